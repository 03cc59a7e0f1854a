"""Engine-agnostic communicator interface.

The executor talks to one `Communicator` per mesh axis and never looks inside
the buffers it passes (it only relies on `.shape` / `.dtype`), so an MPI, NCCL
or in-process implementation can be swapped in without touching the executor.

Every collective is split-phase: the call *starts* it and returns a `Work`;
`Work.wait()` completes it. Until then `dst` must not be read (and `src` must
not be modified or freed).

Subclasses implement `_all_reduce`, `_all_gather`, `_reduce_scatter` and
`_all_to_all`; the public methods here validate shapes and arguments once for
every backend, number each collective per axis and record it in the flight
recorder (`flight`, whose watchdog ends a wait longer than
TESSERA_COLLECTIVE_TIMEOUT), and log every collective when
`TESSERA_COMM_TRACE=1`:

    [tessera comm] rank 3 tp all_reduce sum 65536 B 0.214 ms

(the time runs from the start of the collective to the end of its wait, so
it includes any compute it overlapped with).
"""

from __future__ import annotations

import math
import sys
import time
from abc import ABC, abstractmethod

import numpy as np

from . import env, flight

REDUCTIONS = ("sum", "max", "min", "prod")
#: each reduction as the elementwise ufunc that combines two contributions
REDUCE_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


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


def trace_enabled() -> bool:
    return env.flag("TESSERA_COMM_TRACE")


class RecordedWork(Work):
    """A started collective as the flight recorder follows it: its wait is
    watched (flight.FlightRecorder's watchdog ends a wait longer than
    TESSERA_COLLECTIVE_TIMEOUT), its completion recorded (and logged with
    TESSERA_COMM_TRACE)."""

    def __init__(self, work: Work, entry: flight.Entry, trace: str | None):
        self._work, self.entry, self._trace = work, entry, trace
        self._t0 = time.perf_counter()

    def wait(self) -> None:
        if self.entry.state == "completed":
            return
        self.entry.waiting_since = time.monotonic()
        self._work.wait()
        self.entry.state, self.entry.t_end = "completed", time.time()
        if self._trace is not None:
            ms = (time.perf_counter() - self._t0) * 1e3
            sys.stderr.write(f"[tessera comm] {self._trace} {ms:.3f} ms\n")
            sys.stderr.flush()


