// RUN: not tessera-opt %s -split-input-file 2>%t.err | FileCheck %s
// RUN: FileCheck %s --check-prefix=ERR < %t.err
// RUN: tessera-opt %s -split-input-file -verify-diagnostics | FileCheck %s --check-prefix=VERIFY

// Each chunk is parsed on its own; outputs are joined by `// -----`, and
// diagnostics carry the line numbers of this file.

// CHECK: func.func @first
// CHECK: // -----
// CHECK-NOT: func.func @second
// CHECK: // -----
// CHECK: func.func @third
// ERR: split-input-file.mlir:[[# @LINE + 13]]:8: error: 'tgraph.matmul' op contraction dimensions differ
// ERR-NOT: error

// VERIFY: func.func @first
// VERIFY: // -----
// VERIFY: // -----
// VERIFY: func.func @third
func.func @first() {
  return
}
// -----
func.func @second(%a: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{contraction dimensions differ}}
  %0 = tgraph.matmul %a, %a : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
// -----
func.func @third() {
  return
}
