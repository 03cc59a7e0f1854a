// tessera-lower-to-tile's options (TargetOptions fields, kebab case) on one
// GEMM and one attention kernel.
// RUN: tessera-opt %s --split-input-file --tessera-lower-to-tile | FileCheck %s --check-prefix=DEFAULT
// RUN: tessera-opt %s --split-input-file --pass-pipeline='builtin.module(tessera-lower-to-tile{target=gpu wgmma=false})' | FileCheck %s --check-prefix=MMA
// RUN: tessera-opt %s --split-input-file --tessera-lower-to-tile='tma=false' | FileCheck %s --check-prefix=CPASYNC
// RUN: tessera-opt %s --split-input-file --pass-pipeline='builtin.module(tessera-lower-to-tile{gemm-configs=64x64x32:w2x2:s3,16x16x16:w1x1:s2 target-blocks=1 grouped-tile-order=false})' | FileCheck %s --check-prefix=CONFIG
// RUN: tessera-opt %s --split-input-file --pass-pipeline='builtin.module(tessera-lower-to-tile{pingpong attention-forward-blocks=64:128x64,128:128x64,256:16x16})' | FileCheck %s --check-prefix=PINGPONG
// RUN: tessera-opt %s --split-input-file --tessera-lower-to-tile='target=cpu' | FileCheck %s --check-prefix=CPU

