//===- TSched.td - Tessera Schedule IR ---------------------*- tablegen -*-===//
//
// Schedule IR: the per-rank program. Buffers are builtin memrefs; kernels are
// launched on streams; collectives are asynchronous (start -> token -> wait)
// so that communication overlaps independent compute; events order streams.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_TSCHED_TD
#define TESSERA_TSCHED_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def TSched_Dialect : Dialect {
  let name = "tsched";
  let summary = "Tessera Schedule IR: streams, launches, async collectives, buffers";
  let description = [{
    Schedule IR is the per-rank program the runtime executes. A function body
    allocates buffers (`memref`s), launches kernels on streams, starts
    collectives on a communication stream and waits for them where their
    result is first needed.

    ```mlir
    %compute = tsched.stream "compute"
    %comm = tsched.stream "comm"
    %h = tsched.alloc : memref<8x8xf32>
    tsched.launch @mlp_k0 on %compute ins(%x, %w1 : memref<8x16xf32>, memref<16x8xf32>) outs(%h : memref<8x8xf32>)
    %e = tsched.event_record %compute
    tsched.event_wait %e on %comm
    %t = tsched.collective_start <all_reduce> %y -> %y on %comm over @mesh["tp"] {reduction = #tgraph.reduction<sum>} : memref<8x16xf32> -> memref<8x16xf32>
    tsched.collective_wait %t on %compute
    ```
  }];
  let cppNamespace = "::tessera::tsched";
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  let dependentDialects = ["::tessera::tgraph::TGraphDialect"];
}

def TSched_StreamType : TypeDef<TSched_Dialect, "Stream"> {
  let mnemonic = "stream";
  let summary = "an ordered queue of work (a CUDA stream on GPU)";
}
def TSched_EventType : TypeDef<TSched_Dialect, "Event"> {
  let mnemonic = "event";
  let summary = "a point in a stream other streams can wait for";
}
def TSched_TokenType : TypeDef<TSched_Dialect, "Token"> {
  let mnemonic = "token";
  let summary = "an in-flight asynchronous collective";
}

def TSched_CollectiveKind : I32EnumAttr<"CollectiveKind", "collective operation", [
    I32EnumAttrCase<"all_reduce", 0>, I32EnumAttrCase<"all_gather", 1>,
    I32EnumAttrCase<"reduce_scatter", 2>, I32EnumAttrCase<"all_to_all", 3>,
    I32EnumAttrCase<"broadcast", 4>, I32EnumAttrCase<"shift", 5>]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::tessera::tsched";
}
def TSched_CollectiveKindAttr
    : EnumAttr<TSched_Dialect, TSched_CollectiveKind, "collective"> {
  let assemblyFormat = "`<` $value `>`";
}

// The reduction kind is Graph IR's `#tgraph.reduction<...>`.
def TSched_ReductionAttr : Attr<
    CPred<"::llvm::isa<::tessera::tgraph::ReductionKindAttr>($_self)">,
    "#tgraph.reduction attribute"> {
  let storageType = "::tessera::tgraph::ReductionKindAttr";
  let returnType = "::tessera::tgraph::ReductionKind";
  let convertFromStorage = "$_self.getValue()";
}

class TSched_Op<string mnemonic, list<Trait> traits = []>
    : Op<TSched_Dialect, mnemonic, traits>;

def TSched_StreamOp : TSched_Op<"stream"> {
  let summary = "create a named stream";
  let arguments = (ins StrAttr:$name);
  let results = (outs TSched_StreamType:$stream);
  let assemblyFormat = "$name attr-dict";
}

def TSched_AllocOp : TSched_Op<"alloc", [MemoryEffects<[MemAlloc]>]> {
  let summary = "allocate a buffer";
  let description = [{
    `symmetric`: the buffer lives on the NVSHMEM symmetric heap, at the same
    offset on every rank, so kernels can put into peers' copies. Every rank
    allocates it (collectively) the first time the schedule runs and keeps
    it for later runs; its `tsched.free` releases nothing.

    ```mlir
    %0 = tsched.alloc : memref<64x128xf32>
    %1 = tsched.alloc {symmetric} : memref<256x128xbf16>
    ```
  }];
  let arguments = (ins UnitAttr:$symmetric);
  let results = (outs AnyStaticShapeMemRef:$buffer);
  let assemblyFormat = "attr-dict `:` type($buffer)";
}

def TSched_FreeOp : TSched_Op<"free", [MemoryEffects<[MemFree]>]> {
  let summary = "release a buffer";
  let arguments = (ins AnyStaticShapeMemRef:$buffer);
  let assemblyFormat = "$buffer attr-dict `:` type($buffer)";
}

