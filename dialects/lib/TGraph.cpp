//===- TGraph.cpp - Tessera Graph IR dialect ------------------------------===//
//
// Verifiers for meshes, shardings and the Graph IR ops. Every check that user
// input can reach reports a diagnostic naming the operand or attribute; none
// asserts (the pip LLVM is built with assertions on, so an assert aborts).
//
//===----------------------------------------------------------------------===//

#include "tessera/TGraph/TGraph.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace tessera::tgraph;

#include "tessera/TGraph/TGraphDialect.cpp.inc"
#include "tessera/TGraph/TGraphEnums.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "tessera/TGraph/TGraphAttrs.cpp.inc"
#define GET_OP_CLASSES
#include "tessera/TGraph/TGraphOps.cpp.inc"

void TGraphDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "tessera/TGraph/TGraphAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "tessera/TGraph/TGraphOps.cpp.inc"
      >();
}

static std::string shapeString(ArrayRef<int64_t> shape) {
  std::string s;
  llvm::raw_string_ostream os(s);
  llvm::interleave(shape, os, "x");
  return s;
}

//===----------------------------------------------------------------------===//
// MeshOp
//===----------------------------------------------------------------------===//

LogicalResult MeshOp::verify() {
  ArrayRef<int64_t> shape = getShape();
  ArrayAttr axes = getAxes();
  if (axes.empty())
    return emitOpError("mesh @") << getSymName() << " must have at least one axis";
  if (axes.size() != shape.size())
    return emitOpError("mesh @")
           << getSymName() << " names " << axes.size() << " axes but gives "
           << shape.size() << " sizes";
  llvm::StringSet<> seen;
  for (auto [axis, size] : llvm::zip(axes.getAsValueRange<StringAttr>(), shape)) {
    if (axis.empty())
      return emitOpError("mesh axis names must not be empty");
    if (axis.contains(':'))
      return emitOpError("mesh axis name '")
             << axis << "' must not contain ':' (it writes sub-axes, as in \"dp:(1)2\")";
    if (!seen.insert(axis).second)
      return emitOpError("mesh axis '") << axis << "' appears twice";
    if (size < 1)
      return emitOpError("mesh axis '") << axis << "' has size " << size
                                         << "; sizes must be >= 1";
  }
  return success();
}

std::optional<int64_t> MeshOp::getAxisSize(StringRef axis) {
  for (auto [name, size] : llvm::zip(getAxes().getAsValueRange<StringAttr>(), getShape()))
    if (name == axis)
      return size;
  return std::nullopt;
}

std::optional<int64_t> MeshOp::getGroupSize(StringRef axis) {
  if (std::optional<int64_t> size = getAxisSize(axis))
    return size;
  // A sub-axis "name:(pre)size": pre * size must divide the axis' size.
  auto [name, rest] = axis.split(':');
  std::optional<int64_t> whole = getAxisSize(name);
  int64_t pre = 0, size = 0;
  if (!whole || !rest.consume_front("(") || rest.consumeInteger(10, pre) ||
      !rest.consume_front(")") || rest.consumeInteger(10, size) || !rest.empty())
    return std::nullopt;
  if (pre < 1 || size < 1 || *whole % (pre * size) != 0)
    return std::nullopt;
  return size;
}

//===----------------------------------------------------------------------===//
// ShardingAttr
//===----------------------------------------------------------------------===//

LogicalResult
ShardingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                     FlatSymbolRefAttr mesh, ArrayAttr dims, ArrayAttr partial) {
  llvm::StringSet<> seen;
  auto checkAxis = [&](Attribute a, StringRef where) -> LogicalResult {
    auto name = llvm::dyn_cast<StringAttr>(a);
    if (!name)
      return emitError() << "sharding " << where << " must list mesh axis names (strings), got " << a;
    if (!seen.insert(name.getValue()).second)
      return emitError() << "mesh axis '" << name.getValue()
                         << "' is used more than once in one sharding";
    return success();
  };
  for (auto [i, dim] : llvm::enumerate(dims)) {
    auto list = llvm::dyn_cast<ArrayAttr>(dim);
    if (!list)
      return emitError() << "sharding entry for dimension " << i
                         << " must be a list of mesh axes, got " << dim;
    for (Attribute a : list)
      if (failed(checkAxis(a, "dimension entries")))
        return failure();
  }
  if (partial)
    for (Attribute a : partial)
      if (failed(checkAxis(a, "'partial'")))
        return failure();
  return success();
}

SmallVector<StringRef> ShardingAttr::getDimAxes(unsigned dim) const {
  SmallVector<StringRef> axes;
  if (dim < getDims().size())
    for (Attribute a : llvm::cast<ArrayAttr>(getDims()[dim]))
      axes.push_back(llvm::cast<StringAttr>(a).getValue());
  return axes;
}

SmallVector<StringRef> ShardingAttr::getPartialAxes() const {
  SmallVector<StringRef> axes;
  if (getPartial())
    for (Attribute a : getPartial())
      axes.push_back(llvm::cast<StringAttr>(a).getValue());
  return axes;
}

/// Checks `sharding` against the tensor type it describes and the mesh it
/// names. `what` names the value in diagnostics ("argument #1", "result").
/// Divisibility is checked only before partitioning: afterwards the types
/// are per-rank shapes.
static LogicalResult verifyShardingOf(Operation *anchor, ShardingAttr sharding,
                                      Type type, const Twine &what,
                                      function_ref<InFlightDiagnostic()> emitError,
                                      SmallVectorImpl<int64_t> *blockShape = nullptr) {
  auto tensor = llvm::dyn_cast<RankedTensorType>(type);
  if (!tensor)
    return emitError() << "sharding on " << what << " needs a ranked tensor, got " << type;
  if (sharding.getDims().size() != static_cast<size_t>(tensor.getRank()))
    return emitError() << "sharding of " << what << " has "
                       << sharding.getDims().size()
                       << " dimension entries but the tensor " << tensor
                       << " has rank " << tensor.getRank();
  auto mesh = SymbolTable::lookupNearestSymbolFrom<MeshOp>(anchor, sharding.getMesh());
  if (!mesh)
    return emitError() << "sharding of " << what << " refers to unknown mesh "
                       << sharding.getMesh();
  auto func = llvm::isa<FunctionOpInterface>(anchor)
                  ? anchor
                  : anchor->getParentOfType<FunctionOpInterface>().getOperation();
  bool partitioned = func && func->hasAttr("tgraph.partitioned");
  for (int64_t d = 0; d < tensor.getRank(); ++d) {
    int64_t parts = 1;
    for (StringRef axis : sharding.getDimAxes(d)) {
      std::optional<int64_t> size = mesh.getAxisSize(axis);
      if (!size)
        return emitError() << "sharding of " << what << " splits dimension " << d
                           << " over axis '" << axis << "', which mesh "
                           << sharding.getMesh() << " does not have";
      parts *= *size;
    }
    if (!partitioned && !tensor.isDynamicDim(d) && tensor.getDimSize(d) % parts != 0)
      return emitError() << "dimension " << d << " of " << what << " (size "
                         << tensor.getDimSize(d)
                         << ") is not divisible by the " << parts
                         << " shards its sharding asks for";
    if (blockShape)
      blockShape->push_back(tensor.isDynamicDim(d) ? ShapedType::kDynamic
                                                   : tensor.getDimSize(d) / parts);
  }
  for (StringRef axis : sharding.getPartialAxes())
    if (!mesh.getAxisSize(axis))
      return emitError() << "sharding of " << what << " has a partial sum over axis '"
                         << axis << "', which mesh " << sharding.getMesh()
                         << " does not have";
  return success();
}

