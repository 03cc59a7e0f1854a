// RUN: tessera-opt %s -split-input-file -verify-diagnostics

//===----------------------------------------------------------------------===//
// tgraph.mesh
//===----------------------------------------------------------------------===//

// expected-error @below {{'tgraph.mesh' op mesh @m must have at least one axis}}
tgraph.mesh @m axes = [] shape = []

// -----

// expected-error @below {{mesh @m names 2 axes but gives 1 sizes}}
tgraph.mesh @m axes = ["dp", "tp"] shape = [2]

// -----

// expected-error @below {{mesh axis names must not be empty}}
tgraph.mesh @m axes = [""] shape = [2]

// -----

// expected-error @below {{mesh axis name 'dp:(1)2' must not contain ':' (it writes sub-axes, as in "dp:(1)2")}}
tgraph.mesh @m axes = ["dp:(1)2"] shape = [2]

// -----

// expected-error @below {{mesh axis 'tp' appears twice}}
tgraph.mesh @m axes = ["tp", "tp"] shape = [2, 2]

// -----

// expected-error @below {{mesh axis 'tp' has size 0; sizes must be >= 1}}
tgraph.mesh @m axes = ["tp"] shape = [0]

// -----

//===----------------------------------------------------------------------===//
// #tgraph.sharding (the attribute itself)
//===----------------------------------------------------------------------===//

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{sharding dimension entries must list mesh axis names (strings), got 1}}
func.func @f(%x: tensor<8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[1]]>}) { return }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{sharding entry for dimension 1 must be a list of mesh axes, got "tp"}}
func.func @f(%x: tensor<8x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], "tp"]>}) { return }

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// expected-error @below {{mesh axis 'tp' is used more than once in one sharding}}
func.func @f(%x: tensor<8x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], ["tp"]]>}) { return }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{mesh axis 'tp' is used more than once in one sharding}}
func.func @f(%x: tensor<8x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"], []], partial = ["tp"]>}) { return }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{sharding 'partial' must list mesh axis names (strings), got 3}}
func.func @f(%x: tensor<8x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], []], partial = [3]>}) { return }

// -----

//===----------------------------------------------------------------------===//
// Shardings of function arguments and results
//===----------------------------------------------------------------------===//

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{sharding on argument #0 needs a ranked tensor, got 'i32'}}
func.func @f(%x: i32 {tgraph.sharding = #tgraph.sharding<@mesh, []>}) { return }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{sharding of argument #1 has 1 dimension entries but the tensor 'tensor<8x16xf32>' has rank 2}}
func.func @f(%x: tensor<8xf32>, %y: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[]]>}) { return }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{sharding of argument #0 refers to unknown mesh @nope}}
func.func @f(%x: tensor<8xf32> {tgraph.sharding = #tgraph.sharding<@nope, [[]]>}) { return }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{sharding of argument #0 splits dimension 1 over axis 'dp', which mesh @mesh does not have}}
func.func @f(%x: tensor<8x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["dp"]]>}) { return }

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 4]
// expected-error @below {{dimension 0 of argument #0 (size 12) is not divisible by the 8 shards its sharding asks for}}
func.func @f(%x: tensor<12x8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp", "tp"], []]>}) { return }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{sharding of result #0 has a partial sum over axis 'dp', which mesh @mesh does not have}}
func.func @f(%x: tensor<8xf32>) -> (tensor<8xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[]], partial = ["dp"]>}) { return %x : tensor<8xf32> }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{dimension 0 of result #0 (size 3) is not divisible by the 2 shards its sharding asks for}}
func.func @f(%x: tensor<3xf32>) -> (tensor<3xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"]]>}) { return %x : tensor<3xf32> }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{'tgraph.sharding' must be a #tgraph.sharding attribute}}
func.func @f(%x: tensor<8xf32> {tgraph.sharding = "tp"}) { return }

// -----

// expected-error @below {{unknown argument attribute 'tgraph.layout'}}
func.func @f(%x: tensor<8xf32> {tgraph.layout = 1}) { return }

// -----

// expected-error @below {{unknown result attribute 'tgraph.layout'}}
func.func @f(%x: tensor<8xf32>) -> (tensor<8xf32> {tgraph.layout = 1}) { return %x : tensor<8xf32> }

// -----

//===----------------------------------------------------------------------===//
// Discardable tgraph attributes on operations
//===----------------------------------------------------------------------===//

// expected-error @below {{'tgraph.partitioned' must be a unit attribute}}
func.func @f() attributes {tgraph.partitioned = 1 : i32} { return }

// -----

// expected-error @below {{unknown tgraph attribute 'tgraph.bogus'}}
func.func @f() attributes {tgraph.bogus} { return }

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
// expected-error @below {{'tgraph.sharding' needs an op with a result}}
func.func @f() attributes {tgraph.sharding = #tgraph.sharding<@mesh, []>} { return }

// -----

tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 4]
func.func @f(%a: tensor<6x4xf32>, %b: tensor<4x6xf32>) -> tensor<6x6xf32> {
  // expected-error @below {{dimension 1 of the result (size 6) is not divisible by the 4 shards its sharding asks for}}
  %0 = tgraph.matmul %a, %b {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"], ["tp"]]>} : tensor<6x4xf32>, tensor<4x6xf32> -> tensor<6x6xf32>
  return %0 : tensor<6x6xf32>
}

// -----

// Divisibility is not checked after partitioning: shapes are per-rank there.
tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @partitioned(%x: tensor<3xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["tp"]]>}) attributes {tgraph.partitioned} { return }
// But the mesh axes still have to exist.
// expected-error @below {{sharding of argument #0 splits dimension 0 over axis 'dp', which mesh @mesh does not have}}
func.func @partitioned2(%x: tensor<3xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [["dp"]]>}) attributes {tgraph.partitioned} { return }

// -----

//===----------------------------------------------------------------------===//
// tgraph.matmul
//===----------------------------------------------------------------------===//

