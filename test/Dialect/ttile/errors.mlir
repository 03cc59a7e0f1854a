// RUN: tessera-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

//===----------------------------------------------------------------------===//
// !ttile.tile
//===----------------------------------------------------------------------===//

// expected-error @below {{a tile needs at least one dimension}}
func.func private @f(!ttile.tile<f32>)

// -----

// expected-error @below {{tile dimensions must be >= 1, got 0}}
func.func private @f(!ttile.tile<0x4xf32>)

// -----

// expected-error @below {{tile elements must be integers or floats, got 'index'}}
func.func private @f(!ttile.tile<4xindex>)

// -----

// expected-error @below {{expected static shape}}
func.func private @f(!ttile.tile<?x4xf32>)

// -----

//===----------------------------------------------------------------------===//
// ttile.kernel
//===----------------------------------------------------------------------===//

// expected-error @below {{'ttile.kernel' op kernel @k must not return values; write results to its buffer arguments}}
ttile.kernel @k(%a: memref<8xf32>) -> memref<8xf32> attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op argument #1 of kernel @k must be a statically shaped memref, got 'tensor<8xf32>'}}
ttile.kernel @k(%a: memref<8xf32>, %b: tensor<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'row_segments' must be [argument, rows, tile rows], got 2 values}}
ttile.kernel @k(%n: memref<4xi32>, %a: memref<64x8xf32>) attributes {grid = array<i64: 8>, block = array<i64: 1>, row_segments = array<i64: 0, 64>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'row_segments' names argument #2 but the kernel has 2}}
ttile.kernel @k(%n: memref<4xi32>, %a: memref<64x8xf32>) attributes {grid = array<i64: 8>, block = array<i64: 1>, row_segments = array<i64: 2, 64, 8>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'row_segments' argument #1 must hold segment sizes ([S] or [B, S] i32), got 'memref<64x8xf32>'}}
ttile.kernel @k(%n: memref<4xi32>, %a: memref<64x8xf32>) attributes {grid = array<i64: 8>, block = array<i64: 1>, row_segments = array<i64: 1, 64, 8>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'row_segments' tile rows (7) must divide its rows (64)}}
ttile.kernel @k(%n: memref<4xi32>, %a: memref<64x8xf32>) attributes {grid = array<i64: 8>, block = array<i64: 1>, row_segments = array<i64: 0, 64, 7>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'row_segments' rows (64) do not split into the 3 blocks of argument #0}}
ttile.kernel @k(%n: memref<3x2xi32>, %a: memref<64x8xf32>) attributes {grid = array<i64: 8>, block = array<i64: 1>, row_segments = array<i64: 0, 64, 8>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'row_segments' needs a 1-D grid of whole row bands (8 bands)}}
ttile.kernel @k(%n: memref<4xi32>, %a: memref<64x8xf32>) attributes {grid = array<i64: 4>, block = array<i64: 1>, row_segments = array<i64: 0, 64, 8>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op argument #0 of kernel @k must be a statically shaped memref, got 'memref<?xf32>'}}
ttile.kernel @k(%a: memref<?xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'grid' must have 1 to 3 dimensions}}
ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64>, block = array<i64: 1>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'grid' must have 1 to 3 dimensions}}
ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1, 1, 1, 1>, block = array<i64: 1>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'grid' sizes must be >= 1, got 0}}
ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 2, 0>, block = array<i64: 1>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'block' sizes must be >= 1, got -1}}
ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: -1>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'block' must have 1 to 3 dimensions and at most 1024 threads}}
ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 64, 32>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'block' must have 1 to 3 dimensions and at most 1024 threads}}
ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op requires attribute 'grid'}}
ttile.kernel @k(%a: memref<8xf32>) attributes {block = array<i64: 1>} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op region #0 ('body') failed to verify constraint: region with 1 blocks}}
ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  // expected-error @below {{'ttile.return' op expects parent op 'ttile.kernel'}}
  "test.region"() ({ ttile.return }) : () -> ()
  ttile.return
}

// -----

//===----------------------------------------------------------------------===//
// ttile.program_id
//===----------------------------------------------------------------------===//

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 4>, block = array<i64: 1>} {
  // expected-error @below {{'ttile.program_id' op dim 1 is out of range for a grid of rank 1}}
  %0 = ttile.program_id 1
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 4>, block = array<i64: 1>} {
  // A negative dim is rejected too (the message shows it as an unsigned number).
  // expected-error-re @below {{'ttile.program_id' op dim -1 is out of range for a grid of rank 1}}
  %0 = ttile.program_id -1
  ttile.return
}

