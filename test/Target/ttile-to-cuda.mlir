// RUN: tessera-translate --ttile-to-cuda %s --split-input-file --verify-diagnostics | FileCheck %s

// The same kernel for the GPU: program ids are block indices; tiles that an
// op outside their region needs (the dot's operands, the loop-carried
// accumulator, the reduction's input) live in dynamic shared memory; the
// chain relu -> add -> mul -> max -> exp is ONE loop in which each thread
// computes whole elements in registers; the row sum splits each row over a
// group of lanes combined by warp shuffles.
// CHECK: // launch: grid (2), block (64), dynamic shared memory [[SMEM:[0-9]+]] bytes
// CHECK: extern "C" __global__ void __launch_bounds__(64) everything(void* arg0_, void* arg1_, void* arg2_, void* arg3_) {
// CHECK: extern __shared__ __align__(128) unsigned char tessera_smem[];
// CHECK: const int64_t pid0 = blockIdx.x;
// CHECK: for (int64_t [[K:k[0-9]+]] = {{c[0-9]+}}; [[K]] < {{c[0-9]+}}; [[K]] += {{c[0-9]+}}) {
// CHECK: // ttile.dot 4x4x2 on CUDA cores: the dot has no 'warps'
// CHECK: for (int64_t k = 0; k < 2; ++k) s +=
// CHECK: for (int64_t [[E:e[0-9]+]] = threadIdx.x; [[E]] < 16; [[E]] += blockDim.x) {
// CHECK: const float [[R:v[0-9]+]] = ([[ACC:t[0-9]+]][{{.*}}] > 0 ? [[ACC]][{{.*}}] : 0);
// CHECK-NEXT: const float [[S:v[0-9]+]] = [[R]] + [[ACC]][{{.*}}];
// CHECK-NEXT: const float [[M:v[0-9]+]] = [[S]] * [[S]];
// CHECK-NEXT: const float [[X:v[0-9]+]] = ([[M]] > [[S]] ? [[M]] : [[S]]);
// CHECK-NEXT: const float [[EX:v[0-9]+]] = exp([[X]]);
// CHECK-NEXT: [[T:t[0-9]+]][{{.*}}] = [[EX]];
// CHECK: __syncthreads();
// CHECK: arg2[{{.*}}] = [[T]][{{.*}}];
// CHECK: __shfl_xor_sync(0xffffffffu, a, off)
tgraph.mesh @unused axes = ["x"] shape = [1]
ttile.kernel @everything(%a: memref<8x4xf32>, %b: memref<4x4xf32>, %c: memref<8x4xf32>, %r: memref<8x1xf32>)
    attributes {grid = array<i64: 2>, block = array<i64: 64>} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %row = arith.muli %pid, %c4 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<4x4xf32>
  %acc = scf.for %k = %c0 to %c4 step %c2 iter_args(%it = %acc0) -> (!ttile.tile<4x4xf32>) {
    %ta = ttile.load %a[%row, %k] : memref<8x4xf32> -> !ttile.tile<4x2xf32>
    %tb = ttile.load %b[%k, %c0] : memref<4x4xf32> -> !ttile.tile<2x4xf32>
    %d = ttile.dot %ta, %tb, %it : !ttile.tile<4x2xf32>, !ttile.tile<2x4xf32> -> !ttile.tile<4x4xf32>
    scf.yield %d : !ttile.tile<4x4xf32>
  }
  %r0 = ttile.relu %acc : !ttile.tile<4x4xf32>
  %s = ttile.add %r0, %acc : !ttile.tile<4x4xf32>
  %m = ttile.mul %s, %s : !ttile.tile<4x4xf32>
  %x = ttile.max %m, %s : !ttile.tile<4x4xf32>
  %e = ttile.exp %x : !ttile.tile<4x4xf32>
  ttile.barrier
  ttile.store %e, %c[%row, %c0] : !ttile.tile<4x4xf32>, memref<8x4xf32>
  %red = ttile.reduce %e {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<4x4xf32> -> !ttile.tile<4x1xf32>
  ttile.store %red, %r[%row, %c0] : !ttile.tile<4x1xf32>, memref<8x1xf32>
  ttile.return
}

