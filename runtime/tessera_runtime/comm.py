"""Engine-agnostic communicator interface.

The executor talks to one `Communicator` per mesh axis and never looks inside
the buffers it passes (it only relies on `.shape` / `.dtype`), so an MPI, NCCL
or in-process implementation can be swapped in without touching the executor.

Every collective is split-phase: the call *starts* it and returns a `Work`;
`Work.wait()` completes it. Until then `dst` must not be read (and `src` must
not be modified or freed).

Subclasses implement `_all_reduce`, `_all_gather` and `_reduce_scatter`; the
public methods here validate shapes and arguments once for every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

REDUCTIONS = ("sum", "max", "min", "prod")


class CommError(ValueError):
    """A collective was called with inconsistent buffers or arguments."""


class Work(ABC):
    """Handle of a started collective."""

    @abstractmethod
    def wait(self) -> None:
        """Block until the collective has completed and `dst` holds the result.
        Calling it again is a no-op."""


class CompletedWork(Work):
    """A collective that finished when it was started (e.g. size-1 axis)."""

    def wait(self) -> None:
        pass


class Communicator(ABC):
    """Collectives over the ranks of one group (ordered by `rank`).

    `stream` is an opaque engine stream handle: ignored by host-side
    communicators, used by device-side ones (NCCL) to enqueue the collective.
    """

    @property
    @abstractmethod
    def size(self) -> int: ...

    @property
    @abstractmethod
    def rank(self) -> int: ...

    # -- public, validated entry points ------------------------------------
    def all_reduce(self, src, dst, reduction: str = "sum",
                   deterministic: bool = False, stream=None) -> Work:
        """dst = reduce(src over ranks); src may be dst (in place)."""
        _check_reduction(reduction)
        _check_dtype(src, dst, "all_reduce")
        if tuple(src.shape) != tuple(dst.shape):
            raise CommError(f"all_reduce: src shape {tuple(src.shape)} != "
                            f"dst shape {tuple(dst.shape)}")
        return self._all_reduce(src, dst, reduction, bool(deterministic), stream)

    def all_gather(self, src, dst, dim: int = 0, stream=None) -> Work:
        """dst = concatenate(src of every rank, in rank order) along `dim`."""
        _check_dtype(src, dst, "all_gather")
        _check_split(dst, src, dim, self.size, "all_gather", "dst", "src")
        return self._all_gather(src, dst, dim, stream)

    def reduce_scatter(self, src, dst, dim: int = 0, reduction: str = "sum",
                       deterministic: bool = False, stream=None) -> Work:
        """dst = this rank's block along `dim` of reduce(src over ranks)."""
        _check_reduction(reduction)
        _check_dtype(src, dst, "reduce_scatter")
        _check_split(src, dst, dim, self.size, "reduce_scatter", "src", "dst")
        return self._reduce_scatter(src, dst, dim, reduction, bool(deterministic), stream)

    # -- backend hooks ----------------------------------------------------------
    @abstractmethod
    def _all_reduce(self, src, dst, reduction, deterministic, stream) -> Work: ...

    @abstractmethod
    def _all_gather(self, src, dst, dim, stream) -> Work: ...

    @abstractmethod
    def _reduce_scatter(self, src, dst, dim, reduction, deterministic, stream) -> Work: ...


class SelfCommunicator(Communicator):
    """The communicator of a size-1 axis: every collective is a copy."""

    size = 1
    rank = 0

    @staticmethod
    def _copy(src, dst) -> Work:
        if src is not dst:
            dst[...] = src
        return CompletedWork()

    def _all_reduce(self, src, dst, reduction, deterministic, stream) -> Work:
        return self._copy(src, dst)

    def _all_gather(self, src, dst, dim, stream) -> Work:
        return self._copy(src, dst)

    def _reduce_scatter(self, src, dst, dim, reduction, deterministic, stream) -> Work:
        return self._copy(src, dst)


# -- shared validation (shape/dtype only: buffers stay opaque) ---------------

def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise CommError(f"unknown reduction {reduction!r} (known: {list(REDUCTIONS)})")


def _check_dtype(src, dst, what: str) -> None:
    if src.dtype != dst.dtype:
        raise CommError(f"{what}: src dtype {src.dtype} != dst dtype {dst.dtype}")


def _check_split(big, small, dim: int, size: int, what: str, big_name: str,
                 small_name: str) -> None:
    """`big` must be `small` with dimension `dim` multiplied by `size`."""
    bs, ss = tuple(big.shape), tuple(small.shape)
    if not 0 <= dim < len(ss):
        raise CommError(f"{what}: dim {dim} out of range for rank-{len(ss)} {small_name}")
    expect = ss[:dim] + (ss[dim] * size,) + ss[dim + 1:]
    if bs != expect:
        raise CommError(f"{what}: {big_name} shape {bs} must be {small_name} shape {ss} "
                        f"with dim {dim} times the group size {size}, i.e. {expect}")
