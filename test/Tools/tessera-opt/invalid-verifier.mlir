// RUN: not tessera-opt %s 2>&1 | FileCheck %s

// Input that parses but does not verify: the verifier's error (and its
// "see current operation" note), exit code 1.
// CHECK-NOT: Traceback
// CHECK: invalid-verifier.mlir:[[# @LINE + 4]]:8: error: 'tgraph.matmul' op contraction dimensions differ
// CHECK: invalid-verifier.mlir:[[# @LINE + 3]]:8: note: see current operation:
// CHECK-NOT: Traceback
func.func @f(%a: tensor<8x16xf32>, %b: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = tgraph.matmul %a, %b : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
