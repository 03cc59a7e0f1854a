"""The CUDA printer: CUDA C++ for sm_90a (Hopper) from scheduled Tile IR.

tessera-gpu-software-pipeline, tessera-gpu-place and tessera-gpu-alloc-shared decide
how each kernel runs (which loops pipeline on tensor cores, where each tile
lives, shared-memory offsets); this package prints what they decided, one
module per op family, composed into `CudaKernelEmitter` (kernel.py):

* pointwise.py: pointwise regions, one per-thread loop over an iteration
  shape with values in registers (or over a tensor-core fragment's).
* reduce.py: `ttile.reduce` over lane groups and warp shuffles.
* mma.py: `ttile.dot` on tensor cores or CUDA cores, and the mma.sync
  building blocks (accumulators, ldmatrix, mma tiles).
* staging.py: cp.async and TMA rings of `stages` slots, mbarriers.
* gemm.py: GEMM main loops on mma.sync or wgmma, fed by cp.async, TMA or a
  producer warpgroup.
* register_loop.py: loops whose tiles stay in registers (flash attention).
* nvshmem.py: device-initiated puts, gets, signals and waits.
* prelude.py: the source's preamble and the `tessera_*` PTX wrappers.
* common.py: what several parts share (fragment layout, wgmma descriptors).

`emit_cuda_kernels(module, options)` returns the source and each kernel's
launch configuration.
"""

from .kernel import CudaKernelEmitter, emit_cuda, emit_cuda_kernels  # noqa: F401
