//===- TTile.cpp - Tessera Tile IR dialect --------------------------------===//

#include "tessera/TTile/TTile.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/FunctionImplementation.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace tessera::ttile;

#include "tessera/TTile/TTileDialect.cpp.inc"
#include "tessera/TTile/TTileEnums.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "tessera/TTile/TTileAttrs.cpp.inc"
#define GET_TYPEDEF_CLASSES
#include "tessera/TTile/TTileTypes.cpp.inc"
#define GET_OP_CLASSES
#include "tessera/TTile/TTileOps.cpp.inc"

void TTileDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "tessera/TTile/TTileTypes.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "tessera/TTile/TTileAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "tessera/TTile/TTileOps.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// TileType: !ttile.tile<16x32xf32>
//===----------------------------------------------------------------------===//

Type TileType::parse(AsmParser &parser) {
  SmallVector<int64_t> shape;
  Type element;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseLess() ||
      parser.parseDimensionList(shape, /*allowDynamic=*/false, /*withTrailingX=*/true) ||
      parser.parseType(element) || parser.parseGreater())
    return {};
  return TileType::getChecked([&] { return parser.emitError(loc); },
                              parser.getContext(), shape, element);
}

void TileType::print(AsmPrinter &printer) const {
  printer << "<";
  for (int64_t d : getShape())
    printer << d << "x";
  printer << getElementType() << ">";
}

LogicalResult TileType::verify(function_ref<InFlightDiagnostic()> emitError,
                               ArrayRef<int64_t> shape, Type elementType) {
  if (shape.empty())
    return emitError() << "a tile needs at least one dimension";
  for (int64_t d : shape)
    if (d < 1)
      return emitError() << "tile dimensions must be >= 1, got " << d;
  if (!elementType.isIntOrFloat())
    return emitError() << "tile elements must be integers or floats, got " << elementType;
  return success();
}

//===----------------------------------------------------------------------===//
// KernelOp
//===----------------------------------------------------------------------===//

ParseResult KernelOp::parse(OpAsmParser &parser, OperationState &result) {
  auto buildType = [](Builder &builder, ArrayRef<Type> args, ArrayRef<Type> results,
                      function_interface_impl::VariadicFlag, std::string &) {
    return builder.getFunctionType(args, results);
  };
  return function_interface_impl::parseFunctionOp(
      parser, result, /*allowVariadic=*/false, getFunctionTypeAttrName(result.name),
      buildType, getArgAttrsAttrName(result.name), getResAttrsAttrName(result.name));
}

void KernelOp::print(OpAsmPrinter &p) {
  function_interface_impl::printFunctionOp(p, *this, /*isVariadic=*/false,
                                           getFunctionTypeAttrName(),
                                           getArgAttrsAttrName(), getResAttrsAttrName());
}

LogicalResult KernelOp::verify() {
  if (!getFunctionType().getResults().empty())
    return emitOpError("kernel @") << getSymName()
                                   << " must not return values; write results to its buffer arguments";
  for (auto [i, type] : llvm::enumerate(getFunctionType().getInputs())) {
    auto memref = llvm::dyn_cast<MemRefType>(type);
    if (!memref || !memref.hasStaticShape())
      return emitOpError("argument #") << i << " of kernel @" << getSymName()
                                       << " must be a statically shaped memref, got " << type;
  }
  if (getGrid().empty() || getGrid().size() > 3)
    return emitOpError("'grid' must have 1 to 3 dimensions");
  for (int64_t g : getGrid())
    if (g < 1)
      return emitOpError("'grid' sizes must be >= 1, got ") << g;
  int64_t threads = 1;
  for (int64_t b : getBlock()) {
    if (b < 1)
      return emitOpError("'block' sizes must be >= 1, got ") << b;
    threads *= b;
  }
  if (getBlock().empty() || getBlock().size() > 3 || threads > 1024)
    return emitOpError("'block' must have 1 to 3 dimensions and at most 1024 threads");
  if (getBody().empty())
    return emitOpError("kernel @") << getSymName() << " must have a body";
  if (getStages() && (*getStages() < 1 || *getStages() > 8))
    return emitOpError("'stages' must be 1 to 8, got ") << *getStages();
  if (getProducerWarpgroup() && (getBlock().size() != 1 || threads % 128 || threads < 256))
    return emitOpError("'producer_warpgroup' needs a 1-D block of whole warpgroups, one of them "
                       "computing besides the producer (256 threads or more), got ")
           << threads << " threads";
  if (auto segments = getRowSegments())
    return verifyRowSegments(*segments);
  return success();
}

