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
  }];
}

def TGraph_MatmulOp : TGraph_Op<"matmul", [Pure]> {
  let summary = "matrix product";
  let description = [{
    `lhs[..., M, K] x rhs[..., K, N] -> result[..., M, N]`; leading batch
    dimensions must match.

    ```mlir
    %0 = tgraph.matmul %a, %b : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

def TGraph_AddOp : TGraph_Op<"add", [Pure, SameOperandsAndResultType]> {
  let summary = "elementwise addition";
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def TGraph_ReluOp : TGraph_Op<"relu", [Pure, SameOperandsAndResultType]> {
  let summary = "elementwise max(x, 0)";
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
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
    ```mlir
    %1 = tgraph.all_gather %0 on @mesh["tp"] dim 1 : tensor<8x8xf32> -> tensor<8x16xf32>
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

def TGraph_ReduceScatterOp : TGraph_CollectiveOp<"reduce_scatter"> {
  let summary = "reduce over a mesh axis and keep this rank's block along `dim`";
  let description = [{
    ```mlir
    %1 = tgraph.reduce_scatter <sum> %0 on @mesh["tp"] dim 0 : tensor<8x16xf32> -> tensor<4x16xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, TGraph_ReductionKindAttr:$kind,
                       FlatSymbolRefAttr:$mesh, StrAttr:$axis, I64Attr:$dim,
                       UnitAttr:$deterministic);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $kind $input `on` $mesh `[` $axis `]` `dim` $dim (`deterministic` $deterministic^)?
    attr-dict `:` type($input) `->` type($result)
  }];
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

#endif // TESSERA_TGRAPH_TD