static LogicalResult verifyShardingNamedAttr(Operation *op, NamedAttribute attr,
                                             Type type, const Twine &what) {
  auto sharding = llvm::dyn_cast<ShardingAttr>(attr.getValue());
  if (!sharding)
    return op->emitError() << "'" << attr.getName().getValue()
                           << "' must be a #tgraph.sharding attribute";
  return verifyShardingOf(op, sharding, type, what,
                          [&] { return op->emitError(); });
}

LogicalResult TGraphDialect::verifyRegionArgAttribute(Operation *op, unsigned,
                                                      unsigned argIndex,
                                                      NamedAttribute attr) {
  if (attr.getName() != getShardingAttrName())
    return op->emitError() << "unknown argument attribute '" << attr.getName().getValue() << "'";
  auto func = llvm::dyn_cast<FunctionOpInterface>(op);
  if (!func)
    return op->emitError() << "'" << attr.getName().getValue() << "' is only valid on function arguments";
  return verifyShardingNamedAttr(op, attr, func.getArgumentTypes()[argIndex],
                                 "argument #" + Twine(argIndex));
}

LogicalResult TGraphDialect::verifyRegionResultAttribute(Operation *op, unsigned,
                                                         unsigned resultIndex,
                                                         NamedAttribute attr) {
  if (attr.getName() != getShardingAttrName())
    return op->emitError() << "unknown result attribute '" << attr.getName().getValue() << "'";
  auto func = llvm::dyn_cast<FunctionOpInterface>(op);
  if (!func)
    return op->emitError() << "'" << attr.getName().getValue() << "' is only valid on function results";
  return verifyShardingNamedAttr(op, attr, func.getResultTypes()[resultIndex],
                                 "result #" + Twine(resultIndex));
}

