// RUN: tessera-opt %s --allow-unregistered-dialect | FileCheck %s
// RUN: not tessera-opt %s 2>&1 | FileCheck %s --check-prefix=ERR

// CHECK: "mydialect.op"() {value = 1 : i32} : () -> ()
// ERR: unregistered.mlir:[[# @LINE + 2]]:15: error: operation being parsed with an unregistered dialect
// ERR-NOT: Traceback
"mydialect.op"() {value = 1 : i32} : () -> ()
