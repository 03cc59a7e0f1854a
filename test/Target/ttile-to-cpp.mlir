// RUN: tessera-translate --ttile-to-cpp %s --split-input-file --verify-diagnostics | FileCheck %s

// Every ttile op, in one kernel: the grid becomes loops over program ids, tiles
// become local arrays, scf.for carries the accumulator. The outermost grid
// loop runs a range (everything__range), which the CPU engine splits over
// its threads; everything runs the whole grid.
// CHECK: extern "C" const int64_t everything__grid = 2;
// CHECK-NEXT: extern "C" void everything__range(void* arg0_, void* arg1_, void* arg2_, void* arg3_, int64_t pid0_begin, int64_t pid0_end) {
// CHECK-NEXT: float* __restrict__ arg0 = static_cast<float*>(arg0_);  // memref<8x4xf32>
// CHECK-DAG: float [[ACC:t[0-9]+]][16];  // tile 4x4
// CHECK: for (int64_t pid0 = pid0_begin; pid0 < pid0_end; ++pid0) {
// CHECK: [[ACC]][{{e[0-9]+}}] = (float)0.0;
// CHECK: [[IT:t[0-9]+]][{{e[0-9]+}}] = [[ACC]][{{e[0-9]+}}];
// CHECK: for (int64_t [[K:k[0-9]+]] = {{c[0-9]+}}; [[K]] < {{c[0-9]+}}; [[K]] += {{c[0-9]+}}) {
// CHECK: = arg0[
// dot: float tiles accumulate in place into the tile the loop carries (the
// register-blocked tessera_dot from the prelude; the yield copies nothing)
// CHECK: tessera_dot({{t[0-9]+}}, {{t[0-9]+}}, [[IT]], 4, 2, 4);
// CHECK-NEXT: }
// the exp2, stored once into a buffer nothing loads and also reduced, is
// computed in place there (the reduction reads it there)
// CHECK: float* __restrict__ [[E:t[0-9]+]] = arg2 + (
// relu, add, mul, max, exp, exp2 (the vectorizable exp of x ln 2), reduce
// CHECK: < 0 ? 0 : {{.*}})
// CHECK: tessera_exp(
// CHECK: [[E]][{{e[0-9]+}}] = tessera_exp(({{.*}}) * 0.69314718055994531f)
// the reduction, stored once into a buffer nothing loads, is computed in place
// CHECK: float* __restrict__ [[R:t[0-9]+]] = arg3 + (
// CHECK: float acc = [[E]][
// CHECK: for (int64_t q = 1; q < 4; ++q)
// CHECK: [[R]][{{e[0-9]+}}] = acc;
// CHECK: extern "C" void everything(void* arg0_, void* arg1_, void* arg2_, void* arg3_) {
// CHECK-NEXT: everything__range(arg0_, arg1_, arg2_, arg3_, 0, 2);
tgraph.mesh @unused axes = ["x"] shape = [1]
ttile.kernel @everything(%a: memref<8x4xf32>, %b: memref<4x4xf32>, %c: memref<8x4xf32>, %r: memref<8x1xf32>)
    attributes {grid = array<i64: 2>, block = array<i64: 64>} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %row = arith.muli %pid, %c4 : index
  %acc0 = ttile.fill 0.0 : !ttile.tile<4x4xf32>
  %acc = scf.for %k = %c0 to %c4 step %c2 iter_args(%it = %acc0) -> (!ttile.tile<4x4xf32>) {
    %ta = ttile.load %a[%row, %k] : memref<8x4xf32> -> !ttile.tile<4x2xf32>
    %tb = ttile.load %b[%k, %c0] : memref<4x4xf32> -> !ttile.tile<2x4xf32>
    %d = ttile.dot %ta, %tb, %it : !ttile.tile<4x2xf32>, !ttile.tile<2x4xf32> -> !ttile.tile<4x4xf32>
    scf.yield %d : !ttile.tile<4x4xf32>
  }
  %r0 = ttile.relu %acc : !ttile.tile<4x4xf32>
  %s = ttile.add %r0, %acc : !ttile.tile<4x4xf32>
  %m = ttile.mul %s, %s : !ttile.tile<4x4xf32>
  %x = ttile.max %m, %s : !ttile.tile<4x4xf32>
  %ex = ttile.exp %x : !ttile.tile<4x4xf32>
  %e = ttile.exp2 %ex : !ttile.tile<4x4xf32>
  ttile.barrier
  ttile.store %e, %c[%row, %c0] : !ttile.tile<4x4xf32>, memref<8x4xf32>
  %red = ttile.reduce %e {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<4x4xf32> -> !ttile.tile<4x1xf32>
  ttile.store %red, %r[%row, %c0] : !ttile.tile<4x1xf32>, memref<8x1xf32>
  ttile.return
}