LogicalResult TGraphDialect::verifyOperationAttribute(Operation *op,
                                                      NamedAttribute attr) {
  // Function-level partitioning options (see tessera-partition).
  if (attr.getName() == "tgraph.partitioned" || attr.getName() == "tgraph.deterministic" ||
      attr.getName() == "tgraph.local") {
    if (!llvm::isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << attr.getName().getValue() << "' must be a unit attribute";
    return success();
  }
  if (attr.getName() == "tgraph.pipeline") {
    // How tessera-pipeline-schedule runs the function (see tessera.pipeline).
    auto dict = llvm::dyn_cast<DictionaryAttr>(attr.getValue());
    if (!dict || !llvm::isa_and_nonnull<StringAttr>(dict.get("axis")) ||
        !llvm::isa_and_nonnull<StringAttr>(dict.get("schedule")) ||
        !llvm::isa_and_nonnull<IntegerAttr>(dict.get("microbatches")))
      return op->emitError("'tgraph.pipeline' must be a dictionary with 'axis' and 'schedule' "
                           "strings and an integer 'microbatches'");
    return success();
  }
  if (attr.getName() == "tgraph.scatter_partials") {
    auto axes = llvm::dyn_cast<ArrayAttr>(attr.getValue());
    if (!axes || !llvm::all_of(axes, [](Attribute a) { return llvm::isa<StringAttr>(a); }))
      return op->emitError("'tgraph.scatter_partials' must be an array of mesh axis names");
    return success();
  }
  if (attr.getName() == "tgraph.remat") {
    // An op of a recomputation region (tessera.remat): the autodiff pass
    // recomputes the region's forward before its backward, keeping what
    // `policy` saves. Consumed by tessera-autodiff.
    auto dict = llvm::dyn_cast<DictionaryAttr>(attr.getValue());
    auto region = dict ? llvm::dyn_cast_or_null<IntegerAttr>(dict.get("region")) : nullptr;
    auto policy = dict ? llvm::dyn_cast_or_null<StringAttr>(dict.get("policy")) : nullptr;
    if (!region || !policy || dict.size() != 2)
      return op->emitError("'tgraph.remat' must be a dictionary with an integer 'region' and a "
                           "string 'policy'");
    if (region.getInt() < 0)
      return op->emitError() << "'tgraph.remat' region must be >= 0, got " << region.getInt();
    if (!llvm::is_contained(llvm::ArrayRef<llvm::StringRef>{"none", "nothing_saveable",
                                                             "dots_saveable", "selective"},
                            policy.getValue()))
      return op->emitError() << "unknown 'tgraph.remat' policy '" << policy.getValue()
                             << "' (none, nothing_saveable, dots_saveable, selective)";
    if (op->getDialect() != this || op->getNumResults() == 0)
      return op->emitError("'tgraph.remat' marks tgraph ops with results");
    return success();
  }
  if (attr.getName() == "tgraph.recompute") {
    // A copy tessera-autodiff made of region `value`'s forward op, read by the
    // region's backward (it keeps CSE from merging it with the original).
    auto region = llvm::dyn_cast<IntegerAttr>(attr.getValue());
    if (!region || region.getInt() < 0)
      return op->emitError("'tgraph.recompute' must be a non-negative integer (the region)");
    return success();
  }
  if (attr.getName() == "tgraph.no_gradient") {
    // tessera-autodiff sends no cotangent back through this op (op.moe's FP8
    // scales: a rounding's scale is a constant to the derivative).
    if (!llvm::isa<UnitAttr>(attr.getValue()))
      return op->emitError("'tgraph.no_gradient' must be a unit attribute");
    return success();
  }
  if (attr.getName() == getShardingAttrName()) {
    // Ops with several results give them all one sharding (attention), or
    // one each, as an array, where their ranks differ (moe_dispatch).
    if (op->getNumResults() == 0)
      return op->emitError() << "'" << attr.getName().getValue()
                             << "' needs an op with a result";
    if (auto each = llvm::dyn_cast<ArrayAttr>(attr.getValue())) {
      if (each.size() != op->getNumResults())
        return op->emitError() << "'" << attr.getName().getValue() << "' has " << each.size()
                               << " shardings for " << op->getNumResults() << " results";
      for (auto [result, sharding] : llvm::zip(op->getResults(), each))
        if (failed(verifyShardingNamedAttr(op, NamedAttribute(attr.getName(), sharding),
                                           result.getType(), "the result")))
          return failure();
      return success();
    }
    for (Value result : op->getResults())
      if (failed(verifyShardingNamedAttr(op, attr, result.getType(), "the result")))
        return failure();
    return success();
  }
  return op->emitError() << "unknown tgraph attribute '" << attr.getName().getValue() << "'";
}

//===----------------------------------------------------------------------===//
// MatmulOp
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::verify() {
  auto lhs = getLhs().getType(), rhs = getRhs().getType();
  auto res = getResult().getType();
  if (lhs.getRank() < 2 || rhs.getRank() < 2)
    return emitOpError("operands must have rank >= 2, got 'lhs' ")
           << lhs << " and 'rhs' " << rhs;
  // (a 2-D rhs with a higher-rank lhs: one weight shared by every batch)
  bool shared = rhs.getRank() == 2 && lhs.getRank() > 2;
  if ((lhs.getRank() != rhs.getRank() && !shared) || res.getRank() != lhs.getRank())
    return emitOpError("'lhs' ") << lhs << ", 'rhs' " << rhs << " and result "
                                 << res << " must have the same rank (or 'rhs' be 2-D)";
  if (lhs.getElementType() != rhs.getElementType() ||
      res.getElementType() != lhs.getElementType())
    return emitOpError("element types differ: 'lhs' ")
           << lhs.getElementType() << ", 'rhs' " << rhs.getElementType()
           << ", result " << res.getElementType();
  int64_t r = lhs.getRank(), rb = rhs.getRank();
  ArrayRef<int64_t> a = lhs.getShape(), b = rhs.getShape(), c = res.getShape();
  for (int64_t i = 0; i < r - 2; ++i)
    if ((!shared && a[i] != b[i]) || a[i] != c[i])
      return emitOpError("batch dimension ") << i << " differs: 'lhs' "
                                             << shapeString(a) << ", 'rhs' "
                                             << shapeString(b) << ", result "
                                             << shapeString(c);
  if (a[r - 1] != b[rb - 2])
    return emitOpError("contraction dimensions differ: 'lhs' has shape ")
           << shapeString(a) << " (K = " << a[r - 1] << ") but 'rhs' has shape "
           << shapeString(b) << " (K = " << b[rb - 2] << ")";
  if (c[r - 2] != a[r - 2] || c[r - 1] != b[rb - 1])
    return emitOpError("result shape ")
           << shapeString(c) << " does not match 'lhs' " << shapeString(a)
           << " x 'rhs' " << shapeString(b);
  return success();
}

LogicalResult ContractRowsOp::verify() {
  auto lhs = getLhs().getType(), rhs = getRhs().getType();
  auto res = getResult().getType();
  if (lhs.getRank() < 2 || rhs.getRank() != lhs.getRank())
    return emitOpError("'lhs' ") << lhs << " and 'rhs' " << rhs
                                 << " must have one rank, at least 2 (rows, then a column)";
  if (lhs.getElementType() != rhs.getElementType() ||
      res.getElementType() != lhs.getElementType())
    return emitOpError("element types differ: 'lhs' ")
           << lhs.getElementType() << ", 'rhs' " << rhs.getElementType()
           << ", result " << res.getElementType();
  int64_t r = lhs.getRank();
  ArrayRef<int64_t> a = lhs.getShape(), b = rhs.getShape();
  if (a.drop_back() != b.drop_back())
    return emitOpError("row dimensions differ: 'lhs' ") << shapeString(a) << ", 'rhs' "
                                                      << shapeString(b);
  if (res.getRank() != 2 || res.getDimSize(0) != a[r - 1] || res.getDimSize(1) != b[r - 1])
    return emitOpError("result ") << res << " must be [" << a[r - 1] << ", " << b[r - 1]
                                  << "]";
  return success();
}

//===----------------------------------------------------------------------===//
// Elementwise, shape and indexing ops
//===----------------------------------------------------------------------===//

static bool isInteger(Type t) { return isa<IntegerType, IndexType>(t); }

/// `dims` lists distinct dimensions of a rank-`rank` tensor.
static LogicalResult verifyDimList(Operation *op, ArrayRef<int64_t> dims, int64_t rank,
                                   StringRef what) {
  llvm::SmallDenseSet<int64_t> seen;
  for (int64_t d : dims) {
    if (d < 0 || d >= rank)
      return op->emitOpError() << what << " " << d << " is out of range for rank " << rank;
    if (!seen.insert(d).second)
      return op->emitOpError() << what << " " << d << " appears twice";
  }
  return success();
}

LogicalResult CompareOp::verify() {
  auto lhs = getLhs().getType(), rhs = getRhs().getType(), res = getResult().getType();
  if (lhs != rhs)
    return emitOpError("operand types differ: 'lhs' ") << lhs << ", 'rhs' " << rhs;
  if (res.getShape() != lhs.getShape() || !res.getElementType().isInteger(1))
    return emitOpError("result must be an i1 tensor of shape ")
           << shapeString(lhs.getShape()) << ", got " << res;
  return success();
}

LogicalResult SelectOp::verify() {
  auto cond = getCond().getType(), res = getResult().getType();
  if (cond.getShape() != res.getShape() || !cond.getElementType().isInteger(1))
    return emitOpError("'cond' must be an i1 tensor of shape ")
           << shapeString(res.getShape()) << ", got " << cond;
  return success();
}

LogicalResult CastOp::verify() {
  auto in = getInput().getType(), res = getResult().getType();
  if (in.getShape() != res.getShape())
    return emitOpError("cast changes the shape: ") << in << " to " << res;
  return success();
}

LogicalResult IotaOp::verify() {
  auto res = getResult().getType();
  if (getDim() < 0 || static_cast<int64_t>(getDim()) >= res.getRank())
    return emitOpError("dim ") << getDim() << " is out of range for " << res;
  if (!isInteger(res.getElementType()) && !isa<FloatType>(res.getElementType()))
    return emitOpError("result element type must be an integer or float, got ") << res;
  return success();
}

LogicalResult BroadcastOp::verify() {
  auto in = getInput().getType(), res = getResult().getType();
  if (in.getRank() != res.getRank() || in.getElementType() != res.getElementType())
    return emitOpError("'input' ") << in << " and result " << res
                                   << " must have the same rank and element type";
  for (int64_t d = 0; d < in.getRank(); ++d)
    if (in.getDimSize(d) != res.getDimSize(d) && in.getDimSize(d) != 1)
      return emitOpError("dimension ") << d << " of 'input' " << in
                                       << " has size " << in.getDimSize(d)
                                       << "; only size-1 dimensions broadcast (to "
                                       << res.getDimSize(d) << ")";
  return success();
}

LogicalResult ReduceOp::verify() {
  auto in = getInput().getType(), res = getResult().getType();
  if (in.getRank() != res.getRank() || in.getElementType() != res.getElementType())
    return emitOpError("'input' ") << in << " and result " << res
                                   << " must have the same rank and element type "
                                      "(reduced dimensions are kept with size 1)";
  if (failed(verifyDimList(*this, getDims(), in.getRank(), "reduced dimension")))
    return failure();
  for (int64_t d = 0; d < in.getRank(); ++d) {
    int64_t want = llvm::is_contained(getDims(), d) ? 1 : in.getDimSize(d);
    if (res.getDimSize(d) != want)
      return emitOpError("result dimension ") << d << " must be " << want << ", got "
                                              << res.getDimSize(d);
  }
  return success();
}

LogicalResult ReshapeOp::verify() {
  auto in = getInput().getType(), res = getResult().getType();
  if (in.getElementType() != res.getElementType())
    return emitOpError("element types differ: ") << in << " to " << res;
  if (in.getNumElements() != res.getNumElements())
    return emitOpError("cannot reshape ") << in << " (" << in.getNumElements()
                                          << " elements) to " << res << " ("
                                          << res.getNumElements() << " elements)";
  return success();
}

LogicalResult TransposeOp::verify() {
  auto in = getInput().getType(), res = getResult().getType();
  ArrayRef<int64_t> perm = getPerm();
  if (static_cast<int64_t>(perm.size()) != in.getRank() || res.getRank() != in.getRank())
    return emitOpError("perm must have one entry per dimension of ") << in;
  if (failed(verifyDimList(*this, perm, in.getRank(), "perm entry")))
    return failure();
  for (int64_t d = 0; d < in.getRank(); ++d)
    if (res.getDimSize(d) != in.getDimSize(perm[d]))
      return emitOpError("result dimension ") << d << " must be 'input' dimension "
                                              << perm[d] << " (" << in.getDimSize(perm[d])
                                              << "), got " << res.getDimSize(d);
  if (in.getElementType() != res.getElementType())
    return emitOpError("element types differ");
  return success();
}

/// `small` fits in `big` at `offsets` (slice: small is the result; pad: the input).
static LogicalResult verifyBox(Operation *op, RankedTensorType small, RankedTensorType big,
                               ArrayRef<int64_t> offsets) {
  if (small.getRank() != big.getRank() || small.getElementType() != big.getElementType())
    return op->emitOpError() << small << " and " << big
                             << " must have the same rank and element type";
  if (static_cast<int64_t>(offsets.size()) != big.getRank())
    return op->emitOpError("offsets must have one entry per dimension");
  for (int64_t d = 0; d < big.getRank(); ++d)
    if (offsets[d] < 0 || offsets[d] + small.getDimSize(d) > big.getDimSize(d))
      return op->emitOpError("dimension ") << d << ": [" << offsets[d] << ", "
                                           << offsets[d] + small.getDimSize(d)
                                           << ") is outside [0, " << big.getDimSize(d) << ")";
  return success();
}

LogicalResult SliceOp::verify() {
  return verifyBox(*this, getResult().getType(), getInput().getType(), getOffsets());
}

LogicalResult PadOp::verify() {
  return verifyBox(*this, getInput().getType(), getResult().getType(), getOffsets());
}

LogicalResult ConcatOp::verify() {
  auto res = getResult().getType();
  int64_t dim = static_cast<int64_t>(getDim());
  if (getInputs().empty())
    return emitOpError("needs at least one input");
  if (dim < 0 || dim >= res.getRank())
    return emitOpError("dim ") << dim << " is out of range for " << res;
  int64_t total = 0;
  for (auto [i, v] : llvm::enumerate(getInputs())) {
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getRank() != res.getRank() || t.getElementType() != res.getElementType())
      return emitOpError("input #") << i << " " << t << " must have the rank and element type of "
                                    << res;
    for (int64_t d = 0; d < res.getRank(); ++d)
      if (d != dim && t.getDimSize(d) != res.getDimSize(d))
        return emitOpError("input #") << i << " " << t << " differs from the result "
                                      << res << " in dimension " << d;
    total += t.getDimSize(dim);
  }
  if (total != res.getDimSize(dim))
    return emitOpError("inputs add up to ") << total << " along dim " << dim
                                            << ", result has " << res.getDimSize(dim);
  return success();
}

