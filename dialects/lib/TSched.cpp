//===- TSched.cpp - Tessera Schedule IR dialect ---------------------------===//

#include "tessera/TSched/TSched.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace tessera::tsched;
namespace tgraph = tessera::tgraph;

#include "tessera/TSched/TSchedDialect.cpp.inc"
#include "tessera/TSched/TSchedEnums.cpp.inc"
#define GET_TYPEDEF_CLASSES
#include "tessera/TSched/TSchedTypes.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "tessera/TSched/TSchedAttrs.cpp.inc"
#define GET_OP_CLASSES
#include "tessera/TSched/TSchedOps.cpp.inc"

void TSchedDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "tessera/TSched/TSchedTypes.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "tessera/TSched/TSchedAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "tessera/TSched/TSchedOps.cpp.inc"
      >();
}

/// A launch buffer matches a kernel operand when shape and element type agree;
/// before Tile IR the kernel is a function on tensors, afterwards on memrefs.
static bool sameShapeAndElement(Type buffer, Type kernelType) {
  auto a = llvm::cast<ShapedType>(buffer);
  auto b = llvm::dyn_cast<ShapedType>(kernelType);
  return b && b.hasStaticShape() && a.getShape() == b.getShape() &&
         a.getElementType() == b.getElementType();
}

LogicalResult LaunchOp::verifySymbolUses(SymbolTableCollection &symbols) {
  Operation *target = symbols.lookupNearestSymbolFrom(*this, getKernelAttr());
  if (!target)
    return emitOpError("launches unknown kernel ") << getKernelAttr();
  auto kernel = llvm::dyn_cast<FunctionOpInterface>(target);
  if (!kernel)
    return emitOpError("symbol ") << getKernelAttr() << " is not a kernel";
  ArrayRef<Type> params = kernel.getArgumentTypes();
  ArrayRef<Type> results = kernel.getResultTypes();
  SmallVector<Type> expected;
  SmallVector<Type> given;
  if (results.empty()) {
    // Destination-passing kernel: arguments are ins then outs.
    llvm::append_range(expected, params);
    llvm::append_range(given, getIns().getTypes());
    llvm::append_range(given, getOuts().getTypes());
  } else {
    if (params.size() != getIns().size() || results.size() != getOuts().size())
      return emitOpError("kernel ") << getKernelAttr() << " takes " << params.size()
                                    << " inputs and returns " << results.size()
                                    << " results, but the launch passes "
                                    << getIns().size() << " ins and "
                                    << getOuts().size() << " outs";
    llvm::append_range(expected, params);
    llvm::append_range(expected, results);
    llvm::append_range(given, getIns().getTypes());
    llvm::append_range(given, getOuts().getTypes());
  }
  if (expected.size() != given.size())
    return emitOpError("kernel ") << getKernelAttr() << " takes " << expected.size()
                                  << " buffers, but the launch passes " << given.size();
  for (auto [i, pair] : llvm::enumerate(llvm::zip(given, expected)))
    if (!sameShapeAndElement(std::get<0>(pair), std::get<1>(pair)))
      return emitOpError("buffer #") << i << " has type " << std::get<0>(pair)
                                     << " but kernel " << getKernelAttr()
                                     << " expects " << std::get<1>(pair);
  return success();
}

