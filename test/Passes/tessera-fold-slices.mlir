// RUN: tessera-opt %s --split-input-file --tessera-fold-slices --verify-diagnostics | FileCheck %s

// Index 1 of dimension 1 of x, sliced and reshaped to [2, 8, 4], read by a
// kernel's strided loads: the kernel reads x itself at index 1 (a clone with
// x's type); the slice, the reshape, their buffers and declarations go, and
// x's free follows the kernel. The kernel is also launched on a buffer of
// its own: that launch keeps the original.
// CHECK-LABEL: func.func @slices(
// CHECK-NOT: tsched.launch @slice_0
// CHECK-NOT: tsched.launch @view_1
// CHECK: tsched.launch @rows_2_in_place on %{{.*}} ins(%arg0 : memref<2x3x8x4xf32>)
// CHECK-NEXT: tsched.free %arg0 : memref<2x3x8x4xf32>
// CHECK: tsched.launch @rows_2 on %{{.*}} ins(%arg1 : memref<2x8x4xf32>)
// CHECK: ttile.kernel @rows_2(
// CHECK: ttile.kernel @rows_2_in_place(%arg0: memref<2x3x8x4xf32>, %arg1: memref<2x8x4xf32>)
// CHECK: %[[I:.*]] = arith.constant 1 : index
// CHECK: ttile.load %arg0[%{{.*}}, %[[I]], %{{.*}}, %{{.*}}] {dims = array<i64: 2, 3>} : memref<2x3x8x4xf32> -> !ttile.tile<8x4xf32>
// CHECK-NOT: func.func private @slice_0
// CHECK-NOT: func.func private @view_1
module attributes {tessera.target = "cpu"} {
  func.func @slices(%x: memref<2x3x8x4xf32>, %y: memref<2x8x4xf32>) -> (memref<2x8x4xf32>, memref<2x8x4xf32>) {
    %s = tsched.stream "compute"
    %p = tsched.alloc : memref<2x1x8x4xf32>
    tsched.launch @slice_0 on %s ins(%x : memref<2x3x8x4xf32>) outs(%p : memref<2x1x8x4xf32>)
    tsched.free %x : memref<2x3x8x4xf32>
    %q = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @view_1 on %s ins(%p : memref<2x1x8x4xf32>) outs(%q : memref<2x8x4xf32>)
    tsched.free %p : memref<2x1x8x4xf32>
    %o = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @rows_2 on %s ins(%q : memref<2x8x4xf32>) outs(%o : memref<2x8x4xf32>)
    tsched.free %q : memref<2x8x4xf32>
    %o2 = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @rows_2 on %s ins(%y : memref<2x8x4xf32>) outs(%o2 : memref<2x8x4xf32>)
    return %o, %o2 : memref<2x8x4xf32>, memref<2x8x4xf32>
  }
  ttile.kernel @rows_2(%arg0: memref<2x8x4xf32>, %arg1: memref<2x8x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 2>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.program_id 0
    %1 = ttile.load %arg0[%0, %c0, %c0] {dims = array<i64: 1, 2>} : memref<2x8x4xf32> -> !ttile.tile<8x4xf32>
    %2 = ttile.tanh %1 : !ttile.tile<8x4xf32>
    ttile.store %2, %arg1[%0, %c0, %c0] {dims = array<i64: 1, 2>} : !ttile.tile<8x4xf32>, memref<2x8x4xf32>
    ttile.return
  }
  func.func private @slice_0(memref<2x3x8x4xf32>, memref<2x1x8x4xf32>) attributes {tsched.library = "slice", tsched.library_attrs = {offsets = array<i64: 0, 1, 0, 0>}}
  func.func private @view_1(memref<2x1x8x4xf32>, memref<2x8x4xf32>) attributes {tsched.library = "reshape", tsched.library_attrs = {}}
}

// -----

