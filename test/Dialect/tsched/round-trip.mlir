// RUN: tessera-opt %s | tessera-opt | FileCheck %s
// RUN: tessera-opt %s --mlir-print-op-generic | tessera-opt | FileCheck %s

// Every tsched op, type and attribute in its custom form, printed, re-parsed
// and printed again.

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 4]

// A kernel on tensors (before Tile IR lowering): ins are its inputs, outs its results.
func.func private @k_tensor(tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>

// A library routine that writes nothing (a value check): no results.
func.func private @k_check(memref<8x8xf32>) attributes {tsched.library = "check_range"}

// A Tile IR kernel: its arguments are the launch's ins, then its outs.
ttile.kernel @k_tile(%a: memref<8x8xf32>, %b: memref<8x8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  ttile.return
}

// CHECK-LABEL: func.func @schedule(
// CHECK-SAME: %[[X:.*]]: memref<8x16xf32>, %[[W:.*]]: memref<16x8xf32>)
func.func @schedule(%x: memref<8x16xf32>, %w: memref<16x8xf32>) {
  // CHECK: %[[COMPUTE:.*]] = tsched.stream "compute"
  %compute = tsched.stream "compute"
  // CHECK: %[[COMM:.*]] = tsched.stream "comm"
  %comm = tsched.stream "comm"
  // CHECK: %[[H:.*]] = tsched.alloc : memref<8x8xf32>
  %h = tsched.alloc : memref<8x8xf32>
  // CHECK: %[[SYM:.*]] = tsched.alloc {symmetric} : memref<8x8xf32>
  %sym = tsched.alloc {symmetric} : memref<8x8xf32>
  // CHECK: tsched.launch @k_tensor on %[[COMPUTE]] ins(%[[X]], %[[W]] : memref<8x16xf32>, memref<16x8xf32>) outs(%[[H]] : memref<8x8xf32>)
  tsched.launch @k_tensor on %compute ins(%x, %w : memref<8x16xf32>, memref<16x8xf32>) outs(%h : memref<8x8xf32>)
  // CHECK: %[[O:.*]] = tsched.alloc : memref<8x8xf32>
  %o = tsched.alloc : memref<8x8xf32>
  // CHECK: tsched.launch @k_tile on %[[COMPUTE]] ins(%[[H]] : memref<8x8xf32>) outs(%[[O]] : memref<8x8xf32>)
  tsched.launch @k_tile on %compute ins(%h : memref<8x8xf32>) outs(%o : memref<8x8xf32>)
  // No `ins`: every buffer is an output.
  // CHECK: tsched.launch @k_tile on %[[COMPUTE]] outs(%[[H]], %[[O]] : memref<8x8xf32>, memref<8x8xf32>)
  tsched.launch @k_tile on %compute outs(%h, %o : memref<8x8xf32>, memref<8x8xf32>)
  // No `outs`: the launch writes no buffer (a value check).
  // CHECK: tsched.launch @k_check on %[[COMPUTE]] ins(%[[H]] : memref<8x8xf32>){{$}}
  tsched.launch @k_check on %compute ins(%h : memref<8x8xf32>)
  // CHECK: %[[E:.*]] = tsched.event_record %[[COMPUTE]]
  %e = tsched.event_record %compute
  // CHECK: tsched.event_wait %[[E]] on %[[COMM]]
  tsched.event_wait %e on %comm
  // CHECK: %[[T0:.*]] = tsched.collective_start <all_reduce> %[[O]] -> %[[O]] on %[[COMM]] over @mesh["tp"] {reduction = #tgraph.reduction<sum>} : memref<8x8xf32> -> memref<8x8xf32>
  %t0 = tsched.collective_start <all_reduce> %o -> %o on %comm over @mesh["tp"] {reduction = #tgraph.reduction<sum>} : memref<8x8xf32> -> memref<8x8xf32>
  // CHECK: tsched.collective_wait %[[T0]] on %[[COMPUTE]]
  tsched.collective_wait %t0 on %compute
  // A sub-axis (tp's major part of size 2, as hierarchical collectives use).
  // CHECK: %[[TS:.*]] = tsched.collective_start <all_reduce> %[[O]] -> %[[O]] on %[[COMM]] over @mesh["tp:(1)2"] {reduction = #tgraph.reduction<sum>} : memref<8x8xf32> -> memref<8x8xf32>
  %ts = tsched.collective_start <all_reduce> %o -> %o on %comm over @mesh["tp:(1)2"] {reduction = #tgraph.reduction<sum>} : memref<8x8xf32> -> memref<8x8xf32>
  // CHECK: tsched.collective_wait %[[TS]] on %[[COMPUTE]]
  tsched.collective_wait %ts on %compute
  // CHECK: %[[G:.*]] = tsched.alloc : memref<8x32xf32>
  %g = tsched.alloc : memref<8x32xf32>
  // CHECK: %[[T1:.*]] = tsched.collective_start <all_gather> %[[O]] -> %[[G]] on %[[COMM]] over @mesh["tp"] {dim = 1 : i64} : memref<8x8xf32> -> memref<8x32xf32>
  %t1 = tsched.collective_start <all_gather> %o -> %g on %comm over @mesh["tp"] {dim = 1 : i64} : memref<8x8xf32> -> memref<8x32xf32>
  // CHECK: tsched.collective_wait %[[T1]] on %[[COMPUTE]]
  tsched.collective_wait %t1 on %compute
  // A ragged all_to_all: its (send, receive) row counts.
  // CHECK: tsched.collective_start <all_to_all> %{{.*}} -> %{{.*}} counts(%[[N:.*]], %[[N]] : memref<4xi32>, memref<4xi32>) on %[[COMM]] over @mesh["tp"] {concat_dim = 1 : i64, dim = 0 : i64} : memref<4x2x8xf32> -> memref<1x8x8xf32>
  %blocks = tsched.alloc : memref<4x2x8xf32>
  %moved = tsched.alloc : memref<1x8x8xf32>
  %n = tsched.alloc : memref<4xi32>
  %ta = tsched.collective_start <all_to_all> %blocks -> %moved counts(%n, %n : memref<4xi32>, memref<4xi32>) on %comm over @mesh["tp"] {dim = 0 : i64, concat_dim = 1 : i64} : memref<4x2x8xf32> -> memref<1x8x8xf32>
  tsched.collective_wait %ta on %compute
  tsched.free %blocks : memref<4x2x8xf32>
  tsched.free %moved : memref<1x8x8xf32>
  tsched.free %n : memref<4xi32>
  // CHECK: %[[S:.*]] = tsched.alloc : memref<4x32xi32>
  %s = tsched.alloc : memref<4x32xi32>
  %gi = tsched.alloc : memref<8x32xi32>
  // CHECK: %[[T2:.*]] = tsched.collective_start <reduce_scatter> %{{.*}} -> %[[S]] on %[[COMM]] over @mesh["dp"] {deterministic, dim = 0 : i64, reduction = #tgraph.reduction<max>} : memref<8x32xi32> -> memref<4x32xi32>
  %t2 = tsched.collective_start <reduce_scatter> %gi -> %s on %comm over @mesh["dp"] {reduction = #tgraph.reduction<max>, dim = 0 : i64, deterministic} : memref<8x32xi32> -> memref<4x32xi32>
  // CHECK: tsched.collective_wait %[[T2]] on %[[COMPUTE]]
  tsched.collective_wait %t2 on %compute
  // CHECK: %[[T3:.*]] = tsched.collective_start <all_reduce> %[[G]] -> %[[G]] on %[[COMM]] over @mesh["dp"] {deterministic, reduction = #tgraph.reduction<prod>} : memref<8x32xf32> -> memref<8x32xf32>
  %t3 = tsched.collective_start <all_reduce> %g -> %g on %comm over @mesh["dp"] {reduction = #tgraph.reduction<prod>, deterministic} : memref<8x32xf32> -> memref<8x32xf32>
  tsched.collective_wait %t3 on %compute
  // CHECK: tsched.free %[[H]] : memref<8x8xf32>
  tsched.free %h : memref<8x8xf32>
  // CHECK: tsched.free %[[O]] : memref<8x8xf32>
  tsched.free %o : memref<8x8xf32>
  tsched.free %g : memref<8x32xf32>
  // CHECK: tsched.free %[[S]] : memref<4x32xi32>
  tsched.free %s : memref<4x32xi32>
  tsched.free %gi : memref<8x32xi32>
  return
}

// The dialect's types as function arguments.
// CHECK-LABEL: func.func @types(
// CHECK-SAME: %[[S:.*]]: !tsched.stream, %[[E:.*]]: !tsched.event, %[[T:.*]]: !tsched.token)
func.func @types(%s: !tsched.stream, %e: !tsched.event, %t: !tsched.token) {
  // CHECK: tsched.event_wait %[[E]] on %[[S]]
  tsched.event_wait %e on %s
  // CHECK: tsched.collective_wait %[[T]] on %[[S]]
  tsched.collective_wait %t on %s
  return
}

// The collective kind attribute on its own.
// CHECK-LABEL: func.func private @kinds()
// CHECK-SAME: kinds = [#tsched.collective<all_reduce>, #tsched.collective<all_gather>, #tsched.collective<reduce_scatter>]
func.func private @kinds() attributes {kinds = [#tsched.collective<all_reduce>, #tsched.collective<all_gather>, #tsched.collective<reduce_scatter>]}

// Point-to-point transfers of a pipeline, each run by one rank of "tp"
// (tsched.action), and a broadcast from rank 1.
// CHECK-LABEL: func.func @p2p
// CHECK: %[[T0:.*]] = tsched.send %{{.*}} to 1 on %{{.*}} over @mesh["tp"] {tsched.action = {axis = "tp", rank = 0 : i64}} : memref<4x8xf32>
// CHECK: %[[T1:.*]] = tsched.recv %{{.*}} from 0 on %{{.*}} over @mesh["tp"] {tsched.action = {axis = "tp", rank = 1 : i64}} : memref<4x8xf32>
// CHECK: tsched.collective_start <broadcast> %{{.*}} -> %{{.*}} on %{{.*}} over @mesh["tp"] {root = 1 : i64} : memref<4x8xf32> -> memref<4x8xf32>
// CHECK: tsched.collective_start <shift> %{{.*}} -> %{{.*}} on %{{.*}} over @mesh["tp"] {offset = 1 : i64} : memref<4x8xf32> -> memref<4x8xf32>
func.func @p2p(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  %comm = tsched.stream "comm"
  %t0 = tsched.send %a to 1 on %comm over @mesh["tp"] {tsched.action = {axis = "tp", rank = 0 : i64}} : memref<4x8xf32>
  %t1 = tsched.recv %b from 0 on %comm over @mesh["tp"] {tsched.action = {axis = "tp", rank = 1 : i64}} : memref<4x8xf32>
  tsched.collective_wait %t0 on %comm {tsched.action = {axis = "tp", rank = 0 : i64}}
  tsched.collective_wait %t1 on %comm {tsched.action = {axis = "tp", rank = 1 : i64}}
  %t2 = tsched.collective_start <broadcast> %a -> %b on %comm over @mesh["tp"] {root = 1 : i64} : memref<4x8xf32> -> memref<4x8xf32>
  tsched.collective_wait %t2 on %comm
  %t3 = tsched.collective_start <shift> %a -> %b on %comm over @mesh["tp"] {offset = 1 : i64} : memref<4x8xf32> -> memref<4x8xf32>
  tsched.collective_wait %t3 on %comm
  return
}