func.func @f(%a: tensor<8xf32>, %b: tensor<8x4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'tgraph.matmul' op operands must have rank >= 2, got 'lhs' 'tensor<8xf32>' and 'rhs' 'tensor<8x4xf32>'}}
  %0 = tgraph.matmul %a, %b : tensor<8xf32>, tensor<8x4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @f(%a: tensor<8x16xf32>, %b: tensor<2x16x4xf32>) -> tensor<8x4xf32> {
  // expected-error @below {{'lhs' 'tensor<8x16xf32>', 'rhs' 'tensor<2x16x4xf32>' and result 'tensor<8x4xf32>' must have the same rank (or 'rhs' be 2-D)}}
  %0 = tgraph.matmul %a, %b : tensor<8x16xf32>, tensor<2x16x4xf32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @f(%a: tensor<2x8x16xf32>, %b: tensor<16x4xf32>) -> tensor<2x8x8xf32> {
  // expected-error @below {{result shape 2x8x8 does not match 'lhs' 2x8x16 x 'rhs' 16x4}}
  %0 = tgraph.matmul %a, %b : tensor<2x8x16xf32>, tensor<16x4xf32> -> tensor<2x8x8xf32>
  return %0 : tensor<2x8x8xf32>
}

// -----

func.func @f(%a: tensor<2x8x16xf32>, %b: tensor<2x4x32xf32>) -> tensor<16x32xf32> {
  // expected-error @below {{'tgraph.contract_rows' op row dimensions differ: 'lhs' 2x8x16, 'rhs' 2x4x32}}
  %0 = tgraph.contract_rows %a, %b : tensor<2x8x16xf32>, tensor<2x4x32xf32> -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// -----

func.func @f(%a: tensor<2x8x16xf32>, %b: tensor<2x8x32xf32>) -> tensor<32x16xf32> {
  // expected-error @below {{'tgraph.contract_rows' op result 'tensor<32x16xf32>' must be [16, 32]}}
  %0 = tgraph.contract_rows %a, %b : tensor<2x8x16xf32>, tensor<2x8x32xf32> -> tensor<32x16xf32>
  return %0 : tensor<32x16xf32>
}

// -----

func.func @f(%a: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<1x1xf32> {
  // expected-error @below {{'tgraph.contract_rows' op 'lhs' 'tensor<16xf32>' and 'rhs' 'tensor<16xf32>' must have one rank, at least 2 (rows, then a column)}}
  %0 = tgraph.contract_rows %a, %b : tensor<16xf32>, tensor<16xf32> -> tensor<1x1xf32>
  return %0 : tensor<1x1xf32>
}

// -----

func.func @f(%a: tensor<8x16xf32>, %b: tensor<16x4xf16>) -> tensor<8x4xf32> {
  // expected-error @below {{element types differ: 'lhs' 'f32', 'rhs' 'f16', result 'f32'}}
  %0 = tgraph.matmul %a, %b : tensor<8x16xf32>, tensor<16x4xf16> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @f(%a: tensor<2x8x16xf32>, %b: tensor<3x16x4xf32>) -> tensor<2x8x4xf32> {
  // expected-error @below {{batch dimension 0 differs: 'lhs' 2x8x16, 'rhs' 3x16x4, result 2x8x4}}
  %0 = tgraph.matmul %a, %b : tensor<2x8x16xf32>, tensor<3x16x4xf32> -> tensor<2x8x4xf32>
  return %0 : tensor<2x8x4xf32>
}

// -----

func.func @f(%a: tensor<8x16xf32>, %b: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @below {{contraction dimensions differ: 'lhs' has shape 8x16 (K = 16) but 'rhs' has shape 8x16 (K = 8)}}
  %0 = tgraph.matmul %a, %b : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

func.func @f(%a: tensor<8x16xf32>, %b: tensor<16x4xf32>) -> tensor<8x8xf32> {
  // expected-error @below {{result shape 8x8 does not match 'lhs' 8x16 x 'rhs' 16x4}}
  %0 = tgraph.matmul %a, %b : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

//===----------------------------------------------------------------------===//
// Elementwise ops
//===----------------------------------------------------------------------===//

func.func @f(%a: tensor<8xf32>, %b: tensor<4xf32>) -> tensor<8xf32> {
  // expected-error @below {{'tgraph.add' op requires the same type for all operands and results}}
  %0 = "tgraph.add"(%a, %b) : (tensor<8xf32>, tensor<4xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

func.func @f(%a: vector<8xf32>) -> vector<8xf32> {
  // expected-error @below {{'tgraph.relu' op operand #0 must be ranked tensor of any type values, but got 'vector<8xf32>'}}
  %0 = "tgraph.relu"(%a) : (vector<8xf32>) -> vector<8xf32>
  return %0 : vector<8xf32>
}

// -----

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{'tgraph.all_reduce' op refers to unknown mesh @nope}}
  %0 = tgraph.all_reduce <sum> %x on @nope["tp"] : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{'tgraph.all_reduce' op mesh @mesh has no axis 'dp'}}
  %0 = tgraph.all_reduce <max> %x on @mesh["dp"] : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// A sub-axis whose pre-size times size does not divide its axis (3 x 2 of 4).
tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{'tgraph.all_reduce' op mesh @mesh has no axis 'tp:(3)2'}}
  %0 = tgraph.all_reduce <sum> %x on @mesh["tp:(3)2"] : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// A sub-axis' size is the group size: dim 0 of 8 over "tp:(1)2" is 4, not 2.
tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8xf32>) -> tensor<2xf32> {
  // expected-error @below {{'tgraph.reduce_scatter' op}}
  %0 = tgraph.reduce_scatter <sum> %x on @mesh["tp:(1)2"] dim 0 : tensor<8xf32> -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{expected ::tessera::tgraph::ReductionKind to be one of: sum, max, min, prod}}
  // expected-error @below {{failed to parse TGraph_ReductionKindAttr parameter 'value'}}
  %0 = tgraph.all_reduce <mean> %x on @mesh["tp"] : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<4x2x8xf32>) -> tensor<1x8x8xf32> {
  // expected-error @below {{'tgraph.all_to_all' op 'channels' must be 1 to 64, got 0}}
  %0 = tgraph.all_to_all %x on @mesh["tp"] split_dim 0 concat_dim 1 {channels = 0 : i64} : tensor<4x2x8xf32> -> tensor<1x8x8xf32>
  return %0 : tensor<1x8x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<4x2x8xf32>, %n: tensor<4xi32>) -> tensor<1x8x8xf32> {
  // expected-error @below {{'tgraph.all_to_all' op 'counts' must be (send, receive), got 1 operands}}
  %0 = tgraph.all_to_all %x counts(%n : tensor<4xi32>) on @mesh["tp"] split_dim 0 concat_dim 1 : tensor<4x2x8xf32> -> tensor<1x8x8xf32>
  return %0 : tensor<1x8x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<4x2x8xf32>, %n: tensor<4xi32>, %m: tensor<2xi32>) -> tensor<1x8x8xf32> {
  // expected-error @below {{'tgraph.all_to_all' op 'counts' #1 must be tensor<4xi32> (one count per rank of 'tp'), got 'tensor<2xi32>'}}
  %0 = tgraph.all_to_all %x counts(%n, %m : tensor<4xi32>, tensor<2xi32>) on @mesh["tp"] split_dim 0 concat_dim 1 : tensor<4x2x8xf32> -> tensor<1x8x8xf32>
  return %0 : tensor<1x8x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>, %n: tensor<4xi32>) -> tensor<32x1xf32> {
  // expected-error @below {{'tgraph.all_to_all' op with 'counts' the last dimension (a row) must be neither split_dim nor concat_dim}}
  %0 = tgraph.all_to_all %x counts(%n, %n : tensor<4xi32>, tensor<4xi32>) on @mesh["tp"] split_dim 1 concat_dim 0 : tensor<8x4xf32> -> tensor<32x1xf32>
  return %0 : tensor<32x1xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<2x4x8xf32>, %n: tensor<4xi32>) -> tensor<8x1x8xf32> {
  // expected-error @below {{'tgraph.all_to_all' op with 'counts' the pieces must be contiguous: dimension 0 of 'input' (before split_dim) must be 1, got 2}}
  %0 = tgraph.all_to_all %x counts(%n, %n : tensor<4xi32>, tensor<4xi32>) on @mesh["tp"] split_dim 1 concat_dim 0 : tensor<2x4x8xf32> -> tensor<8x1x8xf32>
  return %0 : tensor<8x1x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<8x16xf32> {
  // expected-error @below {{'tgraph.all_gather' op mesh @mesh has no axis 'dp'}}
  %0 = tgraph.all_gather %x on @mesh["dp"] dim 1 : tensor<8x4xf32> -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<8x8xf32> {
  // expected-error @below {{'tgraph.all_gather' op gathered dimension 1 must be 4 x 4 = 16, got 8}}
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 1 : tensor<8x4xf32> -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<4x16xf32> {
  // expected-error @below {{'tgraph.all_gather' op dimension 0 of result (4) must equal that of 'input' (8)}}
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 1 : tensor<8x4xf32> -> tensor<4x16xf32>
  return %0 : tensor<4x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<8x4x4xf32> {
  // expected-error @below {{'tgraph.all_gather' op result 'tensor<8x4x4xf32>' must have the rank and element type of 'input' 'tensor<8x4xf32>'}}
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 1 : tensor<8x4xf32> -> tensor<8x4x4xf32>
  return %0 : tensor<8x4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<8x16xf16> {
  // expected-error @below {{must have the rank and element type of 'input'}}
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 1 : tensor<8x4xf32> -> tensor<8x16xf16>
  return %0 : tensor<8x16xf16>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-error @below {{'tgraph.all_gather' op dim 2 is out of range for 'input' 'tensor<8x4xf32>'}}
  %0 = tgraph.all_gather %x on @mesh["tp"] dim 2 : tensor<8x4xf32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-error @below {{'tgraph.all_gather' op dim -1 is out of range}}
  %0 = tgraph.all_gather %x on @mesh["tp"] dim -1 : tensor<8x4xf32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<8x1xf32> {
  // expected-error @below {{'tgraph.reduce_scatter' op refers to unknown mesh @nope}}
  %0 = tgraph.reduce_scatter <sum> %x on @nope["tp"] dim 1 : tensor<8x4xf32> -> tensor<8x1xf32>
  return %0 : tensor<8x1xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<6x4xf32>) -> tensor<1x4xf32> {
  // expected-error @below {{'tgraph.reduce_scatter' op scattered dimension 0 of 'input' (6) does not split evenly over 4 ranks}}
  %0 = tgraph.reduce_scatter <sum> %x on @mesh["tp"] dim 0 : tensor<6x4xf32> -> tensor<1x4xf32>
  return %0 : tensor<1x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
  // expected-error @below {{'tgraph.reduce_scatter' op scattered dimension 0 must be 8 / 4 = 2, got 4}}
  %0 = tgraph.reduce_scatter <sum> %x on @mesh["tp"] dim 0 : tensor<8x4xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8x4xf32>) -> tensor<2x2xf32> {
  // expected-error @below {{'tgraph.reduce_scatter' op dimension 1 of result (2) must equal that of 'input' (4)}}
  %0 = tgraph.reduce_scatter <sum> %x on @mesh["tp"] dim 0 : tensor<8x4xf32> -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}

// -----

//===----------------------------------------------------------------------===//
// tgraph.shard
//===----------------------------------------------------------------------===//

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{'tgraph.shard' op sharding of the annotated value refers to unknown mesh @nope}}
  %0 = tgraph.shard %x : tensor<8xf32> to #tgraph.sharding<@nope, [[]]>
  return %0 : tensor<8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{'tgraph.shard' op sharding of the annotated value has 2 dimension entries but the tensor 'tensor<8xf32>' has rank 1}}
  %0 = tgraph.shard %x : tensor<8xf32> to #tgraph.sharding<@mesh, [[], []]>
  return %0 : tensor<8xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<6xf32>) -> tensor<6xf32> {
  // expected-error @below {{'tgraph.shard' op dimension 0 of the annotated value (size 6) is not divisible by the 4 shards its sharding asks for}}
  %0 = tgraph.shard %x : tensor<6xf32> to #tgraph.sharding<@mesh, [["tp"]]>
  return %0 : tensor<6xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [4]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{'tgraph.shard' op sharding of the annotated value splits dimension 0 over axis 'dp', which mesh @mesh does not have}}
  %0 = tgraph.shard %x : tensor<8xf32> to #tgraph.sharding<@mesh, [["dp"]]>
  return %0 : tensor<8xf32>
}

//===----------------------------------------------------------------------===//
// Training op set
//===----------------------------------------------------------------------===//

// -----

func.func @f(%x: tensor<2x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{'tgraph.broadcast' op dimension 0 of 'input' 'tensor<2x8xf32>' has size 2; only size-1 dimensions broadcast (to 4)}}
  %0 = tgraph.broadcast %x : tensor<2x8xf32> to tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>) -> tensor<4x2xf32> {
  // expected-error @below {{'tgraph.reduce' op result dimension 1 must be 1, got 2}}
  %0 = tgraph.reduce <sum> %x dims [1] : tensor<4x8xf32> -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{'tgraph.reduce' op reduced dimension 2 is out of range for rank 2}}
  %0 = tgraph.reduce <sum> %x dims [2] : tensor<4x8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>) -> tensor<5x6xf32> {
  // expected-error @below {{'tgraph.reshape' op cannot reshape 'tensor<4x8xf32>' (32 elements) to 'tensor<5x6xf32>' (30 elements)}}
  %0 = tgraph.reshape %x : tensor<4x8xf32> to tensor<5x6xf32>
  return %0 : tensor<5x6xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>) -> tensor<8x4xf32> {
  // expected-error @below {{'tgraph.transpose' op perm entry 0 appears twice}}
  %0 = tgraph.transpose %x perm [0, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>) -> tensor<4x4xf32> {
  // expected-error @below {{'tgraph.slice' op dimension 1: [6, 10) is outside [0, 8)}}
  %0 = tgraph.slice %x offsets [0, 6] : tensor<4x8xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

func.func @f(%a: tensor<4x4xf32>, %b: tensor<4x3xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{'tgraph.concat' op inputs add up to 7 along dim 1, result has 8}}
  %0 = tgraph.concat %a, %b dim 1 : tensor<4x4xf32>, tensor<4x3xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @f(%t: tensor<16x8xf32>, %ids: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{'tgraph.gather' op 'indices' must be an integer tensor, got 'tensor<4xf32>'}}
  %0 = tgraph.gather %t[%ids] : tensor<16x8xf32>, tensor<4xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @f(%t: tensor<16x8xf32>, %ids: tensor<2x3xi32>) -> tensor<6x8xf32> {
  // expected-error @below {{'tgraph.gather' op table 'tensor<16x8xf32>' and rows 'tensor<6x8xf32>' must have one element type, and rows the indices' dimensions then the table's row shape}}
  %0 = tgraph.gather %t[%ids] : tensor<16x8xf32>, tensor<2x3xi32> -> tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// -----

func.func @f(%t: tensor<16x8xf32>, %ids: tensor<2x3xi32>) -> tensor<3x2x8xf32> {
  // expected-error @below {{'tgraph.gather' op rows 'tensor<3x2x8xf32>' must have one row per index ('tensor<2x3xi32>')}}
  %0 = tgraph.gather %t[%ids] : tensor<16x8xf32>, tensor<2x3xi32> -> tensor<3x2x8xf32>
  return %0 : tensor<3x2x8xf32>
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'tgraph.grad' op 'loss' must be a float scalar (tensor<f32>), got 'tensor<4xf32>'}}
  %0 = tgraph.grad %x wrt %x : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @f(%l: tensor<f32>, %x: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @below {{'tgraph.grad' op 'wrt' value #0 has type 'tensor<4xi32>'; only float tensors have gradients}}
  %0 = tgraph.grad %l wrt %x : tensor<f32>, tensor<4xi32> -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xi32> {
  // expected-error @below {{'tgraph.compare' op result must be an i1 tensor of shape 4, got 'tensor<4xi32>'}}
  %0 = tgraph.compare <lt> %x, %x : tensor<4xf32> -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @f(%q: tensor<64x16xf32>, %k: tensor<32x8xf32>) -> tensor<64x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'k' must be [..., Sk, D] with the rank, head width and element type of 'q' 'tensor<64x16xf32>', got 'tensor<32x8xf32>'}}
  %o:2 = tgraph.attention %q, %k, %k {scale = 0.25 : f64} : tensor<64x16xf32>, tensor<32x8xf32>, tensor<32x8xf32> -> tensor<64x16xf32>, tensor<64x1xf32>
  return %o#0 : tensor<64x16xf32>
}

// -----

func.func @f(%q: tensor<4x64x16xf32>, %k: tensor<3x64x16xf32>) -> tensor<4x64x16xf32> {
  // expected-error @below {{'tgraph.attention' op each leading dimension of 'k' 'tensor<3x64x16xf32>' must divide 'q''s 'tensor<4x64x16xf32>' (grouped heads)}}
  %o:2 = tgraph.attention %q, %k, %k {scale = 0.25 : f64} : tensor<4x64x16xf32>, tensor<3x64x16xf32>, tensor<3x64x16xf32> -> tensor<4x64x16xf32>, tensor<4x64x1xf32>
  return %o#0 : tensor<4x64x16xf32>
}

// -----

func.func @f(%q: tensor<64x16xf32>) -> tensor<64x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'window' must be at least 1 and needs 'causal', got 8}}
  %o:2 = tgraph.attention %q, %q, %q {scale = 0.25 : f64, window = 8 : i64} : tensor<64x16xf32>, tensor<64x16xf32>, tensor<64x16xf32> -> tensor<64x16xf32>, tensor<64x1xf32>
  return %o#0 : tensor<64x16xf32>
}

// -----

func.func @f(%q: tensor<2x4x8x16xf32>, %m: tensor<2x2x8x8xf32>) -> tensor<2x4x8x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'mask' must be [1|2, 1|4, 8|1, 8] of 'f32', got 'tensor<2x2x8x8xf32>'}}
  %o:2 = tgraph.attention %q, %q, %q mask(%m : tensor<2x2x8x8xf32>) {scale = 0.25 : f64} : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32> -> tensor<2x4x8x16xf32>, tensor<2x4x8x1xf32>
  return %o#0 : tensor<2x4x8x16xf32>
}

