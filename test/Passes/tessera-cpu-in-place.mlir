// tessera-cpu-in-place: which tiles of a CPU kernel are blocks of its
// buffers (ttile.in_place on a load: a pointer, no copy; on a store: the
// tile is computed where the store writes it) and which dots add into their
// accumulator's array (ttile.accumulate).
// RUN: tessera-opt %s --split-input-file --tessera-cpu-in-place --verify-diagnostics | FileCheck %s

// A bias add and GELU over a row block: the loads of %x and %b (never
// stored, contiguous) are read in place; the sum is computed in its
// store's block of %kept (stored once, never loaded), the GELU in %y's.
// CHECK-LABEL: ttile.kernel @gelu(
// CHECK: ttile.load %arg0{{.*}}{ttile.in_place}
// CHECK: ttile.load %arg1{{.*}}{ttile.in_place}
// CHECK: ttile.store %{{.*}}, %arg2{{.*}}{ttile.in_place}
// CHECK: ttile.store %{{.*}}, %arg3{{.*}}{ttile.in_place}
ttile.kernel @gelu(%x: memref<64x128xf32>, %b: memref<64x128xf32>, %kept: memref<64x128xf32>, %y: memref<64x128xf32>)
    attributes {grid = array<i64: 4>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %p = ttile.program_id 0
  %row = arith.muli %p, %c16 : index
  %tx = ttile.load %x[%row, %c0] : memref<64x128xf32> -> !ttile.tile<16x128xf32>
  %tb = ttile.load %b[%row, %c0] : memref<64x128xf32> -> !ttile.tile<16x128xf32>
  %s = ttile.add %tx, %tb : !ttile.tile<16x128xf32>
  %g = ttile.gelu %s : !ttile.tile<16x128xf32>
  ttile.store %s, %kept[%row, %c0] : !ttile.tile<16x128xf32>, memref<64x128xf32>
  ttile.store %g, %y[%row, %c0] : !ttile.tile<16x128xf32>, memref<64x128xf32>
  ttile.return
}

// -----

// Copies: a column block is not contiguous, a bf16 buffer is converted
// per element, a buffer the kernel stores to is read by copying (a view
// would see the store), a buffer stored twice is written by copying, and a
// tile whose store offset is computed after it cannot be computed there.
// CHECK-LABEL: ttile.kernel @copies(
// CHECK-NOT: ttile.in_place
// CHECK: ttile.return
ttile.kernel @copies(%a: memref<16x128xf32>, %h: memref<16x16xbf16>, %io: memref<16x16xf32>, %two: memref<16x32xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %ta = ttile.load %a[%c0, %c0] : memref<16x128xf32> -> !ttile.tile<16x16xf32>
  %th = ttile.load %h[%c0, %c0] : memref<16x16xbf16> -> !ttile.tile<16x16xbf16>
  %tio = ttile.load %io[%c0, %c0] : memref<16x16xf32> -> !ttile.tile<16x16xf32>
  %s = ttile.add %ta, %tio : !ttile.tile<16x16xf32>
  ttile.store %s, %io[%c0, %c0] : !ttile.tile<16x16xf32>, memref<16x16xf32>
  ttile.store %s, %two[%c0, %c0] : !ttile.tile<16x16xf32>, memref<16x32xf32>
  %m = ttile.mul %ta, %ta : !ttile.tile<16x16xf32>
  %c16 = arith.constant 16 : index
  ttile.store %m, %two[%c0, %c16] : !ttile.tile<16x16xf32>, memref<16x32xf32>
  %t0 = ttile.load %a[%c0, %c0] : memref<16x128xf32> -> !ttile.tile<1x128xf32>
  %e = ttile.exp %t0 : !ttile.tile<1x128xf32>
  %c1 = arith.constant 1 : index
  ttile.store %e, %a[%c1, %c0] : !ttile.tile<1x128xf32>, memref<16x128xf32>
  ttile.return
}

// -----

// A loop's dot adds into the carried accumulator (its only use, in its
// block); the dot after the loop does not: its accumulator is read twice.
// The loop's result is a carried array: its store copies.
// CHECK-LABEL: ttile.kernel @dots(
// CHECK: scf.for
// CHECK: ttile.dot {{.*}}{ttile.accumulate}
// CHECK: ttile.store %{{[0-9]+}}, %arg2[%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}] : !ttile.tile<16x16xf32>
// CHECK: ttile.dot
// CHECK-NOT: ttile.accumulate
// CHECK: ttile.return
ttile.kernel @dots(%a: memref<16x64xf32>, %b: memref<64x16xf32>, %c: memref<16x16xf32>, %d: memref<16x16xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  %zero = ttile.fill 0.0 : !ttile.tile<16x16xf32>
  %acc = scf.for %k = %c0 to %c64 step %c16 iter_args(%it = %zero) -> (!ttile.tile<16x16xf32>) {
    %ta = ttile.load %a[%c0, %k] : memref<16x64xf32> -> !ttile.tile<16x16xf32>
    %tb = ttile.load %b[%k, %c0] : memref<64x16xf32> -> !ttile.tile<16x16xf32>
    %r = ttile.dot %ta, %tb, %it : !ttile.tile<16x16xf32>, !ttile.tile<16x16xf32> -> !ttile.tile<16x16xf32>
    scf.yield %r : !ttile.tile<16x16xf32>
  }
  ttile.store %acc, %c[%c0, %c0] : !ttile.tile<16x16xf32>, memref<16x16xf32>
  %again = ttile.dot %acc, %acc, %acc : !ttile.tile<16x16xf32>, !ttile.tile<16x16xf32> -> !ttile.tile<16x16xf32>
  ttile.store %again, %d[%c0, %c0] : !ttile.tile<16x16xf32>, memref<16x16xf32>
  ttile.return
}

// -----

// A kernel the GPU schedule placed already.
// expected-error @+1 {{kernel is scheduled for the GPU (ttile.smem_bytes); the CPU schedule is for kernels printed as C++}}
ttile.kernel @placed(%x: memref<16xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 32>, ttile.smem_bytes = 0 : i64} {
  ttile.return
}
