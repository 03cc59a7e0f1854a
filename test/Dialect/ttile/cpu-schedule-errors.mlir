// The CPU schedule's attributes (TTile.td, "The CPU schedule") on the wrong
// op, of the wrong type, or with values the C++ printer cannot honour.
// RUN: tessera-opt %s -split-input-file -verify-diagnostics

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.in_place' belongs on a ttile.load or a ttile.store}}
  %x = ttile.fill 0.0 {ttile.in_place} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'ttile.in_place' is a unit attribute, got true}}
  %x = ttile.load %a[%c0] {ttile.in_place = true} : memref<8xf32> -> !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'ttile.in_place' reads a buffer the kernel stores to (a view would see the store)}}
  %x = ttile.load %a[%c0] {ttile.in_place} : memref<8xf32> -> !ttile.tile<8xf32>
  %y = ttile.neg %x : !ttile.tile<8xf32>
  ttile.store %y, %a[%c0] : !ttile.tile<8xf32>, memref<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'ttile.in_place' needs a tile that is one contiguous block of a buffer that is not 0-d, bf16 or FP8}}
  %x = ttile.load %a[%c0, %c0] {ttile.in_place} : memref<8x8xf32> -> !ttile.tile<4x4xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xbf16>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'ttile.in_place' needs a tile that is one contiguous block of a buffer that is not 0-d, bf16 or FP8}}
  %x = ttile.load %a[%c0] {ttile.in_place} : memref<8xbf16> -> !ttile.tile<8xbf16>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>, %b: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %x = ttile.load %a[%c0] : memref<8xf32> -> !ttile.tile<8xf32>
  %y = ttile.neg %x : !ttile.tile<8xf32>
  // expected-error @below {{'ttile.store' op 'ttile.in_place' needs a buffer the kernel stores only there and never loads (2 stores, 0 loads)}}
  ttile.store %y, %b[%c0] {ttile.in_place} : !ttile.tile<8xf32>, memref<8xf32>
  ttile.store %x, %b[%c0] : !ttile.tile<8xf32>, memref<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<16xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %x = ttile.fill 1.0 : !ttile.tile<8xf32>
  %c8 = arith.constant 8 : index
  // expected-error @below {{'ttile.store' op 'ttile.in_place' needs its offsets computed before the tile}}
  ttile.store %x, %a[%c8] {ttile.in_place} : !ttile.tile<8xf32>, memref<16xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %x = ttile.fill 1.0 : !ttile.tile<8xf32>
  %r = scf.for %i = %c0 to %c1 step %c1 iter_args(%it = %x) -> (!ttile.tile<8xf32>) {
    scf.yield %it : !ttile.tile<8xf32>
  }
  // expected-error @below {{'ttile.store' op 'ttile.in_place' stores a tile held in another value's array (scf.for)}}
  ttile.store %r, %a[%c0] {ttile.in_place} : !ttile.tile<8xf32>, memref<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %x = ttile.fill 1.0 : !ttile.tile<8x8xf32>
  // expected-error @below {{'ttile.fill' op 'ttile.accumulate' belongs on a ttile.dot}}
  %y = ttile.fill 1.0 {ttile.accumulate} : !ttile.tile<8x8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %x = ttile.fill 1.0 : !ttile.tile<8x8xf32>
  // expected-error @below {{'ttile.dot' op 'ttile.accumulate' needs the dot to be its accumulator's only use, in the accumulator's block}}
  %y = ttile.dot %x, %x, %x {ttile.accumulate} : !ttile.tile<8x8xf32>, !ttile.tile<8x8xf32> -> !ttile.tile<8x8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %x = ttile.fill 1.0 : !ttile.tile<8x8xf32>
  %acc = ttile.load %a[%c0, %c0] {ttile.in_place} : memref<8x8xf32> -> !ttile.tile<8x8xf32>
  // expected-error @below {{'ttile.dot' op 'ttile.accumulate' into a load read in place (a buffer)}}
  %y = ttile.dot %x, %x, %acc {ttile.accumulate} : !ttile.tile<8x8xf32>, !ttile.tile<8x8xf32> -> !ttile.tile<8x8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.fused' must be >= 0, got -1}}
  %x = ttile.fill 0.0 {ttile.fused = -1 : i64} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %x = ttile.fill 1.0 : !ttile.tile<8x8xf32>
  // expected-error @below {{'ttile.dot' op 'ttile.fused' belongs on an elementwise op, a fill, an iota, a dropout factor, a broadcast or a ttile.load {ttile.in_place}}}
  %y = ttile.dot %x, %x, %x {ttile.fused = 0 : i64} : !ttile.tile<8x8xf32>, !ttile.tile<8x8xf32> -> !ttile.tile<8x8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.fused' loop 0 is not consecutive ops of its block (interrupted by 'arith.constant')}}
  %x = ttile.fill 0.0 {ttile.fused = 0 : i64} : !ttile.tile<8xf32>
  %c0 = arith.constant 0 : index
  %y = ttile.neg %x {ttile.fused = 0 : i64} : !ttile.tile<8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @below {{'ttile.fill' op 'ttile.fused' loop 0 holds tiles of 8 and 4 elements}}
  %x = ttile.fill 0.0 {ttile.fused = 0 : i64} : !ttile.tile<8xf32>
  %y = ttile.fill 0.0 {ttile.fused = 0 : i64} : !ttile.tile<4xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %x = ttile.fill 0.0 {ttile.fused = 0 : i64} : !ttile.tile<4x8xf32>
  // expected-error @below {{'ttile.broadcast' op 'ttile.fused' on a broadcast its loop cannot index (one last dimension for the loop's broadcasts, a source the loop does not compute)}}
  %y = ttile.broadcast %x {ttile.fused = 0 : i64} : !ttile.tile<4x8xf32> to !ttile.tile<4x8xf32>
  ttile.return
}

// -----

ttile.kernel @k(%a: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  // expected-error @below {{'ttile.load' op 'ttile.fused' loop 0 computes nothing (only loads)}}
  %x = ttile.load %a[%c0] {ttile.fused = 0 : i64, ttile.in_place} : memref<8xf32> -> !ttile.tile<8xf32>
  ttile.return
}
