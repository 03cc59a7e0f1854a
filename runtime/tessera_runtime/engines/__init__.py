"""Execution engines: where buffers live and how kernels run.

The executor only talks to this interface, so a GPU engine (e.g. cupy
arrays + a CUDA module, streams and events) can be added next to the CPU
engine without touching the executor. Buffers are opaque to the executor
beyond `.shape` and `.dtype`.
"""

from __future__ import annotations

import contextlib
import math
import time
from abc import ABC, abstractmethod


class EngineError(RuntimeError):
    """A kernel library or kernel is missing, or a launch/event is invalid."""


class Event(ABC):
    """Marks a point in a stream; `event_wait` orders another stream after it."""


class Engine(ABC):
    name: str = "?"
    #: whether prepared launches take buffer addresses (`address`), which the
    #: executor then takes once per buffer, not once per launch argument
    by_address = False
    #: path of the loaded kernel library (for error messages), or None
    kernel_library = None
    #: whether every launch has finished when it returns (a host engine):
    #: events then order nothing, and the straight-line run leaves them out
    synchronous = False

    # -- memory ---------------------------------------------------------------
    @abstractmethod
    def alloc(self, shape, dtype):
        """An uninitialized C-contiguous buffer of `shape` and numpy `dtype`."""

    @abstractmethod
    def free(self, buffer) -> None:
        """Release `buffer`; the executor never touches it again."""

    def alloc_symmetric(self, shape, dtype, slot: int):
        """A buffer on the NVSHMEM symmetric heap for allocation site `slot`
        (a program instruction): allocated collectively by every rank on the
        first call (`new_symmetric`), the same buffer on later calls."""
        kept = self.__dict__.setdefault("_symmetric", {})
        if slot not in kept:
            kept[slot] = self.new_symmetric(shape, dtype)
        return kept[slot]

    def new_symmetric(self, shape, dtype):
        """A new buffer on the NVSHMEM symmetric heap (a collective call)."""
        raise EngineError(f"the {self.name} engine has no NVSHMEM symmetric heap (kernels "
                          "using transport='nvshmem' need the cuda or cuda-emulated engine)")

    @abstractmethod
    def from_host(self, array):
        """A buffer holding a copy of host array `array` that the program may
        write to (the caller's array is never modified)."""

    def is_buffer(self, array, dtype) -> bool:
        """Whether `array` is already one of this engine's buffers of program
        type `dtype` (a device array a run returned), which `from_host`
        copies where it is, not across the bus, and a donating run
        (`Program.run(donate=True)`) uses without a copy."""
        return False

    @abstractmethod
    def to_host(self, buffer, dtype=None):
        """`buffer` as a host numpy array (of numpy `dtype`, the program's
        type for it, where the engine stores that type differently)."""

    # -- kernels -----------------------------------------------------------------
    @abstractmethod
    def load_kernels(self, path, launches=None) -> None:
        """Load the kernel library at `path`; `launches` gives each kernel's
        launch configuration (GPU engines: {"grid", "block", "shared_bytes"})."""

    @abstractmethod
    def has_kernel(self, kernel: str) -> bool: ...

    @abstractmethod
    def launch(self, kernel: str, args, stream=None) -> None:
        """Enqueue `kernel(arg0, arg1, ...)` on `stream` with the buffers'
        data pointers, in order."""

    def prepare_launch(self, kernel: str, n_args: int, stream=None):
        """A callable running `kernel` on a list of buffers (resolved once;
        the executor calls it on every run). An engine that launches `by_address`
        takes `nbytes` (the arguments' total) and its callable takes the
        buffers' addresses (`address`) instead."""
        return lambda args: self.launch(kernel, args, stream)

    def prepare_library(self, routine: str, attrs: dict, stream=None, nbytes: int = 0):
        """A callable running library `routine` on a list of buffers
        (`nbytes`: their total, where the executor knows it)."""
        return lambda args: self.call_library(routine, attrs, args, stream)

    def address(self, buffer) -> int:
        """The address of `buffer`'s data (engines launching by address)."""
        raise EngineError(f"the {self.name} engine launches buffers, not addresses")

    def reshape_view(self, buffer, shape):
        """`buffer` seen with another shape, sharing its memory."""
        return buffer.reshape(shape)

    def flat_view(self, buffer, start: int, shape):
        """The contiguous block of `buffer` (row-major) from element `start`,
        as an array of `shape`, sharing its memory."""
        return buffer.reshape(-1)[start:start + math.prod(shape)].reshape(shape)

    def carve(self, arena, offset: int, nbytes: int, shape, dtype):
        """The buffer of `shape` and numpy `dtype` (`nbytes` long) at byte
        `offset` of `arena`, a uint8 buffer from `alloc`, sharing its memory."""
        return arena[offset:offset + nbytes].view(dtype).reshape(shape)

    def prepare_library_by_address(self, routine: str, attrs: dict, metas, stream=None):
        """An engine launching `by_address` may run library `routine` on
        buffers of `metas` ((shape, dtype) each, inputs then the output) as a
        callable taking their addresses, like a kernel; None: it takes the
        buffers (`prepare_library`)."""
        return None

    def run_scope(self):
        """A context every run of a program executes in."""
        return contextlib.nullcontext()

    def has_library(self, routine: str) -> bool:
        """Whether this engine implements library routine `routine`."""
        from .library import ROUTINES
        return routine in ROUTINES

    def call_library(self, routine: str, attrs: dict, args, stream=None) -> None:
        """Runs library routine `routine` (matmul, transpose, gather, ...) on
        `args` (inputs, then the output) on `stream`."""
        raise EngineError(f"the {self.name} engine has no library routines")

    def read_flags(self, flags) -> list[tuple[int, int]]:
        """The flags of a finished run's value checks (what the routines of
        `library.CHECKS` returned: (row, value) on the host, or the engine's
        buffers of the two) as (row, value) pairs, row < 0 where nothing
        failed. Called once per run, after `synchronize`, only when some
        check returned a flag."""
        return [f if isinstance(f, tuple) else tuple(int(v) for v in self.to_host(f))
                for f in flags]

    # -- streams and events ------------------------------------------------------
    def stream(self, name: str):
        """The engine handle for the program stream called `name`."""
        return name

    @abstractmethod
    def record_event(self, stream) -> Event: ...

    @abstractmethod
    def wait_event(self, event: Event, stream) -> None: ...

    def synchronize(self) -> None:
        """Block until all enqueued work has finished."""

    # -- profiling (profiler.py): a stamp before and after each launch ------------------
    def begin_timestamps(self) -> None:
        """A profiled run starts (a GPU engine anchors its event clock here)."""

    def timestamp(self, stream):
        """A point in `stream`: on a host engine, where launches are
        synchronous, the host clock now (time.perf_counter)."""
        return time.perf_counter()

    def resolve_timestamps(self, stamps) -> list[float]:
        """`stamps` as perf_counter seconds (called after synchronize)."""
        return stamps


ENGINES = ("cpu", "cuda", "cuda-emulated")


def get_engine(name: str) -> Engine:
    """A fresh engine by the name used in manifest.json (`engine`, `kernels`)."""
    if name == "cpu":
        from .cpu import CPUEngine
        return CPUEngine()
    if name == "cuda":
        from .cuda import CUDAEngine
        return CUDAEngine()
    if name == "cuda-emulated":
        from .emulated_cuda import EmulatedCUDAEngine
        return EmulatedCUDAEngine()
    raise EngineError(f"engine {name!r} is not available in this runtime (available: "
                      f"{list(ENGINES)})")
