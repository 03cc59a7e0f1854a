// RUN: tessera-opt %s --split-input-file --tessera-autodiff --verify-diagnostics | FileCheck %s

// The backward of matmul + relu + cross-entropy (as tessera.op traces it:
// log-softmax, a one-hot mask of the labels, a mean over the rows).
// CHECK-LABEL: func.func @loss
// CHECK-NOT: tgraph.grad
// After the forward ops: the seed d loss / d loss = 1, then the mean's division.
// CHECK: %[[LOSS:.*]] = tgraph.div %[[SUM:.*]], %[[COUNT:.*]] : tensor<f32>
// CHECK-NEXT: %[[SEED:.*]] = tgraph.fill 1.000000e+00 : tensor<f32>
// CHECK-NEXT: tgraph.div %[[SEED]], %[[COUNT]] : tensor<f32>
// The log-softmax: the row sum's cotangent is broadcast back over the
// classes, the max's goes to the elements equal to it...
// CHECK: tgraph.broadcast %{{.*}} : tensor<4x1xf32> to tensor<4x5xf32>
// CHECK: tgraph.compare <eq> %[[MM:.*]], %{{.*}} : tensor<4x5xf32> -> tensor<4x5xi1>
// ...the relu passes the cotangent where its input was positive...
// CHECK: %[[POS:.*]] = tgraph.compare <gt> %{{.*}}, %{{.*}} : tensor<4x5xf32> -> tensor<4x5xi1>
// CHECK: %[[DRELU:.*]] = tgraph.select %[[POS]], %{{.*}}, %{{.*}} : tensor<4x5xi1>, tensor<4x5xf32>
// ...and the matmul's rule gives d w = x^T @ d y.
// CHECK: %[[XT:.*]] = tgraph.transpose %arg0 perm [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
// CHECK: %[[DW:.*]] = tgraph.matmul %[[XT]], %[[DRELU]] : tensor<8x4xf32>, tensor<4x5xf32> -> tensor<8x5xf32>
// CHECK: return %[[LOSS]], %[[DW]] : tensor<f32>, tensor<8x5xf32>
func.func @loss(%x: tensor<4x8xf32>, %w: tensor<8x5xf32>, %labels: tensor<4xi32>) -> (tensor<f32>, tensor<8x5xf32>) {
  %0 = tgraph.matmul %x, %w : tensor<4x8xf32>, tensor<8x5xf32> -> tensor<4x5xf32>
  %1 = tgraph.relu %0 : tensor<4x5xf32>
  %2 = tgraph.reshape %labels : tensor<4xi32> to tensor<4x1xi32>
  %3 = tgraph.iota dim 1 : tensor<4x5xi32>
  %4 = tgraph.broadcast %2 : tensor<4x1xi32> to tensor<4x5xi32>
  %5 = tgraph.compare <eq> %4, %3 : tensor<4x5xi32> -> tensor<4x5xi1>
  %8 = tgraph.fill 1.000000e+00 : tensor<4x5xf32>
  %9 = tgraph.fill 0.000000e+00 : tensor<4x5xf32>
  %10 = tgraph.select %5, %8, %9 : tensor<4x5xi1>, tensor<4x5xf32>
  %11 = tgraph.reduce <sum> %10 dims [1] : tensor<4x5xf32> -> tensor<4x1xf32>
  %12 = tgraph.reshape %11 : tensor<4x1xf32> to tensor<4xf32>
  %13 = tgraph.reduce <max> %1 dims [1] : tensor<4x5xf32> -> tensor<4x1xf32>
  %14 = tgraph.broadcast %13 : tensor<4x1xf32> to tensor<4x5xf32>
  %15 = tgraph.sub %1, %14 : tensor<4x5xf32>
  %16 = tgraph.exp %15 : tensor<4x5xf32>
  %17 = tgraph.reduce <sum> %16 dims [1] : tensor<4x5xf32> -> tensor<4x1xf32>
  %18 = tgraph.log %17 : tensor<4x1xf32>
  %19 = tgraph.broadcast %18 : tensor<4x1xf32> to tensor<4x5xf32>
  %20 = tgraph.sub %15, %19 : tensor<4x5xf32>
  %21 = tgraph.mul %20, %10 : tensor<4x5xf32>
  %22 = tgraph.reduce <sum> %21 dims [1] : tensor<4x5xf32> -> tensor<4x1xf32>
  %23 = tgraph.reshape %22 : tensor<4x1xf32> to tensor<4xf32>
  %24 = tgraph.neg %23 : tensor<4xf32>
  %25 = tgraph.reduce <sum> %12 dims [0] : tensor<4xf32> -> tensor<1xf32>
  %26 = tgraph.reshape %25 : tensor<1xf32> to tensor<f32>
  %27 = tgraph.fill 1.000000e+00 : tensor<f32>
  %28 = tgraph.max %26, %27 : tensor<f32>
  %29 = tgraph.reduce <sum> %24 dims [0] : tensor<4xf32> -> tensor<1xf32>
  %30 = tgraph.reshape %29 : tensor<1xf32> to tensor<f32>
  %31 = tgraph.div %30, %28 : tensor<f32>
  %32 = tgraph.grad %31 wrt %w : tensor<f32>, tensor<8x5xf32> -> tensor<8x5xf32>
  return %31, %32 : tensor<f32>, tensor<8x5xf32>
}