// A 4096^3 bf16 GEMM. By default: the Hopper configuration (wgmma 128x256x64,
// a 4-stage TMA ring fed by a producer warpgroup, tiles in groups of rows).
// DEFAULT-LABEL: ttile.kernel @mm(
// DEFAULT-SAME: block = array<i64: 384>, grid = array<i64: 512>, producer_warpgroup, stages = 4 : i64, ttile.tile_sizes = array<i64: 128, 256, 64>
// DEFAULT: arith.remui
// DEFAULT: arith.addi
// DEFAULT: ttile.load %{{.*}} {tma}
// DEFAULT: ttile.dot {{.*}} {warps = array<i64: 8, 1>, wgmma}
// wgmma=false: the largest mma.sync configuration, no TMA (it needs wgmma).
// MMA-LABEL: ttile.kernel @mm(
// MMA-SAME: block = array<i64: 256>, grid = array<i64: 1024>, stages = 3 : i64, ttile.tile_sizes = array<i64: 128, 128, 32>
// MMA-NOT: tma
// MMA: ttile.dot {{.*}} {warps = array<i64: 2, 4>} :
// tma=false: wgmma on a cp.async ring, no producer warpgroup.
// CPASYNC-LABEL: ttile.kernel @mm(
// CPASYNC-SAME: block = array<i64: 256>, grid = array<i64: 512>, stages = 4 : i64, ttile.tile_sizes = array<i64: 128, 256, 64>
// CPASYNC-NOT: {tma}
// CPASYNC: ttile.dot {{.*}} {warps = array<i64: 8, 1>, wgmma}
// The configurations given, preferred first, in row-major tile order (row
// pid / 64, column pid % 64; grouped order adds a group's first row).
// CONFIG-LABEL: ttile.kernel @mm(
// CONFIG-SAME: block = array<i64: 128>, grid = array<i64: 4096>, stages = 3 : i64, ttile.tile_sizes = array<i64: 64, 64, 32>
// CONFIG: %[[PID:.*]] = ttile.program_id 0
// CONFIG: arith.divui %[[PID]], %c64
// CONFIG-NOT: arith.addi
// CONFIG: arith.remui %[[PID]], %c64
// CONFIG-NOT: arith.addi
// CONFIG: ttile.dot {{.*}} {warps = array<i64: 2, 2>}
// The CPU target: a library call (BLAS), no kernel.
// CPU-LABEL: func.func private @mm(
// CPU-SAME: tsched.library = "matmul"
// CPU-NOT: ttile.kernel @mm
func.func @big_gemm(%a: memref<4096x4096xbf16>, %b: memref<4096x4096xbf16>) -> memref<4096x4096xbf16> {
  %s = tsched.stream "compute"
  %0 = tsched.alloc : memref<4096x4096xbf16>
  tsched.launch @mm on %s ins(%a, %b : memref<4096x4096xbf16>, memref<4096x4096xbf16>) outs(%0 : memref<4096x4096xbf16>)
  return %0 : memref<4096x4096xbf16>
}
func.func private @mm(%a: tensor<4096x4096xbf16>, %b: tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16> attributes {tsched.kernel} {
  %0 = tgraph.matmul %a, %b : tensor<4096x4096xbf16>, tensor<4096x4096xbf16> -> tensor<4096x4096xbf16>
  return %0 : tensor<4096x4096xbf16>
}

// -----

// Causal bf16 attention at head width 64. By default: 64-row forward blocks
// (4 warps, one warpgroup) on wgmma, K and V through a TMA ring.
// DEFAULT-LABEL: ttile.kernel @att(
// DEFAULT-SAME: block = array<i64: 128>, grid = array<i64: 16>, stages = 2 : i64, ttile.tile_sizes = array<i64: 64, 64>
// DEFAULT-NOT: ttile.pingpong
// DEFAULT: ttile.load {{.*}} {tma}
// DEFAULT: ttile.dot {{.*}} {warps = array<i64: 4, 1>, wgmma}
// wgmma=false: the same blocks on mma.sync, no TMA.
// MMA-LABEL: ttile.kernel @att(
// MMA-NOT: tma
// MMA: ttile.dot {{.*}} {warps = array<i64: 4, 1>} :
// tma=false: wgmma, K and V by cp.async.
// CPASYNC-LABEL: ttile.kernel @att(
// CPASYNC-NOT: {tma}
// CPASYNC: ttile.dot {{.*}} {warps = array<i64: 4, 1>, wgmma}
// 128-row forward blocks whose two warpgroups take turns at the tensor cores
// (`pingpong` alone: a boolean option's true).
// PINGPONG-LABEL: ttile.kernel @att(
// PINGPONG-SAME: block = array<i64: 256>, grid = array<i64: 8>, stages = 2 : i64, ttile.tile_sizes = array<i64: 128, 64>
// PINGPONG: scf.for
// PINGPONG: ttile.dot {{.*}} {warps = array<i64: 8, 1>, wgmma}
// PINGPONG: } {ttile.pingpong}
// The CPU target: 64 x 64 blocks, no warps.
// CPU-LABEL: ttile.kernel @att(
// CPU-SAME: block = array<i64: 128>, grid = array<i64: 16>, ttile.tile_sizes = array<i64: 64, 64>
// CPU-NOT: warps
func.func @attention(%q: memref<4x256x64xbf16>, %k: memref<4x256x64xbf16>, %v: memref<4x256x64xbf16>) -> (memref<4x256x64xbf16>, memref<4x256x1xf32>) {
  %s = tsched.stream "compute"
  %o = tsched.alloc : memref<4x256x64xbf16>
  %l = tsched.alloc : memref<4x256x1xf32>
  tsched.launch @att on %s ins(%q, %k, %v : memref<4x256x64xbf16>, memref<4x256x64xbf16>, memref<4x256x64xbf16>) outs(%o, %l : memref<4x256x64xbf16>, memref<4x256x1xf32>)
  return %o, %l : memref<4x256x64xbf16>, memref<4x256x1xf32>
}
func.func private @att(%q: tensor<4x256x64xbf16>, %k: tensor<4x256x64xbf16>, %v: tensor<4x256x64xbf16>) -> (tensor<4x256x64xbf16>, tensor<4x256x1xf32>) attributes {tsched.kernel} {
  %o:2 = tgraph.attention %q, %k, %v {causal, scale = 0.125 : f64} : tensor<4x256x64xbf16>, tensor<4x256x64xbf16>, tensor<4x256x64xbf16> -> tensor<4x256x64xbf16>, tensor<4x256x1xf32>
  return %o#0, %o#1 : tensor<4x256x64xbf16>, tensor<4x256x1xf32>
}
