// RUN: tessera-opt %s --split-input-file --tessera-lower-to-tile --verify-diagnostics | FileCheck %s

// Inputs are Schedule IR as tessera-lower-to-schedule leaves it: launches of
// kernels that are functions on tensors.

// A GPU target (no `tessera.target = "cpu"`): the relu after the matmul is
// its epilogue: one launch, one kernel, no intermediate buffer. f32 operands
// run on CUDA cores: tiles are the largest divisors up to 32, no `warps`.
// CHECK-LABEL: func.func @fuse
// CHECK: %[[OUT:.*]] = tsched.alloc : memref<64x32xf32>
// CHECK-NEXT: tsched.launch @mm_fused2 on %{{.*}} ins(%arg0, %arg1 : memref<64x16xf32>, memref<16x32xf32>) outs(%[[OUT]] : memref<64x32xf32>)
// CHECK-NOT: tsched.launch
// CHECK: return %[[OUT]]
// CHECK: ttile.kernel @mm_fused2(%[[A:.*]]: memref<64x16xf32>, %[[B:.*]]: memref<16x32xf32>, %[[C:.*]]: memref<64x32xf32>)
// CHECK-SAME: block = array<i64: 128>, grid = array<i64: 2>, ttile.tile_sizes = array<i64: 32, 32, 16>
// CHECK: %[[ACC:.*]] = ttile.fill 0.000000e+00 : !ttile.tile<32x32xf32>
// CHECK: %[[SUM:.*]] = scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[IT:.*]] = %[[ACC]]) -> (!ttile.tile<32x32xf32>)
// CHECK: ttile.load %[[A]][%{{.*}}, %[[K]]] : memref<64x16xf32> -> !ttile.tile<32x16xf32>
// CHECK: ttile.load %[[B]][%[[K]], %{{.*}}] : memref<16x32xf32> -> !ttile.tile<16x32xf32>
// CHECK: ttile.dot %{{.*}}, %{{.*}}, %[[IT]] : !ttile.tile<32x16xf32>, !ttile.tile<16x32xf32> -> !ttile.tile<32x32xf32>
// CHECK: %[[R:.*]] = ttile.relu %[[SUM]] : !ttile.tile<32x32xf32>
// CHECK: ttile.store %[[R]], %[[C]]
// CHECK-NOT: ttile.kernel @relu
func.func @fuse(%a: memref<64x16xf32>, %b: memref<16x32xf32>) -> memref<64x32xf32> {
  %s = tsched.stream "compute"
  %h = tsched.alloc : memref<64x16xf32>
  %0 = tsched.alloc : memref<64x32xf32>
  tsched.launch @mm on %s ins(%a, %b : memref<64x16xf32>, memref<16x32xf32>) outs(%0 : memref<64x32xf32>)
  %1 = tsched.alloc : memref<64x32xf32>
  tsched.launch @relu on %s ins(%0 : memref<64x32xf32>) outs(%1 : memref<64x32xf32>)
  tsched.free %0 : memref<64x32xf32>
  tsched.free %h : memref<64x16xf32>
  return %1 : memref<64x32xf32>
}
func.func private @mm(%a: tensor<64x16xf32>, %b: tensor<16x32xf32>) -> tensor<64x32xf32> attributes {tsched.kernel} {
  %0 = tgraph.matmul %a, %b : tensor<64x16xf32>, tensor<16x32xf32> -> tensor<64x32xf32>
  return %0 : tensor<64x32xf32>
}
func.func private @relu(%x: tensor<64x32xf32>) -> tensor<64x32xf32> attributes {tsched.kernel} {
  %0 = tgraph.relu %x : tensor<64x32xf32>
  return %0 : tensor<64x32xf32>
}

// -----

// A residual add fuses too; the residual becomes an extra kernel input loaded
// at the output tile's offsets.
// CHECK-LABEL: func.func @residual
// CHECK: tsched.launch @mm_fused2 on %{{.*}} ins(%arg0, %arg1, %arg2 : memref<8x8xf32>, memref<8x8xf32>, memref<8x8xf32>)
// CHECK: ttile.kernel @mm_fused2(%{{.*}}: memref<8x8xf32>, %{{.*}}: memref<8x8xf32>, %[[RES:.*]]: memref<8x8xf32>, %{{.*}}: memref<8x8xf32>)
// CHECK: scf.for
// CHECK: %[[T:.*]] = ttile.load %[[RES]]
// CHECK: ttile.add %{{.*}}, %[[T]] : !ttile.tile<8x8xf32>
func.func @residual(%a: memref<8x8xf32>, %b: memref<8x8xf32>, %r: memref<8x8xf32>) -> memref<8x8xf32> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<8x8xf32>
  tsched.launch @mm on %s ins(%a, %b : memref<8x8xf32>, memref<8x8xf32>) outs(%0 : memref<8x8xf32>)
  %1 = tsched.alloc : memref<8x8xf32>
  tsched.launch @add on %s ins(%0, %r : memref<8x8xf32>, memref<8x8xf32>) outs(%1 : memref<8x8xf32>)
  tsched.free %0 : memref<8x8xf32>
  return %1 : memref<8x8xf32>
}
func.func private @mm(%a: tensor<8x8xf32>, %b: tensor<8x8xf32>) -> tensor<8x8xf32> attributes {tsched.kernel} {
  %0 = tgraph.matmul %a, %b : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
func.func private @add(%x: tensor<8x8xf32>, %y: tensor<8x8xf32>) -> tensor<8x8xf32> attributes {tsched.kernel} {
  %0 = tgraph.add %x, %y : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

// The matmul's output is also returned: the fused kernel stores it as well as
// the relu's.
// CHECK-LABEL: func.func @escapes
// CHECK: tsched.launch @mm_fused2 on %{{.*}} ins(%arg0, %arg1 : {{.*}}) outs(%{{.*}}, %{{.*}} : memref<8x8192xf32>, memref<8x8192xf32>)
// CHECK: ttile.kernel @mm_fused2(%{{.*}}: memref<8x4xf32>, %{{.*}}: memref<4x8192xf32>, %[[MM:.*]]: memref<8x8192xf32>, %[[Y:.*]]: memref<8x8192xf32>)
// CHECK: %[[SUM:.*]] = scf.for
// CHECK: %[[R:.*]] = ttile.relu %[[SUM]]
// CHECK-DAG: ttile.store %[[SUM]], %[[MM]]
// CHECK-DAG: ttile.store %[[R]], %[[Y]]
func.func @escapes(%a: memref<8x4xf32>, %b: memref<4x8192xf32>) -> (memref<8x8192xf32>, memref<8x8192xf32>) {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<8x8192xf32>
  tsched.launch @mm on %s ins(%a, %b : memref<8x4xf32>, memref<4x8192xf32>) outs(%0 : memref<8x8192xf32>)
  %1 = tsched.alloc : memref<8x8192xf32>
  tsched.launch @relu on %s ins(%0 : memref<8x8192xf32>) outs(%1 : memref<8x8192xf32>)
  return %0, %1 : memref<8x8192xf32>, memref<8x8192xf32>
}
func.func private @mm(%a: tensor<8x4xf32>, %b: tensor<4x8192xf32>) -> tensor<8x8192xf32> attributes {tsched.kernel} {
  %0 = tgraph.matmul %a, %b : tensor<8x4xf32>, tensor<4x8192xf32> -> tensor<8x8192xf32>
  return %0 : tensor<8x8192xf32>
}
func.func private @relu(%x: tensor<8x8192xf32>) -> tensor<8x8192xf32> attributes {tsched.kernel} {
  %0 = tgraph.relu %x : tensor<8x8192xf32>
  return %0 : tensor<8x8192xf32>
}

// -----

// A batched bf16 GEMM with a bias: the bias' reshape (a library call that
// reads nothing the GEMM produces) moves ahead of the GEMM instead of
// breaking the fusion; the configuration is a tensor-core one (warps on the
// dot, block = warps x 32 threads, pipeline stages on the kernel); the grid
// covers batch x M/BM x N/BN; tiles are 2-D views of one matrix of the
// batch; bf16 operands accumulate in f32, cast back after the loop.
// CHECK-LABEL: func.func @batched_bias
// CHECK: tsched.launch @flat on
// CHECK: tsched.launch @bmm_fused3 on %{{.*}} ins(%arg0, %arg1, %{{.*}} : memref<4x384x128xbf16>, memref<4x128x384xbf16>, memref<1x1x384xbf16>)
// CHECK: ttile.kernel @bmm_fused3(%[[A:.*]]: memref<4x384x128xbf16>, %[[B:.*]]: memref<4x128x384xbf16>, %[[BIAS:.*]]: memref<1x1x384xbf16>, %[[C:.*]]: memref<4x384x384xbf16>)
// CHECK-SAME: block = array<i64: 128>, grid = array<i64: 144>, stages = 3 : i64, ttile.tile_sizes = array<i64: 64, 64, 32>
// CHECK: %[[ACC:.*]] = ttile.fill 0.000000e+00 : !ttile.tile<64x64xf32>
// CHECK: %[[SUM:.*]] = scf.for %[[K:.*]] = %{{.*}} iter_args(%[[IT:.*]] = %[[ACC]]) -> (!ttile.tile<64x64xf32>)
// CHECK: ttile.load %[[A]][%[[BATCH:.*]], %{{.*}}, %[[K]]] : memref<4x384x128xbf16> -> !ttile.tile<64x32xbf16>
// CHECK: ttile.load %[[B]][%[[BATCH]], %[[K]], %{{.*}}] : memref<4x128x384xbf16> -> !ttile.tile<32x64xbf16>
// CHECK: ttile.dot %{{.*}}, %{{.*}}, %[[IT]] {warps = array<i64: 2, 2>} : !ttile.tile<64x32xbf16>, !ttile.tile<32x64xbf16> -> !ttile.tile<64x64xf32>
// CHECK: %[[OUT:.*]] = ttile.cast %[[SUM]] : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
// CHECK: %[[BT:.*]] = ttile.load %[[BIAS]]{{.*}} -> !ttile.tile<1x64xbf16>
// CHECK: %[[BB:.*]] = ttile.broadcast %[[BT]] : !ttile.tile<1x64xbf16> to !ttile.tile<64x64xbf16>
// CHECK: %[[Y:.*]] = ttile.add %[[OUT]], %[[BB]]
// CHECK: ttile.store %[[Y]], %[[C]][%[[BATCH]], %{{.*}}, %{{.*}}] : !ttile.tile<64x64xbf16>, memref<4x384x384xbf16>
func.func @batched_bias(%a: memref<4x384x128xbf16>, %b: memref<4x128x384xbf16>, %bias: memref<384xbf16>) -> memref<4x384x384xbf16> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<4x384x384xbf16>
  tsched.launch @bmm on %s ins(%a, %b : memref<4x384x128xbf16>, memref<4x128x384xbf16>) outs(%0 : memref<4x384x384xbf16>)
  %1 = tsched.alloc : memref<1x1x384xbf16>
  tsched.launch @flat on %s ins(%bias : memref<384xbf16>) outs(%1 : memref<1x1x384xbf16>)
  %2 = tsched.alloc : memref<4x384x384xbf16>
  tsched.launch @bc on %s ins(%1 : memref<1x1x384xbf16>) outs(%2 : memref<4x384x384xbf16>)
  %3 = tsched.alloc : memref<4x384x384xbf16>
  tsched.launch @add on %s ins(%0, %2 : memref<4x384x384xbf16>, memref<4x384x384xbf16>) outs(%3 : memref<4x384x384xbf16>)
  return %3 : memref<4x384x384xbf16>
}
func.func private @bmm(%a: tensor<4x384x128xbf16>, %b: tensor<4x128x384xbf16>) -> tensor<4x384x384xbf16> attributes {tsched.kernel} {
  %0 = tgraph.matmul %a, %b : tensor<4x384x128xbf16>, tensor<4x128x384xbf16> -> tensor<4x384x384xbf16>
  return %0 : tensor<4x384x384xbf16>
}
func.func private @flat(%a: tensor<384xbf16>) -> tensor<1x1x384xbf16> attributes {tsched.kernel} {
  %0 = tgraph.reshape %a : tensor<384xbf16> to tensor<1x1x384xbf16>
  return %0 : tensor<1x1x384xbf16>
}
func.func private @bc(%a: tensor<1x1x384xbf16>) -> tensor<4x384x384xbf16> attributes {tsched.kernel} {
  %0 = tgraph.broadcast %a : tensor<1x1x384xbf16> to tensor<4x384x384xbf16>
  return %0 : tensor<4x384x384xbf16>
}
func.func private @add(%x: tensor<4x384x384xbf16>, %y: tensor<4x384x384xbf16>) -> tensor<4x384x384xbf16> attributes {tsched.kernel} {
  %0 = tgraph.add %x, %y : tensor<4x384x384xbf16>
  return %0 : tensor<4x384x384xbf16>
}

// -----

// A GEMM large enough to give every SM a 128x256 tile gets the Hopper
// configuration: two warpgroups (warps 8x1, 256 threads) on wgmma, 64-wide
// K steps through a 4-stage ring that the tensor memory accelerator fills
// (`tma` loads), the copies issued by a third, producer warpgroup. Its 32 x 16
// output tiles run in groups of 16 tile rows, each group column by column
// (tile t of group t / 256: row 16 (t / 256) + t % 256 % 16, column t % 256 / 16).
// CHECK-LABEL: func.func @big_gemm
// CHECK: ttile.kernel @mm(
// CHECK-SAME: block = array<i64: 384>, grid = array<i64: 512>, producer_warpgroup, stages = 4 : i64, ttile.tile_sizes = array<i64: 128, 256, 64>
// CHECK: %[[PID:.*]] = ttile.program_id 0
// CHECK: %[[PER:.*]] = arith.constant 256 : index
// CHECK: %[[G:.*]] = arith.divui %[[PID]], %[[PER]]
// CHECK: %[[FIRST:.*]] = arith.muli %[[G]], %[[C16:.*]] : index
// CHECK: %[[IN:.*]] = arith.remui %[[PID]], %[[PER]]
// CHECK: %[[R:.*]] = arith.remui %[[IN]], %[[C16B:.*]] : index
// CHECK: %[[ROW:.*]] = arith.addi %[[FIRST]], %[[R]]
// CHECK: %[[COL:.*]] = arith.divui %[[IN]], %{{.*}} : index
// CHECK: arith.muli %[[ROW]], %{{.*}} : index
// CHECK: arith.muli %[[COL]], %{{.*}} : index
// CHECK: ttile.load %{{.*}} {tma} : memref<4096x4096xbf16> -> !ttile.tile<128x64xbf16>
// CHECK: ttile.load %{{.*}} {tma} : memref<4096x4096xbf16> -> !ttile.tile<64x256xbf16>
// CHECK: ttile.dot %{{.*}}, %{{.*}}, %{{.*}} {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
func.func @big_gemm(%a: memref<4096x4096xbf16>, %b: memref<4096x4096xbf16>) -> memref<4096x4096xbf16> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<4096x4096xbf16>
  tsched.launch @mm on %s ins(%a, %b : memref<4096x4096xbf16>, memref<4096x4096xbf16>) outs(%0 : memref<4096x4096xbf16>)
  return %0 : memref<4096x4096xbf16>
}
func.func private @mm(%a: tensor<4096x4096xbf16>, %b: tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16> attributes {tsched.kernel} {
  %0 = tgraph.matmul %a, %b : tensor<4096x4096xbf16>, tensor<4096x4096xbf16> -> tensor<4096x4096xbf16>
  return %0 : tensor<4096x4096xbf16>
}

// -----

// A reduction after a GEMM is not part of its epilogue: it gets its own kernel.
// CHECK-LABEL: func.func @gemm_then_softmax_row
// CHECK: tsched.launch @mm on
// CHECK: tsched.launch @rmax on
func.func @gemm_then_softmax_row(%a: memref<16x16xf32>, %b: memref<16x16xf32>) -> memref<16x1xf32> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<16x16xf32>
  tsched.launch @mm on %s ins(%a, %b : memref<16x16xf32>, memref<16x16xf32>) outs(%0 : memref<16x16xf32>)
  %1 = tsched.alloc : memref<16x1xf32>
  tsched.launch @rmax on %s ins(%0 : memref<16x16xf32>) outs(%1 : memref<16x1xf32>)
  return %1 : memref<16x1xf32>
}
func.func private @mm(%a: tensor<16x16xf32>, %b: tensor<16x16xf32>) -> tensor<16x16xf32> attributes {tsched.kernel} {
  %0 = tgraph.matmul %a, %b : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  return %0 : tensor<16x16xf32>
}
func.func private @rmax(%a: tensor<16x16xf32>) -> tensor<16x1xf32> attributes {tsched.kernel} {
  %0 = tgraph.reduce <max> %a dims [1] : tensor<16x16xf32> -> tensor<16x1xf32>
  return %0 : tensor<16x1xf32>
}

