// RUN: tessera-opt %s --split-input-file --tessera-ring-attention --verify-diagnostics | FileCheck %s

// Attention whose q and k/v sequences stay split over cp (tessera-partition
// marked it ring_axes): step 0 attends over the rank's own key/value block,
// step 1 over the block the ring_shift brought from the rank before; the
// two partial results merge by their log-sum-exp. Nothing gathers.
tgraph.mesh @mesh axes = ["cp"] shape = [2]
// CHECK-LABEL: func.func @ring
// CHECK-NOT: all_gather
// CHECK: %[[O0:.*]], %[[L0:.*]] = tgraph.attention %arg0, %arg1, %arg1 {{.*}}ring_axes = ["cp"]
// CHECK: %[[K1:.*]] = tgraph.ring_shift %arg1 on @mesh["cp"] offset 1 : tensor<1x4x2x8xf32>
// CHECK: %[[O1:.*]], %[[L1:.*]] = tgraph.attention %arg0, %[[K1]], %[[K1]] {{.*}}ring_step = 1
// CHECK: tgraph.max %[[L0]], %[[L1]]
// CHECK: tgraph.log
// CHECK-NOT: tgraph.attention
// CHECK: return
func.func @ring(%q: tensor<1x4x4x8xf32>, %k: tensor<1x4x2x8xf32>) -> tensor<1x4x4x8xf32> attributes {tgraph.partitioned} {
  %o:2 = tgraph.attention %q, %k, %k {ring_axes = ["cp"], scale = 0.25 : f64, seq_dim = 1 : i64, tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>} : tensor<1x4x4x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32> -> tensor<1x4x4x8xf32>, tensor<1x4x4x1xf32>
  return %o#0 : tensor<1x4x4x8xf32>
}

// -----

// Causal attention is striped first (rank r holds positions r, r + 2, ...:
// one all_to_all per operand), so both ranks do the same work. Step 1's
// block of 4 keys gets masked keys in front (document id -2^31): 4 (the
// kernels' blocks stay whole) where the block comes from a rank at or
// before this one (rank >= 1), else 5 and its last key dropped, selected by
// the rank. The result goes back to the contiguous blocks.
tgraph.mesh @mesh axes = ["cp"] shape = [2]
// CHECK-LABEL: func.func @striped
// CHECK: %[[Q:.*]] = tgraph.all_to_all %{{.*}} on @mesh["cp"] split_dim 2 concat_dim 1 : tensor<1x2x2x4x8xf32> -> tensor<1x4x1x4x8xf32>
// CHECK: tgraph.attention {{.*}} {causal, ring_axes = ["cp"]
// CHECK: %[[K1:.*]] = tgraph.ring_shift
// CHECK-NOT: tgraph.ring_shift
// CHECK: %[[C:.*]] = tgraph.iota
// CHECK: %[[R:.*]] = tgraph.axis_slice %[[C]] on @mesh["cp"] dim 0 : tensor<2xi32> -> tensor<1xi32>
// CHECK: %[[F:.*]] = tgraph.compare <ge> %[[R]]
// CHECK: %[[IN:.*]] = tgraph.concat %{{.*}}, %[[K1]] dim 1 : tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32> -> tensor<1x8x4x8xf32>
// CHECK: %[[HEAD:.*]] = tgraph.slice %[[K1]] offsets [0, 0, 0, 0] : tensor<1x4x4x8xf32> -> tensor<1x3x4x8xf32>
// CHECK: %[[OUT:.*]] = tgraph.concat %{{.*}}, %[[HEAD]] dim 1 : tensor<1x5x4x8xf32>, tensor<1x3x4x8xf32> -> tensor<1x8x4x8xf32>
// CHECK: %[[KS:.*]] = tgraph.select %{{.*}}, %[[IN]], %[[OUT]] : tensor<1x8x4x8xi1>, tensor<1x8x4x8xf32>
// CHECK: tgraph.fill 0xC1E0000000000000 : tensor<1x1x4x1xi32>
// CHECK: tgraph.attention %{{.*}}, %[[KS]], %[[KS]] segments({{.*}} : tensor<1x1x4x1xi32>, tensor<1x1x8x1xi32>) {causal, ring_step = 1
// CHECK: tgraph.all_to_all {{.*}} split_dim 1 concat_dim 3 : tensor<1x2x2x1x4x8xf32> -> tensor<1x1x2x2x4x8xf32>
func.func @striped(%q: tensor<1x4x4x8xf32>, %k: tensor<1x4x4x8xf32>) -> tensor<1x4x4x8xf32> attributes {tgraph.partitioned} {
  %o:2 = tgraph.attention %q, %k, %k {causal, ring_axes = ["cp"], scale = 0.25 : f64, seq_dim = 1 : i64, tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>} : tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32> -> tensor<1x4x4x8xf32>, tensor<1x4x4x1xf32>
  return %o#0 : tensor<1x4x4x8xf32>
}

// -----