// -----

func.func @f() {
  // expected-error @below {{'ttile.program_id' op must be inside a ttile.kernel}}
  %0 = ttile.program_id 0
  return
}

// -----

//===----------------------------------------------------------------------===//
// ttile.load / ttile.store
//===----------------------------------------------------------------------===//

ttile.kernel @k(%a: memref<8x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op needs 2 offsets for 'source' 'memref<8x16xf32>', got 1}}
  %t = ttile.load %a[%c0] : memref<8x16xf32> -> !ttile.tile<4x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op tile '!ttile.tile<1x8x16xf32>' has a higher rank than 'source' 'memref<8x16xf32>'}}
  %t = ttile.load %a[%c0, %c0] : memref<8x16xf32> -> !ttile.tile<1x8x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op tile '!ttile.tile<4x16xf16>' and 'source' 'memref<8x16xf32>' have different element types}}
  %t = ttile.load %a[%c0, %c0] : memref<8x16xf32> -> !ttile.tile<4x16xf16>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<2x8x4x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'dims' must name 2 dimensions (one per tile dimension), got 3}}
  %t = ttile.load %a[%c0, %c0, %c0, %c0] {dims = array<i64: 0, 1, 3>} : memref<2x8x4x16xf32> -> !ttile.tile<4x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<2x8x4x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'dims' must be increasing dimensions of 'source' 'memref<2x8x4x16xf32>'}}
  %t = ttile.load %a[%c0, %c0, %c0, %c0] {dims = array<i64: 3, 1>} : memref<2x8x4x16xf32> -> !ttile.tile<4x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<2x8x4x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %t = ttile.fill 0.0 : !ttile.tile<3x16xf32>
  // expected-error @below {{'ttile.store' op tile '!ttile.tile<3x16xf32>' does not evenly divide 'dest' 'memref<2x8x4x16xf32>'}}
  ttile.store %t, %a[%c0, %c0, %c0, %c0] {dims = array<i64: 1, 3>} : !ttile.tile<3x16xf32>, memref<2x8x4x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<2x64x4x64xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'tma' loads trailing tiles (no 'dims')}}
  %t = ttile.load %a[%c0, %c0, %c0, %c0] {dims = array<i64: 1, 3>, tma} : memref<2x64x4x64xbf16> -> !ttile.tile<64x64xbf16>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op tile '!ttile.tile<3x16xf32>' does not evenly divide 'source' 'memref<8x16xf32>'}}
  %t = ttile.load %a[%c0, %c0] : memref<8x16xf32> -> !ttile.tile<3x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op tile '!ttile.tile<16x16xf32>' does not evenly divide 'source' 'memref<8x16xf32>'}}
  %t = ttile.load %a[%c0, %c0] : memref<8x16xf32> -> !ttile.tile<16x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %t = ttile.fill 0.0 : !ttile.tile<4x16xf32>
  // expected-error @below {{'ttile.store' op needs 2 offsets for 'dest' 'memref<8x16xf32>', got 3}}
  ttile.store %t, %a[%c0, %c0, %c0] : !ttile.tile<4x16xf32>, memref<8x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %t = ttile.fill 0.0 : !ttile.tile<4x16xi32>
  // expected-error @below {{'ttile.store' op tile '!ttile.tile<4x16xi32>' and 'dest' 'memref<8x16xf32>' have different element types}}
  ttile.store %t, %a[%c0, %c0] : !ttile.tile<4x16xi32>, memref<8x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %t = ttile.fill 0.0 : !ttile.tile<4x5xf32>
  // expected-error @below {{'ttile.store' op tile '!ttile.tile<4x5xf32>' does not evenly divide 'dest' 'memref<8x16xf32>'}}
  ttile.store %t, %a[%c0, %c0] : !ttile.tile<4x5xf32>, memref<8x16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  %c0 = arith.constant 0 : index
  %t = ttile.fill 0.0 : !ttile.tile<3xf32>
  // expected-error @below {{'ttile.store' op tile '!ttile.tile<3xf32>' does not evenly divide 'dest' 'memref<8x16xf32>'}}
  ttile.store %t, %a[%c0, %c0] : !ttile.tile<3xf32>, memref<8x16xf32>
  ttile.return
}

