"""CPU engine: numpy buffers and a ctypes-loaded kernel library.

Kernels are `extern "C" void KERNEL(void*, void*, ...)` taking data pointers
in launch-argument order. Launches are synchronous, so every stream is
trivially in order and a recorded event is complete when it is recorded.

A kernel with a grid also has `KERNEL__range(..., pid0_begin, pid0_end)`:
a launch that touches at least THREADED_MIN_BYTES runs its outermost grid
dimension in equal slices on `threads` threads (ctypes releases the GIL
for the call). The pids of a Tile IR kernel write disjoint tiles, so the
result is bitwise the same on any number of threads.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .. import env
from . import Engine, EngineError, Event

#: A launch whose buffers total less runs on one thread: handing slices to
#: the pool costs tens of microseconds, about what such a kernel takes.
THREADED_MIN_BYTES = 4 << 20
#: A program with a GEMM whose operands and result total at least this
#: has OpenBLAS's idle workers sleep right away (quiet_blas_workers): its
#: GEMMs are long enough that waking a worker is noise, and the kernels
#: between them long enough that a spinning worker costs them a core. With
#: only smaller GEMMs (the w128 GPT's are <= 1.5 MiB) the worker kept
#: spinning between GEMMs is worth more than the core it takes (measured:
#: its 27 GEMMs 2-3 ms slower a step with sleeping workers).
QUIET_BLAS_MIN_BYTES = 8 << 20


_char_at, _address_of = ctypes.c_char.from_buffer, ctypes.addressof


def address(array: np.ndarray) -> int:
    """The data pointer of `array`. Through a ctypes view of its buffer: 0.8
    us where `.ctypes.data` takes 2.7-3.9 us; read-only or empty arrays,
    which a ctypes view refuses, the slow way."""
    try:
        return _address_of(_char_at(array))
    except (TypeError, ValueError):
        return array.ctypes.data


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: what a process' heap keeps of the memory a run freed (glibc's default
#: returns it to the kernel past 128 KiB).
KEPT_FREE_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Makes glibc's malloc reuse the memory a run frees instead of handing
    it back to the kernel. Why: a step allocates and frees the same buffers
    every run, and by default glibc serves blocks over its (adaptive) mmap
    threshold with fresh mmaps and trims the heap's top on free, so every
    run page-faults its buffers in again, zero-filled by the kernel
    (measured: 3,500 minor faults, ~14 MiB, per step of the example GPT,
    half a generated GELU kernel's time). Blocks up to 32 MiB (glibc's
    largest mmap threshold) then come from the heap and stay there; the
    heap keeps up to KEPT_FREE_BYTES free at its top. Process-wide, once;
    TESSERA_CPU_KEEP_FREED=0 leaves malloc as it is. False where malloc is
    not glibc's (or the variable says no)."""
    global _kept
    if _kept is None:
        _kept = env.value("TESSERA_CPU_KEEP_FREED") != "0" and _mallopt(
            (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, KEPT_FREE_BYTES))
    return _kept


_kept: bool | None = None


def _mallopt(*settings) -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):    # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in settings)


