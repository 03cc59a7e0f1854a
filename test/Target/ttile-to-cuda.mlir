// RUN: tessera-translate --ttile-to-cuda %s --split-input-file --verify-diagnostics | FileCheck %s

// The same kernel for the GPU: program ids are block indices; tiles that an
// op outside their region needs (the dot's operands, the loop-carried
// accumulator, the reduction's input) live in dynamic shared memory; the
// chain relu -> add -> mul -> max -> exp is ONE loop in which each thread
// computes whole elements in registers; the row sum splits each row over a
// group of lanes combined by warp shuffles. A float exp runs on the
// special-function unit's 2^x (exp2 is that 2^x alone). Element loops
// stride by the block's threads.
// CHECK: // launch: grid (2), block (64), dynamic shared memory [[SMEM:[0-9]+]] bytes
// CHECK: extern "C" __global__ void __launch_bounds__(64) everything(void* arg0_, void* arg1_, void* arg2_, void* arg3_) {
// CHECK: extern __shared__ __align__(1024) unsigned char tessera_smem[];
// CHECK: const int64_t pid0 = blockIdx.x;
// CHECK: for (int64_t [[K:k[0-9]+]] = {{c[0-9]+}}; [[K]] < {{c[0-9]+}}; [[K]] += {{c[0-9]+}}) {
// CHECK: // ttile.dot 4x4x2 on CUDA cores: the dot has no 'warps'
// CHECK: for (int64_t k = 0; k < 2; ++k) s +=
// CHECK: for (int64_t [[E:e[0-9]+]] = threadIdx.x; [[E]] < 16; [[E]] += 64) {
// CHECK: const float [[R:v[0-9]+]] = ([[ACC:t[0-9]+]][{{.*}}] > 0 ? [[ACC]][{{.*}}] : 0);
// CHECK-NEXT: const float [[S:v[0-9]+]] = [[R]] + [[ACC]][{{.*}}];
// CHECK-NEXT: const float [[M:v[0-9]+]] = [[S]] * [[S]];
// CHECK-NEXT: const float [[X:v[0-9]+]] = ([[M]] > [[S]] ? [[M]] : [[S]]);
// CHECK-NEXT: const float [[EX:v[0-9]+]] = tessera_ex2(([[X]]) * 1.4426950408889634f);
// CHECK-NEXT: const float [[EX2:v[0-9]+]] = tessera_ex2([[EX]]);
// CHECK-NEXT: [[T:t[0-9]+]][{{.*}}] = [[EX2]];
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
  %ex = ttile.exp %x : !ttile.tile<4x4xf32>
  %e = ttile.exp2 %ex : !ttile.tile<4x4xf32>
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

// `wgmma` on the dot: a Hopper main loop. Two warpgroups each multiply 64
// rows of the A tile by the whole 256-column B tile with wgmma.mma_async,
// both operands read from shared memory through matrix descriptors; the
// cp.async ring writes them 128-byte swizzled (chunk ^ row % 8) and runs 2
// of 4 stages ahead, so one wgmma group stays in flight (wait<1>). Builds
// for plain sm_90 (no arch-specific features) get the mma.sync loop; both
// leave the accumulator in the same registers for the epilogue.
// CHECK: template <> __device__ __forceinline__ void tessera_wgmma_bf16<256, 1>(float* d, uint64_t a, uint64_t b) {
// CHECK: "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
// CHECK: "{%0, %1, {{.*}}, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
// CHECK-LABEL: // ttile.kernel @wgmma_gemm
// CHECK: // launch: grid (2), block (256), dynamic shared memory 208896 bytes
// CHECK: // tensor-core GEMM: block tile 128x256x64, warps 8x1, 4 stages (wgmma.mma_async.m64n256k16
// CHECK: float [[ACC:acc[0-9]+]][1][32][4];
// CHECK: #if defined(__CUDA_ARCH_FEAT_SM90_ALL) || (defined(TESSERA_EMULATED_PTX) && !defined(TESSERA_EMULATE_NO_WGMMA))
// CHECK: const int wg = threadIdx.x >> 7;
// CHECK: tessera_cp_async16(sa + (0) * 8192 + ((c >> 6) * 128 + r) * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3),
// CHECK: tessera_cp_async16(sb + (0) * 16384 + ((c >> 6) * 64 + r) * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3),
// CHECK: tessera_cp_async_wait<1>();
// CHECK-NEXT: tessera_fence_proxy_async();
// CHECK-NEXT: __syncthreads();
// CHECK-NEXT: if (it + 2 < n_it)
// CHECK: tessera_wgmma_fence();
// CHECK: tessera_wgmma_bf16<256, 1>(&[[ACC]][0][0][0], tessera_wgmma_desc(a_st + (kk >> 6) * 8192 + (kk & 63), 16, 1024), tessera_wgmma_desc(b_st + kk * 64, 8192, 1024));
// CHECK-NEXT: tessera_wgmma_commit();
// CHECK-NEXT: tessera_wgmma_wait<1>();
// CHECK: tessera_wgmma_wait<0>();
// CHECK: #else
// CHECK: tessera_mma_bf16([[ACC]][mi][ni], af[mi], bf[ni]);
// CHECK: #endif
// CHECK: arg2[{{.*}}] = float_to_bf16(
ttile.kernel @wgmma_gemm(%a: memref<256x320xbf16>, %b: memref<320x256xbf16>, %c: memref<256x256xbf16>)
    attributes {grid = array<i64: 2>, block = array<i64: 256>, stages = 4 : i64} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %c320 = arith.constant 320 : index
  %row = arith.muli %pid, %c128 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<128x256xf32>
  %acc = scf.for %k = %c0 to %c320 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<128x256xf32>) {
    %ta = ttile.load %a[%row, %k] : memref<256x320xbf16> -> !ttile.tile<128x64xbf16>
    %tb = ttile.load %b[%k, %c0] : memref<320x256xbf16> -> !ttile.tile<64x256xbf16>
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
    scf.yield %d : !ttile.tile<128x256xf32>
  }
  %h = ttile.cast %acc : !ttile.tile<128x256xf32> to !ttile.tile<128x256xbf16>
  ttile.store %h, %c[%row, %c0] : !ttile.tile<128x256xbf16>, memref<256x256xbf16>
  ttile.return
}

// -----