// -----

// A value check is a library call that writes no buffer; reading nothing the
// run around it makes, it moves ahead of the run, which stays one kernel.
// CHECK-LABEL: func.func @check
// CHECK: tsched.launch @chk on %{{.*}} ins(%arg1 : memref<8xi32>){{$}}
// CHECK-NOT: tsched.launch @chk
// CHECK: tsched.launch @neg_fused2 on %{{.*}} ins(%arg0 : memref<8xf32>) outs(%{{.*}} : memref<8xf32>)
// CHECK-NOT: tsched.launch
// CHECK: func.func private @chk(memref<8xi32>) attributes {tsched.library = "check_range", tsched.library_attrs = {allowed = array<i64: -100>, high = 7 : i64, low = 0 : i64, message = "{row} {value}"}}
module attributes {tessera.target = "cpu"} {
func.func @check(%x: memref<8xf32>, %t: memref<8xi32>) -> memref<8xf32> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<8xf32>
  tsched.launch @neg on %s ins(%x : memref<8xf32>) outs(%0 : memref<8xf32>)
  tsched.launch @chk on %s ins(%t : memref<8xi32>)
  %1 = tsched.alloc : memref<8xf32>
  tsched.launch @exp on %s ins(%0 : memref<8xf32>) outs(%1 : memref<8xf32>)
  tsched.free %0 : memref<8xf32>
  return %1 : memref<8xf32>
}
func.func private @neg(%x: tensor<8xf32>) -> tensor<8xf32> attributes {tsched.kernel} {
  %0 = tgraph.neg %x : tensor<8xf32>
  return %0 : tensor<8xf32>
}
func.func private @chk(%t: tensor<8xi32>) attributes {tsched.kernel} {
  %0 = tgraph.check_range %t in [0, 7) or [-100] message "{row} {value}" : tensor<8xi32>
  return
}
func.func private @exp(%x: tensor<8xf32>) -> tensor<8xf32> attributes {tsched.kernel} {
  %0 = tgraph.exp %x : tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

// An op this pass has no lowering for is reported at the op.
tgraph.mesh @mesh axes = ["x"] shape = [2]
func.func @unlowerable(%a: memref<8xf32>) -> memref<8xf32> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<8xf32>
  tsched.launch @ar on %s ins(%a : memref<8xf32>) outs(%0 : memref<8xf32>)
  return %0 : memref<8xf32>
}
func.func private @ar(%a: tensor<8xf32>) -> tensor<8xf32> attributes {tsched.kernel} {
  // expected-error @+1 {{tessera-lower-to-tile cannot lower 'tgraph.all_reduce' in kernel @ar}}
  %0 = tgraph.all_reduce <sum> %a on @mesh["x"] : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// A launched kernel with no op (canonicalize erases a check whose result
// nothing reads) is reported at the kernel, not a crash.
func.func @empty_kernel(%t: memref<8xi32>) {
  %s = tsched.stream "compute"
  tsched.launch @nothing on %s ins(%t : memref<8xi32>)
  return
}
// expected-error @below {{tessera-lower-to-tile: kernel @nothing computes nothing (a tsched.kernel function holds the op it launches)}}
func.func private @nothing(%t: tensor<8xi32>) attributes {tsched.kernel} {
  return
}

// -----

// A column min: Tile IR has max only, so the loop combines with
// -max(-acc, -r) from an identity of +inf.
// CHECK-LABEL: ttile.kernel @cmin
// CHECK: %[[Z:.*]] = ttile.fill 0x7FF0000000000000 : !ttile.tile<1x8xf32>
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[ACC:.*]] = %[[Z]])
// CHECK: %[[R:.*]] = ttile.reduce %{{.*}} {dim = 0 : i64, kind = #tgraph.reduction<min>}
// CHECK-NEXT: %[[NA:.*]] = ttile.neg %[[ACC]]
// CHECK-NEXT: %[[NR:.*]] = ttile.neg %[[R]]
// CHECK-NEXT: %[[M:.*]] = ttile.max %[[NA]], %[[NR]]
// CHECK-NEXT: %[[N:.*]] = ttile.neg %[[M]]
// CHECK-NEXT: scf.yield %[[N]]
module attributes {tessera.target = "cpu"} {
func.func @column_min(%g: memref<64x8xf32>) -> memref<1x8xf32> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<1x8xf32>
  tsched.launch @cmin on %s ins(%g : memref<64x8xf32>) outs(%0 : memref<1x8xf32>)
  return %0 : memref<1x8xf32>
}
func.func private @cmin(%a: tensor<64x8xf32>) -> tensor<1x8xf32> attributes {tsched.kernel} {
  %0 = tgraph.reduce <min> %a dims [0] : tensor<64x8xf32> -> tensor<1x8xf32>
  return %0 : tensor<1x8xf32>
}
}

// -----

// A reduction over two dimensions, neither of them the last, is one kernel
// per reduced dimension: the pass says which to split, at the op.
func.func @two_dims(%a: memref<4x8x16xf32>) -> memref<1x1x16xf32> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<1x1x16xf32>
  tsched.launch @colsum on %s ins(%a : memref<4x8x16xf32>) outs(%0 : memref<1x1x16xf32>)
  return %0 : memref<1x1x16xf32>
}
func.func private @colsum(%a: tensor<4x8x16xf32>) -> tensor<1x1x16xf32> attributes {tsched.kernel} {
  // expected-error @+1 {{tessera-lower-to-tile reduces one dimension per kernel; split the reduction over [0, 1]}}
  %0 = tgraph.reduce <sum> %a dims [0, 1] : tensor<4x8x16xf32> -> tensor<1x1x16xf32>
  return %0 : tensor<1x1x16xf32>
}

// -----

