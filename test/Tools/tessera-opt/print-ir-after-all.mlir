// RUN: tessera-opt %s --canonicalize --tessera-propagate-sharding --pass-pipeline='builtin.module(func.func(cse))' --mlir-print-ir-after-all -o /dev/null 2>&1 | FileCheck %s
// RUN: tessera-opt %s --pass-pipeline='builtin.module(canonicalize)' --mlir-print-ir-after-all --mlir-print-op-generic 2>&1 >/dev/null | FileCheck %s --check-prefix=GENERIC

// Passes run in command-line order; each prints a mlir-opt style header.
// CHECK: // -----// IR Dump After Canonicalizer (canonicalize) //----- //
// CHECK-NEXT: module {
// CHECK: func.func @f
// CHECK: // -----// IR Dump After TesseraPropagateSharding (tessera-propagate-sharding) //----- //
// CHECK-NEXT: module {
// Nested passes print the op they ran on.
// CHECK: // -----// IR Dump After CSE (cse) //----- //
// CHECK-NEXT: func.func @f
// CHECK-NOT: IR Dump

// GENERIC: // -----// IR Dump After Canonicalizer (canonicalize) //----- //
// GENERIC-NEXT: "builtin.module"() ({

func.func @f(%a: i32) -> i32 {
  %0 = arith.addi %a, %a : i32
  return %0 : i32
}