LogicalResult KernelOp::verifyRowSegments(ArrayRef<int64_t> segments) {
  if (segments.size() != 3)
    return emitOpError("'row_segments' must be [argument, rows, tile rows], got ")
           << segments.size() << " values";
  int64_t arg = segments[0], rows = segments[1], tileRows = segments[2];
  ArrayRef<Type> inputs = getFunctionType().getInputs();
  if (arg < 0 || arg >= static_cast<int64_t>(inputs.size()))
    return emitOpError("'row_segments' names argument #")
           << arg << " but the kernel has " << inputs.size();
  auto sizes = llvm::cast<MemRefType>(inputs[arg]);
  if (!sizes.getElementType().isInteger(32) || sizes.getRank() < 1 || sizes.getRank() > 2)
    return emitOpError("'row_segments' argument #")
           << arg << " must hold segment sizes ([S] or [B, S] i32), got " << sizes;
  if (rows < 1 || tileRows < 1 || rows % tileRows)
    return emitOpError("'row_segments' tile rows (")
           << tileRows << ") must divide its rows (" << rows << ")";
  if (sizes.getRank() == 2 && rows % sizes.getDimSize(0))
    return emitOpError("'row_segments' rows (")
           << rows << ") do not split into the " << sizes.getDimSize(0) << " blocks of argument #"
           << arg;
  if (getGrid().size() != 1 || getGrid()[0] % (rows / tileRows))
    return emitOpError("'row_segments' needs a 1-D grid of whole row bands (")
           << rows / tileRows << " bands)";
  return success();
}

//===----------------------------------------------------------------------===//
// Ops
//===----------------------------------------------------------------------===//

LogicalResult ProgramIdOp::verify() {
  // May sit in loops inside the kernel, so look through enclosing ops.
  auto kernel = (*this)->getParentOfType<KernelOp>();
  if (!kernel)
    return emitOpError("must be inside a ttile.kernel");
  int64_t rank = static_cast<int64_t>(kernel.getGrid().size());
  int64_t dim = static_cast<int64_t>(getDim());
  if (dim < 0 || dim >= rank)
    return emitOpError("dim ") << dim << " is out of range for a grid of rank " << rank;
  return success();
}

LogicalResult FillOp::verify() {
  Type element = getResult().getType().getElementType();
  double value = getValue().convertToDouble();
  if (element.isInteger() && value != static_cast<double>(static_cast<int64_t>(value)))
    return emitOpError("value ") << value << " is not an integer but the tile holds " << element;
  return success();
}

/// A tile access must name one offset per buffer dimension, agree on element
/// type, and use a tile that divides the buffer (no partial tiles yet).
static LogicalResult verifyTileAccess(Operation *op, TileType tile, MemRefType buffer,
                                      size_t numOffsets, StringRef bufferName,
                                      std::optional<ArrayRef<int64_t>> dims) {
  // A 0-d buffer (a scalar) is accessed as a one-element 1-D tile.
  if (buffer.getRank() == 0) {
    if (numOffsets != 0 || tile.getShape() != ArrayRef<int64_t>{1} ||
        tile.getElementType() != buffer.getElementType() || dims)
      return op->emitOpError("a 0-d '") << bufferName << "' " << buffer
                                        << " is accessed with no offsets or dims as a "
                                           "one-element 1-D tile of its element type";
    return success();
  }
  if (numOffsets != static_cast<size_t>(buffer.getRank()))
    return op->emitOpError("needs ") << buffer.getRank() << " offsets for '" << bufferName
                                     << "' " << buffer << ", got " << numOffsets;
  // A lower-rank tile covers the buffer's trailing dimensions, or `dims`.
  int64_t rank = tile.getShape().size();
  if (rank > buffer.getRank())
    return op->emitOpError("tile ") << tile << " has a higher rank than '" << bufferName
                                    << "' " << buffer;
  if (tile.getElementType() != buffer.getElementType())
    return op->emitOpError("tile ") << tile << " and '" << bufferName << "' " << buffer
                                    << " have different element types";
  SmallVector<int64_t> spanned;
  for (int64_t i = 0; i < rank; ++i)
    spanned.push_back(buffer.getRank() - rank + i);
  if (dims) {
    if (static_cast<int64_t>(dims->size()) != rank)
      return op->emitOpError("'dims' must name ")
             << rank << " dimensions (one per tile dimension), got " << dims->size();
    for (auto [i, d] : llvm::enumerate(*dims))
      if (d < 0 || d >= buffer.getRank() || (i > 0 && d <= (*dims)[i - 1]))
        return op->emitOpError("'dims' must be increasing dimensions of '")
               << bufferName << "' " << buffer;
    spanned.assign(dims->begin(), dims->end());
  }
  for (auto [t, d] : llvm::zip(tile.getShape(), spanned))
    if (buffer.getShape()[d] % t != 0)
      return op->emitOpError("tile ") << tile << " does not evenly divide '" << bufferName
                                      << "' " << buffer;
  return success();
}