// -----

// A value the loss does not depend on gets a zero gradient; two gradients of
// one loss share the backward code.
// CHECK-LABEL: func.func @unused
// CHECK: %[[ZERO:.*]] = tgraph.fill 0.000000e+00 : tensor<3xf32>
// CHECK: return %{{.*}}, %[[ZERO]]
func.func @unused(%a: tensor<2xf32>, %b: tensor<3xf32>) -> (tensor<2xf32>, tensor<3xf32>) {
  %0 = tgraph.mul %a, %a : tensor<2xf32>
  %1 = tgraph.reduce <sum> %0 dims [0] : tensor<2xf32> -> tensor<1xf32>
  %2 = tgraph.reshape %1 : tensor<1xf32> to tensor<f32>
  %g:2 = tgraph.grad %2 wrt %a, %b : tensor<f32>, tensor<2xf32>, tensor<3xf32> -> tensor<2xf32>, tensor<3xf32>
  return %g#0, %g#1 : tensor<2xf32>, tensor<3xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @through_a_collective(%a: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{no derivative rule for 'tgraph.all_reduce'}}
  %0 = tgraph.all_reduce <sum> %a on @mesh["tp"] : tensor<2xf32>
  %1 = tgraph.reduce <sum> %0 dims [0] : tensor<2xf32> -> tensor<1xf32>
  %2 = tgraph.reshape %1 : tensor<1xf32> to tensor<f32>
  %g = tgraph.grad %2 wrt %a : tensor<f32>, tensor<2xf32> -> tensor<2xf32>
  return %g : tensor<2xf32>
}

// -----

// Attention's backward is one tgraph.attention_grad fed by the forward's
// log-sum-exp and delta = rowsum(dout * out).
// CHECK-LABEL: func.func @attention
// CHECK: %[[OUT:.*]], %[[LSE:.*]] = tgraph.attention %arg0, %arg1, %arg2 {causal
// CHECK: %[[DOUT:.*]] = tgraph.broadcast
// CHECK: %[[P:.*]] = tgraph.mul %[[DOUT]], %[[OUT]]
// CHECK: %[[DELTA:.*]] = tgraph.reduce <sum> %[[P]] dims [2] : tensor<2x8x4xf32> -> tensor<2x8x1xf32>
// CHECK: %[[DQ:.*]], %{{.*}}, %{{.*}} = tgraph.attention_grad %arg0, %arg1, %arg2, %[[DOUT]], %[[LSE]], %[[DELTA]] {causal, scale = 5.000000e-01 : f64}
// CHECK: return %[[DQ]]
func.func @attention(%q: tensor<2x8x4xf32>, %k: tensor<2x8x4xf32>, %v: tensor<2x8x4xf32>) -> tensor<2x8x4xf32> {
  %o:2 = tgraph.attention %q, %k, %v {causal, scale = 0.5 : f64} : tensor<2x8x4xf32>, tensor<2x8x4xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2x8x1xf32>
  %0 = tgraph.reduce <sum> %o#0 dims [0, 1, 2] : tensor<2x8x4xf32> -> tensor<1x1x1xf32>
  %1 = tgraph.reshape %0 : tensor<1x1x1xf32> to tensor<f32>
  %g = tgraph.grad %1 wrt %q : tensor<f32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return %g : tensor<2x8x4xf32>
}