// The backward: each step's gradients from the global lse and delta; dq
// sums on the rank, dk and dv travel with their block (a shift per step)
// and take one more shift home.
tgraph.mesh @mesh axes = ["cp"] shape = [2]
// CHECK-LABEL: func.func @ring_grad
// CHECK: %[[DQ0:.*]], %[[DK0:.*]], %[[DV0:.*]] = tgraph.attention_grad {{.*}}ring_axes = ["cp"]
// CHECK: %[[K1:.*]] = tgraph.ring_shift %arg1
// CHECK: %[[DK1:.*]] = tgraph.ring_shift %[[DK0]]
// CHECK: %[[DV1:.*]] = tgraph.ring_shift %[[DV0]]
// CHECK: %[[DQ1:.*]], %[[GK:.*]], %[[GV:.*]] = tgraph.attention_grad %arg0, %[[K1]], %[[K1]], {{.*}}ring_step = 1
// CHECK: %[[DK2:.*]] = tgraph.add %[[DK1]], %[[GK]]
// CHECK: %[[DKH:.*]] = tgraph.ring_shift %[[DK2]] on @mesh["cp"] offset 1
// CHECK: return %{{.*}}, %[[DKH]]
func.func @ring_grad(%q: tensor<1x4x4x8xf32>, %k: tensor<1x4x2x8xf32>, %do: tensor<1x4x4x8xf32>, %lse: tensor<1x4x4x1xf32>)
    -> (tensor<1x4x4x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) attributes {tgraph.partitioned} {
  %g:3 = tgraph.attention_grad %q, %k, %k, %do, %lse, %lse {ring_axes = ["cp"], scale = 0.25 : f64, seq_dim = 1 : i64, tgraph.sharding = [#tgraph.sharding<@mesh, [[], ["cp"], [], []]>, #tgraph.sharding<@mesh, [[], ["cp"], [], []]>, #tgraph.sharding<@mesh, [[], ["cp"], [], []]>]} : tensor<1x4x4x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x4x8xf32>, tensor<1x4x4x1xf32>, tensor<1x4x4x1xf32> -> tensor<1x4x4x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>
  return %g#0, %g#1, %g#2 : tensor<1x4x4x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["cp"] shape = [4]
func.func @causal_not_striped(%q: tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32> attributes {tgraph.partitioned} {
  // expected-error @+1 {{causal ring attention stripes its block of 2 positions over 4 ranks, which does not divide it}}
  %o:2 = tgraph.attention %q, %q, %q {causal, ring_axes = ["cp"], scale = 0.25 : f64, seq_dim = 1 : i64, tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>} : tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32> -> tensor<1x2x4x8xf32>, tensor<1x2x4x1xf32>
  return %o#0 : tensor<1x2x4x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["cp"] shape = [2]
func.func @ring_with_window(%q: tensor<1x4x4x8xf32>) -> tensor<1x4x4x8xf32> attributes {tgraph.partitioned} {
  // expected-error @+1 {{ring attention takes no mask, window or dropout}}
  %o:2 = tgraph.attention %q, %q, %q {causal, window = 2 : i64, ring_axes = ["cp"], scale = 0.25 : f64, seq_dim = 1 : i64, tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>} : tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32> -> tensor<1x4x4x8xf32>, tensor<1x4x4x1xf32>
  return %o#0 : tensor<1x4x4x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["cp"] shape = [2]
func.func @ring_over_two_axes(%q: tensor<1x4x4x8xf32>) -> tensor<1x4x4x8xf32> attributes {tgraph.partitioned} {
  // expected-error @+1 {{ring attention runs over one mesh axis, got ring_axes ['cp', 'tp']}}
  %o:2 = tgraph.attention %q, %q, %q {ring_axes = ["cp", "tp"], scale = 0.25 : f64, seq_dim = 1 : i64, tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>} : tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32> -> tensor<1x4x4x8xf32>, tensor<1x4x4x1xf32>
  return %o#0 : tensor<1x4x4x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["cp"] shape = [2]
func.func @ring_axes_not_names(%q: tensor<1x4x4x8xf32>) -> tensor<1x4x4x8xf32> attributes {tgraph.partitioned} {
  // expected-error @+1 {{ring_axes must be an array of axis names, got [1]}}
  %o:2 = tgraph.attention %q, %q, %q {ring_axes = [1], scale = 0.25 : f64, seq_dim = 1 : i64, tgraph.sharding = #tgraph.sharding<@mesh, [[], ["cp"], [], []]>} : tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32> -> tensor<1x4x4x8xf32>, tensor<1x4x4x1xf32>
  return %o#0 : tensor<1x4x4x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["cp"] shape = [2]
func.func @not_partitioned(%q: tensor<1x4x4x8xf32>) -> tensor<1x4x4x8xf32> {
  // expected-error @+1 {{an op marked ring_axes has no tgraph.sharding (run tessera-partition first)}}
  %o:2 = tgraph.attention %q, %q, %q {ring_axes = ["cp"], scale = 0.25 : f64, seq_dim = 1 : i64} : tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32> -> tensor<1x4x4x8xf32>, tensor<1x4x4x1xf32>
  return %o#0 : tensor<1x4x4x8xf32>
}