LogicalResult LoadOp::verify() {
  TileType tile = getResult().getType();
  MemRefType source = getSource().getType();
  if (failed(verifyTileAccess(*this, tile, source, getOffsets().size(), "source", getDims())))
    return failure();
  if (!getTma())
    return success();
  if (getDims())
    return emitOpError("'tma' loads trailing tiles (no 'dims')");
  // What the tensor map and the swizzled shared-memory layout allow.
  Type elt = tile.getElementType();
  if (!(elt.isBF16() || elt.isF16()) || tile.getShape().size() != 2)
    return emitOpError("'tma' loads 2-D bf16 or f16 tiles, not ") << tile;
  if (tile.getShape()[1] % 64 || tile.getShape()[0] > 256)
    return emitOpError("'tma' needs tile columns a multiple of 64 (128-byte swizzled rows) "
                       "and at most 256 rows, not ")
           << tile;
  // (Rows are then whole 128-byte multiples too: the tile divides them.)
  if (source.getRank() > 5)
    return emitOpError("'tma' needs a 'source' of rank 5 or less, not ") << source;
  auto arg = dyn_cast<BlockArgument>(getSource());
  auto kernel = (*this)->getParentOfType<KernelOp>();
  if (!arg || !kernel || arg.getOwner() != &kernel.getBody().front())
    return emitOpError("'tma' loads from a kernel argument (its tensor map is built on the "
                       "host)");
  return success();
}

LogicalResult StoreOp::verify() {
  return verifyTileAccess(*this, getValue().getType(), getDest().getType(),
                          getOffsets().size(), "dest", getDims());
}

LogicalResult DotOp::verify() {
  TileType a = getLhs().getType(), b = getRhs().getType(), c = getAcc().getType();
  if (a.getShape().size() != 2 || b.getShape().size() != 2 || c.getShape().size() != 2)
    return emitOpError("'lhs', 'rhs' and 'acc' must be 2-D tiles");
  if (a.getElementType() != b.getElementType())
    return emitOpError("'lhs' ") << a << " and 'rhs' " << b << " have different element types";
  if (a.getShape()[1] != b.getShape()[0])
    return emitOpError("contraction dimensions differ: 'lhs' ")
           << a << " vs 'rhs' " << b;
  if (c.getShape()[0] != a.getShape()[0] || c.getShape()[1] != b.getShape()[1])
    return emitOpError("'acc' ") << c << " must be " << a.getShape()[0] << "x"
                                 << b.getShape()[1] << " for 'lhs' " << a << " and 'rhs' " << b;
  if (auto warps = getWarps()) {
    if (warps->size() != 2 || (*warps)[0] < 1 || (*warps)[1] < 1)
      return emitOpError("'warps' must be two sizes >= 1 (warps along M and N)");
    if (c.getShape()[0] % (*warps)[0] || c.getShape()[1] % (*warps)[1])
      return emitOpError("'warps' [") << (*warps)[0] << ", " << (*warps)[1]
                                      << "] do not evenly split 'acc' " << c;
    auto kernel = (*this)->getParentOfType<KernelOp>();
    int64_t threads = 1;
    if (kernel)
      for (int64_t b : kernel.getBlock())
        threads *= b;
    // A producer warpgroup only copies: the dot's warps are the others.
    bool producer = kernel && kernel.getProducerWarpgroup();
    if (producer)
      threads -= 128;
    if (kernel && threads != (*warps)[0] * (*warps)[1] * 32)
      return emitOpError("'warps' [") << (*warps)[0] << ", " << (*warps)[1] << "] need "
                                      << (*warps)[0] * (*warps)[1] * 32 << " threads but the kernel's "
                                      << (producer ? "block has, besides its producer warpgroup, "
                                                   : "block has ")
                                      << threads;
  }
  if (getWgmma()) {
    auto warps = getWarps();
    int64_t m = c.getShape()[0], n = c.getShape()[1], k = a.getShape()[1];
    Type elt = a.getElementType();
    if (!(elt.isBF16() || elt.isF16()) || !c.getElementType().isF32())
      return emitOpError("'wgmma' needs bf16 or f16 operands and an f32 'acc', not ")
             << a << " into " << c;
    if (!warps || warps->size() != 2 || (*warps)[1] != 1 || (*warps)[0] % 4 ||
        m != 16 * (*warps)[0])
      return emitOpError("'wgmma' needs 'warps' = [M/16, 1] in whole warpgroups (M a multiple "
                         "of 64): 'acc' is ")
             << c;
    // The instruction's shape (m64nNk16); where the operands sit (whole
    // 128-byte swizzle atoms in shared memory, or A in registers) is the
    // emitter's to check, since it decides where they sit.
    if (n % 8 || n > 256 || k % 16)
      return emitOpError("'wgmma' needs N a multiple of 8 up to 256 and K a multiple of 16 "
                         "(m64nNk16 steps), not N = ")
             << n << ", K = " << k;
  }
  return success();
}

LogicalResult ReduceOp::verify() {
  TileType in = getInput().getType(), out = getResult().getType();
  int64_t rank = in.getShape().size();
  int64_t dim = static_cast<int64_t>(getDim());
  if (dim < 0 || dim >= rank)
    return emitOpError("dim ") << dim << " is out of range for 'input' " << in;
  SmallVector<int64_t> want(in.getShape());
  want[dim] = 1;
  if (out.getShape() != ArrayRef<int64_t>(want) || out.getElementType() != in.getElementType())
    return emitOpError("result ") << out << " must be 'input' " << in
                                  << " with dimension " << dim << " reduced to 1";
  return success();
}

//===----------------------------------------------------------------------===//
// Elementwise conversions, broadcast, iota
//===----------------------------------------------------------------------===//

