// RUN: tessera-opt %s -split-input-file -verify-diagnostics

//===----------------------------------------------------------------------===//
// tsched.launch
//===----------------------------------------------------------------------===//

func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op launches unknown kernel @nope}}
  tsched.launch @nope on %s ins(%a : memref<8xf32>) outs(%a : memref<8xf32>)
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op symbol @mesh is not a kernel}}
  tsched.launch @mesh on %s ins(%a : memref<8xf32>) outs(%a : memref<8xf32>)
  return
}

// -----

func.func private @k(tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op kernel @k takes 2 inputs and returns 1 results, but the launch passes 1 ins and 1 outs}}
  tsched.launch @k on %s ins(%a : memref<8xf32>) outs(%a : memref<8xf32>)
  return
}

// -----

func.func private @k(tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>)
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{kernel @k takes 1 inputs and returns 2 results, but the launch passes 1 ins and 1 outs}}
  tsched.launch @k on %s ins(%a : memref<8xf32>) outs(%a : memref<8xf32>)
  return
}

// -----

func.func private @k(tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
func.func @f(%a: memref<8x16xf32>, %b: memref<8x16xf32>, %c: memref<8x8xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op buffer #1 has type 'memref<8x16xf32>' but kernel @k expects 'tensor<16x8xf32>'}}
  tsched.launch @k on %s ins(%a, %b : memref<8x16xf32>, memref<8x16xf32>) outs(%c : memref<8x8xf32>)
  return
}

// -----

func.func private @k(tensor<8x16xf32>) -> tensor<8x8xf32>
func.func @f(%a: memref<8x16xf32>, %c: memref<8x8xf16>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op buffer #1 has type 'memref<8x8xf16>' but kernel @k expects 'tensor<8x8xf32>'}}
  tsched.launch @k on %s ins(%a : memref<8x16xf32>) outs(%c : memref<8x8xf16>)
  return
}

// -----

func.func private @k(tensor<?x16xf32>) -> tensor<8x8xf32>
func.func @f(%a: memref<8x16xf32>, %c: memref<8x8xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op buffer #0 has type 'memref<8x16xf32>' but kernel @k expects 'tensor<?x16xf32>'}}
  tsched.launch @k on %s ins(%a : memref<8x16xf32>) outs(%c : memref<8x8xf32>)
  return
}

// -----

ttile.kernel @k(%a: memref<8xf32>, %b: memref<8xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  ttile.return
}
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op kernel @k takes 2 buffers, but the launch passes 3}}
  tsched.launch @k on %s ins(%a, %a : memref<8xf32>, memref<8xf32>) outs(%a : memref<8xf32>)
  return
}

// -----

ttile.kernel @k(%a: memref<8xf32>, %b: memref<4xf32>) attributes {grid = array<i64: 1>, block = array<i64: 1>} {
  ttile.return
}
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op buffer #1 has type 'memref<8xf32>' but kernel @k expects 'memref<4xf32>'}}
  tsched.launch @k on %s ins(%a : memref<8xf32>) outs(%a : memref<8xf32>)
  return
}

// -----

func.func private @k(tensor<8xf32>) -> tensor<8xf32>
func.func @f(%a: tensor<8xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op operand #1 must be variadic of statically shaped memref of any type values, but got 'tensor<8xf32>'}}
  "tsched.launch"(%s, %a, %a) <{kernel = @k, operandSegmentSizes = array<i32: 1, 1, 1>}> : (!tsched.stream, tensor<8xf32>, tensor<8xf32>) -> ()
  return
}

// -----

func.func private @k(tensor<8xf32>) -> tensor<8xf32>
func.func @f(%a: memref<?xf32>) {
  %s = tsched.stream "compute"
  // expected-error @below {{'tsched.launch' op operand #1 must be variadic of statically shaped memref of any type values, but got 'memref<?xf32>'}}
  tsched.launch @k on %s ins(%a : memref<?xf32>) outs(%a : memref<?xf32>)
  return
}

// -----