// With `tma` loads the wgmma ring is filled by the tensor memory accelerator:
// the kernel takes one more argument, the runtime-built tensor maps (A's
// 128x64 box, B's 64x64 box, the launch record lists both); thread 0 arms a
// slot's mbarrier with the stage's 48 KiB and issues one copy per 64-column
// panel; every thread waits on the slot's phase; after the block barrier,
// the slot of the iteration before is refilled, 3 iterations ahead.
// CHECK-LABEL: // ttile.kernel @tma_gemm
// CHECK: // launch: grid (2), block (256), dynamic shared memory 208928 bytes
// CHECK: void __launch_bounds__(256) tma_gemm(void* arg0_, void* arg1_, void* arg2_, const unsigned char* __restrict__ tessera_tmaps)
// CHECK: 4 stages (wgmma.mma_async.m64n256k16 {{.*}}; TMA (cp.async.bulk.tensor) into the wgmma ring, cp.async for mma.sync)
// CHECK: uint64_t* const full = reinterpret_cast<uint64_t*>(tessera_smem + 208896);
// CHECK: for (int s = 0; s < 4; ++s) { tessera_mbarrier_init(&full[s], 1); }
// CHECK-NEXT: tessera_fence_barrier_init();
// CHECK: tessera_mbarrier_expect_tx(&full[0], 49152);
// CHECK-NEXT: tessera_tma_load_2d(sa + (0) * 8192 + 0, tessera_tmaps + 0, (int)(kv), (int)([[ROW:.*]]), &full[0]);
// CHECK-NEXT: tessera_tma_load_2d(sb + (0) * 16384 + 0, tessera_tmaps + 128, (int)([[COL:.*]]), (int)(kv), &full[0]);
// CHECK-NEXT: tessera_tma_load_2d(sb + (0) * 16384 + 4096, tessera_tmaps + 128, (int)([[COL]] + 64), (int)(kv), &full[0]);
// CHECK: for (int64_t it = 0; it < n_it; ++it) {
// CHECK-NEXT: tessera_mbarrier_wait(&full[it % 4], (unsigned)(it / 4) & 1);
// CHECK: tessera_wgmma_wait<1>();
// CHECK-NEXT: __syncthreads();
// CHECK-NEXT: if (threadIdx.x == 0 && it + 3 < n_it) {
// CHECK: tessera_mbarrier_expect_tx(&full[(it + 3) % 4], 49152);
// CHECK: #else
// CHECK: tessera_cp_async16(
// CHECK: #endif
ttile.kernel @tma_gemm(%a: memref<256x320xbf16>, %b: memref<320x256xbf16>, %c: memref<256x256xbf16>)
    attributes {grid = array<i64: 2>, block = array<i64: 256>, stages = 4 : i64} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %c320 = arith.constant 320 : index
  %row = arith.muli %pid, %c128 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<128x256xf32>
  %acc = scf.for %k = %c0 to %c320 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<128x256xf32>) {
    %ta = ttile.load %a[%row, %k] {tma} : memref<256x320xbf16> -> !ttile.tile<128x64xbf16>
    %tb = ttile.load %b[%k, %c0] {tma} : memref<320x256xbf16> -> !ttile.tile<64x256xbf16>
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
    scf.yield %d : !ttile.tile<128x256xf32>
  }
  %h = ttile.cast %acc : !ttile.tile<128x256xf32> to !ttile.tile<128x256xbf16>
  ttile.store %h, %c[%row, %c0] : !ttile.tile<128x256xbf16>, memref<256x256xbf16>
  ttile.return
}

// -----

// Warp specialization: the block's last warpgroup is the producer. It gives
// its registers to the two computing warpgroups (setmaxnreg: 168 each at
// launch, 40 for the producer, 232 for the others), and one of its threads
// refills each slot as soon as every computing warp has released it (the
// `empty` mbarrier, one arrival per warp after its wgmma group on the slot
// retired), all 4 slots in flight; then it leaves the kernel. The computing
// warps meet no block barrier in the loop. On plain sm_90 the producer
// leaves at once and the others run the mma.sync loop.
// CHECK-LABEL: // ttile.kernel @producer_gemm
// CHECK: // launch: grid (2), block (384), dynamic shared memory 208960 bytes
// CHECK: void __launch_bounds__(384) producer_gemm(
// CHECK: uint64_t* const full = reinterpret_cast<uint64_t*>(tessera_smem + 208896);
// CHECK-NEXT: uint64_t* const empty = reinterpret_cast<uint64_t*>(tessera_smem + 208928);
// CHECK: for (int s = 0; s < 4; ++s) { tessera_mbarrier_init(&full[s], 1); tessera_mbarrier_init(&empty[s], 8); }
// CHECK: if (threadIdx.x >= 256) {     // the producer warpgroup
// CHECK-NEXT: tessera_setmaxnreg_dec<40>();
// CHECK-NEXT: if (threadIdx.x == 256) {
// CHECK-NEXT: for (int64_t it = 0; it < n_it; ++it) {
// CHECK-NEXT: if (it >= 4)
// CHECK-NEXT: tessera_mbarrier_wait(&empty[it % 4], (unsigned)(it / 4 - 1) & 1);
// CHECK: tessera_mbarrier_expect_tx(&full[it % 4], 49152);
// CHECK: return;
// CHECK: tessera_setmaxnreg_inc<232>();
// CHECK: for (int64_t it = 0; it < n_it; ++it) {
// CHECK-NEXT: tessera_mbarrier_wait(&full[it % 4], (unsigned)(it / 4) & 1);
// CHECK-NOT: __syncthreads
// CHECK: tessera_wgmma_wait<1>();
// CHECK-NEXT: if (it >= 1) {
// CHECK-NEXT: __syncwarp();
// CHECK-NEXT: if ((threadIdx.x & 31) == 0) tessera_mbarrier_arrive(&empty[(it - 1) % 4]);
// CHECK: #else
// CHECK-NEXT: if (threadIdx.x >= 256) return;
// CHECK: tessera_cp_async16(
// CHECK: #endif
ttile.kernel @producer_gemm(%a: memref<256x320xbf16>, %b: memref<320x256xbf16>, %c: memref<256x256xbf16>)
    attributes {grid = array<i64: 2>, block = array<i64: 384>, stages = 4 : i64, producer_warpgroup} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %c320 = arith.constant 320 : index
  %row = arith.muli %pid, %c128 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<128x256xf32>
  %acc = scf.for %k = %c0 to %c320 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<128x256xf32>) {
    %ta = ttile.load %a[%row, %k] {tma} : memref<256x320xbf16> -> !ttile.tile<128x64xbf16>
    %tb = ttile.load %b[%k, %c0] {tma} : memref<320x256xbf16> -> !ttile.tile<64x256xbf16>
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
    scf.yield %d : !ttile.tile<128x256xf32>
  }
  %h = ttile.cast %acc : !ttile.tile<128x256xf32> to !ttile.tile<128x256xbf16>
  ttile.store %h, %c[%row, %c0] : !ttile.tile<128x256xbf16>, memref<256x256xbf16>
  ttile.return
}

// -----

