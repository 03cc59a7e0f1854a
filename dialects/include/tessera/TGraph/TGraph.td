//===- TGraph.td - Tessera Graph IR ------------------------*- tablegen -*-===//
//
// Graph IR: operator algebra on *global* tensors over a named device mesh.
// Tensors carry shardings (which mesh axes split which dimension, and which
// axes hold a pending partial sum); passes propagate shardings and partition
// the program into a per-rank SPMD program in which collectives appear.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_TGRAPH_TD
#define TESSERA_TGRAPH_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

def TGraph_Dialect : Dialect {
  let name = "tgraph";
  let summary = "Tessera Graph IR: global tensors, device meshes and shardings";
  let description = [{
    Graph IR is what `tessera.compile` traces a Python function into. Values are
    builtin `tensor<...>` with *global* shapes. A `tgraph.mesh` names the device
    mesh; a `#tgraph.sharding` says, per tensor dimension, which mesh axes split
    it (like a JAX PartitionSpec) and which axes hold a pending partial sum.

    Function arguments and results carry their sharding in the `tgraph.sharding`
    argument/result attribute; after `tessera-propagate-sharding` every op
    carries one too. `tessera-partition` rewrites the function to local
    (per-rank) shapes and inserts the collectives the shardings imply.

    Recomputation (`tessera.remat`): the ops of a region carry
    `tgraph.remat = {region = N : i64, policy = "..."}` (policy
    `nothing_saveable`, `dots_saveable`, `selective`, or `none` for a
    candidate region the memory budget may choose for). `tessera-autodiff`
    consumes them: it copies the region's forward before the region's
    backward, marking each copy `tgraph.recompute = N : i64` (which keeps CSE
    from merging it back into the original).

    `tgraph.no_gradient` (a unit attribute) on an op: `tessera-autodiff`
    sends no cotangent back through it (the scales of `op.moe`'s FP8
    packing, constants to the derivative of a rounding).

    ```mlir
    tgraph.mesh @mesh axes = ["tp"] shape = [2]
    func.func @mlp(%x: tensor<8x16xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], []]>},
                   %w: tensor<16x32xf32> {tgraph.sharding = #tgraph.sharding<@mesh, [[], ["tp"]]>})
        -> tensor<8x32xf32> {
      %0 = tgraph.matmul %x, %w : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
      return %0 : tensor<8x32xf32>
    }
    ```
  }];
  let cppNamespace = "::tessera::tgraph";
  let useDefaultAttributePrinterParser = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    /// Name of the discardable attribute holding a value's sharding on function
    /// arguments/results and (after propagation) on ops.
    static constexpr ::llvm::StringLiteral getShardingAttrName() {
      return ::llvm::StringLiteral("tgraph.sharding");
    }
  }];
}

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

def TGraph_ReductionKind : I32EnumAttr<"ReductionKind", "reduction kind of a collective", [
    I32EnumAttrCase<"sum", 0>, I32EnumAttrCase<"max", 1>,
    I32EnumAttrCase<"min", 2>, I32EnumAttrCase<"prod", 3>]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::tessera::tgraph";
}

def TGraph_ReductionKindAttr
    : EnumAttr<TGraph_Dialect, TGraph_ReductionKind, "reduction"> {
  let assemblyFormat = "`<` $value `>`";
}

def TGraph_Transport : I32EnumAttr<"Transport", "how a collective moves data between GPUs", [
    I32EnumAttrCase<"Auto", 0, "auto">, I32EnumAttrCase<"NCCL", 1, "nccl">,
    I32EnumAttrCase<"NVSHMEM", 2, "nvshmem">]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::tessera::tgraph";
}

def TGraph_TransportAttr : EnumAttr<TGraph_Dialect, TGraph_Transport, "transport"> {
  let summary = "collective transport: the runtime's collective library, or NVSHMEM in a kernel";
  let description = [{
    `nccl`: a separate collective (NCCL on GPUs, MPI on CPUs), overlapped with
    compute by the schedule. `nvshmem`: the communication happens inside the
    consuming kernel, which reads peers' tiles as they arrive (GPU target
    only). `auto`: `tessera-lower-to-schedule` picks one by size.
  }];
  let assemblyFormat = "`<` $value `>`";
}

def TGraph_ShardingAttr : AttrDef<TGraph_Dialect, "Sharding"> {
  let mnemonic = "sharding";
  let summary = "how a tensor is laid out over a device mesh";
  let description = [{
    `#tgraph.sharding<@mesh, [[dim0 axes], [dim1 axes], ...]>` lists, for each
    tensor dimension, the mesh axes that dimension is split over (outermost
    first); an empty list means the dimension is replicated. The optional
    `partial = ["axis", ...]` says the value is a pending *partial sum* over
    those axes: each rank holds a summand and the full value is their sum.

    ```mlir
    #tgraph.sharding<@mesh, [[], ["tp"]]>                  // column-split over tp
    #tgraph.sharding<@mesh, [["tp"], ["dp"]]>              // 2-D split
    #tgraph.sharding<@mesh, [[], []], partial = ["tp"]>    // partial sum over tp
    ```
  }];
  let parameters = (ins "::mlir::FlatSymbolRefAttr":$mesh,
                        "::mlir::ArrayAttr":$dims,
                        OptionalParameter<"::mlir::ArrayAttr">:$partial);
  let assemblyFormat = "`<` $mesh `,` $dims (`,` `partial` `=` $partial^)? `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Mesh axes splitting tensor dimension `dim`.
    ::llvm::SmallVector<::llvm::StringRef> getDimAxes(unsigned dim) const;
    /// Axes with a pending partial sum.
    ::llvm::SmallVector<::llvm::StringRef> getPartialAxes() const;
  }];
}

//===----------------------------------------------------------------------===//
// Ops
//===----------------------------------------------------------------------===//

class TGraph_Op<string mnemonic, list<Trait> traits = []>
    : Op<TGraph_Dialect, mnemonic, traits>;

