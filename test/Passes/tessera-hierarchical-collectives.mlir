// RUN: tessera-opt %s --split-input-file --tessera-hierarchical-collectives=ranks-per-node=2 --verify-diagnostics | FileCheck %s
// RUN: tessera-opt %s --split-input-file --tessera-hierarchical-collectives --verify-diagnostics | FileCheck %s --check-prefix=ONE-NODE

tgraph.mesh @mesh axes = ["dp"] shape = [4]
// dp = 4 on nodes of 2 ranks: a reduce-scatter inside each node ("dp:(2)2",
// dp's minor part), an all-reduce across the 2 nodes ("dp:(1)2", its major
// part) and an all-gather inside each node, over the value flattened and
// padded to a multiple of 2 elements (15 -> 16).
// CHECK-LABEL: func.func @grad
// CHECK: %[[F:.*]] = tgraph.reshape %arg0 : tensor<3x5xf32> to tensor<15xf32>
// CHECK: %[[P:.*]] = tgraph.pad %[[F]] offsets [0] : tensor<15xf32> -> tensor<16xf32>
// CHECK: %[[S:.*]] = tgraph.reduce_scatter <sum> %[[P]] on @mesh["dp:(2)2"] dim 0 : tensor<16xf32> -> tensor<8xf32>
// CHECK: %[[R:.*]] = tgraph.all_reduce <sum> %[[S]] on @mesh["dp:(1)2"] : tensor<8xf32>
// CHECK: %[[G:.*]] = tgraph.all_gather %[[R]] on @mesh["dp:(2)2"] dim 0 : tensor<8xf32> -> tensor<16xf32>
// CHECK: %[[C:.*]] = tgraph.slice %[[G]] offsets [0] : tensor<16xf32> -> tensor<15xf32>
// CHECK: tgraph.reshape %[[C]] : tensor<15xf32> to tensor<3x5xf32>
// CHECK-NOT: on @mesh["dp"]
// ONE-NODE-LABEL: func.func @grad
// ONE-NODE: tgraph.all_reduce <sum> %arg0 on @mesh["dp"] : tensor<3x5xf32>
// ONE-NODE-NOT: reduce_scatter
func.func @grad(%a: tensor<3x5xf32>) -> tensor<3x5xf32> attributes {tgraph.partitioned} {
  %0 = tgraph.all_reduce <sum> %a on @mesh["dp"] : tensor<3x5xf32>
  return %0 : tensor<3x5xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// dp x tp on nodes of 2: each node holds one tp group (stride 1, inside a
// node: stays flat) and each dp group has one rank per node (nothing to
// reduce inside a node: stays flat).
// CHECK-LABEL: func.func @hybrid
// CHECK: tgraph.all_reduce <sum> %arg0 on @mesh["dp"] : tensor<4xf32>
// CHECK: tgraph.all_reduce <max> %arg1 on @mesh["tp"] : tensor<4xf32>
// CHECK-NOT: reduce_scatter
func.func @hybrid(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
    attributes {tgraph.partitioned} {
  %0 = tgraph.all_reduce <sum> %a on @mesh["dp"] : tensor<4xf32>
  %1 = tgraph.all_reduce <max> %b on @mesh["tp"] : tensor<4xf32>
  return %0, %1 : tensor<4xf32>, tensor<4xf32>
}

// -----

tgraph.mesh @mesh axes = ["pp", "dp"] shape = [2, 4]
// pp x dp = 2 x 4 on nodes of 2: each of the two dp groups spans 2 nodes. A
// deterministic all_reduce keeps its fixed tree (2 per node is a power of
// two), and the reduction kind (max) carries over; a size that is a
// multiple of 2 needs no pad.
// CHECK-LABEL: func.func @strided
// CHECK: tgraph.reduce_scatter <max> %arg0 on @mesh["dp:(2)2"] dim 0 deterministic : tensor<8xf32> -> tensor<4xf32>
// CHECK: tgraph.all_reduce <max> %{{.*}} on @mesh["dp:(1)2"] deterministic : tensor<4xf32>
// CHECK: tgraph.all_gather %{{.*}} on @mesh["dp:(2)2"] dim 0 : tensor<4xf32> -> tensor<8xf32>
// CHECK-NOT: tgraph.pad
func.func @strided(%a: tensor<8xf32>) -> tensor<8xf32> attributes {tgraph.partitioned} {
  %0 = tgraph.all_reduce <max> %a on @mesh["dp"] deterministic : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
func.func @not_partitioned(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{tgraph.all_reduce in a function that is not partitioned: run tessera-partition before tessera-hierarchical-collectives}}
  %0 = tgraph.all_reduce <sum> %a on @mesh["dp"] : tensor<4xf32>
  return %0 : tensor<4xf32>
}
