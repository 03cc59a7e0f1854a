// tessera-cpu-fuse: consecutive elementwise ops, fills, iotas, dropout
// factors, broadcasts and in-place loads over tiles of one size share one
// element loop
// (ttile.fused = N, N numbering the kernel's loops), when the loop has two
// ops or more besides its loads. Its input is tessera-cpu-in-place's output.
// RUN: tessera-opt %s --split-input-file --tessera-cpu-in-place --tessera-cpu-fuse --verify-diagnostics | FileCheck %s

// A bias (a broadcast row) plus GELU: the in-place loads, the broadcast
// and both elementwise ops form loop 0; the store ends it. The reduction
// ends the next run; the lone exp after it is a loop of its own.
// CHECK-LABEL: ttile.kernel @bias_gelu(
// CHECK: ttile.load %arg0{{.*}}{ttile.fused = 0 : i64, ttile.in_place}
// CHECK-NEXT: ttile.load %arg1{{.*}}{ttile.fused = 0 : i64, ttile.in_place}
// CHECK-NEXT: ttile.broadcast {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.add {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.gelu {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.store
// CHECK-NEXT: ttile.reduce
// CHECK-NOT: ttile.fused
// CHECK: ttile.return
ttile.kernel @bias_gelu(%x: memref<64x128xf32>, %b: memref<1x128xf32>, %y: memref<64x128xf32>, %r: memref<64x1xf32>)
    attributes {grid = array<i64: 4>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %p = ttile.program_id 0
  %row = arith.muli %p, %c16 : index
  %tx = ttile.load %x[%row, %c0] : memref<64x128xf32> -> !ttile.tile<16x128xf32>
  %tb = ttile.load %b[%c0, %c0] : memref<1x128xf32> -> !ttile.tile<1x128xf32>
  %bb = ttile.broadcast %tb : !ttile.tile<1x128xf32> to !ttile.tile<16x128xf32>
  %s = ttile.add %tx, %bb : !ttile.tile<16x128xf32>
  %g = ttile.gelu %s : !ttile.tile<16x128xf32>
  ttile.store %g, %y[%row, %c0] : !ttile.tile<16x128xf32>, memref<64x128xf32>
  %m = ttile.reduce %g {dim = 1 : i64, kind = #tgraph.reduction<max>} : !ttile.tile<16x128xf32> -> !ttile.tile<16x1xf32>
  %e = ttile.exp %m : !ttile.tile<16x1xf32>
  ttile.store %e, %r[%row, %c0] : !ttile.tile<16x1xf32>, memref<64x1xf32>
  ttile.return
}

// -----

// A causal attention block's mask: the two position iotas, their compare,
// the -inf fill and the select are one loop (the positions are computed from
// the element's index where the compare reads them, never stored), and so
// is a dropout factor with the multiply it feeds.
// CHECK-LABEL: ttile.kernel @causal_mask(
// CHECK: ttile.iota {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.iota {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.compare {{.*}}{{{.*}}ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.fill {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.select {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.dropout_factor {{.*}}ttile.fused = 0 : i64
// CHECK-NEXT: ttile.mul {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.store
ttile.kernel @causal_mask(%x: memref<64x64xf32>, %y: memref<64x64xf32>)
    attributes {grid = array<i64: 4>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %seed = arith.constant 7 : index
  %p = ttile.program_id 0
  %row = arith.muli %p, %c16 : index
  %tx = ttile.load %x[%row, %c0] : memref<64x64xf32> -> !ttile.tile<16x64xf32>
  %qpos = ttile.iota %row dim 0 : !ttile.tile<16x64xi32>
  %kpos = ttile.iota %c0 dim 1 : !ttile.tile<16x64xi32>
  %keep = ttile.compare %qpos, %kpos {kind = #tgraph.compare<ge>} : !ttile.tile<16x64xi32> -> !ttile.tile<16x64xi1>
  %ninf = ttile.fill 0xFFF0000000000000 : !ttile.tile<16x64xf32>
  %s = ttile.select %keep, %tx, %ninf : !ttile.tile<16x64xi1>, !ttile.tile<16x64xf32>
  %z = ttile.dropout_factor %seed, %seed at %row {p = 2.500000e-01 : f64, strides = array<i64: 64, 1>} : !ttile.tile<16x64xf32>
  %d = ttile.mul %s, %z : !ttile.tile<16x64xf32>
  ttile.store %d, %y[%row, %c0] : !ttile.tile<16x64xf32>, memref<64x64xf32>
  ttile.return
}

// -----

// Runs end at a tile of another size and at a broadcast of a value the run
// computes (a scalar in its loop, not an array to index): the broadcast
// starts the next loop. Loops are numbered across the kernel, inside scf.for
// too; the lone exp of a 4x1 tile has a loop of its own.
// CHECK-LABEL: ttile.kernel @runs(
// CHECK: ttile.fill {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.exp {{.*}}{ttile.fused = 0 : i64}
// CHECK-NEXT: ttile.fill {{.*}}{ttile.fused = 1 : i64}
// CHECK-NEXT: ttile.neg {{.*}}{ttile.fused = 1 : i64}
// CHECK-NEXT: ttile.broadcast {{.*}}{ttile.fused = 2 : i64}
// CHECK-NEXT: ttile.add {{.*}}{ttile.fused = 2 : i64}
// CHECK: ttile.exp %{{[0-9]+}} : !ttile.tile<4x1xf32>
// CHECK: scf.for
// CHECK-NEXT: ttile.fill {{.*}}{ttile.fused = 3 : i64}
// CHECK-NEXT: ttile.mul {{.*}}{ttile.fused = 3 : i64}
ttile.kernel @runs(%y: memref<4x8xf32>, %z: memref<4x1xf32>, %w: memref<4x8xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %one = ttile.fill 1.0 : !ttile.tile<4x8xf32>
  %e = ttile.exp %one : !ttile.tile<4x8xf32>
  %col = ttile.fill 2.0 : !ttile.tile<4x1xf32>
  %n = ttile.neg %col : !ttile.tile<4x1xf32>
  %wide = ttile.broadcast %n : !ttile.tile<4x1xf32> to !ttile.tile<4x8xf32>
  %s = ttile.add %e, %wide : !ttile.tile<4x8xf32>
  ttile.store %s, %y[%c0, %c0] : !ttile.tile<4x8xf32>, memref<4x8xf32>
  %lone = ttile.exp %n : !ttile.tile<4x1xf32>
  ttile.store %lone, %z[%c0, %c0] : !ttile.tile<4x1xf32>, memref<4x1xf32>
  scf.for %i = %c0 to %c1 step %c1 {
    %h = ttile.fill 0.5 : !ttile.tile<4x8xf32>
    %q = ttile.mul %h, %h : !ttile.tile<4x8xf32>
    ttile.store %q, %w[%c0, %c0] : !ttile.tile<4x8xf32>, memref<4x8xf32>
  }
  ttile.return
}

// -----

// A kernel the GPU schedule placed already.
// expected-error @+1 {{kernel is scheduled for the GPU (ttile.smem_bytes); the CPU schedule is for kernels printed as C++}}
ttile.kernel @placed(%x: memref<16xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 32>, ttile.smem_bytes = 0 : i64} {
  ttile.return
}
