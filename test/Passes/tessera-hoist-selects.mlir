// RUN: tessera-opt %s --split-input-file --tessera-hoist-selects='target=cpu' --verify-diagnostics | FileCheck %s
// RUN: tessera-opt %s --split-input-file --tessera-hoist-selects='target=gpu' | FileCheck %s --check-prefix=GPU

// On the GPU target nothing moves (the selects would join every parameter's
// update into one kernel that spills registers).
// GPU-LABEL: func.func @skip_step(
// GPU:      tgraph.sub %arg0, %arg2
// GPU-NEXT: tgraph.fill

// where_finite after an optimizer update: each select (and the broadcast of
// the flag it reads, and that broadcast's reshape) moves up to the sub
// whose result only it reads, so the update and the select are adjacent.
// CHECK-LABEL: func.func @skip_step(
// CHECK:      %[[U0:.*]] = tgraph.sub %arg0
// CHECK-NEXT: tgraph.reshape %arg3
// CHECK-NEXT: tgraph.broadcast
// CHECK-NEXT: tgraph.select %{{.*}}, %[[U0]], %arg0
// CHECK-NEXT: tgraph.fill
// CHECK-NEXT: %[[U1:.*]] = tgraph.mul %arg1
// CHECK-NEXT: tgraph.sub %arg1, %[[U1]]
// CHECK-NEXT: tgraph.reshape %arg3
// CHECK-NEXT: tgraph.broadcast
// CHECK-NEXT: tgraph.select
// CHECK-NEXT: return
func.func @skip_step(%w0: tensor<4x8xf32>, %w1: tensor<8xf32>, %lr: tensor<4x8xf32>,
                     %ok: tensor<i1>) -> (tensor<4x8xf32>, tensor<8xf32>) {
  %u0 = tgraph.sub %w0, %lr : tensor<4x8xf32>
  %f = tgraph.fill 3.000000e-05 : tensor<8xf32>
  %m = tgraph.mul %w1, %f : tensor<8xf32>
  %u1 = tgraph.sub %w1, %m : tensor<8xf32>
  %r0 = tgraph.reshape %ok : tensor<i1> to tensor<1x1xi1>
  %b0 = tgraph.broadcast %r0 : tensor<1x1xi1> to tensor<4x8xi1>
  %s0 = tgraph.select %b0, %u0, %w0 : tensor<4x8xi1>, tensor<4x8xf32>
  %r1 = tgraph.reshape %ok : tensor<i1> to tensor<1xi1>
  %b1 = tgraph.broadcast %r1 : tensor<1xi1> to tensor<8xi1>
  %s1 = tgraph.select %b1, %u1, %w1 : tensor<8xi1>, tensor<8xf32>
  return %s0, %s1 : tensor<4x8xf32>, tensor<8xf32>
}

// -----

