// RUN: tessera-opt %s --split-input-file --tessera-fold-transposes --verify-diagnostics | FileCheck %s

// dW = x^T dy and dx = dy W^T, as autodiff writes them: both transposes go
// with their buffers; the matmuls read x and W through declarations marked
// transpose_lhs / transpose_rhs (the old matmul declarations, now launched by
// nothing, go too).
// CHECK-LABEL: func.func @grads(
// CHECK-NOT: tsched.launch @t_
// CHECK: tsched.launch @mm_1_transpose_lhs on %{{.*}} ins(%arg0, %arg1 : memref<8x4xf32>, memref<8x2xf32>) outs(%{{.*}} : memref<4x2xf32>)
// CHECK: tsched.launch @mm_3_transpose_rhs on %{{.*}} ins(%arg1, %arg2 : memref<8x2xf32>, memref<4x2xf32>) outs(%{{.*}} : memref<8x4xf32>)
// CHECK-NOT: tsched.free
// CHECK: return
// CHECK-DAG: func.func private @mm_1_transpose_lhs(memref<8x4xf32>, memref<8x2xf32>, memref<4x2xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {transpose_lhs}}
// CHECK-DAG: func.func private @mm_3_transpose_rhs(memref<8x2xf32>, memref<4x2xf32>, memref<8x4xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {transpose_rhs}}
// CHECK-NOT: func.func private @t_
// CHECK-NOT: func.func private @mm_1(
// CHECK-NOT: func.func private @mm_3(
module attributes {tessera.target = "cpu"} {
  func.func @grads(%x: memref<8x4xf32>, %dy: memref<8x2xf32>, %w: memref<4x2xf32>) -> (memref<4x2xf32>, memref<8x4xf32>) {
    %s = tsched.stream "compute"
    %xt = tsched.alloc : memref<4x8xf32>
    tsched.launch @t_0 on %s ins(%x : memref<8x4xf32>) outs(%xt : memref<4x8xf32>)
    %dw = tsched.alloc : memref<4x2xf32>
    tsched.launch @mm_1 on %s ins(%xt, %dy : memref<4x8xf32>, memref<8x2xf32>) outs(%dw : memref<4x2xf32>)
    tsched.free %xt : memref<4x8xf32>
    %wt = tsched.alloc : memref<2x4xf32>
    tsched.launch @t_2 on %s ins(%w : memref<4x2xf32>) outs(%wt : memref<2x4xf32>)
    %dx = tsched.alloc : memref<8x4xf32>
    tsched.launch @mm_3 on %s ins(%dy, %wt : memref<8x2xf32>, memref<2x4xf32>) outs(%dx : memref<8x4xf32>)
    tsched.free %wt : memref<2x4xf32>
    return %dw, %dx : memref<4x2xf32>, memref<8x4xf32>
  }
  func.func private @t_0(memref<8x4xf32>, memref<4x8xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0>}}
  func.func private @mm_1(memref<4x8xf32>, memref<8x2xf32>, memref<4x2xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
  func.func private @t_2(memref<4x2xf32>, memref<2x4xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0>}}
  func.func private @mm_3(memref<8x2xf32>, memref<2x4xf32>, memref<8x4xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
}

// -----

// A batched transpose of the last two dimensions folds too.
// CHECK-LABEL: func.func @batched(
// CHECK: tsched.launch @bmm_1_transpose_rhs on %{{.*}} ins(%arg0, %arg1 : memref<2x4x8xf32>, memref<2x4x8xf32>)
module attributes {tessera.target = "cpu"} {
  func.func @batched(%q: memref<2x4x8xf32>, %k: memref<2x4x8xf32>) -> memref<2x4x4xf32> {
    %s = tsched.stream "compute"
    %kt = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @t_0 on %s ins(%k : memref<2x4x8xf32>) outs(%kt : memref<2x8x4xf32>)
    %p = tsched.alloc : memref<2x4x4xf32>
    tsched.launch @bmm_1 on %s ins(%q, %kt : memref<2x4x8xf32>, memref<2x8x4xf32>) outs(%p : memref<2x4x4xf32>)
    tsched.free %kt : memref<2x8x4xf32>
    return %p : memref<2x4x4xf32>
  }
  func.func private @t_0(memref<2x4x8xf32>, memref<2x8x4xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 0, 2, 1>}}
  func.func private @bmm_1(memref<2x4x8xf32>, memref<2x8x4xf32>, memref<2x4x4xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
}

// -----