/// Shared by gather and scatter_add: `rows` is [I..., D...] indexed by
/// `indices` [I...] (any rank: token ids [B, S] stay [B, S], so a split of
/// either dimension carries over) into `table` [V, D...].
static LogicalResult verifyRowIndexing(Operation *op, RankedTensorType table,
                                       RankedTensorType indices, RankedTensorType rows) {
  if (!isInteger(indices.getElementType()))
    return op->emitOpError("'indices' must be an integer tensor, got ") << indices;
  int64_t n = indices.getRank();
  if (table.getRank() < 1 || rows.getRank() != n + table.getRank() - 1 ||
      rows.getElementType() != table.getElementType())
    return op->emitOpError("table ") << table << " and rows " << rows
                                     << " must have one element type, and rows the indices' "
                                        "dimensions then the table's row shape";
  for (int64_t d = 0; d < n; ++d)
    if (rows.getDimSize(d) != indices.getDimSize(d))
      return op->emitOpError("rows ") << rows << " must have one row per index ("
                                      << indices << ")";
  for (int64_t d = 1; d < table.getRank(); ++d)
    if (rows.getDimSize(n + d - 1) != table.getDimSize(d))
      return op->emitOpError("row shape differs: table ") << table << ", rows " << rows;
  return success();
}

LogicalResult GatherOp::verify() {
  return verifyRowIndexing(*this, getTable().getType(), getIndices().getType(),
                           getResult().getType());
}

LogicalResult ScatterAddOp::verify() {
  return verifyRowIndexing(*this, getResult().getType(), getIndices().getType(),
                           getUpdates().getType());
}

//===----------------------------------------------------------------------===//
// Value checks
//===----------------------------------------------------------------------===//

