// RUN: not tessera-opt %s 2>&1 | FileCheck %s
// RUN: not tessera-opt %s --canonicalize 2>&1 | FileCheck %s

// Malformed input: a mlir-opt style diagnostic, the source line and a caret,
// exit code 1, and no Python traceback.
// CHECK-NOT: Traceback
// CHECK: invalid-input.mlir:[[# @LINE + 3]]:19: error: expected SSA operand
// CHECK-NEXT: {{^}}  %0 = tgraph.relu : tensor<4xf32>
// CHECK-NEXT: {{^                  \^$}}
  %0 = tgraph.relu : tensor<4xf32>
// CHECK-NOT: Traceback