// A producer warpgroup feeds only a wgmma GEMM main loop on tma loads.
ttile.kernel @producer_without_tma(%a: memref<128x64xbf16>, %b: memref<64x256xbf16>, %c: memref<128x256xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 384>, stages = 3 : i64, producer_warpgroup} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<128x256xf32>
  // expected-error @+1 {{the kernel's producer warpgroup has no GEMM main loop to feed: the loop's dot is not wgmma on tma loads}}
  %acc = scf.for %k = %c0 to %c64 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<128x256xf32>) {
    %ta = ttile.load %a[%c0, %k] : memref<128x64xbf16> -> !ttile.tile<128x64xbf16>
    %tb = ttile.load %b[%k, %c0] : memref<64x256xbf16> -> !ttile.tile<64x256xbf16>
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
    scf.yield %d : !ttile.tile<128x256xf32>
  }
  ttile.store %acc, %c[%c0, %c0] : !ttile.tile<128x256xf32>, memref<128x256xf32>
  ttile.return
}

// -----

// expected-error @+1 {{kernel @producer_idle has a producer_warpgroup but no wgmma GEMM main loop with tma loads for it to feed}}
ttile.kernel @producer_idle(%a: memref<64x64xf32>, %c: memref<64x64xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 256>, producer_warpgroup} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %a[%c0, %c0] : memref<64x64xf32> -> !ttile.tile<64x64xf32>
  ttile.store %t, %c[%c0, %c0] : !ttile.tile<64x64xf32>, memref<64x64xf32>
  ttile.return
}

// -----

// TMA fills only the ring of a wgmma GEMM: on one operand alone, or outside
// such a loop, it is an error.
ttile.kernel @tma_one_operand(%a: memref<128x64xbf16>, %b: memref<64x256xbf16>, %c: memref<128x256xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 256>, stages = 3 : i64} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<128x256xf32>
  %acc = scf.for %k = %c0 to %c64 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<128x256xf32>) {
    %ta = ttile.load %a[%c0, %k] {tma} : memref<128x64xbf16> -> !ttile.tile<128x64xbf16>
    %tb = ttile.load %b[%k, %c0] : memref<64x256xbf16> -> !ttile.tile<64x256xbf16>
    // expected-error @+1 {{ttile.load {tma} needs both operands of a wgmma dot loaded with tma}}
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
    scf.yield %d : !ttile.tile<128x256xf32>
  }
  ttile.store %acc, %c[%c0, %c0] : !ttile.tile<128x256xf32>, memref<128x256xf32>
  ttile.return
}

// -----

ttile.kernel @tma_elementwise(%a: memref<64x64xbf16>, %c: memref<64x64xbf16>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  // expected-error @+1 {{a ttile.load {tma} is emitted only as an operand of a wgmma GEMM loop (acc = dot(load, load, acc) with both loads tma)}}
  %t = ttile.load %a[%c0, %c0] {tma} : memref<64x64xbf16> -> !ttile.tile<64x64xbf16>
  ttile.store %t, %c[%c0, %c0] : !ttile.tile<64x64xbf16>, memref<64x64xbf16>
  ttile.return
}

// -----

// wgmma with N = 32 on a GEMM main loop: its swizzled tiles need whole
// 64-column atoms (the verifier allows any N the instruction has).
ttile.kernel @wgmma_narrow_gemm(%a: memref<64x64xbf16>, %b: memref<64x32xbf16>, %c: memref<64x32xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>, stages = 3 : i64} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x32xf32>
  %acc = scf.for %k = %c0 to %c64 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<64x32xf32>) {
    %ta = ttile.load %a[%c0, %k] : memref<64x64xbf16> -> !ttile.tile<64x64xbf16>
    %tb = ttile.load %b[%k, %c0] : memref<64x32xbf16> -> !ttile.tile<64x32xbf16>
    // expected-error @+1 {{'wgmma' on a GEMM main loop needs whole 128-byte swizzle atoms in its shared-memory tiles: N and K multiples of 64, not N = 32, K = 64}}
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x64xbf16>, !ttile.tile<64x32xbf16> -> !ttile.tile<64x32xf32>
    scf.yield %d : !ttile.tile<64x32xf32>
  }
  ttile.store %acc, %c[%c0, %c0] : !ttile.tile<64x32xf32>, memref<64x32xf32>
  ttile.return
}

// -----