// -----

func.func @lse(%q: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{the log-sum-exp result of tgraph.attention is not differentiable}}
  %o:2 = tgraph.attention %q, %q, %q {scale = 0.5 : f64} : tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32> -> tensor<8x4xf32>, tensor<8x1xf32>
  %0 = tgraph.reduce <sum> %o#1 dims [0, 1] : tensor<8x1xf32> -> tensor<1x1xf32>
  %1 = tgraph.reshape %0 : tensor<1x1xf32> to tensor<f32>
  %g = tgraph.grad %1 wrt %q : tensor<f32>, tensor<8x4xf32> -> tensor<8x4xf32>
  return %g : tensor<8x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// Through per-rank code: the gradient is a second tgraph.spmd whose body
// runs reverse mode over the forward body. w is replicated but each rank's
// rows of x give its own contribution, so w's cotangent is a pending sum
// over dp (partial out-sharding); the all_reduce's cotangent passes on. The
// backward reads nothing the forward computed (only x and w): none of the
// forward is recomputed, its all_reduce included.
// CHECK-LABEL: func.func @through_spmd
// CHECK: %[[G:.*]]:2 = tgraph.spmd @through_spmd_body_vjp(%arg0, %arg1, %{{.*}}) in [#tgraph.sharding<@mesh, {{\[}}["dp"], []]>, #tgraph.sharding<@mesh, {{\[}}[], []]>, #tgraph.sharding<@mesh, []>] out [#tgraph.sharding<@mesh, {{\[}}["dp"], []]>, #tgraph.sharding<@mesh, {{\[}}[], []], partial = ["dp"]>]
// CHECK: return %[[G]]#1
// CHECK: func.func private @through_spmd_body_vjp(%{{.*}}: tensor<2x3xf32>, %{{.*}}: tensor<3x2xf32>, %{{.*}}: tensor<f32>) -> (tensor<2x3xf32>, tensor<3x2xf32>) attributes {tgraph.local}
// CHECK-NOT: tgraph.all_reduce
// CHECK: tgraph.matmul
// CHECK-NOT: tgraph.all_reduce
// CHECK: return
func.func @through_spmd(%x: tensor<4x3xf32>, %w: tensor<3x2xf32>) -> tensor<3x2xf32> {
  %l = tgraph.spmd @through_spmd_body(%x, %w) in [#tgraph.sharding<@mesh, [["dp"], []]>, #tgraph.sharding<@mesh, [[], []]>] out [#tgraph.sharding<@mesh, []>] : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<f32>
  %g = tgraph.grad %l wrt %w : tensor<f32>, tensor<3x2xf32> -> tensor<3x2xf32>
  return %g : tensor<3x2xf32>
}
func.func private @through_spmd_body(%x: tensor<2x3xf32>, %w: tensor<3x2xf32>) -> tensor<f32> attributes {tgraph.local} {
  %y = tgraph.matmul %x, %w : tensor<2x3xf32>, tensor<3x2xf32> -> tensor<2x2xf32>
  %r = tgraph.reduce <sum> %y dims [0, 1] : tensor<2x2xf32> -> tensor<1x1xf32>
  %s = tgraph.reshape %r : tensor<1x1xf32> to tensor<f32>
  %t = tgraph.all_reduce <sum> %s on @mesh["dp"] : tensor<f32>
  return %t : tensor<f32>
}

// -----

// A ragged all_to_all (an MoE layer's exchange) sends its cotangent back
// the way it came: split and concat dims swapped, and its (send, receive)
// row counts too.
// CHECK-LABEL: func.func private @ragged_body_vjp(
// CHECK-SAME: %[[X:[^:]*]]: tensor<2x4x3xf32>, %[[SENT:[^:]*]]: tensor<2xi32>, %[[GOT:[^:]*]]: tensor<2xi32>, %[[CT:[^:]*]]: tensor<1x8x3xf32>
// CHECK: tgraph.all_to_all %[[CT]] counts(%[[GOT]], %[[SENT]] : tensor<2xi32>, tensor<2xi32>) on @mesh["ep"] split_dim 1 concat_dim 0
tgraph.mesh @mesh axes = ["ep"] shape = [2]
func.func @ragged(%x: tensor<4x4x3xf32>, %sent: tensor<4xi32>, %got: tensor<4xi32>) -> tensor<4x4x3xf32> {
  %l = tgraph.spmd @ragged_body(%x, %sent, %got) in [#tgraph.sharding<@mesh, [["ep"], [], []]>, #tgraph.sharding<@mesh, [["ep"]]>, #tgraph.sharding<@mesh, [["ep"]]>] out [#tgraph.sharding<@mesh, [["ep"], [], []]>] : (tensor<4x4x3xf32>, tensor<4xi32>, tensor<4xi32>) -> tensor<2x8x3xf32>
  %r = tgraph.reduce <sum> %l dims [0, 1, 2] : tensor<2x8x3xf32> -> tensor<1x1x1xf32>
  %s = tgraph.reshape %r : tensor<1x1x1xf32> to tensor<f32>
  %g = tgraph.grad %s wrt %x : tensor<f32>, tensor<4x4x3xf32> -> tensor<4x4x3xf32>
  return %g : tensor<4x4x3xf32>
}
func.func private @ragged_body(%x: tensor<2x4x3xf32>, %sent: tensor<2xi32>, %got: tensor<2xi32>) -> tensor<1x8x3xf32> attributes {tgraph.local} {
  %y = tgraph.all_to_all %x counts(%sent, %got : tensor<2xi32>, tensor<2xi32>) on @mesh["ep"] split_dim 0 concat_dim 1 : tensor<2x4x3xf32> -> tensor<1x8x3xf32>
  return %y : tensor<1x8x3xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
func.func @max_all_reduce(%x: tensor<4xf32>) -> tensor<4xf32> {
  %l = tgraph.spmd @max_body(%x) in [#tgraph.sharding<@mesh, [["dp"]]>] out [#tgraph.sharding<@mesh, [[]]>] : (tensor<4xf32>) -> tensor<2xf32>
  %r = tgraph.reduce <sum> %l dims [0] : tensor<2xf32> -> tensor<1xf32>
  %s = tgraph.reshape %r : tensor<1xf32> to tensor<f32>
  %g = tgraph.grad %s wrt %x : tensor<f32>, tensor<4xf32> -> tensor<4xf32>
  return %g : tensor<4xf32>
}
func.func private @max_body(%x: tensor<2xf32>) -> tensor<2xf32> attributes {tgraph.local} {
  // expected-error @+1 {{tessera-autodiff: no derivative for a 'max' all_reduce}}
  %m = tgraph.all_reduce <max> %x on @mesh["dp"] : tensor<2xf32>
  return %m : tensor<2xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
func.func @through_send(%x: tensor<4xf32>) -> tensor<4xf32> {
  %l = tgraph.spmd @send_body(%x) in [#tgraph.sharding<@mesh, [["dp"]]>] out [#tgraph.sharding<@mesh, [["dp"]]>] : (tensor<4xf32>) -> tensor<4xf32>
  %r = tgraph.reduce <sum> %l dims [0] : tensor<4xf32> -> tensor<1xf32>
  %s = tgraph.reshape %r : tensor<1xf32> to tensor<f32>
  %g = tgraph.grad %s wrt %x : tensor<f32>, tensor<4xf32> -> tensor<4xf32>
  return %g : tensor<4xf32>
}
func.func private @send_body(%x: tensor<2xf32>) -> tensor<2xf32> attributes {tgraph.local} {
  // expected-error @+1 {{tessera-autodiff: no derivative through per-rank sends and receives ('tgraph.send' in send_body)}}
  tgraph.send %x on @mesh["dp"] to 1 : tensor<2xf32>
  %r = tgraph.recv on @mesh["dp"] from 1 : tensor<2xf32>
  return %r : tensor<2xf32>
}

// -----

// Recomputation (ts.remat, policy nothing_saveable): the region's forward is
// copied right before its backward, each copy marked tgraph.recompute; the
// tanh's VJP reads the copy, so the forward tanh dies with its last forward
// use. The region marks are consumed.
// CHECK-LABEL: func.func @remat_nothing_saveable
// CHECK-NOT: tgraph.remat
// CHECK: %[[MM:.*]] = tgraph.matmul %arg0, %arg1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
// CHECK-NEXT: %[[TANH:.*]] = tgraph.tanh %[[MM]] : tensor<4x8xf32>
// CHECK-NEXT: %[[SUM:.*]] = tgraph.reduce <sum> %[[TANH]]
// CHECK: %[[MM2:.*]] = tgraph.matmul %arg0, %arg1 {tgraph.recompute = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
// CHECK-NEXT: %[[TANH2:.*]] = tgraph.tanh %[[MM2]] {tgraph.recompute = 0 : i64} : tensor<4x8xf32>
// CHECK: tgraph.mul %[[TANH2]], %[[TANH2]] : tensor<4x8xf32>
// CHECK-NOT: tgraph.mul %[[TANH]]
// CHECK: return
func.func @remat_nothing_saveable(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = tgraph.matmul %x, %w {tgraph.remat = {policy = "nothing_saveable", region = 0 : i64}} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %1 = tgraph.tanh %0 {tgraph.remat = {policy = "nothing_saveable", region = 0 : i64}} : tensor<4x8xf32>
  %2 = tgraph.reduce <sum> %1 dims [0, 1] : tensor<4x8xf32> -> tensor<1x1xf32>
  %3 = tgraph.reshape %2 : tensor<1x1xf32> to tensor<f32>
  %4 = tgraph.grad %3 wrt %w : tensor<f32>, tensor<8x8xf32> -> tensor<8x8xf32>
  return %4 : tensor<8x8xf32>
}

// -----

// dots_saveable keeps the matmul's product: only the tanh is recomputed, from it.
// CHECK-LABEL: func.func @remat_dots_saveable
// CHECK: %[[MM:.*]] = tgraph.matmul %arg0, %arg1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
// CHECK-NOT: tgraph.matmul %arg0, %arg1 {tgraph.recompute
// CHECK: %[[TANH2:.*]] = tgraph.tanh %[[MM]] {tgraph.recompute = 5 : i64} : tensor<4x8xf32>
// CHECK: tgraph.mul %[[TANH2]], %[[TANH2]] : tensor<4x8xf32>
func.func @remat_dots_saveable(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = tgraph.matmul %x, %w {tgraph.remat = {policy = "dots_saveable", region = 5 : i64}} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %1 = tgraph.tanh %0 {tgraph.remat = {policy = "dots_saveable", region = 5 : i64}} : tensor<4x8xf32>
  %2 = tgraph.reduce <sum> %1 dims [0, 1] : tensor<4x8xf32> -> tensor<1x1xf32>
  %3 = tgraph.reshape %2 : tensor<1x1xf32> to tensor<f32>
  %4 = tgraph.grad %3 wrt %w : tensor<f32>, tensor<8x8xf32> -> tensor<8x8xf32>
  return %4 : tensor<8x8xf32>
}

// -----

// selective recomputes attention only, and a candidate region (policy none)
// nothing: without attention both differentiate as if unmarked.
// CHECK-LABEL: func.func @remat_selective_and_none
// CHECK-NOT: tgraph.recompute
// CHECK-NOT: tgraph.remat
// CHECK: return
func.func @remat_selective_and_none(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = tgraph.matmul %x, %w {tgraph.remat = {policy = "selective", region = 0 : i64}} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %1 = tgraph.tanh %0 {tgraph.remat = {policy = "none", region = 1 : i64}} : tensor<4x8xf32>
  %2 = tgraph.reduce <sum> %1 dims [0, 1] : tensor<4x8xf32> -> tensor<1x1xf32>
  %3 = tgraph.reshape %2 : tensor<1x1xf32> to tensor<f32>
  %4 = tgraph.grad %3 wrt %w : tensor<f32>, tensor<8x8xf32> -> tensor<8x8xf32>
  return %4 : tensor<8x8xf32>
}

// -----

// An op marked tgraph.no_gradient sends no cotangent back: y = x * s with
// s = max(x) marked is differentiated with s a constant (d x = s, the max's
// rule never runs); an FP8 value's cotangent is bf16: the cast back to f32
// has a bf16 cotangent, cast to f32 again at the cast into FP8.
// CHECK-LABEL: func.func @scaled
// CHECK-NOT: tgraph.compare
// CHECK: %[[G:.*]] = tgraph.cast %{{.*}} : tensor<4xf32> to tensor<4xbf16>
// CHECK: tgraph.cast %[[G]] : tensor<4xbf16> to tensor<4xf32>
// CHECK-NOT: tgraph.compare
// CHECK: return
func.func @scaled(%x: tensor<4xf32>) -> tensor<4xf32> {
  %m = tgraph.reduce <max> %x dims [0] {tgraph.no_gradient} : tensor<4xf32> -> tensor<1xf32>
  %s = tgraph.broadcast %m : tensor<1xf32> to tensor<4xf32>
  %q = tgraph.cast %x : tensor<4xf32> to tensor<4xf8E4M3FN>
  %d = tgraph.cast %q : tensor<4xf8E4M3FN> to tensor<4xf32>
  %y = tgraph.mul %d, %s : tensor<4xf32>
  %l = tgraph.reduce <sum> %y dims [0] : tensor<4xf32> -> tensor<1xf32>
  %r = tgraph.reshape %l : tensor<1xf32> to tensor<f32>
  %g = tgraph.grad %r wrt %x : tensor<f32>, tensor<4xf32> -> tensor<4xf32>
  return %g : tensor<4xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
// A forward value the backward reads (the gathered rows) comes from the
// forward call: the forward tgraph.spmd returns it too (split over every
// mesh axis: each rank's block its own) and the backward body takes it as
// an argument, so the all_gather runs once.
// CHECK-LABEL: func.func @residual
// CHECK: %[[F:.*]]:2 = tgraph.spmd @residual_body(%arg0) in [#tgraph.sharding<@mesh, {{\[}}["dp"], []]>] out [#tgraph.sharding<@mesh, []>, #tgraph.sharding<@mesh, {{\[}}["dp"], []]>] : (tensor<4x3xf32>) -> (tensor<f32>, tensor<8x3xf32>)
// CHECK: tgraph.spmd @residual_body_vjp(%arg0, %{{.*}}, %[[F]]#1)
// CHECK: func.func private @residual_body(
// CHECK: %[[G:.*]] = tgraph.all_gather
// CHECK: return %{{.*}}, %[[G]] : tensor<f32>, tensor<4x3xf32>
// CHECK: func.func private @residual_body_vjp(%{{.*}}: tensor<2x3xf32>, %{{.*}}: tensor<f32>, %{{.*}}: tensor<4x3xf32>)
// CHECK-NOT: tgraph.all_gather
// CHECK: return
func.func @residual(%x: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %l = tgraph.spmd @residual_body(%x) in [#tgraph.sharding<@mesh, [["dp"], []]>] out [#tgraph.sharding<@mesh, []>] : (tensor<4x3xf32>) -> tensor<f32>
  %g = tgraph.grad %l wrt %x : tensor<f32>, tensor<4x3xf32> -> tensor<4x3xf32>
  return %g : tensor<4x3xf32>
}
func.func private @residual_body(%x: tensor<2x3xf32>) -> tensor<f32> attributes {tgraph.local} {
  %a = tgraph.all_gather %x on @mesh["dp"] dim 0 : tensor<2x3xf32> -> tensor<4x3xf32>
  %p = tgraph.mul %a, %a : tensor<4x3xf32>
  %r = tgraph.reduce <sum> %p dims [0, 1] : tensor<4x3xf32> -> tensor<1x1xf32>
  %s = tgraph.reshape %r : tensor<1x1xf32> to tensor<f32>
  return %s : tensor<f32>
}

// -----

// Slices that split a tensor (q, k and v out of one projection): their
// cotangents, zero-padded pieces of disjoint boxes that meet along one
// dimension, sum as one concat (the pads and partial concat left dead for
// canonicalize), not as full-size pads and adds.
// CHECK-LABEL: func.func @split3
// CHECK-NOT: tgraph.add
// CHECK: %[[G:.*]] = tgraph.concat %[[GA:.*]], %[[GB:.*]], %[[GC:.*]] dim 1 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32> -> tensor<2x6xf32>
// CHECK-NEXT: return %[[G]]
func.func @split3(%x: tensor<2x6xf32>) -> tensor<2x6xf32> {
  %a = tgraph.slice %x offsets [0, 0] : tensor<2x6xf32> -> tensor<2x2xf32>
  %b = tgraph.slice %x offsets [0, 2] : tensor<2x6xf32> -> tensor<2x2xf32>
  %c = tgraph.slice %x offsets [0, 4] : tensor<2x6xf32> -> tensor<2x2xf32>
  %ab = tgraph.mul %a, %b : tensor<2x2xf32>
  %abc = tgraph.mul %ab, %c : tensor<2x2xf32>
  %r = tgraph.reduce <sum> %abc dims [0, 1] : tensor<2x2xf32> -> tensor<1x1xf32>
  %s = tgraph.reshape %r : tensor<1x1xf32> to tensor<f32>
  %g = tgraph.grad %s wrt %x : tensor<f32>, tensor<2x6xf32> -> tensor<2x6xf32>
  return %g : tensor<2x6xf32>
}

// -----

// Overlapping slices' cotangents still add.
// CHECK-LABEL: func.func @overlap
// CHECK: tgraph.pad
// CHECK: tgraph.pad
// CHECK: tgraph.add
func.func @overlap(%x: tensor<2x6xf32>) -> tensor<2x6xf32> {
  %a = tgraph.slice %x offsets [0, 0] : tensor<2x6xf32> -> tensor<2x4xf32>
  %b = tgraph.slice %x offsets [0, 2] : tensor<2x6xf32> -> tensor<2x4xf32>
  %ab = tgraph.mul %a, %b : tensor<2x4xf32>
  %r = tgraph.reduce <sum> %ab dims [0, 1] : tensor<2x4xf32> -> tensor<1x1xf32>
  %s = tgraph.reshape %r : tensor<1x1xf32> to tensor<f32>
  %g = tgraph.grad %s wrt %x : tensor<f32>, tensor<2x6xf32> -> tensor<2x6xf32>
  return %g : tensor<2x6xf32>
}

// -----

// Dropout's cotangent is dropout of the cotangent with the same key and
// rate: the same mask, drawn again, never stored.
// CHECK-LABEL: func.func @dropout
// CHECK: tgraph.dropout %{{.*}}[%arg1] {p = 2.500000e-01 : f64} : tensor<2x6xf32>, tensor<2xi64> -> tensor<2x6xf32>
// CHECK: %[[G:.*]] = tgraph.dropout %{{.*}}[%arg1] {p = 2.500000e-01 : f64} : tensor<2x6xf32>, tensor<2xi64> -> tensor<2x6xf32>
// CHECK: return %[[G]]
func.func @dropout(%x: tensor<2x6xf32>, %key: tensor<2xi64>) -> tensor<2x6xf32> {
  %d = tgraph.dropout %x[%key] {p = 0.25 : f64} : tensor<2x6xf32>, tensor<2xi64> -> tensor<2x6xf32>
  %r = tgraph.reduce <sum> %d dims [0, 1] : tensor<2x6xf32> -> tensor<1x1xf32>
  %s = tgraph.reshape %r : tensor<1x1xf32> to tensor<f32>
  %g = tgraph.grad %s wrt %x : tensor<f32>, tensor<2x6xf32> -> tensor<2x6xf32>
  return %g : tensor<2x6xf32>
}