LogicalResult CheckRangeOp::verify() {
  RankedTensorType type = getInput().getType();
  if (!type.getElementType().isSignlessInteger())
    return emitOpError("'input' must be a tensor of integers, got ") << type;
  int64_t low = getLow(), high = getHigh();
  if (low > high)
    return emitOpError("range [") << low << ", " << high << ") has its bounds reversed";
  if (std::optional<ArrayRef<int64_t>> allowed = getAllowed()) {
    if (allowed->empty())
      return emitOpError("'allowed' must not be empty (leave it out)");
    for (int64_t v : *allowed)
      if (v >= low && v < high)
        return emitOpError("allowed value ") << v << " is already in [" << low << ", "
                                             << high << ")";
  }
  StringRef message = getMessage();
  if (!message.contains("{row}") || !message.contains("{value}"))
    return emitOpError("'message' must name the failing element's {row} and {value}");
  if (getRowAxes() && type.getRank() < 1)
    return emitOpError("'row_axes' needs a tensor with rows, got ") << type;
  if (getRowAxes() && getDimAxes())
    return emitOpError("'row_axes' and 'dim_axes' both given: name the split rows or every "
                       "dimension's axes, not both");
  if (auto axes = getDimAxes(); axes && static_cast<int64_t>(axes->size()) != type.getRank())
    return emitOpError("'dim_axes' must have one entry per dimension of ") << type << ", got "
                                                                          << axes->size();
  return success();
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

static bool isI32(Type t) { return t.isSignlessInteger(32); }

LogicalResult TopKOp::verify() {
  auto in = getInput().getType();
  auto out = getIndices().getType();
  if (in.getRank() < 1 || !isa<FloatType>(in.getElementType()))
    return emitOpError("'input' must be a float tensor of rank >= 1, got ") << in;
  int64_t n = in.getDimSize(in.getRank() - 1), k = getK();
  if (k < 1 || k > n)
    return emitOpError("k = ") << k << " must be in [1, " << n << "] (the last dimension)";
  SmallVector<int64_t> shape(in.getShape());
  shape.back() = k;
  if (!isI32(out.getElementType()) || out.getShape() != ArrayRef<int64_t>(shape))
    return emitOpError("result must be tensor<") << shapeString(shape) << "xi32>, got " << out;
  return success();
}

/// The rows of the dispatch layout of a dispatch or collect op (`experts[T,
/// k]` over `num_experts` experts with `capacity` (0: dropless) in `blocks`
/// blocks), after checking the attributes and the optional `base[k, E]`.
template <typename DispatchOrCollect>
static FailureOr<int64_t> verifyDispatchLayout(DispatchOrCollect op) {
  RankedTensorType experts = op.getExperts().getType();
  Value base = op.getBase();
  int64_t numExperts = op.getNumExperts(), capacity = op.getCapacity(), blocks = op.getBlocks();
  if (experts.getRank() != 2 || !isI32(experts.getElementType()))
    return op->emitOpError("'experts' must be a [tokens, k] i32 tensor, got ") << experts;
  int64_t tokens = experts.getDimSize(0), k = experts.getDimSize(1);
  if (numExperts < 1 || k > numExperts)
    return op->emitOpError("experts ") << numExperts << " must be >= k = " << k;
  if (capacity < 0)
    return op->emitOpError("capacity ") << capacity << " must be >= 0 (0: dropless)";
  if (blocks < 1 || numExperts % blocks != 0)
    return op->emitOpError("blocks = ") << blocks << " must divide the " << numExperts
                                        << " experts";
  if (base) {
    auto want = RankedTensorType::get({k, numExperts}, experts.getElementType());
    if (cast<RankedTensorType>(base.getType()) != want)
      return op->emitOpError("'base' must be ") << want << ", got " << base.getType();
  }
  int64_t rows = tokens * k;
  return blocks * (capacity == 0 ? rows : std::min(rows, numExperts / blocks * capacity));
}

/// `rows[N, D...]`, checked against the layout's row count and the feature
/// shape `features` (D...) and element type of the token side.
static LogicalResult verifyDispatchRows(Operation *op, RankedTensorType rowsType, int64_t n,
                                        ArrayRef<int64_t> features, Type element) {
  SmallVector<int64_t> want{n};
  want.append(features.begin(), features.end());
  auto wanted = RankedTensorType::get(want, element);
  if (rowsType != wanted)
    return op->emitOpError("rows must be ") << wanted << " for this routing, got " << rowsType;
  return success();
}

LogicalResult MoeDispatchOp::verify() {
  auto experts = getExperts().getType();
  auto rows = verifyDispatchLayout(*this);
  if (failed(rows))
    return failure();
  auto in = getInput().getType();
  int64_t tokens = experts.getDimSize(0), k = experts.getDimSize(1);
  bool perToken = in.getRank() == 2 && in.getDimSize(0) == tokens;
  bool perChoice = in.getRank() == 3 && in.getDimSize(0) == tokens && in.getDimSize(1) == k;
  if (!perToken && !perChoice)
    return emitOpError("'input' must be [") << tokens << ", D] or [" << tokens << ", " << k
                                            << ", D] for 'experts' " << experts << ", got " << in;
  ArrayRef<int64_t> features = in.getShape().drop_front(perChoice ? 2 : 1);
  if (failed(verifyDispatchRows(*this, getRows().getType(), *rows, features,
                                in.getElementType())))
    return failure();
  auto sizes = getSizes().getType();
  if (sizes.getRank() != 1 || sizes.getDimSize(0) != getNumExperts() || !isI32(sizes.getElementType()))
    return emitOpError("'sizes' must be tensor<") << getNumExperts() << "xi32>, got " << sizes;
  return success();
}

LogicalResult MoeCollectOp::verify() {
  auto experts = getExperts().getType();
  auto rows = verifyDispatchLayout(*this);
  if (failed(rows))
    return failure();
  auto out = getResult().getType();
  SmallVector<int64_t> lead{experts.getDimSize(0), experts.getDimSize(1)};
  if (out.getRank() != 3 || out.getShape().take_front(2) != ArrayRef<int64_t>(lead))
    return emitOpError("result must be [") << lead[0] << ", " << lead[1] << ", D], got " << out;
  return verifyDispatchRows(*this, getRows().getType(), *rows, out.getShape().drop_front(2),
                            out.getElementType());
}

/// `sizes` of a grouped op: integers, `[S]` or `[B, S]` (B blocks of the
/// `rows`), S a multiple of the number of groups.
static LogicalResult verifySegments(Operation *op, RankedTensorType sizes, int64_t groups,
                                    int64_t rows) {
  if ((sizes.getRank() != 1 && sizes.getRank() != 2) || !isInteger(sizes.getElementType()))
    return op->emitOpError("'sizes' must be a [S] or [blocks, S] integer tensor, got ") << sizes;
  int64_t segments = sizes.getDimSize(sizes.getRank() - 1);
  if (groups < 1 || segments % groups != 0)
    return op->emitOpError("'sizes' has ") << segments << " segments, not a multiple of the "
                                           << groups << " groups";
  if (sizes.getRank() == 2 && (sizes.getDimSize(0) < 1 || rows % sizes.getDimSize(0) != 0))
    return op->emitOpError("'sizes' has ") << sizes.getDimSize(0) << " blocks, which do not "
                                           << "divide the " << rows << " rows";
  return success();
}

LogicalResult GroupedMatmulOp::verify() {
  auto lhs = getLhs().getType(), rhs = getRhs().getType(), out = getResult().getType();
  if (lhs.getRank() != 2 || rhs.getRank() != 3)
    return emitOpError("operands must be lhs [N, K] and rhs [G, K, M], got ") << lhs << " and "
                                                                            << rhs;
  if (lhs.getElementType() != rhs.getElementType() || out.getElementType() != lhs.getElementType())
    return emitOpError("operands and result must have one element type");
  int64_t k = rhs.getDimSize(getTransposeRhs() ? 2 : 1), m = rhs.getDimSize(getTransposeRhs() ? 1 : 2);
  if (k != lhs.getDimSize(1))
    return emitOpError("contracting dimensions differ: lhs ") << lhs << ", rhs " << rhs
                                                              << (getTransposeRhs() ? " (transposed)" : "");
  if (out.getShape() != ArrayRef<int64_t>{lhs.getDimSize(0), m})
    return emitOpError("result must be [") << lhs.getDimSize(0) << ", " << m << "], got " << out;
  return verifySegments(*this, getSizes().getType(), rhs.getDimSize(0), lhs.getDimSize(0));
}

LogicalResult GroupedOuterOp::verify() {
  auto lhs = getLhs().getType(), rhs = getRhs().getType(), out = getResult().getType();
  if (lhs.getRank() != 2 || rhs.getRank() != 2 || lhs.getDimSize(0) != rhs.getDimSize(0))
    return emitOpError("operands must be lhs [N, K] and rhs [N, M], got ") << lhs << " and " << rhs;
  if (out.getRank() != 3 || out.getDimSize(1) != lhs.getDimSize(1) ||
      out.getDimSize(2) != rhs.getDimSize(1))
    return emitOpError("result must be [G, ") << lhs.getDimSize(1) << ", " << rhs.getDimSize(1)
                                              << "], got " << out;
  if (lhs.getElementType() != rhs.getElementType() || out.getElementType() != lhs.getElementType())
    return emitOpError("operands and result must have one element type");
  return verifySegments(*this, getSizes().getType(), out.getDimSize(0), lhs.getDimSize(0));
}

//===----------------------------------------------------------------------===//
// Dynamic slices
//===----------------------------------------------------------------------===//

/// `start` is an i32 scalar and `dim` a dimension of `x`; `block` (the
/// slice or the update) has `x`'s rank, element type and shape but along
/// `dim`, where it is at most `x`'s.
static LogicalResult verifyDynamicSlice(Operation *op, RankedTensorType x, Type start,
                                        RankedTensorType block, StringRef name, int64_t dim) {
  auto s = dyn_cast<RankedTensorType>(start);
  if (!s || s.getRank() != 0 || !s.getElementType().isInteger(32))
    return op->emitOpError("'start' must be an i32 scalar tensor, got ") << start;
  if (dim < 0 || dim >= x.getRank())
    return op->emitOpError("'dim' ") << dim << " is not a dimension of " << x;
  bool ok = block.getRank() == x.getRank() && block.getElementType() == x.getElementType() &&
            block.getDimSize(dim) <= x.getDimSize(dim);
  for (int64_t d = 0; ok && d < x.getRank(); ++d)
    ok = d == dim || block.getDimSize(d) == x.getDimSize(d);
  if (!ok)
    return op->emitOpError("'") << name << "' must have the shape of 'x' " << x
                                << " but along dim " << dim << " (at most its size), got "
                                << block;
  return success();
}

LogicalResult DynamicSliceOp::verify() {
  return verifyDynamicSlice(*this, getX().getType(), getStart().getType(),
                            getResult().getType(), "result", getDim());
}

LogicalResult DynamicUpdateSliceOp::verify() {
  if (getResult().getType() != getX().getType())
    return emitOpError("'result' must have the type of 'x' ") << getX().getType() << ", got "
                                                               << getResult().getType();
  return verifyDynamicSlice(*this, getX().getType(), getStart().getType(),
                            getUpdate().getType(), "update", getDim());
}

//===----------------------------------------------------------------------===//
// Dropout
//===----------------------------------------------------------------------===//

LogicalResult DropoutOp::verify() {
  auto x = getX().getType();
  if (!isa<FloatType>(x.getElementType()))
    return emitOpError("'x' must be a floating-point tensor, got ") << x;
  auto key = dyn_cast<RankedTensorType>(getKey().getType());
  if (!key || key.getShape() != ArrayRef<int64_t>{2} || !key.getElementType().isInteger(64))
    return emitOpError("'key' must be the tensor<2xi64> [seed, step], got ") << getKey().getType();
  double p = getP().convertToDouble();
  if (!(p > 0.0 && p < 1.0))
    return emitOpError("'p' must lie in (0, 1), got ") << p;
  if (auto axes = getDimAxes(); axes && static_cast<int64_t>(axes->size()) != x.getRank())
    return emitOpError("'dim_axes' must have one entry per dimension of ") << x << ", got "
                                                                         << axes->size();
  return success();
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

/// The leading (batch, head) dimensions of an attention operand whose
/// sequence runs along `seqDim`: every dimension but that and the last.
static SmallVector<int64_t> attentionLead(RankedTensorType t, int64_t seqDim) {
  SmallVector<int64_t> lead;
  for (int64_t d = 0; d + 1 < t.getRank(); ++d)
    if (d != seqDim)
      lead.push_back(t.getDimSize(d));
  return lead;
}

/// f32, or f64 for f64 operands: the element type of attention's row
/// statistics (lse, delta) and of its additive mask.
static Type attentionStatistic(Operation *op, RankedTensorType q) {
  return q.getElementType().isF64() ? Type(Float64Type::get(op->getContext()))
                                    : Type(Float32Type::get(op->getContext()));
}

/// `[L..., rows, cols]` where each `L` is 1 or `q`'s leading dimension.
static LogicalResult verifyAttentionSide(Operation *op, StringRef name, RankedTensorType t,
                                         ArrayRef<int64_t> lead, ArrayRef<int64_t> rows,
                                         int64_t cols, Type element) {
  auto describe = [&]() {
    auto diag = op->emitOpError("'") << name << "' must be [";
    for (int64_t l : lead)
      diag << "1|" << l << ", ";
    for (auto [i, r] : llvm::enumerate(rows))
      diag << (i ? "|" : "") << r;
    diag << ", " << cols << "] of " << element << ", got " << t;
    return diag;
  };
  if (t.getRank() != static_cast<int64_t>(lead.size()) + 2 || t.getElementType() != element)
    return describe();
  for (auto [i, l] : llvm::enumerate(lead))
    if (t.getDimSize(i) != 1 && t.getDimSize(i) != l)
      return describe();
  if (!llvm::is_contained(rows, t.getDimSize(lead.size())) || t.getDimSize(lead.size() + 1) != cols)
    return describe();
  return success();
}

/// Checks the operands of an attention op: `q[..., Sq, D]`, `k[..., Sk, D]`,
/// `v[..., Sk, Dv]` of one float element type whose leading dimensions
/// divide `q`'s; the optional mask and segment ids; the scale (positive),
/// the sequence dimension (any but the last) and the window (with causal).
static LogicalResult verifyAttentionOperands(Operation *op, RankedTensorType q,
                                             RankedTensorType k, RankedTensorType v,
                                             Value mask, Value qSegments, Value kvSegments,
                                             bool causal, std::optional<uint64_t> window,
                                             std::optional<APFloat> softcap,
                                             const APFloat &scale,
                                             std::optional<uint64_t> seqDimAttr) {
  if (q.getRank() < 2)
    return op->emitOpError("'q' must be [..., S, D], got ") << q;
  int64_t rank = q.getRank();
  if (seqDimAttr && (static_cast<int64_t>(*seqDimAttr) < 0 ||
                     static_cast<int64_t>(*seqDimAttr) >= rank - 1))
    return op->emitOpError("'seq_dim' must be a dimension of 'q' ")
           << q << " before its last, got " << static_cast<int64_t>(*seqDimAttr);
  int64_t seqDim = seqDimAttr ? static_cast<int64_t>(*seqDimAttr) : rank - 2;
  if (!isa<FloatType>(q.getElementType()))
    return op->emitOpError("operands must be float tensors, got ") << q;
  SmallVector<int64_t> lead = attentionLead(q, seqDim);
  if (k.getRank() != rank || k.getElementType() != q.getElementType() ||
      k.getDimSize(rank - 1) != q.getDimSize(rank - 1))
    return op->emitOpError("'k' must be [..., Sk, D] with the rank, head width and element "
                           "type of 'q' ")
           << q << ", got " << k;
  SmallVector<int64_t> kvLead = attentionLead(k, seqDim);
  for (auto [ql, kl] : llvm::zip(lead, kvLead))
    if (kl <= 0 || ql % kl != 0)
      return op->emitOpError("each leading dimension of 'k' ")
             << k << " must divide 'q''s " << q << " (grouped heads)";
  if (v.getRank() != rank || v.getShape().drop_back() != k.getShape().drop_back() ||
      v.getElementType() != q.getElementType())
    return op->emitOpError("'v' must be [..., Sk, Dv] with the leading dimensions and element "
                           "type of 'k' ")
           << k << ", got " << v;
  if (scale.convertToDouble() <= 0)
    return op->emitOpError("'scale' must be positive, got ") << scale.convertToDouble();
  if (softcap && !(softcap->convertToDouble() > 0))
    return op->emitOpError("'softcap' must be positive, got ") << softcap->convertToDouble();
  if (window && (!causal || static_cast<int64_t>(*window) < 1))
    return op->emitOpError("'window' must be at least 1 and needs 'causal', got ")
           << static_cast<int64_t>(*window);
  int64_t sq = q.getDimSize(seqDim), sk = k.getDimSize(seqDim);
  if (mask && failed(verifyAttentionSide(op, "mask", cast<RankedTensorType>(mask.getType()),
                                         lead, {sq, 1}, sk, attentionStatistic(op, q))))
    return failure();
  if (static_cast<bool>(qSegments) != static_cast<bool>(kvSegments))
    return op->emitOpError("'q_segments' and 'kv_segments' come together");
  auto i32 = IntegerType::get(op->getContext(), 32);
  if (qSegments &&
      (failed(verifyAttentionSide(op, "q_segments", cast<RankedTensorType>(qSegments.getType()),
                                  lead, {sq}, 1, i32)) ||
       failed(verifyAttentionSide(op, "kv_segments",
                                  cast<RankedTensorType>(kvSegments.getType()), lead, {sk}, 1,
                                  i32))))
    return failure();
  return success();
}

/// `[..., Sq, 1]` f32 (f64 for f64 operands): the per-row statistics of
/// attention (lse, delta).
static LogicalResult verifyRowStatistic(Operation *op, StringRef name, RankedTensorType q,
                                        Type t) {
  SmallVector<int64_t> shape(q.getShape().drop_back());
  shape.push_back(1);
  auto expected = RankedTensorType::get(shape, attentionStatistic(op, q));
  if (t != expected)
    return op->emitOpError("'") << name << "' must be " << expected << ", got " << t;
  return success();
}

/// The operand checks of an attention op (`AttentionOp`, `AttentionGradOp`)
/// and the type of its output `[..., Sq, Dv]` (`out`, `dout`).
/// Attention dropout: `dropout_p` in (0, 1) and the i64 seeds `[L..., 1, 3]`
/// (L: q's leading dimensions, `seq_dim` left out), both or neither.
template <typename AttentionLike>
static LogicalResult verifyAttentionDropout(AttentionLike op, RankedTensorType q) {
  auto rate = op.getDropoutPAttr();
  Value seeds = op.getDropoutSeeds();
  if (!rate && !seeds)
    return success();
  if (!rate || !seeds)
    return op.emitOpError("'dropout_p' and 'dropout(%seeds)' go together");
  double p = rate.getValueAsDouble();
  if (!(p > 0.0 && p < 1.0))
    return op.emitOpError("'dropout_p' must lie in (0, 1), got ") << p;
  int64_t seqDim = op.getSeqDim() ? static_cast<int64_t>(*op.getSeqDim()) : q.getRank() - 2;
  SmallVector<int64_t> want;
  for (int64_t d = 0; d + 1 < q.getRank(); ++d)
    if (d != seqDim)
      want.push_back(q.getDimSize(d));
  want.append({1, 3});
  auto got = cast<RankedTensorType>(seeds.getType());
  auto wantType = RankedTensorType::get(want, IntegerType::get(op.getContext(), 64));
  if (got != wantType)
    return op.emitOpError("'dropout' seeds must be ")
           << wantType << " ((seed, step, head) per head of " << q << "), got " << got;
  return success();
}

template <typename AttentionLike>
static FailureOr<RankedTensorType> verifyAttentionOf(AttentionLike op) {
  auto q = op.getQ().getType(), k = op.getK().getType(), v = op.getV().getType();
  std::optional<APFloat> softcap;
  if (auto cap = op.getSoftcapAttr())
    softcap = cap.getValue();
  if (failed(verifyAttentionOperands(op, q, k, v, op.getMask(), op.getQSegments(),
                                     op.getKvSegments(), op.getCausal(), op.getWindow(), softcap,
                                     op.getScale(), op.getSeqDim())))
    return failure();
  if (failed(verifyAttentionDropout(op, q)))
    return failure();
  SmallVector<int64_t> outShape(q.getShape().drop_back());
  outShape.push_back(v.getDimSize(v.getRank() - 1));
  return RankedTensorType::get(outShape, q.getElementType());
}

LogicalResult AttentionOp::verify() {
  FailureOr<RankedTensorType> out = verifyAttentionOf(*this);
  if (failed(out))
    return failure();
  if (getOut().getType() != *out)
    return emitOpError("'out' must be ") << *out << ", got " << getOut().getType();
  return verifyRowStatistic(*this, "lse", getQ().getType(), getLse().getType());
}

LogicalResult AttentionGradOp::verify() {
  auto q = getQ().getType(), k = getK().getType(), v = getV().getType();
  FailureOr<RankedTensorType> out = verifyAttentionOf(*this);
  if (failed(out))
    return failure();
  if (getDout().getType() != *out)
    return emitOpError("'dout' must be ") << *out << ", got " << getDout().getType();
  if (failed(verifyRowStatistic(*this, "lse", q, getLse().getType())) ||
      failed(verifyRowStatistic(*this, "delta", q, getDelta().getType())))
    return failure();
  if (getDq().getType() != q || getDk().getType() != k || getDv().getType() != v)
    return emitOpError("results must have the types of 'q', 'k' and 'v'");
  return success();
}

LogicalResult GradOp::verify() {
  auto loss = getLoss().getType();
  if (loss.getRank() != 0 || !isa<FloatType>(loss.getElementType()))
    return emitOpError("'loss' must be a float scalar (tensor<f32>), got ") << loss;
  if (getWrt().size() != getGrads().size())
    return emitOpError("needs one result per 'wrt' value");
  for (auto [i, pair] : llvm::enumerate(llvm::zip(getWrt(), getGrads()))) {
    auto [w, g] = pair;
    if (w.getType() != g.getType())
      return emitOpError("gradient #") << i << " has type " << g.getType()
                                       << " but its 'wrt' value has type " << w.getType();
    if (!isa<FloatType>(cast<RankedTensorType>(w.getType()).getElementType()))
      return emitOpError("'wrt' value #") << i << " has type " << w.getType()
                                          << "; only float tensors have gradients";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

/// Looks up `axis` of `meshRef`; reports an error on `op` if either is unknown.
static FailureOr<int64_t> lookupAxisSize(Operation *op, SymbolTableCollection *symbols,
                                         FlatSymbolRefAttr meshRef, StringRef axis) {
  MeshOp mesh = symbols ? symbols->lookupNearestSymbolFrom<MeshOp>(op, meshRef)
                        : SymbolTable::lookupNearestSymbolFrom<MeshOp>(op, meshRef);
  if (!mesh) {
    op->emitOpError("refers to unknown mesh ") << meshRef;
    return failure();
  }
  std::optional<int64_t> size = mesh.getGroupSize(axis);
  if (!size) {
    op->emitOpError("mesh ") << meshRef << " has no axis '" << axis << "'";
    return failure();
  }
  return *size;
}

/// Checks that `result` is `input` with dimension `dim` multiplied (gather) or
/// divided (scatter) by the axis size.
static LogicalResult verifyResizedDim(Operation *op, RankedTensorType input,
                                      RankedTensorType result, int64_t dim,
                                      int64_t axisSize, bool gather) {
  if (input.getRank() != result.getRank() ||
      input.getElementType() != result.getElementType())
    return op->emitOpError("result ") << result << " must have the rank and element type of 'input' " << input;
  if (dim < 0 || dim >= input.getRank())
    return op->emitOpError("dim ") << dim << " is out of range for 'input' " << input;
  for (int64_t d = 0; d < input.getRank(); ++d) {
    int64_t in = input.getDimSize(d), out = result.getDimSize(d);
    if (d != dim) {
      if (in != out)
        return op->emitOpError("dimension ") << d << " of result (" << out
                                             << ") must equal that of 'input' (" << in << ")";
      continue;
    }
    if (gather && out != in * axisSize)
      return op->emitOpError("gathered dimension ")
             << d << " must be " << in << " x " << axisSize << " = " << in * axisSize
             << ", got " << out;
    if (!gather && in % axisSize != 0)
      return op->emitOpError("scattered dimension ")
             << d << " of 'input' (" << in << ") does not split evenly over "
             << axisSize << " ranks";
    if (!gather && out != in / axisSize)
      return op->emitOpError("scattered dimension ")
             << d << " must be " << in << " / " << axisSize << " = " << in / axisSize
             << ", got " << out;
  }
  return success();
}

LogicalResult AllReduceOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return lookupAxisSize(*this, &symbols, getMeshAttr(), getAxis());
}
int64_t AllReduceOp::getAxisSize() {
  return *lookupAxisSize(*this, nullptr, getMeshAttr(), getAxis());
}

LogicalResult AllGatherOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = lookupAxisSize(*this, &symbols, getMeshAttr(), getAxis());
  if (failed(size))
    return failure();
  return verifyResizedDim(*this, getInput().getType(), getResult().getType(),
                          static_cast<int64_t>(getDim()), *size, /*gather=*/true);
}
int64_t AllGatherOp::getAxisSize() {
  return *lookupAxisSize(*this, nullptr, getMeshAttr(), getAxis());
}

LogicalResult ReduceScatterOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = lookupAxisSize(*this, &symbols, getMeshAttr(), getAxis());
  if (failed(size))
    return failure();
  return verifyResizedDim(*this, getInput().getType(), getResult().getType(),
                          static_cast<int64_t>(getDim()), *size, /*gather=*/false);
}
int64_t ReduceScatterOp::getAxisSize() {
  return *lookupAxisSize(*this, nullptr, getMeshAttr(), getAxis());
}

LogicalResult AllToAllOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = lookupAxisSize(*this, &symbols, getMeshAttr(), getAxis());
  if (failed(size))
    return failure();
  RankedTensorType input = getInput().getType(), result = getResult().getType();
  int64_t split = static_cast<int64_t>(getSplitDim());
  int64_t concat = static_cast<int64_t>(getConcatDim());
  if (input.getRank() != result.getRank() ||
      input.getElementType() != result.getElementType())
    return emitOpError("result ") << result << " must have the rank and element type of 'input' " << input;
  for (int64_t d : {split, concat})
    if (d < 0 || d >= input.getRank())
      return emitOpError("dim ") << d << " is out of range for 'input' " << input;
  if (split == concat)
    return emitOpError("split_dim and concat_dim must differ (both are ") << split << ")";
  if (input.getDimSize(split) % *size != 0)
    return emitOpError("split_dim ") << split << " of 'input' (" << input.getDimSize(split)
                                     << ") does not split evenly over " << *size << " ranks";
  for (int64_t d = 0; d < input.getRank(); ++d) {
    int64_t want = d == split    ? input.getDimSize(d) / *size
                   : d == concat ? input.getDimSize(d) * *size
                                 : input.getDimSize(d);
    if (result.getDimSize(d) != want)
      return emitOpError("dimension ") << d << " of result must be " << want << ", got "
                                       << result.getDimSize(d);
  }
  if (auto channels = getChannels(); channels && (*channels < 1 || *channels > 64))
    return emitOpError("'channels' must be 1 to 64, got ") << *channels;
  if (getCounts().empty())
    return success();
  if (getCounts().size() != 2)
    return emitOpError("'counts' must be (send, receive), got ") << getCounts().size()
                                                                 << " operands";
  for (auto [i, count] : llvm::enumerate(getCounts())) {
    auto type = llvm::dyn_cast<RankedTensorType>(count.getType());
    if (!type || type.getRank() != 1 || type.getDimSize(0) != *size ||
        !type.getElementType().isInteger(32))
      return emitOpError("'counts' #") << i << " must be tensor<" << *size << "xi32> (one count "
                                       << "per rank of '" << getAxis() << "'), got "
                                       << count.getType();
  }
  int64_t last = input.getRank() - 1;
  if (split == last || concat == last)
    return emitOpError("with 'counts' the last dimension (a row) must be neither split_dim nor "
                       "concat_dim");
  for (int64_t d = 0; d < split; ++d)
    if (input.getDimSize(d) != 1)
      return emitOpError("with 'counts' the pieces must be contiguous: dimension ")
             << d << " of 'input' (before split_dim) must be 1, got " << input.getDimSize(d);
  for (int64_t d = 0; d < concat; ++d)
    if (result.getDimSize(d) != 1)
      return emitOpError("with 'counts' the pieces must be contiguous: dimension ")
             << d << " of the result (before concat_dim) must be 1, got " << result.getDimSize(d);
  return success();
}
int64_t AllToAllOp::getAxisSize() {
  return *lookupAxisSize(*this, nullptr, getMeshAttr(), getAxis());
}

