"""CPU engine: numpy buffers and a ctypes-loaded kernel library.

Kernels are `extern "C" void KERNEL(void*, void*, ...)` taking data pointers
in launch-argument order. Launches are synchronous, so every stream is
trivially in order and a recorded event is complete when it is recorded.

A kernel with a grid also has `KERNEL__slice(void** args, begin, end)`: a
launch that touches at least THREADED_MIN_BYTES runs its outermost grid
dimension in equal slices on an OpenMP team of `threads` threads through
the library's `tessera_parallel(slice, args, grid, threads)` (the library
is built with -fopenmp; ctypes releases the GIL for the call). The pids of a
Tile IR kernel write disjoint tiles, so the result is bitwise the same on
any number of threads. The library's `tessera_gemm_f32` runs the float32
GEMMs (the library routine matmul) on the same team, each member calling
numpy's OpenBLAS one-threaded on a block of the result: one pool for the
whole program.
"""

from __future__ import annotations

import ctypes
import math
import operator
import os
from pathlib import Path

import numpy as np

from .. import env
from . import Engine, EngineError, Event, library

#: A launch whose buffers total less runs on one thread. The team's
#: members spin between launches (the GEMMs run on the same team, so no
#: other pool wants the cores), so waking them costs about a microsecond
#: and a low threshold was as fast as any on the w128 GPT step; where
#: numpy's OpenBLAS runs the GEMMs (no team_sgemm) its spinning workers
#: hold the cores and a team member waits a scheduler slice behind them:
#: there the threshold is THREADED_MIN_BYTES_BESIDE_OPENBLAS (the
#: measurements: bench/results/docstring-timings-moved-2026-12-02.md).
THREADED_MIN_BYTES = 64 << 10
THREADED_MIN_BYTES_BESIDE_OPENBLAS = 4 << 20
#: A 2-D float32 GEMM of at least GEMM_SPLIT_MIN_MACS multiply-adds is cut
#: into blocks of rows (or columns) that the kernels' OpenMP team shares
#: (tessera_gemm_f32): 2 blocks, or GEMM_PIECES from GEMM_FULL_SPLIT_MACS,
#: but never more than the machine's cores per local rank (`gemm_block_limit`).
#: The cut matters to the bits (OpenBLAS sums a small block differently:
#: measured, 10 of 118 random shapes changed bits at 4 or 8 blocks), so it
#: depends on the shape and the job's layout only, never on the thread count
#: (TESSERA_NUM_THREADS, affinity). Why not 4 blocks always: every block
#: packs the whole of the operand it does not cut again, and on a 1-thread
#: rank the blocks run one after another (each block more was slower on
#: one thread and on two: bench/results/docstring-timings-moved-2026-12-02.md).
GEMM_PIECES = 4
GEMM_SPLIT_MIN_MACS = 1 << 18
GEMM_FULL_SPLIT_MACS = 1 << 24
#: A program with a GEMM whose operands and result total at least this
#: has OpenBLAS's idle workers sleep right away (quiet_blas_workers): its
#: GEMMs are long enough that waking a worker is noise, and the kernels
#: between them long enough that a spinning worker costs them a core. With
#: only smaller GEMMs (the w128 GPT's are <= 1.5 MiB) the worker kept
#: spinning between GEMMs is worth more than the core it takes (its GEMMs
#: were slower with sleeping workers).
QUIET_BLAS_MIN_BYTES = 8 << 20


_char_at, _address_of = ctypes.c_char.from_buffer, ctypes.addressof


def address(array: np.ndarray) -> int:
    """The data pointer of `array`. Through a ctypes view of its buffer,
    a fraction of what `.ctypes.data` costs (a step takes thousands of
    addresses); read-only or empty arrays, which a ctypes view refuses, the
    slow way."""
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
    core from the kernels that followed each GEMM (on the w512 GPT step
    the generated kernels and the step got faster; the GEMMs' worker
    wake-ups are within the noise). OpenBLAS reads its timeout
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


def _openblas_paths() -> list[str]:
    """The OpenBLAS libraries this process has loaded (numpy's: imported above)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split(None, 5)[-1].strip() for line in maps
                           if "openblas" in line.rsplit("/", 1)[-1].lower()})
    except OSError:
        return []


def _openblas_libraries():
    """The OpenBLAS libraries this process has loaded, as ctypes libraries."""
    for path in _openblas_paths():
        try:
            yield ctypes.CDLL(path)
        except OSError:
            continue


def _openblas():
    """numpy's OpenBLAS, if it has the entry points quiet_blas_workers needs."""
    for lib in _openblas_libraries():
        if all(hasattr(lib, f) for f in ("openblas_read_env", "openblas_thread_timeout",
                                         "blas_thread_shutdown_", "blas_thread_init")):
            lib.openblas_thread_timeout.restype = ctypes.c_int
            return lib
    return None


