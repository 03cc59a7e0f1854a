// RUN: tessera-opt %s --split-input-file --tessera-propagate-sharding --verify-diagnostics | FileCheck %s

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Column-parallel then row-parallel: the second matmul's result is a partial sum.
// CHECK-LABEL: func.func @mlp
func.func @mlp(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], []]>},
               %w1: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
               %w2: tensor<32x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>}) -> tensor<8x16xf32> {
  // CHECK: tgraph.matmul {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], ["tp"]]>}
  %0 = tgraph.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  // CHECK: tgraph.relu {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], ["tp"]]>}
  %1 = tgraph.relu %0 : tensor<8x32xf32>
  // CHECK: tgraph.matmul {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], []], partial = ["tp"]>}
  %2 = tgraph.matmul %1, %w2 : tensor<8x32xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// Arguments without a sharding are replicated; batch rows follow the lhs, a
// linear add of two partial sums stays partial, relu needs the full value.
// CHECK-LABEL: func.func @mesh2d
func.func @mesh2d(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"]]>},
                  %w: tensor<16x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                  %v: tensor<16x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                  %r: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // CHECK: tgraph.matmul {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []], partial = ["tp"]>}
  %0 = tgraph.matmul %x, %w : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  %1 = tgraph.matmul %x, %v : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  // CHECK: tgraph.add {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []], partial = ["tp"]>}
  %2 = tgraph.add %0, %1 : tensor<8x4xf32>
  // CHECK: tgraph.relu {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"dp"], []]>}
  %3 = tgraph.relu %2 : tensor<8x4xf32>
  // Operands that disagree (rows split vs replicated) meet at the replicated layout.
  // CHECK: tgraph.add {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}], []]>}
  %4 = tgraph.add %3, %r : tensor<8x4xf32>
  return %4 : tensor<8x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// tgraph.shard pins a value's sharding.
// CHECK-LABEL: func.func @pinned
func.func @pinned(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // CHECK: tgraph.shard {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"tp"], []]>}
  %0 = tgraph.shard %x : tensor<8x16xf32> to #tgraph.sharding<@mesh, [["tp"], []]>
  // CHECK: tgraph.relu {{.*}} {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"tp"], []]>}
  %1 = tgraph.relu %0 : tensor<8x16xf32>
  return %1 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @early_collective(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{'tgraph.all_reduce' is a per-rank collective and appears only after tessera-partition}}
  %0 = tgraph.all_reduce <sum> %x on @mesh["tp"] : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @unknown_op(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{tessera-propagate-sharding does not know how to shard 'arith.addf'}}
  %0 = arith.addf %x, %x : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tgraph.mesh @a axes = ["tp"] shape = [2]
tgraph.mesh @b axes = ["tp"] shape = [2]
// expected-error @+1 {{function uses several meshes (a, b)}}
func.func @two_meshes(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@a, [[], []]>},
                      %y: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@b, [[], []]>}) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}