// -----

func.func @f(%q: tensor<2x8x16xf32>, %s: tensor<2x8x1xi32>, %t: tensor<2x8x1xi64>) -> tensor<2x8x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'kv_segments' must be [1|2, 8, 1] of 'i32', got 'tensor<2x8x1xi64>'}}
  %o:2 = tgraph.attention %q, %q, %q segments(%s, %t : tensor<2x8x1xi32>, tensor<2x8x1xi64>) {scale = 0.25 : f64} : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32> -> tensor<2x8x16xf32>, tensor<2x8x1xf32>
  return %o#0 : tensor<2x8x16xf32>
}

// -----

func.func @f(%q: tensor<64x16xf32>) -> tensor<64x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'lse' must be 'tensor<64x1xf32>', got 'tensor<64xf32>'}}
  %o:2 = tgraph.attention %q, %q, %q {scale = 0.25 : f64} : tensor<64x16xf32>, tensor<64x16xf32>, tensor<64x16xf32> -> tensor<64x16xf32>, tensor<64xf32>
  return %o#0 : tensor<64x16xf32>
}

// -----

func.func @f(%q: tensor<64x16xf32>) -> tensor<64x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'scale' must be positive, got -1}}
  %o:2 = tgraph.attention %q, %q, %q {scale = -1.0 : f64} : tensor<64x16xf32>, tensor<64x16xf32>, tensor<64x16xf32> -> tensor<64x16xf32>, tensor<64x1xf32>
  return %o#0 : tensor<64x16xf32>
}