def team_sgemm() -> tuple[int, int] | None:
    """The addresses of numpy's OpenBLAS `cblas_sgemm` (64-bit integers)
    and `openblas_set_num_threads_local`, which the kernel library's
    tessera_gemm_f32 calls from its OpenMP team; None where numpy's BLAS
    lacks either (its GEMMs then stay numpy.matmul calls)."""
    global _team_sgemm
    if _team_sgemm is None:
        _team_sgemm = False
        for lib in _openblas_libraries():
            sgemm = next((getattr(lib, f) for f in ("scipy_cblas_sgemm64_", "cblas_sgemm64_")
                          if hasattr(lib, f)), None)
            if sgemm is not None and hasattr(lib, "openblas_set_num_threads_local"):
                _team_sgemm = (ctypes.cast(sgemm, ctypes.c_void_p).value,
                               ctypes.cast(lib.openblas_set_num_threads_local,
                                           ctypes.c_void_p).value)
                break
    return _team_sgemm or None


_team_sgemm: tuple[int, int] | bool | None = None


def quiet_openmp_workers() -> None:
    """Where OpenBLAS keeps its own workers (no team_sgemm), has the
    kernels' OpenMP team members sleep as soon as a launch is done
    (GOMP_SPINCOUNT=0), before the first kernel library loads libgomp,
    unless the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY. Why: libgomp's
    default spins ~300,000 rounds after each parallel region, on the core
    the next GEMM's OpenBLAS worker needs (on the w512 GPT step sleeping
    beat spinning and the Python thread pool this team replaced). With
    team_sgemm the team is the
    only pool and its members spin between launches. libgomp reads the
    variable when it loads, so a process that loaded it before keeps its
    setting."""
    if team_sgemm() is None and not (env.is_set("GOMP_SPINCOUNT")
                                     or env.is_set("OMP_WAIT_POLICY")):
        env.export("GOMP_SPINCOUNT", "0")


def _local_ranks() -> int:
    """The job's ranks on this machine (the launcher says; else the world)."""
    from .. import world
    local = env.get("OMPI_COMM_WORLD_LOCAL_SIZE") or env.get("MPI_LOCALNRANKS")
    return int(local) if local else world()[1]