def quiet_blas_workers() -> bool:
    """Makes numpy's OpenBLAS worker threads sleep right after a call
    (2**TESSERA_BLAS_THREAD_TIMEOUT cycles of spinning, default 16) instead
    of spinning for OpenBLAS's default 2**28 cycles (~0.1 s); called when a
    program with large GEMMs is prepared (QUIET_BLAS_MIN_BYTES). Why: a step
    alternates GEMMs with generated kernels, and the spinning worker took a
    core from the kernels that followed each GEMM (measured on the w512 GPT
    step: its generated kernels ~450 -> ~280 ms, the step 1749 -> 1514 ms;
    its GEMMs pay a worker wake-up each, within the noise). OpenBLAS reads its timeout
    when it loads, before this runs: the engine sets OPENBLAS_THREAD_TIMEOUT,
    has OpenBLAS read its environment again and restarts its workers.
    Process-wide, once; not when the user set OPENBLAS_THREAD_TIMEOUT (or
    TESSERA_BLAS_THREAD_TIMEOUT=0). False where numpy's BLAS is not an
    OpenBLAS with these entry points."""
    global _quiet
    if _quiet is None:
        try:
            log2_cycles = env.integer("TESSERA_BLAS_THREAD_TIMEOUT")
        except ValueError as err:
            raise EngineError(str(err)) from None
        _quiet = False
        if log2_cycles > 0 and not env.is_set("OPENBLAS_THREAD_TIMEOUT"):
            lib = _openblas()
            if lib is not None:
                env.export("OPENBLAS_THREAD_TIMEOUT", str(max(4, log2_cycles)))
                lib.openblas_read_env()
                lib.blas_thread_shutdown_()       # restarted with the new timeout
                lib.blas_thread_init()
                _quiet = lib.openblas_thread_timeout() == max(4, log2_cycles)
    return _quiet


_quiet: bool | None = None


