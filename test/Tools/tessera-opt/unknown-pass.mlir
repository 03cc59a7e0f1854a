// RUN: not tessera-opt %s --no-such-pass 2>&1 | FileCheck %s --check-prefix=FLAG
// RUN: not tessera-opt %s --pass-pipeline='builtin.module(canonicalize, no-such-pass)' 2>&1 | FileCheck %s --check-prefix=PIPELINE
// RUN: not tessera-opt %s --pass-pipeline='builtin.module(func.func(no-such-pass))' 2>&1 | FileCheck %s --check-prefix=NESTED
// RUN: not tessera-opt %s --canonicalize=no-such-option=1 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not tessera-opt %s --tessera-autodiff=x=1 2>&1 | FileCheck %s --check-prefix=TESSERA-OPTION
// RUN: not tessera-opt %s --tessera-lower-to-tile='wgmma=false no-such-option=1' 2>&1 | FileCheck %s --check-prefix=UNKNOWN-OPTION
// RUN: not tessera-opt %s --pass-pipeline='builtin.module(tessera-lower-to-tile{wgmma=maybe})' 2>&1 | FileCheck %s --check-prefix=BAD-VALUE
// RUN: not tessera-opt %s --pass-pipeline='builtin.module(tessera-lower-to-tile{target=tpu})' 2>&1 | FileCheck %s --check-prefix=BAD-TARGET
// RUN: not tessera-opt %s --pass-pipeline='builtin.module(tessera-lower-to-tile{gemm-configs=128x64})' 2>&1 | FileCheck %s --check-prefix=BAD-CONFIG
// RUN: not tessera-opt %s --pass-pipeline='builtin.module(tessera-lower-to-tile{target})' 2>&1 | FileCheck %s --check-prefix=NO-VALUE
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
// TESSERA-OPTION: tessera-opt: error: Tessera pass 'tessera-autodiff' takes no options
// UNKNOWN-OPTION: tessera-opt: error: Tessera pass 'tessera-lower-to-tile' has no option 'no-such-option' (its options: {{.*}}wgmma{{.*}})
// BAD-VALUE: tessera-opt: error: invalid options for Tessera pass 'tessera-lower-to-tile' in 'tessera-lower-to-tile{wgmma=maybe}': option 'wgmma': 'maybe' is not a boolean (true or false)
// BAD-TARGET: error: {{.*}}option 'target': unknown target 'tpu'; choose one of cpu, gpu
// BAD-CONFIG: error: {{.*}}option 'gemm-configs': GEMM configuration '128x64' is not BMxBNxBK
// NO-VALUE: tessera-opt: error: pass option 'target' in 'tessera-lower-to-tile{target}' has no value (name=value)
// MALFORMED: tessera-opt: error: missing ')' in pass pipeline
// MLIR-OPTION: tessera-opt: error: unknown pass or option '--mlir-no-such-option'

func.func @f() {
  return
}
