//===- TTile.td - Tessera Tile IR --------------------------*- tablegen -*-===//
//
// Tile IR: kernels written over tiles. A kernel runs once per point of its
// grid (`ttile.program_id`); each instance loads tiles from global buffers,
// computes on them (mma/dot, elementwise, reductions) and stores tiles back.
// The emitters turn a kernel into C++ (CPU: the grid becomes loops) or CUDA
// C++ (GPU: the grid becomes blocks, `block` threads cooperate on each tile).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_TTILE_TD
#define TESSERA_TTILE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/FunctionInterfaces.td"
include "mlir/Interfaces/CallInterfaces.td"

def TTile_Dialect : Dialect {
  let name = "ttile";
  let summary = "Tessera Tile IR: tiled kernels";
  let description = [{
    Tile IR holds the kernels of a program. Tile values have the type
    `!ttile.tile<16x32xf32>`; loops over the reduction dimension use upstream
    `scf.for` with tiles as loop-carried values.

    ```mlir
    ttile.kernel @relu(%x: memref<8x16xf32>, %y: memref<8x16xf32>) attributes {grid = array<i64: 2>, block = array<i64: 128>} {
      %pid = ttile.program_id 0
      %c4 = arith.constant 4 : index
      %c0 = arith.constant 0 : index
      %row = arith.muli %pid, %c4 : index
      %t = ttile.load %x[%row, %c0] : memref<8x16xf32> -> !ttile.tile<4x16xf32>
      %r = ttile.relu %t : !ttile.tile<4x16xf32>
      ttile.store %r, %y[%row, %c0] : !ttile.tile<4x16xf32>, memref<8x16xf32>
      ttile.return
    }
    ```
  }];
  let cppNamespace = "::tessera::ttile";
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  // The GPU and CPU schedules' discardable attributes (`ttile.place`,
  // `ttile.fused`, ...; see below).
  let hasOperationAttrVerify = 1;
  let dependentDialects = ["::tessera::tgraph::TGraphDialect"];
}