// -----

func.func @f(%a: memref<?x16xf32>) {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op operand #0 must be statically shaped memref of any type values, but got 'memref<?x16xf32>'}}
  %t = ttile.load %a[%c0, %c0] : memref<?x16xf32> -> !ttile.tile<4x16xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// ttile.dot
//===----------------------------------------------------------------------===//

func.func @f(%a: !ttile.tile<4x8x2xf32>, %b: !ttile.tile<8x16xf32>, %c: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.dot' op 'lhs', 'rhs' and 'acc' must be 2-D tiles}}
  %0 = ttile.dot %a, %b, %c : !ttile.tile<4x8x2xf32>, !ttile.tile<8x16xf32> -> !ttile.tile<4x16xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x8xf16>, %b: !ttile.tile<8x16xf32>, %c: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.dot' op 'lhs' '!ttile.tile<4x8xf16>' and 'rhs' '!ttile.tile<8x16xf32>' have different element types}}
  %0 = ttile.dot %a, %b, %c : !ttile.tile<4x8xf16>, !ttile.tile<8x16xf32> -> !ttile.tile<4x16xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x8xf32>, %b: !ttile.tile<16x16xf32>, %c: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.dot' op contraction dimensions differ: 'lhs' '!ttile.tile<4x8xf32>' vs 'rhs' '!ttile.tile<16x16xf32>'}}
  %0 = ttile.dot %a, %b, %c : !ttile.tile<4x8xf32>, !ttile.tile<16x16xf32> -> !ttile.tile<4x16xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x8xf32>, %b: !ttile.tile<8x16xf32>, %c: !ttile.tile<4x8xf32>) {
  // expected-error @below {{'ttile.dot' op 'acc' '!ttile.tile<4x8xf32>' must be 4x16 for 'lhs' '!ttile.tile<4x8xf32>' and 'rhs' '!ttile.tile<8x16xf32>'}}
  %0 = ttile.dot %a, %b, %c : !ttile.tile<4x8xf32>, !ttile.tile<8x16xf32> -> !ttile.tile<4x8xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x8xf32>, %b: !ttile.tile<8x16xf32>, %c: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.dot' op failed to verify that all of {acc, result} have same type}}
  %0 = "ttile.dot"(%a, %b, %c) : (!ttile.tile<4x8xf32>, !ttile.tile<8x16xf32>, !ttile.tile<4x16xf32>) -> !ttile.tile<4x16xf16>
  return
}

// -----

func.func @f(%a: !ttile.tile<64x64xf32>, %b: !ttile.tile<64x64xf32>, %c: !ttile.tile<64x64xf32>) {
  // expected-error @below {{'ttile.dot' op 'wgmma' needs bf16 or f16 operands and an f32 'acc', not '!ttile.tile<64x64xf32>' into '!ttile.tile<64x64xf32>'}}
  %0 = ttile.dot %a, %b, %c {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x64xf32>, !ttile.tile<64x64xf32> -> !ttile.tile<64x64xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<64x64xbf16>, %b: !ttile.tile<64x64xbf16>, %c: !ttile.tile<64x64xf32>) {
  // expected-error @below {{'ttile.dot' op 'wgmma' needs 'warps' = [M/16, 1] in whole warpgroups (M a multiple of 64): 'acc' is '!ttile.tile<64x64xf32>'}}
  %0 = ttile.dot %a, %b, %c {warps = array<i64: 2, 2>, wgmma} : !ttile.tile<64x64xbf16>, !ttile.tile<64x64xbf16> -> !ttile.tile<64x64xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<64x8xbf16>, %b: !ttile.tile<8x64xbf16>, %c: !ttile.tile<64x64xf32>) {
  // expected-error @below {{'ttile.dot' op 'wgmma' needs N a multiple of 8 up to 256 and K a multiple of 16 (m64nNk16 steps), not N = 64, K = 8}}
  %0 = ttile.dot %a, %b, %c {warps = array<i64: 4, 1>, wgmma} : !ttile.tile<64x8xbf16>, !ttile.tile<8x64xbf16> -> !ttile.tile<64x64xf32>
  return
}

// -----

ttile.kernel @k(%a: memref<64x64xf32>) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'tma' loads 2-D bf16 or f16 tiles, not '!ttile.tile<64x64xf32>'}}
  %t = ttile.load %a[%c0, %c0] {tma} : memref<64x64xf32> -> !ttile.tile<64x64xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<64x64xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'tma' needs tile columns a multiple of 64 (128-byte swizzled rows) and at most 256 rows, not '!ttile.tile<64x32xbf16>'}}
  %t = ttile.load %a[%c0, %c0] {tma} : memref<64x64xbf16> -> !ttile.tile<64x32xbf16>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<1x1x1x1x64x64xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'tma' needs a 'source' of rank 5 or less, not 'memref<1x1x1x1x64x64xbf16>'}}
  %t = ttile.load %a[%c0, %c0, %c0, %c0, %c0, %c0] {tma} : memref<1x1x1x1x64x64xbf16> -> !ttile.tile<64x64xbf16>
  ttile.return
}