// -----

// expected-error @+1 {{element type i16 is not supported by the kernel emitter yet}}
ttile.kernel @short_ints(%a: memref<4x4xi16>, %b: memref<4x4xi16>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %a[%c0, %c0] : memref<4x4xi16> -> !ttile.tile<4x4xi16>
  ttile.store %t, %b[%c0, %c0] : !ttile.tile<4x4xi16>, memref<4x4xi16>
  ttile.return
}

// -----

ttile.kernel @float_scalar(%a: memref<4xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @+1 {{only integer/index constants are supported in kernels}}
  %f = arith.constant 1.0 : f32
  ttile.return
}

// -----

// A bf16 GEMM with `warps` and `stages` runs on tensor cores: a 3-stage
// cp.async ring of A and B tiles in shared memory, ldmatrix, mma.sync into an
// f32 register accumulator; the epilogue (cast, bias, relu, store) runs on
// the accumulator registers without touching shared memory.
// CHECK-LABEL: // ttile.kernel @gemm
// CHECK: // launch: grid (4), block (128), dynamic shared memory 29184 bytes
// CHECK: // tensor-core GEMM: block tile 64x64x32, warps 2x2, 3 stages
// CHECK: float [[ACC:acc[0-9]+]][2][4][4];
// CHECK: tessera_cp_async16(sa +
// CHECK: tessera_cp_async_commit();
// CHECK: tessera_cp_async_wait<1>();
// CHECK: tessera_ldmatrix_x4(af[mi], a_st +
// CHECK: tessera_ldmatrix_x4_trans(r, b_st +
// CHECK: tessera_mma_bf16([[ACC]][mi][ni], af[mi], bf[ni]);
// CHECK: tessera_cp_async_wait<0>();
// CHECK: const int64_t [[ROW:x[0-9]+]] = {{.*}} + 16 * {{.*}} + ({{.*}} >> 2) + 8 * ({{.*}} >> 1);
// CHECK: const float [[V:v[0-9]+]] = bf16_round((float)([[ACC]][{{.*}}]));
// CHECK: bf16_to_float(arg2[
// CHECK: arg3[{{.*}}] = float_to_bf16(
ttile.kernel @gemm(%a: memref<128x96xbf16>, %b: memref<96x128xbf16>, %bias: memref<1x128xbf16>, %c: memref<128x128xbf16>)
    attributes {grid = array<i64: 4>, block = array<i64: 128>, stages = 3 : i64} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c2 = arith.constant 2 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %c96 = arith.constant 96 : index
  %bi = arith.divui %pid, %c2 : index
  %bj = arith.remui %pid, %c2 : index
  %row = arith.muli %bi, %c64 : index
  %col = arith.muli %bj, %c64 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  %acc = scf.for %k = %c0 to %c96 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %ta = ttile.load %a[%row, %k] : memref<128x96xbf16> -> !ttile.tile<64x32xbf16>
    %tb = ttile.load %b[%k, %col] : memref<96x128xbf16> -> !ttile.tile<32x64xbf16>
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 2, 2>} : !ttile.tile<64x32xbf16>, !ttile.tile<32x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  }
  %h = ttile.cast %acc : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
  %tbias = ttile.load %bias[%c0, %col] : memref<1x128xbf16> -> !ttile.tile<1x64xbf16>
  %bb = ttile.broadcast %tbias : !ttile.tile<1x64xbf16> to !ttile.tile<64x64xbf16>
  %y = ttile.add %h, %bb : !ttile.tile<64x64xbf16>
  %r = ttile.relu %y : !ttile.tile<64x64xbf16>
  ttile.store %r, %c[%row, %col] : !ttile.tile<64x64xbf16>, memref<128x128xbf16>
  ttile.return
}

