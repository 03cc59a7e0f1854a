"""Every environment variable Tessera reads, in one place: what it does, who
reads it and its default. No other module reads the environment
(`test/test_env.py` checks it); `tessera --env` prints this table with the
values set now.

It lives in the runtime because the runtime is the one package every other
imports (a bundle runs where only the runtime is installed); it imports
nothing but the standard library.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variable:
    name: str
    #: who reads it: frontend (the `tessera` API), compiler, runtime, tests
    reader: str
    #: the value when unset, as text ("" for none)
    default: str
    doc: str


# (rank, size) variables set by common MPI launchers, in the order `world()` tries them.
LAUNCHER_RANKS = (
    ("PMI_RANK", "PMI_SIZE"),                          # MPICH / Hydra, Intel MPI
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),    # MVAPICH2
    ("SLURM_PROCID", "SLURM_NTASKS"),                  # srun
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),            # Hydra, node-local: 1-node fallback
)

_VARIABLES = [
    Variable("TESSERA_TARGET", "frontend", "cpu",
             "default target of compiled functions: cpu or gpu"),
    Variable("TESSERA_DETERMINISTIC", "frontend", "0",
             "1: every reduction in a fixed order, bitwise reproducible (dist.deterministic)"),
    Variable("TESSERA_DUMP_IR", "frontend", "",
             "a folder: rank 0 writes every compiled function's IR at every level there "
             "(`tessera trace` sets it)"),
    Variable("TESSERA_DUMP_KERNELS", "compiler", "",
             "a folder: every kernel the C++ and CUDA printers emit is written there, one "
             "file per kernel named by the hash of its text (compare two folders to see "
             "which kernels a compiler change altered)"),
    Variable("TESSERA_COLLECTIVE_REPORT", "frontend", "",
             "a byte count: print the collectives each compiled function needs that move at "
             "least that many bytes per rank, with the Python line behind each"),
    Variable("TESSERA_MEMORY_REPORT", "frontend", "0",
             "1: rank 0 prints each compiled function's memory plan (peak bytes per rank and "
             "what holds it; `tessera trace --memory` sets it)"),
    Variable("TESSERA_RANKS_PER_NODE", "frontend", "",
             "world ranks per node (consecutive): all-reduces over an axis spanning nodes "
             "become reduce-scatter in each node, all-reduce across nodes, all-gather in each "
             "node (`tessera launch --ranks-per-node` sets it)"),
    Variable("TESSERA_AUTOTUNE", "frontend", "0",
             "1: every compiled function measures the compile options that matter on its "
             "first call of a signature and runs the fastest (ts.jit(..., autotune=True)); "
             "choices are stored under the cache directory (`tessera autotune --show`)"),
    Variable("TESSERA_AUTOTUNE_CANDIDATES", "frontend", "5",
             "how many candidates an autotuning search compiles and times (the cost model "
             "ranks them when there are more)"),
    Variable("TESSERA_AUTOTUNE_REPS", "frontend", "5",
             "timed runs per autotuning candidate (after one warm-up; the median counts)"),
    Variable("TESSERA_SHOW_IR", "compiler", "0",
             "1: compile errors include the IR of the operation that failed (MLIR's "
             "'see current operation' note)"),
    Variable("TESSERA_CACHE_DIR", "compiler, runtime", "$XDG_CACHE_HOME/tessera",
             "where compiled kernels, bundles and NVRTC cubins are cached"),
    Variable("XDG_CACHE_HOME", "compiler, runtime", "~/.cache",
             "the cache's parent when TESSERA_CACHE_DIR is unset"),
    Variable("CXX", "compiler, runtime", "c++",
             "the host C++ compiler for CPU kernels and the CUDA emulator"),
    Variable("TESSERA_NUM_THREADS", "runtime", "the cores this process may use / ranks",
             "threads a large generated CPU kernel runs on (its outermost grid loop split "
             "in equal slices); ranks of one job share the cores"),
    Variable("TESSERA_GEMM_BLOCKS", "runtime", "the machine's cores / ranks on it, up to 4",
             "the most blocks a large float32 GEMM is cut into for the kernels' threads; the "
             "result's bits depend on it (not on the thread count)"),
    Variable("TESSERA_CPU_KEEP_FREED", "runtime", "1",
             "0: the CPU engine leaves glibc's malloc as it is (by default the heap keeps "
             "the memory a run frees, so the next run does not page-fault it in again)"),
    Variable("TESSERA_BLAS_THREAD_TIMEOUT", "runtime", "4",
             "log2 of the CPU cycles numpy's OpenBLAS worker threads spin after a call "
             "before they sleep, set by the CPU engine once it prepares a program with a "
             "GEMM of >= 8 MiB (OpenBLAS's own default, 28, is ~0.1 s: a spinning worker "
             "takes a core from the generated kernels); 0 leaves OpenBLAS as it is"),
    Variable("OPENBLAS_THREAD_TIMEOUT", "runtime", "",
             "OpenBLAS's own setting of the above (read when it loads): when set, the CPU "
             "engine leaves it"),
    Variable("GOMP_SPINCOUNT", "runtime", "",
             "libgomp's rounds of spinning after a parallel region (read when it loads); "
             "unless it or OMP_WAIT_POLICY is set, the CPU engine exports 0 before it "
             "loads a kernel library, so the generated kernels' OpenMP team sleeps between "
             "launches instead of taking the core OpenBLAS's GEMM worker needs"),
    Variable("OMP_WAIT_POLICY", "runtime", "",
             "OpenMP's spin-or-sleep policy: when set, the CPU engine leaves GOMP_SPINCOUNT "
             "unset"),
    Variable("OMPI_COMM_WORLD_LOCAL_SIZE", "runtime", "",
             "the job's ranks on this machine (set by Open MPI; MPI_LOCALNRANKS with Hydra): "
             "they share its cores"),
    Variable("TESSERA_BUILD_JOBS", "compiler", "the cores this process may use",
             "how many host C++ compiles of generated kernels run at once (a kernel "
             "source is split into that many translation units, each cached)"),
    Variable("NVSHMEM_HOME", "compiler", "",
             "an NVSHMEM install to compile NVSHMEM kernels against (else the "
             "nvidia-nvshmem-cu13 wheel)"),
    Variable("TESSERA_OPT_TRACEBACK", "compiler", "",
             "1: tessera-opt prints the Python traceback of a pass that raised (for developers)"),
    Variable("TESSERA_COMM_TRACE", "runtime", "0",
             "1: every rank logs every collective it runs"),
    Variable("TESSERA_COLLECTIVE_TIMEOUT", "runtime", "600",
             "seconds a collective or transfer may take to complete before the rank dumps "
             "its flight recorder (its last collectives) and fails with CollectiveTimeout"),
    Variable("TESSERA_CHECK_INPUTS", "frontend", "first",
             "when the ranks compare checksums of the arguments they must pass alike (numpy "
             "arrays, replicated DTensor blocks, captured constants) in a multi-rank job: "
             "'first' (before each compiled signature's first run), 'always' (every call) or "
             "'never'"),
    Variable("TESSERA_SHM_COLLECTIVES", "runtime", "1",
             "0: collectives and transfers between CPU ranks on one machine go through MPI "
             "instead of shared memory (where a waiting rank sleeps instead of spinning)"),
    Variable("TESSERA_SHM_MESSAGE_BYTES", "runtime", str(1 << 20),
             "the largest collective or transfer (bytes per rank) that goes through shared "
             "memory in one piece: larger broadcasts and transfers go in pieces of this "
             "size, other larger collectives through MPI. Each group of n ranks maps 16 x n "
             "times this, once per process"),
    Variable("TESSERA_FLIGHT_RING", "runtime", "64",
             "how many of its latest collectives and transfers each rank's flight recorder "
             "keeps"),
    Variable("TESSERA_FLIGHT_DIR", "runtime", "",
             "a folder where each rank writes its flight recorder on a timeout, when asked "
             "(SIGUSR1) and at exit; `tessera launch` sets it and merges the records"),
    Variable("TESSERA_PROFILE", "frontend", "",
             "a folder: profile the whole run as dist.profile does and write trace.json and "
             "summary.txt there (`tessera launch --profile DIR` sets it)"),
    Variable("TESSERA_CUDA_EMULATE", "runtime", "0",
             "1: run GPU bundles on the CPU emulator of the generated CUDA (cuda-emulated engine)"),
    Variable("TESSERA_EMULATE_ARCH", "runtime", "sm_90a",
             "the architecture the emulator runs kernels as: sm_90a (wgmma branches) or sm_90"),
    Variable("TESSERA_EMULATED_NVSHMEM_HEAP", "runtime", str(256 << 20),
             "bytes of the emulated NVSHMEM symmetric heap per PE"),
    Variable("TESSERA_EMULATOR_WAIT_S", "runtime", "120",
             "seconds an emulated wait (mbarrier, named barrier, NVSHMEM signal) spins before "
             "the emulator stops the kernel with a message"),
    Variable("TESSERA_CUDA_DEVICE", "runtime", "rank % devices",
             "the GPU this process uses"),
    Variable("CUDA_PATH", "runtime", "",
             "a CUDA toolkit whose lib64 holds libnvrtc (after the nvidia-cuda-nvrtc wheel)"),
    Variable("CUDA_HOME", "runtime", "", "as CUDA_PATH"),
    Variable("TESSERA_ELASTIC_CONTROL", "frontend", "",
             "the control folder of `tessera launch --elastic` (set by the launcher): "
             "dist.elastic reports the sizes the script accepts there and hears resize "
             "requests, and each rank's wrapper reports how its rank ended"),
    Variable("TESSERA_ELASTIC_RESTART", "frontend", "0",
             "how many times `tessera launch --elastic` restarted this job (set by the launcher)"),
    Variable("TESSERA_ELASTIC_MAX", "frontend", "0",
             "the largest job `tessera launch --elastic` may start (set by the launcher)"),
    Variable("TESSERA_ELASTIC_KILL", "frontend", "",
             "RANK:STEP: that rank kills itself with SIGKILL at that dist.elastic safe point of "
             "the job's first run (to test elastic restarts)"),
    Variable("TESSERA_STRICT_SKIPS", "tests", "0",
             "1 (CI): a test that skips for anything but a missing GPU fails"),
] + [Variable(rank, "runtime", "", f"this process' rank, with {size} (set by MPI launchers; "
              "none set: a single process)") for rank, size in LAUNCHER_RANKS] \
  + [Variable(size, "runtime", "", f"the job's size, with {rank}")
     for rank, size in LAUNCHER_RANKS]

VARIABLES: dict[str, Variable] = {v.name: v for v in _VARIABLES}


def _known(name: str) -> str:
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a documented Tessera environment variable "
                       "(add it to tessera_runtime/env.py)")
    return name


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value; `default` when unset (or set to "")."""
    value = os.environ.get(_known(name))
    return value if value else default