def _nbytes(buf) -> int:
    return math.prod(buf.shape) * buf.dtype.itemsize


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

    #: what the trace calls this group (the mesh axis) and this process
    label: str = "group"
    world_rank: int = 0
    #: collectives started so far (the flight recorder's sequence number)
    issued: int = 0
    #: TESSERA_COMM_TRACE, read at the first collective
    trace: bool | None = None

    def name_group(self, axis: str, world_rank: int, members: list[int]) -> None:
        """This communicator is mesh axis `axis` of world rank `world_rank`,
        over the world ranks `members` (in axis order)."""
        self.label, self.world_rank = axis, world_rank
        flight.RECORDER.join(axis, world_rank, members)

    def _traced(self, work: Work, what: str, buf, source: str | None,
                peer: int | None = None) -> Work:
        if peer is None:
            self.issued += 1
            seq = self.issued
        else:                           # transfers are numbered per peer
            seqs = self.__dict__.setdefault("_p2p_issued", {})
            seq = seqs[what, peer] = seqs.get((what, peer), 0) + 1
        nbytes = _nbytes(buf)
        entry = flight.RECORDER.record(seq, what.split()[0], self.label, nbytes, source, peer)
        if peer is not None:
            what = f"{what} {'to' if what == 'send' else 'from'} {peer}"
        if self.trace is None:          # (read once, not os.environ on every collective)
            self.trace = trace_enabled()
        trace = f"rank {self.world_rank} {self.label} {what} {nbytes} B" if self.trace else None
        return RecordedWork(work, entry, trace)

    # -- public, validated entry points ------------------------------------
    def all_reduce(self, src, dst, reduction: str = "sum",
                   deterministic: bool = False, stream=None, source: str | None = None) -> Work:
        """dst = reduce(src over ranks); src may be dst (in place). With
        `deterministic`, the contributions are combined in a fixed binary
        tree over rank order, ((r0+r1)+(r2+r3)), on every engine."""
        _check_reduction(reduction)
        _check_dtype(src, dst, "all_reduce")
        if tuple(src.shape) != tuple(dst.shape):
            raise CommError(f"all_reduce: src shape {tuple(src.shape)} != "
                            f"dst shape {tuple(dst.shape)}")
        work = self._all_reduce(src, dst, reduction, bool(deterministic), stream)
        tag = " deterministic" if deterministic else ""
        return self._traced(work, f"all_reduce {reduction}{tag}", src, source)

    def all_gather(self, src, dst, dim: int = 0, stream=None, source: str | None = None) -> Work:
        """dst = concatenate(src of every rank, in rank order) along `dim`."""
        _check_dtype(src, dst, "all_gather")
        _check_split(dst, src, dim, self.size, "all_gather", "dst", "src")
        return self._traced(self._all_gather(src, dst, dim, stream), f"all_gather dim {dim}", dst,
                            source)

    def reduce_scatter(self, src, dst, dim: int = 0, reduction: str = "sum",
                       deterministic: bool = False, stream=None,
                       source: str | None = None) -> Work:
        """dst = this rank's block along `dim` of reduce(src over ranks)."""
        _check_reduction(reduction)
        _check_dtype(src, dst, "reduce_scatter")
        _check_split(src, dst, dim, self.size, "reduce_scatter", "src", "dst")
        work = self._reduce_scatter(src, dst, dim, reduction, bool(deterministic), stream)
        return self._traced(work, f"reduce_scatter {reduction} dim {dim}", src, source)

    def all_to_all(self, src, dst, split_dim: int, concat_dim: int, stream=None,
                   source: str | None = None, counts=None) -> Work:
        """Block j of src along `split_dim` goes to rank j; dst is the blocks
        received, concatenated along `concat_dim` in rank order.

        counts: (send, receive), [size] int32 arrays, a ragged exchange: of
        block j only its first send[j] rows (rows of src's last dimension,
        in the block's row-major order) need to move, and receive[i] is how
        many rank i sends; the rest of each received block is undefined.
        The blocks must be contiguous (every dimension before `split_dim` of
        src and before `concat_dim` of dst of size 1). A backend may move
        whole blocks."""
        _check_dtype(src, dst, "all_to_all")
        ss, ds = tuple(src.shape), tuple(dst.shape)
        n = self.size
        ok = (0 <= split_dim < len(ss) and 0 <= concat_dim < len(ss) and split_dim != concat_dim
              and ss[split_dim] % n == 0)
        if ok:
            expect = list(ss)
            expect[split_dim] //= n
            expect[concat_dim] *= n
            ok = ds == tuple(expect)
        if not ok:
            raise CommError(f"all_to_all: src {ss} split along dim {split_dim} over {n} ranks "
                            f"and concatenated along dim {concat_dim} cannot give dst {ds}")
        if counts is not None:
            _check_counts(counts, src, dst, split_dim, concat_dim, n)
        work = self._all_to_all(src, dst, split_dim, concat_dim, stream, counts)
        return self._traced(work, f"all_to_all dims {split_dim}->{concat_dim}", src, source)

    def broadcast(self, src, dst, root: int = 0, stream=None, source: str | None = None) -> Work:
        """dst = src of rank `root` (src is read on the root only)."""
        _check_dtype(src, dst, "broadcast")
        if tuple(src.shape) != tuple(dst.shape) or not 0 <= root < self.size:
            raise CommError(f"broadcast: src {tuple(src.shape)} and dst {tuple(dst.shape)} must "
                            f"have one shape and root {root} must be a rank of {self.size}")
        return self._traced(self._broadcast(src, dst, root, stream), f"broadcast root {root}", src,
                            source)

    def shift(self, src, dst, offset: int = 1, stream=None, source: str | None = None) -> Work:
        """Point-to-point ring shift: rank r sends src to rank (r + offset) mod
        size and receives dst from rank (r - offset) mod size (pipeline stages
        hand activations on this way)."""
        _check_dtype(src, dst, "shift")
        if tuple(src.shape) != tuple(dst.shape):
            raise CommError(f"shift: src {tuple(src.shape)} and dst {tuple(dst.shape)} differ")
        return self._traced(self._shift(src, dst, offset % self.size, stream),
                            f"shift {offset:+d}", src, source)

    def send(self, buf, peer: int, stream=None, source: str | None = None) -> Work:
        """Start sending `buf` to rank `peer` of this axis. Sends and
        receives between two ranks pair up in the order they are started
        (the schedule verifier proves the orders agree)."""
        self._check_peer(peer, "send")
        return self._traced(self._send(buf, peer, stream), "send", buf, source, peer)

    def recv(self, buf, peer: int, stream=None, source: str | None = None) -> Work:
        """Start receiving into `buf` from rank `peer` of this axis."""
        self._check_peer(peer, "recv")
        return self._traced(self._recv(buf, peer, stream), "recv", buf, source, peer)

    def _check_peer(self, peer: int, what: str) -> None:
        if not 0 <= peer < self.size or peer == self.rank:
            raise CommError(f"{what}: peer {peer} must be another rank of this axis "
                            f"(size {self.size}, this rank {self.rank})")

    # -- backend hooks ----------------------------------------------------------
    @abstractmethod
    def _all_reduce(self, src, dst, reduction, deterministic, stream) -> Work: ...

    @abstractmethod
    def _all_gather(self, src, dst, dim, stream) -> Work: ...

    @abstractmethod
    def _reduce_scatter(self, src, dst, dim, reduction, deterministic, stream) -> Work: ...

    @abstractmethod
    def _all_to_all(self, src, dst, split_dim, concat_dim, stream, counts) -> Work: ...

    @abstractmethod
    def _broadcast(self, src, dst, root, stream) -> Work: ...

    @abstractmethod
    def _shift(self, src, dst, offset, stream) -> Work: ...

    @abstractmethod
    def _send(self, buf, peer, stream) -> Work: ...

    @abstractmethod
    def _recv(self, buf, peer, stream) -> Work: ...


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

    def _all_to_all(self, src, dst, split_dim, concat_dim, stream, counts) -> Work:
        return self._copy(src, dst)

    def _broadcast(self, src, dst, root, stream) -> Work:
        return self._copy(src, dst)

    def _shift(self, src, dst, offset, stream) -> Work:
        return self._copy(src, dst)

    def _send(self, buf, peer, stream) -> Work:
        raise CommError("send on a size-1 axis")     # _check_peer refuses first

    _recv = _send


