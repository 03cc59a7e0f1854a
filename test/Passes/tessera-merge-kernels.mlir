// RUN: tessera-opt %s --split-input-file --tessera-merge-kernels --verify-diagnostics | FileCheck %s

// Two microbatches' copies of one fused kernel and of one library call: the
// second of each goes, and its launches launch the first. A kernel that
// differs (here only in its constant) stays.
// CHECK-LABEL: func.func @step(
// CHECK: tsched.launch @mm_0 on
// CHECK: tsched.launch @tanh_1 on
// CHECK: tsched.launch @mm_0 on
// CHECK: tsched.launch @tanh_1 on
// CHECK: tsched.launch @scale_4 on
// CHECK: ttile.kernel @tanh_1(
// CHECK-NOT: ttile.kernel @tanh_3(
// CHECK: ttile.kernel @scale_4(
// CHECK: func.func private @mm_0(
// CHECK-NOT: func.func private @mm_2(
module attributes {tessera.target = "cpu"} {
  func.func @step(%x: memref<4x4xf32>, %w: memref<4x4xf32>) -> memref<4x4xf32> {
    %s = tsched.stream "compute"
    %a = tsched.alloc : memref<4x4xf32>
    tsched.launch @mm_0 on %s ins(%x, %w : memref<4x4xf32>, memref<4x4xf32>) outs(%a : memref<4x4xf32>)
    %b = tsched.alloc : memref<4x4xf32>
    tsched.launch @tanh_1 on %s ins(%a : memref<4x4xf32>) outs(%b : memref<4x4xf32>)
    %c = tsched.alloc : memref<4x4xf32>
    tsched.launch @mm_2 on %s ins(%b, %w : memref<4x4xf32>, memref<4x4xf32>) outs(%c : memref<4x4xf32>)
    %d = tsched.alloc : memref<4x4xf32>
    tsched.launch @tanh_3 on %s ins(%c : memref<4x4xf32>) outs(%d : memref<4x4xf32>)
    %e = tsched.alloc : memref<4x4xf32>
    tsched.launch @scale_4 on %s ins(%d : memref<4x4xf32>) outs(%e : memref<4x4xf32>)
    return %e : memref<4x4xf32>
  }
  ttile.kernel @tanh_1(%arg0: memref<4x4xf32>, %arg1: memref<4x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>, ttile.tile_sizes = array<i64: 4, 4>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.load %arg0[%c0, %c0] : memref<4x4xf32> -> !ttile.tile<4x4xf32>
    %1 = ttile.tanh %0 : !ttile.tile<4x4xf32>
    ttile.store %1, %arg1[%c0, %c0] : !ttile.tile<4x4xf32>, memref<4x4xf32>
    ttile.return
  }
  ttile.kernel @tanh_3(%arg0: memref<4x4xf32>, %arg1: memref<4x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>, ttile.tile_sizes = array<i64: 4, 4>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.load %arg0[%c0, %c0] : memref<4x4xf32> -> !ttile.tile<4x4xf32>
    %1 = ttile.tanh %0 : !ttile.tile<4x4xf32>
    ttile.store %1, %arg1[%c0, %c0] : !ttile.tile<4x4xf32>, memref<4x4xf32>
    ttile.return
  }
  ttile.kernel @scale_4(%arg0: memref<4x4xf32>, %arg1: memref<4x4xf32>) attributes {block = array<i64: 128>, grid = array<i64: 1>, ttile.tile_sizes = array<i64: 4, 4>} {
    %c0 = arith.constant 0 : index
    %0 = ttile.load %arg0[%c0, %c0] : memref<4x4xf32> -> !ttile.tile<4x4xf32>
    %1 = ttile.fill 2.000000e+00 : !ttile.tile<4x4xf32>
    %2 = ttile.mul %0, %1 : !ttile.tile<4x4xf32>
    ttile.store %2, %arg1[%c0, %c0] : !ttile.tile<4x4xf32>, memref<4x4xf32>
    ttile.return
  }
  func.func private @mm_0(memref<4x4xf32>, memref<4x4xf32>, memref<4x4xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
  func.func private @mm_2(memref<4x4xf32>, memref<4x4xf32>, memref<4x4xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
}

// -----

// Library calls that differ in their attributes stay apart.
// CHECK-LABEL: func.func @apart(
// CHECK: tsched.launch @t_0 on
// CHECK: tsched.launch @t_1 on
// CHECK-DAG: func.func private @t_0(
// CHECK-DAG: func.func private @t_1(
module attributes {tessera.target = "cpu"} {
  func.func @apart(%x: memref<4x4xf32>) -> memref<4x4xf32> {
    %s = tsched.stream "compute"
    %a = tsched.alloc : memref<4x4xf32>
    tsched.launch @t_0 on %s ins(%x : memref<4x4xf32>) outs(%a : memref<4x4xf32>)
    %b = tsched.alloc : memref<4x4xf32>
    tsched.launch @t_1 on %s ins(%a : memref<4x4xf32>) outs(%b : memref<4x4xf32>)
    return %b : memref<4x4xf32>
  }
  func.func private @t_0(memref<4x4xf32>, memref<4x4xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = [1, 0]}}
  func.func private @t_1(memref<4x4xf32>, memref<4x4xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = [0, 1]}}
}
