// RUN: tessera-opt --help | FileCheck %s
// RUN: tessera-opt -h | FileCheck %s
// RUN: tessera-opt --list-passes | FileCheck %s --check-prefix=LIST

// CHECK: USAGE: tessera-opt [options] [<input file>]
// CHECK: -o <filename>
// CHECK: --pass-pipeline=<pipeline>
// CHECK: --split-input-file
// CHECK: --verify-diagnostics
// CHECK: --mlir-print-ir-after-all
// CHECK: --mlir-print-op-generic
// CHECK: --mlir-print-debuginfo
// CHECK: --verify-each / --no-verify-each
// CHECK: --allow-unregistered-dialect
// CHECK: --list-passes

// Every Tessera pass, with its one-line summary.
// CHECK: Tessera passes:
// CHECK-DAG: --tessera-propagate-sharding {{.*}}- Give every tgraph value a sharding
// CHECK-DAG: --tessera-partition {{.*}}- SPMD-partition tgraph
// CHECK-DAG: --tessera-lower-to-schedule {{.*}}- Lower partitioned tgraph to tsched
// CHECK-DAG: --tessera-lower-to-tile {{.*}}- Lower tsched kernels to ttile kernels
// CHECK: Upstream MLIR passes: any pass name mlir-opt knows also works

// LIST: Tessera passes:
// LIST-DAG: --tessera-propagate-sharding {{.*}}- Give every tgraph value a sharding
// LIST-DAG: --tessera-partition {{.*}}- SPMD-partition tgraph
// LIST-DAG: --tessera-lower-to-schedule {{.*}}- Lower partitioned tgraph to tsched
// LIST-DAG: --tessera-lower-to-tile {{.*}}- Lower tsched kernels to ttile kernels
// LIST: any upstream MLIR pass name also works
