"""Kernel families tessera-lower-to-tile builds beyond fused elementwise
runs (not passes; the pass calls them):

* `gemm`: a GEMM's configuration, tile order and K loop (`gemm_config`,
  `gemm_offsets`, `gemm_tile`);
* `flash_attention`: the forward and backward flash-attention kernels of
  `tgraph.attention` / `tgraph.attention_grad` (`forward_kernel`,
  `backward_kernels`);
* `collective_gemm`: the interface of a GEMM fused with its collective over
  NVSHMEM (`CollectiveGemm`), implemented by `gathered_gemm.GatheredGemm`
  (all_gather + matmul) and `scattered_gemm.ScatteredGemm` (matmul +
  reduce_scatter);
* `exchange`: an all_to_all over NVSHMEM as a kernel of its own (an MoE
  layer's dispatch and combine: `exchange_kernel`).

They build Tile IR with `tessera_compiler.ir.tile_builder` and read their
knobs from `TargetOptions`; none imports the pass.
"""
