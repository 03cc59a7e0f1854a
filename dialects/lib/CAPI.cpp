//===- CAPI.cpp - C API of Tessera's dialects -----------------------------===//

#include "tessera-c/Dialects.h"

#include "mlir/CAPI/IR.h"
#include "mlir/CAPI/Registration.h"
#include "mlir/CAPI/Support.h"
#include "tessera/TGraph/TGraph.h"
#include "tessera/TSched/TSched.h"
#include "tessera/TTile/TTile.h"

using namespace mlir;

MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(TGraph, tgraph, tessera::tgraph::TGraphDialect)
MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(TSched, tsched, tessera::tsched::TSchedDialect)
MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(TTile, ttile, tessera::ttile::TTileDialect)

using tessera::tgraph::ShardingAttr;
using tessera::ttile::TileType;

//===----------------------------------------------------------------------===//
// !ttile.tile
//===----------------------------------------------------------------------===//

bool tesseraTypeIsATile(MlirType type) { return llvm::isa<TileType>(unwrap(type)); }

MlirTypeID tesseraTileTypeGetTypeID(void) { return wrap(TileType::getTypeID()); }

MlirType tesseraTileTypeGet(MlirContext ctx, intptr_t rank, const int64_t *shape,
                            MlirType element) {
  MLIRContext *context = unwrap(ctx);
  // getChecked: user input reaches here, and the pip LLVM aborts on a
  // failed assertion in get().
  return wrap(TileType::getChecked(
      [&] { return emitError(UnknownLoc::get(context)); }, context,
      llvm::ArrayRef<int64_t>(shape, rank), unwrap(element)));
}

intptr_t tesseraTileTypeGetRank(MlirType type) {
  return llvm::cast<TileType>(unwrap(type)).getShape().size();
}

int64_t tesseraTileTypeGetDimSize(MlirType type, intptr_t dim) {
  return llvm::cast<TileType>(unwrap(type)).getShape()[dim];
}

MlirType tesseraTileTypeGetElementType(MlirType type) {
  return wrap(llvm::cast<TileType>(unwrap(type)).getElementType());
}

//===----------------------------------------------------------------------===//
// #tgraph.sharding
//===----------------------------------------------------------------------===//

bool tesseraAttributeIsASharding(MlirAttribute attr) {
  return llvm::isa<ShardingAttr>(unwrap(attr));
}

MlirTypeID tesseraShardingAttrGetTypeID(void) { return wrap(ShardingAttr::getTypeID()); }

static ArrayAttr axisNames(MLIRContext *context, const MlirStringRef *names, intptr_t n) {
  llvm::SmallVector<Attribute> out;
  for (intptr_t i = 0; i < n; ++i)
    out.push_back(StringAttr::get(context, unwrap(names[i])));
  return ArrayAttr::get(context, out);
}

MlirAttribute tesseraShardingAttrGet(MlirContext ctx, MlirStringRef mesh, intptr_t rank,
                                     const intptr_t *counts, const MlirStringRef *axes,
                                     intptr_t numPartial, const MlirStringRef *partial) {
  MLIRContext *context = unwrap(ctx);
  llvm::SmallVector<Attribute> dims;
  for (intptr_t d = 0; d < rank; ++d) {
    dims.push_back(axisNames(context, axes, counts[d]));
    axes += counts[d];
  }
  ArrayAttr partialAttr = numPartial ? axisNames(context, partial, numPartial) : ArrayAttr();
  return wrap(ShardingAttr::getChecked(
      [&] { return emitError(UnknownLoc::get(context)); }, context,
      FlatSymbolRefAttr::get(context, unwrap(mesh)), ArrayAttr::get(context, dims),
      partialAttr));
}

MlirStringRef tesseraShardingAttrGetMesh(MlirAttribute attr) {
  return wrap(llvm::cast<ShardingAttr>(unwrap(attr)).getMesh().getValue());
}

intptr_t tesseraShardingAttrGetRank(MlirAttribute attr) {
  return llvm::cast<ShardingAttr>(unwrap(attr)).getDims().size();
}

intptr_t tesseraShardingAttrGetNumDimAxes(MlirAttribute attr, intptr_t dim) {
  return llvm::cast<ArrayAttr>(llvm::cast<ShardingAttr>(unwrap(attr)).getDims()[dim]).size();
}

MlirStringRef tesseraShardingAttrGetDimAxis(MlirAttribute attr, intptr_t dim, intptr_t i) {
  auto axes = llvm::cast<ArrayAttr>(llvm::cast<ShardingAttr>(unwrap(attr)).getDims()[dim]);
  return wrap(llvm::cast<StringAttr>(axes[i]).getValue());
}

intptr_t tesseraShardingAttrGetNumPartialAxes(MlirAttribute attr) {
  ArrayAttr partial = llvm::cast<ShardingAttr>(unwrap(attr)).getPartial();
  return partial ? partial.size() : 0;
}