LogicalResult AxisSliceOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = lookupAxisSize(*this, &symbols, getMeshAttr(), getAxis());
  if (failed(size))
    return failure();
  return verifyResizedDim(*this, getInput().getType(), getResult().getType(),
                          static_cast<int64_t>(getDim()), *size, /*gather=*/false);
}
int64_t AxisSliceOp::getAxisSize() {
  return *lookupAxisSize(*this, nullptr, getMeshAttr(), getAxis());
}

LogicalResult RingShiftOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = lookupAxisSize(*this, &symbols, getMeshAttr(), getAxis());
  if (failed(size))
    return failure();
  int64_t offset = static_cast<int64_t>(getOffset());
  if (offset < 1 || offset >= *size)
    return emitOpError("offset ") << offset << " must be 1 to " << *size - 1 << " (axis '"
                                  << getAxis() << "' has " << *size << " ranks)";
  return success();
}
int64_t RingShiftOp::getAxisSize() {
  return *lookupAxisSize(*this, nullptr, getMeshAttr(), getAxis());
}

LogicalResult TransferOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = lookupAxisSize(*this, &symbols, getMeshAttr(), getAxis());
  if (failed(size))
    return failure();
  int64_t from = static_cast<int64_t>(getFrom());
  if (from < 0 || from >= *size)
    return emitOpError("'from' ") << from << " is not a rank of axis '" << getAxis()
                                  << "' (size " << *size << ")";
  if (std::optional<uint64_t> to = getTo()) {
    int64_t dest = static_cast<int64_t>(*to);
    if (dest < 0 || dest >= *size)
      return emitOpError("'to' ") << dest << " is not a rank of axis '" << getAxis()
                                  << "' (size " << *size << ")";
    if (dest == from)
      return emitOpError("sends rank ") << from << " a value it already holds";
  }
  return success();
}
int64_t TransferOp::getAxisSize() {
  return *lookupAxisSize(*this, nullptr, getMeshAttr(), getAxis());
}