// -----

func.func @f(%a: memref<64x64xbf16>) {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'tma' loads from a kernel argument (its tensor map is built on the host)}}
  %t = ttile.load %a[%c0, %c0] {tma} : memref<64x64xbf16> -> !ttile.tile<64x64xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// Elementwise ops and ttile.reduce
//===----------------------------------------------------------------------===//

func.func @f(%a: !ttile.tile<4x8xf32>, %b: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.add' op requires the same type for all operands and results}}
  %0 = "ttile.add"(%a, %b) : (!ttile.tile<4x8xf32>, !ttile.tile<4x16xf32>) -> !ttile.tile<4x8xf32>
  return
}

// -----

func.func @f(%a: tensor<4xf32>) {
  // expected-error @below {{'ttile.exp' op operand #0 must be a statically shaped tile of elements held by one kernel instance, but got 'tensor<4xf32>'}}
  %0 = "ttile.exp"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.reduce' op dim 2 is out of range for 'input' '!ttile.tile<4x16xf32>'}}
  %0 = ttile.reduce %a {kind = #tgraph.reduction<sum>, dim = 2 : i64} : !ttile.tile<4x16xf32> -> !ttile.tile<4x1xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.reduce' op result '!ttile.tile<4x16xf32>' must be 'input' '!ttile.tile<4x16xf32>' with dimension 1 reduced to 1}}
  %0 = ttile.reduce %a {kind = #tgraph.reduction<max>, dim = 1 : i64} : !ttile.tile<4x16xf32> -> !ttile.tile<4x16xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.reduce' op result '!ttile.tile<4x1xf16>' must be 'input' '!ttile.tile<4x16xf32>' with dimension 1 reduced to 1}}
  %0 = ttile.reduce %a {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<4x16xf32> -> !ttile.tile<4x1xf16>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x16xf32>) {
  // expected-error-re @below {{'ttile.reduce' op dim -1 is out of range for 'input' '!ttile.tile<4x16xf32>'}}
  %0 = ttile.reduce %a {kind = #tgraph.reduction<sum>, dim = -1 : i64} : !ttile.tile<4x16xf32> -> !ttile.tile<4x1xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.reduce' op requires attribute 'kind'}}
  %0 = ttile.reduce %a {dim = 1 : i64} : !ttile.tile<4x16xf32> -> !ttile.tile<4x1xf32>
  return
}

// -----

func.func @f(%a: !ttile.tile<4x16xf32>) {
  // expected-error @below {{'ttile.reduce' op attribute 'kind' failed to satisfy constraint: #tgraph.reduction attribute}}
  %0 = ttile.reduce %a {kind = "sum", dim = 1 : i64} : !ttile.tile<4x16xf32> -> !ttile.tile<4x1xf32>
  return
}

// -----

ttile.kernel @int_fill(%a: memref<4xi32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op value 1.500000e+00 is not an integer but the tile holds 'i32'}}
  %0 = ttile.fill 1.5 : !ttile.tile<4xi32>
  ttile.return
}

// -----

ttile.kernel @k(%x: memref<2x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %x[%c0, %c0] : memref<2x8xf32> -> !ttile.tile<2x8xf32>
  // expected-error @below {{'ttile.broadcast' op only size-1 dimensions broadcast: '!ttile.tile<2x8xf32>' to '!ttile.tile<4x8xf32>'}}
  %b = ttile.broadcast %t : !ttile.tile<2x8xf32> to !ttile.tile<4x8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%x: memref<f32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op a 0-d 'source' 'memref<f32>' is accessed with no offsets or dims as a one-element 1-D tile of its element type}}
  %t = ttile.load %x[%c0] : memref<f32> -> !ttile.tile<1xf32>
  ttile.return
}

