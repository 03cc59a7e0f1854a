// tessera-gpu-software-pipeline: each scf.for of a ttile.kernel becomes a GEMM main
// loop (#ttile.pipeline<kind = gemm>), a loop with its tiles in registers
// (kind = registers) or neither (ttile.fallback says why); dots outside such
// loops go to tensor cores or say why not. It places a schedulable loop's
// values (ttile.place) and nothing else: regions, spills and shared-memory
// offsets are tessera-gpu-place's and tessera-gpu-alloc-shared's.
// RUN: tessera-opt %s --split-input-file --tessera-gpu-software-pipeline --verify-diagnostics | FileCheck %s
// RUN: tessera-opt %s --split-input-file --tessera-gpu-software-pipeline='register-budget=64' --verify-diagnostics | FileCheck %s --check-prefix=BUDGET
// Scheduling again replaces the schedule (the passes after it set nothing
// that survives a second tessera-gpu-software-pipeline).
// RUN: tessera-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(tessera-gpu-software-pipeline,tessera-gpu-place,tessera-gpu-alloc-shared,tessera-gpu-software-pipeline)' | FileCheck %s --check-prefix=AGAIN

// An mma.sync GEMM main loop on a 3-stage cp.async ring: its loads are
// staged, its dot and result fragments, its initial fill folded in.
// CHECK-LABEL: ttile.kernel @gemm(
// CHECK: ttile.fill {{.*}}ttile.place = #ttile.place<literal>
// CHECK: ttile.load {{.*}}ttile.place = #ttile.place<staged>
// CHECK: ttile.load {{.*}}ttile.place = #ttile.place<staged>
// CHECK: ttile.dot {{.*}}ttile.place = #ttile.place<fragment>
// CHECK: } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = mma_sync, copies = cp_async, stages = 3>, ttile.place = #ttile.place<fragment>}
// The epilogue is tessera-gpu-place's.
// CHECK: ttile.cast %{{[0-9]+}} : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
// CHECK-NOT: ttile.region
// AGAIN-LABEL: ttile.kernel @gemm(
// AGAIN-NOT: ttile.smem_bytes
// AGAIN: } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = mma_sync, copies = cp_async, stages = 3>, ttile.place = #ttile.place<fragment>}
// AGAIN-NOT: ttile.region
// AGAIN: ttile.return
ttile.kernel @gemm(%a: memref<128x96xbf16>, %b: memref<96x128xbf16>, %c: memref<128x128xbf16>)
    attributes {grid = array<i64: 4>, block = array<i64: 128>, stages = 3 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c96 = arith.constant 96 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  %acc = scf.for %k = %c0 to %c96 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %ta = ttile.load %a[%c0, %k] : memref<128x96xbf16> -> !ttile.tile<64x32xbf16>
    %tb = ttile.load %b[%k, %c0] : memref<96x128xbf16> -> !ttile.tile<32x64xbf16>
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 2, 2>} : !ttile.tile<64x32xbf16>, !ttile.tile<32x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  }
  %h = ttile.cast %acc : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
  ttile.store %h, %c[%c0, %c0] : !ttile.tile<64x64xbf16>, memref<128x128xbf16>
  ttile.return
}

// -----

// wgmma on a TMA ring fed by a producer warpgroup, one wgmma group in flight
// (3+ stages: lag = 1).
// CHECK-LABEL: ttile.kernel @producer_gemm(
// CHECK: } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = wgmma, copies = tma, stages = 4, lag = 1, producer = true>
ttile.kernel @producer_gemm(%a: memref<256x320xbf16>, %b: memref<320x256xbf16>, %c: memref<256x256xf32>)
    attributes {grid = array<i64: 2>, block = array<i64: 384>, stages = 4 : i64, producer_warpgroup} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c320 = arith.constant 320 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<128x256xf32>
  %acc = scf.for %k = %c0 to %c320 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<128x256xf32>) {
    %ta = ttile.load %a[%c0, %k] {tma} : memref<256x320xbf16> -> !ttile.tile<128x64xbf16>
    %tb = ttile.load %b[%k, %c0] {tma} : memref<320x256xbf16> -> !ttile.tile<64x256xbf16>
    %d = ttile.dot %ta, %tb, %it {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
    scf.yield %d : !ttile.tile<128x256xf32>
  }
  ttile.store %acc, %c[%c0, %c0] : !ttile.tile<128x256xf32>, memref<256x256xf32>
  ttile.return
}