// Left alone: a transpose that also feeds a generated kernel, one that moves
// a leading dimension, and one whose input a launch overwrites before the
// matmul reads it (reading the input later would see the new values).
// CHECK-LABEL: func.func @kept(
// CHECK: tsched.launch @t_0 on
// CHECK: tsched.launch @mm_1 on
// CHECK: tsched.launch @neg_2 on
// CHECK: tsched.launch @t_3 on
// CHECK: tsched.launch @t_5 on
// CHECK: tsched.launch @neg_6 on
// CHECK: tsched.launch @mm_7 on
// CHECK-NOT: transpose_lhs
// CHECK-NOT: transpose_rhs
module attributes {tessera.target = "cpu"} {
  func.func @kept(%x: memref<4x4xf32>, %w: memref<4x4xf32>, %b: memref<2x4x4xf32>) -> (memref<4x4xf32>, memref<4x4xf32>, memref<4x2x4xf32>, memref<4x4xf32>) {
    %s = tsched.stream "compute"
    %xt = tsched.alloc : memref<4x4xf32>
    tsched.launch @t_0 on %s ins(%x : memref<4x4xf32>) outs(%xt : memref<4x4xf32>)
    %y = tsched.alloc : memref<4x4xf32>
    tsched.launch @mm_1 on %s ins(%xt, %w : memref<4x4xf32>, memref<4x4xf32>) outs(%y : memref<4x4xf32>)
    %z = tsched.alloc : memref<4x4xf32>
    tsched.launch @neg_2 on %s ins(%xt : memref<4x4xf32>) outs(%z : memref<4x4xf32>)
    %bt = tsched.alloc : memref<4x2x4xf32>
    tsched.launch @t_3 on %s ins(%b : memref<2x4x4xf32>) outs(%bt : memref<4x2x4xf32>)
    %wt = tsched.alloc : memref<4x4xf32>
    tsched.launch @t_5 on %s ins(%w : memref<4x4xf32>) outs(%wt : memref<4x4xf32>)
    tsched.launch @neg_6 on %s ins(%x : memref<4x4xf32>) outs(%w : memref<4x4xf32>)
    %v = tsched.alloc : memref<4x4xf32>
    tsched.launch @mm_7 on %s ins(%x, %wt : memref<4x4xf32>, memref<4x4xf32>) outs(%v : memref<4x4xf32>)
    return %y, %z, %bt, %v : memref<4x4xf32>, memref<4x4xf32>, memref<4x2x4xf32>, memref<4x4xf32>
  }
  ttile.kernel @neg_2(%arg0: memref<4x4xf32>, %arg1: memref<4x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>, ttile.tile_sizes = array<i64: 4, 4>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.load %arg0[%c0, %c0] : memref<4x4xf32> -> !ttile.tile<4x4xf32>
    %1 = ttile.neg %0 : !ttile.tile<4x4xf32>
    ttile.store %1, %arg1[%c0, %c0] : !ttile.tile<4x4xf32>, memref<4x4xf32>
    ttile.return
  }
  ttile.kernel @neg_6(%arg0: memref<4x4xf32>, %arg1: memref<4x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>, ttile.tile_sizes = array<i64: 4, 4>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.load %arg0[%c0, %c0] : memref<4x4xf32> -> !ttile.tile<4x4xf32>
    %1 = ttile.neg %0 : !ttile.tile<4x4xf32>
    ttile.store %1, %arg1[%c0, %c0] : !ttile.tile<4x4xf32>, memref<4x4xf32>
    ttile.return
  }
  func.func private @t_0(memref<4x4xf32>, memref<4x4xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0>}}
  func.func private @mm_1(memref<4x4xf32>, memref<4x4xf32>, memref<4x4xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
  func.func private @t_3(memref<2x4x4xf32>, memref<4x2x4xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0, 2>}}
  func.func private @t_5(memref<4x4xf32>, memref<4x4xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0>}}
  func.func private @mm_7(memref<4x4xf32>, memref<4x4xf32>, memref<4x4xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
}

// -----

// Invalid input never reaches the pass: the dialect rejects a launch of an
// undeclared kernel first.
module attributes {tessera.target = "cpu"} {
  func.func @undeclared(%x: memref<4x4xf32>) -> memref<4x4xf32> {
    %s = tsched.stream "compute"
    %a = tsched.alloc : memref<4x4xf32>
    // expected-error @+1 {{launches unknown kernel @nowhere}}
    tsched.launch @nowhere on %s ins(%x : memref<4x4xf32>) outs(%a : memref<4x4xf32>)
    return %a : memref<4x4xf32>
  }
}

// -----

