// RUN: tessera-opt %s -o %t.out.mlir
// RUN: FileCheck %s < %t.out.mlir
// RUN: tessera-opt %s -o - | FileCheck %s
// The output file is itself valid input.
// RUN: tessera-opt %t.out.mlir | FileCheck %s

// CHECK: module {
// CHECK-NEXT: tgraph.mesh @mesh axes = ["tp"] shape = [2]
// CHECK-NEXT: func.func @f(%{{.*}}: tensor<4xf32>) -> tensor<4xf32>
tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = tgraph.relu %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}
