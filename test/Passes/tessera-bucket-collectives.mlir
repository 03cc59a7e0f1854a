// RUN: tessera-opt %s --split-input-file --tessera-bucket-collectives --verify-diagnostics | FileCheck %s

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// Two gradients all-reduced over dp and used only afterwards: one all_reduce of
// both, flattened and concatenated, sliced apart. The tp all_reduce (another
// axis) stays on its own.
// CHECK-LABEL: func.func @grads
// CHECK-DAG: %[[A:.*]] = tgraph.reshape %arg0 : tensor<4x8xf32> to tensor<32xf32>
// CHECK: %[[C:.*]] = tgraph.concat %[[A]], %arg1 dim 0 : tensor<32xf32>, tensor<3xf32> -> tensor<35xf32>
// CHECK: %[[R:.*]] = tgraph.all_reduce <sum> %[[C]] on @mesh["dp"] : tensor<35xf32>
// CHECK-DAG: tgraph.slice %[[R]] offsets [0] : tensor<35xf32> -> tensor<32xf32>
// CHECK-DAG: tgraph.slice %[[R]] offsets [32] : tensor<35xf32> -> tensor<3xf32>
// CHECK-NOT: on @mesh["dp"]
// CHECK: tgraph.all_reduce <sum> %arg2 on @mesh["tp"]
func.func @grads(%a: tensor<4x8xf32>, %b: tensor<3xf32>, %c: tensor<3xf32>)
    -> (tensor<4x8xf32>, tensor<3xf32>, tensor<3xf32>) attributes {tgraph.partitioned} {
  %0 = tgraph.all_reduce <sum> %a on @mesh["dp"] : tensor<4x8xf32>
  %1 = tgraph.all_reduce <sum> %b on @mesh["dp"] : tensor<3xf32>
  %2 = tgraph.all_reduce <sum> %c on @mesh["tp"] : tensor<3xf32>
  %3 = tgraph.exp %0 : tensor<4x8xf32>
  return %3, %1, %2 : tensor<4x8xf32>, tensor<3xf32>, tensor<3xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// The second all_reduce's operand needs the first's result: no fusion.
// Different reductions (sum, max) do not fuse either.
// CHECK-LABEL: func.func @chain
// CHECK: tgraph.all_reduce <sum> %arg0
// CHECK: tgraph.all_reduce <sum> %{{.*}}
// CHECK: tgraph.all_reduce <max> %arg1
// CHECK-NOT: tgraph.concat
func.func @chain(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
    attributes {tgraph.partitioned} {
  %0 = tgraph.all_reduce <sum> %a on @mesh["dp"] : tensor<4xf32>
  %1 = tgraph.exp %0 : tensor<4xf32>
  %2 = tgraph.all_reduce <sum> %1 on @mesh["dp"] : tensor<4xf32>
  %3 = tgraph.all_reduce <max> %b on @mesh["dp"] : tensor<4xf32>
  return %2, %3 : tensor<4xf32>, tensor<4xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// Deterministic all_reduces fuse into a deterministic one (same bits per element).
// CHECK-LABEL: func.func @deterministic
// CHECK: tgraph.all_reduce <sum> %{{.*}} on @mesh["dp"] deterministic : tensor<8xf32>
// CHECK-NOT: tgraph.all_reduce
func.func @deterministic(%a: tensor<4xf32>, %b: tensor<2x2xf32>) -> (tensor<4xf32>, tensor<2x2xf32>)
    attributes {tgraph.partitioned} {
  %0 = tgraph.all_reduce <sum> %a on @mesh["dp"] deterministic : tensor<4xf32>
  %1 = tgraph.all_reduce <sum> %b on @mesh["dp"] deterministic : tensor<2x2xf32>
  return %0, %1 : tensor<4xf32>, tensor<2x2xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
func.func @not_partitioned(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{tgraph.all_reduce in a function that is not partitioned: run tessera-partition before tessera-bucket-collectives}}
  %0 = tgraph.all_reduce <sum> %a on @mesh["dp"] : tensor<4xf32>
  return %0 : tensor<4xf32>
}