// -----

// A long row reduction keeps 8 lanes (vectorizable; combined in a fixed
// tree), a short one stays one sequential loop, and one over a leading
// dimension adds rows in order with the loop over outputs innermost.
// CHECK-LABEL: void reductions__range(
// CHECK: float lane[8];
// CHECK: for (int64_t q = 8; q < 32; q += 8) {
// CHECK-NEXT: #pragma GCC ivdep
// CHECK-NEXT: for (int64_t l = 0; l < 8; ++l) lane[l] = lane[l] + row[q + l];
// CHECK: for (int64_t q = 32; q < 37; ++q) lane[q - 32] = lane[q - 32] + row[q];
// CHECK: lane[0] = lane[0] + lane[1];
// CHECK: lane[0] = lane[0] + lane[4];
// CHECK: for (int64_t [[Q:q[0-9]+]] = 1; [[Q]] < 4; ++[[Q]]) {
// CHECK-NEXT: #pragma GCC ivdep
// CHECK-NEXT: for (int64_t [[I:i[0-9]+]] = 0; [[I]] < 37; ++[[I]])
ttile.kernel @reductions(%x: memref<4x37xf32>, %rows: memref<4x1xf32>, %cols: memref<1x37xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %x[%c0, %c0] : memref<4x37xf32> -> !ttile.tile<4x37xf32>
  %r = ttile.reduce %t {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<4x37xf32> -> !ttile.tile<4x1xf32>
  %c = ttile.reduce %t {kind = #tgraph.reduction<sum>, dim = 0 : i64} : !ttile.tile<4x37xf32> -> !ttile.tile<1x37xf32>
  ttile.store %r, %rows[%c0, %c0] : !ttile.tile<4x1xf32>, memref<4x1xf32>
  ttile.store %c, %cols[%c0, %c0] : !ttile.tile<1x37xf32>, memref<1x37xf32>
  ttile.return
}

// -----

// expected-error @+1 {{element type i16 is not supported by the kernel emitter yet}}
ttile.kernel @short_ints(%a: memref<4x4xi16>, %b: memref<4x4xi16>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %a[%c0, %c0] : memref<4x4xi16> -> !ttile.tile<4x4xi16>
  ttile.store %t, %b[%c0, %c0] : !ttile.tile<4x4xi16>, memref<4x4xi16>
  ttile.return
}

// -----

ttile.kernel @float_scalar(%a: memref<4xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @+1 {{only integer/index constants are supported in kernels}}
  %f = arith.constant 1.0 : f32
  ttile.return
}

// -----

ttile.kernel @nvshmem_on_cpu(%a: memref<4xi64> {ttile.symmetric}) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  // expected-error @+1 {{'ttile.quiet' is NVSHMEM device communication; it needs the GPU target (tessera-translate --ttile-to-cuda)}}
  ttile.quiet
  ttile.return
}

// -----

// A run of elementwise ops and fills over tiles of one size is one loop: the
// tiles only the run reads are scalars in it (element for element the same
// operations, so the same bits). Its load of whole rows reads the buffer in
// place, and the tile it stores is computed in place in the output: no
// arrays, no copies.
// CHECK-LABEL: void chain__range(
// CHECK-NOT: float t{{[0-9]+}}[
// CHECK: const float* __restrict__ [[T:t[0-9]+]] = arg0 + (
// CHECK-NEXT: float* __restrict__ [[OUT:t[0-9]+]] = arg1 + (
// CHECK-NEXT: #pragma GCC ivdep
// CHECK-NEXT: for (int64_t [[E:e[0-9]+]] = 0; [[E]] < 16; ++[[E]]) {
// CHECK-NEXT: const float [[H:v[0-9]+]] = (float)0.5;
// CHECK-NEXT: const float [[M:v[0-9]+]] = [[T]][[[E]]] * [[H]];
// CHECK-NEXT: const float [[S:v[0-9]+]] = [[M]] + [[T]][[[E]]];
// CHECK-NEXT: [[OUT]][[[E]]] = tessera_exp([[S]]);
// CHECK-NEXT: }
// CHECK-NOT: arg1[
// CHECK: extern "C" void chain(
ttile.kernel @chain(%a: memref<8x4xf32>, %c: memref<8x4xf32>)
    attributes {grid = array<i64: 2>, block = array<i64: 64>} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %row = arith.muli %pid, %c4 : index
  %t = ttile.load %a[%row, %c0] : memref<8x4xf32> -> !ttile.tile<4x4xf32>
  %half = ttile.fill 0.5 : !ttile.tile<4x4xf32>
  %m = ttile.mul %t, %half : !ttile.tile<4x4xf32>
  %s = ttile.add %m, %t : !ttile.tile<4x4xf32>
  %e = ttile.exp %s : !ttile.tile<4x4xf32>
  ttile.store %e, %c[%row, %c0] : !ttile.tile<4x4xf32>, memref<8x4xf32>
  ttile.return
}