// The optimizer state's select: the new moment is also read by the update,
// so the select goes after that reader (the last one of its operands
// before it) and fuses with it; the matmul in between stays behind.
// CHECK-LABEL: func.func @moments(
// CHECK:      %[[M1:.*]] = tgraph.add %arg1, %arg2
// CHECK-NEXT: %[[P1:.*]] = tgraph.sub %arg0, %[[M1]]
// CHECK-NEXT: tgraph.select %arg3, %[[P1]], %arg0
// CHECK-NEXT: tgraph.select %arg3, %[[M1]], %arg1
// CHECK-NEXT: tgraph.matmul
func.func @moments(%p: tensor<4x4xf32>, %m: tensor<4x4xf32>, %g: tensor<4x4xf32>,
                   %ok: tensor<4x4xi1>) -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) {
  %m1 = tgraph.add %m, %g : tensor<4x4xf32>
  %p1 = tgraph.sub %p, %m1 : tensor<4x4xf32>
  %x = tgraph.matmul %g, %g : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %sp = tgraph.select %ok, %p1, %p : tensor<4x4xi1>, tensor<4x4xf32>
  %sm = tgraph.select %ok, %m1, %m : tensor<4x4xi1>, tensor<4x4xf32>
  return %sp, %sm, %x : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// Staying: a select whose operand is made after its producer by a matmul
// (no cheap op to copy along), and one that is the last reader of none of
// its operands (moving it up would only lengthen its result's life).
// CHECK-LABEL: func.func @stays(
// CHECK:      %[[U:.*]] = tgraph.sub %arg0, %arg1
// CHECK-NEXT: %[[L:.*]] = tgraph.matmul %arg0, %arg0
// CHECK-NEXT: tgraph.select %arg2, %[[U]], %[[L]]
// CHECK-NEXT: %[[V:.*]] = tgraph.neg %arg1
// CHECK-NEXT: tgraph.neg %arg0
// CHECK-NEXT: tgraph.select %arg2, %[[V]], %arg1
func.func @stays(%a: tensor<4x4xf32>, %b: tensor<4x4xf32>, %ok: tensor<4x4xi1>)
    -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) {
  %u = tgraph.sub %a, %b : tensor<4x4xf32>
  %late = tgraph.matmul %a, %a : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %t = tgraph.select %ok, %u, %late : tensor<4x4xi1>, tensor<4x4xf32>
  %v = tgraph.neg %b : tensor<4x4xf32>
  %w = tgraph.neg %a : tensor<4x4xf32>
  %r = tgraph.select %ok, %v, %b : tensor<4x4xi1>, tensor<4x4xf32>
  return %t, %r, %v, %w, %b : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// Ops of different pipeline ranks do not move next to each other.
// CHECK-LABEL: func.func @ranks(
// CHECK:      tgraph.neg %arg0 {tsched.action
// CHECK-NEXT: tgraph.neg %arg1
// CHECK-NEXT: tgraph.select
func.func @ranks(%a: tensor<4xf32>, %b: tensor<4xf32>, %ok: tensor<4xi1>) -> tensor<4xf32> {
  %x = tgraph.neg %a {tsched.action = {axis = "pp", rank = 0 : i64, kind = "F", microbatch = 0 : i64}} : tensor<4xf32>
  %y = tgraph.neg %b : tensor<4xf32>
  %s = tgraph.select %ok, %x, %y {tsched.action = {axis = "pp", rank = 1 : i64, kind = "F", microbatch = 0 : i64}} : tensor<4xi1>, tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

// After CSE one reshape and one broadcast of the flag serve both selects:
// each select gets its own copies next to it, and the originals, left
// without users, go.
// CHECK-LABEL: func.func @shared_flag(
// CHECK:      %[[U0:.*]] = tgraph.sub %arg0, %arg2
// CHECK-NEXT: %[[R0:.*]] = tgraph.reshape %arg3
// CHECK-NEXT: %[[B0:.*]] = tgraph.broadcast %[[R0]]
// CHECK-NEXT: tgraph.select %[[B0]], %[[U0]], %arg0
// CHECK-NEXT: %[[U1:.*]] = tgraph.sub %arg1, %arg2
// CHECK-NEXT: %[[R1:.*]] = tgraph.reshape %arg3
// CHECK-NEXT: %[[B1:.*]] = tgraph.broadcast %[[R1]]
// CHECK-NEXT: tgraph.select %[[B1]], %[[U1]], %arg1
// CHECK-NEXT: return
func.func @shared_flag(%w0: tensor<8xf32>, %w1: tensor<8xf32>, %lr: tensor<8xf32>,
                       %ok: tensor<i1>) -> (tensor<8xf32>, tensor<8xf32>) {
  %u0 = tgraph.sub %w0, %lr : tensor<8xf32>
  %u1 = tgraph.sub %w1, %lr : tensor<8xf32>
  %r = tgraph.reshape %ok : tensor<i1> to tensor<1xi1>
  %b = tgraph.broadcast %r : tensor<1xi1> to tensor<8xi1>
  %s0 = tgraph.select %b, %u0, %w0 : tensor<8xi1>, tensor<8xf32>
  %s1 = tgraph.select %b, %u1, %w1 : tensor<8xi1>, tensor<8xf32>
  return %s0, %s1 : tensor<8xf32>, tensor<8xf32>
}