// -----

func.func @f(%q: tensor<64x16xi32>) -> tensor<64x16xi32> {
  // expected-error @below {{'tgraph.attention' op operands must be float tensors, got 'tensor<64x16xi32>'}}
  %o:2 = tgraph.attention %q, %q, %q {scale = 1.0 : f64} : tensor<64x16xi32>, tensor<64x16xi32>, tensor<64x16xi32> -> tensor<64x16xi32>, tensor<64x1xf32>
  return %o#0 : tensor<64x16xi32>
}

// -----

func.func @f(%q: tensor<64x16xf32>, %d: tensor<64x8xf32>, %s: tensor<64x1xf32>) -> tensor<64x16xf32> {
  // expected-error @below {{'tgraph.attention_grad' op 'dout' must be 'tensor<64x16xf32>', got 'tensor<64x8xf32>'}}
  %g:3 = tgraph.attention_grad %q, %q, %q, %d, %s, %s {scale = 1.0 : f64} : tensor<64x16xf32>, tensor<64x16xf32>, tensor<64x16xf32>, tensor<64x8xf32>, tensor<64x1xf32>, tensor<64x1xf32> -> tensor<64x16xf32>, tensor<64x16xf32>, tensor<64x16xf32>
  return %g#0 : tensor<64x16xf32>
}

