// RUN: tessera-opt %s --split-input-file --tessera-lower-to-tile --verify-diagnostics | FileCheck %s

// Inputs are Schedule IR as tessera-lower-to-schedule leaves it: launches of
// kernels that are functions on tensors.

// The relu reading only the matmul's output is fused into its epilogue: one
// launch, one kernel, no intermediate buffer.
// CHECK-LABEL: func.func @fuse
// CHECK: %[[OUT:.*]] = tsched.alloc : memref<64x32xf32>
// CHECK-NEXT: tsched.launch @mm_relu on %{{.*}} ins(%arg0, %arg1 : memref<64x16xf32>, memref<16x32xf32>) outs(%[[OUT]] : memref<64x32xf32>)
// CHECK-NOT: tsched.launch
// CHECK: return %[[OUT]]
// CHECK: ttile.kernel @mm_relu(%[[A:.*]]: memref<64x16xf32>, %[[B:.*]]: memref<16x32xf32>, %[[C:.*]]: memref<64x32xf32>)
// CHECK-SAME: block = array<i64: 128>, grid = array<i64: 2, 1>, ttile.tile_sizes = array<i64: 32, 32, 16>
// CHECK: %[[ACC:.*]] = ttile.fill 0.000000e+00 : !ttile.tile<32x32xf32>
// CHECK: %[[SUM:.*]] = scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[IT:.*]] = %[[ACC]]) -> (!ttile.tile<32x32xf32>)
// CHECK: ttile.load %[[A]][%{{.*}}, %[[K]]] : memref<64x16xf32> -> !ttile.tile<32x16xf32>
// CHECK: ttile.load %[[B]][%[[K]], %{{.*}}] : memref<16x32xf32> -> !ttile.tile<16x32xf32>
// CHECK: ttile.dot %{{.*}}, %{{.*}}, %[[IT]]
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
// CHECK: tsched.launch @mm_add on %{{.*}} ins(%arg0, %arg1, %arg2 : memref<8x8xf32>, memref<8x8xf32>, memref<8x8xf32>)
// CHECK: ttile.kernel @mm_add(%{{.*}}: memref<8x8xf32>, %{{.*}}: memref<8x8xf32>, %[[RES:.*]]: memref<8x8xf32>, %{{.*}}: memref<8x8xf32>)
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

// No fusion when the matmul's output is needed elsewhere (here: returned).
// The relu alone is tiled as an elementwise kernel over its output.
// CHECK-LABEL: func.func @escapes
// CHECK: tsched.launch @mm on
// CHECK: tsched.launch @relu on
// CHECK: ttile.kernel @relu(%[[X:.*]]: memref<8x8192xf32>, %[[Y:.*]]: memref<8x8192xf32>)
// CHECK-SAME: grid = array<i64: 16>, ttile.tile_sizes = array<i64: 1, 4096>
// CHECK: %[[T:.*]] = ttile.load %[[X]]{{.*}} -> !ttile.tile<1x4096xf32>
// CHECK-NEXT: %[[R:.*]] = ttile.relu %[[T]]
// CHECK-NEXT: ttile.store %[[R]], %[[Y]]
// CHECK: ttile.kernel @mm(
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

func.func @batched(%a: memref<2x4x4xf32>, %b: memref<2x4x4xf32>) -> memref<2x4x4xf32> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<2x4x4xf32>
  tsched.launch @bmm on %s ins(%a, %b : memref<2x4x4xf32>, memref<2x4x4xf32>) outs(%0 : memref<2x4x4xf32>)
  return %0 : memref<2x4x4xf32>
}
func.func private @bmm(%a: tensor<2x4x4xf32>, %b: tensor<2x4x4xf32>) -> tensor<2x4x4xf32> attributes {tsched.kernel} {
  // expected-error @+1 {{tessera-lower-to-tile tiles 2-D matmuls; kernel @bmm has a rank-3 matmul}}
  %0 = tgraph.matmul %a, %b : tensor<2x4x4xf32>, tensor<2x4x4xf32> -> tensor<2x4x4xf32>
  return %0 : tensor<2x4x4xf32>
}
