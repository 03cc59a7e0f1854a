// RUN: tessera-opt %s --split-input-file --tessera-verify-schedule --verify-diagnostics | FileCheck %s

// Rank 0 sends to rank 1, which receives and sends back: every send pairs
// with its recv in order and nothing waits forever.
tgraph.mesh @mesh axes = ["pp"] shape = [2]
// CHECK-LABEL: func.func @ping_pong
func.func @ping_pong(%a: memref<4xf32>, %b: memref<4xf32>, %c: memref<4xf32>) {
  %comm = tsched.stream "comm"
  %s0 = tsched.send %a to 1 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 0 : i64}} : memref<4xf32>
  %r1 = tsched.recv %b from 0 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 1 : i64}} : memref<4xf32>
  tsched.collective_wait %r1 on %comm {tsched.action = {axis = "pp", rank = 1 : i64}}
  %s1 = tsched.send %b to 0 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 1 : i64}} : memref<4xf32>
  %r0 = tsched.recv %c from 1 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 0 : i64}} : memref<4xf32>
  tsched.collective_wait %r0 on %comm {tsched.action = {axis = "pp", rank = 0 : i64}}
  tsched.collective_wait %s0 on %comm {tsched.action = {axis = "pp", rank = 0 : i64}}
  tsched.collective_wait %s1 on %comm {tsched.action = {axis = "pp", rank = 1 : i64}}
  return
}

// -----

// Each rank waits for the other's value before sending its own: a deadlock,
// rejected at compile time with where each rank waits (rank 0 at the wait
// below for rank 1's send #0, rank 1 at its wait for rank 0's).
tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @deadlock(%a: memref<4xf32>, %b: memref<4xf32>) {
  %comm = tsched.stream "comm"
  %r0 = tsched.recv %b from 1 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 0 : i64}} : memref<4xf32>
  // expected-error @below {{the ranks of 'pp' deadlock: rank 0 waits at tsched.collective_wait}}
  tsched.collective_wait %r0 on %comm {tsched.action = {axis = "pp", rank = 0 : i64}}
  %r1 = tsched.recv %a from 0 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 1 : i64}} : memref<4xf32>
  tsched.collective_wait %r1 on %comm {tsched.action = {axis = "pp", rank = 1 : i64}}
  %s0 = tsched.send %a to 1 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 0 : i64}} : memref<4xf32>
  %s1 = tsched.send %b to 0 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 1 : i64}} : memref<4xf32>
  tsched.collective_wait %s0 on %comm {tsched.action = {axis = "pp", rank = 0 : i64}}
  tsched.collective_wait %s1 on %comm {tsched.action = {axis = "pp", rank = 1 : i64}}
  return
}

// -----

// The k-th send and the k-th recv between two ranks pair up: their types must agree.
tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @mismatch(%a: memref<4xf32>, %b: memref<8xf32>) {
  %comm = tsched.stream "comm"
  %s0 = tsched.send %a to 1 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 0 : i64}} : memref<4xf32>
  // expected-error @below {{moves memref<4xf32> but the recv it pairs with}}
  %r1 = tsched.recv %b from 0 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 1 : i64}} : memref<8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @unpaired(%a: memref<4xf32>) {
  %comm = tsched.stream "comm"
  // expected-error @below {{rank 0 sends 1 buffers to rank 1, which receives 0 from it}}
  %s0 = tsched.send %a to 1 on %comm over @mesh["pp"] {tsched.action = {axis = "pp", rank = 0 : i64}} : memref<4xf32>
  return
}

// -----