// -----

ttile.kernel @k(%x: memref<2x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.iota' op dim 2 is out of range for '!ttile.tile<2x8xi32>'}}
  %t = ttile.iota %c0 dim 2 : !ttile.tile<2x8xi32>
  ttile.return
}

// -----

// GPU parameters: pipeline stages and the warp grid of a dot.

// expected-error @below {{'ttile.kernel' op 'stages' must be 1 to 8, got 0}}
ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>, stages = 0 : i64} {
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<32x32xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %x = ttile.load %a[%c0, %c0] : memref<32x32xbf16> -> !ttile.tile<32x32xbf16>
  %acc = ttile.fill 0.0 : !ttile.tile<32x32xf32>
  // expected-error @below {{'ttile.dot' op 'warps' [3, 1] do not evenly split 'acc' '!ttile.tile<32x32xf32>'}}
  %d = ttile.dot %x, %x, %acc {warps = array<i64: 3, 1>} : !ttile.tile<32x32xbf16>, !ttile.tile<32x32xbf16> -> !ttile.tile<32x32xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<32x32xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %x = ttile.load %a[%c0, %c0] : memref<32x32xbf16> -> !ttile.tile<32x32xbf16>
  %acc = ttile.fill 0.0 : !ttile.tile<32x32xf32>
  // expected-error @below {{'ttile.dot' op 'warps' [2, 4] need 256 threads but the kernel's block has 128}}
  %d = ttile.dot %x, %x, %acc {warps = array<i64: 2, 4>} : !ttile.tile<32x32xbf16>, !ttile.tile<32x32xbf16> -> !ttile.tile<32x32xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<32x32xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 128>} {
  %c0 = arith.constant 0 : index
  %x = ttile.load %a[%c0, %c0] : memref<32x32xbf16> -> !ttile.tile<32x32xbf16>
  %acc = ttile.fill 0.0 : !ttile.tile<32x32xf32>
  // expected-error @below {{'ttile.dot' op 'warps' must be two sizes >= 1 (warps along M and N)}}
  %d = ttile.dot %x, %x, %acc {warps = array<i64: 4>} : !ttile.tile<32x32xbf16>, !ttile.tile<32x32xbf16> -> !ttile.tile<32x32xf32>
  ttile.return
}

// -----

ttile.kernel @k(%n: memref<4xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load_scalar' op reads an index from an integer buffer, got 'memref<4xf32>'}}
  %r = ttile.load_scalar %n[%c0] : memref<4xf32>
  ttile.return
}

// -----

ttile.kernel @k(%n: memref<2x4xi32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load_scalar' op needs one index per dimension of 'memref<2x4xi32>', got 1}}
  %r = ttile.load_scalar %n[%c0] : memref<2x4xi32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<16x32xf32>, %all: memref<64x32xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.put' op 'dest' must be a kernel argument marked {ttile.symmetric} (a buffer every PE allocated with nvshmem_malloc)}}
  ttile.put %a[%c0, %c0] to %all[%c0, %c0] on %c0 {shape = array<i64: 16, 32>} : memref<16x32xf32> -> memref<64x32xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<16x32xf32>, %all: memref<64x32xf32> {ttile.symmetric}) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.put' op 'shape' [1] = 64 does not fit 'source' 'memref<16x32xf32>' and 'dest' 'memref<64x32xf32>'}}
  ttile.put %a[%c0, %c0] to %all[%c0, %c0] on %c0 {shape = array<i64: 16, 64>} : memref<16x32xf32> -> memref<64x32xf32>
  ttile.return
}

// -----

ttile.kernel @k(%all: memref<64x32xf32>, %a: memref<16x32xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.get' op 'source' must be a kernel argument marked {ttile.symmetric} (a buffer every PE allocated with nvshmem_malloc)}}
  ttile.get %all[%c0, %c0] on %c0 to %a[%c0, %c0] {shape = array<i64: 16, 32>} : memref<64x32xf32> -> memref<16x32xf32>
  ttile.return
}

// -----