LogicalResult CompareOp::verify() {
  TileType a = getLhs().getType(), b = getRhs().getType(), r = getResult().getType();
  if (a != b)
    return emitOpError("operand types differ: ") << a << " vs " << b;
  if (r.getShape() != a.getShape() || !r.getElementType().isInteger(1))
    return emitOpError("result must be an i1 tile shaped like the operands, got ") << r;
  return success();
}

LogicalResult SelectOp::verify() {
  TileType c = getCond().getType(), r = getResult().getType();
  if (c.getShape() != r.getShape() || !c.getElementType().isInteger(1))
    return emitOpError("'cond' must be an i1 tile shaped like the result, got ") << c;
  return success();
}

LogicalResult CastOp::verify() {
  if (getInput().getType().getShape() != getResult().getType().getShape())
    return emitOpError("cast changes the tile shape: ")
           << getInput().getType() << " to " << getResult().getType();
  return success();
}

LogicalResult BroadcastOp::verify() {
  TileType in = getInput().getType(), out = getResult().getType();
  if (in.getShape().size() != out.getShape().size() ||
      in.getElementType() != out.getElementType())
    return emitOpError("'input' ") << in << " and result " << out
                                   << " must have the same rank and element type";
  for (auto [i, o] : llvm::zip(in.getShape(), out.getShape()))
    if (i != o && i != 1)
      return emitOpError("only size-1 dimensions broadcast: ") << in << " to " << out;
  return success();
}

LogicalResult TransposeOp::verify() {
  TileType in = getInput().getType(), out = getResult().getType();
  ArrayRef<int64_t> a = in.getShape(), b = out.getShape();
  if (a.size() != 2 || b.size() != 2 || a[0] != b[1] || a[1] != b[0] ||
      in.getElementType() != out.getElementType())
    return emitOpError("transposes a 2-D tile: ") << in << " cannot become " << out;
  return success();
}

LogicalResult IotaOp::verify() {
  TileType r = getResult().getType();
  if (getDim() < 0 || static_cast<int64_t>(getDim()) >= static_cast<int64_t>(r.getShape().size()))
    return emitOpError("dim ") << getDim() << " is out of range for " << r;
  return success();
}

LogicalResult DropoutFactorOp::verify() {
  TileType r = getResult().getType();
  if (r.getShape().size() != 2 || !isa<FloatType>(r.getElementType()))
    return emitOpError("result must be a 2-D float tile, got ") << r;
  if (getStrides().size() != 2)
    return emitOpError("'strides' must give one stride per tile dimension, got ")
           << getStrides().size();
  double p = getP().convertToDouble();
  if (!(p > 0.0 && p < 1.0))
    return emitOpError("'p' must lie in (0, 1), got ") << p;
  return success();
}

//===----------------------------------------------------------------------===//
// NVSHMEM
//===----------------------------------------------------------------------===//

/// `buffer` must be an argument of the enclosing kernel marked `ttile.symmetric`.
static LogicalResult verifySymmetric(Operation *op, Value buffer, StringRef role) {
  auto arg = llvm::dyn_cast<BlockArgument>(buffer);
  auto kernel = op->getParentOfType<KernelOp>();
  if (!arg || !kernel || arg.getOwner() != &kernel.getBody().front() ||
      !kernel.getArgAttr(arg.getArgNumber(), "ttile.symmetric"))
    return op->emitOpError("'") << role << "' must be a kernel argument marked "
                                << "{ttile.symmetric} (a buffer every PE allocated with "
                                << "nvshmem_malloc)";
  return success();
}

static LogicalResult verifySignals(Operation *op, Value signals) {
  auto type = llvm::cast<MemRefType>(signals.getType());
  if (type.getRank() != 1 || !type.getElementType().isInteger(64))
    return op->emitOpError("'signals' must be a 1-D buffer of i64 signal words, got ") << type;
  return success();
}

/// A box copy between two buffers (put or get): same element type, one
/// offset per dimension, and a box `shape` that fits the trailing dimensions
/// of both.
static LogicalResult verifyBoxCopy(Operation *op, Value source, ValueRange sourceOffsets,
                                   Value dest, ValueRange destOffsets, ArrayRef<int64_t> shape) {
  auto src = llvm::cast<MemRefType>(source.getType());
  auto dst = llvm::cast<MemRefType>(dest.getType());
  if (src.getElementType() != dst.getElementType())
    return op->emitOpError("'source' ") << src << " and 'dest' " << dst
                                        << " have different element types";
  if (sourceOffsets.size() != static_cast<size_t>(src.getRank()) ||
      destOffsets.size() != static_cast<size_t>(dst.getRank()))
    return op->emitOpError("needs one offset per dimension of 'source' and 'dest'");
  if (shape.empty() || shape.size() > static_cast<size_t>(std::min(src.getRank(), dst.getRank())))
    return op->emitOpError("'shape' must have 1 to min(rank(source), rank(dest)) sizes");
  for (auto [i, n] : llvm::enumerate(shape)) {
    size_t fromEnd = shape.size() - i;
    if (n < 1 || n > src.getShape()[src.getRank() - fromEnd] ||
        n > dst.getShape()[dst.getRank() - fromEnd])
      return op->emitOpError("'shape' [") << i << "] = " << n << " does not fit 'source' "
                                          << src << " and 'dest' " << dst;
  }
  return success();
}

