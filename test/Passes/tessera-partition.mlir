// RUN: tessera-opt %s --split-input-file --tessera-partition --verify-diagnostics | FileCheck %s
// RUN: tessera-opt %s --split-input-file --pass-pipeline='builtin.module(tessera-partition{context-parallel=ring})' --verify-diagnostics | FileCheck %s --check-prefix=RING

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
func.func @gather(%x: tensor<4x8xf32>, %w: tensor<8x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>})
    -> (tensor<4x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], []]>}) {
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
                  %w: tensor<16x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>})
    -> (tensor<8x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], []]>}) {
  %0 = tgraph.matmul %x, %w : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Without a result annotation a result keeps the layout it is computed in
// (here rows split over tp); only the pending sum is reduced.
// CHECK-LABEL: func.func @keeps_layout
// CHECK-SAME: -> (tensor<2x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, {{\[\[}}"tp"], []]>})
// CHECK-NOT: tgraph.all_gather
func.func @keeps_layout(%x: tensor<4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                        %w: tensor<8x6xf32>) -> tensor<4x6xf32> {
  %0 = tgraph.matmul %x, %w : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Replicated -> split is a local slice (no communication); split on one
// dimension -> split on another is one all_to_all.
// CHECK-LABEL: func.func @reshards
// CHECK: %[[S:.*]] = tgraph.axis_slice %arg0 on @mesh["tp"] dim 0 : tensor<8x16xf32> -> tensor<4x16xf32>
// CHECK: tgraph.all_to_all %[[S]] on @mesh["tp"] split_dim 1 concat_dim 0 : tensor<4x16xf32> -> tensor<8x8xf32>
// CHECK-NOT: tgraph.all_gather
func.func @reshards(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = tgraph.shard %x : tensor<8x16xf32> to #tgraph.sharding<@mesh, [["tp"], []]>
  %1 = tgraph.shard %0 : tensor<8x16xf32> to #tgraph.sharding<@mesh, [[], ["tp"]]>
  return %1 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// A broadcast or fill another operand needs split is made at the local shape
// instead of being made whole and sliced.
// CHECK-LABEL: func.func @local_broadcast
// CHECK-DAG: tgraph.broadcast %arg1 : tensor<1x16xf32> to tensor<4x16xf32>
// CHECK-DAG: tgraph.fill 2.000000e+00 : tensor<4x16xf32>
// CHECK-NOT: tgraph.axis_slice
func.func @local_broadcast(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                           %b: tensor<1x16xf32>) -> tensor<8x16xf32> {
  %0 = tgraph.broadcast %b : tensor<1x16xf32> to tensor<8x16xf32>
  %1 = tgraph.add %x, %0 : tensor<8x16xf32>
  %2 = tgraph.fill 2.0 : tensor<8x16xf32>
  %3 = tgraph.mul %1, %2 : tensor<8x16xf32>
  return %3 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Softmax over a split dimension: the max is all-reduced right after the local
// max; the sum stays a pending sum until the division needs it.
// CHECK-LABEL: func.func @softmax
// CHECK: %[[M:.*]] = tgraph.reduce <max> {{.*}} -> tensor<4x1xf32>
// CHECK-NEXT: %[[MR:.*]] = tgraph.all_reduce <max> %[[M]] on @mesh["tp"]
// CHECK: tgraph.broadcast %[[MR]]
// CHECK: %[[S:.*]] = tgraph.reduce <sum>
// CHECK-NEXT: %[[SR:.*]] = tgraph.all_reduce <sum> %[[S]] on @mesh["tp"]
// CHECK: tgraph.broadcast %[[SR]] : tensor<4x1xf32> to tensor<4x8xf32>
// CHECK: tgraph.div {{.*}} : tensor<4x8xf32>
func.func @softmax(%x: tensor<4x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>}) -> tensor<4x16xf32> {
  %0 = tgraph.reduce <max> %x dims [1] : tensor<4x16xf32> -> tensor<4x1xf32>
  %1 = tgraph.broadcast %0 : tensor<4x1xf32> to tensor<4x16xf32>
  %2 = tgraph.sub %x, %1 : tensor<4x16xf32>
  %3 = tgraph.exp %2 : tensor<4x16xf32>
  %4 = tgraph.reduce <sum> %3 dims [1] : tensor<4x16xf32> -> tensor<4x1xf32>
  %5 = tgraph.broadcast %4 : tensor<4x1xf32> to tensor<4x16xf32>
  %6 = tgraph.div %3, %5 : tensor<4x16xf32>
  return %6 : tensor<4x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Vocab-parallel embedding: each rank looks up the rows it holds (row_axes)
// and the partial lookups are summed by one all_reduce, not a table gather.
// CHECK-LABEL: func.func @vocab_parallel
// CHECK: %[[G:.*]] = tgraph.gather %arg0[%arg1] {row_axes = ["tp"]{{.*}}} : tensor<6x8xf32>, tensor<5xi32> -> tensor<5x8xf32>
// CHECK-NEXT: tgraph.all_reduce <sum> %[[G]] on @mesh["tp"]
// CHECK-NOT: tgraph.all_gather
func.func @vocab_parallel(%table: tensor<12x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                          %ids: tensor<5xi32>) -> tensor<5x8xf32> {
  %0 = tgraph.gather %table[%ids] : tensor<12x8xf32>, tensor<5xi32> -> tensor<5x8xf32>
  %1 = tgraph.exp %0 : tensor<5x8xf32>
  return %1 : tensor<5x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// A value check keeps its operand's layout and names the axes splitting it
// (the runtime numbers a failing element from this rank's block): the row
// axes when only rows are split, else every dimension's (token ids split
// along the sequence); it reduces a pending sum first.
// CHECK-LABEL: func.func @check_range
// CHECK: %[[T:.*]] = tgraph.check_range %arg0 in [0, 7) or [-100] message "{row} {value}" {row_axes = ["dp"]{{.*}}} : tensor<4xi32>
// CHECK-NOT: all_gather
// CHECK: tgraph.check_range %arg1 in [0, 7) message "{row} {value}" {dim_axes = ["dp", "tp"]{{.*}}} : tensor<2x3xi32>
// CHECK: %[[V:.*]] = tgraph.all_reduce <sum> %arg2 on @mesh["tp"]
// CHECK: tgraph.check_range %[[V]] in [0, 7) message "{row} {value}" {tgraph.sharding = {{.*}}} : tensor<3xi32>
func.func @check_range(%t: tensor<8xi32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"]]>},
                       %u: tensor<4x6xi32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"]]>},
                       %v: tensor<3xi32> {tgraph.sharding = #tgraph.sharding<@mesh, [[]], partial = ["tp"]>})
    -> (tensor<8xi32>, tensor<4x6xi32>, tensor<3xi32>) {
  %0 = tgraph.check_range %t in [0, 7) or [-100] message "{row} {value}" : tensor<8xi32>
  %1 = tgraph.check_range %u in [0, 7) message "{row} {value}" : tensor<4x6xi32>
  %2 = tgraph.check_range %v in [0, 7) message "{row} {value}" : tensor<3xi32>
  return %0, %1, %2 : tensor<8xi32>, tensor<4x6xi32>, tensor<3xi32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Matmul against a row-split weight slices the replicated activation's K
// locally; a pending sum read twice is reduced once.
// CHECK-LABEL: func.func @row_parallel
// CHECK: %[[X:.*]] = tgraph.axis_slice %arg0 on @mesh["tp"] dim 1 : tensor<4x8xf32> -> tensor<4x4xf32>
// CHECK: tgraph.matmul %[[X]], %arg1
// CHECK-COUNT-1: tgraph.all_reduce
// CHECK-NOT: tgraph.all_reduce
func.func @row_parallel(%x: tensor<4x8xf32>,
                        %w: tensor<8x6xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>}) -> tensor<4x6xf32> {
  %0 = tgraph.matmul %x, %w : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
  %1 = tgraph.exp %0 : tensor<4x6xf32>
  %2 = tgraph.log %0 : tensor<4x6xf32>
  %3 = tgraph.add %1, %2 : tensor<4x6xf32>
  return %3 : tensor<4x6xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// Deterministic mode: reductions carry `deterministic` (a fixed tree).
// ZeRO (scatter_partials = ["dp"]): a gradient needed summed is
// reduce-scattered and the update runs on each rank's block.
// CHECK-LABEL: func.func @zero_deterministic
// CHECK: tgraph.reduce_scatter <sum> %{{.*}} on @mesh["dp"] dim 0 deterministic : tensor<8x4xf32> -> tensor<4x4xf32>
// CHECK-NOT: tgraph.all_reduce {{.*}} tensor<8x4xf32>
// CHECK: tgraph.mul {{.*}} : tensor<4x4xf32>
// CHECK: tgraph.all_reduce <sum> %{{.*}} on @mesh["dp"] deterministic : tensor<1x1xf32>
func.func @zero_deterministic(%x: tensor<6x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], []]>},
                              %dy: tensor<6x4xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], []]>})
    -> (tensor<8x4xf32>, tensor<1x1xf32>) attributes {tgraph.deterministic, tgraph.scatter_partials = ["dp"]} {
  %xt = tgraph.transpose %x perm [1, 0] : tensor<6x8xf32> -> tensor<8x6xf32>
  %g = tgraph.matmul %xt, %dy : tensor<8x6xf32>, tensor<6x4xf32> -> tensor<8x4xf32>
  %sq = tgraph.mul %g, %g : tensor<8x4xf32>
  %n = tgraph.reduce <sum> %sq dims [0, 1] : tensor<8x4xf32> -> tensor<1x1xf32>
  return %sq, %n : tensor<8x4xf32>, tensor<1x1xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @unknown_op(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{'arith.addf' has no sharding rule: only tgraph ops can be distributed}}
  %0 = arith.addf %x, %x : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}


// -----

// Sequence-split keys meet head-split queries: one all_to_all moves the
// keys to a head split (Ulysses-style sequence parallelism), and each rank
// runs attention on its heads over whole sequences; out and lse are local.
tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// CHECK-LABEL: func.func @attention
// CHECK: %[[K:.*]] = tgraph.all_to_all %arg1 on @mesh["tp"] split_dim 1 concat_dim 2 : tensor<1x4x4x16xf32> -> tensor<1x2x8x16xf32>
// CHECK: %{{.*}}, %{{.*}} = tgraph.attention %arg0, %[[K]], %[[K]] {{.*}} -> tensor<1x2x8x16xf32>, tensor<1x2x8x1xf32>
func.func @attention(%q: tensor<2x4x8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"], [], []]>},
                     %k: tensor<2x4x8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], [], ["tp"], []]>}) -> tensor<2x4x8x16xf32> {
  %o:2 = tgraph.attention %q, %k, %k {scale = 0.25 : f64} : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32> -> tensor<2x4x8x16xf32>, tensor<2x4x8x1xf32>
  return %o#0 : tensor<2x4x8x16xf32>
}