def TTile_TileType : TypeDef<TTile_Dialect, "Tile"> {
  let mnemonic = "tile";
  let summary = "a statically shaped tile of elements held by one kernel instance";
  let parameters = (ins ArrayRefParameter<"int64_t">:$shape, "::mlir::Type":$elementType);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

//===----------------------------------------------------------------------===//
// The GPU schedule
//
// How a kernel runs on a streaming multiprocessor, decided by three passes
// and read by the CUDA printer (tessera-translate --ttile-to-cuda), which
// decides nothing itself:
//
//   tessera-gpu-software-pipeline
//                            each scf.for: a GEMM main loop or a loop with its
//                            tiles in registers on tensor cores (#ttile.pipeline:
//                            instruction, ring filled by cp.async or TMA,
//                            stages, wgmma groups in flight, producer warpgroup,
//                            ping-pong, issuing ahead) or neither
//                            (`ttile.fallback`: why); the placement of the
//                            values of register loops
//   tessera-gpu-place        every other tile value: registers inside one
//                            pointwise region (`ttile.region`: one per-thread
//                            loop), a tensor-core fragment, or shared memory;
//                            where fragments are copied to shared memory
//                            (`ttile.spill`)
//   tessera-gpu-alloc-shared byte offsets of shared tiles (`ttile.smem`), rings
//                            (`ttile.ring`) and mbarriers (`ttile.barriers`),
//                            where dead tiles' bytes are reused
//                            (`ttile.release`: a block barrier first), and the
//                            kernel's total (`ttile.smem_bytes`)
//
// They are discardable attributes of the ops they describe (ttile, scf and
// arith ops), checked by the dialect's attribute verifier.
//===----------------------------------------------------------------------===//

//===----------------------------------------------------------------------===//
// The CPU schedule
//
// How a kernel runs as C++ loops, decided by two passes and read by the C++
// printer (tessera-translate --ttile-to-cpp), which decides nothing itself:
//
//   tessera-cpu-in-place  `ttile.in_place` (unit) on a ttile.load: the tile is
//                         the loaded block itself (a pointer, no copy): one
//                         contiguous block of a buffer the kernel never
//                         stores to, not bf16 / FP8, not itself stored. On a
//                         ttile.store: the stored tile is computed in the
//                         block the store writes (the store copies nothing):
//                         defined by an op (not a loop) in the store's
//                         block, one contiguous block of a buffer the kernel
//                         stores only there and never loads.
//                         `ttile.accumulate` (unit) on a ttile.dot: it adds
//                         into its accumulator's array: the accumulator has
//                         the result's type, the dot is its only use, in its
//                         block, and it is not a load read in place.
//   tessera-cpu-fuse      `ttile.fused = N` (i64 >= 0) on consecutive
//                         elementwise ops, fills, iotas, dropout factors,
//                         broadcasts and in-place loads of one block: they
//                         share one element loop
//                         (loop N of the kernel) over tiles of one size.
//
// A missing attribute is the plain form (a copy; a loop per op), so the
// printer is correct on any Tile IR. The verifier rejects an attribute on
// the wrong op or with values the printer cannot honour.
//===----------------------------------------------------------------------===//

def TTile_Placement : I32EnumAttr<"Placement", "where a tile value lives while a GPU kernel runs", [
    // Each thread's elements, inside the one pointwise region computing them.
    I32EnumAttrCase<"registers", 0>,
    // A tile in the block's shared memory (offset: `ttile.smem`).
    I32EnumAttrCase<"shared", 1>,
    // Tensor-core accumulator registers (the m16n8k16 layout over `warps`).
    I32EnumAttrCase<"fragment", 2>,
    // A register loop's [BM, 1] column: each thread's rows.
    I32EnumAttrCase<"column", 3>,
    // A register loop's [1, n] row: each thread's columns.
    I32EnumAttrCase<"row", 4>,
    // A loop's load, streamed through its ring of shared-memory slots.
    I32EnumAttrCase<"staged", 5>,
    // The transpose of a staged tile (read transposed from its slot).
    I32EnumAttrCase<"staged_transposed", 6>,
    // A fill, folded into the code that reads it.
    I32EnumAttrCase<"literal", 7>,
    // A broadcast, read at its result's coordinates.
    I32EnumAttrCase<"broadcast", 8>,
    // Read from global memory where it is used (a register loop's
    // loop-invariant A operand, or a column it reads as a row).
    I32EnumAttrCase<"global", 9>]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::tessera::ttile";
}

def TTile_PlaceAttr : EnumAttr<TTile_Dialect, TTile_Placement, "place"> {
  let summary = "where a tile value lives on the GPU (`ttile.place`)";
  let assemblyFormat = "`<` $value `>`";
}

def TTile_Mma : I32EnumAttr<"Mma", "tensor-core instruction", [
    I32EnumAttrCase<"mma_sync", 0>, I32EnumAttrCase<"wgmma", 1>]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::tessera::ttile";
}

def TTile_MmaAttr : EnumAttr<TTile_Dialect, TTile_Mma, "mma"> {
  let summary = "a tensor-core instruction (`mma.sync` or Hopper's `wgmma`)";
  let assemblyFormat = "`<` $value `>`";
}

def TTile_Copies : I32EnumAttr<"Copies", "how a loop's ring of shared-memory slots is filled", [
    I32EnumAttrCase<"cp_async", 0>, I32EnumAttrCase<"tma", 1>]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::tessera::ttile";
}

def TTile_LoopKind : I32EnumAttr<"LoopKind", "what a pipelined loop is", [
    // acc = dot(load A, load B, acc): a GEMM main loop.
    I32EnumAttrCase<"gemm", 0>,
    // A loop whose carried and computed tiles stay in registers (attention's).
    I32EnumAttrCase<"registers", 1>]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::tessera::ttile";
}