LogicalResult LoadScalarOp::verify() {
  auto type = llvm::cast<MemRefType>(getBuffer().getType());
  if (!llvm::isa<IntegerType>(type.getElementType()))
    return emitOpError("reads an index from an integer buffer, got ") << type;
  if (getIndices().size() != static_cast<size_t>(type.getRank()))
    return emitOpError("needs one index per dimension of ") << type << ", got "
                                                            << getIndices().size();
  return success();
}

LogicalResult PutOp::verify() {
  if (failed(verifyBoxCopy(*this, getSource(), getSourceOffsets(), getDest(), getDestOffsets(),
                           getShape())))
    return failure();
  return verifySymmetric(*this, getDest(), "dest");
}

LogicalResult GetOp::verify() {
  if (failed(verifyBoxCopy(*this, getSource(), getSourceOffsets(), getDest(), getDestOffsets(),
                           getShape())))
    return failure();
  return verifySymmetric(*this, getSource(), "source");
}

LogicalResult SignalOp::verify() {
  if (getKind() != "set" && getKind() != "add")
    return emitOpError("'kind' must be \"set\" or \"add\", got \"") << getKind() << "\"";
  if (failed(verifySignals(*this, getSignals())))
    return failure();
  return verifySymmetric(*this, getSignals(), "signals");
}

LogicalResult WaitOp::verify() {
  static const llvm::StringRef cmps[] = {"eq", "ne", "gt", "ge", "lt", "le"};
  if (!llvm::is_contained(cmps, getCmp()))
    return emitOpError("'cmp' must be one of eq, ne, gt, ge, lt, le; got \"") << getCmp() << "\"";
  if (failed(verifySignals(*this, getSignals())))
    return failure();
  return verifySymmetric(*this, getSignals(), "signals");
}

//===----------------------------------------------------------------------===//
// The GPU schedule (discardable attributes; see TTile.td)
//===----------------------------------------------------------------------===//

LogicalResult PipelineAttr::verify(function_ref<InFlightDiagnostic()> emitError, LoopKind kind,
                                   Mma mma, Copies copies, int64_t stages, int64_t lag,
                                   bool producer, bool pingpong, bool issueAhead) {
  if (stages < 1 || stages > 8)
    return emitError() << "pipeline stages must be 1 to 8, got " << stages;
  if (lag < 0 || lag >= stages)
    return emitError() << "pipeline lag (wgmma groups in flight) must be below its " << stages
                       << " stages, got " << lag;
  if (copies == Copies::tma && mma != Mma::wgmma)
    return emitError() << "a pipeline filled by TMA must be a wgmma one";
  if (producer && (kind != LoopKind::gemm || copies != Copies::tma))
    return emitError() << "a producer warpgroup feeds only a GEMM main loop's TMA ring";
  if ((pingpong || issueAhead) && (kind != LoopKind::registers || mma != Mma::wgmma))
    return emitError() << "ping-pong and issuing ahead are for wgmma loops with their tiles "
                          "in registers";
  if (issueAhead && (copies != Copies::tma || stages < 3 || pingpong))
    return emitError() << "issuing ahead needs a TMA ring of 3 stages or more, without ping-pong";
  return success();
}

/// `attr` is one `T` (an op with one result) or an array of them, one per
/// result; `check` judges each.
template <typename T>
static LogicalResult verifyPerResult(Operation *op, NamedAttribute attr, StringRef what,
                                     function_ref<LogicalResult(T)> check) {
  if (auto one = llvm::dyn_cast<T>(attr.getValue())) {
    if (op->getNumResults() != 1)
      return op->emitOpError("'") << attr.getName().getValue() << "' of an op with "
                                  << op->getNumResults() << " results must be an array of "
                                  << what << ", one per result";
    return check(one);
  }
  auto list = llvm::dyn_cast<ArrayAttr>(attr.getValue());
  if (!list || list.size() != op->getNumResults())
    return op->emitOpError("'") << attr.getName().getValue() << "' must be " << what
                                << " (or an array of them, one per result), got "
                                << attr.getValue();
  for (Attribute a : list) {
    auto one = llvm::dyn_cast<T>(a);
    if (!one)
      return op->emitOpError("'") << attr.getName().getValue() << "' lists " << a << ", not " << what;
    if (failed(check(one)))
      return failure();
  }
  return success();
}

static bool isLoop(Operation *op) { return op->getName().getStringRef() == "scf.for"; }

/// The byte offset of a shared-memory allocation: `align`-byte aligned
/// (16 for tiles, 8 for mbarriers).
static LogicalResult checkOffset(Operation *op, StringRef name, int64_t offset, bool allowNone,
                                 int64_t align = 16) {
  if (allowNone && offset == -1)
    return success();
  if (offset < 0 || offset % align)
    return op->emitOpError("'") << name << "' offsets must be " << align
                                << "-byte aligned bytes"
                                << (allowNone ? " (or -1: none)" : "") << ", got " << offset;
  return success();
}