// The ranks of an axis must issue its collectives in one order.
tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @collective_order(%a: memref<4xf32>, %b: memref<4xf32>, %c: memref<8xf32>) {
  %comm = tsched.stream "comm"
  %t0 = tsched.collective_start <all_reduce> %a -> %b on %comm over @mesh["pp"] {reduction = #tgraph.reduction<sum>, tsched.action = {axis = "pp", rank = 0 : i64}} : memref<4xf32> -> memref<4xf32>
  // expected-error @below {{collective #0 over 'pp' differs between ranks: rank 1 runs tsched.collective_start}}
  %t1 = tsched.collective_start <all_gather> %a -> %c on %comm over @mesh["pp"] {dim = 0 : i64, tsched.action = {axis = "pp", rank = 1 : i64}} : memref<4xf32> -> memref<8xf32>
  return
}

// -----

// A microbatch's backward before its forward.
tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func private @k(memref<4xf32>) -> memref<4xf32>
func.func @order(%a: memref<4xf32>, %b: memref<4xf32>) {
  %s = tsched.stream "compute"
  tsched.launch @k on %s ins(%a : memref<4xf32>) outs(%b : memref<4xf32>) {tsched.action = {axis = "pp", rank = 0 : i64, kind = "B", stage = 0 : i64, microbatch = 1 : i64}}
  // expected-error @below {{rank 0 runs F of stage 0, microbatch 1 after its B: each microbatch's F must come before its B, and B before W}}
  tsched.launch @k on %s ins(%a : memref<4xf32>) outs(%b : memref<4xf32>) {tsched.action = {axis = "pp", rank = 0 : i64, kind = "F", stage = 0 : i64, microbatch = 1 : i64}}
  return
}

// -----

// A rank's end action (kind E: the epilogue pipeline.run's `then` places
// after all its pipeline work) is a known kind; an unknown one is refused.
tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func private @k(memref<4xf32>) -> memref<4xf32>
func.func @end_action(%a: memref<4xf32>, %b: memref<4xf32>) {
  %s = tsched.stream "compute"
  tsched.launch @k on %s ins(%a : memref<4xf32>) outs(%b : memref<4xf32>) {tsched.action = {axis = "pp", rank = 0 : i64, kind = "W", stage = 0 : i64, microbatch = 1 : i64}}
  tsched.launch @k on %s ins(%b : memref<4xf32>) outs(%a : memref<4xf32>) {tsched.action = {axis = "pp", rank = 0 : i64, kind = "E", stage = 0 : i64, microbatch = -1 : i64}}
  // expected-error @below {{unknown action kind 'X' (F, B, W or E)}}
  tsched.launch @k on %s ins(%a : memref<4xf32>) outs(%b : memref<4xf32>) {tsched.action = {axis = "pp", rank = 0 : i64, kind = "X", stage = 0 : i64, microbatch = 0 : i64}}
  return
}

// -----

// Library declarations that match their routines' declarations
// (tessera_runtime/routines.py): attributes, buffers and result rule.
// CHECK-LABEL: func.func private @mm
// CHECK-SAME: tsched.library = "matmul"
func.func private @mm(memref<2x8x4xf32>, memref<4x6xf32>, memref<2x8x6xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}
// CHECK-LABEL: func.func private @mm_t
func.func private @mm_t(memref<8x4xf32>, memref<6x4xf32>, memref<8x6xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {transpose_rhs}}
// CHECK-LABEL: func.func private @tr
func.func private @tr(memref<2x3x4xf32>, memref<4x2x3xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 2, 0, 1>}}
// CHECK-LABEL: func.func private @cat
func.func private @cat(memref<2x3xf32>, memref<2x5xf32>, memref<2x8xf32>) attributes {tsched.library = "concat", tsched.library_attrs = {dim = 1 : i64}}
// CHECK-LABEL: func.func private @emb
func.func private @emb(memref<16x8xbf16>, memref<2x4xi32>, memref<2x4x8xbf16>) attributes {tsched.library = "gather", tsched.library_attrs = {row_axes = ["tp"]}}
// CHECK-LABEL: func.func private @chk
func.func private @chk(memref<8xi32>) attributes {tsched.library = "check_range", tsched.library_attrs = {allowed = array<i64: -100>, high = 7 : i64, low = 0 : i64, message = "{row} {value}"}}

// -----

// expected-error @below {{library declaration @f: unknown library routine 'sort' (known: axis_slice,}}
func.func private @f(memref<8xf32>, memref<8xf32>) attributes {tsched.library = "sort", tsched.library_attrs = {}}

// -----

// expected-error @below {{library declaration @f: routine 'transpose' needs attribute 'perm' (a list of integers (DenseI64ArrayAttr))}}
func.func private @f(memref<2x3xf32>, memref<3x2xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {}}

// -----

// expected-error @below {{library declaration @f: attribute 'dim' of routine 'concat' must be an integer (IntegerAttr i64), got "1"}}
func.func private @f(memref<2x3xf32>, memref<2x3xf32>, memref<2x6xf32>) attributes {tsched.library = "concat", tsched.library_attrs = {dim = "1"}}

// -----

// expected-error @below {{library declaration @f: routine 'slice' has no attribute 'perm' (it has: offsets)}}
func.func private @f(memref<4xf32>, memref<2xf32>) attributes {tsched.library = "slice", tsched.library_attrs = {offsets = array<i64: 1>, perm = array<i64: 0>}}

// -----

// expected-error @below {{library declaration @f: 'tsched.library_attrs' must be a dictionary}}
func.func private @f(memref<4xf32>, memref<4xf32>) attributes {tsched.library = "reshape"}

// -----

// expected-error @below {{library declaration @f: routine 'gather' takes 3 buffers (table, indices, result), got 2}}
func.func private @f(memref<16x8xf32>, memref<4xi32>) attributes {tsched.library = "gather", tsched.library_attrs = {}}

// -----

// The result rule: a transpose by [1, 0] of 2x3 is 3x2.
// expected-error @below {{library declaration @f: routine 'transpose': the result rule gives [3, 2]xfloat32, the declaration has [2, 3]xfloat32}}
func.func private @f(memref<2x3xf32>, memref<2x3xf32>) attributes {tsched.library = "transpose", tsched.library_attrs = {perm = array<i64: 1, 0>}}

// -----

// expected-error @below {{library declaration @f: routine 'matmul': contracted sizes differ: 4 and 5}}
func.func private @f(memref<8x4xf32>, memref<5x6xf32>, memref<8x6xf32>) attributes {tsched.library = "matmul", tsched.library_attrs = {}}

// -----

// expected-error @below {{library declaration @f: routine 'slice': slice: a box of [3] at offsets [2] does not fit in [4]}}
func.func private @f(memref<4xf32>, memref<3xf32>) attributes {tsched.library = "slice", tsched.library_attrs = {offsets = array<i64: 2>}}

// -----

// expected-error @below {{library declaration @f: routine 'check_range': check_range checks integers, got [8]xfloat32}}
func.func private @f(memref<8xf32>) attributes {tsched.library = "check_range", tsched.library_attrs = {high = 7 : i64, low = 0 : i64, message = "m"}}