/// A point-to-point peer: a coordinate of the op's mesh axis.
template <typename OpT>
static LogicalResult verifyPeer(OpT op, SymbolTableCollection &symbols, int64_t peer,
                                StringRef which) {
  FailureOr<int64_t> size = lookupAxisSize(op, &symbols, op.getMeshAttr(), op.getAxis());
  if (failed(size))
    return failure();
  if (peer < 0 || peer >= *size)
    return op.emitOpError("'") << which << "' " << peer << " is not a rank of axis '"
                               << op.getAxis() << "' (size " << *size << ")";
  return success();
}

LogicalResult SendOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyPeer(*this, symbols, static_cast<int64_t>(getTo()), "to");
}
int64_t SendOp::getAxisSize() {
  return *lookupAxisSize(*this, nullptr, getMeshAttr(), getAxis());
}

LogicalResult RecvOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyPeer(*this, symbols, static_cast<int64_t>(getFrom()), "from");
}
int64_t RecvOp::getAxisSize() {
  return *lookupAxisSize(*this, nullptr, getMeshAttr(), getAxis());
}

LogicalResult ShardOp::verifySymbolUses(SymbolTableCollection &) {
  return verifyShardingOf(*this, getSharding(), getResult().getType(),
                          "the annotated value", [&] { return emitOpError(); });
}

