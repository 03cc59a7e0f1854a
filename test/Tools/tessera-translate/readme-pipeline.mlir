// The README's command line: Graph IR through every pass, then to C++ and CUDA.
// RUN: tessera-opt %S/../../../examples/tp_mlp.mlir --pass-pipeline='builtin.module(tessera-partition, tessera-lower-to-schedule, tessera-lower-to-tile, canonicalize, cse)' | tessera-translate --ttile-to-cpp | FileCheck %s --check-prefix=CPP
// RUN: tessera-opt %S/../../../examples/tp_mlp.mlir --pass-pipeline='builtin.module(tessera-partition, tessera-lower-to-schedule, tessera-lower-to-tile, canonicalize, cse)' | tessera-translate --ttile-to-cuda | FileCheck %s --check-prefix=CUDA
// RUN: not tessera-translate --ttile-to-cpp %S/../../../examples/missing.mlir 2>&1 | FileCheck %s --check-prefix=MISSING

// CPP-DAG: extern "C" void mlp_matmul_0_fused2(void* arg0_, void* arg1_, void* arg2_) {
// CPP-DAG: extern "C" void mlp_matmul_2(void* arg0_, void* arg1_, void* arg2_) {
// CUDA-DAG: extern "C" __global__ void __launch_bounds__({{[0-9]+}}) mlp_matmul_0_fused2(
// CUDA-DAG: extern "C" __global__ void __launch_bounds__({{[0-9]+}}) mlp_matmul_2(
// MISSING: missing.mlir