def TTile_PipelineAttr : AttrDef<TTile_Dialect, "Pipeline"> {
  let mnemonic = "pipeline";
  let summary = "the schedule of an scf.for on tensor cores (`ttile.pipeline`)";
  let description = [{
    `kind`: a GEMM main loop or a loop with its tiles in registers. `mma`:
    the tensor-core instruction (a wgmma loop is also printed on mma.sync for
    plain sm_90, in the same registers). Its loads stream through a ring of
    `stages` shared-memory slots filled by `copies` (cp.async, or TMA with an
    mbarrier per slot); `lag` wgmma groups stay in flight while the next is
    issued, so the slot refilled is the one read `lag + 1` iterations ago.
    `producer`: a producer warpgroup only issues the ring's TMA copies (warp
    specialization). `pingpong`: the block's two warpgroups take turns at
    the tensor cores. `issue_ahead`: the first dot of the next iteration is
    issued under this one's softmax.

    ```mlir
    #ttile.pipeline<kind = gemm, mma = wgmma, copies = tma, stages = 4, lag = 1, producer = true>
    ```
  }];
  let parameters = (ins EnumParameter<TTile_LoopKind>:$kind,
                        EnumParameter<TTile_Mma>:$mma,
                        EnumParameter<TTile_Copies>:$copies,
                        "int64_t":$stages,
                        DefaultValuedParameter<"int64_t", "0">:$lag,
                        DefaultValuedParameter<"bool", "false">:$producer,
                        DefaultValuedParameter<"bool", "false">:$pingpong,
                        DefaultValuedParameter<"bool", "false">:$issue_ahead);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def TTile_ReductionAttr : Attr<
    CPred<"::llvm::isa<::tessera::tgraph::ReductionKindAttr>($_self)">,
    "#tgraph.reduction attribute"> {
  let storageType = "::tessera::tgraph::ReductionKindAttr";
  let returnType = "::tessera::tgraph::ReductionKind";
  let convertFromStorage = "$_self.getValue()";
}

class TTile_Op<string mnemonic, list<Trait> traits = []>
    : Op<TTile_Dialect, mnemonic, traits>;