def _check_counts(counts, src, dst, split_dim: int, concat_dim: int, n: int) -> None:
    """A ragged all_to_all's (send, receive) counts against its blocks."""
    last = len(src.shape) - 1
    if not (leading_is_trivial(src.shape, split_dim) and leading_is_trivial(dst.shape, concat_dim)
            and last not in (split_dim, concat_dim)):
        raise CommError(f"all_to_all with counts: the blocks of src {tuple(src.shape)} along dim "
                        f"{split_dim} and of dst {tuple(dst.shape)} along dim {concat_dim} must "
                        "be contiguous runs of whole rows")
    if len(counts) != 2 or any(tuple(c.shape) != (n,) for c in counts):
        raise CommError(f"all_to_all counts must be (send, receive), each of {n} entries")
    rows = math.prod(src.shape) // (n * src.shape[-1]) if src.shape[-1] else 0
    for name, c in zip(("send", "receive"), counts):
        if isinstance(c, np.ndarray) and ((c < 0).any() or (c > rows).any()):
            raise CommError(f"all_to_all {name} counts {c.tolist()} must be within the "
                            f"{rows} rows of a block")


def leading_is_trivial(shape, dim: int) -> bool:
    """True if blocks along `dim` are already contiguous in C order (all
    dimensions before `dim` have size 1), so no packing is needed."""
    return math.prod(shape[:dim]) == 1


def rank_blocks(xp, src, n: int, dim: int):
    """`src` cut into `n` blocks along `dim` and laid out contiguously as
    (n, *block): block k is rank k's (what scatter-like collectives send).
    A view when the blocks are contiguous already, else one packed copy;
    `xp` is the array library (numpy, cupy)."""
    if leading_is_trivial(src.shape, dim):
        block = list(src.shape)
        block[dim] //= n
        return src.reshape((n,) + tuple(block))
    return xp.stack(xp.split(src, n, axis=dim))


def tree_reduce(blocks, ufunc, out) -> None:
    """out = reduction of blocks[0..n) in a fixed pairwise tree over their order
    (any array library: the MPI and NCCL engines share it, hence the same bits).

    ((b0 op b1) op (b2 op b3)) ...; an odd block at the end of a level is
    carried up unchanged. Elementwise ufuncs are exact per element, so a fixed
    pairing gives a fixed result.
    """
    level = list(blocks)
    while len(level) > 2:
        nxt = [ufunc(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    if len(level) == 2 and hasattr(ufunc, "nout"):   # a numpy/cupy ufunc: the root writes out
        ufunc(level[0], level[1], out=out)
    else:
        out[...] = level[0] if len(level) == 1 else ufunc(level[0], level[1])


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