// -----

// f32 operands: no tensor-core schedule; the loop and its dot say why.
// CHECK-LABEL: ttile.kernel @f32_gemm(
// CHECK: ttile.dot {{.*}}ttile.fallback = "f32 operands with an f32 accumulator (tensor cores: bf16/f16 into f32); f32 x f32 operands into f32 (this path: bf16 into f32)"
// CHECK: } {ttile.fallback = "a loaded tile !ttile.tile<16x16xf32> is not a 2-D bf16 tile of a bf16 buffer"}
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

// Flash attention's loop keeps its tiles in registers: scores are fragments,
// row statistics columns, K and V staged (K transposed), Q read from global
// memory into registers.
// CHECK-LABEL: ttile.kernel @flash(
// CHECK: ttile.load %arg0{{.*}}ttile.place = #ttile.place<global>
// CHECK: ttile.load {{.*}}ttile.place = #ttile.place<staged>
// CHECK: ttile.transpose {{.*}}ttile.place = #ttile.place<staged_transposed>
// CHECK: ttile.dot {{.*}}ttile.place = #ttile.place<fragment>
// CHECK: ttile.reduce {{.*}}ttile.place = #ttile.place<column>
// CHECK: ttile.broadcast {{.*}}ttile.place = #ttile.place<broadcast>
// CHECK: } {ttile.pipeline = #ttile.pipeline<kind = registers, mma = mma_sync, copies = cp_async, stages = 2>, ttile.place = [#ttile.place<column>, #ttile.place<column>, #ttile.place<fragment>]}
ttile.kernel @flash(%q: memref<32x16xbf16>, %k: memref<32x16xbf16>, %v: memref<32x16xbf16>, %o: memref<32x16xf32>) attributes {block = array<i64: 64>, grid = array<i64: 1>, stages = 2 : i64} {
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
    %rmax = ttile.reduce %s {dim = 1 : i64, kind = #tgraph.reduction<max>} : !ttile.tile<32x32xf32> -> !ttile.tile<32x1xf32>
    %mn = ttile.max %m, %rmax : !ttile.tile<32x1xf32>
    %mb = ttile.broadcast %mn : !ttile.tile<32x1xf32> to !ttile.tile<32x32xf32>
    %d = ttile.sub %s, %mb : !ttile.tile<32x32xf32>
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
  ttile.store %res#2, %o[%c0, %c0] : !ttile.tile<32x16xf32>, memref<32x16xf32>
  ttile.return
}

// -----

// A wgmma register loop: the loop-invariant Q goes to shared memory on the
// wgmma branch (its A operand must be there); with fewer registers for the
// loop (register-budget=64) on the mma.sync branch too.
// CHECK-LABEL: ttile.kernel @wgmma_register_loop(
// CHECK: ttile.load %arg0{{.*}}ttile.shared_in = [#ttile.mma<wgmma>]
// CHECK: } {ttile.pipeline = #ttile.pipeline<kind = registers, mma = wgmma, copies = cp_async, stages = 2>, ttile.place = #ttile.place<fragment>}
// BUDGET-LABEL: ttile.kernel @wgmma_register_loop(
// BUDGET: ttile.load %arg0{{.*}}ttile.shared_in = [#ttile.mma<mma_sync>, #ttile.mma<wgmma>]
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

// Staged tiles that are not whole swizzle atoms: the loop stays in registers
// on mma.sync and says why it is not on wgmma.
// CHECK-LABEL: ttile.kernel @wgmma_register_loop_narrow(
// CHECK: } {ttile.fallback = "a staged 32x96 tile is not whole 128-byte swizzle atoms (8 rows by 64 columns)", ttile.pipeline = #ttile.pipeline<kind = registers, mma = mma_sync, copies = cp_async, stages = 2>
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

// Two warpgroups taking turns (ttile.pingpong), and issuing the next Q K^T
// ahead on a 3-stage TMA ring (ttile.issue_ahead), become the loop's pipeline.
// CHECK-LABEL: ttile.kernel @pingpong(
// CHECK: #ttile.pipeline<kind = registers, mma = wgmma, copies = cp_async, stages = 2, pingpong = true>
// CHECK-LABEL: ttile.kernel @issue_ahead(
// CHECK: #ttile.pipeline<kind = registers, mma = wgmma, copies = tma, stages = 3, issue_ahead = true>
ttile.kernel @pingpong(%q: memref<128x128xbf16>, %k: memref<256x128xbf16>, %v: memref<256x128xbf16>, %o: memref<128x128xf32>)
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
ttile.kernel @issue_ahead(%q: memref<64x64xbf16>, %k: memref<256x64xbf16>, %v: memref<256x64xbf16>, %o: memref<64x64xf32>)
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

// TMA fills only the ring of a wgmma GEMM: on one operand alone it is an error.
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

// A register loop's staged tiles share one ring: tma on some is an error.
ttile.kernel @tma_some_staged(%q: memref<64x64xbf16>, %k: memref<256x64xbf16>, %v: memref<256x64xbf16>, %o: memref<64x64xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>, stages = 3 : i64} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c256 = arith.constant 256 : index
  %tq = ttile.load %q[%c0, %c0] : memref<64x64xbf16> -> !ttile.tile<64x64xbf16>
  %zero = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  // expected-error @+1 {{a register loop's staged tiles are loaded with tma all or none (they share one ring)}}
  %acc = scf.for %j = %c0 to %c256 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %tk = ttile.load %k[%j, %c0] {tma} : memref<256x64xbf16> -> !ttile.tile<64x64xbf16>
    %tv = ttile.load %v[%j, %c0] : memref<256x64xbf16> -> !ttile.tile<64x64xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<64x64xbf16> to !ttile.tile<64x64xbf16>
    %s = ttile.dot %tq, %kt, %zero {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
    %p = ttile.cast %s : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
    %d = ttile.dot %p, %tv, %it {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  }
  ttile.store %acc, %o[%c0, %c0] : !ttile.tile<64x64xf32>, memref<64x64xf32>
  ttile.return
}

// -----

// TMA needs wgmma: a register loop on mma.sync cannot take it.
ttile.kernel @tma_without_wgmma(%q: memref<64x64xbf16>, %k: memref<256x64xbf16>, %v: memref<256x64xbf16>, %o: memref<64x64xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>, stages = 3 : i64} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c256 = arith.constant 256 : index
  %tq = ttile.load %q[%c0, %c0] : memref<64x64xbf16> -> !ttile.tile<64x64xbf16>
  %zero = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  %acc0 = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  // expected-error @+1 {{ttile.load {tma} in a loop whose dots are not wgmma: none asks for it}}
  %acc = scf.for %j = %c0 to %c256 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %tk = ttile.load %k[%j, %c0] {tma} : memref<256x64xbf16> -> !ttile.tile<64x64xbf16>
    %tv = ttile.load %v[%j, %c0] {tma} : memref<256x64xbf16> -> !ttile.tile<64x64xbf16>
    %kt = ttile.transpose %tk : !ttile.tile<64x64xbf16> to !ttile.tile<64x64xbf16>
    %s = ttile.dot %tq, %kt, %zero {warps = array<i64: 4, 1>} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
    %p = ttile.cast %s : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
    %d = ttile.dot %p, %tv, %it {warps = array<i64: 4, 1>} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  }
  ttile.store %acc, %o[%c0, %c0] : !ttile.tile<64x64xf32>, memref<64x64xf32>
  ttile.return
}
