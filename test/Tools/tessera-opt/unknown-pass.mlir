// RUN: not tessera-opt %s --no-such-pass 2>&1 | FileCheck %s --check-prefix=FLAG
// RUN: not tessera-opt %s --pass-pipeline='builtin.module(canonicalize, no-such-pass)' 2>&1 | FileCheck %s --check-prefix=PIPELINE
// RUN: not tessera-opt %s --pass-pipeline='builtin.module(func.func(no-such-pass))' 2>&1 | FileCheck %s --check-prefix=NESTED
// RUN: not tessera-opt %s --canonicalize=no-such-option=1 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not tessera-opt %s --tessera-partition=x=1 2>&1 | FileCheck %s --check-prefix=TESSERA-OPTION
// RUN: not tessera-opt %s --pass-pipeline='builtin.module(canonicalize' 2>&1 | FileCheck %s --check-prefix=MALFORMED
// RUN: not tessera-opt %s --mlir-no-such-option 2>&1 | FileCheck %s --check-prefix=MLIR-OPTION

// Unknown passes and options are rejected cleanly, before reading the input.

// FLAG: tessera-opt: error: unknown pass or option '--no-such-pass'
// FLAG-NOT: Traceback
// PIPELINE: tessera-opt: error: unknown pass or option 'no-such-pass' in pass pipeline
// PIPELINE-NOT: Traceback
// NESTED: tessera-opt: error: unknown pass or option 'func.func' in pass pipeline
// NESTED: 'no-such-pass' does not refer to a registered pass or pass pipeline
// OPTION: tessera-opt: error: invalid pass '--canonicalize=no-such-option=1'
// OPTION: no such option no-such-option
// TESSERA-OPTION: tessera-opt: error: Tessera pass 'tessera-partition' takes no options
// MALFORMED: tessera-opt: error: missing ')' in pass pipeline
// MLIR-OPTION: tessera-opt: error: unknown pass or option '--mlir-no-such-option'

func.func @f() {
  return
}
