"""Tile IR -> kernel source. `emit_cpp` (CPU engine) and `emit_cuda` (GPU) walk the
same `ttile.kernel`s. The CPU emitter runs the grid as loops over tiles held in
local arrays; the CUDA emitter runs one thread block per grid point, keeps
chains of elementwise ops in registers, and runs GEMM main loops on tensor
cores."""

from .cuda import emit_cuda, emit_cuda_kernels  # noqa: F401
from .tile_emitter import emit_cpp  # noqa: F401