def export(name: str, value: str) -> None:
    """Sets a variable for this process' libraries (a C library reading its
    environment) and the processes it starts."""
    os.environ[_known(name)] = value


def raw(name: str) -> str | None:
    """The variable's value as set ("" included); None when unset."""
    return os.environ.get(_known(name))


def is_set(name: str) -> bool:
    return _known(name) in os.environ


def flag(name: str) -> bool:
    """Whether the variable is set to anything but "" or "0"."""
    return os.environ.get(_known(name), "") not in ("", "0")


def value(name: str) -> str:
    """The variable's value, else the default the table documents (for
    variables whose default is a value, not a description)."""
    return get(name) or VARIABLES[name].default


def integer(name: str, default: int | None = None) -> int:
    """As an integer; unset: `default`, else the table's default."""
    text = get(name)
    return int(text) if text is not None else default if default is not None \
        else int(VARIABLES[name].default)


def number(name: str, default: float | None = None) -> float:
    """As a float; unset: `default`, else the table's default."""
    text = get(name)
    return float(text) if text is not None else default if default is not None \
        else float(VARIABLES[name].default)


def cache_root() -> Path:
    """The root of every cache Tessera keeps (compiled kernels, bundles,
    NVRTC cubins, emulator libraries)."""
    root = get("TESSERA_CACHE_DIR") or os.path.join(
        get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tessera")
    return Path(root)


def cache_dir(kind: str) -> Path:
    """The cache's directory for build products of `kind` ("kernels",
    "bundles", "nvrtc", "emulated"), created if missing."""
    path = cache_root() / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def folder_digest(folder: Path) -> str:
    """The hash of every file in `folder` (names and contents): the part of
    a cached build's key for the headers its source includes by name only,
    so an edited header never reuses an object built from the old one."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def count(name: str) -> int | None:
    """A variable holding a count (of threads, jobs): None when unset, at
    least 1; ValueError naming it when it is not a number."""
    text = get(name)
    if text is None:
        return None
    try:
        return max(1, int(text))
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None


def cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1


def host_compiler() -> str | None:
    """The host C++ compiler: CXX, else c++ or g++ on the PATH."""
    return get("CXX") or shutil.which("c++") or shutil.which("g++")


def table() -> str:
    """Every variable, grouped by who reads it: its value now (or "unset")
    and what it does, with its default."""
    width = max(len(v.name) for v in _VARIABLES)
    lines = []
    for reader in dict.fromkeys(v.reader for v in _VARIABLES):
        lines.append(f"read by the {reader}:")
        for v in (v for v in _VARIABLES if v.reader == reader):
            now = os.environ.get(v.name)
            shown = "unset" if now is None else repr(now)
            doc = v.doc + (f" (default: {v.default})" if v.default else "")
            wrapped = textwrap.wrap(doc, 100 - width - 20) or [""]
            lines.append(f"  {v.name:<{width}}  {shown:<14}  {wrapped[0]}")
            lines += [" " * (width + 20) + w for w in wrapped[1:]]
    return "\n".join(lines)