def default_threads() -> int:
    """TESSERA_NUM_THREADS, else this process' share of the cores it may
    run on (the job's ranks on this machine split them: 4 ranks on 2 cores
    run one thread each rather than oversubscribe)."""
    try:
        given = env.count("TESSERA_NUM_THREADS")
    except ValueError as err:
        raise EngineError(str(err)) from None
    return given or max(1, env.cores() // _local_ranks())


def gemm_block_limit(ranks: int | None = None) -> int:
    """The most blocks a GEMM is cut into: TESSERA_GEMM_BLOCKS, else the
    machine's cores per rank on it (`ranks`, default the job's), up to
    GEMM_PIECES. From the core count, not the affinity or the thread count,
    so that the bits do not change with those; 4 ranks on 2 cores cut
    nothing (a rank's blocks would run one after another)."""
    try:
        given = env.count("TESSERA_GEMM_BLOCKS")
    except ValueError as err:
        raise EngineError(str(err)) from None
    return given or max(1, min(GEMM_PIECES, (os.cpu_count() or 1) // (ranks or _local_ranks())))


class TeamBLAS:
    """numpy, as the library routines see it (their `xp`) while the GEMMs
    run on the kernel library's OpenMP team: `matmul` of 2-D float32
    operands, each C-contiguous or the transpose of one (a BLAS transpose
    flag), goes to tessera_gemm_f32; any other matmul (batched, float64,
    strided) to numpy with OpenBLAS held to one thread, so OpenBLAS's own
    workers never wake and spin on the team's cores."""

    def __init__(self, gemm, set_blas_threads, threads: int, most_pieces: int):
        self._gemm, self._set_blas_threads, self.threads = gemm, set_blas_threads, threads
        self.most_pieces = most_pieces

    def __getattr__(self, name):
        return getattr(np, name)

    def matmul(self, a, b, out=None):
        ta, tb = _blas_operand(a), _blas_operand(b)
        if ta is not None and tb is not None and a.size and b.size and \
                (out is None or (out.dtype == np.float32 and out.flags.c_contiguous)):
            m, k, n = a.shape[0], a.shape[1], b.shape[1]
            if out is None:
                out = np.empty((m, n), np.float32)
            pieces = gemm_pieces(m, n, k, self.most_pieces)
            self._gemm(ta, tb, m, n, k, (a.T if ta else a).ctypes.data,
                       (b.T if tb else b).ctypes.data, out.ctypes.data, pieces, self.threads)
            return out
        saved = self._set_blas_threads(1)
        try:
            return np.matmul(a, b, out=out)
        finally:
            self._set_blas_threads(saved)


def gemm_pieces(m: int, n: int, k: int, most: int = GEMM_PIECES) -> int:
    """How many blocks tessera_gemm_f32 cuts an m x n x k GEMM into, at most
    `most` (gemm_block_limit()): by shape, not by thread count."""
    macs = m * n * k
    return min(most, 1 if macs < GEMM_SPLIT_MIN_MACS else
               2 if macs < GEMM_FULL_SPLIT_MACS else GEMM_PIECES)


def _merge_contiguous(extent, src_strides, dst_strides, item: int):
    """(extent, src strides, dst strides) with size-1 dimensions dropped and
    each dimension that is contiguous with the next on both sides merged into
    it (a transpose's rows become whole memcpys); None past rank 8."""
    dims = [(n, s, d) for n, s, d in zip(extent, src_strides, dst_strides) if n != 1] \
        or [(1, item, item)]
    merged = [dims[-1]]
    for n, s, d in reversed(dims[:-1]):
        m, ms, md = merged[-1]
        if s == ms * m and d == md * m:
            merged[-1] = (n * m, ms, md)
        else:
            merged.append((n, s, d))
    merged.reverse()
    if len(merged) > 8:
        return None
    return tuple(list(x) for x in zip(*merged))


def _blas_operand(x) -> int | None:
    """0 for a C-contiguous 2-D float32 array, 1 for the transpose of one,
    None for anything else."""
    if x.ndim != 2 or x.dtype != np.float32:
        return None
    if x.flags.c_contiguous:
        return 0
    return 1 if x.T.flags.c_contiguous else None


class CPUEvent(Event):
    def __init__(self, stream):
        self.stream = stream
        self.completed = True   # launches are synchronous

    def __repr__(self) -> str:
        return f"CPUEvent(stream={self.stream!r})"


class CPUEngine(Engine):
    name = "cpu"
    by_address = True
    synchronous = True

    def __init__(self):
        self._lib = None
        #: the library's {"gather": tessera_gather_rows_f32, "scatter_add": ...}
        self._rows = None
        self._copy_box = None     # the library's tessera_copy_box
        #: the library's value checks: {numpy dtype: tessera_check_range_<type>}
        self._range_checks: dict = {}
        self.kernel_library = None
        self._kernels: dict[str, object] = {}
        self._threads: int | None = None      # default_threads(), at the first launch
        self._gemm_blocks: int | None = None  # gemm_block_limit(), at the first GEMM
        self._team = None         # (tessera_gemm_f32, OpenBLAS's thread setter) of the library
        self._gemm_then = None    # the library's tessera_gemm_f32_then (a GEMM's epilogue)
        self._team_blas: TeamBLAS | None = None    # _library_numpy's, for self.threads
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
        quiet_openmp_workers()
        try:
            # Absolute path: a bare relative name would make dlopen search
            # the system library path instead of the bundle.
            self._lib = ctypes.CDLL(str(path.resolve()))
        except OSError as e:
            raise EngineError(f"cannot load kernel library {path}: {e}") from None
        self.kernel_library = path
        self._kernels.clear()
        self._team = self._team_blas = self._rows = self._copy_box = self._gemm_then = None
        self._range_checks = {}
        if not hasattr(self._lib, "tessera_parallel"):      # a library from before the team
            return
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        for dtype, name in ((np.int32, "i32"), (np.int64, "i64")):
            check = getattr(self._lib, f"tessera_check_range_{name}", None)
            if check is not None:
                check.restype, check.argtypes = i64, [ptr, i64, i64, i64, i64]
                self._range_checks[np.dtype(dtype)] = check
        if hasattr(self._lib, "tessera_gather_rows_f32"):
            gather = self._lib.tessera_gather_rows_f32
            scatter = self._lib.tessera_scatter_add_rows_f32
            for fn in (gather, scatter):
                fn.restype = i64
                fn.argtypes = [ptr, ptr, i64, i64, i64, i64, ptr, i64]
            self._rows = {"gather": gather, "scatter_add": scatter}
        self._copy_box = getattr(self._lib, "tessera_copy_box", None)
        if self._copy_box is not None:
            self._copy_box.restype = None
            self._copy_box.argtypes = [ptr, ptr, i64, ptr, ptr, ptr, i64, ptr, i64, ctypes.c_int]
        self._lib.tessera_parallel.restype = None
        self._lib.tessera_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                               ctypes.c_int]
        sgemm = team_sgemm()
        if sgemm is not None:
            self._lib.tessera_use_sgemm.argtypes = [ctypes.c_void_p] * 2
            self._lib.tessera_use_sgemm(*sgemm)
            gemm = self._lib.tessera_gemm_f32
            gemm.restype = None
            gemm.argtypes = [ctypes.c_int] * 2 + [ctypes.c_int64] * 3 + \
                [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int]
            self._team = (gemm, ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(sgemm[1]))
            then = getattr(self._lib, "tessera_gemm_f32_then", None)
            if then is not None:
                then.restype = None
                then.argtypes = gemm.argtypes + [ctypes.c_void_p] * 2 + [ctypes.c_int64]
            self._gemm_then = then

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
            part = ctypes.cast(getattr(self._lib, kernel + "__slice"), ctypes.c_void_p).value
            grid = ctypes.c_int64.in_dll(self._lib, kernel + "__grid").value
        except AttributeError:          # no grid
            return lambda ptrs: fn(*ptrs)
        parts = min(self.threads, grid)
        least = THREADED_MIN_BYTES if self._team is not None \
            else THREADED_MIN_BYTES_BESIDE_OPENBLAS
        if parts < 2 or nbytes < least:
            return lambda ptrs: fn(*ptrs)
        team, args = self._lib.tessera_parallel, ctypes.c_void_p * n_args
        return lambda ptrs: team(part, args(*ptrs), grid, parts)

    @property
    def threads(self) -> int:
        """Threads a large kernel launch runs on (default_threads())."""
        if self._threads is None:
            self._threads = default_threads()
        return self._threads

    @property
    def gemm_block_limit(self) -> int:
        """The most blocks a GEMM is cut into (gemm_block_limit())."""
        if self._gemm_blocks is None:
            self._gemm_blocks = gemm_block_limit()
        return self._gemm_blocks

    def prepare_library(self, routine: str, attrs: dict, stream=None, nbytes: int = 0):
        from .library import ROUTINES
        impl = ROUTINES[routine]
        xp = self._library_numpy()
        if xp is np and routine == "matmul" and nbytes >= QUIET_BLAS_MIN_BYTES:
            quiet_blas_workers()
        if routine == "matmul" and "epilogue" in attrs:
            # (No team GEMM with epilogues in this library: the GEMM, then
            # the kernel over its output.)
            kernel, mapping = attrs["epilogue"], attrs["epilogue_args"]
            return lambda args: (impl(xp, attrs, args[0], args[1], args[-1]),
                                 self.launch(kernel, [args[i] for i in mapping]))

        # (run inside run_scope: IEEE results, inf and nan, as on a GPU)
        return lambda args: impl(xp, attrs, *args)

    def prepare_library_by_address(self, routine: str, attrs: dict, metas, stream=None):
        """A float32 2-D matmul (`_gemm_by_address`), a float32 embedding
        lookup or gradient with int32 ids (`_rows_by_address`), or a
        transpose, slice or pad of any dtype (`_box_by_address`), as one call
        into the kernel library; None for the rest."""
        if routine in ("gather", "scatter_add"):
            return self._rows_by_address(routine, attrs, metas)
        if routine in ("transpose", "slice", "pad"):
            return self._box_by_address(routine, attrs, metas)
        if routine == "concat":
            return self._concat_by_address(attrs, metas)
        if routine == "check_range":
            return self._check_by_address(attrs, metas)
        return self._gemm_by_address(routine, attrs, metas)

    def _check_by_address(self, attrs: dict, metas):
        """A value check of int32 or int64 (library.check_range) as one call
        of the library's tessera_check_range_*: one pass over the block,
        returning the flag, (row, value) or None. numpy's (None here) where
        the range or the allowed values do not fit its form: at most one
        allowed value, 0 < high - low < 2^bits."""
        (shape, dtype), = metas
        check = self._range_checks.get(np.dtype(dtype))
        allowed = tuple(attrs.get("allowed", ()))
        low, high = attrs["low"], attrs["high"]
        if check is None or len(allowed) > 1:
            return None
        info = np.iinfo(dtype)
        if not (info.min <= low < high <= info.max + 1):
            return None
        if high - low == 1 << info.bits:
            return lambda ptrs: None                    # every value passes
        other = allowed[0] if allowed and info.min <= allowed[0] <= info.max else low
        n = math.prod(shape)
        item = ctypes.c_int32 if np.dtype(dtype) == np.int32 else ctypes.c_int64
        size = ctypes.sizeof(item)
        # (ctypes objects made once, not converted from ints on every call)
        args = tuple(ctypes.c_int64(v) for v in (n, low, high, other))

        def run(ptrs):
            i = check(ptrs[0], *args)
            return None if i < 0 else (library.global_index(attrs, shape, i),
                                       item.from_address(ptrs[0] + size * i).value)
        return run

    def _box_by_address(self, routine: str, attrs: dict, metas):
        """A transpose, slice or pad (library.py's) as one tessera_copy_box
        call: the box's extent and both sides' byte strides, worked out
        here once, with dimensions contiguous on both sides merged."""
        if self._copy_box is None or len(metas) != 2:
            return None
        (shape, dtype), (out_shape, out_dtype) = metas
        item = np.dtype(dtype).itemsize
        if np.dtype(dtype) != np.dtype(out_dtype) or not math.prod(out_shape):
            return None
        src_strides, dst_strides = ([item * math.prod(s[d + 1:]) for d in range(len(s))]
                                    for s in (shape, out_shape))        # C-contiguous, bytes
        src_start = dst_start = zero = 0
        if routine == "transpose":
            extent, src_strides = list(out_shape), [src_strides[d] for d in attrs["perm"]]
        elif routine == "slice":
            extent = list(out_shape)
            src_start = sum(o * st for o, st in zip(attrs["offsets"], src_strides))
        else:                                        # pad: zeros, then the input inside
            extent, zero = list(shape), math.prod(out_shape) * item
            dst_start = sum(o * st for o, st in zip(attrs["offsets"], dst_strides))
        box = _merge_contiguous(extent, src_strides, dst_strides, item)
        if box is None:
            return None
        extent, src_strides, dst_strides = (
            (ctypes.c_int64 * len(x))(*x) for x in box)
        moved = math.prod(out_shape) * item
        threads = self.threads if moved >= THREADED_MIN_BYTES else 1
        copy, rank = self._copy_box, len(extent)
        return lambda ptrs: copy(ptrs[0] + src_start, ptrs[1] + dst_start, rank, extent,
                                 src_strides, dst_strides, item, ptrs[1], zero, threads)

    def _concat_by_address(self, attrs: dict, metas):
        """A concat (library.py's) as one tessera_copy_box call per input,
        each into its place in the output (the cotangent of q, k and v
        split out of one projection is one: numpy's concatenate copied it on
        one thread)."""
        if self._copy_box is None:
            return None
        *shapes, (out_shape, out_dtype) = metas
        item = np.dtype(out_dtype).itemsize
        if any(np.dtype(d) != np.dtype(out_dtype) for _, d in shapes) or not math.prod(out_shape):
            return None
        dst_strides = [item * math.prod(out_shape[d + 1:]) for d in range(len(out_shape))]
        dim, start, copies = attrs["dim"] % len(out_shape), 0, []
        for i, (shape, _) in enumerate(shapes):
            if not math.prod(shape):                 # (a zero-size input: nothing to copy)
                continue
            src_strides = [item * math.prod(shape[d + 1:]) for d in range(len(shape))]
            box = _merge_contiguous(list(shape), src_strides, dst_strides, item)
            if box is None:
                return None
            copies.append((i, start * dst_strides[dim], len(box[0]),
                           *((ctypes.c_int64 * len(x))(*x) for x in box)))
            start += shape[dim]
        threads = self.threads if math.prod(out_shape) * item >= THREADED_MIN_BYTES else 1
        copy, out = self._copy_box, len(shapes)

        def run(ptrs):
            for i, dst_start, rank, extent, src_strides, dst_strides in copies:
                copy(ptrs[i], ptrs[out] + dst_start, rank, extent, src_strides, dst_strides, item,
                     ptrs[out], 0, threads)
        return run

    def _rows_by_address(self, routine: str, attrs: dict, metas):
        """tessera_gather_rows_f32 / tessera_scatter_add_rows_f32 on this
        rank's block of the table (`block`, as library.gather takes it)."""
        if self._rows is None or len(metas) != 3:
            return None
        from .library import index_out_of_range
        (s0, d0), (ids_shape, di), (so, do) = metas
        table_shape, rows_shape = (s0, so) if routine == "gather" else (so, s0)
        if np.dtype(di) != np.int32 or len(table_shape) != 2 or \
                any(np.dtype(d) != np.float32 for d in (d0, do)) or \
                tuple(rows_shape) != tuple(ids_shape) + (table_shape[1],):
            return None
        rows, width = table_shape
        n = math.prod(ids_shape)
        index, count = attrs.get("block", (0, 1))
        first, total = index * rows, rows * count
        fn = self._rows[routine]

        def run(ptrs):                  # (rows in, ids, rows out)
            bad = fn(ptrs[0], ptrs[1], n, width, first, total, ptrs[2], rows)
            if bad >= 0:
                raise index_out_of_range(
                    routine, ctypes.c_int32.from_address(ptrs[1] + 4 * bad).value, total)
        return run

    def _gemm_by_address(self, routine: str, attrs: dict, metas):
        """A float32 2-D matmul straight to the team's tessera_gemm_f32 with
        the buffers' addresses (the executor's are C-contiguous; a transposed
        operand is its untransposed buffer and a transpose flag): one ctypes
        call, where the array path (TeamBLAS.matmul) spends a quarter of a
        w128 dp x tp rank's GEMM time on views, flags and `.ctypes`."""
        epilogue = attrs.get("epilogue")
        if routine != "matmul" or self._team is None or (len(metas) != 3 and epilogue is None):
            return None
        (sa, da), (sb, db), (so, do) = metas[0], metas[1], metas[-1]
        if any(len(s) != 2 for s in (sa, sb, so)) or \
                any(np.dtype(d) != np.float32 for d in (da, db, do)):
            return None
        ta, tb = int(bool(attrs.get("transpose_lhs"))), int(bool(attrs.get("transpose_rhs")))
        m, k = (sa[1], sa[0]) if ta else tuple(sa)
        kb, n = (sb[1], sb[0]) if tb else tuple(sb)
        if k != kb or tuple(so) != (m, n) or not m * n * k:
            return None
        pieces = gemm_pieces(m, n, k, self.gemm_block_limit)
        gemm, threads = self._team[0], self.threads
        if epilogue is None:
            return lambda ptrs: gemm(ta, tb, m, n, k, ptrs[0], ptrs[1], ptrs[2], pieces, threads)
        if self._gemm_then is None:
            return None
        # The epilogue kernel's arguments, picked from the launch's buffers.
        then, rows = self._gemm_then, attrs["epilogue_rows"]
        self._kernel(epilogue)            # (a clear error where the library lacks it)
        part = ctypes.cast(getattr(self._lib, epilogue + "__slice"), ctypes.c_void_p).value
        pick, args = operator.itemgetter(*attrs["epilogue_args"]), \
            ctypes.c_void_p * len(attrs["epilogue_args"])
        return lambda ptrs: then(ta, tb, m, n, k, ptrs[0], ptrs[1], ptrs[-1], pieces, threads,
                                 part, args(*pick(ptrs)), rows)

    def run_scope(self):
        return np.errstate(all="ignore")     # IEEE results (inf, nan), as on a GPU

    def _library_numpy(self):
        """The library routines' `xp`: numpy, or TeamBLAS on this engine's
        threads where the kernel library has the team's GEMM."""
        if self._team is None:
            return np
        if self._team_blas is None or self._team_blas.threads != self.threads:
            self._team_blas = TeamBLAS(*self._team, self.threads, self.gemm_block_limit)
        return self._team_blas

    def call_library(self, routine: str, attrs: dict, args, stream=None) -> None:
        with self.run_scope():
            self.prepare_library(routine, attrs, stream)(args)

    # -- events ----------------------------------------------------------------------
    def record_event(self, stream) -> CPUEvent:
        return CPUEvent(stream)

    def wait_event(self, event, stream) -> None:
        if not isinstance(event, CPUEvent):
            raise EngineError(f"event_wait on stream {stream!r}: {event!r} is not a CPU event")
        if not event.completed:   # cannot happen with synchronous launches
            raise EngineError(f"event_wait on stream {stream!r}: {event!r} never completed")