//===----------------------------------------------------------------------===//
// The CPU schedule (see "The CPU schedule" in TTile.td)
//===----------------------------------------------------------------------===//

/// Whether the tile `access` (a load or store) moves is one contiguous block
/// of `buffer`: not 0-d, not bf16 / FP8 (held as bits, converted per
/// element), whole in every dimension after its first of extent > 1.
static bool isBlockOf(Operation *access, Type tileType, Type bufferType) {
  auto tile = llvm::dyn_cast<TileType>(tileType);
  auto buffer = llvm::dyn_cast<MemRefType>(bufferType);
  if (!tile || !buffer)
    return false;
  ArrayRef<int64_t> shape = buffer.getShape(), sizes = tile.getShape();
  Type element = buffer.getElementType();
  if (shape.empty() || sizes.size() > shape.size() || element.isBF16() ||
      llvm::isa<Float8E4M3FNType>(element))
    return false;
  SmallVector<int64_t> placed(shape.size(), 1);
  if (auto dims = access->getAttrOfType<DenseI64ArrayAttr>("dims")) {
    for (auto [d, n] : llvm::zip(dims.asArrayRef(), sizes)) {
      if (d < 0 || d >= static_cast<int64_t>(shape.size()))
        return false;
      placed[d] = n;
    }
  } else {
    for (size_t i = 0; i < sizes.size(); ++i)
      placed[shape.size() - sizes.size() + i] = sizes[i];
  }
  size_t first = 0;
  while (first < placed.size() && placed[first] <= 1)
    ++first;
  for (size_t d = first + 1; d < shape.size(); ++d)
    if (placed[d] != shape[d])
      return false;
  return true;
}

/// The enclosing kernel's ops that store to (`stores`) or load from `buffer`.
static void countAccesses(Operation *op, Value buffer, int &stores, int &loads) {
  stores = loads = 0;
  Operation *kernel = op->getParentOfType<KernelOp>();
  if (!kernel)
    return;
  kernel->walk([&](Operation *o) {
    StringRef name = o->getName().getStringRef();
    if (name == "ttile.store" && o->getNumOperands() > 1 && o->getOperand(1) == buffer)
      ++stores;
    else if (name == "ttile.load" && o->getNumOperands() > 0 && o->getOperand(0) == buffer)
      ++loads;
  });
}

static LogicalResult verifyInPlace(Operation *op) {
  StringRef name = op->getName().getStringRef();
  int stores = 0, loads = 0;
  if (name == "ttile.load") {
    if (op->getNumOperands() < 1 || op->getNumResults() != 1)
      return failure();
    countAccesses(op, op->getOperand(0), stores, loads);
    if (stores)
      return op->emitOpError("'ttile.in_place' reads a buffer the kernel stores to (a view "
                             "would see the store)");
    if (!isBlockOf(op, op->getResult(0).getType(), op->getOperand(0).getType()))
      return op->emitOpError("'ttile.in_place' needs a tile that is one contiguous block of "
                             "a buffer that is not 0-d, bf16 or FP8");
    return success();
  }
  if (name != "ttile.store")
    return op->emitOpError("'ttile.in_place' belongs on a ttile.load or a ttile.store");
  if (op->getNumOperands() < 2)
    return failure();
  Value value = op->getOperand(0), buffer = op->getOperand(1);
  Operation *producer = value.getDefiningOp();
  if (!producer || producer->getBlock() != op->getBlock())
    return op->emitOpError("'ttile.in_place' stores a tile defined outside its block");
  StringRef made = producer->getName().getStringRef();
  if (made == "scf.for" || (made == "ttile.dot" && producer->hasAttr("ttile.accumulate")))
    return op->emitOpError("'ttile.in_place' stores a tile held in another value's array (")
           << made << ")";
  for (Value offset : op->getOperands().drop_front(2))
    if (Operation *o = offset.getDefiningOp())
      if (o->getBlock() == producer->getBlock() && producer->isBeforeInBlock(o))
        return op->emitOpError("'ttile.in_place' needs its offsets computed before the tile");
  countAccesses(op, buffer, stores, loads);
  if (stores != 1 || loads)
    return op->emitOpError("'ttile.in_place' needs a buffer the kernel stores only there and "
                           "never loads (")
           << stores << " stores, " << loads << " loads)";
  if (!isBlockOf(op, value.getType(), buffer.getType()))
    return op->emitOpError("'ttile.in_place' needs a tile that is one contiguous block of a "
                           "buffer that is not 0-d, bf16 or FP8");
  return success();
}

static LogicalResult verifyAccumulate(Operation *op) {
  if (op->getName().getStringRef() != "ttile.dot")
    return op->emitOpError("'ttile.accumulate' belongs on a ttile.dot");
  if (op->getNumOperands() != 3 || op->getNumResults() != 1)
    return failure();
  Value acc = op->getOperand(2);
  if (!acc.hasOneUse() || acc.getParentBlock() != op->getBlock())
    return op->emitOpError("'ttile.accumulate' needs the dot to be its accumulator's only use, "
                           "in the accumulator's block");
  if (acc.getType() != op->getResult(0).getType())
    return op->emitOpError("'ttile.accumulate' needs an accumulator of the result's type");
  if (Operation *load = acc.getDefiningOp())
    if (load->getName().getStringRef() == "ttile.load" && load->hasAttr("ttile.in_place"))
      return op->emitOpError("'ttile.accumulate' into a load read in place (a buffer)");
  return success();
}