def TTile_KernelOp : TTile_Op<"kernel", [
    FunctionOpInterface, IsolatedFromAbove]> {
  let summary = "a tiled kernel launched over a grid";
  let description = [{
    Arguments are global buffers (`memref`s): the launch's inputs, then its
    outputs. `grid` is the number of kernel instances per dimension; `block`
    is the number of threads cooperating on one instance on the GPU.
    `stages` (optional) is how many iterations of a GEMM main loop are in
    flight at once: the GPU emitter keeps that many `ttile.load` tiles of the
    loop in a shared-memory ring, filled asynchronously ahead of the `ttile.dot`
    that reads them. It is a tuning parameter; it never changes results.
    `producer_warpgroup` (optional) makes the block's last warpgroup (128
    threads, counted in `block`) a producer: on sm_90a it only issues the
    tensor-memory-accelerator copies of the kernel's GEMM main loop (its
    `ttile.load {tma}`s) and gives its registers to the other warpgroups,
    which compute every tile; it leaves the kernel when the loop's copies
    are issued. The `warps` of the loop's `ttile.dot` count only the others.
    `row_segments = array<i64: ARG, ROWS, TILE_ROWS>` (optional) says that
    only rows inside the segments of argument ARG are ever read from the
    kernel's outputs (ROWS rows each, segment sizes as
    `tgraph.grouped_matmul` reads them: `[S]`, or `[B, S]` for B blocks of
    ROWS / B rows, each block's segments from its first row). The 1-D grid
    enumerates ROWS / TILE_ROWS bands of TILE_ROWS rows, band-major, so an
    instance whose band lies past every block's segments may skip its work,
    leaving those rows as they were: an expert-parallel MoE layer's padding.

    ```mlir
    ttile.kernel @gemm(%a: memref<256x64xbf16>, %b: memref<64x256xbf16>, %c: memref<256x256xf32>)
        attributes {grid = array<i64: 4>, block = array<i64: 256>, stages = 3 : i64} { ... }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<FunctionType>:$function_type,
                       DenseI64ArrayAttr:$grid, DenseI64ArrayAttr:$block,
                       OptionalAttr<I64Attr>:$stages,
                       UnitAttr:$producer_warpgroup,
                       OptionalAttr<DenseI64ArrayAttr>:$row_segments,
                       OptionalAttr<DictArrayAttr>:$arg_attrs,
                       OptionalAttr<DictArrayAttr>:$res_attrs);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    // FunctionOpInterface
    ::mlir::Region *getCallableRegion() { return &getBody(); }
    ::llvm::ArrayRef<::mlir::Type> getArgumentTypes() { return getFunctionType().getInputs(); }
    ::llvm::ArrayRef<::mlir::Type> getResultTypes() { return getFunctionType().getResults(); }
    bool isDeclaration() { return isExternal(); }
    ::mlir::LogicalResult verifyRowSegments(::llvm::ArrayRef<int64_t> segments);
  }];
}

def TTile_ReturnOp : TTile_Op<"return", [Pure, HasParent<"KernelOp">, Terminator]> {
  let summary = "end of a kernel";
  let assemblyFormat = "attr-dict";
}

def TTile_ProgramIdOp : TTile_Op<"program_id", [Pure]> {
  let summary = "this instance's coordinate along a grid dimension";
  let arguments = (ins I64Attr:$dim);
  let results = (outs Index:$result);
  let assemblyFormat = "$dim attr-dict";
  let hasVerifier = 1;
}

def TTile_LoadOp : TTile_Op<"load", [MemoryEffects<[MemRead]>]> {
  let summary = "load a tile from a buffer at element offsets";
  let description = [{
    One offset per buffer dimension. A tile of lower rank than the buffer
    covers its trailing dimensions, with size 1 in the leading ones (one
    matrix of a batch: `memref<4x64x32xf32>` at `[%b, %i, %k]` as a
    `!ttile.tile<16x32xf32>`).

    `dims` names the buffer dimensions the tile's dimensions run along
    instead (increasing; size 1 in the others): rows of one head of a
    `memref<2x64x4x32xf32>` laid out `[batch, seq, head, d]` at
    `[%b, %i, %h, %c0] {dims = array<i64: 1, 3>}`. The CPU emitter reads
    such tiles with the buffer's strides; the GPU emitters take trailing
    tiles only.

    `tma` loads the tile with Hopper's tensor memory accelerator
    (`cp.async.bulk.tensor`, sm_90): one thread issues the copy through a
    tensor map the runtime builds on the host for the kernel argument
    `source`, and the tile lands in shared memory 128-byte swizzled, as
    64-column panels (the layout `wgmma` reads). It needs a bf16 or f16
    2-D tile with columns a multiple of 64 and at most 256 rows, loaded
    straight from a kernel argument of rank 5 or less.

    ```mlir
    %ta = ttile.load %a[%row, %k] {tma} : memref<4096x4096xbf16> -> !ttile.tile<128x64xbf16>
    ```
  }];
  let arguments = (ins AnyStaticShapeMemRef:$source, Variadic<Index>:$offsets,
                       UnitAttr:$tma, OptionalAttr<DenseI64ArrayAttr>:$dims);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = [{
    $source `[` $offsets `]` attr-dict `:` qualified(type($source)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def TTile_StoreOp : TTile_Op<"store", [MemoryEffects<[MemWrite]>]> {
  let summary = "store a tile into a buffer at element offsets";
  let description = [{
    The tile lands where `ttile.load` with the same offsets and `dims`
    would read it.
  }];
  let arguments = (ins TTile_TileType:$value, AnyStaticShapeMemRef:$dest,
                       Variadic<Index>:$offsets, OptionalAttr<DenseI64ArrayAttr>:$dims);
  let assemblyFormat = [{
    $value `,` $dest `[` $offsets `]` attr-dict `:` qualified(type($value)) `,` qualified(type($dest))
  }];
  let hasVerifier = 1;
}

def TTile_FillOp : TTile_Op<"fill", [Pure]> {
  let summary = "a tile with every element equal to `value`";
  let arguments = (ins F64Attr:$value);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = "$value attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def TTile_DotOp : TTile_Op<"dot", [Pure, AllTypesMatch<["acc", "result"]>]> {
  let summary = "tile matrix multiply-accumulate: result = acc + lhs x rhs";
  let description = [{
    The accumulator may be wider than the operands (bf16 or f16 operands
    accumulate in f32). `warps = [WM, WN]` (optional) splits the `M x N`
    accumulator over a `WM x WN` grid of warps, each owning an
    `M/WM x N/WN` block held in registers; the kernel's `block` must then be
    `WM * WN * 32` threads. With half-precision operands, f32 accumulation
    and warp blocks that are multiples of 16 x 16 (K a multiple of 16), the
    GPU emitter runs the dot on tensor cores (`mma.sync.m16n8k16`).

    `wgmma` asks for Hopper's warpgroup MMA (`wgmma.mma_async.m64nNk16`,
    sm_90a): each group of four warps computes 64 rows of the accumulator
    over all its columns, so `warps` must be `[WM, 1]` with WM a multiple of
    4 and M = 16 * WM, N a multiple of 8 up to 256 and K a multiple of 16.
    B, and A unless it is a register tile, are read from 128-byte-swizzled
    shared memory, which the CUDA emitter lays out: a GEMM main loop needs N
    and K multiples of 64 (whole swizzle atoms), a loop with its tiles in
    registers every staged tile's columns (elsewhere the dot runs on
    `mma.sync`). The accumulator's register layout is that of `mma.sync`
    with the same `warps`, so code after the dot does not depend on the
    instruction.

    ```mlir
    %c = ttile.dot %a, %b, %acc : !ttile.tile<16x32xf32>, !ttile.tile<32x16xf32> -> !ttile.tile<16x16xf32>
    %d = ttile.dot %x, %y, %it {warps = array<i64: 2, 4>} : !ttile.tile<128x32xbf16>, !ttile.tile<32x128xbf16> -> !ttile.tile<128x128xf32>
    %e = ttile.dot %x, %y, %it {warps = array<i64: 8, 1>, wgmma} : !ttile.tile<128x64xbf16>, !ttile.tile<64x256xbf16> -> !ttile.tile<128x256xf32>
    ```
  }];
  let arguments = (ins TTile_TileType:$lhs, TTile_TileType:$rhs, TTile_TileType:$acc,
                       OptionalAttr<DenseI64ArrayAttr>:$warps, UnitAttr:$wgmma);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $acc attr-dict `:` qualified(type($lhs)) `,` qualified(type($rhs)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

// Elementwise ops (`Elementwise`): each has an entry in the op table
// (tessera_compiler/ir/ops.py), from which both emitters take its expression.
class TTile_BinaryOp<string mnemonic, string what>
    : TTile_Op<mnemonic, [Pure, SameOperandsAndResultType, Elementwise]> {
  let summary = "elementwise " # what # " of two tiles";
  let arguments = (ins TTile_TileType:$lhs, TTile_TileType:$rhs);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` qualified(type($result))";
}
def TTile_AddOp : TTile_BinaryOp<"add", "sum">;
def TTile_MulOp : TTile_BinaryOp<"mul", "product">;
def TTile_MaxOp : TTile_BinaryOp<"max", "maximum">;
def TTile_SubOp : TTile_BinaryOp<"sub", "difference">;
def TTile_DivOp : TTile_BinaryOp<"div", "quotient">;
def TTile_PowOp : TTile_BinaryOp<"pow", "power: lhs ** rhs">;