def TSched_LaunchOp : TSched_Op<"launch",
    [AttrSizedOperandSegments, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "launch a kernel on a stream";
  let description = [{
    `ins` are read, `outs` are written. The kernel is either a function on
    tensors (inputs = `ins`, results = `outs`; before Tile IR lowering) or a
    `ttile.kernel` whose arguments are `ins` followed by `outs`. A launch
    without `outs` writes no buffer (a value check, `tgraph.check_range`).
  }];
  let arguments = (ins FlatSymbolRefAttr:$kernel, TSched_StreamType:$stream,
                       Variadic<AnyStaticShapeMemRef>:$ins,
                       Variadic<AnyStaticShapeMemRef>:$outs);
  let assemblyFormat = [{
    $kernel `on` $stream (`ins` `(` $ins^ `:` type($ins) `)`)?
    (`outs` `(` $outs^ `:` type($outs) `)`)? attr-dict
  }];
}

def TSched_CollectiveStartOp : TSched_Op<"collective_start",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "start an asynchronous collective on a stream";
  let description = [{
    Reads `src` and writes `dst` (they may be the same buffer for all_reduce).
    `dst` must not be read until the returned token is waited on.
    Attributes: `reduction` (`#tgraph.reduction<...>`, for all_reduce and
    reduce_scatter), `dim` (for all_gather and reduce_scatter; the split
    dimension of all_to_all), `concat_dim` (all_to_all), `root` (broadcast:
    the rank along `axis` whose `src` every rank receives in `dst`; only it
    reads `src`, which may be defined on it alone), `offset` (shift: rank
    `r` sends `src` to rank `r + offset` and receives `dst` from rank
    `r - offset`, mod the axis size; `tgraph.ring_shift`) and
    `deterministic` (fixed reduction order). `counts` (all_to_all only, optional): the
    `(send, receive)` row counts of a ragged exchange (`tgraph.all_to_all`);
    the collective reads them when it starts.
  }];
  let arguments = (ins TSched_CollectiveKindAttr:$kind,
                       AnyStaticShapeMemRef:$src, AnyStaticShapeMemRef:$dst,
                       Variadic<AnyStaticShapeMemRef>:$counts,
                       TSched_StreamType:$stream, FlatSymbolRefAttr:$mesh,
                       StrAttr:$axis, OptionalAttr<TSched_ReductionAttr>:$reduction,
                       OptionalAttr<I64Attr>:$dim, OptionalAttr<I64Attr>:$concat_dim,
                       OptionalAttr<I64Attr>:$root, OptionalAttr<I64Attr>:$offset,
                       UnitAttr:$deterministic);
  let results = (outs TSched_TokenType:$token);
  let assemblyFormat = [{
    $kind $src `->` $dst (`counts` `(` $counts^ `:` type($counts) `)`)?
    `on` $stream `over` $mesh `[` $axis `]` attr-dict `:` type($src) `->` type($dst)
  }];
}

class TSched_PointToPointOp<string mnemonic, string direction, string what>
    : TSched_Op<mnemonic, [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "start " # what # " over a mesh axis (a pipeline transfer)";
  let description = [{
    Point-to-point transfers between pipeline stages. Both start on a stream
    and return a token that `tsched.collective_wait` completes: a send's
    buffer must stay alive and unwritten until then; a recv's buffer must not
    be read before. Sends and recvs between two ranks pair up in program
    order (the k-th send from A to B is the k-th recv on B from A), which
    `tessera-verify-schedule` checks for every rank before anything runs.
    The op runs only on the rank named by its `tsched.action`.

    ```mlir
    %t0 = tsched.send %a to 1 on %comm over @mesh["pp"] : memref<4x8xf32>
    %t1 = tsched.recv %b from 0 on %comm over @mesh["pp"] : memref<4x8xf32>
    ```
  }];
  let arguments = (ins AnyStaticShapeMemRef:$buffer, I64Attr:$peer,
                       TSched_StreamType:$stream, FlatSymbolRefAttr:$mesh, StrAttr:$axis);
  let results = (outs TSched_TokenType:$token);
  let assemblyFormat = "$buffer `" # direction # "` $peer `on` $stream `over` $mesh `[` $axis `]` attr-dict `:` type($buffer)";
}

def TSched_SendOp : TSched_PointToPointOp<"send", "to", "sending a buffer to a peer">;
def TSched_RecvOp : TSched_PointToPointOp<"recv", "from", "receiving a buffer from a peer">;

def TSched_CollectiveWaitOp : TSched_Op<"collective_wait"> {
  let summary = "make a stream wait until a collective has completed";
  let arguments = (ins TSched_TokenType:$token, TSched_StreamType:$stream);
  let assemblyFormat = "$token `on` $stream attr-dict";
}

def TSched_EventRecordOp : TSched_Op<"event_record"> {
  let summary = "record an event at the current point of a stream";
  let arguments = (ins TSched_StreamType:$stream);
  let results = (outs TSched_EventType:$event);
  let assemblyFormat = "$stream attr-dict";
}

def TSched_EventWaitOp : TSched_Op<"event_wait"> {
  let summary = "make a stream wait for an event";
  let arguments = (ins TSched_EventType:$event, TSched_StreamType:$stream);
  let assemblyFormat = "$event `on` $stream attr-dict";
}

#endif // TESSERA_TSCHED_TD