MlirStringRef tesseraShardingAttrGetPartialAxis(MlirAttribute attr, intptr_t i) {
  ArrayAttr partial = llvm::cast<ShardingAttr>(unwrap(attr)).getPartial();
  return wrap(llvm::cast<StringAttr>(partial[i]).getValue());
}

//===----------------------------------------------------------------------===//
// Enum attributes
//===----------------------------------------------------------------------===//

#define TESSERA_DEFINE_CAPI_ENUM_ATTR(NAME, NAMESPACE)                                  \
  bool tesseraAttributeIsA##NAME(MlirAttribute attr) {                                 \
    return llvm::isa<NAMESPACE::NAME##Attr>(unwrap(attr));                             \
  }                                                                                    \
  MlirTypeID tessera##NAME##AttrGetTypeID(void) {                                      \
    return wrap(NAMESPACE::NAME##Attr::getTypeID());                                   \
  }                                                                                    \
  MlirAttribute tessera##NAME##AttrGet(MlirContext ctx, MlirStringRef value) {         \
    std::optional<NAMESPACE::NAME> kind = NAMESPACE::symbolize##NAME(unwrap(value));   \
    if (!kind)                                                                         \
      return MlirAttribute{nullptr};                                                   \
    return wrap(NAMESPACE::NAME##Attr::get(unwrap(ctx), *kind));                       \
  }                                                                                    \
  MlirStringRef tessera##NAME##AttrGetValue(MlirAttribute attr) {                      \
    return wrap(NAMESPACE::stringify##NAME(                                            \
        llvm::cast<NAMESPACE::NAME##Attr>(unwrap(attr)).getValue()));                  \
  }

TESSERA_DEFINE_CAPI_ENUM_ATTR(ReductionKind, tessera::tgraph)
TESSERA_DEFINE_CAPI_ENUM_ATTR(Transport, tessera::tgraph)
TESSERA_DEFINE_CAPI_ENUM_ATTR(CompareKind, tessera::tgraph)
TESSERA_DEFINE_CAPI_ENUM_ATTR(CollectiveKind, tessera::tsched)
TESSERA_DEFINE_CAPI_ENUM_ATTR(Placement, tessera::ttile)
TESSERA_DEFINE_CAPI_ENUM_ATTR(Mma, tessera::ttile)

//===----------------------------------------------------------------------===//
// #ttile.pipeline
//===----------------------------------------------------------------------===//

using tessera::ttile::PipelineAttr;

bool tesseraAttributeIsAPipeline(MlirAttribute attr) {
  return llvm::isa<PipelineAttr>(unwrap(attr));
}

MlirTypeID tesseraPipelineAttrGetTypeID(void) { return wrap(PipelineAttr::getTypeID()); }

MlirAttribute tesseraPipelineAttrGet(MlirContext ctx, MlirStringRef kind, MlirStringRef mma,
                                     MlirStringRef copies, int64_t stages, int64_t lag,
                                     bool producer, bool pingpong, bool issueAhead) {
  using namespace tessera::ttile;
  MLIRContext *context = unwrap(ctx);
  auto error = [&] { return emitError(UnknownLoc::get(context)); };
  std::optional<LoopKind> k = symbolizeLoopKind(unwrap(kind));
  std::optional<Mma> m = symbolizeMma(unwrap(mma));
  std::optional<Copies> c = symbolizeCopies(unwrap(copies));
  if (!k || !m || !c) {
    error() << "unknown pipeline kind, instruction or copies: " << unwrap(kind) << ", "
            << unwrap(mma) << ", " << unwrap(copies);
    return MlirAttribute{nullptr};
  }
  return wrap(PipelineAttr::getChecked(error, context, *k, *m, *c, stages, lag, producer,
                                       pingpong, issueAhead));
}

static PipelineAttr pipeline(MlirAttribute attr) {
  return llvm::cast<PipelineAttr>(unwrap(attr));
}

MlirStringRef tesseraPipelineAttrGetKind(MlirAttribute attr) {
  return wrap(tessera::ttile::stringifyLoopKind(pipeline(attr).getKind()));
}
MlirStringRef tesseraPipelineAttrGetMma(MlirAttribute attr) {
  return wrap(tessera::ttile::stringifyMma(pipeline(attr).getMma()));
}
MlirStringRef tesseraPipelineAttrGetCopies(MlirAttribute attr) {
  return wrap(tessera::ttile::stringifyCopies(pipeline(attr).getCopies()));
}
int64_t tesseraPipelineAttrGetStages(MlirAttribute attr) { return pipeline(attr).getStages(); }
int64_t tesseraPipelineAttrGetLag(MlirAttribute attr) { return pipeline(attr).getLag(); }
bool tesseraPipelineAttrGetProducer(MlirAttribute attr) { return pipeline(attr).getProducer(); }
bool tesseraPipelineAttrGetPingpong(MlirAttribute attr) { return pipeline(attr).getPingpong(); }
bool tesseraPipelineAttrGetIssueAhead(MlirAttribute attr) {
  return pipeline(attr).getIssueAhead();
}
