// RUN: tessera-opt %s --pass-pipeline='builtin.module(tessera-propagate-sharding, canonicalize, func.func(cse))' | FileCheck %s
// RUN: tessera-opt %s --tessera-propagate-sharding --canonicalize --cse | FileCheck %s
// RUN: tessera-opt %s --canonicalize=max-iterations=3 --cse | FileCheck %s
// RUN: tessera-opt %s -p 'builtin.module(canonicalize{max-iterations=3 region-simplify=disabled}, func.func(cse))' | FileCheck %s
// RUN: tessera-opt %s | FileCheck %s --check-prefix=NOPASS

// A pipeline mixing a Tessera pass with upstream canonicalize and cse:
// canonicalize folds the constant arithmetic, cse merges the duplicate add.

// CHECK-LABEL: func.func @f(
// CHECK-SAME: %[[A:.*]]: i32)
// CHECK-NEXT: %[[SUM:.*]] = arith.addi %[[A]], %[[A]] : i32
// CHECK-NEXT: %[[PROD:.*]] = arith.muli %[[SUM]], %[[SUM]] : i32
// CHECK-NEXT: return %[[PROD]] : i32

// NOPASS: arith.constant 0 : i32
// NOPASS: arith.addi
// NOPASS: arith.addi
func.func @f(%a: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %0 = arith.addi %a, %a : i32
  %1 = arith.addi %a, %a : i32
  %2 = arith.addi %1, %c0 : i32
  %3 = arith.muli %0, %2 : i32
  return %3 : i32
}