class TTile_UnaryOp<string mnemonic, string what>
    : TTile_Op<mnemonic, [Pure, SameOperandsAndResultType, Elementwise]> {
  let summary = what # " of each element of a tile";
  let arguments = (ins TTile_TileType:$input);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = "$input attr-dict `:` qualified(type($result))";
}
def TTile_ReluOp : TTile_UnaryOp<"relu", "max(x, 0)">;
def TTile_ExpOp : TTile_UnaryOp<"exp", "exp(x)">;
// 2^x is what the special-function unit computes: exp(x) costs a multiply
// by log2(e) more, which a kernel can fold into a scale it applies anyway
// (flash attention's softmax).
def TTile_Exp2Op : TTile_UnaryOp<"exp2", "2^x">;
def TTile_NegOp : TTile_UnaryOp<"neg", "-x">;
def TTile_LogOp : TTile_UnaryOp<"log", "log(x)">;
def TTile_TanhOp : TTile_UnaryOp<"tanh", "tanh(x)">;
def TTile_GeluOp : TTile_UnaryOp<"gelu", "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))">;
def TTile_SqrtOp : TTile_UnaryOp<"sqrt", "sqrt(x)">;
def TTile_RsqrtOp : TTile_UnaryOp<"rsqrt", "1 / sqrt(x)">;
def TTile_SinOp : TTile_UnaryOp<"sin", "sin(x)">;
def TTile_CosOp : TTile_UnaryOp<"cos", "cos(x)">;
def TTile_ErfOp : TTile_UnaryOp<"erf", "erf(x)">;
def TTile_AbsOp : TTile_UnaryOp<"abs", "|x|">;
def TTile_SignOp : TTile_UnaryOp<"sign", "sign(x): -1, 0 or 1 (NaN stays NaN)">;
def TTile_FloorOp : TTile_UnaryOp<"floor", "floor(x)">;
def TTile_CeilOp : TTile_UnaryOp<"ceil", "ceil(x)">;