ttile.kernel @k(%all: memref<64x32xf32> {ttile.symmetric}, %a: memref<16x32xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.get' op 'source' 'memref<64x32xf32>' and 'dest' 'memref<16x32xbf16>' have different element types}}
  ttile.get %all[%c0, %c0] on %c0 to %a[%c0, %c0] {shape = array<i64: 16, 32>} : memref<64x32xf32> -> memref<16x32xbf16>
  ttile.return
}

// -----

ttile.kernel @k(%all: memref<64x32xf32> {ttile.symmetric}, %a: memref<16x32xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.get' op needs one offset per dimension of 'source' and 'dest'}}
  ttile.get %all[%c0] on %c0 to %a[%c0, %c0] {shape = array<i64: 16, 32>} : memref<64x32xf32> -> memref<16x32xf32>
  ttile.return
}

// -----

ttile.kernel @k(%flags: memref<4xi32> {ttile.symmetric}) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.signal' op 'signals' must be a 1-D buffer of i64 signal words, got 'memref<4xi32>'}}
  ttile.signal %flags[%c0], %c0 on %c0 {kind = "set"} : memref<4xi32>
  ttile.return
}

// -----

ttile.kernel @k(%flags: memref<4xi64> {ttile.symmetric}) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.signal' op 'kind' must be "set" or "add", got "xor"}}
  ttile.signal %flags[%c0], %c0 on %c0 {kind = "xor"} : memref<4xi64>
  ttile.return
}

// -----

ttile.kernel @k(%flags: memref<4xi64> {ttile.symmetric}) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.wait' op 'cmp' must be one of eq, ne, gt, ge, lt, le; got "gte"}}
  ttile.wait %flags[%c0], %c0 {cmp = "gte"} : memref<4xi64>
  ttile.return
}

// -----

ttile.kernel @k(%x: memref<2x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %x[%c0, %c0] : memref<2x8xf32> -> !ttile.tile<2x8xf32>
  // expected-error @below {{'ttile.transpose' op transposes a 2-D tile: '!ttile.tile<2x8xf32>' cannot become '!ttile.tile<2x8xf32>'}}
  %b = ttile.transpose %t : !ttile.tile<2x8xf32> to !ttile.tile<2x8xf32>
  ttile.return
}

// -----

// A producer warpgroup needs whole warpgroups and at least one besides it.
// expected-error @below {{'ttile.kernel' op 'producer_warpgroup' needs a 1-D block of whole warpgroups, one of them computing besides the producer (256 threads or more), got 128 threads}}
ttile.kernel @k(%a: memref<32x32xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 128>, producer_warpgroup} {
  ttile.return
}

// -----

// expected-error @below {{'ttile.kernel' op 'producer_warpgroup' needs a 1-D block of whole warpgroups}}
ttile.kernel @k(%a: memref<32x32xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 320>, producer_warpgroup} {
  ttile.return
}

// -----