def _openblas():
    """The OpenBLAS this process has loaded (numpy's), if it has the entry
    points quiet_blas_workers needs (numpy, imported above, has loaded it)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps
                     if "openblas" in line.rsplit("/", 1)[-1].lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if all(hasattr(lib, f) for f in ("openblas_read_env", "openblas_thread_timeout",
                                         "blas_thread_shutdown_", "blas_thread_init")):
            lib.openblas_thread_timeout.restype = ctypes.c_int
            return lib
    return None


def default_threads() -> int:
    """TESSERA_NUM_THREADS, else this process' share of the cores it may
    run on (the job's ranks on this machine split them: 4 ranks on 2 cores
    run one thread each rather than oversubscribe)."""
    from .. import world
    try:
        given = env.count("TESSERA_NUM_THREADS")
    except ValueError as err:
        raise EngineError(str(err)) from None
    local = env.get("OMPI_COMM_WORLD_LOCAL_SIZE") or env.get("MPI_LOCALNRANKS")
    return given or max(1, env.cores() // (int(local) if local else world()[1]))


class CPUEvent(Event):
    def __init__(self, stream):
        self.stream = stream
        self.completed = True   # launches are synchronous

    def __repr__(self) -> str:
        return f"CPUEvent(stream={self.stream!r})"


class CPUEngine(Engine):
    name = "cpu"
    by_address = True

    def __init__(self):
        self._lib = None
        self.kernel_library = None
        self._kernels: dict[str, object] = {}
        self._threads: int | None = None      # default_threads(), at the first launch
        self._workers: ThreadPoolExecutor | None = None
        keep_freed_memory()

    # -- memory -----------------------------------------------------------------
    def alloc(self, shape, dtype):
        return np.empty(tuple(shape), dtype=np.dtype(dtype))

    def free(self, buffer) -> None:
        pass  # numpy memory is reclaimed when the executor drops its reference

    def from_host(self, array):
        # Copy: a program may write its argument buffers (in-place kernels,
        # in-place all_reduce), and that must not leak into the caller's array.
        return np.array(array, order="C", copy=True)

    address = staticmethod(address)

    def is_buffer(self, array, dtype) -> bool:
        return (isinstance(array, np.ndarray) and array.dtype == np.dtype(dtype)
                and array.flags.c_contiguous and array.flags.writeable)

    def to_host(self, buffer, dtype=None):
        return buffer

    # -- kernels -------------------------------------------------------------------
    def load_kernels(self, path, launches=None) -> None:
        path = Path(path)
        if not path.is_file():
            raise EngineError(f"kernel library not found: {path}")
        try:
            # Absolute path: a bare relative name would make dlopen search
            # the system library path instead of the bundle.
            self._lib = ctypes.CDLL(str(path.resolve()))
        except OSError as e:
            raise EngineError(f"cannot load kernel library {path}: {e}") from None
        self.kernel_library = path
        self._kernels.clear()

    def _kernel(self, kernel: str):
        fn = self._kernels.get(kernel)
        if fn is None:
            if self._lib is None:
                raise EngineError(f"kernel '{kernel}': no kernel library is loaded")
            try:
                fn = getattr(self._lib, kernel)
            except AttributeError:
                raise EngineError(f"kernel '{kernel}' not found in kernel library "
                                  f"{self.kernel_library}") from None
            fn.restype = None
            self._kernels[kernel] = fn
        return fn

    def has_kernel(self, kernel: str) -> bool:
        try:
            self._kernel(kernel)
        except EngineError:
            return False
        return True

    def launch(self, kernel: str, args, stream=None) -> None:
        fn = self._kernel(kernel)
        ptrs = []
        for i, a in enumerate(args):
            # The kernel indexes raw memory with compiled-in row-major
            # strides: anything but a C-contiguous numpy array would be
            # read/written wrongly.
            if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
                raise EngineError(f"kernel '{kernel}' arg {i}: expected a C-contiguous "
                                  f"numpy array, got {type(a).__name__}")
            ptrs.append(ctypes.c_void_p(a.ctypes.data))
        fn(*ptrs)

    def prepare_launch(self, kernel: str, n_args: int, stream=None, nbytes: int = 0):
        # Called with the buffers' addresses (by_address): the executor only
        # has C-contiguous numpy buffers (alloc/from_host), so the checks of
        # `launch` are not repeated per call.
        fn = self._kernel(kernel)
        fn.argtypes = [ctypes.c_void_p] * n_args
        try:
            ranged = getattr(self._lib, kernel + "__range")
            grid = ctypes.c_int64.in_dll(self._lib, kernel + "__grid").value
        except AttributeError:          # no grid (or a library from before ranges)
            return lambda ptrs: fn(*ptrs)
        parts = min(self.threads, grid)
        if parts < 2 or nbytes < THREADED_MIN_BYTES:
            return lambda ptrs: fn(*ptrs)
        ranged.restype = None
        ranged.argtypes = [ctypes.c_void_p] * n_args + [ctypes.c_int64] * 2
        bounds = [grid * i // parts for i in range(parts + 1)]
        pool = self._pool()

        def sliced(ptrs):
            rest = [pool.submit(ranged, *ptrs, bounds[i], bounds[i + 1])
                    for i in range(1, parts)]
            ranged(*ptrs, bounds[0], bounds[1])         # this thread takes the first slice
            for done in rest:
                done.result()
        return sliced

    @property
    def threads(self) -> int:
        """Threads a large kernel launch runs on (default_threads())."""
        if self._threads is None:
            self._threads = default_threads()
        return self._threads

    def _pool(self) -> ThreadPoolExecutor:
        if self._workers is None:
            self._workers = ThreadPoolExecutor(self.threads - 1,
                                               thread_name_prefix="tessera-kernels")
        return self._workers

    def prepare_library(self, routine: str, attrs: dict, stream=None, nbytes: int = 0):
        from .library import ROUTINES
        if routine == "matmul" and nbytes >= QUIET_BLAS_MIN_BYTES:
            quiet_blas_workers()
        impl = ROUTINES[routine]

        def call(args):
            with np.errstate(all="ignore"):     # IEEE results (inf, nan), as on a GPU
                impl(np, attrs, *args)
        return call

    def call_library(self, routine: str, attrs: dict, args, stream=None) -> None:
        from .library import ROUTINES
        with np.errstate(all="ignore"):     # IEEE results (inf, nan), as on a GPU
            ROUTINES[routine](np, attrs, *args)

    # -- events ----------------------------------------------------------------------
    def record_event(self, stream) -> CPUEvent:
        return CPUEvent(stream)

    def wait_event(self, event, stream) -> None:
        if not isinstance(event, CPUEvent):
            raise EngineError(f"event_wait on stream {stream!r}: {event!r} is not a CPU event")
        if not event.completed:   # cannot happen with synchronous launches
            raise EngineError(f"event_wait on stream {stream!r}: {event!r} never completed")