// Two kernels' strided stores, reshaped to unit pieces of dimension 1 and
// concatenated: each kernel stores into the concat's buffer at its piece's
// index (that buffer's allocation moves before the first of them).
// CHECK-LABEL: func.func @concat(
// CHECK: %[[OUT:.*]] = tsched.alloc : memref<2x2x8x4xf32>
// CHECK-NEXT: tsched.launch @rows_0_in_place on %{{.*}} ins(%arg0 : memref<2x8x4xf32>) outs(%[[OUT]] : memref<2x2x8x4xf32>)
// CHECK-NEXT: tsched.launch @rows_0_in_place2 on %{{.*}} ins(%arg1 : memref<2x8x4xf32>) outs(%[[OUT]] : memref<2x2x8x4xf32>)
// CHECK-NEXT: return %[[OUT]]
// CHECK: ttile.kernel @rows_0_in_place2(%arg0: memref<2x8x4xf32>, %arg1: memref<2x2x8x4xf32>)
// CHECK: ttile.store %{{.*}}, %arg1[%{{.*}}, %c1, %{{.*}}, %{{.*}}] {dims = array<i64: 2, 3>} : !ttile.tile<8x4xf32>, memref<2x2x8x4xf32>
// CHECK: ttile.kernel @rows_0_in_place(%arg0: memref<2x8x4xf32>, %arg1: memref<2x2x8x4xf32>)
// CHECK: ttile.store %{{.*}}, %arg1[%{{.*}}, %c0, %{{.*}}, %{{.*}}] {dims = array<i64: 2, 3>} : !ttile.tile<8x4xf32>, memref<2x2x8x4xf32>
// CHECK-NOT: tsched.library = "concat"
module attributes {tessera.target = "cpu"} {
  func.func @concat(%a: memref<2x8x4xf32>, %b: memref<2x8x4xf32>) -> memref<2x2x8x4xf32> {
    %s = tsched.stream "compute"
    %ga = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @rows_0 on %s ins(%a : memref<2x8x4xf32>) outs(%ga : memref<2x8x4xf32>)
    %gb = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @rows_0 on %s ins(%b : memref<2x8x4xf32>) outs(%gb : memref<2x8x4xf32>)
    %pa = tsched.alloc : memref<2x1x8x4xf32>
    tsched.launch @view_1 on %s ins(%ga : memref<2x8x4xf32>) outs(%pa : memref<2x1x8x4xf32>)
    tsched.free %ga : memref<2x8x4xf32>
    %pb = tsched.alloc : memref<2x1x8x4xf32>
    tsched.launch @view_1 on %s ins(%gb : memref<2x8x4xf32>) outs(%pb : memref<2x1x8x4xf32>)
    tsched.free %gb : memref<2x8x4xf32>
    %out = tsched.alloc : memref<2x2x8x4xf32>
    tsched.launch @cat_2 on %s ins(%pa, %pb : memref<2x1x8x4xf32>, memref<2x1x8x4xf32>) outs(%out : memref<2x2x8x4xf32>)
    tsched.free %pa : memref<2x1x8x4xf32>
    tsched.free %pb : memref<2x1x8x4xf32>
    return %out : memref<2x2x8x4xf32>
  }
  ttile.kernel @rows_0(%arg0: memref<2x8x4xf32>, %arg1: memref<2x8x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 2>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.program_id 0
    %1 = ttile.load %arg0[%0, %c0, %c0] {dims = array<i64: 1, 2>} : memref<2x8x4xf32> -> !ttile.tile<8x4xf32>
    %2 = ttile.tanh %1 : !ttile.tile<8x4xf32>
    ttile.store %2, %arg1[%0, %c0, %c0] {dims = array<i64: 1, 2>} : !ttile.tile<8x4xf32>, memref<2x8x4xf32>
    ttile.return
  }
  func.func private @view_1(memref<2x8x4xf32>, memref<2x1x8x4xf32>) attributes {tsched.library = "reshape", tsched.library_attrs = {}}
  func.func private @cat_2(memref<2x1x8x4xf32>, memref<2x1x8x4xf32>, memref<2x2x8x4xf32>) attributes {tsched.library = "concat", tsched.library_attrs = {dim = 1 : i64}}
}

// -----