// -----

// Context parallelism: q, k and v split along the sequence (seq_dim 1 of
// [B, S, H, D]) over cp. Nothing gathers the sequence: all-to-alls trade
// its split for a head split (Ulysses), each rank attends over the whole
// sequence for its heads, and out returns to the sequence split right
// after the op (lse, unread, stays put).
tgraph.mesh @mesh axes = ["cp"] shape = [2]
// CHECK-LABEL: func.func @ulysses
// CHECK-NOT: all_gather
// CHECK: %[[Q:.*]] = tgraph.all_to_all %arg0 on @mesh["cp"] split_dim 2 concat_dim 1 : tensor<1x4x4x8xf32> -> tensor<1x8x2x8xf32>
// CHECK: %[[K:.*]] = tgraph.all_to_all %arg1 on @mesh["cp"] split_dim 2 concat_dim 1 : tensor<1x4x2x8xf32> -> tensor<1x8x1x8xf32>
// CHECK: %[[O:.*]], %{{.*}} = tgraph.attention %[[Q]], %[[K]], %[[K]] {causal, {{.*}}ulysses_axes = ["cp"]} {{.*}} -> tensor<1x8x2x8xf32>, tensor<1x8x2x1xf32>
// CHECK: %[[R:.*]] = tgraph.all_to_all %[[O]] on @mesh["cp"] split_dim 1 concat_dim 2 : tensor<1x8x2x8xf32> -> tensor<1x4x4x8xf32>
// CHECK-NOT: all_to_all
// CHECK: return %[[R]]
func.func @ulysses(%q: tensor<1x8x4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>},
                   %k: tensor<1x8x2x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>})
    -> (tensor<1x8x4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>}) {
  %o:2 = tgraph.attention %q, %k, %k {causal, scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<1x8x4x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32> -> tensor<1x8x4x8xf32>, tensor<1x8x4x1xf32>
  return %o#0 : tensor<1x8x4x8xf32>
}

// -----

// Multi-query heads (one key/value head): q's sequence split is traded for
// its heads; the one key/value head is gathered whole.
tgraph.mesh @mesh axes = ["cp"] shape = [2]
// CHECK-LABEL: func.func @multi_query
// CHECK: %[[Q:.*]] = tgraph.all_to_all %arg0 on @mesh["cp"] split_dim 2 concat_dim 1
// CHECK: %[[K:.*]] = tgraph.all_gather %arg1 on @mesh["cp"] dim 1 : tensor<1x4x1x8xf32> -> tensor<1x8x1x8xf32>
// CHECK: tgraph.attention %[[Q]], %[[K]], %[[K]] {{.*}}ulysses_axes = ["cp"]
func.func @multi_query(%q: tensor<1x8x4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>},
                       %k: tensor<1x8x1x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>}) -> tensor<1x8x4x8xf32> {
  %o:2 = tgraph.attention %q, %k, %k {scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<1x8x4x8xf32>, tensor<1x8x1x8xf32>, tensor<1x8x1x8xf32> -> tensor<1x8x4x8xf32>, tensor<1x8x4x1xf32>
  return %o#0 : tensor<1x8x4x8xf32>
}

// -----

// A sequence split no leading dimension can take (2 grouped key/value
// heads over 4 ranks, one batch row) and the ring cannot either (causal
// attention stripes each rank's 2 positions over 4 ranks) is gathered.
tgraph.mesh @mesh axes = ["cp"] shape = [4]
// CHECK-LABEL: func.func @sequence_gathered
// CHECK: tgraph.all_gather %arg0 on @mesh["cp"] dim 1
// CHECK: tgraph.all_gather %arg1 on @mesh["cp"] dim 1
// CHECK-NOT: ulysses_axes
func.func @sequence_gathered(%q: tensor<1x8x4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>},
                             %k: tensor<1x8x2x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>}) -> tensor<1x8x4x8xf32> {
  %o:2 = tgraph.attention %q, %k, %k {causal, scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<1x8x4x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32> -> tensor<1x8x4x8xf32>, tensor<1x8x4x1xf32>
  return %o#0 : tensor<1x8x4x8xf32>
}

// -----

// Where no head dimension takes the split but the ring can, the sequence
// stays split and the op is marked for tessera-ring-attention (auto:
// Ulysses would gather it).
tgraph.mesh @mesh axes = ["cp"] shape = [4]
// CHECK-LABEL: func.func @ring
// CHECK-NOT: all_gather
// CHECK-NOT: all_to_all
// CHECK: tgraph.attention %arg0, %arg1, %arg1 {ring_axes = ["cp"], {{.*}} : tensor<1x2x4x8xf32>, tensor<1x2x2x8xf32>, tensor<1x2x2x8xf32>
func.func @ring(%q: tensor<1x8x4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>},
                %k: tensor<1x8x2x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>}) -> tensor<1x8x4x8xf32> {
  %o:2 = tgraph.attention %q, %k, %k {scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<1x8x4x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32> -> tensor<1x8x4x8xf32>, tensor<1x8x4x1xf32>
  return %o#0 : tensor<1x8x4x8xf32>
}

// -----

// Multi-query attention's backward with q's heads over tp: each rank's dk
// and dv (of the one key/value head) are its heads' share, a pending sum
// over tp, all-reduced where they are returned.
tgraph.mesh @mesh axes = ["tp"] shape = [2]
// CHECK-LABEL: func.func @multi_query_grad
// CHECK: %{{.*}}, %[[DK:.*]], %[[DV:.*]] = tgraph.attention_grad {{.*}}#tgraph.sharding<@mesh, {{\[\[}}], [], [], []], partial = ["tp"]>
// CHECK: tgraph.all_reduce <sum> %[[DK]] on @mesh["tp"]
// CHECK: tgraph.all_reduce <sum> %[[DV]] on @mesh["tp"]
func.func @multi_query_grad(%q: tensor<1x4x8x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"], [], []]>},
                            %k: tensor<1x1x8x8xf32>,
                            %do: tensor<1x4x8x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"], [], []]>},
                            %lse: tensor<1x4x8x1xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"], [], []]>})
    -> (tensor<1x4x8x8xf32>, tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32>) {
  %g:3 = tgraph.attention_grad %q, %k, %k, %do, %lse, %lse {causal, scale = 0.25 : f64} : tensor<1x4x8x8xf32>, tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32>, tensor<1x4x8x8xf32>, tensor<1x4x8x1xf32>, tensor<1x4x8x1xf32> -> tensor<1x4x8x8xf32>, tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32>
  return %g#0, %g#1, %g#2 : tensor<1x4x8x8xf32>, tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32>
}

// -----

// A linear layer over [B, S, K] rows split along the sequence: each rank
// multiplies its rows by the whole weight, no communication; the weight's
// gradient (contract_rows) is a pending partial sum over cp, all-reduced
// where it is returned.
tgraph.mesh @mesh axes = ["cp"] shape = [2]
// CHECK-LABEL: func.func @rows_over_cp
// CHECK: %[[Y:.*]] = tgraph.matmul %arg0, %arg1 {{.*}} : tensor<2x4x16xf32>, tensor<16x32xf32> -> tensor<2x4x32xf32>
// CHECK: %[[G:.*]] = tgraph.contract_rows %arg0, %[[Y]] {{.*}} : tensor<2x4x16xf32>, tensor<2x4x32xf32> -> tensor<16x32xf32>
// CHECK: tgraph.all_reduce <sum> %[[G]] on @mesh["cp"]
func.func @rows_over_cp(%x: tensor<2x8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], []]>},
                        %w: tensor<16x32xf32>) -> (tensor<2x8x32xf32>, tensor<16x32xf32>) {
  %y = tgraph.matmul %x, %w : tensor<2x8x16xf32>, tensor<16x32xf32> -> tensor<2x8x32xf32>
  %g = tgraph.contract_rows %x, %y : tensor<2x8x16xf32>, tensor<2x8x32xf32> -> tensor<16x32xf32>
  return %y, %g : tensor<2x8x32xf32>, tensor<16x32xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// Rows of x and columns of w split over the same axis. With a transport
// requested, x's rows are gathered (the all_gather carries the transport)
// and w stays split; without one, w is gathered.
// CHECK-LABEL: func.func @column_parallel
// CHECK: %[[G:.*]] = tgraph.all_gather %arg0 on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<8x16xf32> -> tensor<16x16xf32>
// CHECK-NEXT: tgraph.matmul %[[G]], %arg1 {{.*}} : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
// CHECK-LABEL: func.func @weight_gathered
// CHECK: tgraph.all_gather %arg1 on @mesh["tp"] dim 1 : tensor<16x16xf32> -> tensor<16x32xf32>
// CHECK-NOT: transport
func.func @column_parallel(%x: tensor<16x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                           %w: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>})
    -> tensor<16x32xf32> {
  %0 = tgraph.matmul %x, %w {transport = #tgraph.transport<nvshmem>} : tensor<16x16xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}
func.func @weight_gathered(%x: tensor<16x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                           %w: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>})
    -> tensor<16x32xf32> {
  %0 = tgraph.matmul %x, %w : tensor<16x16xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// A row-parallel matmul (K split) whose sum a residual add wants split by
// rows: the reduce_scatter inserted for the add carries the matmul's
// transport; without a transport it has none.
// CHECK-LABEL: func.func @scattered
// CHECK: %[[P:.*]] = tgraph.matmul %arg0, %arg1 {{{.*}}transport = #tgraph.transport<nvshmem>} : tensor<16x8xf32>, tensor<8x32xf32> -> tensor<16x32xf32>
// CHECK-NEXT: %[[S:.*]] = tgraph.reduce_scatter <sum> %[[P]] on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>} : tensor<16x32xf32> -> tensor<8x32xf32>
// CHECK-NEXT: tgraph.add %arg2, %[[S]]
// CHECK-LABEL: func.func @scattered_plain
// CHECK: tgraph.reduce_scatter <sum> %{{.*}} on @mesh["tp"] dim 0 : tensor<16x32xf32> -> tensor<8x32xf32>
func.func @scattered(%h: tensor<16x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                        %w: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                        %r: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>})
    -> tensor<16x32xf32> {
  %0 = tgraph.matmul %h, %w {transport = #tgraph.transport<nvshmem>} : tensor<16x16xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
  %1 = tgraph.add %r, %0 : tensor<16x32xf32>
  return %1 : tensor<16x32xf32>
}
func.func @scattered_plain(%h: tensor<16x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                              %w: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                              %r: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>})
    -> tensor<16x32xf32> {
  %0 = tgraph.matmul %h, %w : tensor<16x16xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
  %1 = tgraph.add %r, %0 : tensor<16x32xf32>
  return %1 : tensor<16x32xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// transport = nvshmem on a matmul whose product is all-reduced (nothing split
// by rows wants it): no collective the GEMM could fuse.
func.func @transport_unused(%h: tensor<16x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>},
                            %w: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>})
    -> tensor<16x32xf32> {
  // expected-error @+1 {{transport = nvshmem: this matmul has no collective to fuse on this mesh (neither an all-gather of its lhs rows nor a reduce-scatter of its product over rows; the fused kernels take a 2-D lhs); use 'auto' to fuse only where one applies}}
  %0 = tgraph.matmul %h, %w {transport = #tgraph.transport<nvshmem>} : tensor<16x16xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
  %1 = tgraph.exp %0 : tensor<16x32xf32>
  return %1 : tensor<16x32xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// A local-view call: the replicated operand is sliced to the rows the
// in-sharding gives each rank, the body's ops (its explicit all_reduce
// included) move into the caller unchanged, the body is erased, and the
// result is the replicated sum the out-sharding declares (no collective
// added after it).
// CHECK-LABEL: func.func @spmd_inlined
// CHECK-NEXT: %[[X:.*]] = tgraph.axis_slice %arg0 on @mesh["dp"] dim 0 : tensor<8x4xf32> -> tensor<4x4xf32>
// CHECK-NEXT: %[[E:.*]] = tgraph.exp %[[X]] : tensor<4x4xf32>
// CHECK-NEXT: %[[S:.*]] = tgraph.all_reduce <sum> %[[E]] on @mesh["dp"] : tensor<4x4xf32>
// CHECK-NEXT: %[[T:.*]] = tgraph.tanh %[[S]] {tgraph.sharding = #tgraph.sharding<@mesh, {{\[}}[], []]>} : tensor<4x4xf32>
// CHECK-NEXT: return %[[T]] : tensor<4x4xf32>
// CHECK-NOT: tgraph.local
func.func @spmd_inlined(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
  %y = tgraph.spmd @spmd_inlined_body(%x) in [#tgraph.sharding<@mesh, [["dp"], []]>] out [#tgraph.sharding<@mesh, [[], []]>] : (tensor<8x4xf32>) -> tensor<4x4xf32>
  %z = tgraph.tanh %y : tensor<4x4xf32>
  return %z : tensor<4x4xf32>
}
func.func private @spmd_inlined_body(%x: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {tgraph.local} {
  %e = tgraph.exp %x : tensor<4x4xf32>
  %s = tgraph.all_reduce <sum> %e on @mesh["dp"] : tensor<4x4xf32>
  return %s : tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// One block returned as two results in different layouts.
func.func @spmd_one_block_two_layouts(%x: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<4x4xf32>) {
  // expected-error @+1 {{the local-view function spmd_twice_body returns one block as two results with different layouts; return a copy for each}}
  %y:2 = tgraph.spmd @spmd_twice_body(%x) in [#tgraph.sharding<@mesh, [["dp"], []]>] out [#tgraph.sharding<@mesh, [["dp"], []]>, #tgraph.sharding<@mesh, [[], []]>] : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<4x4xf32>)
  return %y#0, %y#1 : tensor<8x4xf32>, tensor<4x4xf32>
}
func.func private @spmd_twice_body(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) attributes {tgraph.local} {
  %e = tgraph.exp %x : tensor<4x4xf32>
  return %e, %e : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// Dropout keeps its operand's layout (each rank draws its own block's words:
// dim_axes places the block) and a pending sum (the mask is linear): no
// collective before it.
// CHECK-LABEL: func.func @dropout
// CHECK-NOT: tgraph.all_gather
// CHECK: tgraph.dropout %arg0[%arg2] {dim_axes = ["dp", "tp"]{{.*}}} : tensor<2x4xf32>, tensor<2xi64> -> tensor<2x4xf32>
// CHECK: %[[M:.*]] = tgraph.matmul
// CHECK-NEXT: %[[D:.*]] = tgraph.dropout %[[M]][%arg2] {dim_axes = ["dp", ""]{{.*}}} : tensor<2x8xf32>, tensor<2xi64> -> tensor<2x8xf32>
// CHECK-NEXT: tgraph.all_reduce <sum> %[[D]] on @mesh["tp"]
func.func @dropout(%x: tensor<4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"]]>},
                   %w: tensor<8x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []]>},
                   %key: tensor<2xi64>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %0 = tgraph.dropout %x[%key] {p = 0.25 : f64} : tensor<4x8xf32>, tensor<2xi64> -> tensor<4x8xf32>
  %1 = tgraph.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %2 = tgraph.dropout %1[%key] {p = 0.5 : f64} : tensor<4x8xf32>, tensor<2xi64> -> tensor<4x8xf32>
  %3 = tgraph.exp %2 : tensor<4x8xf32>
  return %0, %3 : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// context-parallel=ring: a sequence split over cp stays split even where
// heads could take it (RING); where another operand splits the batch over
// the same axis (dout of a loss weighted per batch row), the ring cannot
// take it too: the sequence split moves to the batch (all-to-all).
tgraph.mesh @mesh axes = ["cp"] shape = [2]
// RING-LABEL: func.func @ring_forced
// RING: tgraph.attention %arg0, %arg1, %arg1 {ring_axes = ["cp"]
// RING-LABEL: func.func @ring_axis_taken
// RING-NOT: ring_axes
// RING: tgraph.all_to_all %arg0 on @mesh["cp"] split_dim 0 concat_dim 1
// RING-NOT: ring_axes
func.func @ring_forced(%q: tensor<1x8x4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>},
                       %k: tensor<1x8x4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>}) -> tensor<1x8x4x8xf32> {
  %o:2 = tgraph.attention %q, %k, %k {scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<1x8x4x8xf32>, tensor<1x8x4x8xf32>, tensor<1x8x4x8xf32> -> tensor<1x8x4x8xf32>, tensor<1x8x4x1xf32>
  return %o#0 : tensor<1x8x4x8xf32>
}
func.func @ring_axis_taken(%q: tensor<2x8x4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>},
                           %do: tensor<2x8x4x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["cp"], [], [], []]>},
                           %lse: tensor<2x8x4x1xf32>) -> tensor<2x8x4x8xf32> {
  %g:3 = tgraph.attention_grad %q, %q, %q, %do, %lse, %lse {scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x1xf32>, tensor<2x8x4x1xf32> -> tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>
  return %g#0 : tensor<2x8x4x8xf32>
}
