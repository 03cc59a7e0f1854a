// RUN: tessera-opt %s --split-input-file --tessera-partition --verify-diagnostics | FileCheck %s

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// The tensor-parallel MLP: local shapes, no communication until the result,
// which needs the full value: exactly one all_reduce.
// CHECK-LABEL: func.func @mlp
// CHECK-SAME: %arg1: tensor<16x16xf32>
// CHECK-SAME: %arg2: tensor<16x16xf32>
// CHECK-SAME: attributes {tgraph.partitioned}
func.func @mlp(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], []]>},
               %w1: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
               %w2: tensor<32x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>}) -> tensor<8x16xf32> {
  // CHECK: %[[H:.*]] = tgraph.matmul {{.*}} : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  // CHECK-NEXT: %[[R:.*]] = tgraph.relu %[[H]]
  // CHECK-NEXT: %[[P:.*]] = tgraph.matmul %[[R]]
  // CHECK-NEXT: %[[Y:.*]] = tgraph.all_reduce <sum> %[[P]] on @mesh["tp"] : tensor<8x16xf32>
  // CHECK-NEXT: return %[[Y]]
  %0 = tgraph.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %1 = tgraph.relu %0 : tensor<8x32xf32>
  %2 = tgraph.matmul %1, %w2 : tensor<8x32xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Partial sums stay lazy through a linear add: one all_reduce, after the add.
// CHECK-LABEL: func.func @lazy
// CHECK-COUNT-2: tgraph.matmul
// CHECK-NOT: tgraph.all_reduce
// CHECK: tgraph.add
// CHECK-NEXT: tgraph.all_reduce
// CHECK-NOT: tgraph.all_reduce
func.func @lazy(%x: tensor<4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                %a: tensor<8x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                %b: tensor<8x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>}) -> tensor<4x6xf32> {
  %0 = tgraph.matmul %x, %a : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
  %1 = tgraph.matmul %x, %b : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
  %2 = tgraph.add %0, %1 : tensor<4x6xf32>
  return %2 : tensor<4x6xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// A partial sum wanted split along rows is one reduce_scatter, not all_reduce + slice.
// CHECK-LABEL: func.func @scatter
// CHECK: tgraph.reduce_scatter <sum> %{{.*}} on @mesh["tp"] dim 0 : tensor<4x6xf32> -> tensor<2x6xf32>
// CHECK-NOT: tgraph.all_reduce
func.func @scatter(%x: tensor<4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                   %a: tensor<8x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>})
    -> (tensor<4x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>}) {
  %0 = tgraph.matmul %x, %a : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// A column-split result returned replicated is gathered along dim 1.
// CHECK-LABEL: func.func @gather
// CHECK: tgraph.matmul {{.*}} -> tensor<4x3xf32>
// CHECK: tgraph.all_gather %{{.*}} on @mesh["tp"] dim 1 : tensor<4x3xf32> -> tensor<4x6xf32>
func.func @gather(%x: tensor<4x8xf32>, %w: tensor<8x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>}) -> tensor<4x6xf32> {
  %0 = tgraph.matmul %x, %w : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// On a 2-D mesh, each axis' collective uses that axis only.
// CHECK-LABEL: func.func @mesh2d
// CHECK-SAME: %arg0: tensor<4x8xf32>
// CHECK: tgraph.all_reduce <sum> %{{.*}} on @mesh["tp"] : tensor<4x4xf32>
// CHECK: tgraph.all_gather %{{.*}} on @mesh["dp"] dim 0 : tensor<4x4xf32> -> tensor<8x4xf32>
func.func @mesh2d(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"]]>},
                  %w: tensor<16x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>}) -> tensor<8x4xf32> {
  %0 = tgraph.matmul %x, %w : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @needs_slice(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{needs a local slice, which tessera-partition does not insert yet}}
  %0 = tgraph.shard %x : tensor<8x16xf32> to #tgraph.sharding<@mesh, [["tp"], []]>
  return %0 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @unknown_op(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{tessera-partition does not know how to partition 'arith.addf'}}
  %0 = arith.addf %x, %x : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