static std::optional<int64_t> tileElements(Type type) {
  auto tile = llvm::dyn_cast<TileType>(type);
  if (!tile)
    return std::nullopt;
  int64_t n = 1;
  for (int64_t d : tile.getShape())
    n *= d;
  return n;
}

/// Whether a fused loop (running over rows of the result's last dimension)
/// can index broadcast `op`'s source directly: the result's shape, one
/// column, one value, or the result's trailing dimensions.
static bool loopIndexesBroadcast(Operation *op) {
  auto result = llvm::dyn_cast<TileType>(op->getResult(0).getType());
  auto src = llvm::dyn_cast<TileType>(op->getOperand(0).getType());
  if (!result || !src || src.getShape().size() > result.getShape().size())
    return false;
  ArrayRef<int64_t> shape = result.getShape();
  SmallVector<int64_t> source(shape.size() - src.getShape().size(), 1);
  llvm::append_range(source, src.getShape());
  if (ArrayRef<int64_t>(source) == shape)
    return true;
  if (source.back() == 1 &&
      ArrayRef<int64_t>(source).drop_back() == shape.drop_back())
    return true;
  size_t lead = 0;
  while (lead < source.size() && source[lead] == 1)
    ++lead;
  return lead == source.size() || ArrayRef<int64_t>(source).drop_front(lead) == shape.drop_front(lead);
}

/// `ttile.fused = N` on `op`: an op a fused element loop can hold, and the
/// ops of loop N in `op`'s block consecutive, over tiles of one size, with
/// one last dimension for their broadcasts, which read no value of the loop
/// (only the first op of the loop reports what is wrong with it).
static LogicalResult verifyFused(Operation *op, int64_t loop) {
  StringRef name = op->getName().getStringRef();
  bool load = name == "ttile.load";
  if (!(op->hasTrait<OpTrait::Elementwise>() || name == "ttile.fill" || name == "ttile.iota" ||
        name == "ttile.dropout_factor" || name == "ttile.broadcast" ||
        (load && op->hasAttr("ttile.in_place"))))
    return op->emitOpError("'ttile.fused' belongs on an elementwise op, a fill, an iota, a "
                           "dropout factor, a broadcast or a ttile.load {ttile.in_place}");
  if (op->getNumResults() != 1 || !tileElements(op->getResult(0).getType()))
    return failure();
  auto inLoop = [&](Operation &o) {
    auto n = o.getAttrOfType<IntegerAttr>("ttile.fused");
    return n && n.getInt() == loop;
  };
  Block *block = op->getBlock();
  Operation *first = nullptr, *last = nullptr;
  for (Operation &o : *block)
    if (inLoop(o)) {
      if (!first)
        first = &o;
      last = &o;
    }
  if (first != op)
    return success();
  std::optional<int64_t> size, width;
  bool computes = false;
  llvm::SmallPtrSet<Operation *, 16> members;
  for (Operation *o = first;; o = o->getNextNode()) {
    if (!inLoop(*o))
      return op->emitOpError("'ttile.fused' loop ") << loop << " is not consecutive ops of its "
                                                          "block (interrupted by '"
                                                       << o->getName() << "')";
    members.insert(o);
    if (o->getName().getStringRef() != "ttile.load" && o->getNumResults() == 1) {
      computes = true;
      std::optional<int64_t> n = tileElements(o->getResult(0).getType());
      if (size && n != size)
        return op->emitOpError("'ttile.fused' loop ")
               << loop << " holds tiles of " << *size << " and " << n.value_or(0) << " elements";
      size = n;
      if (o->getName().getStringRef() == "ttile.broadcast") {
        int64_t w = llvm::cast<TileType>(o->getResult(0).getType()).getShape().back();
        Operation *src = o->getOperand(0).getDefiningOp();
        if (!loopIndexesBroadcast(o) || (width && *width != w) ||
            (src && members.contains(src) && src->getName().getStringRef() != "ttile.load"))
          return o->emitOpError("'ttile.fused' on a broadcast its loop cannot index (one "
                                "last dimension for the loop's broadcasts, a source the loop "
                                "does not compute)");
        width = w;
      }
    }
    if (o == last)
      break;
  }
  if (!computes)
    return op->emitOpError("'ttile.fused' loop ") << loop << " computes nothing (only loads)";
  return success();
}

/// One attribute of the CPU schedule (`ttile.in_place`, `ttile.accumulate`,
/// `ttile.fused`).
static LogicalResult verifyCpuSchedule(Operation *op, StringRef name, Attribute value) {
  if (name == "ttile.fused") {
    auto loop = llvm::dyn_cast<IntegerAttr>(value);
    if (!loop)
      return op->emitOpError("'ttile.fused' must be an integer, got ") << value;
    if (loop.getInt() < 0)
      return op->emitOpError("'ttile.fused' must be >= 0, got ") << loop.getInt();
    return verifyFused(op, loop.getInt());
  }
  if (!llvm::isa<UnitAttr>(value))
    return op->emitOpError("'") << name << "' is a unit attribute, got " << value;
  return name == "ttile.in_place" ? verifyInPlace(op) : verifyAccumulate(op);
}

