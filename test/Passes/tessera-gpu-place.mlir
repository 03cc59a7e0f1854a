// tessera-gpu-place: pointwise regions (ttile.region, the first op's
// ttile.domain), where each remaining tile value lives (ttile.place) and
// where a fragment is copied to shared memory first (ttile.spill). Its input
// is tessera-gpu-software-pipeline's output: the loops' #ttile.pipeline, the values
// those loops placed.
// RUN: tessera-opt %s --split-input-file --tessera-gpu-place --verify-diagnostics | FileCheck %s

// A GEMM epilogue reading the loop's fragment: one region over the
// fragment's 64x64 shape, in registers, no spill. The loop's own values keep
// tessera-gpu-software-pipeline's placement.
// CHECK-LABEL: ttile.kernel @epilogue(
// CHECK: ttile.fill {{.*}}{ttile.place = #ttile.place<literal>}
// CHECK: ttile.dot {{.*}}{ttile.place = #ttile.place<fragment>, warps
// CHECK: ttile.cast {{.*}}{ttile.domain = array<i64: 64, 64>, ttile.place = #ttile.place<registers>, ttile.region = [[R:[0-9]+]] : i64}
// CHECK-NEXT: ttile.load %arg2{{.*}}{ttile.place = #ttile.place<registers>, ttile.region = [[R]] : i64}
// CHECK-NEXT: ttile.broadcast {{.*}}{ttile.place = #ttile.place<registers>, ttile.region = [[R]] : i64}
// CHECK-NEXT: ttile.add {{.*}}{ttile.place = #ttile.place<registers>, ttile.region = [[R]] : i64}
// CHECK-NEXT: ttile.relu {{.*}}{ttile.place = #ttile.place<registers>, ttile.region = [[R]] : i64}
// CHECK-NEXT: ttile.store {{.*}}{ttile.region = [[R]] : i64}
// CHECK-NOT: ttile.spill
ttile.kernel @epilogue(%a: memref<128x96xbf16>, %b: memref<96x128xbf16>, %bias: memref<1x128xbf16>, %c: memref<128x128xbf16>)
    attributes {grid = array<i64: 4>, block = array<i64: 128>, stages = 3 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c96 = arith.constant 96 : index
  %acc0 = ttile.fill 0.0 {ttile.place = #ttile.place<literal>} : !ttile.tile<64x64xf32>
  %acc = scf.for %k = %c0 to %c96 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %ta = ttile.load %a[%c0, %k] {ttile.place = #ttile.place<staged>} : memref<128x96xbf16> -> !ttile.tile<64x32xbf16>
    %tb = ttile.load %b[%k, %c0] {ttile.place = #ttile.place<staged>} : memref<96x128xbf16> -> !ttile.tile<32x64xbf16>
    %d = ttile.dot %ta, %tb, %it {ttile.place = #ttile.place<fragment>, warps = array<i64: 2, 2>} : !ttile.tile<64x32xbf16>, !ttile.tile<32x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = mma_sync, copies = cp_async, stages = 3>, ttile.place = #ttile.place<fragment>}
  %h = ttile.cast %acc : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
  %tbias = ttile.load %bias[%c0, %c0] : memref<1x128xbf16> -> !ttile.tile<1x64xbf16>
  %bb = ttile.broadcast %tbias : !ttile.tile<1x64xbf16> to !ttile.tile<64x64xbf16>
  %y = ttile.add %h, %bb : !ttile.tile<64x64xbf16>
  %r = ttile.relu %y : !ttile.tile<64x64xbf16>
  ttile.store %r, %c[%c0, %c0] : !ttile.tile<64x64xbf16>, memref<128x128xbf16>
  ttile.return
}

// -----

// A fragment read by a region over its registers (the exp) stays there; read
// by a reduction it is spilled to shared memory first.
// CHECK-LABEL: ttile.kernel @spill(
// CHECK: ttile.exp {{.*}}ttile.place = #ttile.place<registers>, ttile.region = [[R:[0-9]+]] : i64}
// CHECK-NOT: ttile.spill
// CHECK: ttile.reduce {{.*}}{dim = 1 : i64, kind = #tgraph.reduction<sum>, ttile.place = #ttile.place<shared>, ttile.spill}
// CHECK: ttile.store {{.*}}{ttile.domain = array<i64: 64, 1>, ttile.region = {{[0-9]+}} : i64}
ttile.kernel @spill(%a: memref<64x64xbf16>, %b: memref<64x64xbf16>, %r: memref<64x1xf32>, %c: memref<64x64xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %acc0 = ttile.fill 0.0 {ttile.place = #ttile.place<literal>} : !ttile.tile<64x64xf32>
  %acc = scf.for %k = %c0 to %c64 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %ta = ttile.load %a[%c0, %k] {ttile.place = #ttile.place<staged>} : memref<64x64xbf16> -> !ttile.tile<64x32xbf16>
    %tb = ttile.load %b[%k, %c0] {ttile.place = #ttile.place<staged>} : memref<64x64xbf16> -> !ttile.tile<32x64xbf16>
    %d = ttile.dot %ta, %tb, %it {ttile.place = #ttile.place<fragment>, warps = array<i64: 2, 2>} : !ttile.tile<64x32xbf16>, !ttile.tile<32x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = mma_sync, copies = cp_async, stages = 2>, ttile.place = #ttile.place<fragment>}
  %e = ttile.exp %acc : !ttile.tile<64x64xf32>
  ttile.store %e, %c[%c0, %c0] : !ttile.tile<64x64xf32>, memref<64x64xf32>
  %s = ttile.reduce %acc {dim = 1 : i64, kind = #tgraph.reduction<sum>} : !ttile.tile<64x64xf32> -> !ttile.tile<64x1xf32>
  ttile.store %s, %r[%c0, %c0] : !ttile.tile<64x1xf32>, memref<64x1xf32>
  ttile.return
}

// -----

// Regions end at a reduction and at a change of shape. A region's value read
// outside it goes to shared memory; one read only inside stays in registers.
// CHECK-LABEL: ttile.kernel @regions(
// CHECK: ttile.load %arg0{{.*}}{ttile.domain = array<i64: 32, 64>, ttile.place = #ttile.place<registers>, ttile.region = [[A:[0-9]+]] : i64}
// CHECK-NEXT: ttile.exp {{.*}}{ttile.place = #ttile.place<shared>, ttile.region = [[A]] : i64}
// CHECK-NEXT: ttile.reduce {{.*}}ttile.place = #ttile.place<shared>}
// CHECK-NEXT: ttile.store {{.*}}{ttile.domain = array<i64: 32, 1>, ttile.region = [[B:[0-9]+]] : i64}
// CHECK-NEXT: ttile.load %arg1{{.*}}{ttile.domain = array<i64: 16, 16>, ttile.place = #ttile.place<registers>, ttile.region = [[C:[0-9]+]] : i64}
// CHECK-NEXT: ttile.store {{.*}}{ttile.region = [[C]] : i64}
ttile.kernel @regions(%x: memref<32x64xf32>, %y: memref<16x16xf32>, %r: memref<32x1xf32>, %z: memref<16x16xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %x[%c0, %c0] : memref<32x64xf32> -> !ttile.tile<32x64xf32>
  %e = ttile.exp %t : !ttile.tile<32x64xf32>
  %s = ttile.reduce %e {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<32x64xf32> -> !ttile.tile<32x1xf32>
  ttile.store %s, %r[%c0, %c0] : !ttile.tile<32x1xf32>, memref<32x1xf32>
  %u = ttile.load %y[%c0, %c0] : memref<16x16xf32> -> !ttile.tile<16x16xf32>
  ttile.store %u, %z[%c0, %c0] : !ttile.tile<16x16xf32>, memref<16x16xf32>
  ttile.return
}

// -----

// A loop tessera-gpu-software-pipeline has not seen.
ttile.kernel @unscheduled(%a: memref<16x16xf32>, %c: memref<16x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<16x16xf32>
  // expected-error @+1 {{'scf.for' has no schedule: run tessera-gpu-software-pipeline before tessera-gpu-place}}
  %acc = scf.for %k = %c0 to %c16 step %c16 iter_args(%it = %acc0) -> (!ttile.tile<16x16xf32>) {
    %t = ttile.load %a[%c0, %k] : memref<16x16xf32> -> !ttile.tile<16x16xf32>
    %s = ttile.add %t, %it : !ttile.tile<16x16xf32>
    scf.yield %s : !ttile.tile<16x16xf32>
  }
  ttile.store %acc, %c[%c0, %c0] : !ttile.tile<16x16xf32>, memref<16x16xf32>
  ttile.return
}

// -----

// A kernel placed already (tessera-gpu-software-pipeline clears a schedule; this
// pass does not).
// expected-error @+1 {{kernel is scheduled already; run tessera-gpu-software-pipeline first (it clears the schedule)}}
ttile.kernel @placed(%x: memref<16x16xf32>, %z: memref<16x16xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 32>, ttile.smem_bytes = 0 : i64} {
  %c0 = arith.constant 0 : index
  %u = ttile.load %x[%c0, %c0] {ttile.domain = array<i64: 16, 16>, ttile.place = #ttile.place<registers>, ttile.region = 0 : i64} : memref<16x16xf32> -> !ttile.tile<16x16xf32>
  ttile.store %u, %z[%c0, %c0] {ttile.region = 0 : i64} : !ttile.tile<16x16xf32>, memref<16x16xf32>
  ttile.return
}