// -----

func.func @f(%q: tensor<2x64x16xf32>) -> tensor<2x64x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'seq_dim' must be a dimension of 'q' 'tensor<2x64x16xf32>' before its last, got 2}}
  %o:2 = tgraph.attention %q, %q, %q {scale = 1.0 : f64, seq_dim = 2 : i64} : tensor<2x64x16xf32>, tensor<2x64x16xf32>, tensor<2x64x16xf32> -> tensor<2x64x16xf32>, tensor<2x64x1xf32>
  return %o#0 : tensor<2x64x16xf32>
}

// -----

func.func @f(%q: tensor<2x64x16xf32>) -> tensor<2x64x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'seq_dim' must be a dimension of 'q' 'tensor<2x64x16xf32>' before its last, got -1}}
  %o:2 = tgraph.attention %q, %q, %q {scale = 1.0 : f64, seq_dim = -1 : i64} : tensor<2x64x16xf32>, tensor<2x64x16xf32>, tensor<2x64x16xf32> -> tensor<2x64x16xf32>, tensor<2x64x1xf32>
  return %o#0 : tensor<2x64x16xf32>
}

// -----

func.func @unknown_transport(%a: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+2 {{expected ::tessera::tgraph::Transport to be one of: auto, nccl, nvshmem}}
  // expected-error @+1 {{failed to parse TGraph_TransportAttr parameter 'value'}}
  %0 = tgraph.matmul %a, %a {transport = #tgraph.transport<mpi>} : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

//===----------------------------------------------------------------------===//
// tgraph.spmd
//===----------------------------------------------------------------------===//

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @spmd_unknown_body(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
  // expected-error @below {{'tgraph.spmd' op refers to unknown function @nowhere}}
  %y = tgraph.spmd @nowhere(%x) in [#tgraph.sharding<@mesh, [["tp"], []]>] out [#tgraph.sharding<@mesh, [[], []]>] : (tensor<8x4xf32>) -> tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @spmd_global_body(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
  // expected-error @below {{'tgraph.spmd' op body @body must be a local-view function (marked tgraph.local)}}
  %y = tgraph.spmd @body(%x) in [#tgraph.sharding<@mesh, [["tp"], []]>] out [#tgraph.sharding<@mesh, [[], []]>] : (tensor<8x4xf32>) -> tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}
func.func private @body(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  return %x : tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @spmd_block_type(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
  // expected-error @below {{'tgraph.spmd' op input #0 of type 'tensor<8x4xf32>' laid out as #tgraph.sharding<@mesh, [["tp"], []]> has blocks of type 'tensor<4x4xf32>', but the body's is 'tensor<8x4xf32>'}}
  %y = tgraph.spmd @body(%x) in [#tgraph.sharding<@mesh, [["tp"], []]>] out [#tgraph.sharding<@mesh, [[], []]>] : (tensor<8x4xf32>) -> tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}
func.func private @body(%x: tensor<8x4xf32>) -> tensor<4x4xf32> attributes {tgraph.local} {
  %s = tgraph.slice %x offsets [0, 0] : tensor<8x4xf32> -> tensor<4x4xf32>
  return %s : tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @spmd_counts(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
  // expected-error @below {{'tgraph.spmd' op has 1 inputs, 2 input shardings, and its body has 1}}
  %y = tgraph.spmd @body(%x) in [#tgraph.sharding<@mesh, [["tp"], []]>, #tgraph.sharding<@mesh, [[], []]>] out [#tgraph.sharding<@mesh, [[], []]>] : (tensor<8x4xf32>) -> tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}
func.func private @body(%x: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {tgraph.local} {
  return %x : tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["tp"] shape = [2]
func.func @spmd_bad_axis(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
  // expected-error @below {{'tgraph.spmd' op sharding of input #0 splits dimension 0 over axis 'dp', which mesh @mesh does not have}}
  %y = tgraph.spmd @body(%x) in [#tgraph.sharding<@mesh, [["dp"], []]>] out [#tgraph.sharding<@mesh, [[], []]>] : (tensor<8x4xf32>) -> tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}
func.func private @body(%x: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {tgraph.local} {
  return %x : tensor<4x4xf32>
}

// -----

tgraph.mesh @mesh axes = ["pp"] shape = [4]
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'tgraph.transfer' op 'to' 4 is not a rank of axis 'pp' (size 4)}}
  %0 = tgraph.transfer %x on @mesh["pp"] from 0 to 4 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

tgraph.mesh @mesh axes = ["pp"] shape = [4]
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'tgraph.transfer' op sends rank 1 a value it already holds}}
  %0 = tgraph.transfer %x on @mesh["pp"] from 1 to 1 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
func.func @f(%x: tensor<4xf32>) {
  // expected-error @below {{'tgraph.send' op 'to' 2 is not a rank of axis 'dp' (size 2)}}
  tgraph.send %x on @mesh["dp"] to 2 : tensor<4xf32>
  return
}

// -----

tgraph.mesh @mesh axes = ["dp"] shape = [2]
func.func @f() -> tensor<4xf32> {
  // expected-error @below {{'tgraph.recv' op refers to unknown mesh @other}}
  %0 = tgraph.recv on @other["dp"] from 0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// expected-error @below {{'tgraph.pipeline' must be a dictionary with 'axis' and 'schedule' strings and an integer 'microbatches'}}
func.func @f() attributes {tgraph.pipeline = {axis = "pp"}} {
  return
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{unknown 'tgraph.remat' policy 'everything' (none, nothing_saveable, dots_saveable, selective)}}
  %0 = tgraph.tanh %x {tgraph.remat = {policy = "everything", region = 0 : i64}} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'tgraph.remat' must be a dictionary with an integer 'region' and a string 'policy'}}
  %0 = tgraph.tanh %x {tgraph.remat = {policy = "selective"}} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'tgraph.remat' region must be >= 0, got -1}}
  %0 = tgraph.tanh %x {tgraph.remat = {policy = "selective", region = -1 : i64}} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// expected-error @below {{'tgraph.remat' marks tgraph ops with results}}
func.func @f() attributes {tgraph.remat = {policy = "selective", region = 0 : i64}} {
  return
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'tgraph.recompute' must be a non-negative integer (the region)}}
  %0 = tgraph.tanh %x {tgraph.recompute = "0"} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

//===----------------------------------------------------------------------===//
// Value checks
//===----------------------------------------------------------------------===//

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'tgraph.check_range' op 'input' must be a tensor of integers, got 'tensor<4xf32>'}}
  %0 = tgraph.check_range %x in [0, 7) message "{row} {value}" : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @f(%x: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @below {{'tgraph.check_range' op range [7, 0) has its bounds reversed}}
  %0 = tgraph.check_range %x in [7, 0) message "{row} {value}" : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @f(%x: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @below {{'tgraph.check_range' op allowed value 3 is already in [0, 7)}}
  %0 = tgraph.check_range %x in [0, 7) or [-100, 3] message "{row} {value}" : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @f(%x: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @below {{'tgraph.check_range' op 'allowed' must not be empty (leave it out)}}
  %0 = tgraph.check_range %x in [0, 7) or [] message "{row} {value}" : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @f(%x: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @below {{'tgraph.check_range' op 'message' must name the failing element's {row} and {value}}}
  %0 = tgraph.check_range %x in [0, 7) message "target {value} is out of range" : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @f(%x: tensor<i32>) -> tensor<i32> {
  // expected-error @below {{'tgraph.check_range' op 'row_axes' needs a tensor with rows, got 'tensor<i32>'}}
  %0 = tgraph.check_range %x in [0, 7) message "{row} {value}" {row_axes = ["dp"]} : tensor<i32>
  return %0 : tensor<i32>
}

// -----

func.func @f(%x: tensor<2x4xi32>) -> tensor<2x4xi32> {
  // expected-error @below {{'tgraph.check_range' op 'dim_axes' must have one entry per dimension of 'tensor<2x4xi32>', got 1}}
  %0 = tgraph.check_range %x in [0, 7) message "{row} {value}" {dim_axes = ["cp"]} : tensor<2x4xi32>
  return %0 : tensor<2x4xi32>
}

// -----

func.func @f(%x: tensor<4xi32>) -> tensor<4xi64> {
  // expected-error @below {{'tgraph.check_range' op failed to verify that all of {input, result} have same type}}
  %0 = "tgraph.check_range"(%x) {low = 0 : i64, high = 7 : i64, message = "{row} {value}"} : (tensor<4xi32>) -> tensor<4xi64>
  return %0 : tensor<4xi64>
}

// -----

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

func.func @f(%l: tensor<16x8xf32>) -> tensor<16x9xi32> {
  // expected-error @below {{'tgraph.topk' op k = 9 must be in [1, 8] (the last dimension)}}
  %0 = tgraph.topk %l k 9 : tensor<16x8xf32> -> tensor<16x9xi32>
  return %0 : tensor<16x9xi32>
}

// -----

func.func @f(%l: tensor<16x8xf32>) -> tensor<16x2xi64> {
  // expected-error @below {{'tgraph.topk' op result must be tensor<16x2xi32>, got 'tensor<16x2xi64>'}}
  %0 = tgraph.topk %l k 2 : tensor<16x8xf32> -> tensor<16x2xi64>
  return %0 : tensor<16x2xi64>
}

// -----

func.func @f(%x: tensor<16x4xf32>, %e: tensor<16x2xi32>) -> tensor<16x4xf32> {
  // expected-error @below {{'tgraph.moe_dispatch' op rows must be 'tensor<32x4xf32>' for this routing, got 'tensor<16x4xf32>'}}
  %0:2 = tgraph.moe_dispatch %x[%e] experts 8 capacity 0 : tensor<16x4xf32>, tensor<16x2xi32> -> tensor<16x4xf32>, tensor<8xi32>
  return %0#0 : tensor<16x4xf32>
}

// -----

func.func @f(%x: tensor<16x4xf32>, %e: tensor<16x2xi32>) -> tensor<24x4xf32> {
  // expected-error @below {{'tgraph.moe_dispatch' op experts 1 must be >= k = 2}}
  %0:2 = tgraph.moe_dispatch %x[%e] experts 1 capacity 12 : tensor<16x4xf32>, tensor<16x2xi32> -> tensor<24x4xf32>, tensor<1xi32>
  return %0#0 : tensor<24x4xf32>
}

// -----

func.func @f(%x: tensor<8x4xf32>, %e: tensor<16x2xi32>) -> tensor<32x4xf32> {
  // expected-error @below {{'tgraph.moe_dispatch' op 'input' must be [16, D] or [16, 2, D] for 'experts' 'tensor<16x2xi32>', got 'tensor<8x4xf32>'}}
  %0:2 = tgraph.moe_dispatch %x[%e] experts 8 capacity 0 : tensor<8x4xf32>, tensor<16x2xi32> -> tensor<32x4xf32>, tensor<8xi32>
  return %0#0 : tensor<32x4xf32>
}

// -----

func.func @f(%r: tensor<32x4xf32>, %e: tensor<16x2xf32>) -> tensor<16x2x4xf32> {
  // expected-error @below {{'tgraph.moe_collect' op 'experts' must be a [tokens, k] i32 tensor, got 'tensor<16x2xf32>'}}
  %0 = tgraph.moe_collect %r[%e] experts 8 capacity 0 : tensor<32x4xf32>, tensor<16x2xf32> -> tensor<16x2x4xf32>
  return %0 : tensor<16x2x4xf32>
}

// -----

func.func @f(%r: tensor<32x4xf32>, %w: tensor<8x5x6xf32>, %s: tensor<8xi32>) -> tensor<32x6xf32> {
  // expected-error @below {{'tgraph.grouped_matmul' op contracting dimensions differ: lhs 'tensor<32x4xf32>', rhs 'tensor<8x5x6xf32>'}}
  %0 = tgraph.grouped_matmul %r, %w, %s : tensor<32x4xf32>, tensor<8x5x6xf32>, tensor<8xi32> -> tensor<32x6xf32>
  return %0 : tensor<32x6xf32>
}

// -----

func.func @f(%r: tensor<32x4xf32>, %w: tensor<8x4x6xf32>, %s: tensor<6xi32>) -> tensor<32x6xf32> {
  // expected-error @below {{'tgraph.grouped_matmul' op 'sizes' has 6 segments, not a multiple of the 8 groups}}
  %0 = tgraph.grouped_matmul %r, %w, %s : tensor<32x4xf32>, tensor<8x4x6xf32>, tensor<6xi32> -> tensor<32x6xf32>
  return %0 : tensor<32x6xf32>
}

// -----

func.func @f(%r: tensor<32x4xf32>, %g: tensor<16x6xf32>, %s: tensor<8xi32>) -> tensor<8x4x6xf32> {
  // expected-error @below {{'tgraph.grouped_outer' op operands must be lhs [N, K] and rhs [N, M], got 'tensor<32x4xf32>' and 'tensor<16x6xf32>'}}
  %0 = tgraph.grouped_outer %r, %g, %s : tensor<32x4xf32>, tensor<16x6xf32>, tensor<8xi32> -> tensor<8x4x6xf32>
  return %0 : tensor<8x4x6xf32>
}

// -----

func.func @f(%x: tensor<16x4xf32>, %e: tensor<16x2xi32>) -> tensor<96x4xf32> {
  // expected-error @below {{'tgraph.moe_dispatch' op blocks = 3 must divide the 8 experts}}
  %0:2 = tgraph.moe_dispatch %x[%e] experts 8 capacity 0 {blocks = 3 : i64} : tensor<16x4xf32>, tensor<16x2xi32> -> tensor<96x4xf32>, tensor<8xi32>
  return %0#0 : tensor<96x4xf32>
}

// -----

func.func @f(%x: tensor<16x4xf32>, %e: tensor<16x2xi32>, %b: tensor<8xi32>) -> tensor<32x4xf32> {
  // expected-error @below {{'tgraph.moe_dispatch' op 'base' must be 'tensor<2x8xi32>', got 'tensor<8xi32>'}}
  %0:2 = tgraph.moe_dispatch %x[%e, %b] experts 8 capacity 2 : tensor<16x4xf32>, tensor<16x2xi32>, tensor<8xi32> -> tensor<16x4xf32>, tensor<8xi32>
  return %0#0 : tensor<16x4xf32>
}

// -----

func.func @f(%r: tensor<30x4xf32>, %w: tensor<4x4x6xf32>, %s: tensor<4x4xi32>) -> tensor<30x6xf32> {
  // expected-error @below {{'tgraph.grouped_matmul' op 'sizes' has 4 blocks, which do not divide the 30 rows}}
  %0 = tgraph.grouped_matmul %r, %w, %s : tensor<30x4xf32>, tensor<4x4x6xf32>, tensor<4x4xi32> -> tensor<30x6xf32>
  return %0 : tensor<30x6xf32>
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'tgraph.no_gradient' must be a unit attribute}}
  %0 = tgraph.exp %x {tgraph.no_gradient = 1 : i64} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @f(%x: tensor<2x64x8xf32>, %u: tensor<2x1x4xf32>, %at: tensor<i32>) -> tensor<2x64x8xf32> {
  // expected-error @below {{'tgraph.dynamic_update_slice' op 'update' must have the shape of 'x' 'tensor<2x64x8xf32>' but along dim 1 (at most its size), got 'tensor<2x1x4xf32>'}}
  %c = tgraph.dynamic_update_slice %x[%at] = %u {dim = 1 : i64} : tensor<2x64x8xf32>, tensor<i32>, tensor<2x1x4xf32> -> tensor<2x64x8xf32>
  return %c : tensor<2x64x8xf32>
}

// -----

func.func @f(%x: tensor<2x64x8xf32>, %at: tensor<1xi64>) -> tensor<2x4x8xf32> {
  // expected-error @below {{'tgraph.dynamic_slice' op 'start' must be an i32 scalar tensor, got 'tensor<1xi64>'}}
  %r = tgraph.dynamic_slice %x[%at] {dim = 1 : i64} : tensor<2x64x8xf32>, tensor<1xi64> -> tensor<2x4x8xf32>
  return %r : tensor<2x4x8xf32>
}

// -----

func.func @f(%x: tensor<2x64x8xf32>, %at: tensor<i32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{'tgraph.dynamic_slice' op 'dim' 3 is not a dimension of 'tensor<2x64x8xf32>'}}
  %r = tgraph.dynamic_slice %x[%at] {dim = 3 : i64} : tensor<2x64x8xf32>, tensor<i32> -> tensor<2x4x8xf32>
  return %r : tensor<2x4x8xf32>
}

// -----

func.func @f(%q: tensor<64x16xf32>) -> tensor<64x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'softcap' must be positive, got -1}}
  %o:2 = tgraph.attention %q, %q, %q {scale = 0.25 : f64, softcap = -1.0 : f64} : tensor<64x16xf32>, tensor<64x16xf32>, tensor<64x16xf32> -> tensor<64x16xf32>, tensor<64x1xf32>
  return %o#0 : tensor<64x16xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>, %key: tensor<2xi64>) -> tensor<4x8xf32> {
  // expected-error @below {{'tgraph.dropout' op 'p' must lie in (0, 1), got 1}}
  %r = tgraph.dropout %x[%key] {p = 1.0 : f64} : tensor<4x8xf32>, tensor<2xi64> -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>, %key: tensor<2xi32>) -> tensor<4x8xf32> {
  // expected-error @below {{'tgraph.dropout' op 'key' must be the tensor<2xi64> [seed, step], got 'tensor<2xi32>'}}
  %r = tgraph.dropout %x[%key] {p = 0.5 : f64} : tensor<4x8xf32>, tensor<2xi32> -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}

// -----

func.func @f(%x: tensor<4x8xi32>, %key: tensor<2xi64>) -> tensor<4x8xi32> {
  // expected-error @below {{'tgraph.dropout' op 'x' must be a floating-point tensor, got 'tensor<4x8xi32>'}}
  %r = tgraph.dropout %x[%key] {p = 0.5 : f64} : tensor<4x8xi32>, tensor<2xi64> -> tensor<4x8xi32>
  return %r : tensor<4x8xi32>
}

// -----

func.func @f(%x: tensor<4x8xf32>, %key: tensor<2xi64>) -> tensor<4x8xf32> {
  // expected-error @below {{'tgraph.dropout' op 'dim_axes' must have one entry per dimension of 'tensor<4x8xf32>', got 1}}
  %r = tgraph.dropout %x[%key] {p = 0.5 : f64, dim_axes = ["dp"]} : tensor<4x8xf32>, tensor<2xi64> -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}

// -----

func.func @f(%q: tensor<2x4x8x16xf32>, %sd: tensor<2x1x1x3xi64>) -> tensor<2x4x8x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'dropout' seeds must be 'tensor<2x4x1x3xi64>' ((seed, step, head) per head of 'tensor<2x4x8x16xf32>'), got 'tensor<2x1x1x3xi64>'}}
  %o:2 = tgraph.attention %q, %q, %q dropout(%sd : tensor<2x1x1x3xi64>) {scale = 0.25 : f64, dropout_p = 0.1 : f64} : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32> -> tensor<2x4x8x16xf32>, tensor<2x4x8x1xf32>
  return %o#0 : tensor<2x4x8x16xf32>
}

// -----

func.func @f(%q: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'dropout_p' and 'dropout(%seeds)' go together}}
  %o:2 = tgraph.attention %q, %q, %q {scale = 0.25 : f64, dropout_p = 0.1 : f64} : tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>, tensor<8x1xf32>
  return %o#0 : tensor<8x16xf32>
}

// -----

func.func @f(%q: tensor<8x16xf32>, %sd: tensor<1x3xi64>) -> tensor<8x16xf32> {
  // expected-error @below {{'tgraph.attention' op 'dropout_p' must lie in (0, 1), got 0}}
  %o:2 = tgraph.attention %q, %q, %q dropout(%sd : tensor<1x3xi64>) {scale = 0.25 : f64, dropout_p = 0.0 : f64} : tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>, tensor<8x1xf32>
  return %o#0 : tensor<8x16xf32>
}

// -----

tgraph.mesh @mesh axes = ["cp"] shape = [4]
func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{'tgraph.ring_shift' op offset 4 must be 1 to 3 (axis 'cp' has 4 ranks)}}
  %0 = tgraph.ring_shift %x on @mesh["cp"] offset 4 : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