// The dot's warps do not count the producer warpgroup.
ttile.kernel @k(%a: memref<128x64xbf16>, %b: memref<64x256xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 256>, producer_warpgroup} {
  %c0 = arith.constant 0 : index
  %x = ttile.load %a[%c0, %c0] : memref<128x64xbf16> -> !ttile.tile<128x64xbf16>
  %y = ttile.load %b[%c0, %c0] : memref<64x256xbf16> -> !ttile.tile<64x256xbf16>
  %acc = ttile.fill 0.0 : !ttile.tile<128x256xf32>
  // expected-error @below {{'ttile.dot' op 'warps' [8, 1] need 256 threads but the kernel's block has, besides its producer warpgroup, 128}}
  %d = ttile.dot %x, %y, %acc {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
  ttile.return
}
// -----

// The GPU schedule's attributes (set by tessera-gpu-software-pipeline, -place and
// -alloc-shared) are checked like the ops.

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @+2 {{pipeline stages must be 1 to 8, got 0}}
  scf.for %i = %c0 to %c0 step %c0 {
  } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = mma_sync, copies = cp_async, stages = 0>}
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @+2 {{pipeline lag (wgmma groups in flight) must be below its 2 stages, got 2}}
  scf.for %i = %c0 to %c0 step %c0 {
  } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = wgmma, copies = cp_async, stages = 2, lag = 2>}
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @+2 {{a pipeline filled by TMA must be a wgmma one}}
  scf.for %i = %c0 to %c0 step %c0 {
  } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = mma_sync, copies = tma, stages = 2>}
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @+2 {{a producer warpgroup feeds only a GEMM main loop's TMA ring}}
  scf.for %i = %c0 to %c0 step %c0 {
  } {ttile.pipeline = #ttile.pipeline<kind = registers, mma = wgmma, copies = tma, stages = 2, producer = true>}
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @+2 {{ping-pong and issuing ahead are for wgmma loops with their tiles in registers}}
  scf.for %i = %c0 to %c0 step %c0 {
  } {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = wgmma, copies = cp_async, stages = 2, pingpong = true>}
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @+2 {{issuing ahead needs a TMA ring of 3 stages or more, without ping-pong}}
  scf.for %i = %c0 to %c0 step %c0 {
  } {ttile.pipeline = #ttile.pipeline<kind = registers, mma = wgmma, copies = tma, stages = 2, issue_ahead = true>}
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.pipeline' belongs on an scf.for}}
  %x = ttile.fill 0.0 {ttile.pipeline = #ttile.pipeline<kind = gemm, mma = mma_sync, copies = cp_async, stages = 2>} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{expected ::tessera::ttile::Placement to be one of: registers, shared, fragment, column, row, staged, staged_transposed, literal, broadcast, global}}
  // expected-error @below {{failed to parse TTile_PlaceAttr parameter 'value' which is to be a `::tessera::ttile::Placement`}}
  %x = ttile.fill 0.0 {ttile.place = #ttile.place<nowhere>} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.place' must be #ttile.place (or an array of them, one per result), got "shared"}}
  %x = ttile.fill 0.0 {ttile.place = "shared"} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %x = ttile.fill 0.0 : !ttile.tile<8xf32>
  // expected-error @below {{'scf.for' op 'ttile.place' of an op with 2 results must be an array of #ttile.place, one per result}}
  %r:2 = scf.for %i = %c0 to %c0 step %c0 iter_args(%u = %x, %v = %x) -> (!ttile.tile<8xf32>, !ttile.tile<8xf32>) {
    scf.yield %u, %v : !ttile.tile<8xf32>, !ttile.tile<8xf32>
  } {ttile.place = #ttile.place<shared>}
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.smem' offsets must be 16-byte aligned bytes, got 12}}
  %x = ttile.fill 0.0 {ttile.smem = 12 : i64} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.smem' must list one offset per result (1), got 2}}
  %x = ttile.fill 0.0 {ttile.smem = array<i64: 0, 16>} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.region' must be >= 0, got -1}}
  %x = ttile.fill 0.0 {ttile.region = -1 : i64} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.domain' belongs on the first op of a pointwise region (one with 'ttile.region')}}
  %x = ttile.fill 0.0 {ttile.domain = array<i64: 8>} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.spill' is a unit attribute, got true}}
  %x = ttile.fill 0.0 {ttile.spill = true} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.pingpong' belongs on an scf.for}}
  %x = ttile.fill 0.0 {ttile.pingpong} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'scf.for' op 'ttile.barriers' offsets must be 8-byte aligned bytes, got 4}}
  scf.for %i = %c0 to %c0 step %c0 {
  } {ttile.barriers = array<i64: 0, 4>}
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.ring' belongs on an scf.for}}
  %x = ttile.fill 0.0 {ttile.ring = 0 : i64} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.shared_in' must list #ttile.mma branches, got ["wgmma"]}}
  %x = ttile.fill 0.0 {ttile.shared_in = ["wgmma"]} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.fallback' must be a string (why), got 1 : i64}}
  %x = ttile.fill 0.0 {ttile.fallback = 1 : i64} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.smem_bytes' belongs on a ttile.kernel}}
  %x = ttile.fill 0.0 {ttile.smem_bytes = 0 : i64} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op unknown Tile IR attribute 'ttile.plcae'}}
  %x = ttile.fill 0.0 {ttile.plcae = #ttile.place<shared>} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%x: memref<2x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.dropout_factor' op 'p' must lie in (0, 1), got 1}}
  %t = ttile.dropout_factor %c0, %c0 at %c0 {p = 1.0 : f64, strides = array<i64: 8, 1>} : !ttile.tile<2x8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%x: memref<2x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.dropout_factor' op result must be a 2-D float tile, got '!ttile.tile<2x8xi32>'}}
  %t = ttile.dropout_factor %c0, %c0 at %c0 {p = 0.5 : f64, strides = array<i64: 8, 1>} : !ttile.tile<2x8xi32>
  ttile.return
}