// The transpose was its input's last reader, so the input is freed right
// after it: the free moves after the matmul that now reads the input.
// CHECK-LABEL: func.func @freed(
// CHECK: %[[A:.*]] = tsched.alloc : memref<8x4xf32>
// CHECK: tsched.launch @relu_0 on %{{.*}} ins(%arg0 : memref<8x4xf32>) outs(%[[A]] : memref<8x4xf32>)
// CHECK: tsched.launch @mm_2_transpose_lhs on %{{.*}} ins(%[[A]], %arg1 : memref<8x4xf32>, memref<8x2xf32>)
// CHECK-NEXT: tsched.free %[[A]] : memref<8x4xf32>
module attributes {tessera.target = "cpu"} {
  func.func @freed(%x: memref<8x4xf32>, %dy: memref<8x2xf32>) -> memref<4x2xf32> {
    %s = tsched.stream "compute"
    %a = tsched.alloc : memref<8x4xf32>
    tsched.launch @relu_0 on %s ins(%x : memref<8x4xf32>) outs(%a : memref<8x4xf32>)
    %at = tsched.alloc : memref<4x8xf32>
    tsched.launch @t_1 on %s ins(%a : memref<8x4xf32>) outs(%at : memref<4x8xf32>)
    tsched.free %a : memref<8x4xf32>
    %dw = tsched.alloc : memref<4x2xf32>
    tsched.launch @mm_2 on %s ins(%at, %dy : memref<4x8xf32>, memref<8x2xf32>) outs(%dw : memref<4x2xf32>)
    tsched.free %at : memref<4x8xf32>
    return %dw : memref<4x2xf32>
  }
  ttile.kernel @relu_0(%arg0: memref<8x4xf32>, %arg1: memref<8x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>, ttile.tile_sizes = array<i64: 8, 4>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.load %arg0[%c0, %c0] : memref<8x4xf32> -> !ttile.tile<8x4xf32>
    %1 = ttile.neg %0 : !ttile.tile<8x4xf32>
    ttile.store %1, %arg1[%c0, %c0] : !ttile.tile<8x4xf32>, memref<8x4xf32>
    ttile.return
  }
  func.func private @t_1(memref<8x4xf32>, memref<4x8xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0>}}
  func.func private @mm_2(memref<4x8xf32>, memref<8x2xf32>, memref<4x2xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
}

// -----

// Both operands transposed: one declaration with both marks, and nothing
// left of the intermediate one.
// CHECK-LABEL: func.func @both(
// CHECK: tsched.launch @mm_2_transpose_lhs_transpose_rhs on %{{.*}} ins(%arg0, %arg1 : memref<8x4xf32>, memref<2x8xf32>)
// CHECK: func.func private @mm_2_transpose_lhs_transpose_rhs(memref<8x4xf32>, memref<2x8xf32>, memref<4x2xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {transpose_lhs, transpose_rhs}}
// CHECK-NOT: func.func private @mm_2
module attributes {tessera.target = "cpu"} {
  func.func @both(%x: memref<8x4xf32>, %y: memref<2x8xf32>) -> memref<4x2xf32> {
    %s = tsched.stream "compute"
    %xt = tsched.alloc : memref<4x8xf32>
    tsched.launch @t_0 on %s ins(%x : memref<8x4xf32>) outs(%xt : memref<4x8xf32>)
    %yt = tsched.alloc : memref<8x2xf32>
    tsched.launch @t_1 on %s ins(%y : memref<2x8xf32>) outs(%yt : memref<8x2xf32>)
    %p = tsched.alloc : memref<4x2xf32>
    tsched.launch @mm_2 on %s ins(%xt, %yt : memref<4x8xf32>, memref<8x2xf32>) outs(%p : memref<4x2xf32>)
    tsched.free %xt : memref<4x8xf32>
    tsched.free %yt : memref<8x2xf32>
    return %p : memref<4x2xf32>
  }
  func.func private @t_0(memref<8x4xf32>, memref<4x8xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0>}}
  func.func private @t_1(memref<2x8xf32>, memref<8x2xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0>}}
  func.func private @mm_2(memref<4x8xf32>, memref<8x2xf32>, memref<4x2xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
}

// -----

// Two launches of one matmul declaration, each reading a transposed operand
// of the same type: both launch one marked copy of it.
// CHECK-LABEL: func.func @shared(
// CHECK: tsched.launch @mm_transpose_lhs on %{{.*}} ins(%arg0, %arg2
// CHECK: tsched.launch @mm_transpose_lhs on %{{.*}} ins(%arg1, %arg2
// CHECK-COUNT-1: func.func private @mm_transpose_lhs(
// CHECK-NOT: func.func private @mm(
module attributes {tessera.target = "cpu"} {
  func.func @shared(%x: memref<8x4xf32>, %y: memref<8x4xf32>, %d: memref<8x2xf32>) -> (memref<4x2xf32>, memref<4x2xf32>) {
    %s = tsched.stream "compute"
    %xt = tsched.alloc : memref<4x8xf32>
    tsched.launch @t on %s ins(%x : memref<8x4xf32>) outs(%xt : memref<4x8xf32>)
    %a = tsched.alloc : memref<4x2xf32>
    tsched.launch @mm on %s ins(%xt, %d : memref<4x8xf32>, memref<8x2xf32>) outs(%a : memref<4x2xf32>)
    tsched.free %xt : memref<4x8xf32>
    %yt = tsched.alloc : memref<4x8xf32>
    tsched.launch @t on %s ins(%y : memref<8x4xf32>) outs(%yt : memref<4x8xf32>)
    %b = tsched.alloc : memref<4x2xf32>
    tsched.launch @mm on %s ins(%yt, %d : memref<4x8xf32>, memref<8x2xf32>) outs(%b : memref<4x2xf32>)
    tsched.free %yt : memref<4x8xf32>
    return %a, %b : memref<4x2xf32>, memref<4x2xf32>
  }
  func.func private @t(memref<8x4xf32>, memref<4x8xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0>}}
  func.func private @mm(memref<4x8xf32>, memref<8x2xf32>, memref<4x2xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
}