LogicalResult CollectiveStartOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto mesh = symbols.lookupNearestSymbolFrom<tgraph::MeshOp>(*this, getMeshAttr());
  if (!mesh)
    return emitOpError("refers to unknown mesh ") << getMeshAttr();
  std::optional<int64_t> size = mesh.getGroupSize(getAxis());
  if (!size)
    return emitOpError("mesh ") << getMeshAttr() << " has no axis '" << getAxis() << "'";

  auto src = llvm::cast<MemRefType>(getSrc().getType());
  auto dst = llvm::cast<MemRefType>(getDst().getType());
  if (src.getElementType() != dst.getElementType() || src.getRank() != dst.getRank())
    return emitOpError("'src' ") << src << " and 'dst' " << dst
                                 << " must have the same rank and element type";
  CollectiveKind kind = getKind();
  if (!getCounts().empty()) {
    if (kind != CollectiveKind::all_to_all || getCounts().size() != 2)
      return emitOpError("'counts' are an all_to_all's (send, receive) pair");
    for (auto [i, count] : llvm::enumerate(getCounts())) {
      auto type = llvm::cast<MemRefType>(count.getType());
      if (type.getRank() != 1 || type.getDimSize(0) != *size ||
          !type.getElementType().isInteger(32))
        return emitOpError("'counts' #") << i << " must be memref<" << *size
                                         << "xi32>, got " << type;
    }
  }
  if (kind == CollectiveKind::broadcast) {
    if (!getRoot() || static_cast<int64_t>(*getRoot()) >= *size)
      return emitOpError("<broadcast> needs a 'root' rank of axis '") << getAxis()
                                                                     << "' (size " << *size << ")";
    if (src.getShape() != dst.getShape())
      return emitOpError("broadcast 'src' ") << src << " and 'dst' " << dst
                                             << " must have the same shape";
    return success();
  }
  if (kind == CollectiveKind::shift) {
    if (!getOffset() || *getOffset() < 1 || static_cast<int64_t>(*getOffset()) >= *size)
      return emitOpError("<shift> needs an 'offset' of 1 to ") << *size - 1 << " (axis '"
                                                               << getAxis() << "')";
    if (src.getShape() != dst.getShape())
      return emitOpError("shift 'src' ") << src << " and 'dst' " << dst
                                         << " must have the same shape";
    return success();
  }
  bool reduces = kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter;
  if (reduces && !getReduction())
    return emitOpError("<") << stringifyCollectiveKind(kind)
                            << "> needs a 'reduction' attribute";
  if (kind == CollectiveKind::all_reduce) {
    if (src.getShape() != dst.getShape())
      return emitOpError("all_reduce 'src' ") << src << " and 'dst' " << dst
                                              << " must have the same shape";
    return success();
  }
  if (!getDim())
    return emitOpError("<") << stringifyCollectiveKind(kind) << "> needs a 'dim' attribute";
  int64_t dim = static_cast<int64_t>(*getDim());
  if (dim < 0 || dim >= src.getRank())
    return emitOpError("dim ") << dim << " is out of range for 'src' " << src;
  if (kind == CollectiveKind::all_to_all) {
    if (!getConcatDim())
      return emitOpError("<all_to_all> needs a 'concat_dim' attribute");
    int64_t concat = static_cast<int64_t>(*getConcatDim());
    if (concat < 0 || concat >= src.getRank() || concat == dim)
      return emitOpError("concat_dim ") << concat << " must be a dimension of 'src' " << src
                                        << " other than dim " << dim;
    for (int64_t d = 0; d < src.getRank(); ++d) {
      int64_t in = src.getDimSize(d);
      int64_t want = d == dim ? in / *size : d == concat ? in * *size : in;
      if (dst.getDimSize(d) != want || (d == dim && in % *size))
        return emitOpError("'dst' ") << dst << " does not match 'src' " << src
                                     << " for <all_to_all> over axis '" << getAxis()
                                     << "' of size " << *size;
    }
    return success();
  }
  for (int64_t d = 0; d < src.getRank(); ++d) {
    int64_t in = src.getDimSize(d), out = dst.getDimSize(d);
    int64_t want = d != dim ? in
                   : kind == CollectiveKind::all_gather ? in * *size
                                                        : in / *size;
    if (out != want || (d == dim && kind == CollectiveKind::reduce_scatter && in % *size))
      return emitOpError("'dst' ") << dst << " does not match 'src' " << src << " for <"
                                   << stringifyCollectiveKind(kind) << "> over axis '"
                                   << getAxis() << "' of size " << *size
                                   << " along dim " << dim;
  }
  return success();
}

template <typename Op>
static LogicalResult verifyPeer(Op op, SymbolTableCollection &symbols) {
  auto mesh = symbols.lookupNearestSymbolFrom<tgraph::MeshOp>(op, op.getMeshAttr());
  if (!mesh)
    return op.emitOpError("refers to unknown mesh ") << op.getMeshAttr();
  std::optional<int64_t> size = mesh.getGroupSize(op.getAxis());
  if (!size)
    return op.emitOpError("mesh ") << op.getMeshAttr() << " has no axis '" << op.getAxis() << "'";
  int64_t peer = static_cast<int64_t>(op.getPeer());
  if (peer < 0 || peer >= *size)
    return op.emitOpError("peer ") << peer << " is not a rank of axis '" << op.getAxis()
                                   << "' (size " << *size << ")";
  return success();
}

LogicalResult SendOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyPeer(*this, symbols);
}
LogicalResult RecvOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyPeer(*this, symbols);
}