// Left alone: a slice a kernel reads with a plain (contiguous) load; one
// whose source a kernel overwrites before the reader; a concat piece that
// something else reads too.
// CHECK-LABEL: func.func @kept(
// CHECK: tsched.launch @slice_0 on
// CHECK: tsched.launch @slice_0 on
// CHECK: tsched.launch @cat_4 on
// CHECK-NOT: _in_place
module attributes {tessera.target = "cpu"} {
  func.func @kept(%x: memref<2x3x8x4xf32>, %w: memref<2x3x8x4xf32>, %a: memref<2x8x4xf32>) -> (memref<2x8x4xf32>, memref<2x8x4xf32>, memref<2x2x8x4xf32>, memref<2x1x8x4xf32>) {
    %s = tsched.stream "compute"
    %p = tsched.alloc : memref<2x1x8x4xf32>
    tsched.launch @slice_0 on %s ins(%x : memref<2x3x8x4xf32>) outs(%p : memref<2x1x8x4xf32>)
    %q = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @view_1 on %s ins(%p : memref<2x1x8x4xf32>) outs(%q : memref<2x8x4xf32>)
    %o = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @plain_2 on %s ins(%q : memref<2x8x4xf32>) outs(%o : memref<2x8x4xf32>)
    %p2 = tsched.alloc : memref<2x1x8x4xf32>
    tsched.launch @slice_0 on %s ins(%w : memref<2x3x8x4xf32>) outs(%p2 : memref<2x1x8x4xf32>)
    %q2 = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @view_1 on %s ins(%p2 : memref<2x1x8x4xf32>) outs(%q2 : memref<2x8x4xf32>)
    tsched.launch @inplace_3 on %s ins(%w : memref<2x3x8x4xf32>) outs(%w : memref<2x3x8x4xf32>)
    %o2 = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @rows_5 on %s ins(%q2 : memref<2x8x4xf32>) outs(%o2 : memref<2x8x4xf32>)
    %ga = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @rows_5 on %s ins(%a : memref<2x8x4xf32>) outs(%ga : memref<2x8x4xf32>)
    %pa = tsched.alloc : memref<2x1x8x4xf32>
    tsched.launch @view_6 on %s ins(%ga : memref<2x8x4xf32>) outs(%pa : memref<2x1x8x4xf32>)
    %gb = tsched.alloc : memref<2x8x4xf32>
    tsched.launch @rows_5 on %s ins(%a : memref<2x8x4xf32>) outs(%gb : memref<2x8x4xf32>)
    %pb = tsched.alloc : memref<2x1x8x4xf32>
    tsched.launch @view_6 on %s ins(%gb : memref<2x8x4xf32>) outs(%pb : memref<2x1x8x4xf32>)
    %out = tsched.alloc : memref<2x2x8x4xf32>
    tsched.launch @cat_4 on %s ins(%pa, %pb : memref<2x1x8x4xf32>, memref<2x1x8x4xf32>) outs(%out : memref<2x2x8x4xf32>)
    return %o, %o2, %out, %pa : memref<2x8x4xf32>, memref<2x8x4xf32>, memref<2x2x8x4xf32>, memref<2x1x8x4xf32>
  }
  ttile.kernel @plain_2(%arg0: memref<2x8x4xf32>, %arg1: memref<2x8x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.load %arg0[%c0, %c0, %c0] : memref<2x8x4xf32> -> !ttile.tile<2x8x4xf32>
    ttile.store %0, %arg1[%c0, %c0, %c0] : !ttile.tile<2x8x4xf32>, memref<2x8x4xf32>
    ttile.return
  }
  ttile.kernel @inplace_3(%arg0: memref<2x3x8x4xf32>, %arg1: memref<2x3x8x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.load %arg0[%c0, %c0, %c0, %c0] : memref<2x3x8x4xf32> -> !ttile.tile<2x3x8x4xf32>
    %1 = ttile.tanh %0 : !ttile.tile<2x3x8x4xf32>
    ttile.store %1, %arg1[%c0, %c0, %c0, %c0] : !ttile.tile<2x3x8x4xf32>, memref<2x3x8x4xf32>
    ttile.return
  }
  ttile.kernel @rows_5(%arg0: memref<2x8x4xf32>, %arg1: memref<2x8x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 2>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.program_id 0
    %1 = ttile.load %arg0[%0, %c0, %c0] {dims = array<i64: 1, 2>} : memref<2x8x4xf32> -> !ttile.tile<8x4xf32>
    ttile.store %1, %arg1[%0, %c0, %c0] {dims = array<i64: 1, 2>} : !ttile.tile<8x4xf32>, memref<2x8x4xf32>
    ttile.return
  }
  func.func private @slice_0(memref<2x3x8x4xf32>, memref<2x1x8x4xf32>) attributes {tsched.library = "slice", tsched.library_attrs = {offsets = array<i64: 0, 1, 0, 0>}}
  func.func private @view_1(memref<2x1x8x4xf32>, memref<2x8x4xf32>) attributes {tsched.library = "reshape", tsched.library_attrs = {}}
  func.func private @view_6(memref<2x8x4xf32>, memref<2x1x8x4xf32>) attributes {tsched.library = "reshape", tsched.library_attrs = {}}
  func.func private @cat_4(memref<2x1x8x4xf32>, memref<2x1x8x4xf32>, memref<2x2x8x4xf32>) attributes {tsched.library = "concat", tsched.library_attrs = {dim = 1 : i64}}
}

// -----

// The GPU target reads no strided tiles: nothing to do.
// CHECK-LABEL: func.func @gpu(
// CHECK: tsched.launch @slice_0 on
module attributes {tessera.target = "gpu"} {
  func.func @gpu(%x: memref<2x3x8x4xf32>) -> memref<2x1x8x4xf32> {
    %s = tsched.stream "compute"
    %p = tsched.alloc : memref<2x1x8x4xf32>
    tsched.launch @slice_0 on %s ins(%x : memref<2x3x8x4xf32>) outs(%p : memref<2x1x8x4xf32>)
    return %p : memref<2x1x8x4xf32>
  }
  func.func private @slice_0(memref<2x3x8x4xf32>, memref<2x1x8x4xf32>) attributes {tsched.library = "slice", tsched.library_attrs = {offsets = array<i64: 0, 1, 0, 0>}}
}