// -----

// The same loop with f32 operands stays on CUDA cores, and the emitter says why.
// CHECK-LABEL: // ttile.kernel @f32_gemm
// CHECK: // ttile.dot 16x16x16 on CUDA cores: f32 operands with an f32 accumulator (tensor cores: bf16/f16 into f32)
ttile.kernel @f32_gemm(%a: memref<16x16xf32>, %c: memref<16x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<16x16xf32>
  %acc = scf.for %k = %c0 to %c16 step %c16 iter_args(%it = %acc0) -> (!ttile.tile<16x16xf32>) {
    %ta = ttile.load %a[%c0, %k] : memref<16x16xf32> -> !ttile.tile<16x16xf32>
    %tb = ttile.load %a[%k, %c0] : memref<16x16xf32> -> !ttile.tile<16x16xf32>
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 1, 1>} : !ttile.tile<16x16xf32>, !ttile.tile<16x16xf32> -> !ttile.tile<16x16xf32>
    scf.yield %d : !ttile.tile<16x16xf32>
  }
  ttile.store %acc, %c[%c0, %c0] : !ttile.tile<16x16xf32>, memref<16x16xf32>
  ttile.return
}

// -----

// expected-error @+1 {{kernel @too_big needs 263168 bytes of shared memory; an sm_90 block has at most 232448: use smaller tiles or fewer stages}}
ttile.kernel @too_big(%a: memref<256x256xf32>, %r: memref<256x1xf32>) attributes {grid = array<i64: 1>, block = array<i64: 256>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %a[%c0, %c0] : memref<256x256xf32> -> !ttile.tile<256x256xf32>
  %s = ttile.reduce %t {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<256x256xf32> -> !ttile.tile<256x1xf32>
  ttile.store %s, %r[%c0, %c0] : !ttile.tile<256x1xf32>, memref<256x1xf32>
  ttile.return
}


// -----

// All-gather fused with a GEMM (a tensor-parallel column matmul over 4 PEs):
// every block pushes 8 rows of this PE's A shard into each PE's symmetric
// gathered buffer, fences, and bumps that PE's flag for this shard; each
// output tile then waits only for the shard its rows come from (all 8 blocks
// of that PE) and runs its tensor-core loop on the gathered rows.
// CHECK: #include <nvshmem.h>
// CHECK-LABEL: // ttile.kernel @ag_gemm
// Peers write symmetric buffers during the kernel: they are not __restrict__.
// CHECK: uint16_t* __restrict__ arg0 = static_cast<uint16_t*>(arg0_);
// CHECK: uint16_t* arg2 = static_cast<uint16_t*>(arg2_);
// CHECK-NEXT: int64_t* arg3 = static_cast<int64_t*>(arg3_);
// CHECK: const int64_t [[ME:pe[0-9]+]] = nvshmem_my_pe();
// CHECK: const int64_t [[N:npes[0-9]+]] = nvshmem_n_pes();
// CHECK: for (int64_t [[R:r[0-9]+]] = 0; [[R]] < 8; ++[[R]])
// CHECK-NEXT: nvshmemx_putmem_nbi_block(arg2 + ({{.*}} + [[R]]) * 128 + {{.*}}, arg0 + ({{.*}} + [[R]]) * 128 + {{.*}}, 256, (int){{.*}});
// CHECK: nvshmem_fence();
// CHECK: if (threadIdx.x == 0) nvshmemx_signal_op(reinterpret_cast<uint64_t*>(arg3) + [[ME]], (uint64_t){{.*}}, NVSHMEM_SIGNAL_ADD, (int){{.*}});
// CHECK: if (threadIdx.x == 0) nvshmem_signal_wait_until(reinterpret_cast<uint64_t*>(arg3) + {{.*}}, NVSHMEM_CMP_GE, (uint64_t){{.*}});
// CHECK-NEXT: __syncthreads();
// CHECK: // tensor-core GEMM: block tile 64x64x32, warps 2x2, 3 stages
// CHECK: tessera_mma_bf16(
ttile.kernel @ag_gemm(%a: memref<64x128xbf16>, %b: memref<128x128xbf16>,
                      %ag: memref<256x128xbf16> {ttile.symmetric}, %flags: memref<4xi64> {ttile.symmetric},
                      %c: memref<256x128xbf16>)
    attributes {grid = array<i64: 8>, block = array<i64: 128>, stages = 3 : i64} {
  %pid = ttile.program_id 0
  %me = ttile.my_pe
  %n = ttile.n_pes
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c8 = arith.constant 8 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  // Push: this block's 8 rows of the local shard, to every PE.
  %mine = arith.muli %pid, %c8 : index
  %shard = arith.muli %me, %c64 : index
  %there = arith.addi %shard, %mine : index
  scf.for %p = %c0 to %n step %c1 {
    ttile.put %a[%mine, %c0] to %ag[%there, %c0] on %p {shape = array<i64: 8, 128>} : memref<64x128xbf16> -> memref<256x128xbf16>
  }
  ttile.fence
  scf.for %p = %c0 to %n step %c1 {
    ttile.signal %flags[%me], %c1 on %p {kind = "add"} : memref<4xi64>
  }
  // Consume: wait for the shard this tile's rows come from, then the GEMM.
  %rt = arith.divui %pid, %c2 : index
  %ct = arith.remui %pid, %c2 : index
  %row = arith.muli %rt, %c64 : index
  %col = arith.muli %ct, %c64 : index
  ttile.wait %flags[%rt], %c8 {cmp = "ge"} : memref<4xi64>
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  %acc = scf.for %k = %c0 to %c128 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %ta = ttile.load %ag[%row, %k] : memref<256x128xbf16> -> !ttile.tile<64x32xbf16>
    %tb = ttile.load %b[%k, %col] : memref<128x128xbf16> -> !ttile.tile<32x64xbf16>
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 2, 2>} : !ttile.tile<64x32xbf16>, !ttile.tile<32x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  }
  %h = ttile.cast %acc : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
  ttile.store %h, %c[%row, %col] : !ttile.tile<64x64xbf16>, memref<256x128xbf16>
  ttile.return
}