//===----------------------------------------------------------------------===//
// SpmdOp
//===----------------------------------------------------------------------===//

/// Checks one side of the op (its inputs or its results) against the body's
/// per-rank types: a sharding per value, valid for its global type, whose
/// block is the body's type.
static LogicalResult verifySpmdSide(SpmdOp op, ArrayAttr shardings, TypeRange globals,
                                    ArrayRef<Type> locals, StringRef what) {
  if (shardings.size() != globals.size() || locals.size() != globals.size())
    return op.emitOpError("has ") << globals.size() << " " << what << "s, "
                                  << shardings.size() << " " << what
                                  << " shardings, and its body has " << locals.size();
  for (auto [i, entry] : llvm::enumerate(shardings)) {
    auto sharding = llvm::dyn_cast<ShardingAttr>(entry);
    if (!sharding)
      return op.emitOpError() << what << " sharding #" << i
                              << " must be a #tgraph.sharding attribute";
    SmallVector<int64_t> shape;
    if (failed(verifyShardingOf(op, sharding, globals[i], Twine(what) + " #" + Twine(i),
                                [&] { return op.emitOpError(); }, &shape)))
      return failure();
    auto block = RankedTensorType::get(
        shape, llvm::cast<RankedTensorType>(globals[i]).getElementType());
    if (block != locals[i])
      return op.emitOpError() << what << " #" << i << " of type " << globals[i]
                              << " laid out as " << sharding << " has blocks of type "
                              << block << ", but the body's is " << locals[i];
  }
  return success();
}

LogicalResult SpmdOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto body = llvm::dyn_cast_or_null<FunctionOpInterface>(
      symbols.lookupNearestSymbolFrom(*this, getBodyAttr()));
  if (!body)
    return emitOpError("refers to unknown function ") << getBodyAttr();
  if (!body->hasAttr("tgraph.local"))
    return emitOpError("body ") << getBodyAttr()
                                << " must be a local-view function (marked tgraph.local)";
  if (failed(verifySpmdSide(*this, getInShardings(), getInputs().getTypes(),
                            body.getArgumentTypes(), "input")))
    return failure();
  return verifySpmdSide(*this, getOutShardings(), getResults().getTypes(),
                        body.getResultTypes(), "result");
}