// A loop with its tiles in registers (flash attention's shape: S = Q K^T,
// then acc += bf16(S) V) whose dots ask for wgmma. On sm_90a: the staged
// key and value tiles land 128-byte swizzled, each thread fences its
// copies for the async proxy before the barrier; the invariant Q is
// copied once, swizzled, and read by descriptor; S's B is the key tile
// read K-major (its transpose), the second dot's A is S packed to bf16 in
// registers and its B the value tile N-major. Each dot waits for its
// group. Plain sm_90 gets the mma.sync loop over padded tiles.
// CHECK: template <> __device__ __forceinline__ void tessera_wgmma_bf16<32, 0>(float* d, uint64_t a, uint64_t b) {
// CHECK: "{%0, %1, {{.*}}, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
// CHECK: template <> __device__ __forceinline__ void tessera_wgmma_rs_bf16<128, 1>(float* d, const uint32_t* a, uint64_t b) {
// CHECK: "{%0, %1, {{.*}}, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
// CHECK-LABEL: // ttile.kernel @wgmma_register_loop
// CHECK: // scf.for with its tiles in registers: 4 warps x 16 rows, 2 tile(s) staged through 2 shared-memory buffers (cp.async, wgmma.mma_async from 128-byte-swizzled shared memory; ldmatrix and mma.sync.m16n8k16 on plain sm_90)
// CHECK: #if defined(__CUDA_ARCH_FEAT_SM90_ALL) || (defined(TESSERA_EMULATED_PTX) && !defined(TESSERA_EMULATE_NO_WGMMA))
// CHECK: tessera_cp_async16([[QS:sa[0-9]+]] + ((c >> 6) * 64 + r) * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3), arg0
// CHECK: tessera_cp_async_wait<0>();
// CHECK-NEXT: tessera_fence_proxy_async();
// CHECK-NEXT: __syncthreads();
// CHECK: // ttile.dot 64x32x128 on wgmma: A from its swizzled shared-memory copy, B K-major (the staged tile read transposed)
// CHECK: tessera_wgmma_fence();
// CHECK: for (int kk = 0; kk < 128; kk += 16)
// CHECK-NEXT: tessera_wgmma_bf16<32, 0>(&{{rv[0-9]+}}[0][0][0], tessera_wgmma_desc([[QS]] + (threadIdx.x >> 7) * 4096 + (kk >> 6) * 4096 + (kk & 63), 16, 1024), tessera_wgmma_desc({{st0_[0-9]+}} + (kk >> 6) * 2048 + (kk & 63), 16, 1024));
// CHECK-NEXT: tessera_wgmma_commit();
// CHECK-NEXT: tessera_wgmma_wait<0>();
// CHECK: // ttile.dot 64x128x32 on wgmma: A from registers, B N-major
// CHECK: ra[kk][r] = tessera_pack_bf16(p[0], p[1]);
// CHECK: for (int kk = 0; kk < 32; kk += 16)
// CHECK-NEXT: tessera_wgmma_rs_bf16<128, 1>(&{{rv[0-9]+}}[0][0][0], ra[kk / 16], tessera_wgmma_desc({{st1_[0-9]+}} + kk * 64, 4096, 1024));
// CHECK: #else
// CHECK-NOT: tessera_wgmma
// CHECK: tessera_mma_bf16(
// CHECK: #endif
ttile.kernel @wgmma_register_loop(%q: memref<64x128xbf16>, %k: memref<256x128xbf16>, %v: memref<256x128xbf16>, %o: memref<64x128xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c256 = arith.constant 256 : index
  %tq = ttile.load %q[%c0, %c0] : memref<64x128xbf16> -> !ttile.tile<64x128xbf16>
  %zero = ttile.fill 0.0 : !ttile.tile<64x32xf32>
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x128xf32>
  %acc = scf.for %j = %c0 to %c256 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<64x128xf32>) {
    %tk = ttile.load %k[%j, %c0] : memref<256x128xbf16> -> !ttile.tile<32x128xbf16>
    %tv = ttile.load %v[%j, %c0] : memref<256x128xbf16> -> !ttile.tile<32x128xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<32x128xbf16> to !ttile.tile<128x32xbf16>
    %s = ttile.dot %tq, %kt, %zero {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x128xbf16>, !ttile.tile<128x32xbf16> -> !ttile.tile<64x32xf32>
    %p = ttile.cast %s : !ttile.tile<64x32xf32> to !ttile.tile<64x32xbf16>
    %d = ttile.dot %p, %tv, %it {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x32xbf16>, !ttile.tile<32x128xbf16> -> !ttile.tile<64x128xf32>
    scf.yield %d : !ttile.tile<64x128xf32>
  }
  ttile.store %acc, %o[%c0, %c0] : !ttile.tile<64x128xf32>, memref<64x128xf32>
  ttile.return
}

// -----

// The same loop over 96-wide tiles (not whole swizzle atoms) stays on
// mma.sync, and the emitter says why.
// CHECK-LABEL: // ttile.kernel @wgmma_register_loop_narrow
// CHECK: // (mma.sync, not wgmma: a staged 32x96 tile is not whole 128-byte swizzle atoms (8 rows by 64 columns))
// CHECK-NOT: tessera_wgmma
// CHECK: tessera_mma_bf16(
ttile.kernel @wgmma_register_loop_narrow(%q: memref<64x96xbf16>, %k: memref<256x96xbf16>, %v: memref<256x96xbf16>, %o: memref<64x96xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c256 = arith.constant 256 : index
  %tq = ttile.load %q[%c0, %c0] : memref<64x96xbf16> -> !ttile.tile<64x96xbf16>
  %zero = ttile.fill 0.0 : !ttile.tile<64x32xf32>
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x96xf32>
  %acc = scf.for %j = %c0 to %c256 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<64x96xf32>) {
    %tk = ttile.load %k[%j, %c0] : memref<256x96xbf16> -> !ttile.tile<32x96xbf16>
    %tv = ttile.load %v[%j, %c0] : memref<256x96xbf16> -> !ttile.tile<32x96xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<32x96xbf16> to !ttile.tile<96x32xbf16>
    %s = ttile.dot %tq, %kt, %zero {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x96xbf16>, !ttile.tile<96x32xbf16> -> !ttile.tile<64x32xf32>
    %p = ttile.cast %s : !ttile.tile<64x32xf32> to !ttile.tile<64x32xbf16>
    %d = ttile.dot %p, %tv, %it {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x32xbf16>, !ttile.tile<32x96xbf16> -> !ttile.tile<64x96xf32>
    scf.yield %d : !ttile.tile<64x96xf32>
  }
  ttile.store %acc, %o[%c0, %c0] : !ttile.tile<64x96xf32>, memref<64x96xf32>
  ttile.return
}

// -----

// `ttile.pingpong` on such a loop over 128 rows (two warpgroups): the
// warpgroups take turns issuing their wgmmas. Warpgroup w waits on named
// barrier 1 + w, issues and commits, then hands the turn over (arrives on
// the other's) before waiting for its own group; warpgroup 1 gives the
// first turn, warpgroup 0 takes the last hand-over after the loop.
// CHECK-LABEL: // ttile.kernel @pingpong_register_loop
// CHECK: // scf.for with its tiles in registers: 8 warps x 16 rows, {{.*}}; the two warpgroups take turns issuing their wgmmas)
// CHECK: for (int64_t it = 0; it < n_it; ++it) {
// CHECK: if (it == 0 && (threadIdx.x >> 7) == 1) tessera_named_barrier_arrive(1, 256);
// CHECK: // ttile.dot 128x32x128 on wgmma
// CHECK: tessera_named_barrier_sync(1 + (threadIdx.x >> 7), 256);
// CHECK: tessera_wgmma_commit();
// CHECK-NEXT: tessera_named_barrier_arrive(2 - (threadIdx.x >> 7), 256);
// CHECK-NEXT: tessera_wgmma_wait<0>();
// CHECK: // ttile.dot 128x128x32 on wgmma
// CHECK: tessera_named_barrier_sync(1 + (threadIdx.x >> 7), 256);
// CHECK: tessera_named_barrier_arrive(2 - (threadIdx.x >> 7), 256);
// CHECK: if (n_it > 0 && (threadIdx.x >> 7) == 0) tessera_named_barrier_sync(1, 256);
// CHECK: #else
// CHECK-NOT: tessera_named_barrier
// CHECK: #endif
ttile.kernel @pingpong_register_loop(%q: memref<128x128xbf16>, %k: memref<256x128xbf16>, %v: memref<256x128xbf16>, %o: memref<128x128xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 256>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c256 = arith.constant 256 : index
  %tq = ttile.load %q[%c0, %c0] : memref<128x128xbf16> -> !ttile.tile<128x128xbf16>
  %zero = ttile.fill 0.0 : !ttile.tile<128x32xf32>
  %acc0 = ttile.fill 0.0 : !ttile.tile<128x128xf32>
  %acc = scf.for %j = %c0 to %c256 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<128x128xf32>) {
    %tk = ttile.load %k[%j, %c0] : memref<256x128xbf16> -> !ttile.tile<32x128xbf16>
    %tv = ttile.load %v[%j, %c0] : memref<256x128xbf16> -> !ttile.tile<32x128xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<32x128xbf16> to !ttile.tile<128x32xbf16>
    %s = ttile.dot %tq, %kt, %zero {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x128xbf16>, !ttile.tile<128x32xbf16> -> !ttile.tile<128x32xf32>
    %p = ttile.cast %s : !ttile.tile<128x32xf32> to !ttile.tile<128x32xbf16>
    %d = ttile.dot %p, %tv, %it {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x32xbf16>, !ttile.tile<32x128xbf16> -> !ttile.tile<128x128xf32>
    scf.yield %d : !ttile.tile<128x128xf32>
  } {ttile.pingpong}
  ttile.store %acc, %o[%c0, %c0] : !ttile.tile<128x128xf32>, memref<128x128xf32>
  ttile.return
}

// -----

// `ttile.pingpong` on a loop of one warpgroup has nobody to take turns with.
ttile.kernel @pingpong_one_warpgroup(%q: memref<64x128xbf16>, %k: memref<256x128xbf16>, %v: memref<256x128xbf16>, %o: memref<64x128xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c256 = arith.constant 256 : index
  %tq = ttile.load %q[%c0, %c0] : memref<64x128xbf16> -> !ttile.tile<64x128xbf16>
  %zero = ttile.fill 0.0 : !ttile.tile<64x32xf32>
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x128xf32>
  // expected-error @+1 {{ttile.pingpong on a loop that is not wgmma over two warpgroups: 4 warps}}
  %acc = scf.for %j = %c0 to %c256 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<64x128xf32>) {
    %tk = ttile.load %k[%j, %c0] : memref<256x128xbf16> -> !ttile.tile<32x128xbf16>
    %tv = ttile.load %v[%j, %c0] : memref<256x128xbf16> -> !ttile.tile<32x128xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<32x128xbf16> to !ttile.tile<128x32xbf16>
    %s = ttile.dot %tq, %kt, %zero {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x128xbf16>, !ttile.tile<128x32xbf16> -> !ttile.tile<64x32xf32>
    %p = ttile.cast %s : !ttile.tile<64x32xf32> to !ttile.tile<64x32xbf16>
    %d = ttile.dot %p, %tv, %it {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x32xbf16>, !ttile.tile<32x128xbf16> -> !ttile.tile<64x128xf32>
    scf.yield %d : !ttile.tile<64x128xf32>
  } {ttile.pingpong}
  ttile.store %acc, %o[%c0, %c0] : !ttile.tile<64x128xf32>, memref<64x128xf32>
  ttile.return
}

// -----

// `ttile.issue_ahead` on a wgmma loop over a 3-stage TMA ring: the first
// dot (loop-invariant A, zero accumulator) is issued one iteration ahead.
// Iteration `it` waits for its own scores (issued in the one before, or
// now in the first), waits for the next slot's TMA phase and issues the
// next scores into a second register tile, runs the rest under them, and
// moves them to the current tile at its end.
// CHECK-LABEL: // ttile.kernel @issue_ahead_register_loop
// CHECK: staged through 3 shared-memory buffers {{.*}}; the first dot of the next iteration issued before this one's rest)
// CHECK: tessera_fence_barrier_init();
// CHECK: __syncthreads();
// CHECK-NEXT: float [[CUR:rv[0-9]+]][1][8][4];
// CHECK-NEXT: const int64_t n_it =
// CHECK: for (int64_t it = 0; it < n_it; ++it) {
// CHECK: if (it == 0) {
// CHECK: [[CUR]][mi][ni][q] = 0.0f;
// CHECK: tessera_wgmma_commit();
// CHECK-NOT: tessera_wgmma_wait
// CHECK: tessera_wgmma_wait<0>();
// CHECK-NEXT: tessera_wgmma_fence_operands<32>(&[[CUR]][0][0][0]);
// CHECK-NEXT: float [[NEXT:sn[0-9]+]][1][8][4];
// CHECK-NEXT: if (it + 1 < n_it) {
// CHECK-NEXT: tessera_mbarrier_wait(&full[(it + 1) % 3], (unsigned)((it + 1) / 3) & 1);
// CHECK: tessera_wgmma_bf16<64, 0>(&[[NEXT]][0][0][0], {{.*}}, tessera_wgmma_desc((st0_{{[0-9]+}}_ring + ((it + 1) % 3) * 4096)
// CHECK-NEXT: tessera_wgmma_commit();
// CHECK-NEXT: }
// CHECK: // ttile.dot 64x64x64 on wgmma: A from registers, B N-major
// CHECK: tessera_wgmma_wait<0>();
// CHECK: if (it + 1 < n_it) {
// CHECK-NEXT: tessera_wgmma_wait<0>();
// CHECK-NEXT: tessera_wgmma_fence_operands<32>(&[[NEXT]][0][0][0]);
// CHECK: [[CUR]][mi][ni][q] = [[NEXT]][mi][ni][q];
// CHECK: #else
ttile.kernel @issue_ahead_register_loop(%q: memref<64x64xbf16>, %k: memref<256x64xbf16>, %v: memref<256x64xbf16>, %o: memref<64x64xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>, stages = 3 : i64} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c256 = arith.constant 256 : index
  %tq = ttile.load %q[%c0, %c0] : memref<64x64xbf16> -> !ttile.tile<64x64xbf16>
  %zero = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  %acc = scf.for %j = %c0 to %c256 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %tk = ttile.load %k[%j, %c0] {tma} : memref<256x64xbf16> -> !ttile.tile<64x64xbf16>
    %tv = ttile.load %v[%j, %c0] {tma} : memref<256x64xbf16> -> !ttile.tile<64x64xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<64x64xbf16> to !ttile.tile<64x64xbf16>
    %s = ttile.dot %tq, %kt, %zero {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
    %p = ttile.cast %s : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
    %d = ttile.dot %p, %tv, %it {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  } {ttile.issue_ahead}
  ttile.store %acc, %o[%c0, %c0] : !ttile.tile<64x64xf32>, memref<64x64xf32>
  ttile.return
}

// -----

// Issuing ahead needs the next iteration's tile in flight when an
// iteration starts: a 2-stage ring cannot.
ttile.kernel @issue_ahead_two_stages(%q: memref<64x64xbf16>, %k: memref<256x64xbf16>, %v: memref<256x64xbf16>, %o: memref<64x64xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c256 = arith.constant 256 : index
  %tq = ttile.load %q[%c0, %c0] : memref<64x64xbf16> -> !ttile.tile<64x64xbf16>
  %zero = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  // expected-error @+1 {{ttile.issue_ahead on a loop where 2 stages (the next iteration's tile must be in flight: 3+)}}
  %acc = scf.for %j = %c0 to %c256 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %tk = ttile.load %k[%j, %c0] {tma} : memref<256x64xbf16> -> !ttile.tile<64x64xbf16>
    %tv = ttile.load %v[%j, %c0] {tma} : memref<256x64xbf16> -> !ttile.tile<64x64xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<64x64xbf16> to !ttile.tile<64x64xbf16>
    %s = ttile.dot %tq, %kt, %zero {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
    %p = ttile.cast %s : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
    %d = ttile.dot %p, %tv, %it {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  } {ttile.issue_ahead}
  ttile.store %acc, %o[%c0, %c0] : !ttile.tile<64x64xf32>, memref<64x64xf32>
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

// A get pulls one row per call, all rows in flight together; the quiet
// completes them and the barrier shares them with the whole block. A quiet
// of its own completes the block's puts, then synchronizes the block too.
// CHECK-LABEL: // ttile.kernel @pull
// CHECK: float* arg0 = static_cast<float*>(arg0_);
// CHECK: for (int64_t [[R:r[0-9]+]] = 0; [[R]] < 16; ++[[R]])
// CHECK-NEXT: nvshmemx_getmem_nbi_block(arg1 + ([[Z:c[0-9]+]] + [[R]]) * 32 + [[Z]], arg0 + ({{.*}} + [[R]]) * 32 + [[Z]], 128, (int){{.*}});
// CHECK-NEXT: nvshmem_quiet();
// CHECK-NEXT: __syncthreads();
// CHECK: nvshmemx_putmem_nbi_block(
// CHECK-NEXT: nvshmem_quiet();
// CHECK-NEXT: __syncthreads();
ttile.kernel @pull(%all: memref<64x32xf32> {ttile.symmetric}, %a: memref<16x32xf32>) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %me = ttile.my_pe
  %n = ttile.n_pes
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %next = arith.addi %me, %c1 : index
  %peer = arith.remui %next, %n : index
  %row = arith.muli %peer, %c16 : index
  ttile.get %all[%row, %c0] on %peer to %a[%c0, %c0] {shape = array<i64: 16, 32>} : memref<64x32xf32> -> memref<16x32xf32>
  %mine = arith.muli %me, %c16 : index
  ttile.put %a[%c0, %c0] to %all[%mine, %c0] on %peer {shape = array<i64: 16, 32>} : memref<16x32xf32> -> memref<64x32xf32>
  ttile.quiet
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

// -----

// The flash-attention forward loop with its tiles in registers: two warps of
// 16 query rows each; the query block goes from global memory straight into
// mma A registers before the loop; key and value blocks stream through a
// 2-stage cp.async ring; the score block, the running max/sum columns and the
// output accumulator never touch shared memory (row reductions are two quad
// shuffles); P feeds the second dot from registers. Only the two columns
// leave through shared memory, for the epilogue after the loop.
// CHECK-LABEL: // ttile.kernel @flash
// CHECK: // launch: grid (1), block (64), dynamic shared memory 6400 bytes
// CHECK: // scf.for with its tiles in registers: 2 warps x 16 rows, 2 tile(s) staged through 2 shared-memory buffers (cp.async, ldmatrix, mma.sync.m16n8k16)
// CHECK: float [[M:rv[0-9]+]][1][2];
// CHECK: [[M]][mi][h] = (-INFINITY);
// CHECK: float [[ACC:rv[0-9]+]][1][2][4];
// CHECK: uint32_t [[QA:qa[0-9]+]][1][1][4];
// CHECK: const uint16_t* p = arg0 + {{.*}} + (int64_t)(wm{{[0-9]+}} + 16 * mi + (lane{{[0-9]+}} >> 2) + 8 * (r & 1)) * 16 + 16 * kk + 2 * (lane{{[0-9]+}} & 3) + 8 * (r >> 1);
// CHECK: tessera_cp_async16(st0_{{[0-9]+}}_ring + (0) * 768 + r * 24 + c,
// CHECK: for (int64_t it = 0; it < n_it; ++it) {
// CHECK: tessera_cp_async_wait<0>();
// CHECK-NEXT: __syncthreads();
// CHECK-NEXT: if (it + 1 < n_it)
// CHECK: // ttile.dot 32x32x16: A from loop-invariant registers, B transposed from the staged tile (ldmatrix)
// CHECK: af[mi][r] = [[QA]][mi][kk][r];
// CHECK: tessera_ldmatrix_x4(r, st0_
// CHECK: for (int off = 1; off < 4; off <<= 1) { const float b = __shfl_xor_sync(0xffffffffu, a, off); a = (b > a ? b : a); }
// CHECK: = bf16_round((float)(
// CHECK: // ttile.dot 32x16x32: A from registers, B from the staged tile (ldmatrix.trans)
// CHECK: af[mi][r] = tessera_pack_bf16(p[0], p[1]);
// CHECK: tessera_ldmatrix_x4_trans(r, st1_
// CHECK: [[ACC]][mi][ni][q] = rv{{[0-9]+}}[mi][ni][q];
// CHECK: tessera_cp_async_wait<0>();
// CHECK: if ((lane{{[0-9]+}} & 3) == 0) t{{[0-9]+}}[wm{{[0-9]+}} + 16 * mi + (lane{{[0-9]+}} >> 2) + 8 * h] = [[M]][mi][h];
// The output accumulator is divided and stored from its registers.
// CHECK: / t{{[0-9]+}}[
// CHECK: arg3[{{.*}}] = float_to_bf16(
ttile.kernel @flash(%q: memref<32x16xbf16>, %k: memref<32x16xbf16>, %v: memref<32x16xbf16>, %o: memref<32x16xbf16>, %lse: memref<32x1xf32>) attributes {block = array<i64: 64>, grid = array<i64: 1>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %tq = ttile.load %q[%c0, %c0] : memref<32x16xbf16> -> !ttile.tile<32x16xbf16>
  %m0 = ttile.fill 0xFFF0000000000000 : !ttile.tile<32x1xf32>
  %l0 = ttile.fill 0.0 : !ttile.tile<32x1xf32>
  %a0 = ttile.fill 0.0 : !ttile.tile<32x16xf32>
  %res:3 = scf.for %j = %c0 to %c32 step %c32 iter_args(%m = %m0, %l = %l0, %acc = %a0) -> (!ttile.tile<32x1xf32>, !ttile.tile<32x1xf32>, !ttile.tile<32x16xf32>) {
    %tk = ttile.load %k[%j, %c0] : memref<32x16xbf16> -> !ttile.tile<32x16xbf16>
    %tv = ttile.load %v[%j, %c0] : memref<32x16xbf16> -> !ttile.tile<32x16xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<32x16xbf16> to !ttile.tile<16x32xbf16>
    %z = ttile.fill 0.0 : !ttile.tile<32x32xf32>
    %s = ttile.dot %tq, %kt, %z {warps = array<i64: 2, 1>} : !ttile.tile<32x16xbf16>, !ttile.tile<16x32xbf16> -> !ttile.tile<32x32xf32>
    %rows = ttile.iota %c0 dim 0 : !ttile.tile<32x32xi32>
    %cols = ttile.iota %j dim 1 : !ttile.tile<32x32xi32>
    %keep = ttile.compare %rows, %cols {kind = #tgraph.compare<ge>} : !ttile.tile<32x32xi32> -> !ttile.tile<32x32xi1>
    %ninf = ttile.fill 0xFFF0000000000000 : !ttile.tile<32x32xf32>
    %sm = ttile.select %keep, %s, %ninf : !ttile.tile<32x32xi1>, !ttile.tile<32x32xf32>
    %rmax = ttile.reduce %sm {dim = 1 : i64, kind = #tgraph.reduction<max>} : !ttile.tile<32x32xf32> -> !ttile.tile<32x1xf32>
    %mn = ttile.max %m, %rmax : !ttile.tile<32x1xf32>
    %mb = ttile.broadcast %mn : !ttile.tile<32x1xf32> to !ttile.tile<32x32xf32>
    %d = ttile.sub %sm, %mb : !ttile.tile<32x32xf32>
    %p = ttile.exp %d : !ttile.tile<32x32xf32>
    %dm = ttile.sub %m, %mn : !ttile.tile<32x1xf32>
    %alpha = ttile.exp %dm : !ttile.tile<32x1xf32>
    %la = ttile.mul %l, %alpha : !ttile.tile<32x1xf32>
    %rsum = ttile.reduce %p {dim = 1 : i64, kind = #tgraph.reduction<sum>} : !ttile.tile<32x32xf32> -> !ttile.tile<32x1xf32>
    %ln = ttile.add %la, %rsum : !ttile.tile<32x1xf32>
    %ab = ttile.broadcast %alpha : !ttile.tile<32x1xf32> to !ttile.tile<32x16xf32>
    %scaled = ttile.mul %acc, %ab : !ttile.tile<32x16xf32>
    %pb = ttile.cast %p : !ttile.tile<32x32xf32> to !ttile.tile<32x32xbf16>
    %an = ttile.dot %pb, %tv, %scaled {warps = array<i64: 2, 1>} : !ttile.tile<32x32xbf16>, !ttile.tile<32x16xbf16> -> !ttile.tile<32x16xf32>
    scf.yield %mn, %ln, %an : !ttile.tile<32x1xf32>, !ttile.tile<32x1xf32>, !ttile.tile<32x16xf32>
  }
  %lb = ttile.broadcast %res#1 : !ttile.tile<32x1xf32> to !ttile.tile<32x16xf32>
  %out = ttile.div %res#2, %lb : !ttile.tile<32x16xf32>
  %ob = ttile.cast %out : !ttile.tile<32x16xf32> to !ttile.tile<32x16xbf16>
  ttile.store %ob, %o[%c0, %c0] : !ttile.tile<32x16xbf16>, memref<32x16xbf16>
  %lg = ttile.log %res#1 : !ttile.tile<32x1xf32>
  %ls = ttile.add %res#0, %lg : !ttile.tile<32x1xf32>
  ttile.store %ls, %lse[%c0, %c0] : !ttile.tile<32x1xf32>, memref<32x1xf32>
  ttile.return
}

// -----

// The same loop with its dots split 1x2 (warps side by side, not owning
// whole rows) cannot keep its tiles in registers; the emitter says why and
// runs the general shared-memory path.
// CHECK-LABEL: // ttile.kernel @flash_split_columns
// CHECK: // scf.for with its tiles in shared memory: a dot's warps are not 2x1 (whole rows per warp)
// CHECK: on tensor cores (mma.sync.m16n8k16) from shared memory, warps 1x2
ttile.kernel @flash_split_columns(%q: memref<32x16xbf16>, %k: memref<32x16xbf16>, %o: memref<32x32xf32>) attributes {block = array<i64: 64>, grid = array<i64: 1>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %tq = ttile.load %q[%c0, %c0] : memref<32x16xbf16> -> !ttile.tile<32x16xbf16>
  %a0 = ttile.fill 0.0 : !ttile.tile<32x32xf32>
  %res = scf.for %j = %c0 to %c32 step %c32 iter_args(%acc = %a0) -> (!ttile.tile<32x32xf32>) {
    %tk = ttile.load %k[%j, %c0] : memref<32x16xbf16> -> !ttile.tile<32x16xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<32x16xbf16> to !ttile.tile<16x32xbf16>
    %s = ttile.dot %tq, %kt, %acc {warps = array<i64: 1, 2>} : !ttile.tile<32x16xbf16>, !ttile.tile<16x32xbf16> -> !ttile.tile<32x32xf32>
    %e = ttile.exp %s : !ttile.tile<32x32xf32>
    scf.yield %e : !ttile.tile<32x32xf32>
  }
  ttile.store %res, %o[%c0, %c0] : !ttile.tile<32x32xf32>, memref<32x32xf32>
  ttile.return
}

// -----

// A loop whose carried tile takes most of the registers (16x256 f32: 128 per
// thread) keeps its loop-invariant A operand (16x256 bf16, another 64) in
// shared memory instead: copied once by cp.async in a commit group ahead of
// the ring's, then read by ldmatrix per k step.
// CHECK-LABEL: // ttile.kernel @wide_rows
// CHECK: uint16_t* const [[SA:sa[0-9]+]] = reinterpret_cast<uint16_t*>(tessera_smem +
// CHECK: tessera_cp_async16([[SA]] + r * 264 + c, arg0 +
// CHECK: tessera_cp_async_commit();
// CHECK: // ttile.dot 16x16x256: A from shared memory (ldmatrix), B transposed from the staged tile (ldmatrix)
// CHECK: tessera_ldmatrix_x4(af[mi], [[SA]] + (wm{{[0-9]+}} + 16 * mi + (lane{{[0-9]+}} & 15)) * 264 + 16 * kk + (lane{{[0-9]+}} >> 4) * 8);
// CHECK: // ttile.dot 16x256x16: A from registers, B from the staged tile (ldmatrix.trans)
ttile.kernel @wide_rows(%k: memref<16x256xbf16>, %v: memref<64x256xbf16>, %o: memref<16x256xf32>) attributes {block = array<i64: 32>, grid = array<i64: 1>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  %tk = ttile.load %k[%c0, %c0] : memref<16x256xbf16> -> !ttile.tile<16x256xbf16>
  %a0 = ttile.fill 0.0 : !ttile.tile<16x256xf32>
  %res = scf.for %i = %c0 to %c64 step %c16 iter_args(%acc = %a0) -> (!ttile.tile<16x256xf32>) {
    %tv = ttile.load %v[%i, %c0] : memref<64x256xbf16> -> !ttile.tile<16x256xbf16>
    %vt = ttile.transpose %tv : !ttile.tile<16x256xbf16> to !ttile.tile<256x16xbf16>
    %z = ttile.fill 0.0 : !ttile.tile<16x16xf32>
    %s = ttile.dot %tk, %vt, %z {warps = array<i64: 1, 1>} : !ttile.tile<16x256xbf16>, !ttile.tile<256x16xbf16> -> !ttile.tile<16x16xf32>
    %sb = ttile.cast %s : !ttile.tile<16x16xf32> to !ttile.tile<16x16xbf16>
    %an = ttile.dot %sb, %tv, %acc {warps = array<i64: 1, 1>} : !ttile.tile<16x16xbf16>, !ttile.tile<16x256xbf16> -> !ttile.tile<16x256xf32>
    scf.yield %an : !ttile.tile<16x256xf32>
  }
  ttile.store %res, %o[%c0, %c0] : !ttile.tile<16x256xf32>, memref<16x256xf32>
  ttile.return
}

// -----

// The same with a B operand whose staged tile is narrower than the A operand
// in shared memory: each is read with its own row pitch (A 264, B 24).
// CHECK-LABEL: // ttile.kernel @wide_rows_narrow_b
// CHECK: // ttile.dot 16x16x256: A from shared memory (ldmatrix), B from the staged tile (ldmatrix.trans)
// CHECK: tessera_ldmatrix_x4(af[mi], sa{{[0-9]+}} + (wm{{[0-9]+}} + 16 * mi + (lane{{[0-9]+}} & 15)) * 264 + 16 * kk +
// CHECK: tessera_ldmatrix_x4_trans(r, st0_{{[0-9]+}} + (16 * kk + (lane{{[0-9]+}} & 15)) * 24 +
ttile.kernel @wide_rows_narrow_b(%k: memref<16x256xbf16>, %w: memref<1024x16xbf16>, %v: memref<64x256xbf16>, %o: memref<16x256xf32>) attributes {block = array<i64: 32>, grid = array<i64: 1>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  %tk = ttile.load %k[%c0, %c0] : memref<16x256xbf16> -> !ttile.tile<16x256xbf16>
  %a0 = ttile.fill 0.0 : !ttile.tile<16x256xf32>
  %res = scf.for %i = %c0 to %c64 step %c16 iter_args(%acc = %a0) -> (!ttile.tile<16x256xf32>) {
    %tw = ttile.load %w[%i, %c0] : memref<1024x16xbf16> -> !ttile.tile<256x16xbf16>
    %z = ttile.fill 0.0 : !ttile.tile<16x16xf32>
    %s = ttile.dot %tk, %tw, %z {warps = array<i64: 1, 1>} : !ttile.tile<16x256xbf16>, !ttile.tile<256x16xbf16> -> !ttile.tile<16x16xf32>
    %sb = ttile.cast %s : !ttile.tile<16x16xf32> to !ttile.tile<16x16xbf16>
    %tv = ttile.load %v[%i, %c0] : memref<64x256xbf16> -> !ttile.tile<16x256xbf16>
    %an = ttile.dot %sb, %tv, %acc {warps = array<i64: 1, 1>} : !ttile.tile<16x16xbf16>, !ttile.tile<16x256xbf16> -> !ttile.tile<16x256xf32>
    scf.yield %an : !ttile.tile<16x256xf32>
  }
  ttile.store %res, %o[%c0, %c0] : !ttile.tile<16x256xf32>, memref<16x256xf32>
  ttile.return
}

// -----

// The dK loop's shape: the transposed score block K Q^T has this block's key
// rows; the per-query statistic (lse, a column in memory) runs along its
// columns, so each thread reads the entries of its own columns straight from
// global memory; the loaded query tile feeds one dot transposed (ldmatrix)
// and the next as it is (ldmatrix.trans).
// CHECK-LABEL: // ttile.kernel @keys_by_queries
// CHECK: // scf.for with its tiles in registers: 2 warps x 16 rows, 1 tile(s) staged through 2 shared-memory buffers
// CHECK: float [[ROW:row[0-9]+]][4][2];
// CHECK: for (int j = 0; j < 2; ++j) [[ROW]][ni][j] = arg2[{{.*}} + (int64_t)(8 * ni + 2 * (lane{{[0-9]+}} & 3) + j) * 1];
// CHECK: tessera_ldmatrix_x4(r, st0_
// CHECK: - [[ROW]][ni][q & 1];
// CHECK: tessera_ldmatrix_x4_trans(r, st0_
ttile.kernel @keys_by_queries(%k: memref<32x16xbf16>, %q: memref<64x16xbf16>, %lse: memref<64x1xf32>, %dk: memref<32x16xf32>) attributes {block = array<i64: 64>, grid = array<i64: 1>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %tk = ttile.load %k[%c0, %c0] : memref<32x16xbf16> -> !ttile.tile<32x16xbf16>
  %a0 = ttile.fill 0.0 : !ttile.tile<32x16xf32>
  %res = scf.for %i = %c0 to %c64 step %c32 iter_args(%acc = %a0) -> (!ttile.tile<32x16xf32>) {
    %tq = ttile.load %q[%i, %c0] : memref<64x16xbf16> -> !ttile.tile<32x16xbf16>
    %tl = ttile.load %lse[%i, %c0] : memref<64x1xf32> -> !ttile.tile<32x1xf32>
    %lt = ttile.transpose %tl : !ttile.tile<32x1xf32> to !ttile.tile<1x32xf32>
    %qt = ttile.transpose %tq : !ttile.tile<32x16xbf16> to !ttile.tile<16x32xbf16>
    %z = ttile.fill 0.0 : !ttile.tile<32x32xf32>
    %st = ttile.dot %tk, %qt, %z {warps = array<i64: 2, 1>} : !ttile.tile<32x16xbf16>, !ttile.tile<16x32xbf16> -> !ttile.tile<32x32xf32>
    %lb = ttile.broadcast %lt : !ttile.tile<1x32xf32> to !ttile.tile<32x32xf32>
    %d = ttile.sub %st, %lb : !ttile.tile<32x32xf32>
    %pt = ttile.exp %d : !ttile.tile<32x32xf32>
    %pb = ttile.cast %pt : !ttile.tile<32x32xf32> to !ttile.tile<32x32xbf16>
    %an = ttile.dot %pb, %tq, %acc {warps = array<i64: 2, 1>} : !ttile.tile<32x32xbf16>, !ttile.tile<32x16xbf16> -> !ttile.tile<32x16xf32>
    scf.yield %an : !ttile.tile<32x16xf32>
  }
  ttile.store %res, %dk[%c0, %c0] : !ttile.tile<32x16xf32>, memref<32x16xf32>
  ttile.return
}