// -----

// Tiles share shared memory by lifetime: the second row-sum's input and
// result reuse the bytes of the first's, which nothing reads any more.
// CHECK-LABEL: ttile.kernel @reuse
// CHECK: dynamic shared memory 8320 bytes
// CHECK: float* const [[A:t[0-9]+]] = reinterpret_cast<float*>(tessera_smem + 0);  // tile 32x64
// CHECK: float* const [[B:t[0-9]+]] = reinterpret_cast<float*>(tessera_smem + 8192);  // tile 32x1
// CHECK: float* const [[C:t[0-9]+]] = reinterpret_cast<float*>(tessera_smem + 0);  // tile 32x64
// CHECK: float* const [[D:t[0-9]+]] = reinterpret_cast<float*>(tessera_smem + 8192);  // tile 32x1
ttile.kernel @reuse(%x: memref<32x64xf32>, %y: memref<32x64xf32>, %a: memref<32x1xf32>, %b: memref<32x1xf32>) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %x[%c0, %c0] : memref<32x64xf32> -> !ttile.tile<32x64xf32>
  %r = ttile.reduce %t {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<32x64xf32> -> !ttile.tile<32x1xf32>
  ttile.store %r, %a[%c0, %c0] : !ttile.tile<32x1xf32>, memref<32x1xf32>
  %u = ttile.load %y[%c0, %c0] : memref<32x64xf32> -> !ttile.tile<32x64xf32>
  %s = ttile.reduce %u {kind = #tgraph.reduction<max>, dim = 1 : i64} : !ttile.tile<32x64xf32> -> !ttile.tile<32x1xf32>
  ttile.store %s, %b[%c0, %c0] : !ttile.tile<32x1xf32>, memref<32x1xf32>
  ttile.return
}