LogicalResult TTileDialect::verifyOperationAttribute(Operation *op, NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  Attribute value = attr.getValue();
  auto unit = [&]() -> LogicalResult {
    if (!llvm::isa<UnitAttr>(value))
      return op->emitOpError("'") << name << "' is a unit attribute, got " << value;
    return success();
  };
  auto integer = [&]() -> std::optional<int64_t> {
    auto i = llvm::dyn_cast<IntegerAttr>(value);
    if (!i) {
      op->emitOpError("'") << name << "' must be an integer, got " << value;
      return std::nullopt;
    }
    return i.getInt();
  };
  auto count = [&]() -> std::optional<int64_t> {     // an integer >= 0
    std::optional<int64_t> i = integer();
    if (i && *i < 0) {
      op->emitOpError("'") << name << "' must be >= 0, got " << *i;
      return std::nullopt;
    }
    return i;
  };
  auto onLoop = [&]() -> LogicalResult {
    if (!isLoop(op))
      return op->emitOpError("'") << name << "' belongs on an scf.for";
    return success();
  };
  if (name == "ttile.place")
    return verifyPerResult<PlacementAttr>(op, attr, "#ttile.place",
                                      [](PlacementAttr) { return success(); });
  if (name == "ttile.smem") {
    if (auto list = llvm::dyn_cast<DenseI64ArrayAttr>(value)) {
      if (static_cast<unsigned>(list.size()) != op->getNumResults())
        return op->emitOpError("'ttile.smem' must list one offset per result (")
               << op->getNumResults() << "), got " << list.size();
      for (int64_t offset : list.asArrayRef())
        if (failed(checkOffset(op, name, offset, true)))
          return failure();
      return success();
    }
    std::optional<int64_t> offset = integer();
    if (!offset)
      return failure();
    return checkOffset(op, name, *offset, false);
  }
  if (name == "ttile.region")
    return count() ? success() : failure();
  if (name == "ttile.in_place" || name == "ttile.accumulate" || name == "ttile.fused")
    return verifyCpuSchedule(op, name, value);
  if (name == "ttile.spill" || name == "ttile.release")
    return unit();
  if (name == "ttile.pingpong" || name == "ttile.issue_ahead")
    return failed(unit()) ? failure() : onLoop();
  if (name == "ttile.pipeline") {
    if (!llvm::isa<PipelineAttr>(value))
      return op->emitOpError("'ttile.pipeline' must be a #ttile.pipeline, got ") << value;
    return onLoop();
  }
  if (name == "ttile.ring") {
    std::optional<int64_t> offset = integer();
    if (!offset || failed(checkOffset(op, name, *offset, false)))
      return failure();
    return onLoop();
  }
  if (name == "ttile.barriers") {
    auto list = llvm::dyn_cast<DenseI64ArrayAttr>(value);
    if (!list)
      return op->emitOpError("'ttile.barriers' must be an array<i64> of byte offsets, got ")
             << value;
    for (int64_t offset : list.asArrayRef())
      if (failed(checkOffset(op, name, offset, false, 8)))
        return failure();
    return onLoop();
  }
  if (name == "ttile.shared_in") {
    auto list = llvm::dyn_cast<ArrayAttr>(value);
    if (!list || !llvm::all_of(list, [](Attribute a) { return llvm::isa<MmaAttr>(a); }))
      return op->emitOpError("'ttile.shared_in' must list #ttile.mma branches, got ") << value;
    return success();
  }
  if (name == "ttile.fallback") {
    if (!llvm::isa<StringAttr>(value))
      return op->emitOpError("'ttile.fallback' must be a string (why), got ") << value;
    return success();
  }
  if (name == "ttile.smem_bytes") {
    if (!count())
      return failure();
    if (!llvm::isa<KernelOp>(op))
      return op->emitOpError("'ttile.smem_bytes' belongs on a ttile.kernel");
    return success();
  }
  if (name == "ttile.domain") {
    auto shape = llvm::dyn_cast<DenseI64ArrayAttr>(value);
    if (!shape || !llvm::all_of(shape.asArrayRef(), [](int64_t d) { return d >= 1; }))
      return op->emitOpError("'ttile.domain' must be an array<i64> of sizes >= 1, got ") << value;
    if (!op->hasAttr("ttile.region"))
      return op->emitOpError("'ttile.domain' belongs on the first op of a pointwise region "
                             "(one with 'ttile.region')");
    return success();
  }
  if (name == "ttile.tile_sizes") {
    if (!llvm::isa<DenseI64ArrayAttr>(value))
      return op->emitOpError("'ttile.tile_sizes' must be an array<i64>, got ") << value;
    return success();
  }
  return op->emitOpError("unknown Tile IR attribute '") << name << "'";
}