// -----

// `row_segments`: an instance whose 8-row band lies past its block's
// segments (2 blocks of 32 rows; sizes in %n) skips its work.
// CHECK-LABEL: void padded__range(
// CHECK: for (int64_t pid0 = pid0_begin; pid0 < pid0_end; ++pid0) {
// CHECK-NEXT: if (tessera_past_segments(arg0, 2, 32, ((pid0) / 1) * 8, 8)) continue;
ttile.kernel @padded(%n: memref<2x2xi32>, %x: memref<64x8xf32>, %y: memref<64x8xf32>) attributes {grid = array<i64: 8>, block = array<i64: 128>, row_segments = array<i64: 0, 64, 8>} {
  %pid = ttile.program_id 0
  %c8 = arith.constant 8 : index
  %c0 = arith.constant 0 : index
  %row = arith.muli %pid, %c8 : index
  %t = ttile.load %x[%row, %c0] : memref<64x8xf32> -> !ttile.tile<8x8xf32>
  %e = ttile.exp %t : !ttile.tile<8x8xf32>
  ttile.store %e, %y[%row, %c0] : !ttile.tile<8x8xf32>, memref<64x8xf32>
  ttile.return
}

// -----

// `ttile.load_scalar`: an index read from an integer buffer (here the row a
// copy starts at).
// CHECK-LABEL: void from_row__range(
// CHECK: const int64_t [[S:s[0-9]+]] = (int64_t)arg0[{{c[0-9]+}}];
// CHECK: const int64_t {{p[0-9]+}}_base = [[S]] * 8
ttile.kernel @from_row(%n: memref<2xi32>, %x: memref<8x8xf32>, %y: memref<1x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %row = ttile.load_scalar %n[%c0] : memref<2xi32>
  %t = ttile.load %x[%row, %c0] : memref<8x8xf32> -> !ttile.tile<1x8xf32>
  ttile.store %t, %y[%c0, %c0] : !ttile.tile<1x8xf32>, memref<1x8xf32>
  ttile.return
}

// -----

// A tile along `dims` (one head's rows of a [batch, seq, head, d] buffer) is
// copied row by row with the buffer's strides: rows 4 x 32 = 128 elements
// apart, never a view or computed in place (its rows are not contiguous).
// CHECK-LABEL: extern "C" void head_rows__range(
// CHECK: const int64_t [[LB:p[0-9]+]]_base = {{c[0-9]+}} * 8192 + {{c[0-9]+}} * 128 + {{i[0-9]+}} * 32 + {{c[0-9]+}} * 1;
// CHECK: for (int64_t [[R:i[0-9]+]] = 0; [[R]] < 16; ++[[R]]) {
// CHECK: for (int64_t [[C:i[0-9]+]] = 0; [[C]] < 32; ++[[C]]) {
// CHECK-NEXT: {{t[0-9]+}}[[[LB]]++] = arg0[[[LB]]_base + [[R]] * 128 + [[C]] * 1];
// CHECK: arg1[{{p[0-9]+}}_base + {{i[0-9]+}} * 128 + {{i[0-9]+}} * 1] = {{t[0-9]+}}[{{p[0-9]+}}++];
ttile.kernel @head_rows(%a: memref<2x64x4x32xf32>, %b: memref<2x64x4x32xf32>) attributes {grid = array<i64: 8>, block = array<i64: 128>} {
  %pid = ttile.program_id 0
  %c4 = arith.constant 4 : index
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %h = arith.remui %pid, %c4 : index
  %t = ttile.load %a[%c0, %c16, %h, %c0] {dims = array<i64: 1, 3>} : memref<2x64x4x32xf32> -> !ttile.tile<16x32xf32>
  %e = ttile.exp %t : !ttile.tile<16x32xf32>
  ttile.store %e, %b[%c0, %c16, %h, %c0] {dims = array<i64: 1, 3>} : !ttile.tile<16x32xf32>, memref<2x64x4x32xf32>
  ttile.return
}
