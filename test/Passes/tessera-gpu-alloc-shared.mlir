// tessera-gpu-alloc-shared: byte offsets in shared memory for the tiles
// tessera-gpu-place put there (ttile.smem), each pipelined loop's ring
// (ttile.ring) and mbarriers (ttile.barriers), the kernel's total
// (ttile.smem_bytes); ttile.release marks where the printer's block barrier
// lets later tiles reuse the bytes of dead ones. Its input is
// tessera-gpu-place's output.
// RUN: tessera-opt %s --split-input-file --tessera-gpu-alloc-shared --verify-diagnostics | FileCheck %s

// Two reductions in a row: the second input tile reuses the first's bytes
// (the first reduction's result, still to be stored, sits after it).
// CHECK-LABEL: ttile.kernel @reuse(
// CHECK-SAME: ttile.smem_bytes = 8320 : i64
// CHECK: ttile.load %arg0{{.*}}ttile.smem = 0 : i64}
// CHECK-NEXT: ttile.reduce {{.*}}ttile.smem = 8192 : i64}
// CHECK-NEXT: ttile.store {{.*}}ttile.release}
// CHECK-NEXT: ttile.load %arg1{{.*}}ttile.smem = 0 : i64}
// CHECK-NEXT: ttile.reduce {{.*}}ttile.release, ttile.smem = 8192 : i64}
// CHECK: ttile.return {ttile.release}
ttile.kernel @reuse(%x: memref<32x64xf32>, %y: memref<32x64xf32>, %a: memref<32x1xf32>, %b: memref<32x1xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %x[%c0, %c0] {ttile.domain = array<i64: 32, 64>, ttile.place = #ttile.place<shared>, ttile.region = 0 : i64} : memref<32x64xf32> -> !ttile.tile<32x64xf32>
  %r = ttile.reduce %t {dim = 1 : i64, kind = #tgraph.reduction<sum>, ttile.place = #ttile.place<shared>} : !ttile.tile<32x64xf32> -> !ttile.tile<32x1xf32>
  ttile.store %r, %a[%c0, %c0] {ttile.domain = array<i64: 32, 64>, ttile.region = 1 : i64} : !ttile.tile<32x1xf32>, memref<32x1xf32>
  %u = ttile.load %y[%c0, %c0] {ttile.place = #ttile.place<shared>, ttile.region = 1 : i64} : memref<32x64xf32> -> !ttile.tile<32x64xf32>
  %s = ttile.reduce %u {dim = 1 : i64, kind = #tgraph.reduction<max>, ttile.place = #ttile.place<shared>} : !ttile.tile<32x64xf32> -> !ttile.tile<32x1xf32>
  ttile.store %s, %b[%c0, %c0] {ttile.domain = array<i64: 32, 1>, ttile.region = 2 : i64} : !ttile.tile<32x1xf32>, memref<32x1xf32>
  ttile.return
}

// -----

// A producer-fed wgmma GEMM: the 4-stage ring first, then its `full` and
// `empty` mbarriers (one 8-byte barrier per stage each).
// CHECK-LABEL: ttile.kernel @producer_gemm(
// CHECK-SAME: ttile.smem_bytes = 208960 : i64
// CHECK: } {ttile.barriers = array<i64: 208896, 208928>, ttile.pipeline = {{.*}}, ttile.ring = 0 : i64}
ttile.kernel @producer_gemm(%a: memref<256x320xbf16>, %b: memref<320x256xbf16>, %c: memref<256x256xf32>)
    attributes {block = array<i64: 384>, grid = array<i64: 2>, producer_warpgroup, stages = 4 : i64} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c320 = arith.constant 320 : index
  %acc0 = ttile.fill 0.0 {ttile.place = #ttile.place<literal>} : !ttile.tile<128x256xf32>
  %acc = scf.for %k = %c0 to %c320 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<128x256xf32>) {
    %ta = ttile.load %a[%c0, %k] {tma, ttile.place = #ttile.place<staged>} : memref<256x320xbf16> -> !ttile.tile<128x64xbf16>
    %tb = ttile.load %b[%k, %c0] {tma, ttile.place = #ttile.place<staged>} : memref<320x256xbf16> -> !ttile.tile<64x256xbf16>
    %d = ttile.dot %ta, %tb, %it {ttile.place = #ttile.place<fragment>, warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
    scf.yield %d : !ttile.tile<128x256xf32>
  } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = wgmma, copies = tma, stages = 4, lag = 1, producer = true>, ttile.place = #ttile.place<fragment>}
  ttile.store %acc, %c[%c0, %c0] {ttile.domain = array<i64: 128, 256>, ttile.region = 1 : i64} : !ttile.tile<128x256xf32>, memref<256x256xf32>
  ttile.return
}

// -----

// A register loop: the loop-invariant Q the wgmma branch reads from shared
// memory gets a tile, then the loop's ring of staged K and V tiles.
// CHECK-LABEL: ttile.kernel @register_loop(
// CHECK-SAME: ttile.smem_bytes = 90112 : i64
// CHECK: ttile.load %arg0{{.*}}ttile.shared_in = [#ttile.mma<wgmma>], ttile.smem = 0 : i64}
// CHECK: } {ttile.pipeline = {{.*}}, ttile.ring = 40960 : i64}
// CHECK: ttile.store {{.*}}ttile.release}
ttile.kernel @register_loop(%q: memref<64x128xbf16>, %k: memref<256x128xbf16>, %v: memref<256x128xbf16>, %o: memref<64x128xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>, stages = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c256 = arith.constant 256 : index
  %tq = ttile.load %q[%c0, %c0] {ttile.domain = array<i64: 64, 128>, ttile.place = #ttile.place<global>, ttile.region = 0 : i64, ttile.shared_in = [#ttile.mma<wgmma>]} : memref<64x128xbf16> -> !ttile.tile<64x128xbf16>
  %zero = ttile.fill 0.000000e+00 {ttile.domain = array<i64: 64, 32>, ttile.place = #ttile.place<literal>, ttile.region = 1 : i64} : !ttile.tile<64x32xf32>
  %acc0 = ttile.fill 0.000000e+00 {ttile.place = #ttile.place<literal>} : !ttile.tile<64x128xf32>
  %acc = scf.for %j = %c0 to %c256 step %c32 iter_args(%it = %acc0) -> (!ttile.tile<64x128xf32>) {
    %tk = ttile.load %k[%j, %c0] {ttile.place = #ttile.place<staged>} : memref<256x128xbf16> -> !ttile.tile<32x128xbf16>
    %tv = ttile.load %v[%j, %c0] {ttile.place = #ttile.place<staged>} : memref<256x128xbf16> -> !ttile.tile<32x128xbf16>
    %kt = ttile.transpose %tk {ttile.place = #ttile.place<staged_transposed>} : !ttile.tile<32x128xbf16> to !ttile.tile<128x32xbf16>
    %s = ttile.dot %tq, %kt, %zero {ttile.place = #ttile.place<fragment>, warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x128xbf16>, !ttile.tile<128x32xbf16> -> !ttile.tile<64x32xf32>
    %p = ttile.cast %s {ttile.place = #ttile.place<fragment>} : !ttile.tile<64x32xf32> to !ttile.tile<64x32xbf16>
    %d = ttile.dot %p, %tv, %it {ttile.place = #ttile.place<fragment>, warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x32xbf16>, !ttile.tile<32x128xbf16> -> !ttile.tile<64x128xf32>
    scf.yield %d : !ttile.tile<64x128xf32>
  } {ttile.pipeline = #ttile.pipeline<kind = registers, mma = wgmma, copies = cp_async, stages = 2>, ttile.place = #ttile.place<fragment>}
  ttile.store %acc, %o[%c0, %c0] {ttile.domain = array<i64: 64, 128>, ttile.region = 3 : i64} : !ttile.tile<64x128xf32>, memref<64x128xf32>
  ttile.return
}

// -----

// 256 KB of live tiles: more than an sm_90 block has.
// expected-error @+1 {{kernel @too_big needs 263168 bytes of shared memory; an sm_90 block has at most 232448: use smaller tiles or fewer stages}}
ttile.kernel @too_big(%a: memref<256x256xf32>, %r: memref<256x1xf32>) attributes {block = array<i64: 256>, grid = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %a[%c0, %c0] {ttile.domain = array<i64: 256, 256>, ttile.place = #ttile.place<shared>, ttile.region = 0 : i64} : memref<256x256xf32> -> !ttile.tile<256x256xf32>
  %s = ttile.reduce %t {dim = 1 : i64, kind = #tgraph.reduction<sum>, ttile.place = #ttile.place<shared>} : !ttile.tile<256x256xf32> -> !ttile.tile<256x1xf32>
  ttile.store %s, %r[%c0, %c0] {ttile.domain = array<i64: 256, 1>, ttile.region = 1 : i64} : !ttile.tile<256x1xf32>, memref<256x1xf32>
  ttile.return
}

// -----

// A value tessera-gpu-place has not placed.
ttile.kernel @unplaced(%a: memref<32x64xf32>, %r: memref<32x1xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %a[%c0, %c0] {ttile.domain = array<i64: 32, 64>, ttile.place = #ttile.place<shared>, ttile.region = 0 : i64} : memref<32x64xf32> -> !ttile.tile<32x64xf32>
  // expected-error @+1 {{'ttile.reduce' has no ttile.place: run tessera-gpu-place before tessera-gpu-alloc-shared}}
  %s = ttile.reduce %t {dim = 1 : i64, kind = #tgraph.reduction<sum>} : !ttile.tile<32x64xf32> -> !ttile.tile<32x1xf32>
  ttile.store %s, %r[%c0, %c0] {ttile.domain = array<i64: 32, 1>, ttile.region = 1 : i64} : !ttile.tile<32x1xf32>, memref<32x1xf32>
  ttile.return
}

// -----

// A loop whose #ttile.pipeline says gemm but whose body is not a GEMM main
// loop (here the dot has no `warps`): a diagnostic, not a crash.
ttile.kernel @not_a_gemm_loop(%a: memref<128x64xbf16>, %b: memref<64x128xbf16>, %c: memref<128x128xf32>)
    attributes {block = array<i64: 128>, grid = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %acc0 = ttile.fill 0.0 {ttile.place = #ttile.place<literal>} : !ttile.tile<128x128xf32>
  // expected-error @+1 {{this loop's #ttile.pipeline says kind = gemm, but the dot has no 'warps': run tessera-gpu-software-pipeline to schedule it}}
  %acc = scf.for %k = %c0 to %c64 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<128x128xf32>) {
    %ta = ttile.load %a[%c0, %k] {ttile.place = #ttile.place<staged>} : memref<128x64xbf16> -> !ttile.tile<128x64xbf16>
    %tb = ttile.load %b[%k, %c0] {ttile.place = #ttile.place<staged>} : memref<64x128xbf16> -> !ttile.tile<64x128xbf16>
    %d = ttile.dot %ta, %tb, %it {ttile.place = #ttile.place<fragment>} : !ttile.tile<128x64xbf16>, !ttile.tile<64x128xbf16> -> !ttile.tile<128x128xf32>
    scf.yield %d : !ttile.tile<128x128xf32>
  } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = mma_sync, copies = cp_async, stages = 2>, ttile.place = #ttile.place<fragment>}
  ttile.store %acc, %c[%c0, %c0] {ttile.domain = array<i64: 128, 128>, ttile.region = 1 : i64} : !ttile.tile<128x128xf32>, memref<128x128xf32>
  ttile.return
}
