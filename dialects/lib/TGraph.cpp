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
                                      function_ref<InFlightDiagnostic()> emitError) {
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
  if (attr.getName() == "tgraph.partitioned") {
    if (!llvm::isa<UnitAttr>(attr.getValue()))
      return op->emitError("'tgraph.partitioned' must be a unit attribute");
    return success();
  }
  if (attr.getName() == getShardingAttrName()) {
    if (op->getNumResults() != 1)
      return op->emitError() << "'" << attr.getName().getValue()
                             << "' needs an op with exactly one result";
    return verifyShardingNamedAttr(op, attr, op->getResult(0).getType(), "the result");
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
  if (lhs.getRank() != rhs.getRank() || res.getRank() != lhs.getRank())
    return emitOpError("'lhs' ") << lhs << ", 'rhs' " << rhs << " and result "
                                 << res << " must have the same rank";
  if (lhs.getElementType() != rhs.getElementType() ||
      res.getElementType() != lhs.getElementType())
    return emitOpError("element types differ: 'lhs' ")
           << lhs.getElementType() << ", 'rhs' " << rhs.getElementType()
           << ", result " << res.getElementType();
  int64_t r = lhs.getRank();
  ArrayRef<int64_t> a = lhs.getShape(), b = rhs.getShape(), c = res.getShape();
  for (int64_t i = 0; i < r - 2; ++i)
    if (a[i] != b[i] || a[i] != c[i])
      return emitOpError("batch dimension ") << i << " differs: 'lhs' "
                                             << shapeString(a) << ", 'rhs' "
                                             << shapeString(b) << ", result "
                                             << shapeString(c);
  if (a[r - 1] != b[r - 2])
    return emitOpError("contraction dimensions differ: 'lhs' has shape ")
           << shapeString(a) << " (K = " << a[r - 1] << ") but 'rhs' has shape "
           << shapeString(b) << " (K = " << b[r - 2] << ")";
  if (c[r - 2] != a[r - 2] || c[r - 1] != b[r - 1])
    return emitOpError("result shape ")
           << shapeString(c) << " does not match 'lhs' " << shapeString(a)
           << " x 'rhs' " << shapeString(b);
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
  std::optional<int64_t> size = mesh.getAxisSize(axis);
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

LogicalResult ShardOp::verifySymbolUses(SymbolTableCollection &) {
  return verifyShardingOf(*this, getSharding(), getResult().getType(),
                          "the annotated value", [&] { return emitOpError(); });
}