def TTile_CompareAttr : Attr<
    CPred<"::llvm::isa<::tessera::tgraph::CompareKindAttr>($_self)">,
    "#tgraph.compare attribute"> {
  let storageType = "::tessera::tgraph::CompareKindAttr";
  let returnType = "::tessera::tgraph::CompareKind";
  let convertFromStorage = "$_self.getValue()";
}

def TTile_CompareOp : TTile_Op<"compare", [Pure, AllTypesMatch<["lhs", "rhs"]>, Elementwise]> {
  let summary = "elementwise comparison giving an i1 tile";
  let arguments = (ins TTile_TileType:$lhs, TTile_TileType:$rhs, TTile_CompareAttr:$kind);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` qualified(type($lhs)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def TTile_SelectOp : TTile_Op<"select", [Pure,
                                         AllTypesMatch<["on_true", "on_false", "result"]>,
                                         Elementwise]> {
  let summary = "elementwise `cond ? on_true : on_false`";
  let arguments = (ins TTile_TileType:$cond, TTile_TileType:$on_true, TTile_TileType:$on_false);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = [{
    $cond `,` $on_true `,` $on_false attr-dict `:` qualified(type($cond)) `,` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def TTile_CastOp : TTile_Op<"cast", [Pure, Elementwise]> {
  let summary = "convert each element to another element type";
  let arguments = (ins TTile_TileType:$input);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = "$input attr-dict `:` qualified(type($input)) `to` qualified(type($result))";
  let hasVerifier = 1;
}

def TTile_BroadcastOp : TTile_Op<"broadcast", [Pure]> {
  let summary = "repeat the size-1 dimensions of a tile";
  let arguments = (ins TTile_TileType:$input);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = "$input attr-dict `:` qualified(type($input)) `to` qualified(type($result))";
  let hasVerifier = 1;
}

def TTile_TransposeOp : TTile_Op<"transpose", [Pure]> {
  let summary = "swap the two dimensions of a 2-D tile";
  let description = [{
    `result[j, i] = input[i, j]`. Attention's backward pass multiplies by
    transposed tiles (`dS^T Q`, `P^T dO`); on tensor cores a transposed
    operand costs nothing (`ldmatrix.trans`), elsewhere it is a copy.

    ```mlir
    %kt = ttile.transpose %k : !ttile.tile<64x32xf32> to !ttile.tile<32x64xf32>
    ```
  }];
  let arguments = (ins TTile_TileType:$input);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = "$input attr-dict `:` qualified(type($input)) `to` qualified(type($result))";
  let hasVerifier = 1;
}

def TTile_IotaOp : TTile_Op<"iota", [Pure]> {
  let summary = "element index along `dim`, plus `offset`";
  let description = [{
    `result[i0, i1, ...] = offset + i_dim`; with `offset` the tile's start along
    `dim` this is the element's index in the whole tensor.

    ```mlir
    %cols = ttile.iota %c0 dim 1 : !ttile.tile<4x8xi32>
    ```
  }];
  let arguments = (ins Index:$offset, I64Attr:$dim);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = "$offset `dim` $dim attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def TTile_DropoutFactorOp : TTile_Op<"dropout_factor", [Pure]> {
  let summary = "dropout's factor of each element of a block: 0 or 1/(1-p)";
  let description = [{
    Element `(r, c)` stands for element `base + r * strides[0] + c *
    strides[1]` (its flat index) of a tensor that `tgraph.dropout` drops
    at rate `p` under key (`seed`, `step`): 0 where that element is
    dropped, `1 / (1 - p)` where it is kept. The words come from the same
    Philox-4x32-10 as the runtime's (`philox_word` in
    cpu/tessera_numerics.h, shared by the C++ and CUDA kernels). Flash
    attention multiplies its probability blocks by it.

    ```mlir
    %z = ttile.dropout_factor %seed, %step at %base {p = 1.000000e-01 : f64, strides = array<i64: 64, 1>} : !ttile.tile<16x16xf32>
    ```
  }];
  let arguments = (ins Index:$seed, Index:$step, Index:$base, F64Attr:$p,
                       DenseI64ArrayAttr:$strides);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = "$seed `,` $step `at` $base attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def TTile_ReduceOp : TTile_Op<"reduce", [Pure]> {
  let summary = "reduce a tile along one dimension (kept with size 1)";
  let description = [{
    ```mlir
    %r = ttile.reduce %t {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<4x16xf32> -> !ttile.tile<4x1xf32>
    ```
  }];
  let arguments = (ins TTile_TileType:$input, TTile_ReductionAttr:$kind, I64Attr:$dim);
  let results = (outs TTile_TileType:$result);
  let assemblyFormat = "$input attr-dict `:` qualified(type($input)) `->` qualified(type($result))";
  let hasVerifier = 1;
}

def TTile_BarrierOp : TTile_Op<"barrier"> {
  let summary = "synchronize the threads of one kernel instance";
  let assemblyFormat = "attr-dict";
}

//----------------------------------------------------------------------------
// NVSHMEM: device-initiated communication between kernel instances on
// different GPUs (processing elements, PEs). Remote buffers are symmetric:
// kernel arguments marked `ttile.symmetric` (allocated with nvshmem_malloc,
// the same size on every PE). Puts are non-blocking; `ttile.fence` orders
// them before later puts and signals to the same PE, `ttile.quiet` waits
// until they are complete. A consumer waits on a signal word the producer
// sets after its data (put, fence, signal). A get pulls instead: it returns
// once the data has landed, so it needs no signal when the peer's buffer is
// known to be ready.
//----------------------------------------------------------------------------

def TTile_LoadScalarOp : TTile_Op<"load_scalar", [MemoryEffects<[MemRead]>]> {
  let summary = "read one integer of a buffer as an index";
  let description = [{
    The element of an integer buffer at `indices`, as an `index`: a count
    the kernel's copies depend on (an MoE exchange's rows per peer).

    ```mlir
    %n = ttile.load_scalar %counts[%pid] : memref<4xi32>
    ```
  }];
  let arguments = (ins AnyStaticShapeMemRef:$buffer, Variadic<Index>:$indices);
  let results = (outs Index:$result);
  let assemblyFormat = "$buffer `[` $indices `]` attr-dict `:` qualified(type($buffer))";
  let hasVerifier = 1;
}

def TTile_MyPeOp : TTile_Op<"my_pe", [Pure]> {
  let summary = "this GPU's processing element number (nvshmem_my_pe)";
  let results = (outs Index:$result);
  let assemblyFormat = "attr-dict";
}

def TTile_NumPesOp : TTile_Op<"n_pes", [Pure]> {
  let summary = "the number of processing elements (nvshmem_n_pes)";
  let results = (outs Index:$result);
  let assemblyFormat = "attr-dict";
}

def TTile_PutOp : TTile_Op<"put", [AttrSizedOperandSegments,
                                    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "copy a box of a local buffer into a symmetric buffer on another PE";
  let description = [{
    Copies the box of `shape` at `source_offsets` of `source` to `dest_offsets`
    of the symmetric buffer `dest` on PE `pe`, without waiting for it to
    arrive (`nvshmemx_putmem_nbi_block`, one call per contiguous run of the
    box: a row, or whole rows when the box spans the inner dimensions of
    both buffers; every thread of the block takes part). With `rows`, only
    the box's first `rows` rows move: the box read as rows of its last
    dimension in row-major order (a ragged exchange's routed rows; more
    than the box holds moves the whole box).

    ```mlir
    ttile.put %a[%c0, %c0] to %gathered[%row, %c0] on %peer {shape = array<i64: 64, 128>} : memref<64x128xbf16> -> memref<256x128xbf16>
    ttile.put %a[%c0, %c0] to %gathered[%row, %c0] on %peer rows %n {shape = array<i64: 64, 128>} : memref<64x128xbf16> -> memref<256x128xbf16>
    ```
  }];
  let arguments = (ins AnyStaticShapeMemRef:$source, Variadic<Index>:$source_offsets,
                       AnyStaticShapeMemRef:$dest, Variadic<Index>:$dest_offsets,
                       Index:$pe, Optional<Index>:$rows, DenseI64ArrayAttr:$shape);
  let assemblyFormat = [{
    $source `[` $source_offsets `]` `to` $dest `[` $dest_offsets `]` `on` $pe
    (`rows` $rows^)? attr-dict `:` qualified(type($source)) `->` qualified(type($dest))
  }];
  let hasVerifier = 1;
}

def TTile_GetOp : TTile_Op<"get", [AttrSizedOperandSegments,
                                    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "copy a box of a symmetric buffer on another PE into a local buffer";
  let description = [{
    Copies the box of `shape` at `source_offsets` of the symmetric buffer
    `source` on PE `pe` to `dest_offsets` of `dest`. Every thread of the
    block takes part (`nvshmemx_getmem_nbi_block`, one call per contiguous
    run, as for `ttile.put`); the op then completes the block's outstanding operations
    (`nvshmem_quiet`, which also completes earlier puts) and synchronizes the
    block, so every thread may read `dest` after it. `rows` as for
    `ttile.put`.

    ```mlir
    ttile.get %gathered[%row, %c0] on %peer to %a[%c0, %c0] {shape = array<i64: 64, 128>} : memref<256x128xbf16> -> memref<64x128xbf16>
    ```
  }];
  let arguments = (ins AnyStaticShapeMemRef:$source, Variadic<Index>:$source_offsets,
                       AnyStaticShapeMemRef:$dest, Variadic<Index>:$dest_offsets,
                       Index:$pe, Optional<Index>:$rows, DenseI64ArrayAttr:$shape);
  let assemblyFormat = [{
    $source `[` $source_offsets `]` `on` $pe `to` $dest `[` $dest_offsets `]`
    (`rows` $rows^)? attr-dict `:` qualified(type($source)) `->` qualified(type($dest))
  }];
  let hasVerifier = 1;
}

def TTile_SignalOp : TTile_Op<"signal", [MemoryEffects<[MemWrite]>]> {
  let summary = "set or add to a signal word of a symmetric buffer on another PE";
  let description = [{
    `kind` is `"set"` or `"add"` (`nvshmemx_signal_op`, issued by one thread
    after the block's earlier operations).

    ```mlir
    ttile.signal %flags[%me], %one on %peer {kind = "set"} : memref<4xi64>
    ```
  }];
  let arguments = (ins AnyStaticShapeMemRef:$signals, Index:$index, Index:$value, Index:$pe,
                       StrAttr:$kind);
  let assemblyFormat = [{
    $signals `[` $index `]` `,` $value `on` $pe attr-dict `:` qualified(type($signals))
  }];
  let hasVerifier = 1;
}

def TTile_WaitOp : TTile_Op<"wait", [MemoryEffects<[MemRead, MemWrite]>]> {
  // MemWrite as well: the wait orders the reads after it (an acquire), so
  // it must never be removed as dead.
  let summary = "wait until a local signal word compares true against a value";
  let description = [{
    `cmp` is one of `eq`, `ne`, `gt`, `ge`, `lt`, `le`
    (`nvshmem_signal_wait_until`; the block continues when it holds).

    ```mlir
    ttile.wait %flags[%peer], %one {cmp = "ge"} : memref<4xi64>
    ```
  }];
  let arguments = (ins AnyStaticShapeMemRef:$signals, Index:$index, Index:$value, StrAttr:$cmp);
  let assemblyFormat = [{
    $signals `[` $index `]` `,` $value attr-dict `:` qualified(type($signals))
  }];
  let hasVerifier = 1;
}

def TTile_FenceOp : TTile_Op<"fence"> {
  let summary = "order earlier puts before later puts and signals to each PE (nvshmem_fence)";
  let assemblyFormat = "attr-dict";
}

def TTile_QuietOp : TTile_Op<"quiet"> {
  let summary = "wait until every earlier put of this block is complete (nvshmem_quiet)";
  let assemblyFormat = "attr-dict";
}

#endif // TESSERA_TTILE_TD