// CPU target. Softmax rows: max, subtract, exp, sum, divide fuse into one
// kernel whose tile holds whole rows (the two launches of @bc included); the
// intermediate buffers disappear; the matmul and the reshape become library
// calls the runtime implements.
// CHECK-LABEL: func.func @softmax
// CHECK: tsched.launch @mm on
// CHECK-NEXT: %[[P:.*]] = tsched.alloc : memref<8x32xf32>
// CHECK-NEXT: tsched.launch @rmax_fused7 on %{{.*}} ins(%{{.*}} : memref<8x32xf32>) outs(%[[P]] : memref<8x32xf32>)
// CHECK-NEXT: %[[F:.*]] = tsched.alloc : memref<256xf32>
// CHECK-NEXT: tsched.launch @flat on
// CHECK: ttile.kernel @rmax_fused7(%[[X:.*]]: memref<8x32xf32>, %[[Y:.*]]: memref<8x32xf32>)
// CHECK-SAME: ttile.tile_sizes = array<i64: 8, 32>
// CHECK: %[[T:.*]] = ttile.load %[[X]]
// CHECK-NEXT: %[[M:.*]] = ttile.reduce %[[T]] {dim = 1 : i64, kind = #tgraph.reduction<max>} : !ttile.tile<8x32xf32> -> !ttile.tile<8x1xf32>
// CHECK-NEXT: %[[MB:.*]] = ttile.broadcast %[[M]] : !ttile.tile<8x1xf32> to !ttile.tile<8x32xf32>
// CHECK-NEXT: %[[D:.*]] = ttile.sub %[[T]], %[[MB]]
// CHECK-NEXT: %[[E:.*]] = ttile.exp %[[D]]
// CHECK-NEXT: %[[S:.*]] = ttile.reduce %[[E]] {dim = 1 : i64, kind = #tgraph.reduction<sum>}
// CHECK-NEXT: %[[SB:.*]] = ttile.broadcast %[[S]]
// CHECK-NEXT: %[[R:.*]] = ttile.div %[[E]], %[[SB]]
// CHECK-NEXT: ttile.store %[[R]], %[[Y]]
// CHECK: func.func private @mm(memref<8x16xf32>, memref<16x32xf32>, memref<8x32xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
// CHECK: func.func private @flat(memref<8x32xf32>, memref<256xf32>) attributes {tsched.library = "reshape", tsched.library_attrs = {}}
module attributes {tessera.target = "cpu"} {
func.func @softmax(%x: memref<8x16xf32>, %w: memref<16x32xf32>) -> memref<256xf32> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<8x32xf32>
  tsched.launch @mm on %s ins(%x, %w : memref<8x16xf32>, memref<16x32xf32>) outs(%0 : memref<8x32xf32>)
  %1 = tsched.alloc : memref<8x1xf32>
  tsched.launch @rmax on %s ins(%0 : memref<8x32xf32>) outs(%1 : memref<8x1xf32>)
  %2 = tsched.alloc : memref<8x32xf32>
  tsched.launch @bc on %s ins(%1 : memref<8x1xf32>) outs(%2 : memref<8x32xf32>)
  tsched.free %1 : memref<8x1xf32>
  %3 = tsched.alloc : memref<8x32xf32>
  tsched.launch @sub on %s ins(%0, %2 : memref<8x32xf32>, memref<8x32xf32>) outs(%3 : memref<8x32xf32>)
  tsched.free %2 : memref<8x32xf32>
  %4 = tsched.alloc : memref<8x32xf32>
  tsched.launch @exp on %s ins(%3 : memref<8x32xf32>) outs(%4 : memref<8x32xf32>)
  tsched.free %3 : memref<8x32xf32>
  %5 = tsched.alloc : memref<8x1xf32>
  tsched.launch @rsum on %s ins(%4 : memref<8x32xf32>) outs(%5 : memref<8x1xf32>)
  %6 = tsched.alloc : memref<8x32xf32>
  tsched.launch @bc on %s ins(%5 : memref<8x1xf32>) outs(%6 : memref<8x32xf32>)
  tsched.free %5 : memref<8x1xf32>
  %7 = tsched.alloc : memref<8x32xf32>
  tsched.launch @div on %s ins(%4, %6 : memref<8x32xf32>, memref<8x32xf32>) outs(%7 : memref<8x32xf32>)
  tsched.free %4 : memref<8x32xf32>
  tsched.free %6 : memref<8x32xf32>
  %8 = tsched.alloc : memref<256xf32>
  tsched.launch @flat on %s ins(%7 : memref<8x32xf32>) outs(%8 : memref<256xf32>)
  tsched.free %7 : memref<8x32xf32>
  tsched.free %0 : memref<8x32xf32>
  return %8 : memref<256xf32>
}
func.func private @mm(%a: tensor<8x16xf32>, %b: tensor<16x32xf32>) -> tensor<8x32xf32> attributes {tsched.kernel} {
  %0 = tgraph.matmul %a, %b : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}
func.func private @rmax(%a: tensor<8x32xf32>) -> tensor<8x1xf32> attributes {tsched.kernel} {
  %0 = tgraph.reduce <max> %a dims [1] : tensor<8x32xf32> -> tensor<8x1xf32>
  return %0 : tensor<8x1xf32>
}
func.func private @rsum(%a: tensor<8x32xf32>) -> tensor<8x1xf32> attributes {tsched.kernel} {
  %0 = tgraph.reduce <sum> %a dims [1] : tensor<8x32xf32> -> tensor<8x1xf32>
  return %0 : tensor<8x1xf32>
}
func.func private @bc(%a: tensor<8x1xf32>) -> tensor<8x32xf32> attributes {tsched.kernel} {
  %0 = tgraph.broadcast %a : tensor<8x1xf32> to tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}
func.func private @sub(%a: tensor<8x32xf32>, %b: tensor<8x32xf32>) -> tensor<8x32xf32> attributes {tsched.kernel} {
  %0 = tgraph.sub %a, %b : tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}
func.func private @exp(%a: tensor<8x32xf32>) -> tensor<8x32xf32> attributes {tsched.kernel} {
  %0 = tgraph.exp %a : tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}
func.func private @div(%a: tensor<8x32xf32>, %b: tensor<8x32xf32>) -> tensor<8x32xf32> attributes {tsched.kernel} {
  %0 = tgraph.div %a, %b : tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}
func.func private @flat(%a: tensor<8x32xf32>) -> tensor<256xf32> attributes {tsched.kernel} {
  %0 = tgraph.reshape %a : tensor<8x32xf32> to tensor<256xf32>
  return %0 : tensor<256xf32>
}
}

// -----

// A reduction over the rows (a bias gradient) gets its own kernel that loops
// over the reduced dimension; a constant is computed inside its consumer.
// CHECK-LABEL: func.func @column
// CHECK: tsched.launch @half_fused2 on %{{.*}} ins(%arg0 : memref<64x8xf32>)
// CHECK: tsched.launch @csum on
// CHECK: ttile.kernel @half_fused2
// CHECK: ttile.fill 5.000000e-01 : !ttile.tile<64x8xf32>
// CHECK: ttile.kernel @csum
// CHECK: %[[Z:.*]] = ttile.fill 0.000000e+00 : !ttile.tile<1x8xf32>
// CHECK: scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[ACC:.*]] = %[[Z]])
// CHECK-NEXT: %[[C:.*]] = ttile.load %{{.*}}[%[[I]], %{{.*}}] : memref<64x8xf32> -> !ttile.tile<64x8xf32>
// CHECK-NEXT: %[[CR:.*]] = ttile.reduce %[[C]] {dim = 0 : i64, kind = #tgraph.reduction<sum>}
// CHECK-NEXT: ttile.add %[[ACC]], %[[CR]]
module attributes {tessera.target = "cpu"} {
func.func @column(%g: memref<64x8xf32>) -> memref<1x8xf32> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<64x8xf32>
  tsched.launch @half on %s outs(%0 : memref<64x8xf32>)
  %1 = tsched.alloc : memref<64x8xf32>
  tsched.launch @mul on %s ins(%g, %0 : memref<64x8xf32>, memref<64x8xf32>) outs(%1 : memref<64x8xf32>)
  tsched.free %0 : memref<64x8xf32>
  %2 = tsched.alloc : memref<1x8xf32>
  tsched.launch @csum on %s ins(%1 : memref<64x8xf32>) outs(%2 : memref<1x8xf32>)
  tsched.free %1 : memref<64x8xf32>
  return %2 : memref<1x8xf32>
}
func.func private @half() -> tensor<64x8xf32> attributes {tsched.kernel} {
  %0 = tgraph.fill 5.000000e-01 : tensor<64x8xf32>
  return %0 : tensor<64x8xf32>
}
func.func private @mul(%a: tensor<64x8xf32>, %b: tensor<64x8xf32>) -> tensor<64x8xf32> attributes {tsched.kernel} {
  %0 = tgraph.mul %a, %b : tensor<64x8xf32>
  return %0 : tensor<64x8xf32>
}
func.func private @csum(%a: tensor<64x8xf32>) -> tensor<1x8xf32> attributes {tsched.kernel} {
  %0 = tgraph.reduce <sum> %a dims [0] : tensor<64x8xf32> -> tensor<1x8xf32>
  return %0 : tensor<1x8xf32>
}
}

// -----

// A broadcast that CSE shares between consumers (AdamW's bias corrections
// over every gradient of one shape) is computed again inside each consumer
// that fuses; the one that does not (a transpose, a library call) reads the
// original. The broadcast's input lives until the last copy has read it.
// CHECK-LABEL: func.func @shared_broadcast
// CHECK: tsched.launch @neg_fused4 on %{{.*}} ins(%arg0, %arg1 : {{.*}}) outs(%[[S:.*]], %[[B:.*]], %{{.*}} : memref<1x8xf32>, memref<64x8xf32>, memref<64x8xf32>)
// CHECK: tsched.launch @flip on %{{.*}} ins(%[[B]] : memref<64x8xf32>)
// CHECK: tsched.launch @spread_fused2 on %{{.*}} ins(%[[S]], %arg2 : memref<1x8xf32>, memref<64x8xf32>)
// CHECK-NEXT: tsched.free %[[S]]
// CHECK: ttile.kernel @spread_fused2
// CHECK: ttile.broadcast
// CHECK: ttile.mul
module attributes {tessera.target = "cpu"} {
func.func @shared_broadcast(%x: memref<1x8xf32>, %a: memref<64x8xf32>, %b: memref<64x8xf32>) -> (memref<64x8xf32>, memref<8x64xf32>, memref<64x8xf32>) {
  %s = tsched.stream "compute"
  %scale = tsched.alloc : memref<1x8xf32>
  tsched.launch @neg on %s ins(%x : memref<1x8xf32>) outs(%scale : memref<1x8xf32>)
  %0 = tsched.alloc : memref<64x8xf32>
  tsched.launch @spread on %s ins(%scale : memref<1x8xf32>) outs(%0 : memref<64x8xf32>)
  tsched.free %scale : memref<1x8xf32>
  %1 = tsched.alloc : memref<64x8xf32>
  tsched.launch @mul on %s ins(%a, %0 : memref<64x8xf32>, memref<64x8xf32>) outs(%1 : memref<64x8xf32>)
  %t = tsched.alloc : memref<8x64xf32>
  tsched.launch @flip on %s ins(%0 : memref<64x8xf32>) outs(%t : memref<8x64xf32>)
  %2 = tsched.alloc : memref<64x8xf32>
  tsched.launch @mul on %s ins(%b, %0 : memref<64x8xf32>, memref<64x8xf32>) outs(%2 : memref<64x8xf32>)
  tsched.free %0 : memref<64x8xf32>
  return %1, %t, %2 : memref<64x8xf32>, memref<8x64xf32>, memref<64x8xf32>
}
func.func private @neg(%a: tensor<1x8xf32>) -> tensor<1x8xf32> attributes {tsched.kernel} {
  %0 = tgraph.neg %a : tensor<1x8xf32>
  return %0 : tensor<1x8xf32>
}
func.func private @spread(%a: tensor<1x8xf32>) -> tensor<64x8xf32> attributes {tsched.kernel} {
  %0 = tgraph.broadcast %a : tensor<1x8xf32> to tensor<64x8xf32>
  return %0 : tensor<64x8xf32>
}
func.func private @mul(%a: tensor<64x8xf32>, %b: tensor<64x8xf32>) -> tensor<64x8xf32> attributes {tsched.kernel} {
  %0 = tgraph.mul %a, %b : tensor<64x8xf32>
  return %0 : tensor<64x8xf32>
}
func.func private @flip(%a: tensor<64x8xf32>) -> tensor<8x64xf32> attributes {tsched.kernel} {
  %0 = tgraph.transpose %a perm [1, 0] : tensor<64x8xf32> -> tensor<8x64xf32>
  return %0 : tensor<8x64xf32>
}
}