func.func private @k(tensor<8xf32>) -> tensor<8xf32>
func.func @f(%a: memref<8xf32>, %e: !tsched.event) {
  // expected-error @below {{'tsched.launch' op operand #0 must be an ordered queue of work (a CUDA stream on GPU), but got '!tsched.event'}}
  "tsched.launch"(%e, %a, %a) <{kernel = @k, operandSegmentSizes = array<i32: 1, 1, 1>}> : (!tsched.event, memref<8xf32>, memref<8xf32>) -> ()
  return
}

// -----

//===----------------------------------------------------------------------===//
// tsched.collective_start
//===----------------------------------------------------------------------===//

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op refers to unknown mesh @nope}}
  %t = tsched.collective_start <all_reduce> %a -> %a on %s over @nope["tp"] {reduction = #tgraph.reduction<sum>} : memref<8xf32> -> memref<8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op mesh @mesh has no axis 'dp'}}
  %t = tsched.collective_start <all_reduce> %a -> %a on %s over @mesh["dp"] {reduction = #tgraph.reduction<sum>} : memref<8xf32> -> memref<8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>, %b: memref<8xf16>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op 'src' 'memref<8xf32>' and 'dst' 'memref<8xf16>' must have the same rank and element type}}
  %t = tsched.collective_start <all_reduce> %a -> %b on %s over @mesh["tp"] {reduction = #tgraph.reduction<sum>} : memref<8xf32> -> memref<8xf16>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>, %b: memref<8x1xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{must have the same rank and element type}}
  %t = tsched.collective_start <all_gather> %a -> %b on %s over @mesh["tp"] {dim = 0 : i64} : memref<8xf32> -> memref<8x1xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>, %n: memref<4xi32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op 'counts' are an all_to_all's (send, receive) pair}}
  %t = tsched.collective_start <all_reduce> %a -> %a counts(%n, %n : memref<4xi32>, memref<4xi32>) on %s over @mesh["tp"] {reduction = #tgraph.reduction<sum>} : memref<8xf32> -> memref<8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<4x2x8xf32>, %b: memref<1x8x8xf32>, %n: memref<4xi64>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op 'counts' #0 must be memref<4xi32>, got 'memref<4xi64>'}}
  %t = tsched.collective_start <all_to_all> %a -> %b counts(%n, %n : memref<4xi64>, memref<4xi64>) on %s over @mesh["tp"] {dim = 0 : i64, concat_dim = 1 : i64} : memref<4x2x8xf32> -> memref<1x8x8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op <all_reduce> needs a 'reduction' attribute}}
  %t = tsched.collective_start <all_reduce> %a -> %a on %s over @mesh["tp"] : memref<8xf32> -> memref<8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>, %b: memref<2xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op <reduce_scatter> needs a 'reduction' attribute}}
  %t = tsched.collective_start <reduce_scatter> %a -> %b on %s over @mesh["tp"] {dim = 0 : i64} : memref<8xf32> -> memref<2xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op attribute 'reduction' failed to satisfy constraint: #tgraph.reduction attribute}}
  %t = tsched.collective_start <all_reduce> %a -> %a on %s over @mesh["tp"] {reduction = "sum"} : memref<8xf32> -> memref<8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>, %b: memref<4xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op all_reduce 'src' 'memref<8xf32>' and 'dst' 'memref<4xf32>' must have the same shape}}
  %t = tsched.collective_start <all_reduce> %a -> %b on %s over @mesh["tp"] {reduction = #tgraph.reduction<sum>} : memref<8xf32> -> memref<4xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>, %b: memref<32xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op <all_gather> needs a 'dim' attribute}}
  %t = tsched.collective_start <all_gather> %a -> %b on %s over @mesh["tp"] : memref<8xf32> -> memref<32xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>, %b: memref<32xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op dim 1 is out of range for 'src' 'memref<8xf32>'}}
  %t = tsched.collective_start <all_gather> %a -> %b on %s over @mesh["tp"] {dim = 1 : i64} : memref<8xf32> -> memref<32xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8x2xf32>, %b: memref<8x4xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op 'dst' 'memref<8x4xf32>' does not match 'src' 'memref<8x2xf32>' for <all_gather> over axis 'tp' of size 4 along dim 1}}
  %t = tsched.collective_start <all_gather> %a -> %b on %s over @mesh["tp"] {dim = 1 : i64} : memref<8x2xf32> -> memref<8x4xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8x2xf32>, %b: memref<4x8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'dst' 'memref<4x8xf32>' does not match 'src' 'memref<8x2xf32>' for <all_gather> over axis 'tp' of size 4 along dim 1}}
  %t = tsched.collective_start <all_gather> %a -> %b on %s over @mesh["tp"] {dim = 1 : i64} : memref<8x2xf32> -> memref<4x8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<6xf32>, %b: memref<1xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'dst' 'memref<1xf32>' does not match 'src' 'memref<6xf32>' for <reduce_scatter> over axis 'tp' of size 4 along dim 0}}
  %t = tsched.collective_start <reduce_scatter> %a -> %b on %s over @mesh["tp"] {reduction = #tgraph.reduction<sum>, dim = 0 : i64} : memref<6xf32> -> memref<1xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{expected ::tessera::tsched::CollectiveKind to be one of: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, shift}}
  // expected-error @below {{failed to parse TSched_CollectiveKindAttr parameter 'value'}}
  %t = tsched.collective_start <scatter> %a -> %a on %s over @mesh["tp"] : memref<8xf32> -> memref<8xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// Buffers, streams, events
//===----------------------------------------------------------------------===//

func.func @f() {
  // expected-error @below {{'tsched.alloc' op result #0 must be statically shaped memref of any type values, but got 'memref<?xf32>'}}
  %0 = tsched.alloc : memref<?xf32>
  return
}

// -----

func.func @f(%a: tensor<8xf32>) {
  // expected-error @below {{'tsched.free' op operand #0 must be statically shaped memref of any type values, but got 'tensor<8xf32>'}}
  "tsched.free"(%a) : (tensor<8xf32>) -> ()
  return
}

// -----

func.func @f(%s: !tsched.stream) {
  // expected-error @below {{'tsched.event_wait' op operand #0 must be a point in a stream other streams can wait for, but got '!tsched.stream'}}
  "tsched.event_wait"(%s, %s) : (!tsched.stream, !tsched.stream) -> ()
  return
}

// -----

func.func @f(%e: !tsched.event, %s: !tsched.stream) {
  // expected-error @below {{'tsched.collective_wait' op operand #0 must be an in-flight asynchronous collective, but got '!tsched.event'}}
  "tsched.collective_wait"(%e, %s) : (!tsched.event, !tsched.stream) -> ()
  return
}

// -----

func.func @f(%s: !tsched.queue) { // expected-error {{type `queue` in dialect `tsched`}}
  return
}

// -----

tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.send' op peer 2 is not a rank of axis 'pp' (size 2)}}
  %t = tsched.send %a to 2 on %s over @mesh["pp"] : memref<8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @f(%a: memref<8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.recv' op mesh @mesh has no axis 'tp'}}
  %t = tsched.recv %a from 0 on %s over @mesh["tp"] : memref<8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["pp"] shape = [2]
func.func @f(%a: memref<8xf32>, %b: memref<8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op <broadcast> needs a 'root' rank of axis 'pp' (size 2)}}
  %t = tsched.collective_start <broadcast> %a -> %b on %s over @mesh["pp"] : memref<8xf32> -> memref<8xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["cp"] shape = [2]
func.func @f(%a: memref<8xf32>, %b: memref<8xf32>) {
  %s = tsched.stream "comm"
  // expected-error @below {{'tsched.collective_start' op <shift> needs an 'offset' of 1 to 1 (axis 'cp')}}
  %t = tsched.collective_start <shift> %a -> %b on %s over @mesh["cp"] : memref<8xf32> -> memref<8xf32>
  return
}
