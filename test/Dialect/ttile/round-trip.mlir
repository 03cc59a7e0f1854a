// RUN: tessera-opt %s | tessera-opt | FileCheck %s
// RUN: tessera-opt %s --mlir-print-op-generic | tessera-opt | FileCheck %s

// Every ttile op and the tile type in their custom form, printed, re-parsed
// and printed again.

// CHECK-LABEL: ttile.kernel @matmul(
// CHECK-SAME: %[[A:[^:]*]]: memref<8x16xf32>, %[[B:[^:]*]]: memref<16x32xf32>, %[[BIAS:[^:]*]]: memref<8x32xf32>, %[[C:[^:]*]]: memref<8x32xf32>)
// CHECK-SAME: attributes {block = array<i64: 8, 16>, grid = array<i64: 2, 2>}
ttile.kernel @matmul(%a: memref<8x16xf32>, %b: memref<16x32xf32>, %bias: memref<8x32xf32>, %c: memref<8x32xf32>) attributes {grid = array<i64: 2, 2>, block = array<i64: 8, 16>} {
  // CHECK: %[[PM:.*]] = ttile.program_id 0
  %pm = ttile.program_id 0
  // CHECK: %[[PN:.*]] = ttile.program_id 1
  %pn = ttile.program_id 1
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %c16 = arith.constant 16 : index
  // CHECK: %[[ROW:.*]] = arith.muli %[[PM]]
  %row = arith.muli %pm, %c4 : index
  // CHECK: %[[COL:.*]] = arith.muli %[[PN]]
  %col = arith.muli %pn, %c16 : index
  // CHECK: %[[ZERO:.*]] = ttile.fill 0.000000e+00 : !ttile.tile<4x16xf32>
  %zero = ttile.fill 0.0 : !ttile.tile<4x16xf32>
  // CHECK: %[[ACC:.*]] = scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[ACC0:.*]] = %[[ZERO]]) -> (!ttile.tile<4x16xf32>) {
  %acc = scf.for %k = %c0 to %c16 step %c8 iter_args(%acc0 = %zero) -> (!ttile.tile<4x16xf32>) {
    // CHECK: %[[TA:.*]] = ttile.load %[[A]][%[[ROW]], %[[K]]] : memref<8x16xf32> -> !ttile.tile<4x8xf32>
    %ta = ttile.load %a[%row, %k] : memref<8x16xf32> -> !ttile.tile<4x8xf32>
    // CHECK: %[[TB:.*]] = ttile.load %[[B]][%[[K]], %[[COL]]] : memref<16x32xf32> -> !ttile.tile<8x16xf32>
    %tb = ttile.load %b[%k, %col] : memref<16x32xf32> -> !ttile.tile<8x16xf32>
    // program_id may be read inside loops of the kernel too.
    // CHECK: ttile.program_id 1
    %pn_inner = ttile.program_id 1
    // CHECK: %[[NEXT:.*]] = ttile.dot %[[TA]], %[[TB]], %[[ACC0]] : !ttile.tile<4x8xf32>, !ttile.tile<8x16xf32> -> !ttile.tile<4x16xf32>
    %next = ttile.dot %ta, %tb, %acc0 : !ttile.tile<4x8xf32>, !ttile.tile<8x16xf32> -> !ttile.tile<4x16xf32>
    // CHECK: scf.yield %[[NEXT]] : !ttile.tile<4x16xf32>
    scf.yield %next : !ttile.tile<4x16xf32>
  }
  // CHECK: %[[TBIAS:.*]] = ttile.load %[[BIAS]][%[[ROW]], %[[COL]]] : memref<8x32xf32> -> !ttile.tile<4x16xf32>
  %tbias = ttile.load %bias[%row, %col] : memref<8x32xf32> -> !ttile.tile<4x16xf32>
  // CHECK: %[[SUM:.*]] = ttile.add %[[ACC]], %[[TBIAS]] : !ttile.tile<4x16xf32>
  %s = ttile.add %acc, %tbias : !ttile.tile<4x16xf32>
  // CHECK: %[[MUL:.*]] = ttile.mul %[[SUM]], %[[SUM]] : !ttile.tile<4x16xf32>
  %m = ttile.mul %s, %s : !ttile.tile<4x16xf32>
  // CHECK: %[[MAX:.*]] = ttile.max %[[MUL]], %[[SUM]] : !ttile.tile<4x16xf32>
  %x = ttile.max %m, %s : !ttile.tile<4x16xf32>
  // CHECK: %[[RELU:.*]] = ttile.relu %[[MAX]] : !ttile.tile<4x16xf32>
  %r = ttile.relu %x : !ttile.tile<4x16xf32>
  // CHECK: %[[EXP:.*]] = ttile.exp %[[RELU]] : !ttile.tile<4x16xf32>
  %e = ttile.exp %r : !ttile.tile<4x16xf32>
  // CHECK: ttile.exp2 %[[EXP]] : !ttile.tile<4x16xf32>
  %e2 = ttile.exp2 %e : !ttile.tile<4x16xf32>
  // CHECK: ttile.reduce %[[EXP]] {dim = 1 : i64, kind = #tgraph.reduction<sum>} : !ttile.tile<4x16xf32> -> !ttile.tile<4x1xf32>
  %sum = ttile.reduce %e {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<4x16xf32> -> !ttile.tile<4x1xf32>
  // CHECK: ttile.reduce %[[EXP]] {dim = 0 : i64, kind = #tgraph.reduction<max>} : !ttile.tile<4x16xf32> -> !ttile.tile<1x16xf32>
  %mx = ttile.reduce %e {kind = #tgraph.reduction<max>, dim = 0 : i64} : !ttile.tile<4x16xf32> -> !ttile.tile<1x16xf32>
  // CHECK: ttile.barrier
  ttile.barrier
  // CHECK: ttile.store %[[EXP]], %[[C]][%[[ROW]], %[[COL]]] : !ttile.tile<4x16xf32>, memref<8x32xf32>
  ttile.store %e, %c[%row, %col] : !ttile.tile<4x16xf32>, memref<8x32xf32>
  // CHECK: ttile.return
  ttile.return
}

// Integer tiles, a 3-D grid and a 1-D tile.
// CHECK-LABEL: ttile.kernel @ints(
// CHECK-SAME: %[[X:[^:]*]]: memref<4xi32>, %[[Y:[^:]*]]: memref<4xi32>) attributes {block = array<i64: 1024>, grid = array<i64: 1, 1, 1>}
ttile.kernel @ints(%x: memref<4xi32>, %y: memref<4xi32>) attributes {grid = array<i64: 1, 1, 1>, block = array<i64: 1024>} {
  // CHECK: %[[PZ:.*]] = ttile.program_id 2
  %pz = ttile.program_id 2
  // CHECK: %[[T:.*]] = ttile.load %[[X]][%[[PZ]]] : memref<4xi32> -> !ttile.tile<4xi32>
  %t = ttile.load %x[%pz] : memref<4xi32> -> !ttile.tile<4xi32>
  // CHECK: %[[ONE:.*]] = ttile.fill 1.000000e+00 : !ttile.tile<4xi32>
  %one = ttile.fill 1.0 : !ttile.tile<4xi32>
  // CHECK: %[[S:.*]] = ttile.add %[[T]], %[[ONE]] : !ttile.tile<4xi32>
  %s = ttile.add %t, %one : !ttile.tile<4xi32>
  // CHECK: ttile.store %[[S]], %[[Y]][%[[PZ]]] : !ttile.tile<4xi32>, memref<4xi32>
  ttile.store %s, %y[%pz] : !ttile.tile<4xi32>, memref<4xi32>
  ttile.return
}

// The tile type with other element types, outside a kernel.
// CHECK-LABEL: func.func private @tile_types(
// CHECK-SAME: !ttile.tile<16x32xf16>, !ttile.tile<1xbf16>, !ttile.tile<2x3x4xi8>, !ttile.tile<8xf64>)
func.func private @tile_types(!ttile.tile<16x32xf16>, !ttile.tile<1xbf16>, !ttile.tile<2x3x4xi8>, !ttile.tile<8xf64>)

// Conversions, comparisons, broadcast and iota (the fused-kernel vocabulary).
// CHECK-LABEL: ttile.kernel @row_ops
// CHECK: ttile.iota %{{.*}} dim 1 : !ttile.tile<2x8xi32>
// CHECK: ttile.compare %{{.*}}, %{{.*}} {kind = #tgraph.compare<ge>} : !ttile.tile<2x8xi32> -> !ttile.tile<2x8xi1>
// CHECK: ttile.cast %{{.*}} : !ttile.tile<2x8xf32> to !ttile.tile<2x8xbf16>
// CHECK: ttile.broadcast %{{.*}} : !ttile.tile<2x1xf32> to !ttile.tile<2x8xf32>
// CHECK: ttile.transpose %{{.*}} : !ttile.tile<2x8xf32> to !ttile.tile<8x2xf32>
// CHECK: ttile.select %{{.*}}, %{{.*}}, %{{.*}} : !ttile.tile<2x8xi1>, !ttile.tile<2x8xf32>
// CHECK: ttile.sub
// CHECK: ttile.div
// CHECK: ttile.neg
// CHECK: ttile.log
// CHECK: ttile.tanh
// CHECK: ttile.sqrt
// CHECK: ttile.rsqrt
// CHECK: ttile.sin %{{.*}} : !ttile.tile<2x8xf32>
// CHECK: ttile.cos
// CHECK: ttile.erf
// CHECK: ttile.abs
// CHECK: ttile.sign
// CHECK: ttile.floor
// CHECK: ttile.ceil
// CHECK: ttile.pow %{{.*}}, %{{.*}} : !ttile.tile<2x8xf32>
ttile.kernel @row_ops(%x: memref<2x8xf32>, %s: memref<f32>, %y: memref<2x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %x[%c0, %c0] : memref<2x8xf32> -> !ttile.tile<2x8xf32>
  %one = ttile.load %s[] : memref<f32> -> !ttile.tile<1xf32>
  %cols = ttile.iota %c0 dim 1 : !ttile.tile<2x8xi32>
  %rows = ttile.iota %c0 dim 0 : !ttile.tile<2x8xi32>
  %m = ttile.compare %rows, %cols {kind = #tgraph.compare<ge>} : !ttile.tile<2x8xi32> -> !ttile.tile<2x8xi1>
  %h = ttile.cast %t : !ttile.tile<2x8xf32> to !ttile.tile<2x8xbf16>
  %r = ttile.reduce %t {kind = #tgraph.reduction<max>, dim = 1 : i64} : !ttile.tile<2x8xf32> -> !ttile.tile<2x1xf32>
  %b = ttile.broadcast %r : !ttile.tile<2x1xf32> to !ttile.tile<2x8xf32>
  %tt = ttile.transpose %b : !ttile.tile<2x8xf32> to !ttile.tile<8x2xf32>
  %sel = ttile.select %m, %t, %b : !ttile.tile<2x8xi1>, !ttile.tile<2x8xf32>
  %d = ttile.sub %sel, %b : !ttile.tile<2x8xf32>
  %q = ttile.div %d, %b : !ttile.tile<2x8xf32>
  %n = ttile.neg %q : !ttile.tile<2x8xf32>
  %l = ttile.log %n : !ttile.tile<2x8xf32>
  %th = ttile.tanh %l : !ttile.tile<2x8xf32>
  %sq = ttile.sqrt %th : !ttile.tile<2x8xf32>
  %rs = ttile.rsqrt %sq : !ttile.tile<2x8xf32>
  %e1 = ttile.sin %rs : !ttile.tile<2x8xf32>
  %e2 = ttile.cos %e1 : !ttile.tile<2x8xf32>
  %e3 = ttile.erf %e2 : !ttile.tile<2x8xf32>
  %e4 = ttile.abs %e3 : !ttile.tile<2x8xf32>
  %e5 = ttile.sign %e4 : !ttile.tile<2x8xf32>
  %e6 = ttile.floor %e5 : !ttile.tile<2x8xf32>
  %e7 = ttile.ceil %e6 : !ttile.tile<2x8xf32>
  %e8 = ttile.pow %e7, %t : !ttile.tile<2x8xf32>
  ttile.store %e8, %y[%c0, %c0] : !ttile.tile<2x8xf32>, memref<2x8xf32>
  ttile.return
}

// -----

// `row_segments`: only rows inside the segments of argument #0 are read
// from the outputs; 8 bands of 8 rows, one instance each.
// CHECK-LABEL: ttile.kernel @padded
// CHECK-SAME: row_segments = array<i64: 0, 64, 8>
ttile.kernel @padded(%n: memref<4x2xi32>, %x: memref<64x8xf32>, %y: memref<64x8xf32>) attributes {grid = array<i64: 8>, block = array<i64: 128>, row_segments = array<i64: 0, 64, 8>} {
  %pid = ttile.program_id 0
  %c8 = arith.constant 8 : index
  %c0 = arith.constant 0 : index
  %row = arith.muli %pid, %c8 : index
  %t = ttile.load %x[%row, %c0] : memref<64x8xf32> -> !ttile.tile<8x8xf32>
  ttile.store %t, %y[%row, %c0] : !ttile.tile<8x8xf32>, memref<64x8xf32>
  ttile.return
}

// -----

// GPU parameters: `stages` on the kernel, `warps` on the dot; a 2-D tile of
// one matrix of a batch (lower-rank tiles cover the trailing dimensions).
// CHECK-LABEL: ttile.kernel @batched_gemm(
// CHECK-SAME: stages = 3 : i64
// CHECK: ttile.load %{{.*}}[%{{.*}}, %{{.*}}, %{{.*}}] : memref<2x64x32xbf16> -> !ttile.tile<64x32xbf16>
// CHECK: ttile.dot %{{.*}}, %{{.*}}, %{{.*}} {warps = array<i64: 2, 2>} : !ttile.tile<64x32xbf16>, !ttile.tile<32x64xbf16> -> !ttile.tile<64x64xf32>
ttile.kernel @batched_gemm(%a: memref<2x64x32xbf16>, %b: memref<2x32x64xbf16>, %c: memref<2x64x64xf32>) attributes {grid = array<i64: 2>, block = array<i64: 128>, stages = 3 : i64} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %acc = ttile.fill 0.0 : !ttile.tile<64x64xf32>
  %ta = ttile.load %a[%pid, %c0, %c0] : memref<2x64x32xbf16> -> !ttile.tile<64x32xbf16>
  %tb = ttile.load %b[%pid, %c0, %c0] : memref<2x32x64xbf16> -> !ttile.tile<32x64xbf16>
  %d = ttile.dot %ta, %tb, %acc {warps = array<i64: 2, 2>} : !ttile.tile<64x32xbf16>, !ttile.tile<32x64xbf16> -> !ttile.tile<64x64xf32>
  ttile.store %d, %c[%pid, %c0, %c0] : !ttile.tile<64x64xf32>, memref<2x64x64xf32>
  ttile.return
}

// -----

// Hopper warpgroup MMA: `wgmma` on the dot, two warpgroups of 64 rows each.
// CHECK-LABEL: ttile.kernel @wgmma_gemm(
// Its operands come through the tensor memory accelerator (`tma` loads).
// CHECK: ttile.load %{{.*}}[%{{.*}}, %{{.*}}] {tma} : memref<128x64xbf16> -> !ttile.tile<128x64xbf16>
// CHECK: ttile.load %{{.*}}[%{{.*}}, %{{.*}}] {tma} : memref<64x256xbf16> -> !ttile.tile<64x256xbf16>
// CHECK: ttile.dot %{{.*}}, %{{.*}}, %{{.*}} {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
ttile.kernel @wgmma_gemm(%a: memref<128x64xbf16>, %b: memref<64x256xbf16>, %c: memref<128x256xf32>) attributes {grid = array<i64: 1>, block = array<i64: 256>, stages = 4 : i64} {
  %c0 = arith.constant 0 : index
  %acc = ttile.fill 0.0 : !ttile.tile<128x256xf32>
  %ta = ttile.load %a[%c0, %c0] {tma} : memref<128x64xbf16> -> !ttile.tile<128x64xbf16>
  %tb = ttile.load %b[%c0, %c0] {tma} : memref<64x256xbf16> -> !ttile.tile<64x256xbf16>
  %d = ttile.dot %ta, %tb, %acc {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
  ttile.store %d, %c[%c0, %c0] : !ttile.tile<128x256xf32>, memref<128x256xf32>
  ttile.return
}

// -----

// A producer warpgroup (the block's fourth) issues the copies; the dot's
// warps are the other two warpgroups.
// CHECK-LABEL: ttile.kernel @producer_gemm(
// CHECK-SAME: block = array<i64: 384>, grid = array<i64: 1>, producer_warpgroup, stages = 4 : i64
// CHECK: ttile.dot %{{.*}}, %{{.*}}, %{{.*}} {warps = array<i64: 8, 1>, wgmma}
ttile.kernel @producer_gemm(%a: memref<128x64xbf16>, %b: memref<64x256xbf16>, %c: memref<128x256xf32>) attributes {grid = array<i64: 1>, block = array<i64: 384>, stages = 4 : i64, producer_warpgroup} {
  %c0 = arith.constant 0 : index
  %acc = ttile.fill 0.0 : !ttile.tile<128x256xf32>
  %ta = ttile.load %a[%c0, %c0] {tma} : memref<128x64xbf16> -> !ttile.tile<128x64xbf16>
  %tb = ttile.load %b[%c0, %c0] {tma} : memref<64x256xbf16> -> !ttile.tile<64x256xbf16>
  %d = ttile.dot %ta, %tb, %acc {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
  ttile.store %d, %c[%c0, %c0] : !ttile.tile<128x256xf32>, memref<128x256xf32>
  ttile.return
}

// -----

// NVSHMEM: PE queries, a put into a symmetric buffer, fence, signal, wait, quiet.
// CHECK-LABEL: ttile.kernel @push(
// CHECK: %[[ME:.*]] = ttile.my_pe
// CHECK: %[[N:.*]] = ttile.n_pes
// CHECK: ttile.put %{{.*}}[%{{.*}}, %{{.*}}] to %{{.*}}[%{{.*}}, %{{.*}}] on %{{.*}} {shape = array<i64: 16, 32>} : memref<16x32xf32> -> memref<64x32xf32>
// CHECK: ttile.fence
// CHECK: ttile.signal %{{.*}}[%[[ME]]], %{{.*}} on %{{.*}} {kind = "set"} : memref<4xi64>
// CHECK: ttile.wait %{{.*}}[%{{.*}}], %{{.*}} {cmp = "ge"} : memref<4xi64>
// CHECK: ttile.quiet
ttile.kernel @push(%a: memref<16x32xf32>, %all: memref<64x32xf32> {ttile.symmetric}, %flags: memref<4xi64> {ttile.symmetric}) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %me = ttile.my_pe
  %n = ttile.n_pes
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %row = arith.muli %me, %c16 : index
  %next = arith.addi %me, %c1 : index
  %peer = arith.remui %next, %n : index
  ttile.put %a[%c0, %c0] to %all[%row, %c0] on %peer {shape = array<i64: 16, 32>} : memref<16x32xf32> -> memref<64x32xf32>
  ttile.fence
  ttile.signal %flags[%me], %c1 on %peer {kind = "set"} : memref<4xi64>
  ttile.wait %flags[%c0], %c1 {cmp = "ge"} : memref<4xi64>
  ttile.quiet
  ttile.return
}

// -----

// A ragged put and get: a count read from a buffer (`ttile.load_scalar`)
// limits the rows that move.
// CHECK-LABEL: ttile.kernel @ragged(
// CHECK: %[[N:.*]] = ttile.load_scalar %{{.*}}[%{{.*}}] : memref<4xi32>
// CHECK: ttile.put %{{.*}}[%{{.*}}, %{{.*}}] to %{{.*}}[%{{.*}}, %{{.*}}] on %{{.*}} rows %[[N]] {shape = array<i64: 16, 32>}
// CHECK: ttile.get %{{.*}}[%{{.*}}, %{{.*}}] on %{{.*}} to %{{.*}}[%{{.*}}, %{{.*}}] rows %[[N]] {shape = array<i64: 16, 32>}
ttile.kernel @ragged(%a: memref<16x32xf32>, %n: memref<4xi32>, %all: memref<64x32xf32> {ttile.symmetric}) attributes {grid = array<i64: 4>, block = array<i64: 128>} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %rows = ttile.load_scalar %n[%pid] : memref<4xi32>
  ttile.put %a[%c0, %c0] to %all[%c0, %c0] on %pid rows %rows {shape = array<i64: 16, 32>} : memref<16x32xf32> -> memref<64x32xf32>
  ttile.get %all[%c0, %c0] on %pid to %a[%c0, %c0] rows %rows {shape = array<i64: 16, 32>} : memref<64x32xf32> -> memref<16x32xf32>
  ttile.return
}

// -----

// NVSHMEM: a get from a symmetric buffer on another PE into a local one.
// CHECK-LABEL: ttile.kernel @pull(
// CHECK: ttile.get %{{.*}}[%{{.*}}, %{{.*}}] on %{{.*}} to %{{.*}}[%{{.*}}, %{{.*}}] {shape = array<i64: 16, 32>} : memref<64x32xf32> -> memref<16x32xf32>
ttile.kernel @pull(%all: memref<64x32xf32> {ttile.symmetric}, %a: memref<16x32xf32>) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %me = ttile.my_pe
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %row = arith.muli %me, %c16 : index
  ttile.get %all[%row, %c0] on %me to %a[%c0, %c0] {shape = array<i64: 16, 32>} : memref<64x32xf32> -> memref<16x32xf32>
  ttile.return
}

// -----

// The GPU schedule (tessera-gpu-software-pipeline, -place, -alloc-shared) as
// attributes: each prints as it parses.
// CHECK-LABEL: ttile.kernel @scheduled(
// CHECK-SAME: ttile.smem_bytes = 29184 : i64
// CHECK: ttile.fill 0.000000e+00 {ttile.place = #ttile.place<literal>}
// CHECK: ttile.load %{{.*}} {ttile.place = #ttile.place<staged>}
// CHECK: ttile.dot %{{.*}} {ttile.place = #ttile.place<fragment>, warps = array<i64: 8, 1>}
// CHECK: } {ttile.barriers = array<i64: 24576, 24600>, ttile.pipeline = #ttile.pipeline<kind = gemm, mma = wgmma, copies = tma, stages = 3, lag = 1, producer = true>, ttile.place = #ttile.place<fragment>, ttile.ring = 0 : i64}
// CHECK: ttile.exp %{{.*}} {ttile.domain = array<i64: 64, 64>, ttile.place = #ttile.place<shared>, ttile.region = 1 : i64, ttile.smem = 24624 : i64, ttile.spill}
// CHECK: ttile.reduce %{{.*}} {dim = 1 : i64, kind = #tgraph.reduction<sum>, ttile.fallback = "why", ttile.place = [#ttile.place<column>], ttile.release, ttile.shared_in = [#ttile.mma<mma_sync>, #ttile.mma<wgmma>], ttile.smem = array<i64: -1>}
// CHECK: } {ttile.issue_ahead, ttile.pipeline = #ttile.pipeline<kind = registers, mma = wgmma, copies = tma, stages = 3, issue_ahead = true>}
ttile.kernel @scheduled(%a: memref<64x64xbf16>, %r: memref<64x1xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 384>, producer_warpgroup, stages = 3 : i64, ttile.smem_bytes = 29184 : i64} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %acc0 = ttile.fill 0.0 {ttile.place = #ttile.place<literal>} : !ttile.tile<64x64xf32>
  %acc = scf.for %k = %c0 to %c64 step %c64 iter_args(%it = %acc0) -> (!ttile.tile<64x64xf32>) {
    %ta = ttile.load %a[%c0, %k] {ttile.place = #ttile.place<staged>} : memref<64x64xbf16> -> !ttile.tile<64x64xbf16>
    %d = ttile.dot %ta, %ta, %it {ttile.place = #ttile.place<fragment>, warps = array<i64: 8, 1>} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
    scf.yield %d : !ttile.tile<64x64xf32>
  } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = wgmma, copies = tma, stages = 3, lag = 1, producer = true>, ttile.place = #ttile.place<fragment>, ttile.ring = 0 : i64, ttile.barriers = array<i64: 24576, 24600>}
  %e = ttile.exp %acc {ttile.domain = array<i64: 64, 64>, ttile.region = 1 : i64, ttile.place = #ttile.place<shared>, ttile.spill, ttile.smem = 24624 : i64} : !ttile.tile<64x64xf32>
  %s = ttile.reduce %e {dim = 1 : i64, kind = #tgraph.reduction<sum>, ttile.fallback = "why", ttile.place = [#ttile.place<column>], ttile.release, ttile.shared_in = [#ttile.mma<mma_sync>, #ttile.mma<wgmma>], ttile.smem = array<i64: -1>} : !ttile.tile<64x64xf32> -> !ttile.tile<64x1xf32>
  scf.for %j = %c0 to %c64 step %c64 {
  } {ttile.pipeline = #ttile.pipeline<kind = registers, mma = wgmma, copies = tma, stages = 3, issue_ahead = true>, ttile.issue_ahead}
  ttile.store %s, %r[%c0, %c0] : !ttile.tile<64x1xf32>, memref<64x1xf32>
  ttile.return
}

// A tile of one head's rows of a [batch, seq, head, d] buffer (`dims`).
// CHECK-LABEL: ttile.kernel @head_rows
// CHECK: %[[T:.*]] = ttile.load %{{.*}}[%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}] {dims = array<i64: 1, 3>} : memref<2x64x4x32xf32> -> !ttile.tile<16x32xf32>
// CHECK: ttile.store %[[T]], %{{.*}}[%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}] {dims = array<i64: 1, 3>} : !ttile.tile<16x32xf32>, memref<2x64x4x32xf32>
ttile.kernel @head_rows(%a: memref<2x64x4x32xf32>, %b: memref<2x64x4x32xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %t = ttile.load %a[%c0, %c16, %c0, %c0] {dims = array<i64: 1, 3>} : memref<2x64x4x32xf32> -> !ttile.tile<16x32xf32>
  ttile.store %t, %b[%c0, %c16, %c0, %c0] {dims = array<i64: 1, 3>} : !ttile.tile<16x32xf32>, memref<2x64x4x32xf32>
  ttile.return
}

// Dropout's factors of a block, at a flat index with strides per dimension.
// CHECK-LABEL: ttile.kernel @dropout_factor
// CHECK: ttile.dropout_factor %{{.*}}, %{{.*}} at %{{.*}} {p = 1.000000e-01 : f64, strides = array<i64: 64, 1>} : !ttile.tile<16x16xf32>
ttile.kernel @dropout_factor(%x: memref<16x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %c7 = arith.constant 7 : index
  %z = ttile.dropout_factor %c7, %c0 at %c0 {p = 0.1 : f64, strides = array<i64: 64, 1>} : !ttile.tile<16x16xf32>
  ttile.store %z, %x[%c0, %c0] : !ttile.tile<16x16xf32>, memref<16x16xf32>
  ttile.return
}