// -----

// A broadcast whose input is more than a few scalars is not computed again
// where that input is already freed (keeping it alive would raise the peak
// that recomputation lowers): the consumer after the free reads the
// broadcast's buffer.
// CHECK-LABEL: func.func @wide_broadcast_input
// CHECK: tsched.launch @neg_fused3 on %{{.*}} outs(%[[B:.*]], %{{.*}} : memref<64x64xf32>, memref<64x64xf32>)
// CHECK: tsched.launch @flip
// CHECK: tsched.launch @mul on %{{.*}} ins(%arg2, %[[B]] : memref<64x64xf32>, memref<64x64xf32>)
module attributes {tessera.target = "cpu"} {
func.func @wide_broadcast_input(%x: memref<1x64xf32>, %a: memref<64x64xf32>, %b: memref<64x64xf32>) -> (memref<64x64xf32>, memref<64x64xf32>, memref<64x64xf32>) {
  %s = tsched.stream "compute"
  %row = tsched.alloc : memref<1x64xf32>
  tsched.launch @neg on %s ins(%x : memref<1x64xf32>) outs(%row : memref<1x64xf32>)
  %0 = tsched.alloc : memref<64x64xf32>
  tsched.launch @spread on %s ins(%row : memref<1x64xf32>) outs(%0 : memref<64x64xf32>)
  tsched.free %row : memref<1x64xf32>
  %1 = tsched.alloc : memref<64x64xf32>
  tsched.launch @mul on %s ins(%a, %0 : memref<64x64xf32>, memref<64x64xf32>) outs(%1 : memref<64x64xf32>)
  %t = tsched.alloc : memref<64x64xf32>
  tsched.launch @flip on %s ins(%1 : memref<64x64xf32>) outs(%t : memref<64x64xf32>)
  %2 = tsched.alloc : memref<64x64xf32>
  tsched.launch @mul on %s ins(%b, %0 : memref<64x64xf32>, memref<64x64xf32>) outs(%2 : memref<64x64xf32>)
  tsched.free %0 : memref<64x64xf32>
  return %1, %t, %2 : memref<64x64xf32>, memref<64x64xf32>, memref<64x64xf32>
}
func.func private @neg(%a: tensor<1x64xf32>) -> tensor<1x64xf32> attributes {tsched.kernel} {
  %0 = tgraph.neg %a : tensor<1x64xf32>
  return %0 : tensor<1x64xf32>
}
func.func private @spread(%a: tensor<1x64xf32>) -> tensor<64x64xf32> attributes {tsched.kernel} {
  %0 = tgraph.broadcast %a : tensor<1x64xf32> to tensor<64x64xf32>
  return %0 : tensor<64x64xf32>
}
func.func private @mul(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> attributes {tsched.kernel} {
  %0 = tgraph.mul %a, %b : tensor<64x64xf32>
  return %0 : tensor<64x64xf32>
}
func.func private @flip(%a: tensor<64x64xf32>) -> tensor<64x64xf32> attributes {tsched.kernel} {
  %0 = tgraph.transpose %a perm [1, 0] : tensor<64x64xf32> -> tensor<64x64xf32>
  return %0 : tensor<64x64xf32>
}
}

// -----

// Causal attention becomes one flash-attention kernel per (batch, 64 query
// rows): keys and values stream through an scf.for that stops at the
// diagonal block and carries the online softmax (row max, denominator,
// output). Block sizes, warps and stages are in the IR; the dots ask for
// wgmma (64-row warpgroups over 64-wide bf16 tiles).
// CHECK-LABEL: func.func @attention
// CHECK: tsched.launch @att on %{{.*}} ins(%arg0, %arg1, %arg2 : {{.*}}) outs(%{{.*}}, %{{.*}} : memref<2x128x64xbf16>, memref<2x128x1xf32>)
// CHECK: ttile.kernel @att(%[[Q:.*]]: memref<2x128x64xbf16>, %[[K:.*]]: memref<2x128x64xbf16>, %[[V:.*]]: memref<2x128x64xbf16>, %[[O:.*]]: memref<2x128x64xbf16>, %[[L:.*]]: memref<2x128x1xf32>)
// CHECK-SAME: block = array<i64: 128>, grid = array<i64: 4>, stages = 2 : i64, ttile.tile_sizes = array<i64: 64, 64>
// CHECK: %[[ROW:.*]] = arith.muli %{{.*}}, %c64
// CHECK: %[[QT:.*]] = ttile.load %[[Q]][%{{.*}}, %[[ROW]], %{{.*}}] : memref<2x128x64xbf16> -> !ttile.tile<64x64xbf16>
// CHECK: %[[END:.*]] = arith.muli
// CHECK: %[[RES:.*]]:3 = scf.for %[[COL:.*]] = %{{.*}} to %[[END]] step %{{.*}} iter_args(%[[M:.*]] = %{{.*}}, %[[SUM:.*]] = %{{.*}}, %[[ACC:.*]] = %{{.*}}) -> (!ttile.tile<64x1xf32>, !ttile.tile<64x1xf32>, !ttile.tile<64x64xf32>)
// CHECK: %[[KT:.*]] = ttile.load %[[K]][%{{.*}}, %[[COL]], %{{.*}}]
// CHECK: %[[KTT:.*]] = ttile.transpose %[[KT]]
// CHECK: ttile.dot %[[QT]], %[[KTT]], %{{.*}} {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
// CHECK: ttile.iota %[[ROW]] dim 0
// CHECK: ttile.iota %[[COL]] dim 1
// CHECK: ttile.compare {{.*}}<ge>
// CHECK: ttile.reduce {{.*}}<max>
// CHECK: ttile.exp
// CHECK: ttile.cast %{{.*}} : !ttile.tile<64x64xf32> to !ttile.tile<64x64xbf16>
// CHECK: ttile.dot
// CHECK: scf.yield
// CHECK: ttile.div %[[RES]]#2
// CHECK: ttile.store %{{.*}}, %[[O]][
// CHECK: ttile.log %[[RES]]#1
// CHECK: ttile.store %{{.*}}, %[[L]][
func.func @attention(%q: memref<2x128x64xbf16>, %k: memref<2x128x64xbf16>, %v: memref<2x128x64xbf16>) -> (memref<2x128x64xbf16>, memref<2x128x1xf32>) {
  %s = tsched.stream "compute"
  %o = tsched.alloc : memref<2x128x64xbf16>
  %l = tsched.alloc : memref<2x128x1xf32>
  tsched.launch @att on %s ins(%q, %k, %v : memref<2x128x64xbf16>, memref<2x128x64xbf16>, memref<2x128x64xbf16>) outs(%o, %l : memref<2x128x64xbf16>, memref<2x128x1xf32>)
  return %o, %l : memref<2x128x64xbf16>, memref<2x128x1xf32>
}
func.func private @att(%q: tensor<2x128x64xbf16>, %k: tensor<2x128x64xbf16>, %v: tensor<2x128x64xbf16>) -> (tensor<2x128x64xbf16>, tensor<2x128x1xf32>) attributes {tsched.kernel} {
  %o:2 = tgraph.attention %q, %k, %v {causal, scale = 0.125 : f64} : tensor<2x128x64xbf16>, tensor<2x128x64xbf16>, tensor<2x128x64xbf16> -> tensor<2x128x64xbf16>, tensor<2x128x1xf32>
  return %o#0, %o#1 : tensor<2x128x64xbf16>, tensor<2x128x1xf32>
}

// -----

// Grouped heads and a key mask: 4 query heads read 2 key/value heads in
// place (the head offset divided by the group, 2), and the additive
// [1, 1, 64] mask is loaded a [1, BN] row per key block, broadcast and
// added to the scaled scores; the softmax then runs in natural units (exp,
// not exp2) and guards rows that have seen no key yet.
// CHECK-LABEL: func.func @attention_grouped_masked
// CHECK: ttile.kernel @gm(%[[Q:.*]]: memref<4x16x32xf32>, %[[K:.*]]: memref<2x64x32xf32>, %[[V:.*]]: memref<2x64x32xf32>, %[[M:.*]]: memref<1x1x64xf32>, %{{.*}}: memref<4x16x32xf32>, %{{.*}}: memref<4x16x1xf32>)
// CHECK: %[[KV:.*]] = arith.divui %{{.*}}, %c2
// CHECK: scf.for %[[COL:.*]] = %{{.*}} to %{{.*}} step
// CHECK: ttile.load %[[K]][%[[KV]], %[[COL]], %{{.*}}]
// CHECK: ttile.load %[[M]][%{{.*}}, %{{.*}}, %[[COL]]] : memref<1x1x64xf32> -> !ttile.tile<1x
// CHECK: ttile.broadcast
// CHECK: ttile.add
// CHECK: ttile.compare {{.*}}<eq>
// CHECK: ttile.exp %
// CHECK: scf.yield
func.func @attention_grouped_masked(%q: memref<4x16x32xf32>, %k: memref<2x64x32xf32>, %v: memref<2x64x32xf32>, %m: memref<1x1x64xf32>) -> (memref<4x16x32xf32>, memref<4x16x1xf32>) {
  %s = tsched.stream "compute"
  %o = tsched.alloc : memref<4x16x32xf32>
  %l = tsched.alloc : memref<4x16x1xf32>
  tsched.launch @gm on %s ins(%q, %k, %v, %m : memref<4x16x32xf32>, memref<2x64x32xf32>, memref<2x64x32xf32>, memref<1x1x64xf32>) outs(%o, %l : memref<4x16x32xf32>, memref<4x16x1xf32>)
  return %o, %l : memref<4x16x32xf32>, memref<4x16x1xf32>
}
func.func private @gm(%q: tensor<4x16x32xf32>, %k: tensor<2x64x32xf32>, %v: tensor<2x64x32xf32>, %m: tensor<1x1x64xf32>) -> (tensor<4x16x32xf32>, tensor<4x16x1xf32>) attributes {tsched.kernel} {
  %o:2 = tgraph.attention %q, %k, %v mask(%m : tensor<1x1x64xf32>) {causal, scale = 0.125 : f64} : tensor<4x16x32xf32>, tensor<2x64x32xf32>, tensor<2x64x32xf32> -> tensor<4x16x32xf32>, tensor<4x16x1xf32>
  return %o#0, %o#1 : tensor<4x16x32xf32>, tensor<4x16x1xf32>
}

// -----

// Its gradient: two kernels without atomics. @g_dkdv owns a key block and
// loops over the query blocks from the diagonal on; @g_dq owns a query block.
// CHECK-LABEL: func.func @attention_grad
// CHECK: tsched.launch @g_dkdv on %{{.*}} ins(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5 : {{.*}}) outs(%[[DK:.*]], %[[DV:.*]] : memref<128x32xf32>, memref<128x32xf32>)
// CHECK: tsched.launch @g_dq on %{{.*}} ins(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5 : {{.*}}) outs(%[[DQ:.*]] : memref<128x32xf32>)
// CHECK: ttile.kernel @g_dkdv
// CHECK-SAME: grid = array<i64: 2>
// CHECK: arith.divui
// CHECK: %[[START:.*]] = arith.muli
// CHECK: scf.for %{{.*}} = %[[START]] to %c128
// CHECK-COUNT-4: ttile.transpose
// CHECK: scf.yield
// CHECK: ttile.kernel @g_dq
// CHECK: scf.for
// CHECK-COUNT-2: ttile.transpose
// CHECK: scf.yield
func.func @attention_grad(%q: memref<128x32xf32>, %k: memref<128x32xf32>, %v: memref<128x32xf32>, %do: memref<128x32xf32>, %l: memref<128x1xf32>, %d: memref<128x1xf32>) -> (memref<128x32xf32>, memref<128x32xf32>, memref<128x32xf32>) {
  %s = tsched.stream "compute"
  %dq = tsched.alloc : memref<128x32xf32>
  %dk = tsched.alloc : memref<128x32xf32>
  %dv = tsched.alloc : memref<128x32xf32>
  tsched.launch @g on %s ins(%q, %k, %v, %do, %l, %d : memref<128x32xf32>, memref<128x32xf32>, memref<128x32xf32>, memref<128x32xf32>, memref<128x1xf32>, memref<128x1xf32>) outs(%dq, %dk, %dv : memref<128x32xf32>, memref<128x32xf32>, memref<128x32xf32>)
  return %dq, %dk, %dv : memref<128x32xf32>, memref<128x32xf32>, memref<128x32xf32>
}
func.func private @g(%q: tensor<128x32xf32>, %k: tensor<128x32xf32>, %v: tensor<128x32xf32>, %do: tensor<128x32xf32>, %l: tensor<128x1xf32>, %d: tensor<128x1xf32>) -> (tensor<128x32xf32>, tensor<128x32xf32>, tensor<128x32xf32>) attributes {tsched.kernel} {
  %g:3 = tgraph.attention_grad %q, %k, %v, %do, %l, %d {causal, scale = 0.125 : f64} : tensor<128x32xf32>, tensor<128x32xf32>, tensor<128x32xf32>, tensor<128x32xf32>, tensor<128x1xf32>, tensor<128x1xf32> -> tensor<128x32xf32>, tensor<128x32xf32>, tensor<128x32xf32>
  return %g#0, %g#1, %g#2 : tensor<128x32xf32>, tensor<128x32xf32>, tensor<128x32xf32>
}

// -----

// On the CPU the gradient is one kernel per key/value head (grid 1: one head
// of keys for two query heads): dQ zeroed in its buffer, then per key block
// the @g_dkdv loop over every query block of the group, each step also adding
// dS K (dS^T transposed) into its dQ block in the buffer; dQ scaled last. P
// and dS once per block: five dots a step where the two kernels take seven.
// CHECK-LABEL: func.func @attention_grad_cpu
// CHECK: tsched.launch @gc_bwd on %{{.*}} outs(%{{.*}}, %{{.*}}, %{{.*}} : memref<2x128x32xf32>, memref<1x128x32xf32>, memref<1x128x32xf32>)
// CHECK: ttile.kernel @gc_bwd
// CHECK-SAME: grid = array<i64: 1>
// CHECK: scf.for
// CHECK: ttile.fill 0.0
// CHECK-NEXT: arith.constant
// CHECK-NEXT: ttile.store %{{.*}}, %arg6
// CHECK: scf.for
// CHECK: scf.for {{.*}} iter_args
// CHECK-COUNT-4: ttile.dot
// CHECK: %[[PART:.*]] = ttile.load %arg6
// CHECK-NEXT: %[[DS:.*]] = ttile.transpose
// CHECK-NEXT: %[[SUM:.*]] = ttile.dot %[[DS]], %{{.*}}, %[[PART]]
// CHECK: ttile.store %[[SUM]], %arg6
// CHECK-NOT: ttile.dot
// CHECK: scf.yield
// CHECK: ttile.store %{{.*}}, %arg7
// CHECK: ttile.store %{{.*}}, %arg8
// CHECK: scf.for
// CHECK: %[[DQ:.*]] = ttile.load %arg6
// CHECK: ttile.mul %[[DQ]]
// CHECK: ttile.store %{{.*}}, %arg6
module attributes {tessera.target = "cpu"} {
func.func @attention_grad_cpu(%q: memref<2x128x32xf32>, %k: memref<1x128x32xf32>, %v: memref<1x128x32xf32>, %do: memref<2x128x32xf32>, %l: memref<2x128x1xf32>, %d: memref<2x128x1xf32>) -> (memref<2x128x32xf32>, memref<1x128x32xf32>, memref<1x128x32xf32>) {
  %s = tsched.stream "compute"
  %dq = tsched.alloc : memref<2x128x32xf32>
  %dk = tsched.alloc : memref<1x128x32xf32>
  %dv = tsched.alloc : memref<1x128x32xf32>
  tsched.launch @gc on %s ins(%q, %k, %v, %do, %l, %d : memref<2x128x32xf32>, memref<1x128x32xf32>, memref<1x128x32xf32>, memref<2x128x32xf32>, memref<2x128x1xf32>, memref<2x128x1xf32>) outs(%dq, %dk, %dv : memref<2x128x32xf32>, memref<1x128x32xf32>, memref<1x128x32xf32>)
  return %dq, %dk, %dv : memref<2x128x32xf32>, memref<1x128x32xf32>, memref<1x128x32xf32>
}
func.func private @gc(%q: tensor<2x128x32xf32>, %k: tensor<1x128x32xf32>, %v: tensor<1x128x32xf32>, %do: tensor<2x128x32xf32>, %l: tensor<2x128x1xf32>, %d: tensor<2x128x1xf32>) -> (tensor<2x128x32xf32>, tensor<1x128x32xf32>, tensor<1x128x32xf32>) attributes {tsched.kernel} {
  %g:3 = tgraph.attention_grad %q, %k, %v, %do, %l, %d {causal, scale = 0.125 : f64} : tensor<2x128x32xf32>, tensor<1x128x32xf32>, tensor<1x128x32xf32>, tensor<2x128x32xf32>, tensor<2x128x1xf32>, tensor<2x128x1xf32> -> tensor<2x128x32xf32>, tensor<1x128x32xf32>, tensor<1x128x32xf32>
  return %g#0, %g#1, %g#2 : tensor<2x128x32xf32>, tensor<1x128x32xf32>, tensor<1x128x32xf32>
}
}

// -----

// Attention dropout: each kernel reads its head's (seed, step, head) from the
// seeds buffer once, before its loop, and draws the probability block's
// factors at its flat index (head * Sq * Sk + row * Sk + col; the transposed
// block of @dr_dkdv with
// strides [1, Sk]); the forward multiplies P by them after the denominator.
// CHECK-LABEL: func.func @attention_dropout
// CHECK: ttile.kernel @df
// CHECK: ttile.load_scalar %{{.*}}[%{{.*}}, %c0{{.*}}, %c2{{.*}}] : memref<2x1x3xi64>
// CHECK: scf.for
// CHECK-NOT: ttile.load_scalar
// CHECK: ttile.reduce {{.*}}<sum>
// CHECK: %[[Z:.*]] = ttile.dropout_factor %{{.*}}, %{{.*}} at %{{.*}} {p = 2.500000e-01 : f64, strides = array<i64: 64, 1>} : !ttile.tile<64x64xf32>
// CHECK-NEXT: %[[PZ:.*]] = ttile.mul %{{.*}}, %[[Z]]
// CHECK-NEXT: ttile.dot %[[PZ]]
// CHECK: ttile.kernel @dr_dkdv
// CHECK: ttile.dropout_factor %{{.*}}, %{{.*}} at %{{.*}} {p = 2.500000e-01 : f64, strides = array<i64: 1, 64>} : !ttile.tile<64x64xf32>
// CHECK: ttile.kernel @dr_dq
// CHECK: ttile.dropout_factor %{{.*}}, %{{.*}} at %{{.*}} {p = 2.500000e-01 : f64, strides = array<i64: 64, 1>} : !ttile.tile<64x64xf32>
func.func @attention_dropout(%q: memref<2x64x16xf32>, %k: memref<2x64x16xf32>, %v: memref<2x64x16xf32>, %sd: memref<2x1x3xi64>, %do: memref<2x64x16xf32>, %l: memref<2x64x1xf32>, %d: memref<2x64x1xf32>) -> (memref<2x64x16xf32>, memref<2x64x16xf32>) {
  %s = tsched.stream "compute"
  %o = tsched.alloc : memref<2x64x16xf32>
  %lse = tsched.alloc : memref<2x64x1xf32>
  %dq = tsched.alloc : memref<2x64x16xf32>
  %dk = tsched.alloc : memref<2x64x16xf32>
  %dv = tsched.alloc : memref<2x64x16xf32>
  tsched.launch @df on %s ins(%q, %k, %v, %sd : memref<2x64x16xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>, memref<2x1x3xi64>) outs(%o, %lse : memref<2x64x16xf32>, memref<2x64x1xf32>)
  tsched.launch @dr on %s ins(%q, %k, %v, %do, %l, %d, %sd : memref<2x64x16xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>, memref<2x64x1xf32>, memref<2x64x1xf32>, memref<2x1x3xi64>) outs(%dq, %dk, %dv : memref<2x64x16xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>)
  return %o, %dq : memref<2x64x16xf32>, memref<2x64x16xf32>
}
func.func private @df(%q: tensor<2x64x16xf32>, %k: tensor<2x64x16xf32>, %v: tensor<2x64x16xf32>, %sd: tensor<2x1x3xi64>) -> (tensor<2x64x16xf32>, tensor<2x64x1xf32>) attributes {tsched.kernel} {
  %o:2 = tgraph.attention %q, %k, %v dropout(%sd : tensor<2x1x3xi64>) {causal, scale = 0.25 : f64, dropout_p = 0.25 : f64} : tensor<2x64x16xf32>, tensor<2x64x16xf32>, tensor<2x64x16xf32> -> tensor<2x64x16xf32>, tensor<2x64x1xf32>
  return %o#0, %o#1 : tensor<2x64x16xf32>, tensor<2x64x1xf32>
}
func.func private @dr(%q: tensor<2x64x16xf32>, %k: tensor<2x64x16xf32>, %v: tensor<2x64x16xf32>, %do: tensor<2x64x16xf32>, %l: tensor<2x64x1xf32>, %d: tensor<2x64x1xf32>, %sd: tensor<2x1x3xi64>) -> (tensor<2x64x16xf32>, tensor<2x64x16xf32>, tensor<2x64x16xf32>) attributes {tsched.kernel} {
  %g:3 = tgraph.attention_grad %q, %k, %v, %do, %l, %d dropout(%sd : tensor<2x1x3xi64>) {causal, scale = 0.25 : f64, dropout_p = 0.25 : f64} : tensor<2x64x16xf32>, tensor<2x64x16xf32>, tensor<2x64x16xf32>, tensor<2x64x16xf32>, tensor<2x64x1xf32>, tensor<2x64x1xf32> -> tensor<2x64x16xf32>, tensor<2x64x16xf32>, tensor<2x64x16xf32>
  return %g#0, %g#1, %g#2 : tensor<2x64x16xf32>, tensor<2x64x16xf32>, tensor<2x64x16xf32>
}

// -----

// An all_gather + matmul kernel (transport = nvshmem) over the outer axis of
// a 2x2 mesh (PE stride 2): one GEMM kernel. Instance (c, 0), for each of the
// 4 local 16-row chunks c, puts its chunk into every PE's symmetric copy,
// completes the puts and sets the chunk's signal word on every PE; every
// instance starts at this rank's own rows and waits for its chunk's word.
module attributes {tessera.target = "gpu"} {
  tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
  // CHECK-LABEL: func.func @gathered
  // CHECK: %[[Y:.*]] = tsched.alloc : memref<128x16xbf16>
  // CHECK-NEXT: %[[G:.*]] = tsched.alloc {symmetric} : memref<128x32xbf16>
  // CHECK-NEXT: %[[R:.*]] = tsched.alloc {symmetric} : memref<8xi64>
  // CHECK-NEXT: tsched.launch @gathered_gather_matmul_0 on %{{.*}} ins(%arg0, %arg1 : memref<64x32xbf16>, memref<32x16xbf16>) outs(%[[Y]], %[[G]], %[[R]] : memref<128x16xbf16>, memref<128x32xbf16>, memref<8xi64>)
  // CHECK-NEXT: tsched.free %[[G]]
  // CHECK-NEXT: tsched.free %[[R]]
  // CHECK: ttile.kernel @gathered_gather_matmul_0(%{{.*}}: memref<64x32xbf16>, %{{.*}}: memref<32x16xbf16>, %{{.*}}: memref<128x16xbf16>, %[[GA:.*]]: memref<128x32xbf16> {ttile.symmetric}, %[[RA:.*]]: memref<8xi64> {ttile.signals, ttile.symmetric})
  // CHECK-SAME: grid = array<i64: 8>
  // CHECK: %[[PE:.*]] = ttile.my_pe
  // CHECK: %[[Q:.*]] = arith.divui %[[PE]], %c2
  // CHECK: %[[COORD:.*]] = arith.remui %[[Q]], %c2
  // CHECK: scf.if
  // CHECK: scf.for %[[J:.*]] =
  // CHECK: %[[STEP:.*]] = arith.muli %[[J]], %c2
  // CHECK: ttile.put %arg0[{{.*}}] to %[[GA]][{{.*}}] on %{{.*}} {shape = array<i64: 16, 32>}
  // CHECK: ttile.quiet
  // CHECK: ttile.signal %[[RA]][{{.*}}], %{{.*}} on %{{.*}} {kind = "set"}
  // CHECK: ttile.wait %[[RA]][{{.*}}], %{{.*}} {cmp = "ge"}
  // CHECK: scf.for
  // CHECK: ttile.load %[[GA]]
  // CHECK: ttile.dot
  func.func @gathered(%arg0: memref<64x32xbf16>, %arg1: memref<32x16xbf16>) -> memref<128x16xbf16> {
    %0 = tsched.stream "compute"
    %1 = tsched.stream "comm"
    %2 = tsched.alloc : memref<128x16xbf16>
    tsched.launch @gathered_gather_matmul_0 on %0 ins(%arg0, %arg1 : memref<64x32xbf16>, memref<32x16xbf16>) outs(%2 : memref<128x16xbf16>)
    return %2 : memref<128x16xbf16>
  }
  func.func private @gathered_gather_matmul_0(%arg0: tensor<64x32xbf16>, %arg1: tensor<32x16xbf16>) -> tensor<128x16xbf16> attributes {tsched.kernel} {
    %0 = tgraph.all_gather %arg0 on @mesh["dp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<64x32xbf16> -> tensor<128x32xbf16>
    %1 = tgraph.matmul %0, %arg1 : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
    return %1 : tensor<128x16xbf16>
  }
}

// -----

// The elementwise launch after a gathered GEMM is its epilogue, as after any
// GEMM: one kernel whose relu runs on the output tile after the K loop and
// whose store goes to the tile's rows (own chunk first), not the grid's.
module attributes {tessera.target = "gpu"} {
  tgraph.mesh @mesh axes = ["tp"] shape = [2]
  // CHECK-LABEL: func.func @gathered_relu
  // CHECK: %[[Z:.*]] = tsched.alloc : memref<128x16xbf16>
  // CHECK: tsched.alloc {symmetric} : memref<128x32xbf16>
  // CHECK: tsched.launch @gathered_gather_matmul_0_fused2 on %{{.*}} ins(%arg0, %arg1 : memref<64x32xbf16>, memref<32x16xbf16>) outs(%[[Z]], %{{.*}}, %{{.*}} : memref<128x16xbf16>, memref<128x32xbf16>, memref<8xi64>)
  // CHECK-NOT: tsched.launch
  // CHECK: ttile.kernel @gathered_gather_matmul_0_fused2(
  // CHECK: ttile.wait %{{.*}}[%[[MB:.*]]], %{{.*}} {cmp = "ge"}
  // CHECK: %[[ROW:.*]] = arith.muli %[[MB]], %c16
  // CHECK: %[[ACC:.*]] = scf.for
  // CHECK: %[[OUT:.*]] = ttile.cast %[[ACC]]
  // CHECK: %[[RELU:.*]] = ttile.relu %[[OUT]]
  // CHECK: ttile.store %[[RELU]], %{{.*}}[%[[ROW]], %{{.*}}]
  func.func @gathered_relu(%arg0: memref<64x32xbf16>, %arg1: memref<32x16xbf16>) -> memref<128x16xbf16> {
    %0 = tsched.stream "compute"
    %2 = tsched.alloc : memref<128x16xbf16>
    tsched.launch @gathered_gather_matmul_0 on %0 ins(%arg0, %arg1 : memref<64x32xbf16>, memref<32x16xbf16>) outs(%2 : memref<128x16xbf16>)
    %3 = tsched.alloc : memref<128x16xbf16>
    tsched.launch @relu on %0 ins(%2 : memref<128x16xbf16>) outs(%3 : memref<128x16xbf16>)
    tsched.free %2 : memref<128x16xbf16>
    return %3 : memref<128x16xbf16>
  }
  func.func private @gathered_gather_matmul_0(%arg0: tensor<64x32xbf16>, %arg1: tensor<32x16xbf16>) -> tensor<128x16xbf16> attributes {tsched.kernel} {
    %0 = tgraph.all_gather %arg0 on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<64x32xbf16> -> tensor<128x32xbf16>
    %1 = tgraph.matmul %0, %arg1 : tensor<128x32xbf16>, tensor<32x16xbf16> -> tensor<128x16xbf16>
    return %1 : tensor<128x16xbf16>
  }
  func.func private @relu(%arg0: tensor<128x16xbf16>) -> tensor<128x16xbf16> attributes {tsched.kernel} {
    %0 = tgraph.relu %arg0 : tensor<128x16xbf16>
    return %0 : tensor<128x16xbf16>
  }
}

// -----

// A matmul + reduce_scatter kernel (transport = nvshmem) on a 4-rank axis,
// with a residual add after it: one GEMM kernel over this rank's 64 x 16
// output tiles. For each rank (coord + j, j = 1..4: peers first, itself
// last) an instance computes the partial tile of that rank's rows (one GEMM
// main loop), stages it and puts it into that rank's inbox slot for this
// rank; then it completes the puts, adds 1 to the tile's signal word on
// every rank, waits for 4 and sums the 4 slots in rank order in f32; the
// add runs on the sum.
module attributes {tessera.target = "gpu"} {
  tgraph.mesh @mesh axes = ["tp"] shape = [4]
  // CHECK-LABEL: func.func @scattered
  // CHECK: %[[Z:.*]] = tsched.alloc : memref<64x16xbf16>
  // CHECK-NEXT: %[[OUTBOX:.*]] = tsched.alloc {symmetric} : memref<256x16xbf16>
  // CHECK-NEXT: %[[INBOX:.*]] = tsched.alloc {symmetric} : memref<256x16xbf16>
  // CHECK-NEXT: %[[READY:.*]] = tsched.alloc {symmetric} : memref<4xi64>
  // CHECK-NEXT: tsched.launch @scattered_matmul_scatter_0_fused2 on %{{.*}} ins(%arg0, %arg1, %arg2 : memref<256x32xbf16>, memref<32x16xbf16>, memref<64x16xbf16>) outs(%[[Z]], %[[OUTBOX]], %[[INBOX]], %[[READY]] :
  // CHECK-NOT: tsched.launch
  // CHECK: ttile.kernel @scattered_matmul_scatter_0_fused2({{.*}}, %[[OB:.*]]: memref<256x16xbf16> {ttile.symmetric}, %[[IB:.*]]: memref<256x16xbf16> {ttile.symmetric}, %[[RD:.*]]: memref<4xi64> {ttile.signals, ttile.symmetric})
  // CHECK-SAME: grid = array<i64: 4>
  // CHECK: %[[PID:.*]] = ttile.program_id 0
  // CHECK: ttile.my_pe
  // CHECK: %[[ROW:.*]] = arith.muli %[[PID]], %c16
  // CHECK: %[[COL:.*]] = arith.muli
  // CHECK: %[[END:.*]] = arith.constant 5 : index
  // CHECK: scf.for %[[J:.*]] = %{{.*}} to %[[END]] step %{{.*}} {
  // CHECK:   %[[ROWS:.*]] = arith.addi %{{.*}}, %[[ROW]]
  // CHECK:   scf.for
  // CHECK:     ttile.load %arg0[%[[ROWS]], %{{.*}}]
  // CHECK:     ttile.dot
  // CHECK:   ttile.store %{{.*}}, %[[OB]][%[[ROWS]], %[[COL]]]
  // CHECK-NEXT: ttile.barrier
  // CHECK:   ttile.put %[[OB]][%[[ROWS]], %[[COL]]] to %[[IB]][%{{.*}}, %[[COL]]] on %{{.*}} {shape = array<i64: 16, 16>}
  // CHECK: }
  // CHECK-NEXT: ttile.quiet
  // CHECK: scf.for
  // CHECK:   ttile.signal %[[RD]][%[[PID]]], %{{.*}} on %{{.*}} {kind = "add"}
  // CHECK: %[[C4:.*]] = arith.constant 4 : index
  // CHECK-NEXT: ttile.wait %[[RD]][%[[PID]]], %[[C4]] {cmp = "ge"}
  // CHECK: %[[S0:.*]] = ttile.load %[[IB]]
  // CHECK-NEXT: %[[W0:.*]] = ttile.cast %[[S0]] : !ttile.tile<16x16xbf16> to !ttile.tile<16x16xf32>
  // CHECK: %[[S1:.*]] = ttile.load %[[IB]]
  // CHECK-NEXT: %[[W1:.*]] = ttile.cast %[[S1]]
  // CHECK-NEXT: ttile.add %[[W0]], %[[W1]] : !ttile.tile<16x16xf32>
  // CHECK-COUNT-2: ttile.add {{.*}} : !ttile.tile<16x16xf32>
  // CHECK-NEXT: %[[TOTAL:.*]] = ttile.cast %{{.*}} : !ttile.tile<16x16xf32> to !ttile.tile<16x16xbf16>
  // CHECK: %[[R:.*]] = ttile.load %arg2[%[[ROW]], %[[COL]]]
  // CHECK-NEXT: %[[OUT:.*]] = ttile.add %[[R]], %[[TOTAL]] : !ttile.tile<16x16xbf16>
  // CHECK-NEXT: ttile.store %[[OUT]], %arg3[%[[ROW]], %[[COL]]]
  func.func @scattered(%arg0: memref<256x32xbf16>, %arg1: memref<32x16xbf16>, %arg2: memref<64x16xbf16>) -> memref<64x16xbf16> {
    %0 = tsched.stream "compute"
    %2 = tsched.alloc : memref<64x16xbf16>
    tsched.launch @scattered_matmul_scatter_0 on %0 ins(%arg0, %arg1 : memref<256x32xbf16>, memref<32x16xbf16>) outs(%2 : memref<64x16xbf16>)
    %3 = tsched.alloc : memref<64x16xbf16>
    tsched.launch @add on %0 ins(%arg2, %2 : memref<64x16xbf16>, memref<64x16xbf16>) outs(%3 : memref<64x16xbf16>)
    tsched.free %2 : memref<64x16xbf16>
    return %3 : memref<64x16xbf16>
  }
  func.func private @scattered_matmul_scatter_0(%arg0: tensor<256x32xbf16>, %arg1: tensor<32x16xbf16>) -> tensor<64x16xbf16> attributes {tsched.kernel} {
    %0 = tgraph.matmul %arg0, %arg1 : tensor<256x32xbf16>, tensor<32x16xbf16> -> tensor<256x16xbf16>
    %1 = tgraph.reduce_scatter <sum> %0 on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<256x16xbf16> -> tensor<64x16xbf16>
    return %1 : tensor<64x16xbf16>
  }
  func.func private @add(%arg0: tensor<64x16xbf16>, %arg1: tensor<64x16xbf16>) -> tensor<64x16xbf16> attributes {tsched.kernel} {
    %0 = tgraph.add %arg0, %arg1 : tensor<64x16xbf16>
    return %0 : tensor<64x16xbf16>
  }
}

// -----

// An all_to_all kernel (transport = nvshmem: an MoE layer's dispatch) whose
// result the function returns, over
// the outer axis of a 2x2 mesh (PE stride 2): one exchange kernel of 2
// instances, a received copy and 2 signal words allocated symmetric around
// its launch. Instance j puts piece j of the operand into the peer at
// coordinate j, at this rank's slot, completes the puts and sets this
// rank's word there; then waits for word j here and copies piece j out.
module attributes {tessera.target = "gpu"} {
  tgraph.mesh @mesh axes = ["ep", "dp"] shape = [2, 2]
  // CHECK-LABEL: func.func @exchanged
  // CHECK: %[[Y:.*]] = tsched.alloc : memref<1x32x8xf32>
  // CHECK-NEXT: %[[RECV:.*]] = tsched.alloc {symmetric} : memref<1x32x8xf32>
  // CHECK-NEXT: %[[SIG:.*]] = tsched.alloc {symmetric} : memref<2xi64>
  // CHECK-NEXT: tsched.launch @exchanged_exchange_0 on %{{.*}} ins(%arg0 : memref<2x16x8xf32>) outs(%[[Y]], %[[RECV]], %[[SIG]] : memref<1x32x8xf32>, memref<1x32x8xf32>, memref<2xi64>)
  // CHECK-NEXT: tsched.free %[[RECV]]
  // CHECK-NEXT: tsched.free %[[SIG]]
  // CHECK: ttile.kernel @exchanged_exchange_0(%[[X:.*]]: memref<2x16x8xf32>, %[[OUT:.*]]: memref<1x32x8xf32>, %[[RA:.*]]: memref<1x32x8xf32> {ttile.symmetric}, %[[SA:.*]]: memref<2xi64> {ttile.signals, ttile.symmetric})
  // CHECK-SAME: grid = array<i64: 2>
  // CHECK: %[[PID:.*]] = ttile.program_id 0
  // CHECK: %[[PE:.*]] = ttile.my_pe
  // CHECK: %[[Q:.*]] = arith.divui %[[PE]], %c2
  // CHECK: %[[COORD:.*]] = arith.remui %[[Q]], %c2
  // CHECK: %[[STEP:.*]] = arith.muli %[[PID]], %c2
  // CHECK: %[[PEER:.*]] = arith.addi %{{.*}}, %[[STEP]]
  // CHECK: %[[MINE:.*]] = arith.muli %[[COORD]], %c16
  // CHECK: ttile.put %[[X]][%[[PID]], %{{.*}}, %{{.*}}] to %[[RA]][%{{.*}}, %[[MINE]], %{{.*}}] on %[[PEER]] {shape = array<i64: 1, 16, 8>}
  // CHECK-NEXT: ttile.quiet
  // CHECK: ttile.signal %[[SA]][%[[COORD]]], %{{.*}} on %[[PEER]] {kind = "set"}
  // CHECK: ttile.wait %[[SA]][%[[PID]]], %{{.*}} {cmp = "ge"}
  // CHECK: %[[SLOT:.*]] = arith.muli %[[PID]], %c16
  // CHECK: ttile.get %[[RA]][%{{.*}}, %[[SLOT]], %{{.*}}] on %{{.*}} to %[[OUT]][%{{.*}}, %[[SLOT]], %{{.*}}] {shape = array<i64: 1, 16, 8>}
  func.func @exchanged(%arg0: memref<2x16x8xf32>) -> memref<1x32x8xf32> {
    %0 = tsched.stream "compute"
    %1 = tsched.alloc : memref<1x32x8xf32>
    tsched.launch @exchanged_exchange_0 on %0 ins(%arg0 : memref<2x16x8xf32>) outs(%1 : memref<1x32x8xf32>)
    return %1 : memref<1x32x8xf32>
  }
  func.func private @exchanged_exchange_0(%arg0: tensor<2x16x8xf32>) -> tensor<1x32x8xf32> attributes {tsched.kernel} {
    %0 = tgraph.all_to_all %arg0 on @mesh["ep"] split_dim 0 concat_dim 1 {transport = #tgraph.transport<nvshmem>} : tensor<2x16x8xf32> -> tensor<1x32x8xf32>
    return %0 : tensor<1x32x8xf32>
  }
}

// -----

// A ragged exchange (the all_to_all's row counts, an MoE layer's): the
// kernel takes the counts after the operand, reads its peer's entry of each
// and moves only those rows (`rows` on the put and the get).
module attributes {tessera.target = "gpu"} {
  tgraph.mesh @mesh axes = ["ep"] shape = [2]
  // CHECK-LABEL: func.func @ragged
  // CHECK: tsched.launch @ragged_exchange_0 on %{{.*}} ins(%arg0, %arg1, %arg2 : memref<2x16x8xf32>, memref<2xi32>, memref<2xi32>) outs(
  // CHECK: ttile.kernel @ragged_exchange_0(%[[X:.*]]: memref<2x16x8xf32>, %[[SENT:.*]]: memref<2xi32>, %[[GOT:.*]]: memref<2xi32>, %[[OUT:.*]]: memref<1x32x8xf32>, %{{.*}}: memref<1x32x8xf32> {ttile.symmetric}, %{{.*}}: memref<2xi64> {ttile.signals, ttile.symmetric})
  // CHECK: %[[PID:.*]] = ttile.program_id 0
  // CHECK: %[[N:.*]] = ttile.load_scalar %[[SENT]][%[[PID]]] : memref<2xi32>
  // CHECK: %[[M:.*]] = ttile.load_scalar %[[GOT]][%[[PID]]] : memref<2xi32>
  // CHECK: ttile.put %[[X]]{{.*}} rows %[[N]]
  // CHECK: ttile.get {{.*}} to %[[OUT]]{{.*}} rows %[[M]]
  func.func @ragged(%arg0: memref<2x16x8xf32>, %arg1: memref<2xi32>, %arg2: memref<2xi32>) -> memref<1x32x8xf32> {
    %0 = tsched.stream "compute"
    %1 = tsched.alloc : memref<1x32x8xf32>
    tsched.launch @ragged_exchange_0 on %0 ins(%arg0, %arg1, %arg2 : memref<2x16x8xf32>, memref<2xi32>, memref<2xi32>) outs(%1 : memref<1x32x8xf32>)
    return %1 : memref<1x32x8xf32>
  }
  func.func private @ragged_exchange_0(%arg0: tensor<2x16x8xf32>, %arg1: tensor<2xi32>, %arg2: tensor<2xi32>) -> tensor<1x32x8xf32> attributes {tsched.kernel} {
    %0 = tgraph.all_to_all %arg0 counts(%arg1, %arg2 : tensor<2xi32>, tensor<2xi32>) on @mesh["ep"] split_dim 0 concat_dim 1 {transport = #tgraph.transport<nvshmem>} : tensor<2x16x8xf32> -> tensor<1x32x8xf32>
    return %0 : tensor<1x32x8xf32>
  }
}

// -----

// In place: an exchange whose result the function does not return (an MoE
// layer's, read by its expert GEMMs) receives straight into its result,
// allocated symmetric: no copy out (no ttile.get), and the reader reads the
// symmetric buffer.
module attributes {tessera.target = "gpu"} {
  tgraph.mesh @mesh axes = ["ep"] shape = [2]
  // CHECK-LABEL: func.func @in_place
  // CHECK: %[[R:.*]] = tsched.alloc {symmetric} : memref<1x32x8xf32>
  // CHECK: %[[SIG:.*]] = tsched.alloc {symmetric} : memref<2xi64>
  // CHECK: tsched.launch @in_place_exchange_0 on %{{.*}} ins(%arg0 : memref<2x16x8xf32>) outs(%[[R]], %[[SIG]] :
  // CHECK: tsched.launch @in_place_neg_1 on %{{.*}} ins(%[[R]] :
  // CHECK: ttile.kernel @in_place_exchange_0(%{{.*}}: memref<2x16x8xf32>, %{{.*}}: memref<1x32x8xf32> {ttile.symmetric}, %{{.*}}: memref<2xi64> {ttile.signals, ttile.symmetric})
  // CHECK: ttile.wait
  // CHECK-NOT: ttile.get
  // CHECK: ttile.return
  func.func @in_place(%arg0: memref<2x16x8xf32>) -> memref<1x32x8xf32> {
    %0 = tsched.stream "compute"
    %1 = tsched.alloc : memref<1x32x8xf32>
    tsched.launch @in_place_exchange_0 on %0 ins(%arg0 : memref<2x16x8xf32>) outs(%1 : memref<1x32x8xf32>)
    %2 = tsched.alloc : memref<1x32x8xf32>
    tsched.launch @in_place_neg_1 on %0 ins(%1 : memref<1x32x8xf32>) outs(%2 : memref<1x32x8xf32>)
    tsched.free %1 : memref<1x32x8xf32>
    return %2 : memref<1x32x8xf32>
  }
  func.func private @in_place_exchange_0(%arg0: tensor<2x16x8xf32>) -> tensor<1x32x8xf32> attributes {tsched.kernel} {
    %0 = tgraph.all_to_all %arg0 on @mesh["ep"] split_dim 0 concat_dim 1 {transport = #tgraph.transport<nvshmem>} : tensor<2x16x8xf32> -> tensor<1x32x8xf32>
    return %0 : tensor<1x32x8xf32>
  }
  func.func private @in_place_neg_1(%arg0: tensor<1x32x8xf32>) -> tensor<1x32x8xf32> attributes {tsched.kernel} {
    %0 = tgraph.neg %arg0 : tensor<1x32x8xf32>
    return %0 : tensor<1x32x8xf32>
  }
}

// -----

// `channels = 2` (multi_qp): 2 instances per peer, each moving 8 of the
// piece's 16 rows (the count less the rows before its range) and setting a
// signal word of its own (2 peers x 2 channels).
module attributes {tessera.target = "gpu"} {
  tgraph.mesh @mesh axes = ["ep"] shape = [2]
  // CHECK-LABEL: func.func @channels
  // CHECK: tsched.alloc {symmetric} : memref<4xi64>
  // CHECK: ttile.kernel @channels_exchange_0({{.*}}%[[SIG:[^:]*]]: memref<4xi64> {ttile.signals, ttile.symmetric})
  // CHECK-SAME: grid = array<i64: 4>
  // CHECK: %[[PID:.*]] = ttile.program_id 0
  // CHECK: %[[J:.*]] = arith.divui %[[PID]], %c2
  // CHECK: %[[C:.*]] = arith.remui %[[PID]], %c2
  // CHECK: %[[N:.*]] = ttile.load_scalar %{{.*}}[%[[J]]]
  // CHECK: %[[SKIP:.*]] = arith.muli %[[C]], %c8
  // CHECK: %[[LEFT:.*]] = arith.subi %[[N]], %[[SKIP]]
  // CHECK: ttile.put {{.*}} rows %[[LEFT]] {shape = array<i64: 1, 8, 8>}
  // CHECK: ttile.signal %[[SIG]]
  // CHECK: ttile.wait %[[SIG]][%[[PID]]]
  func.func @channels(%arg0: memref<2x16x8xf32>, %arg1: memref<2xi32>, %arg2: memref<2xi32>) -> memref<1x32x8xf32> {
    %0 = tsched.stream "compute"
    %1 = tsched.alloc : memref<1x32x8xf32>
    tsched.launch @channels_exchange_0 on %0 ins(%arg0, %arg1, %arg2 : memref<2x16x8xf32>, memref<2xi32>, memref<2xi32>) outs(%1 : memref<1x32x8xf32>)
    return %1 : memref<1x32x8xf32>
  }
  func.func private @channels_exchange_0(%arg0: tensor<2x16x8xf32>, %arg1: tensor<2xi32>, %arg2: tensor<2xi32>) -> tensor<1x32x8xf32> attributes {tsched.kernel} {
    %0 = tgraph.all_to_all %arg0 counts(%arg1, %arg2 : tensor<2xi32>, tensor<2xi32>) on @mesh["ep"] split_dim 0 concat_dim 1 {channels = 2 : i64, transport = #tgraph.transport<nvshmem>} : tensor<2x16x8xf32> -> tensor<1x32x8xf32>
    return %0 : tensor<1x32x8xf32>
  }
}

// -----

// A GELU between two grouped GEMMs (an expert-parallel MoE layer's experts):
// only the GEMMs read its result, and only inside the segments of %sizes, so
// the fused kernel takes %sizes and `row_segments` [its argument, rows, tile
// rows]: instances past a block's segments (the padding) skip their work.
// Its bands stay inside one block of 16 rows (4 blocks) so that each can be
// skipped. A kernel whose result something else reads gets neither.
// CHECK-LABEL: func.func @segment_rows
// CHECK: tsched.launch @gelu on %{{.*}} ins(%{{.*}}, %[[SIZES:.*]] : memref<64x32xf32>, memref<4x2xi32>)
// CHECK: tsched.launch @tanh on %{{.*}} ins(%{{.*}} : memref<64x32xf32>) outs
// CHECK: ttile.kernel @gelu(%{{.*}}: memref<64x32xf32>, %{{.*}}: memref<4x2xi32>, %{{.*}}: memref<64x32xf32>)
// CHECK-SAME: grid = array<i64: 4>, row_segments = array<i64: 1, 64, 16>
// CHECK: ttile.kernel @tanh
// CHECK-NOT: row_segments
module attributes {tessera.target = "cpu"} {
  func.func @segment_rows(%rows: memref<64x16xf32>, %w1: memref<2x16x32xf32>, %w2: memref<2x32x16xf32>, %sizes: memref<4x2xi32>) -> (memref<64x16xf32>, memref<64x32xf32>) {
    %s = tsched.stream "compute"
    %h = tsched.alloc : memref<64x32xf32>
    tsched.launch @up on %s ins(%rows, %w1, %sizes : memref<64x16xf32>, memref<2x16x32xf32>, memref<4x2xi32>) outs(%h : memref<64x32xf32>)
    %a = tsched.alloc : memref<64x32xf32>
    tsched.launch @gelu on %s ins(%h : memref<64x32xf32>) outs(%a : memref<64x32xf32>)
    %y = tsched.alloc : memref<64x16xf32>
    tsched.launch @down on %s ins(%a, %w2, %sizes : memref<64x32xf32>, memref<2x32x16xf32>, memref<4x2xi32>) outs(%y : memref<64x16xf32>)
    tsched.free %a : memref<64x32xf32>
    %t = tsched.alloc : memref<64x32xf32>
    tsched.launch @tanh on %s ins(%h : memref<64x32xf32>) outs(%t : memref<64x32xf32>)
    tsched.free %h : memref<64x32xf32>
    return %y, %t : memref<64x16xf32>, memref<64x32xf32>
  }
  func.func private @up(%x: tensor<64x16xf32>, %w: tensor<2x16x32xf32>, %n: tensor<4x2xi32>) -> tensor<64x32xf32> attributes {tsched.kernel} {
    %0 = tgraph.grouped_matmul %x, %w, %n : tensor<64x16xf32>, tensor<2x16x32xf32>, tensor<4x2xi32> -> tensor<64x32xf32>
    return %0 : tensor<64x32xf32>
  }
  func.func private @gelu(%x: tensor<64x32xf32>) -> tensor<64x32xf32> attributes {tsched.kernel} {
    %0 = tgraph.gelu %x : tensor<64x32xf32>
    return %0 : tensor<64x32xf32>
  }
  func.func private @down(%x: tensor<64x32xf32>, %w: tensor<2x32x16xf32>, %n: tensor<4x2xi32>) -> tensor<64x16xf32> attributes {tsched.kernel} {
    %0 = tgraph.grouped_matmul %x, %w, %n : tensor<64x32xf32>, tensor<2x32x16xf32>, tensor<4x2xi32> -> tensor<64x16xf32>
    return %0 : tensor<64x16xf32>
  }
  func.func private @tanh(%x: tensor<64x32xf32>) -> tensor<64x32xf32> attributes {tsched.kernel} {
    %0 = tgraph.tanh %x : tensor<64x32xf32>
    return %0 : tensor<64x32xf32>
  }
}

// -----

// Attention along dimension 1 of [B, S, H, D] buffers (CPU): one kernel
// instance per (batch, head, 64 query rows); every tile takes the rows of its
// head where they lie (`dims`), loads and stores alike, lse included.
// CHECK-LABEL: func.func @heads
// CHECK: ttile.kernel @att
// CHECK-SAME: grid = array<i64: 8>
// CHECK: %[[B:[0-9]+]] = arith.divui %{{.*}}, %c4
// CHECK: %[[H:[0-9]+]] = arith.remui %{{.*}}, %c4
// CHECK: %[[ROW:[0-9]+]] = arith.muli
// CHECK: ttile.load %arg0[%[[B]], %[[ROW]], %[[H]], %{{.*}}] {dims = array<i64: 1, 3>} : memref<2x64x4x16xf32> -> !ttile.tile<64x16xf32>
// CHECK: scf.for %[[COL:[a-z0-9_]+]] =
// CHECK: ttile.load %arg1[%[[B]], %[[COL]], %[[H]], %{{.*}}] {dims = array<i64: 1, 3>}
// CHECK: ttile.load %arg2[%[[B]], %[[COL]], %[[H]], %{{.*}}] {dims = array<i64: 1, 3>}
// CHECK: ttile.store %{{.*}}, %arg3[%[[B]], %[[ROW]], %[[H]], %{{.*}}] {dims = array<i64: 1, 3>}
// CHECK: ttile.store %{{.*}}, %arg4[%[[B]], %[[ROW]], %[[H]], %{{.*}}] {dims = array<i64: 1, 3>} : !ttile.tile<64x1xf32>, memref<2x64x4x1xf32>
module attributes {tessera.target = "cpu"} {
func.func @heads(%q: memref<2x64x4x16xf32>) -> (memref<2x64x4x16xf32>, memref<2x64x4x1xf32>) {
  %s = tsched.stream "compute"
  %o = tsched.alloc : memref<2x64x4x16xf32>
  %l = tsched.alloc : memref<2x64x4x1xf32>
  tsched.launch @att on %s ins(%q, %q, %q : memref<2x64x4x16xf32>, memref<2x64x4x16xf32>, memref<2x64x4x16xf32>) outs(%o, %l : memref<2x64x4x16xf32>, memref<2x64x4x1xf32>)
  return %o, %l : memref<2x64x4x16xf32>, memref<2x64x4x1xf32>
}
func.func private @att(%q: tensor<2x64x4x16xf32>, %k: tensor<2x64x4x16xf32>, %v: tensor<2x64x4x16xf32>) -> (tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>) attributes {tsched.kernel} {
  %o:2 = tgraph.attention %q, %k, %v {causal, scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32> -> tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>
  return %o#0, %o#1 : tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>
}
}

// -----

// The GPU kernels take [..., S, D] tiles only (tessera-lower-to-schedule
// transposes such attention for the GPU target first).
module attributes {tessera.target = "gpu"} {
func.func @heads_gpu(%q: memref<2x64x4x16xf32>) -> (memref<2x64x4x16xf32>, memref<2x64x4x1xf32>) {
  %s = tsched.stream "compute"
  %o = tsched.alloc : memref<2x64x4x16xf32>
  %l = tsched.alloc : memref<2x64x4x1xf32>
  tsched.launch @att_gpu on %s ins(%q, %q, %q : memref<2x64x4x16xf32>, memref<2x64x4x16xf32>, memref<2x64x4x16xf32>) outs(%o, %l : memref<2x64x4x16xf32>, memref<2x64x4x1xf32>)
  return %o, %l : memref<2x64x4x16xf32>, memref<2x64x4x1xf32>
}
func.func private @att_gpu(%q: tensor<2x64x4x16xf32>, %k: tensor<2x64x4x16xf32>, %v: tensor<2x64x4x16xf32>) -> (tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>) attributes {tsched.kernel} {
  // expected-error @below {{tessera-lower-to-tile: GPU attention kernels read [..., S, D] operands; tessera-lower-to-schedule moves seq_dim there first}}
  %o:2 = tgraph.attention %q, %k, %v {causal, scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32> -> tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>
  return %o#0, %o#1 : tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>
}
}