def TGraph_MeshOp : TGraph_Op<"mesh", [Symbol]> {
  let summary = "a named device mesh";
  let description = [{
    Declares a Cartesian device mesh with named axes and their sizes.

    Collectives may also run over a *sub-axis*, written as in Shardy:
    `"dp:(2)4"` is the part of axis `dp` of size 4 whose coordinate is
    `(c / (N / (2 * 4))) % 4` for a coordinate `c` along `dp` of size `N`, i.e.
    `dp` split into a major part of size 2 ("pre-size"), this part, and a minor
    part of size `N / 8`. Hierarchical collectives run over the sub-axis inside
    a node (the minor part) and the one across nodes (the major part). Axis
    names therefore cannot contain `:`.

    ```mlir
    tgraph.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$axes,
                       DenseI64ArrayAttr:$shape);
  let assemblyFormat = "$sym_name `axes` `=` $axes `shape` `=` $shape attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Size of `axis`, or std::nullopt if the mesh has no such axis.
    std::optional<int64_t> getAxisSize(::llvm::StringRef axis);
    /// Size of the group a collective over `axis` spans: a mesh axis or a
    /// sub-axis `name:(pre)size` of one; std::nullopt if it is neither.
    std::optional<int64_t> getGroupSize(::llvm::StringRef axis);
  }];
}

def TGraph_MatmulOp : TGraph_Op<"matmul", [Pure]> {
  let summary = "matrix product";
  let description = [{
    `lhs[..., M, K] x rhs[..., K, N] -> result[..., M, N]`; leading batch
    dimensions must match. `rhs` may instead be 2-D, `[K, N]`, shared by
    every batch (a linear layer over `[B, S, K]` activations: no reshape
    to `[B * S, K]`, so a split of any of their dimensions, the sequence's
    under context parallelism, carries over to the result);
    `tessera-lower-to-schedule` makes it a 2-D GEMM once shapes are local.

    `transport` (optional) asks that the collective next to this matmul use
    that transport: the all-gather of `lhs` along M, which the partitioner
    inserts when `lhs` is split on M over the axis `rhs` is split on N (a
    sequence-parallel input to a column-parallel weight; without a transport
    the partitioner gathers `rhs` instead), or the reduce-scatter along M of
    this matmul's partial sums (a row-parallel weight whose output is
    sequence-parallel).

    ```mlir
    %0 = tgraph.matmul %a, %b : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
    %1 = tgraph.matmul %a, %b {transport = #tgraph.transport<nvshmem>}
         : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
    %2 = tgraph.matmul %x, %w : tensor<2x8x16xf32>, tensor<16x32xf32> -> tensor<2x8x32xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs,
                       OptionalAttr<TGraph_TransportAttr>:$transport);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

def TGraph_ContractRowsOp : TGraph_Op<"contract_rows", [Pure]> {
  let summary = "lhs^T rhs summed over every row: a linear layer's weight gradient";
  let description = [{
    `lhs[R..., K]` and `rhs[R..., N]` with the same row dimensions `R`:
    `result[k, n] = sum over r of lhs[r, k] * rhs[r, n]`, `[K, N]`. The
    gradient of the weight of a `tgraph.matmul` whose `rhs` is 2-D, with
    its rows kept in their dimensions (a split of any becomes a pending
    partial sum); `tessera-lower-to-schedule` makes it a 2-D GEMM once the
    shapes are local.

    ```mlir
    %dw = tgraph.contract_rows %x, %dy
        : tensor<2x8x16xf32>, tensor<2x8x32xf32> -> tensor<16x32xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

//----------------------------------------------------------------------------
// Elementwise ops. Operands have equal types: broadcasting is explicit
// (tgraph.broadcast), so sharding and differentiation rules stay per-op.
// Each `Elementwise` op has an entry in the op table
// (tessera_compiler/ir/ops.py), which every pass and emitter reads.
//----------------------------------------------------------------------------

class TGraph_BinaryOp<string mnemonic, string what>
    : TGraph_Op<mnemonic, [Pure, SameOperandsAndResultType, Elementwise]> {
  let summary = "elementwise " # what;
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}
def TGraph_AddOp : TGraph_BinaryOp<"add", "addition">;
def TGraph_SubOp : TGraph_BinaryOp<"sub", "subtraction">;
def TGraph_MulOp : TGraph_BinaryOp<"mul", "multiplication">;
def TGraph_DivOp : TGraph_BinaryOp<"div", "division">;
def TGraph_MaxOp : TGraph_BinaryOp<"max", "maximum">;
def TGraph_PowOp : TGraph_BinaryOp<"pow", "power: lhs ** rhs, any real exponent">;

class TGraph_UnaryOp<string mnemonic, string what>
    : TGraph_Op<mnemonic, [Pure, SameOperandsAndResultType, Elementwise]> {
  let summary = "elementwise " # what;
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}
def TGraph_ReluOp : TGraph_UnaryOp<"relu", "max(x, 0)">;
def TGraph_NegOp : TGraph_UnaryOp<"neg", "negation">;
def TGraph_ExpOp : TGraph_UnaryOp<"exp", "e^x">;
def TGraph_LogOp : TGraph_UnaryOp<"log", "natural logarithm">;
def TGraph_TanhOp : TGraph_UnaryOp<"tanh", "hyperbolic tangent">;
// One op, not a composite: its VJP keeps its input only (a composite of
// eight primitives keeps about twelve intermediates of the MLP's width).
def TGraph_GeluOp : TGraph_UnaryOp<"gelu",
    "GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))">;
def TGraph_SqrtOp : TGraph_UnaryOp<"sqrt", "square root">;
def TGraph_RsqrtOp : TGraph_UnaryOp<"rsqrt", "1 / sqrt(x)">;
def TGraph_SinOp : TGraph_UnaryOp<"sin", "sine">;
def TGraph_CosOp : TGraph_UnaryOp<"cos", "cosine">;
def TGraph_ErfOp : TGraph_UnaryOp<"erf", "the error function">;
def TGraph_AbsOp : TGraph_UnaryOp<"abs", "absolute value">;
def TGraph_SignOp : TGraph_UnaryOp<"sign", "-1, 0 or 1 by the sign of x (NaN stays NaN)">;
def TGraph_FloorOp : TGraph_UnaryOp<"floor", "the largest integer not above x">;
def TGraph_CeilOp : TGraph_UnaryOp<"ceil", "the smallest integer not below x">;

def TGraph_CompareKind : I32EnumAttr<"CompareKind", "comparison predicate", [
    I32EnumAttrCase<"eq", 0>, I32EnumAttrCase<"ne", 1>, I32EnumAttrCase<"lt", 2>,
    I32EnumAttrCase<"le", 3>, I32EnumAttrCase<"gt", 4>, I32EnumAttrCase<"ge", 5>]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::tessera::tgraph";
}

def TGraph_CompareKindAttr
    : EnumAttr<TGraph_Dialect, TGraph_CompareKind, "compare"> {
  let assemblyFormat = "`<` $value `>`";
}

def TGraph_CompareOp : TGraph_Op<"compare", [Pure, AllTypesMatch<["lhs", "rhs"]>, Elementwise]> {
  let summary = "elementwise comparison giving an i1 tensor";
  let description = [{
    ```mlir
    %m = tgraph.compare <gt> %x, %y : tensor<4x8xf32> -> tensor<4x8xi1>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs,
                       TGraph_CompareKindAttr:$kind);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)";
  let hasVerifier = 1;
}

def TGraph_SelectOp : TGraph_Op<"select", [Pure,
                                           AllTypesMatch<["on_true", "on_false", "result"]>,
                                           Elementwise]> {
  let summary = "elementwise `cond ? on_true : on_false`";
  let arguments = (ins AnyRankedTensor:$cond, AnyRankedTensor:$on_true,
                       AnyRankedTensor:$on_false);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$cond `,` $on_true `,` $on_false attr-dict `:` type($cond) `,` type($result)";
  let hasVerifier = 1;
}

def TGraph_CastOp : TGraph_Op<"cast", [Pure, Elementwise]> {
  let summary = "elementwise conversion to another element type";
  let description = [{
    Float to float conversions round to nearest even (f32 -> bf16 included).

    ```mlir
    %h = tgraph.cast %x : tensor<4x8xf32> to tensor<4x8xbf16>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
}

def TGraph_FillOp : TGraph_Op<"fill", [Pure]> {
  let summary = "a tensor with every element equal to `value`";
  let description = [{
    ```mlir
    %half = tgraph.fill 5.000000e-01 : tensor<f32>
    ```
  }];
  let arguments = (ins F64Attr:$value);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
}

def TGraph_IotaOp : TGraph_Op<"iota", [Pure]> {
  let summary = "each element's index along dimension `dim`";
  let description = [{
    ```mlir
    %cols = tgraph.iota dim 1 : tensor<4x8xi32>     // %cols[i, j] = j
    ```
  }];
  let arguments = (ins I64Attr:$dim);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "`dim` $dim attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//----------------------------------------------------------------------------
// Shape ops
//----------------------------------------------------------------------------

def TGraph_BroadcastOp : TGraph_Op<"broadcast", [Pure]> {
  let summary = "repeat size-1 dimensions to a larger shape of the same rank";
  let description = [{
    ```mlir
    %b = tgraph.broadcast %bias : tensor<1x32xf32> to tensor<8x32xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
}

def TGraph_ReduceOp : TGraph_Op<"reduce", [Pure]> {
  let summary = "reduce over dimensions, keeping them with size 1";
  let description = [{
    ```mlir
    %s = tgraph.reduce <sum> %x dims [1] : tensor<8x32xf32> -> tensor<8x1xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, TGraph_ReductionKindAttr:$kind,
                       DenseI64ArrayAttr:$dims);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $input `dims` $dims attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def TGraph_ReshapeOp : TGraph_Op<"reshape", [Pure]> {
  let summary = "the same elements in row-major order, in another shape";
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
}

def TGraph_TransposeOp : TGraph_Op<"transpose", [Pure]> {
  let summary = "permute dimensions: result dim i is input dim perm[i]";
  let description = [{
    ```mlir
    %t = tgraph.transpose %x perm [1, 0] : tensor<8x32xf32> -> tensor<32x8xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, DenseI64ArrayAttr:$perm);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input `perm` $perm attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def TGraph_SliceOp : TGraph_Op<"slice", [Pure]> {
  let summary = "a static box of the input starting at `offsets` (the result's shape)";
  let description = [{
    ```mlir
    %q = tgraph.slice %qkv offsets [0, 32] : tensor<8x96xf32> -> tensor<8x32xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, DenseI64ArrayAttr:$offsets);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input `offsets` $offsets attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def TGraph_PadOp : TGraph_Op<"pad", [Pure]> {
  let summary = "place the input at `offsets` in a zero tensor of the result's shape";
  let description = [{
    The inverse of `tgraph.slice` (and its derivative).

    ```mlir
    %g = tgraph.pad %dq offsets [0, 32] : tensor<8x32xf32> -> tensor<8x96xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, DenseI64ArrayAttr:$offsets);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input `offsets` $offsets attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def TGraph_ConcatOp : TGraph_Op<"concat", [Pure]> {
  let summary = "concatenate tensors along `dim`";
  let description = [{
    ```mlir
    %c = tgraph.concat %a, %b dim 1 : tensor<8x16xf32>, tensor<8x8xf32> -> tensor<8x24xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$inputs, I64Attr:$dim);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$inputs `dim` $dim attr-dict `:` type($inputs) `->` type($result)";
  let hasVerifier = 1;
}

//----------------------------------------------------------------------------
// Indexing ops (embedding lookup and its derivative)
//----------------------------------------------------------------------------

def TGraph_GatherOp : TGraph_Op<"gather", [Pure]> {
  let summary = "rows of `table` selected by integer `indices`";
  let description = [{
    `result[i..., :] = table[indices[i...], :]`, for indices of any rank
    (token ids `[B, S]` give `[B, S, D]`, so a split of either dimension
    carries over to the rows). An index outside `[0, rows)` is an error at
    run time.

    After partitioning, `row_axes` says the table's rows are split over these
    mesh axes (vocab parallelism): this rank holds one block of rows, looks up
    only the indices that fall in it and reads zeros for the others, so the
    result is a partial sum over those axes.

    ```mlir
    %e = tgraph.gather %table[%ids] : tensor<64x32xf32>, tensor<16xi32> -> tensor<16x32xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$table, AnyRankedTensor:$indices,
                       OptionalAttr<StrArrayAttr>:$row_axes);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $table `[` $indices `]` attr-dict `:` type($table) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

def TGraph_DynamicSliceOp : TGraph_Op<"dynamic_slice", [Pure]> {
  let summary = "a block of `x` along `dim` from a start index read at run time";
  let description = [{
    `result = x[..., start : start + size, ...]` along `dim`, every other
    dimension whole; `start` is an i32 scalar tensor (a value of the
    program: a decode step's position). A start outside `[0, n - size]`
    is an error at run time (the frontend checks it with
    `tgraph.check_range`).

    ```mlir
    %r = tgraph.dynamic_slice %x[%start] {dim = 1 : i64} : tensor<2x64x8xf32>, tensor<i32> -> tensor<2x1x8xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$x, AnyRankedTensor:$start, I64Attr:$dim);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $x `[` $start `]` attr-dict `:` type($x) `,` type($start) `->` type($result)
  }];
  let hasVerifier = 1;
}

def TGraph_DynamicUpdateSliceOp : TGraph_Op<"dynamic_update_slice", [Pure]> {
  let summary = "`x` with a block along `dim` replaced by `update` at a run-time start";
  let description = [{
    `result = x` but `result[..., start : start + m, ...] = update` along
    `dim` (`update` has `x`'s shape with `m` there); `start` is an i32
    scalar tensor read at run time (a KV cache written at a decode step's
    position). A start outside `[0, n - m]` is an error at run time.

    ```mlir
    %c = tgraph.dynamic_update_slice %cache[%start] = %kv {dim = 1 : i64} : tensor<2x64x8xf32>, tensor<i32>, tensor<2x1x8xf32> -> tensor<2x64x8xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$x, AnyRankedTensor:$start, AnyRankedTensor:$update,
                       I64Attr:$dim);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $x `[` $start `]` `=` $update attr-dict `:` type($x) `,` type($start) `,` type($update)
    `->` type($result)
  }];
  let hasVerifier = 1;
}

def TGraph_DropoutOp : TGraph_Op<"dropout", [Pure, AllTypesMatch<["x", "result"]>]> {
  let summary = "`x` with elements dropped at rate `p`, by counter-based random bits";
  let description = [{
    `result = x * keep / (1 - p)`, where element `e` (its flat row-major
    index in the global tensor) is kept when the random word
    `philox4x32_10(counter = (e / 4, step), key = seed)[e % 4]` has its top
    24 bits at least `round(p * 2^24)`; `key` is the i64 pair
    `[seed, step]` (`tessera_runtime/random.py` says it exactly). A pure
    function of (key, global index): the same mask on one rank and on any
    mesh, and again in the gradient (the same op on the cotangent).
    `0 < p < 1`.

    After partitioning, `dim_axes` names, per dimension, the mesh axes
    splitting it (comma-separated, empty when whole): the runtime places
    this rank's block in the global tensor from them.

    ```mlir
    %r = tgraph.dropout %x[%key] {p = 1.000000e-01 : f64} : tensor<4x8xf32>, tensor<2xi64> -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$x, AnyRankedTensor:$key, F64Attr:$p,
                       OptionalAttr<StrArrayAttr>:$dim_axes);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $x `[` $key `]` attr-dict `:` type($x) `,` type($key) `->` type($result)
  }];
  let hasVerifier = 1;
}

def TGraph_ScatterAddOp : TGraph_Op<"scatter_add", [Pure]> {
  let summary = "sum rows of `updates` into a zero tensor at rows `indices`";
  let description = [{
    `result[indices[i...], :] += updates[i..., :]`: the derivative of `tgraph.gather`
    with respect to the table. Repeated indices accumulate. With `row_axes`
    (after partitioning) the result is this rank's block of rows over those
    mesh axes and updates for other rows are skipped.

    ```mlir
    %g = tgraph.scatter_add %upd[%ids] : tensor<16x32xf32>, tensor<16xi32> -> tensor<64x32xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$updates, AnyRankedTensor:$indices,
                       OptionalAttr<StrArrayAttr>:$row_axes);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $updates `[` $indices `]` attr-dict `:` type($updates) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

//----------------------------------------------------------------------------
// Value checks
//----------------------------------------------------------------------------

def TGraph_CheckRangeOp : TGraph_Op<"check_range",
    [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "its integer operand, each element checked to lie in [low, high) or in `allowed`";
  let description = [{
    The result is `input` (the runtime reads it in place: no copy). Every
    element must lie in `[low, high)` or equal one of `allowed` (values
    outside that range, e.g. cross-entropy's `ignore_index = -100`).
    Otherwise the step computing the result fails with `message` once the
    step has run, where the runtime replaces `{row}` by the position of the
    first such element in the flattened (row-major) global tensor, `{value}`
    by its value and `{where}` by ` at <file>:<line>` (the op's location) or
    nothing. A check never stops a step half-way (a GPU computes it on the
    device; the host reads one small flag per check with the step's results),
    and it runs wherever its result is used: `ts.nn.cross_entropy` checks its
    targets with it, so the loss and its gradient both keep it.

    After partitioning, `row_axes` names the mesh axes splitting the first
    dimension when only it is split, or `dim_axes` those splitting each
    dimension (comma-separated; token ids split along the sequence): this
    rank checks its block and reports an element by its global position.

    ```mlir
    %t = tgraph.check_range %targets in [0, 7) or [-100]
        message "target {value} in row {row} is out of range{where}" : tensor<16xi32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, I64Attr:$low, I64Attr:$high,
                       OptionalAttr<DenseI64ArrayAttr>:$allowed, StrAttr:$message,
                       OptionalAttr<StrArrayAttr>:$row_axes,
                       OptionalAttr<StrArrayAttr>:$dim_axes);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input `in` ` ` `[` $low `,` $high `)` (`or` $allowed^)? `message` $message attr-dict
    `:` type($input)
  }];
  let hasVerifier = 1;
}

//----------------------------------------------------------------------------
// Mixture of experts: routing, the dispatch buffer, grouped expert GEMMs
//----------------------------------------------------------------------------

def TGraph_TopKOp : TGraph_Op<"topk", [Pure]> {
  let summary = "indices of the k largest entries along the last dimension";
  let description = [{
    `indices[..., j]` is the position of the `j`-th largest entry of
    `input[..., :]` (largest first; equal values: the lower index first).
    The result is i32 with `input`'s shape but `k` in the last dimension.
    No derivative (the values a caller needs are read back from the input
    with a one-hot mask, which differentiates).

    ```mlir
    %i = tgraph.topk %logits k 2 : tensor<16x8xf32> -> tensor<16x2xi32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, I64Attr:$k);
  let results = (outs AnyRankedTensor:$indices);
  let assemblyFormat = "$input `k` $k attr-dict `:` type($input) `->` type($indices)";
  let hasVerifier = 1;
}

def TGraph_MoeDispatchOp : TGraph_Op<"moe_dispatch", [Pure]> {
  let summary = "copy each token's row to the slots of the experts it chose";
  let description = [{
    `experts[T, k]` (i32) are the experts each token chose, in choice order.
    The result `rows[N, D]` holds one row per kept (token, choice), packed
    by expert: expert 0's rows first, then expert 1's, ...; within an
    expert, first choices before second choices, each in token order.
    `sizes[E]` (i32) counts each expert's rows; other rows are zero.

    `capacity = 0` keeps every choice (dropless). A capacity `C > 0` keeps
    the choices whose position in their expert's fill order (first choices
    first, token order) is below `C`; the rest are dropped. That position is
    `base[j, e]` plus the choice's rank among this call's (choice j, expert
    e) rows: the optional `base[k, E]` (i32) counts the rows that precede
    them in the fill order (earlier choices, and other ranks' earlier
    tokens); without it, this call's own earlier choices.

    `blocks = B` (an expert-parallel layout, one block per rank holding
    `E / B` consecutive experts) pads each block to `N / B` rows, so that a
    uniform all-to-all of the blocks sends each rank its experts' rows;
    `N / B` is `T * k`, or `min(T * k, E / B * C)` with a capacity.

    `input` is `[T, D]` (each choice copies the token's row) or `[T, k, D]`
    (a row per choice: the derivative of `tgraph.moe_collect`). Expert
    indices outside `[0, E)` are an error at run time.

    ```mlir
    %rows, %sizes = tgraph.moe_dispatch %x[%experts] experts 8 capacity 0
        : tensor<16x32xf32>, tensor<16x2xi32> -> tensor<32x32xf32>, tensor<8xi32>
    %r2, %s2 = tgraph.moe_dispatch %x[%experts, %base] experts 8 capacity 3 {blocks = 2 : i64}
        : tensor<16x32xf32>, tensor<16x2xi32>, tensor<2x8xi32> -> tensor<24x32xf32>, tensor<8xi32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$experts,
                       Optional<AnyRankedTensor>:$base, I64Attr:$num_experts,
                       I64Attr:$capacity, DefaultValuedAttr<I64Attr, "1">:$blocks);
  let results = (outs AnyRankedTensor:$rows, AnyRankedTensor:$sizes);
  let assemblyFormat = [{
    $input `[` $experts (`,` $base^)? `]` `experts` $num_experts `capacity` $capacity attr-dict
    `:` type($input) `,` type($experts) (`,` type($base)^)? `->` type($rows) `,` type($sizes)
  }];
  let hasVerifier = 1;
}

def TGraph_MoeCollectOp : TGraph_Op<"moe_collect", [Pure]> {
  let summary = "read each (token, choice)'s row back from the dispatch layout";
  let description = [{
    The inverse movement of `tgraph.moe_dispatch` with the same `experts`,
    `base`, `num_experts`, `capacity` and `blocks`: `result[t, j, :]` is the
    row that (token `t`, choice `j`) was dispatched to, or zeros where it was
    dropped. The caller weights and sums over `j` (in choice order: a fixed
    order, so the combine is deterministic).

    ```mlir
    %y = tgraph.moe_collect %rows[%experts] experts 8 capacity 0
        : tensor<32x32xf32>, tensor<16x2xi32> -> tensor<16x2x32xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$rows, AnyRankedTensor:$experts,
                       Optional<AnyRankedTensor>:$base, I64Attr:$num_experts,
                       I64Attr:$capacity, DefaultValuedAttr<I64Attr, "1">:$blocks);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $rows `[` $experts (`,` $base^)? `]` `experts` $num_experts `capacity` $capacity attr-dict
    `:` type($rows) `,` type($experts) (`,` type($base)^)? `->` type($result)
  }];
  let hasVerifier = 1;
}

def TGraph_GroupedMatmulOp : TGraph_Op<"grouped_matmul", [Pure]> {
  let summary = "a GEMM per segment of rows, each with its group's weight";
  let description = [{
    `lhs[N, K]` is cut into consecutive segments of `sizes[S]` rows
    (integers); segment `s` is multiplied by `rhs[s mod G]` (`rhs[G, K, M]`,
    or `[G, M, K]` transposed with `transpose_rhs`). With `sizes[B, S]` the
    rows are `B` blocks of `N / B` and block `b`'s segments start at its
    first row (the blocks an expert-parallel all-to-all received, one per
    source rank). Rows outside the segments are zero in the result
    `[N, M]`. One segment per expert is a mixture of experts' FFN.

    ```mlir
    %h = tgraph.grouped_matmul %rows, %w1, %sizes
        : tensor<32x16xf32>, tensor<8x16x64xf32>, tensor<8xi32> -> tensor<32x64xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs, AnyRankedTensor:$sizes,
                       UnitAttr:$transpose_rhs);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $sizes attr-dict `:` type($lhs) `,` type($rhs) `,` type($sizes)
    `->` type($result)
  }];
  let hasVerifier = 1;
}

def TGraph_GroupedOuterOp : TGraph_Op<"grouped_outer", [Pure]> {
  let summary = "per group, the sum of lhs^T rhs over its segments";
  let description = [{
    The weight gradient of `tgraph.grouped_matmul`: with `lhs[N, K]` and
    `rhs[N, M]` cut into the segments of `sizes[S]` (or `[B, S]`, in blocks),
    `result[g] = sum over segments s with s mod G = g of lhs_s^T rhs_s`
    (`result[G, K, M]`; segments added in order, so the sum is deterministic).

    ```mlir
    %dw = tgraph.grouped_outer %rows, %dh, %sizes
        : tensor<32x16xf32>, tensor<32x64xf32>, tensor<8xi32> -> tensor<8x16x64xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs, AnyRankedTensor:$sizes);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $sizes attr-dict `:` type($lhs) `,` type($rhs) `,` type($sizes)
    `->` type($result)
  }];
  let hasVerifier = 1;
}

//----------------------------------------------------------------------------
// Attention (fused: the [S, S] score matrix is never materialized)
//----------------------------------------------------------------------------

def TGraph_AttentionOp : TGraph_Op<"attention", [Pure, AttrSizedOperandSegments]> {
  let summary = "softmax(q k^T * scale [+ masks]) v, with the row log-sum-exp";
  let description = [{
    Operands are `q[..., Sq, D]`, `k[..., Sk, D]` and `v[..., Sk, Dv]` of one
    float element type. Each leading (batch, head) dimension of `k` and `v`
    divides `q`'s: query head `h` reads key/value head `h / (Hq / Hkv)`
    (grouped-query attention; multi-query when `Hkv = 1`), with no copies.
    Query row `i` sits at position `i + Sk - Sq` (the last `Sq` positions:
    a decode step or a chunk of a prefill), which `causal` and `window`
    read. Results: `out[..., Sq, Dv]` (the operands' element type) and
    `lse[..., Sq, 1]` (f32; f64 for f64 operands), the natural log of each
    row's softmax denominator of the scaled scores, which the backward pass
    (`tgraph.attention_grad`) uses to recompute probabilities instead of
    storing them. Lowered to flash-attention Tile IR kernels (online softmax
    over key blocks) that never hold the `[Sq, Sk]` scores.

    `softcap = c` (Gemma 2) caps the scaled scores smoothly before the masks:
    `c * tanh(scale * q k^T / c)`.

    What a query may attend to, all optional and combined:
    * `causal`: keys at or before its position;
    * `window = W` (with `causal`): the last `W` positions, its own included
      (sliding-window attention: key `j` when `pos - j < W`);
    * `mask(%m)`: an additive f32 (f64) bias `[L..., Sq | 1, Sk]`, `-inf`
      where a key is masked; each leading dimension `L` is 1 or `q`'s (in
      the order of `q`'s leading dimensions, `seq_dim` left out);
    * `segments(%qs, %ks)`: i32 document ids `[L..., Sq, 1]` and
      `[L..., Sk, 1]` (packed documents: a query attends to keys of its
      own document only).
    A row with no key left gives `out = 0` and `lse = -inf` (FlashAttention's
    convention), and no gradient.

    `dropout_p = p` with `dropout(%seeds)` drops probabilities after the
    softmax (`lse` stays the undropped one): the mask is `tgraph.dropout`'s
    of the probabilities `[L..., Sq, Sk]` (`L` q's leading dimensions) under
    key (seed, step), drawn in the kernels, never stored. `%seeds` is i64
    `[L..., 1, 3]` holding (seed, step, h) per head, `h` the head's flat
    index in the global `L` (so a split over heads draws the whole
    tensor's mask); the backward draws the same.

    `seq_dim` names the dimension that runs along the sequence (default: the
    second to last); the other leading dimensions are batch dimensions.
    `q[B, S, H, D]` with `seq_dim = 1` is attention per head read straight
    from a `[B, S, H, D]` projection, with no transposes to and from
    `[B, H, S, D]`; `lse` is then `[B, S, H, 1]`.

    ```mlir
    %o, %lse = tgraph.attention %q, %k, %v {causal, scale = 0.125 : f64}
        : tensor<2x4x128x64xbf16>, tensor<2x4x128x64xbf16>, tensor<2x4x128x64xbf16>
        -> tensor<2x4x128x64xbf16>, tensor<2x4x128x1xf32>
    %o2, %lse2 = tgraph.attention %q, %k2, %v2 mask(%m : tensor<2x1x1x256xf32>) {scale = 0.125 : f64}
        : tensor<2x8x1x64xf32>, tensor<2x2x256x64xf32>, tensor<2x2x256x64xf32>
        -> tensor<2x8x1x64xf32>, tensor<2x8x1x1xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$q, AnyRankedTensor:$k, AnyRankedTensor:$v,
                       Optional<AnyRankedTensor>:$mask,
                       Optional<AnyRankedTensor>:$q_segments,
                       Optional<AnyRankedTensor>:$kv_segments,
                       Optional<AnyRankedTensor>:$dropout_seeds,
                       UnitAttr:$causal, F64Attr:$scale, OptionalAttr<I64Attr>:$seq_dim,
                       OptionalAttr<I64Attr>:$window, OptionalAttr<F64Attr>:$softcap,
                       OptionalAttr<F64Attr>:$dropout_p);
  let results = (outs AnyRankedTensor:$out, AnyRankedTensor:$lse);
  let assemblyFormat = [{
    $q `,` $k `,` $v (`mask` `(` $mask^ `:` type($mask) `)`)?
    (`segments` `(` $q_segments^ `,` $kv_segments `:` type($q_segments) `,` type($kv_segments) `)`)?
    (`dropout` `(` $dropout_seeds^ `:` type($dropout_seeds) `)`)?
    attr-dict `:` type($q) `,` type($k) `,` type($v) `->` type($out) `,` type($lse)
  }];
  let hasVerifier = 1;
}

def TGraph_AttentionGradOp : TGraph_Op<"attention_grad", [Pure, AttrSizedOperandSegments]> {
  let summary = "gradients of tgraph.attention with respect to q, k and v";
  let description = [{
    Given the forward operands, the output's cotangent `dout[..., Sq, Dv]`,
    the forward `lse[..., Sq, 1]` and `delta[..., Sq, 1] = rowsum(dout * out)`
    (both f32, or f64 for f64 operands), returns `dq`, `dk`, `dv` shaped like `q`, `k`, `v`. The
    probabilities are recomputed block by block from `lse`; each gradient
    is accumulated by one kernel instance (no atomics: deterministic; a
    grouped key/value head sums its query heads' contributions in one
    loop). `mask`, `segments`, `dropout`, `causal`, `window`, `softcap`,
    `dropout_p` and `seq_dim` are the forward op's; the mask gets no
    gradient.

    ```mlir
    %dq, %dk, %dv = tgraph.attention_grad %q, %k, %v, %do, %lse, %delta {causal, scale = 0.125 : f64}
        : tensor<128x64xf32>, tensor<128x64xf32>, tensor<128x64xf32>, tensor<128x64xf32>,
          tensor<128x1xf32>, tensor<128x1xf32>
        -> tensor<128x64xf32>, tensor<128x64xf32>, tensor<128x64xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$q, AnyRankedTensor:$k, AnyRankedTensor:$v,
                       AnyRankedTensor:$dout, AnyRankedTensor:$lse, AnyRankedTensor:$delta,
                       Optional<AnyRankedTensor>:$mask,
                       Optional<AnyRankedTensor>:$q_segments,
                       Optional<AnyRankedTensor>:$kv_segments,
                       Optional<AnyRankedTensor>:$dropout_seeds,
                       UnitAttr:$causal, F64Attr:$scale, OptionalAttr<I64Attr>:$seq_dim,
                       OptionalAttr<I64Attr>:$window, OptionalAttr<F64Attr>:$softcap,
                       OptionalAttr<F64Attr>:$dropout_p);
  let results = (outs AnyRankedTensor:$dq, AnyRankedTensor:$dk, AnyRankedTensor:$dv);
  let assemblyFormat = [{
    $q `,` $k `,` $v `,` $dout `,` $lse `,` $delta (`mask` `(` $mask^ `:` type($mask) `)`)?
    (`segments` `(` $q_segments^ `,` $kv_segments `:` type($q_segments) `,` type($kv_segments) `)`)?
    (`dropout` `(` $dropout_seeds^ `:` type($dropout_seeds) `)`)?
    attr-dict `:` type($q) `,` type($k) `,`
    type($v) `,` type($dout) `,` type($lse) `,` type($delta) `->` type($dq) `,` type($dk) `,` type($dv)
  }];
  let hasVerifier = 1;
}

//----------------------------------------------------------------------------
// Differentiation
//----------------------------------------------------------------------------

def TGraph_GradOp : TGraph_Op<"grad", [Pure]> {
  let summary = "gradients of a scalar with respect to earlier values";
  let description = [{
    Result `i` is d`loss`/d`wrt[i]`. A placeholder: `tessera-autodiff` replaces
    it with the backward computation (vector-Jacobian products of every op
    between the `wrt` values and `loss`).

    ```mlir
    %g:2 = tgraph.grad %loss wrt %w1, %w2 : tensor<f32>, tensor<16x32xf32>, tensor<32x8xf32>
          -> tensor<16x32xf32>, tensor<32x8xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$loss, Variadic<AnyRankedTensor>:$wrt);
  let results = (outs Variadic<AnyRankedTensor>:$grads);
  let assemblyFormat = "$loss `wrt` $wrt attr-dict `:` type($loss) `,` type($wrt) `->` type($grads)";
  let hasVerifier = 1;
}

class TGraph_CollectiveOp<string mnemonic, list<Trait> traits = []>
    : TGraph_Op<mnemonic, !listconcat(traits,
        [DeclareOpInterfaceMethods<SymbolUserOpInterface>])> {
  code extraBaseClassDeclaration = [{
    /// The size of this op's mesh axis (valid after symbol verification).
    int64_t getAxisSize();
  }];
}

def TGraph_AllReduceOp : TGraph_CollectiveOp<"all_reduce", [SameOperandsAndResultType]> {
  let summary = "reduce a value over a mesh axis; every rank gets the result";
  let description = [{
    `deterministic` asks for a fixed reduction order (bitwise reproducible).

    ```mlir
    %1 = tgraph.all_reduce <sum> %0 on @mesh["tp"] deterministic : tensor<8x16xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, TGraph_ReductionKindAttr:$kind,
                       FlatSymbolRefAttr:$mesh, StrAttr:$axis,
                       UnitAttr:$deterministic);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $kind $input `on` $mesh `[` $axis `]` (`deterministic` $deterministic^)?
    attr-dict `:` type($result)
  }];
  let extraClassDeclaration = extraBaseClassDeclaration;
}

def TGraph_AllGatherOp : TGraph_CollectiveOp<"all_gather"> {
  let summary = "concatenate every rank's shard along `dim` over a mesh axis";
  let description = [{
    `transport` (optional, default `nccl`) selects how the data moves; see
    `#tgraph.transport`.

    ```mlir
    %1 = tgraph.all_gather %0 on @mesh["tp"] dim 1 : tensor<8x8xf32> -> tensor<8x16xf32>
    %2 = tgraph.all_gather %0 on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>}
         : tensor<8x8xf32> -> tensor<16x8xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$axis, I64Attr:$dim,
                       OptionalAttr<TGraph_TransportAttr>:$transport);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input `on` $mesh `[` $axis `]` `dim` $dim attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDeclaration = extraBaseClassDeclaration;
}

def TGraph_ReduceScatterOp : TGraph_CollectiveOp<"reduce_scatter"> {
  let summary = "reduce over a mesh axis and keep this rank's block along `dim`";
  let description = [{
    `transport` (optional, default `nccl`) selects how the data moves; see
    `#tgraph.transport`. With `nvshmem` the sum of a matmul's partial
    products is reduce-scattered by the GEMM kernel itself, which pushes each
    output tile to the rank that owns its rows.

    ```mlir
    %1 = tgraph.reduce_scatter <sum> %0 on @mesh["tp"] dim 0 : tensor<8x16xf32> -> tensor<4x16xf32>
    %2 = tgraph.reduce_scatter <sum> %0 on @mesh["tp"] dim 0 {transport = #tgraph.transport<nvshmem>}
         : tensor<8x16xf32> -> tensor<4x16xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, TGraph_ReductionKindAttr:$kind,
                       FlatSymbolRefAttr:$mesh, StrAttr:$axis, I64Attr:$dim,
                       UnitAttr:$deterministic,
                       OptionalAttr<TGraph_TransportAttr>:$transport);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $kind $input `on` $mesh `[` $axis `]` `dim` $dim (`deterministic` $deterministic^)?
    attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDeclaration = extraBaseClassDeclaration;
}

def TGraph_AllToAllOp : TGraph_CollectiveOp<"all_to_all"> {
  let summary = "move a mesh axis from one split dimension to another";
  let description = [{
    Every rank cuts its block into axis-size pieces along `split_dim`, sends
    piece `j` to rank `j` of the axis and concatenates what it receives along
    `concat_dim` in rank order: a value split over the axis on `concat_dim`
    becomes one split over it on `split_dim`, with no full gather.

    `transport` (optional, default `nccl`): with `nvshmem` (GPU target) the
    exchange is a kernel that puts each piece straight into the peer's
    symmetric receive buffer and signals it (an MoE layer's dispatch and
    combine); the pieces must be contiguous (every dimension before
    `split_dim` in the input, and before `concat_dim` in the result, of
    size 1).

    `counts` (optional, a ragged exchange): `(send, receive)`, two i32
    tensors of one entry per rank of the axis. Of piece `j` only its first
    `send[j]` rows move (a row: the last dimension's elements, the piece in
    row-major order), and `receive[i]` is how many rank `i` sends this
    rank; the rest of each received piece is undefined. The pieces must be
    contiguous as for `nvshmem`, and neither dimension the last. An MoE
    layer's dispatch and combine: blocks padded to their worst case, of
    which the routed rows are a prefix. A transport may move whole pieces.

    `channels` (optional, 1 to 64, with `nvshmem`): each piece moves as that
    many concurrent copies of consecutive row ranges, each signalled on its
    own (the exchange kernel's instances per peer: DeepEP's queue pairs per
    rank, `multi_qp` in the MoE transport). It never changes results.

    ```mlir
    %1 = tgraph.all_to_all %0 on @mesh["dp"] split_dim 1 concat_dim 0
         : tensor<4x16xf32> -> tensor<8x8xf32>
    %2 = tgraph.all_to_all %r on @mesh["ep"] split_dim 0 concat_dim 1
         {transport = #tgraph.transport<nvshmem>} : tensor<2x64x32xf32> -> tensor<1x128x32xf32>
    %3 = tgraph.all_to_all %r counts(%sent, %got : tensor<2xi32>, tensor<2xi32>)
         on @mesh["ep"] split_dim 0 concat_dim 1 : tensor<2x64x32xf32> -> tensor<1x128x32xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, Variadic<AnyRankedTensor>:$counts,
                       FlatSymbolRefAttr:$mesh,
                       StrAttr:$axis, I64Attr:$split_dim, I64Attr:$concat_dim,
                       OptionalAttr<TGraph_TransportAttr>:$transport,
                       OptionalAttr<I64Attr>:$channels);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input (`counts` `(` $counts^ `:` type($counts) `)`)? `on` $mesh `[` $axis `]`
    `split_dim` $split_dim `concat_dim` $concat_dim
    attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDeclaration = extraBaseClassDeclaration;
}

def TGraph_RingShiftOp : TGraph_CollectiveOp<"ring_shift", [SameOperandsAndResultType]> {
  let summary = "pass each rank's block to the rank `offset` after it around a mesh axis";
  let description = [{
    Rank `r` of the axis sends its `input` to rank `(r + offset) mod n` and
    receives the result from rank `(r - offset) mod n` (point-to-point, every
    rank at once: XLA's collective-permute for a ring). Ring attention passes
    key/value blocks around the context-parallel axis with it
    (`tessera-ring-attention`), each shift overlapping the block's attention.
    `offset` is 1 to n - 1.

    ```mlir
    %1 = tgraph.ring_shift %0 on @mesh["cp"] offset 1 : tensor<2x64x4x16xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, FlatSymbolRefAttr:$mesh, StrAttr:$axis,
                       I64Attr:$offset);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input `on` $mesh `[` $axis `]` `offset` $offset attr-dict `:` type($result)
  }];
  let extraClassDeclaration = extraBaseClassDeclaration;
}

def TGraph_AxisSliceOp : TGraph_CollectiveOp<"axis_slice", [Pure]> {
  let summary = "keep this rank's block along `dim` of a value replicated over an axis";
  let description = [{
    The per-rank op that turns a value replicated over a mesh axis into one
    split over it: no communication, each rank copies out block `i` (its
    coordinate on the axis) of dimension `dim`. Inserted by `tessera-partition`.

    ```mlir
    %1 = tgraph.axis_slice %0 on @mesh["tp"] dim 1 : tensor<8x16xf32> -> tensor<8x8xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, FlatSymbolRefAttr:$mesh,
                       StrAttr:$axis, I64Attr:$dim);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input `on` $mesh `[` $axis `]` `dim` $dim attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDeclaration = extraBaseClassDeclaration;
}

def TGraph_TransferOp : TGraph_CollectiveOp<"transfer", [SameOperandsAndResultType]> {
  let summary = "move a value from one rank of a mesh axis to another (pipeline stages)";
  let description = [{
    A pipeline's per-rank programs live in one function: every op carries the
    `tsched.action` it belongs to, which names the rank (along `axis`) that
    runs it. `tgraph.transfer` is how a value made on rank `from` reaches
    rank `to`: `input` is read on `from`, the result exists on `to`.
    Without `to`, the result exists on every rank of the axis (a broadcast
    from `from`, used to hand a stage's gradients and the loss to every
    rank). Inserted by `tessera-pipeline-schedule`; `tessera-lower-to-schedule`
    makes it a `tsched.send` / `tsched.recv` pair (or a broadcast).

    ```mlir
    %1 = tgraph.transfer %0 on @mesh["pp"] from 0 to 1 : tensor<4x8xf32>
    %2 = tgraph.transfer %0 on @mesh["pp"] from 3 : tensor<8x8xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, FlatSymbolRefAttr:$mesh, StrAttr:$axis,
                       I64Attr:$from, OptionalAttr<I64Attr>:$to);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input `on` $mesh `[` $axis `]` `from` $from (`to` $to^)? attr-dict `:` type($result)
  }];
  let extraClassDeclaration = extraBaseClassDeclaration;
}

def TGraph_SendOp : TGraph_CollectiveOp<"send"> {
  let summary = "send this rank's value to another rank of a mesh axis (per-rank code)";
  let description = [{
    Only in a per-rank (local-view, `tgraph.local`) body, where each rank
    traced its own program: this rank sends `input` to the rank whose
    coordinate along `axis` is `to` (the others the same as this rank's).
    It pairs, in program order, with a `tgraph.recv` from this rank in the
    receiver's program; the frontend checks the pairing, the types and that
    no rank waits forever, across every rank's program, before anything
    runs. `tessera-lower-to-schedule` makes it a `tsched.send`.

    ```mlir
    tgraph.send %0 on @mesh["dp"] to 1 : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, FlatSymbolRefAttr:$mesh, StrAttr:$axis,
                       I64Attr:$to);
  let assemblyFormat = "$input `on` $mesh `[` $axis `]` `to` $to attr-dict `:` type($input)";
  let extraClassDeclaration = extraBaseClassDeclaration;
}

def TGraph_RecvOp : TGraph_CollectiveOp<"recv"> {
  let summary = "receive a value from another rank of a mesh axis (per-rank code)";
  let description = [{
    The other half of `tgraph.send`: the value the rank with coordinate
    `from` along `axis` sends this rank (its k-th send here is this rank's
    k-th recv from it). `tessera-lower-to-schedule` makes it a `tsched.recv`,
    waited for where the value is first read.

    ```mlir
    %1 = tgraph.recv on @mesh["dp"] from 0 : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$mesh, StrAttr:$axis, I64Attr:$from);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "`on` $mesh `[` $axis `]` `from` $from attr-dict `:` type($result)";
  let extraClassDeclaration = extraBaseClassDeclaration;
}

def TGraph_ShardOp : TGraph_Op<"shard", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "annotate (and if needed, reshard) a value to a sharding";
  let description = [{
    The result has the given sharding. Propagation treats it as fixed; the
    partitioner inserts whatever collectives move the operand's layout to it.

    ```mlir
    %1 = tgraph.shard %0 : tensor<8x16xf32> to #tgraph.sharding<@mesh, [[], ["tp"]]>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, TGraph_ShardingAttr:$sharding);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input `:` type($result) `to` qualified($sharding) attr-dict";
}

def TGraph_SpmdOp : TGraph_Op<"spmd", [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "run a per-rank (local-view) function on the blocks of global values";
  let description = [{
    The local view inside the global one (JAX's `shard_map`): each input is
    resharded to its `in_shardings` entry and every rank calls `body` on its
    block; `body` (a `func.func` marked `tgraph.local`) computes on per-rank
    shapes and may use the collectives itself. Its results are the blocks of
    global values laid out as `out_shardings` says (a partial entry: the
    blocks are summands). `tessera-partition` inlines the body.

    ```mlir
    %y = tgraph.spmd @step_local(%x) in [#tgraph.sharding<@mesh, [["dp"], []]>]
         out [#tgraph.sharding<@mesh, [[], []]>] : (tensor<8x4xf32>) -> tensor<4x4xf32>
    func.func private @step_local(%x: tensor<4x4xf32>) -> tensor<4x4xf32>
        attributes {tgraph.local} {
      %s = tgraph.all_reduce <sum> %x on @mesh["dp"] : tensor<4x4xf32>
      return %s : tensor<4x4xf32>
    }
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$body, Variadic<AnyRankedTensor>:$inputs,
                       ArrayAttr:$in_shardings, ArrayAttr:$out_shardings);
  let results = (outs Variadic<AnyRankedTensor>:$results);
  let assemblyFormat = [{
    $body `(` $inputs `)` `in` $in_shardings `out` $out_shardings attr-dict `:`
    functional-type($inputs, $results)
  }];
}

#endif // TESSERA_TGRAPH_TD
