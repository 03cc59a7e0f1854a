"""The `cuda-emulated` engine: a GPU bundle's CUDA kernels run on the CPU.

Buffers are numpy arrays and library routines run on numpy, as in the CPU
engine; kernel launches go through `cuda_emulator.EmulatedKernels` with the
launch configuration the compiler recorded for each kernel (grid, block,
dynamic shared memory). It exists to test the GPU code path (generated
kernels, launch configurations, tensor-core fragment layouts) on machines
without a GPU; it is slow (one OS thread per CUDA thread). Select it with
`TESSERA_CUDA_EMULATE=1` or `load_bundle(path, engine="cuda-emulated")`.
"""

from __future__ import annotations

from pathlib import Path

from . import EngineError
from .cpu import CPUEngine
from .cuda_emulator import EmulatedKernels


class EmulatedCUDAEngine(CPUEngine):
    name = "cuda-emulated"

    def __init__(self):
        super().__init__()
        self._emulated = None
        self._launches: dict = {}

    def load_kernels(self, path, launches=None) -> None:
        path = Path(path)
        if not path.is_file():
            raise EngineError(f"CUDA kernel source not found: {path}")
        self._emulated = EmulatedKernels(path.read_text())
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
        return lambda args: emulated.launch(kernel, args, cfg["grid"], cfg["block"],
                                            cfg["shared_bytes"])
