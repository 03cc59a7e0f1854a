"""The `cuda-emulated` engine: a GPU bundle's CUDA kernels run on the CPU.

Buffers are numpy arrays and library routines run on numpy, as in the CPU
engine; kernel launches go through `cuda_emulator.EmulatedKernels` with the
launch configuration the compiler recorded for each kernel (grid, block,
dynamic shared memory). It exists to test the GPU code path (generated
kernels, launch configurations, tensor-core fragment layouts) on machines
without a GPU; it is slow (one OS thread per CUDA thread). Select it with
`TESSERA_CUDA_EMULATE=1` or `load_bundle(path, engine="cuda-emulated")`.
It emulates an sm_90a GPU (wgmma, TMA, setmaxnreg); with
`TESSERA_EMULATE_ARCH=sm_90` it runs the branch kernels take on plain
sm_90 instead (mma.sync where sm_90a has wgmma: what NVRTC builds).

Kernels calling NVSHMEM run too (`cuda_emulator`'s NVSHMEM shim): the PEs
are the job's MPI ranks and the symmetric heap is a file in /dev/shm that
every rank maps (`SymmetricHeap`, TESSERA_EMULATED_NVSHMEM_HEAP bytes per
PE, 256 MiB by default; pages are only backed once written). Before each
launch of such a kernel its signal arguments are zeroed and the ranks meet
at an MPI barrier, as the cuda engine does with `nvshmem_barrier_all`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import env
from ..shared_memory import shared_mapping
from . import EngineError
from .cpu import CPUEngine
from .cuda_emulator import EmulatedKernels

_ALIGN = 256
# What the emulator defines to run kernels as each architecture.
_ARCH_DEFINES = {"sm_90a": (), "sm_90": ("TESSERA_EMULATE_NO_WGMMA",)}


def _mpi_world():
    """MPI.COMM_WORLD (imported only by multi-rank NVSHMEM programs)."""
    from .. import mpi_comm
    return mpi_comm.MPI.COMM_WORLD


class SymmetricHeap:
    """One shared mapping holding every PE's heap; allocations are bump
    offsets, identical on every rank because every rank allocates the same
    buffers in the same order (as with nvshmem_malloc)."""

    def __init__(self, rank: int, size: int, heap_bytes: int):
        self.rank, self.size, self.heap_bytes, self.used = rank, size, heap_bytes, 0
        world = _mpi_world() if size > 1 else None
        self.map = shared_mapping(world, heap_bytes * size, "tessera-nvshmem-")
        self.base = np.frombuffer(self.map, np.uint8).ctypes.data

    def alloc(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset = self.used
        if offset + nbytes > self.heap_bytes:
            raise EngineError(f"the emulated NVSHMEM heap ({self.heap_bytes} B per PE) cannot hold "
                              f"another {nbytes} B; set TESSERA_EMULATED_NVSHMEM_HEAP")
        self.used = (offset + nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        return np.ndarray(tuple(shape), dtype, buffer=self.map,
                          offset=self.rank * self.heap_bytes + offset)


class EmulatedCUDAEngine(CPUEngine):
    name = "cuda-emulated"
    by_address = False          # the emulator's launches take the arrays

    def __init__(self):
        super().__init__()
        self._emulated = None
        self._launches: dict = {}
        self._heap = None

    def new_symmetric(self, shape, dtype):
        if self._heap is None:
            from .. import world
            rank, size = world()
            heap = env.integer("TESSERA_EMULATED_NVSHMEM_HEAP")
            self._heap = SymmetricHeap(rank, size, heap)
        return self._heap.alloc(shape, dtype)

    def load_kernels(self, path, launches=None) -> None:
        path = Path(path)
        if not path.is_file():
            raise EngineError(f"CUDA kernel source not found: {path}")
        arch = env.value("TESSERA_EMULATE_ARCH")
        if arch not in _ARCH_DEFINES:
            raise EngineError(f"TESSERA_EMULATE_ARCH={arch!r}: the emulator runs kernels as "
                              f"{' or '.join(_ARCH_DEFINES)}")
        self._emulated = EmulatedKernels(path.read_text(), _ARCH_DEFINES[arch])
        self._launches = dict(launches or {})
        self.kernel_library = path

    def has_kernel(self, kernel: str) -> bool:
        return self._emulated is not None and kernel in self._launches

    def launch(self, kernel: str, args, stream=None) -> None:
        self.prepare_launch(kernel, len(args), stream)(args)

    def prepare_launch(self, kernel: str, n_args: int, stream=None):
        if not self.has_kernel(kernel):
            raise EngineError(f"kernel '{kernel}' has no launch configuration in "
                              f"{self.kernel_library}")
        cfg = self._launches[kernel]
        emulated = self._emulated
        maps = cfg.get("tensor_maps", ())
        if not cfg.get("nvshmem"):
            return lambda args: emulated.launch(kernel, args, cfg["grid"], cfg["block"],
                                                cfg["shared_bytes"], maps)
        signals = cfg.get("signals", [])

        def launch_nvshmem(args):
            heap = self._heap
            if heap is None:
                raise EngineError(f"kernel '{kernel}' calls NVSHMEM but no symmetric buffer "
                                  "was allocated")
            emulated.attach_symmetric_heap(heap.base, heap.heap_bytes, heap.rank, heap.size)
            for i in signals:
                args[i][...] = 0
            if heap.size > 1:
                _mpi_world().Barrier()
            emulated.launch(kernel, args, cfg["grid"], cfg["block"], cfg["shared_bytes"], maps)
        return launch_nvshmem
