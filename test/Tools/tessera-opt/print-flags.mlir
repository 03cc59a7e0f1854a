// RUN: tessera-opt %s --mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC
// RUN: tessera-opt %s --mlir-print-debuginfo | FileCheck %s --check-prefix=DEBUG
// RUN: tessera-opt %s --mlir-print-debuginfo | tessera-opt --mlir-print-debuginfo | FileCheck %s --check-prefix=DEBUG
// RUN: tessera-opt %s --no-verify-each --canonicalize | FileCheck %s --check-prefix=CUSTOM
// RUN: tessera-opt < %s | FileCheck %s --check-prefix=CUSTOM
// RUN: tessera-opt - < %s | FileCheck %s --check-prefix=CUSTOM

// GENERIC: "builtin.module"() ({
// GENERIC: "tgraph.mesh"() <{axes = ["tp"], shape = array<i64: 2>, sym_name = "mesh"}> : () -> ()
// GENERIC: "tgraph.relu"(%{{.*}}) : (tensor<4xf32>) -> tensor<4xf32>

// Locations refer to this file's lines.
// DEBUG: tgraph.mesh @mesh {{.*}}loc(#[[MESH:loc[0-9]*]])
// DEBUG: tgraph.relu {{.*}}loc(#[[RELU:loc[0-9]*]])
// DEBUG-DAG: #[[MESH]] = loc("{{.*}}print-flags.mlir":[[# @LINE + 5]]:1)
// DEBUG-DAG: #[[RELU]] = loc("{{.*}}print-flags.mlir":[[# @LINE + 6]]:8)

// CUSTOM: tgraph.mesh @mesh axes = ["tp"] shape = [2]
// CUSTOM: tgraph.relu %{{.*}} : tensor<4xf32>
tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = tgraph.relu %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}
