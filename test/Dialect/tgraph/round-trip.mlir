// RUN: tessera-opt %s | tessera-opt | FileCheck %s
// RUN: tessera-opt %s --mlir-print-op-generic | tessera-opt | FileCheck %s

// Every tgraph op, attribute and argument/result/op attribute in its custom
// form, printed, re-parsed and printed again.

// CHECK: tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 4]
tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 4]
// CHECK: tgraph.mesh @line axes = ["x"] shape = [8]
tgraph.mesh @line axes = ["x"] shape = [8]

// CHECK-LABEL: func.func @ops(
// CHECK-SAME: %[[X:.*]]: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, {{\[}}["dp"], []]>},
// CHECK-SAME: %[[W:.*]]: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, {{\[}}[], ["tp"]]>},
// CHECK-SAME: %[[B:.*]]: tensor<4x8x16xf32>, %[[C:.*]]: tensor<4x16x8xf32>, %[[D:.*]]: tensor<?x16xf32> {tgraph.sharding = #tgraph.sharding<@line, {{\[}}["x"], []]>})
// CHECK-SAME: -> (tensor<8x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, {{\[}}["dp"], []], partial = ["tp"]>})
func.func @ops(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], []]>},
               %w: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
               %b: tensor<4x8x16xf32>, %c: tensor<4x16x8xf32>,
               %d: tensor<?x16xf32> {tgraph.sharding = #tgraph.sharding<@line, [["x"], []]>})
    -> (tensor<8x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], []], partial = ["tp"]>}) {
  // CHECK: %[[MM:.*]] = tgraph.matmul %[[X]], %[[W]] {tgraph.sharding = #tgraph.sharding<@mesh, {{\[}}["dp"], ["tp"]]>} : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %0 = tgraph.matmul %x, %w {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"]]>} : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  // CHECK: %[[ADD:.*]] = tgraph.add %[[MM]], %[[MM]] : tensor<8x32xf32>
  %1 = tgraph.add %0, %0 : tensor<8x32xf32>
  // CHECK: %[[RELU:.*]] = tgraph.relu %[[ADD]] : tensor<8x32xf32>
  %2 = tgraph.relu %1 : tensor<8x32xf32>
  // CHECK: tgraph.matmul %[[B]], %[[C]] : tensor<4x8x16xf32>, tensor<4x16x8xf32> -> tensor<4x8x8xf32>
  %3 = tgraph.matmul %b, %c : tensor<4x8x16xf32>, tensor<4x16x8xf32> -> tensor<4x8x8xf32>
  // CHECK: tgraph.matmul %[[B]], %[[C]] {transport = #tgraph.transport<nvshmem>} : tensor<4x8x16xf32>, tensor<4x16x8xf32> -> tensor<4x8x8xf32>
  %t = tgraph.matmul %b, %c {transport = #tgraph.transport<nvshmem>} : tensor<4x8x16xf32>, tensor<4x16x8xf32> -> tensor<4x8x8xf32>
  // CHECK: %[[P:.*]] = tgraph.shard %[[RELU]] : tensor<8x32xf32> to #tgraph.sharding<@mesh, {{\[}}[], []], partial = ["tp"]>
  %4 = tgraph.shard %2 : tensor<8x32xf32> to #tgraph.sharding<@mesh, [[], []], partial = ["tp"]>
  // CHECK: %[[S:.*]] = tgraph.shard %[[P]] : tensor<8x32xf32> to #tgraph.sharding<@mesh, {{\[}}["dp", "tp"], []]>
  %5 = tgraph.shard %4 : tensor<8x32xf32> to #tgraph.sharding<@mesh, [["dp", "tp"], []]>
  // CHECK: return %[[S]] : tensor<8x32xf32>
  return %5 : tensor<8x32xf32>
}

// After partitioning, shapes are per-rank and need not divide by the mesh.
// CHECK-LABEL: func.func @collectives(
// CHECK-SAME: %[[A:.*]]: tensor<8x16xf32>, %[[O:.*]]: tensor<3xf32> {tgraph.sharding = #tgraph.sharding<@mesh, {{\[}}["tp"]]>})
// CHECK-SAME: attributes {tgraph.partitioned}
func.func @collectives(%x: tensor<8x16xf32>, %odd: tensor<3xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"]]>}) -> tensor<8x16xf32> attributes {tgraph.partitioned} {
  // CHECK: %[[R0:.*]] = tgraph.all_reduce <sum> %[[A]] on @mesh["tp"] : tensor<8x16xf32>
  %0 = tgraph.all_reduce <sum> %x on @mesh["tp"] : tensor<8x16xf32>
  // CHECK: %[[R1:.*]] = tgraph.all_reduce <max> %[[R0]] on @mesh["dp"] deterministic : tensor<8x16xf32>
  %1 = tgraph.all_reduce <max> %0 on @mesh["dp"] deterministic : tensor<8x16xf32>
  // CHECK: %[[R2:.*]] = tgraph.all_reduce <min> %[[R1]] on @line["x"] : tensor<8x16xf32>
  %2 = tgraph.all_reduce <min> %1 on @line["x"] : tensor<8x16xf32>
  // CHECK: %[[R3:.*]] = tgraph.all_reduce <prod> %[[R2]] on @mesh["tp"] : tensor<8x16xf32>
  %3 = tgraph.all_reduce <prod> %2 on @mesh["tp"] : tensor<8x16xf32>
  // Sub-axes of tp (size 4): its minor part of size 2, its major part of size 2.
  // CHECK: %[[SUB:.*]] = tgraph.reduce_scatter <sum> %[[R3]] on @mesh["tp:(2)2"] dim 0 : tensor<8x16xf32> -> tensor<4x16xf32>
  %sub = tgraph.reduce_scatter <sum> %3 on @mesh["tp:(2)2"] dim 0 : tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: tgraph.all_reduce <sum> %[[SUB]] on @mesh["tp:(1)2"] : tensor<4x16xf32>
  %sub2 = tgraph.all_reduce <sum> %sub on @mesh["tp:(1)2"] : tensor<4x16xf32>
  // CHECK: %[[G:.*]] = tgraph.all_gather %[[R3]] on @mesh["tp"] dim 1 : tensor<8x16xf32> -> tensor<8x64xf32>
  %4 = tgraph.all_gather %3 on @mesh["tp"] dim 1 : tensor<8x16xf32> -> tensor<8x64xf32>
  // CHECK: %[[RS:.*]] = tgraph.reduce_scatter <sum> %[[G]] on @mesh["tp"] dim 1 : tensor<8x64xf32> -> tensor<8x16xf32>
  %5 = tgraph.reduce_scatter <sum> %4 on @mesh["tp"] dim 1 : tensor<8x64xf32> -> tensor<8x16xf32>
  // CHECK: %[[RS2:.*]] = tgraph.reduce_scatter <max> %[[RS]] on @mesh["dp"] dim 0 deterministic : tensor<8x16xf32> -> tensor<4x16xf32>
  %6 = tgraph.reduce_scatter <max> %5 on @mesh["dp"] dim 0 deterministic : tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: tgraph.reduce_scatter <sum> %[[RS]] on @mesh["dp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<8x16xf32> -> tensor<4x16xf32>
  %rs3 = tgraph.reduce_scatter <sum> %5 on @mesh["dp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: tgraph.all_to_all %[[R3]] on @mesh["tp"] split_dim 0 concat_dim 1 : tensor<8x16xf32> -> tensor<2x64xf32>
  %a2a = tgraph.all_to_all %3 on @mesh["tp"] split_dim 0 concat_dim 1 : tensor<8x16xf32> -> tensor<2x64xf32>
  // CHECK: tgraph.ring_shift %[[R3]] on @mesh["tp"] offset 1 : tensor<8x16xf32>
  %ring = tgraph.ring_shift %3 on @mesh["tp"] offset 1 : tensor<8x16xf32>
  // CHECK: tgraph.all_to_all %[[R3]] on @mesh["tp"] split_dim 0 concat_dim 1 {transport = #tgraph.transport<nvshmem>} : tensor<8x16xf32> -> tensor<2x64xf32>
  %a2a2 = tgraph.all_to_all %3 on @mesh["tp"] split_dim 0 concat_dim 1 {transport = #tgraph.transport<nvshmem>} : tensor<8x16xf32> -> tensor<2x64xf32>
  // A ragged exchange: (send, receive) row counts.
  // CHECK: tgraph.all_to_all %{{.*}} counts(%[[C:.*]], %[[C]] : tensor<4xi32>, tensor<4xi32>) on @mesh["tp"] split_dim 0 concat_dim 1 : tensor<4x2x16xf32> -> tensor<1x8x16xf32>
  %blocks = tgraph.reshape %3 : tensor<8x16xf32> to tensor<4x2x16xf32>
  %counts = tgraph.iota dim 0 : tensor<4xi32>
  %a2a3 = tgraph.all_to_all %blocks counts(%counts, %counts : tensor<4xi32>, tensor<4xi32>) on @mesh["tp"] split_dim 0 concat_dim 1 : tensor<4x2x16xf32> -> tensor<1x8x16xf32>
  // CHECK: tgraph.all_to_all %{{.*}} on @mesh["tp"] split_dim 0 concat_dim 1 {channels = 2 : i64, transport = #tgraph.transport<nvshmem>}
  %a2a4 = tgraph.all_to_all %blocks on @mesh["tp"] split_dim 0 concat_dim 1 {channels = 2 : i64, transport = #tgraph.transport<nvshmem>} : tensor<4x2x16xf32> -> tensor<1x8x16xf32>
  // CHECK: %[[G2:.*]] = tgraph.all_gather %[[RS2]] on @mesh["dp"] dim 0 : tensor<4x16xf32> -> tensor<8x16xf32>
  %7 = tgraph.all_gather %6 on @mesh["dp"] dim 0 : tensor<4x16xf32> -> tensor<8x16xf32>
  // CHECK: return %[[G2]] : tensor<8x16xf32>
  return %7 : tensor<8x16xf32>
}

// The reduction kind attribute on its own.
// CHECK-LABEL: func.func private @reductions()
// CHECK-SAME: kinds = [#tgraph.reduction<sum>, #tgraph.reduction<max>, #tgraph.reduction<min>, #tgraph.reduction<prod>]
func.func private @reductions() attributes {kinds = [#tgraph.reduction<sum>, #tgraph.reduction<max>, #tgraph.reduction<min>, #tgraph.reduction<prod>]}

// The training op set: elementwise, comparisons, casts, constants, shapes,
// indexing and gradients.
// CHECK-LABEL: func.func @training_ops
// CHECK: tgraph.broadcast %{{.*}} : tensor<1x8xf32> to tensor<4x8xf32>
// CHECK: tgraph.sub
// CHECK: tgraph.div
// CHECK: tgraph.rsqrt
// CHECK: tgraph.sin %{{.*}} : tensor<4x8xf32>
// CHECK: tgraph.cos
// CHECK: tgraph.erf
// CHECK: tgraph.abs
// CHECK: tgraph.sign
// CHECK: tgraph.floor
// CHECK: tgraph.ceil
// CHECK: tgraph.pow %{{.*}}, %{{.*}} : tensor<4x8xf32>
// CHECK: tgraph.compare <gt> %{{.*}}, %{{.*}} : tensor<4x8xf32> -> tensor<4x8xi1>
// CHECK: tgraph.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<4x8xi1>, tensor<4x8xf32>
// CHECK: tgraph.reduce <max> %{{.*}} dims [1] : tensor<4x8xf32> -> tensor<4x1xf32>
// CHECK: tgraph.reshape %{{.*}} : tensor<4x1xf32> to tensor<4xf32>
// CHECK: tgraph.iota dim 1 : tensor<4x8xi32>
// CHECK: tgraph.cast %{{.*}} : tensor<4x8xf32> to tensor<4x8xbf16>
// CHECK: tgraph.transpose %{{.*}} perm [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
// CHECK: tgraph.slice %{{.*}} offsets [0, 4] : tensor<4x8xf32> -> tensor<4x4xf32>
// CHECK: tgraph.pad %{{.*}} offsets [0, 4] : tensor<4x4xf32> -> tensor<4x8xf32>
// CHECK: tgraph.concat %{{.*}}, %{{.*}} dim 1 : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x8xf32>
// CHECK: tgraph.gather %{{.*}}[%{{.*}}] : tensor<16x8xf32>, tensor<4xi32> -> tensor<4x8xf32>
// CHECK: tgraph.scatter_add %{{.*}}[%{{.*}}] : tensor<4x8xf32>, tensor<4xi32> -> tensor<16x8xf32>
// CHECK: tgraph.fill 5.000000e-01 : tensor<f32>
// CHECK: tgraph.grad %{{.*}} wrt %{{.*}}, %{{.*}} : tensor<f32>, tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x8xf32>, tensor<16x8xf32>
func.func @training_ops(%x: tensor<4x8xf32>, %b: tensor<1x8xf32>, %ids: tensor<4xi32>, %t: tensor<16x8xf32>, %l: tensor<f32>) -> tensor<4x8xf32> {
  %0 = tgraph.broadcast %b : tensor<1x8xf32> to tensor<4x8xf32>
  %1 = tgraph.sub %x, %0 : tensor<4x8xf32>
  %d = tgraph.div %1, %x : tensor<4x8xf32>
  %r = tgraph.rsqrt %d : tensor<4x8xf32>
  %e1 = tgraph.sin %r : tensor<4x8xf32>
  %e2 = tgraph.cos %e1 : tensor<4x8xf32>
  %e3 = tgraph.erf %e2 : tensor<4x8xf32>
  %e4 = tgraph.abs %e3 : tensor<4x8xf32>
  %e5 = tgraph.sign %e4 : tensor<4x8xf32>
  %e6 = tgraph.floor %e5 : tensor<4x8xf32>
  %e7 = tgraph.ceil %e6 : tensor<4x8xf32>
  %e8 = tgraph.pow %e7, %x : tensor<4x8xf32>
  %2 = tgraph.compare <gt> %1, %x : tensor<4x8xf32> -> tensor<4x8xi1>
  %3 = tgraph.select %2, %1, %x : tensor<4x8xi1>, tensor<4x8xf32>
  %4 = tgraph.reduce <max> %3 dims [1] : tensor<4x8xf32> -> tensor<4x1xf32>
  %5 = tgraph.reshape %4 : tensor<4x1xf32> to tensor<4xf32>
  %6 = tgraph.iota dim 1 : tensor<4x8xi32>
  %7 = tgraph.cast %3 : tensor<4x8xf32> to tensor<4x8xbf16>
  %8 = tgraph.transpose %x perm [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  %9 = tgraph.slice %x offsets [0, 4] : tensor<4x8xf32> -> tensor<4x4xf32>
  %10 = tgraph.pad %9 offsets [0, 4] : tensor<4x4xf32> -> tensor<4x8xf32>
  %11 = tgraph.concat %9, %9 dim 1 : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x8xf32>
  %12 = tgraph.gather %t[%ids] : tensor<16x8xf32>, tensor<4xi32> -> tensor<4x8xf32>
  %13 = tgraph.scatter_add %12[%ids] : tensor<4x8xf32>, tensor<4xi32> -> tensor<16x8xf32>
  %14 = tgraph.fill 5.000000e-01 : tensor<f32>
  %g:2 = tgraph.grad %l wrt %x, %t : tensor<f32>, tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x8xf32>, tensor<16x8xf32>
  return %g#0 : tensor<4x8xf32>
}

// A linear layer over [B, S, K] rows (a 2-D rhs shared by every batch) and
// its weight gradient, every row contracted.
// CHECK-LABEL: func.func @linear_rows
// CHECK: tgraph.matmul %{{.*}}, %{{.*}} : tensor<2x8x16xf32>, tensor<16x32xf32> -> tensor<2x8x32xf32>
// CHECK: tgraph.contract_rows %{{.*}}, %{{.*}} : tensor<2x8x16xf32>, tensor<2x8x32xf32> -> tensor<16x32xf32>
func.func @linear_rows(%x: tensor<2x8x16xf32>, %w: tensor<16x32xf32>) -> tensor<16x32xf32> {
  %0 = tgraph.matmul %x, %w : tensor<2x8x16xf32>, tensor<16x32xf32> -> tensor<2x8x32xf32>
  %1 = tgraph.contract_rows %x, %0 : tensor<2x8x16xf32>, tensor<2x8x32xf32> -> tensor<16x32xf32>
  return %1 : tensor<16x32xf32>
}

// Indices of any rank: token ids [B, S] give rows [B, S, D].
// CHECK-LABEL: func.func @token_rows
// CHECK: tgraph.gather %{{.*}}[%{{.*}}] : tensor<16x8xf32>, tensor<2x3xi32> -> tensor<2x3x8xf32>
// CHECK: tgraph.scatter_add %{{.*}}[%{{.*}}] : tensor<2x3x8xf32>, tensor<2x3xi32> -> tensor<16x8xf32>
func.func @token_rows(%t: tensor<16x8xf32>, %ids: tensor<2x3xi32>) -> tensor<16x8xf32> {
  %0 = tgraph.gather %t[%ids] : tensor<16x8xf32>, tensor<2x3xi32> -> tensor<2x3x8xf32>
  %1 = tgraph.scatter_add %0[%ids] : tensor<2x3x8xf32>, tensor<2x3xi32> -> tensor<16x8xf32>
  return %1 : tensor<16x8xf32>
}

// CHECK-LABEL: func.func @check_range
// CHECK: %[[T:.*]] = tgraph.check_range %{{.*}} in [0, 7) or [-100] message "t {value} at {row}{where}" : tensor<16xi32>
// CHECK: tgraph.check_range %[[T]] in [0, 7) message "t {value} at {row}" {row_axes = ["dp"]} : tensor<16xi32>
// CHECK: tgraph.check_range %{{.*}} in [-2, -2) or [3, 5] message "{row}{value}" : tensor<2x3xi64>
func.func @check_range(%t: tensor<16xi32>, %u: tensor<2x3xi64>) -> tensor<16xi32> {
  %0 = tgraph.check_range %t in [0, 7) or [-100] message "t {value} at {row}{where}" : tensor<16xi32>
  %1 = tgraph.check_range %0 in [0, 7) message "t {value} at {row}" {row_axes = ["dp"]} : tensor<16xi32>
  %2 = tgraph.check_range %u in [-2, -2) or [3, 5] message "{row}{value}" : tensor<2x3xi64>
  return %1 : tensor<16xi32>
}

// CHECK-LABEL: func.func @moe
// CHECK: %[[E:.*]] = tgraph.topk %{{.*}} k 2 : tensor<16x8xf32> -> tensor<16x2xi32>
// CHECK: %[[R:.*]], %[[S:.*]] = tgraph.moe_dispatch %{{.*}}[%[[E]]] experts 8 capacity 0 : tensor<16x4xf32>, tensor<16x2xi32> -> tensor<32x4xf32>, tensor<8xi32>
// CHECK: tgraph.grouped_matmul %[[R]], %{{.*}}, %[[S]] : tensor<32x4xf32>, tensor<8x4x6xf32>, tensor<8xi32> -> tensor<32x6xf32>
// CHECK: tgraph.grouped_matmul %{{.*}}, %{{.*}}, %[[S]] {transpose_rhs} : tensor<32x6xf32>, tensor<8x4x6xf32>, tensor<8xi32> -> tensor<32x4xf32>
// CHECK: tgraph.grouped_outer %[[R]], %{{.*}}, %[[S]] : tensor<32x4xf32>, tensor<32x6xf32>, tensor<8xi32> -> tensor<8x4x6xf32>
// CHECK: tgraph.moe_collect %{{.*}}[%[[E]]] experts 8 capacity 3 : tensor<24x4xf32>, tensor<16x2xi32> -> tensor<16x2x4xf32>
// CHECK: tgraph.moe_dispatch %{{.*}}[%[[E]]] experts 8 capacity 3 : tensor<16x2x4xf32>, tensor<16x2xi32> -> tensor<24x4xf32>, tensor<8xi32>
func.func @moe(%l: tensor<16x8xf32>, %x: tensor<16x4xf32>, %w: tensor<8x4x6xf32>, %c: tensor<24x4xf32>) -> tensor<8x4x6xf32> {
  %e = tgraph.topk %l k 2 : tensor<16x8xf32> -> tensor<16x2xi32>
  %r:2 = tgraph.moe_dispatch %x[%e] experts 8 capacity 0 : tensor<16x4xf32>, tensor<16x2xi32> -> tensor<32x4xf32>, tensor<8xi32>
  %h = tgraph.grouped_matmul %r#0, %w, %r#1 : tensor<32x4xf32>, tensor<8x4x6xf32>, tensor<8xi32> -> tensor<32x6xf32>
  %b = tgraph.grouped_matmul %h, %w, %r#1 {transpose_rhs} : tensor<32x6xf32>, tensor<8x4x6xf32>, tensor<8xi32> -> tensor<32x4xf32>
  %dw = tgraph.grouped_outer %r#0, %h, %r#1 : tensor<32x4xf32>, tensor<32x6xf32>, tensor<8xi32> -> tensor<8x4x6xf32>
  %y = tgraph.moe_collect %c[%e] experts 8 capacity 3 : tensor<24x4xf32>, tensor<16x2xi32> -> tensor<16x2x4xf32>
  %d:2 = tgraph.moe_dispatch %y[%e] experts 8 capacity 3 : tensor<16x2x4xf32>, tensor<16x2xi32> -> tensor<24x4xf32>, tensor<8xi32>
  return %dw : tensor<8x4x6xf32>
}

// CHECK-LABEL: func.func @moe_expert_parallel
// CHECK: tgraph.moe_dispatch %{{.*}}[%{{.*}}, %{{.*}}] experts 8 capacity 3 {blocks = 2 : i64} : tensor<16x4xf32>, tensor<16x2xi32>, tensor<2x8xi32> -> tensor<24x4xf32>, tensor<8xi32>
// CHECK: tgraph.grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} : tensor<24x4xf32>, tensor<4x4x6xf32>, tensor<2x4xi32> -> tensor<24x6xf32>
// CHECK: tgraph.moe_collect %{{.*}}[%{{.*}}, %{{.*}}] experts 8 capacity 3 {blocks = 2 : i64} : tensor<24x4xf32>, tensor<16x2xi32>, tensor<2x8xi32> -> tensor<16x2x4xf32>
func.func @moe_expert_parallel(%x: tensor<16x4xf32>, %e: tensor<16x2xi32>, %b: tensor<2x8xi32>, %w: tensor<4x4x6xf32>, %s: tensor<2x4xi32>) -> tensor<16x2x4xf32> {
  %r:2 = tgraph.moe_dispatch %x[%e, %b] experts 8 capacity 3 {blocks = 2 : i64} : tensor<16x4xf32>, tensor<16x2xi32>, tensor<2x8xi32> -> tensor<24x4xf32>, tensor<8xi32>
  %h = tgraph.grouped_matmul %r#0, %w, %s : tensor<24x4xf32>, tensor<4x4x6xf32>, tensor<2x4xi32> -> tensor<24x6xf32>
  %y = tgraph.moe_collect %r#0[%e, %b] experts 8 capacity 3 {blocks = 2 : i64} : tensor<24x4xf32>, tensor<16x2xi32>, tensor<2x8xi32> -> tensor<16x2x4xf32>
  return %y : tensor<16x2x4xf32>
}

// CHECK-LABEL: func.func @attention
// CHECK: %{{.*}}, %[[LSE:.*]] = tgraph.attention %{{.*}}, %{{.*}}, %{{.*}} {causal, scale = 1.250000e-01 : f64} : tensor<2x64x16xbf16>, tensor<2x64x16xbf16>, tensor<2x64x32xbf16> -> tensor<2x64x32xbf16>, tensor<2x64x1xf32>
// CHECK: tgraph.attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[LSE]], %{{.*}} {causal, scale = 1.250000e-01 : f64} : {{.*}} -> tensor<2x64x16xbf16>, tensor<2x64x16xbf16>, tensor<2x64x32xbf16>
func.func @attention(%q: tensor<2x64x16xbf16>, %k: tensor<2x64x16xbf16>, %v: tensor<2x64x32xbf16>, %d: tensor<2x64x1xf32>) -> tensor<2x64x16xbf16> {
  %o:2 = tgraph.attention %q, %k, %v {causal, scale = 0.125 : f64} : tensor<2x64x16xbf16>, tensor<2x64x16xbf16>, tensor<2x64x32xbf16> -> tensor<2x64x32xbf16>, tensor<2x64x1xf32>
  %g:3 = tgraph.attention_grad %q, %k, %v, %o#0, %o#1, %d {causal, scale = 0.125 : f64} : tensor<2x64x16xbf16>, tensor<2x64x16xbf16>, tensor<2x64x32xbf16>, tensor<2x64x32xbf16>, tensor<2x64x1xf32>, tensor<2x64x1xf32> -> tensor<2x64x16xbf16>, tensor<2x64x16xbf16>, tensor<2x64x32xbf16>
  return %g#0 : tensor<2x64x16xbf16>
}

// Attention along dimension 1 of [B, S, H, D] operands.
// CHECK-LABEL: func.func @attention_seq_dim
// CHECK: tgraph.attention %{{.*}}, %{{.*}}, %{{.*}} {scale = 2.500000e-01 : f64, seq_dim = 1 : i64} : tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32> -> tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>
// CHECK: tgraph.attention_grad {{.*}} {causal, scale = 2.500000e-01 : f64, seq_dim = 1 : i64}
func.func @attention_seq_dim(%q: tensor<2x64x4x16xf32>, %d: tensor<2x64x4x1xf32>) -> tensor<2x64x4x16xf32> {
  %o:2 = tgraph.attention %q, %q, %q {scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32> -> tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>
  %g:3 = tgraph.attention_grad %q, %q, %q, %o#0, %o#1, %d {causal, scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x1xf32>, tensor<2x64x4x1xf32> -> tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>
  return %g#0 : tensor<2x64x4x16xf32>
}

// Grouped key/value heads (8 query heads over 2), a query block at an
// offset (16 queries over 64 keys), a key-padding mask, packed documents,
// a sliding window and a soft cap; the gradient takes the same masks.
// CHECK-LABEL: func.func @attention_masks
// CHECK: tgraph.attention %{{.*}}, %{{.*}}, %{{.*}} mask(%{{.*}} : tensor<2x1x1x64xf32>) segments(%{{.*}}, %{{.*}} : tensor<2x1x16x1xi32>, tensor<2x1x64x1xi32>) {causal, scale = 2.500000e-01 : f64, softcap = 3.000000e+01 : f64, window = 32 : i64} : tensor<2x8x16x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32> -> tensor<2x8x16x16xf32>, tensor<2x8x16x1xf32>
// CHECK: tgraph.attention_grad {{.*}} mask(%{{.*}} : tensor<2x1x1x64xf32>) segments({{.*}}) {causal, scale = 2.500000e-01 : f64, window = 32 : i64}
func.func @attention_masks(%q: tensor<2x8x16x16xf32>, %k: tensor<2x2x64x16xf32>, %m: tensor<2x1x1x64xf32>, %qs: tensor<2x1x16x1xi32>, %ks: tensor<2x1x64x1xi32>, %d: tensor<2x8x16x1xf32>) -> tensor<2x2x64x16xf32> {
  %o:2 = tgraph.attention %q, %k, %k mask(%m : tensor<2x1x1x64xf32>) segments(%qs, %ks : tensor<2x1x16x1xi32>, tensor<2x1x64x1xi32>) {causal, scale = 0.25 : f64, softcap = 30.0 : f64, window = 32 : i64} : tensor<2x8x16x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32> -> tensor<2x8x16x16xf32>, tensor<2x8x16x1xf32>
  %g:3 = tgraph.attention_grad %q, %k, %k, %o#0, %o#1, %d mask(%m : tensor<2x1x1x64xf32>) segments(%qs, %ks : tensor<2x1x16x1xi32>, tensor<2x1x64x1xi32>) {causal, scale = 0.25 : f64, window = 32 : i64} : tensor<2x8x16x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x8x16x16xf32>, tensor<2x8x16x1xf32>, tensor<2x8x16x1xf32> -> tensor<2x8x16x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>
  return %g#1 : tensor<2x2x64x16xf32>
}

// A KV cache written at a run-time position, and a block read back.
// CHECK-LABEL: func.func @dynamic_slices
// CHECK: tgraph.dynamic_update_slice %{{.*}}[%{{.*}}] = %{{.*}} {dim = 1 : i64} : tensor<2x64x8xf32>, tensor<i32>, tensor<2x1x8xf32> -> tensor<2x64x8xf32>
// CHECK: tgraph.dynamic_slice %{{.*}}[%{{.*}}] {dim = 1 : i64} : tensor<2x64x8xf32>, tensor<i32> -> tensor<2x4x8xf32>
func.func @dynamic_slices(%cache: tensor<2x64x8xf32>, %kv: tensor<2x1x8xf32>, %at: tensor<i32>) -> tensor<2x4x8xf32> {
  %c = tgraph.dynamic_update_slice %cache[%at] = %kv {dim = 1 : i64} : tensor<2x64x8xf32>, tensor<i32>, tensor<2x1x8xf32> -> tensor<2x64x8xf32>
  %r = tgraph.dynamic_slice %c[%at] {dim = 1 : i64} : tensor<2x64x8xf32>, tensor<i32> -> tensor<2x4x8xf32>
  return %r : tensor<2x4x8xf32>
}

// CHECK-LABEL: func.func @spmd_call
// CHECK: tgraph.spmd @spmd_body(%{{.*}}) in [#tgraph.sharding<@mesh, {{\[}}["tp"], []]>] out [#tgraph.sharding<@mesh, {{\[}}[], []], partial = ["tp"]>] : (tensor<8x4xf32>) -> tensor<2x4xf32>
// CHECK: func.func private @spmd_body({{.*}}) -> tensor<2x4xf32> attributes {tgraph.local}
func.func @spmd_call(%x: tensor<8x4xf32>) -> tensor<2x4xf32> {
  %y = tgraph.spmd @spmd_body(%x) in [#tgraph.sharding<@mesh, [["tp"], []]>] out [#tgraph.sharding<@mesh, [[], []], partial = ["tp"]>] : (tensor<8x4xf32>) -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}
func.func private @spmd_body(%x: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {tgraph.local} {
  %s = tgraph.all_reduce <sum> %x on @mesh["tp"] : tensor<2x4xf32>
  return %x : tensor<2x4xf32>
}

// Per-rank code's sends and receives (each rank's program holds its half).
// CHECK-LABEL: func.func private @peers
// CHECK: tgraph.send %{{.*}} on @mesh["tp"] to 1 : tensor<4x8xf32>
// CHECK: tgraph.recv on @mesh["tp"] from 3 : tensor<2x2xf32>
func.func private @peers(%x: tensor<4x8xf32>) -> tensor<2x2xf32> attributes {tgraph.local} {
  tgraph.send %x on @mesh["tp"] to 1 : tensor<4x8xf32>
  %0 = tgraph.recv on @mesh["tp"] from 3 : tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}

// Pipeline transfers: to one rank, and to every rank of the axis (a broadcast).
// CHECK-LABEL: func.func @transfers
// CHECK: tgraph.transfer %{{.*}} on @mesh["tp"] from 0 to 3 : tensor<4x8xf32>
// CHECK: tgraph.transfer %{{.*}} on @mesh["tp"] from 2 : tensor<4x8xf32>
func.func @transfers(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {tgraph.pipeline = {axis = "tp", schedule = "1F1B", microbatches = 2 : i64}} {
  %0 = tgraph.transfer %x on @mesh["tp"] from 0 to 3 : tensor<4x8xf32>
  %1 = tgraph.transfer %0 on @mesh["tp"] from 2 : tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}

// Recomputation marks: a region's ops (tessera.remat) and autodiff's copies.
// CHECK-LABEL: func.func @remat_marks
// CHECK: tgraph.tanh %{{.*}} {tgraph.remat = {policy = "dots_saveable", region = 3 : i64}} : tensor<4xf32>
// CHECK: tgraph.tanh %{{.*}} {tgraph.recompute = 3 : i64} : tensor<4xf32>
func.func @remat_marks(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %0 = tgraph.tanh %x {tgraph.remat = {policy = "dots_saveable", region = 3 : i64}} : tensor<4xf32>
  %1 = tgraph.tanh %x {tgraph.recompute = 3 : i64} : tensor<4xf32>
  return %0, %1 : tensor<4xf32>, tensor<4xf32>
}

// Dropout by counter-based random bits of (key, global index); after
// partitioning, the axes splitting each dimension.
// CHECK-LABEL: func.func @dropout
// CHECK: tgraph.dropout %{{.*}}[%{{.*}}] {p = 1.000000e-01 : f64} : tensor<4x8xf32>, tensor<2xi64> -> tensor<4x8xf32>
// CHECK: tgraph.dropout %{{.*}}[%{{.*}}] {dim_axes = ["dp", ""], p = 5.000000e-01 : f64} : tensor<4x8xbf16>, tensor<2xi64> -> tensor<4x8xbf16>
func.func @dropout(%x: tensor<4x8xf32>, %y: tensor<4x8xbf16>, %key: tensor<2xi64>) -> (tensor<4x8xf32>, tensor<4x8xbf16>) {
  %0 = tgraph.dropout %x[%key] {p = 0.1 : f64} : tensor<4x8xf32>, tensor<2xi64> -> tensor<4x8xf32>
  %1 = tgraph.dropout %y[%key] {p = 0.5 : f64, dim_axes = ["dp", ""]} : tensor<4x8xbf16>, tensor<2xi64> -> tensor<4x8xbf16>
  return %0, %1 : tensor<4x8xf32>, tensor<4x8xbf16>
}

// Attention with dropout of its probabilities: (seed, step, head) per head.
// CHECK-LABEL: func.func @attention_dropout
// CHECK: tgraph.attention %arg0, %arg0, %arg0 dropout(%arg1 : tensor<2x4x1x3xi64>) {dropout_p = 1.000000e-01 : f64, scale = 2.500000e-01 : f64}
// CHECK: tgraph.attention_grad %arg0, %arg0, %arg0, %arg0, %{{.*}}, %{{.*}} dropout(%arg1 : tensor<2x4x1x3xi64>) {dropout_p = 1.000000e-01 : f64, scale = 2.500000e-01 : f64}
func.func @attention_dropout(%q: tensor<2x4x8x16xf32>, %sd: tensor<2x4x1x3xi64>) -> tensor<2x4x8x16xf32> {
  %o:2 = tgraph.attention %q, %q, %q dropout(%sd : tensor<2x4x1x3xi64>) {scale = 0.25 : f64, dropout_p = 0.1 : f64} : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32> -> tensor<2x4x8x16xf32>, tensor<2x4x8x1xf32>
  %g:3 = tgraph.attention_grad %q, %q, %q, %q, %o#1, %o#1 dropout(%sd : tensor<2x4x1x3xi64>) {scale = 0.25 : f64, dropout_p = 0.1 : f64} : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x1xf32>, tensor<2x4x8x1xf32> -> tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>
  return %g#0 : tensor<2x4x8x16xf32>
}
