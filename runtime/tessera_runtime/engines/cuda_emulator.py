"""Runs generated CUDA kernels on the CPU, for testing without a GPU.

The CUDA source the emitter produces is compiled as C++ together with a shim
that runs every CUDA thread of a block as a fiber (a `ucontext` with its own
stack) on the calling thread, round-robin, each until it waits:
`__syncthreads()` is a barrier over the block (named barriers, `bar.sync` /
`bar.arrive` with a thread count, too), the warp-level instructions
the tensor-core main loop uses (`ldmatrix`, `mma.sync.m16n8k16`) and
`__shfl_xor_sync` exchange data between the 32 threads of a warp through a
barrier. Each instruction is implemented from its definition in the PTX
ISA (fragment layouts, wgmma's shared-memory matrix descriptors and
128-byte swizzle included), independently of the emitter, so a kernel that
computes the right answer here indexes its tiles, fragments, swizzled
buffers and pipeline stages correctly.

Asynchronous operations complete as LATE as the PTX ISA allows, not at
issue: a thread's `cp.async` copies happen when it waits for their commit
group (`cp.async.wait_group`; until then the destination holds NaNs), and
its `wgmma.mma_async` operations read shared memory and update its
accumulator registers when it waits for their group (`wgmma.wait_group`). A kernel that reuses a pipeline slot
before the wait that protects it therefore computes with the wrong data
here, as it could on a GPU. The emulator says nothing about speed, cannot
check proxy fences (`fence.proxy.async`), and cannot catch races that a
real GPU's timing would expose beyond what the waits and barriers order:
its threads run one at a time in index order between waits, so a thread
reading, with no barrier between, what a lower-numbered thread writes sees
the write here (and the same order every run).

The emulator is C++ in `emulator/` beside this file: its machinery
(`tessera_emulator.cpp`: fibers, barriers, the instructions, the launcher)
is compiled once per cache into an object file; a kernel source is compiled
after `tessera_emulator_api.h`, the calls into it (declarations and one-line
wrappers, a few hundred lines), and linked with that object: 0.45 s of
g++ for a small kernel instead of 2.4 s with the whole emulator in its
translation unit.

    lib = EmulatedKernels(cuda_source)
    lib.launch("kernel_name", [a, b, out], grid=(4,), block=(256,), shared_bytes=56832)

The `cuda-emulated` engine (`emulated_cuda.py`) runs whole GPU bundles this way.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path


import numpy as np

from .. import env
from ..env import cache_dir
from . import EngineError
from .tensor_maps import TensorMaps, emulated_tensor_map


#: The emulator's C++ (see the module docstring), compiled with -I here.
EMULATOR_DIR = Path(__file__).resolve().parent / "emulator"
EMULATOR_CORE, EMULATOR_API = "tessera_emulator.cpp", "tessera_emulator_api.h"


def _cached_compile(cxx: str, source: str, suffix: str, flags: list[str],
                    inputs: tuple[Path, ...] = ()) -> Path:
    """`source` compiled with `flags` (and linked with `inputs`) into the
    emulated cache, named by the hash of all of it. The ranks of a job build
    the same file: one compiles while the others sleep on the lock, then
    they load its file (each compiling its own copy at once took N times the
    g++ time on shared cores)."""
    flags = ["-std=c++20", "-O1", "-fPIC", "-w", *flags]
    key = hashlib.sha256("\0".join([source, cxx, *flags, *(p.name for p in inputs),
                                     env.folder_digest(EMULATOR_DIR)]).encode())
    target = cache_dir("emulated") / f"{key.hexdigest()[:24]}{suffix}"
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / "emulated.cpp"
            src.write_text(source)
            out = Path(tmp) / f"out{suffix}"
            proc = subprocess.run([cxx, *flags, f"-I{EMULATOR_DIR}", str(src), *map(str, inputs),
                                   "-o", str(out)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise EngineError("compiling CUDA kernels for CPU emulation failed:\n"
                                  + proc.stderr[-4000:])
            os.replace(out, target)
    return target


class EmulatedKernels:
    """The kernels of a CUDA source compiled for CPU emulation."""

    def __init__(self, cuda_source: str, defines=()):
        """Compiles `cuda_source` with the emulator's API and links it with
        the emulator's core; `defines` are preprocessor names defined first
        (TESSERA_EMULATE_NO_WGMMA runs the plain-sm_90 branch of wgmma
        kernels)."""
        self.uses_nvshmem = "#include <nvshmem.h>" in cuda_source
        if self.uses_nvshmem:      # the API header has the device API NVSHMEM's headers declare
            cuda_source = "\n".join(line for line in cuda_source.splitlines()
                                    if line not in ("#include <nvshmem.h>", "#include <nvshmemx.h>"))
        cxx = env.host_compiler()
        if not cxx:
            raise EngineError("CUDA emulation compiles kernels with a C++20 compiler: "
                              "install g++ or set CXX")
        core = _cached_compile(cxx, f'#include "{EMULATOR_CORE}"\n', ".o", ["-c"])
        source = (f'#include "{EMULATOR_API}"\n' + "".join(f"#define {d} 1\n" for d in defines)
                  + cuda_source)
        target = _cached_compile(cxx, source, ".so", ["-shared", "-pthread"], inputs=(core,))
        self._lib = ctypes.CDLL(str(target))
        self._tensor_maps: dict = {}
        self._lib.tessera_emulator_wait.argtypes = [ctypes.c_double]
        self._lib.tessera_emulator_wait(env.number("TESSERA_EMULATOR_WAIT_S"))
        self._max_args = self._lib.tessera_emulator_max_args()
        self._lib.tessera_emulate.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                              ctypes.POINTER(ctypes.c_void_p),
                                              ctypes.POINTER(ctypes.c_uint), ctypes.c_uint]

    def attach_symmetric_heap(self, base: int, heap_bytes: int, pe: int, n_pes: int) -> None:
        """Points the NVSHMEM emulation at the job's shared heap mapping
        (address `base`, `heap_bytes` per PE) as PE `pe` of `n_pes`."""
        self._lib.tessera_nvshmem_attach.argtypes = [ctypes.c_void_p, ctypes.c_uint64,
                                                     ctypes.c_int, ctypes.c_int]
        self._lib.tessera_nvshmem_attach(base, heap_bytes, pe, n_pes)

    def launch(self, kernel: str, buffers, grid, block, shared_bytes: int = 0,
               tensor_maps=()) -> None:
        """Runs `kernel` over `grid` blocks of `block` threads on C-contiguous
        numpy `buffers` (written in place). `tensor_maps` are the launch
        record's (see tensor_maps.py): their buffer is passed last."""
        for i, b in enumerate(buffers):
            if not isinstance(b, np.ndarray) or not b.flags.c_contiguous:
                raise EngineError(f"buffer {i} of kernel {kernel} must be a C-contiguous numpy array")
        if tensor_maps:
            maps = self._tensor_maps.get(kernel)
            if maps is None:       # one per kernel: its maps are cached per argument addresses
                maps = self._tensor_maps[kernel] = TensorMaps(
                    tensor_maps, emulated_tensor_map, lambda a: a.ctypes.data,
                    lambda blob: np.frombuffer(blob, np.uint8).copy())
            buffers = list(buffers) + [maps.for_args(buffers)]
        threads = int(np.prod(block))
        if len(buffers) > self._max_args:
            raise EngineError(f"kernel {kernel} takes {len(buffers)} buffers; the emulator "
                              f"supports {self._max_args}")
        fn = ctypes.cast(getattr(self._lib, kernel), ctypes.c_void_p)
        args = (ctypes.c_void_p * len(buffers))(*[b.ctypes.data for b in buffers])
        dims = (ctypes.c_uint * 3)(*(list(grid) + [1, 1, 1])[:3])
        if self._lib.tessera_emulate(fn, len(buffers), args, dims, threads) != 0:
            raise EngineError(f"kernel {kernel}: blocks of {threads} threads must be whole warps")
