//===- Dialects.h - C API for Tessera's dialects ----------------*- C -*-===//
//
// Registration of tgraph, tsched and ttile, and typed access to their custom
// types and attributes (the Python classes in dialects/python read fields
// through these instead of parsing printed IR).
//
//===----------------------------------------------------------------------===//
#ifndef TESSERA_C_DIALECTS_H
#define TESSERA_C_DIALECTS_H

#include "mlir-c/IR.h"
#include "mlir-c/Support.h"

#ifdef __cplusplus
extern "C" {
#endif

MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(TGraph, tgraph);
MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(TSched, tsched);
MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(TTile, ttile);

//===----------------------------------------------------------------------===//
// !ttile.tile<shape x element>
//===----------------------------------------------------------------------===//

MLIR_CAPI_EXPORTED bool tesseraTypeIsATile(MlirType type);
MLIR_CAPI_EXPORTED MlirTypeID tesseraTileTypeGetTypeID(void);
/// The tile type, or a null type (with a diagnostic on the context) when
/// the shape or element type is invalid.
MLIR_CAPI_EXPORTED MlirType tesseraTileTypeGet(MlirContext ctx, intptr_t rank,
                                               const int64_t *shape, MlirType element);
MLIR_CAPI_EXPORTED intptr_t tesseraTileTypeGetRank(MlirType type);
MLIR_CAPI_EXPORTED int64_t tesseraTileTypeGetDimSize(MlirType type, intptr_t dim);
MLIR_CAPI_EXPORTED MlirType tesseraTileTypeGetElementType(MlirType type);

//===----------------------------------------------------------------------===//
// #tgraph.sharding<@mesh, [[axes], ...], partial = [axes]>
//===----------------------------------------------------------------------===//

MLIR_CAPI_EXPORTED bool tesseraAttributeIsASharding(MlirAttribute attr);
MLIR_CAPI_EXPORTED MlirTypeID tesseraShardingAttrGetTypeID(void);
/// `dims` holds `rank` lists of axis names, list d `counts[d]` long, one
/// after the other in `axes`; `partial` `numPartial` names. A null
/// attribute (with a diagnostic) when the sharding is invalid.
MLIR_CAPI_EXPORTED MlirAttribute tesseraShardingAttrGet(
    MlirContext ctx, MlirStringRef mesh, intptr_t rank, const intptr_t *counts,
    const MlirStringRef *axes, intptr_t numPartial, const MlirStringRef *partial);
MLIR_CAPI_EXPORTED MlirStringRef tesseraShardingAttrGetMesh(MlirAttribute attr);
MLIR_CAPI_EXPORTED intptr_t tesseraShardingAttrGetRank(MlirAttribute attr);
MLIR_CAPI_EXPORTED intptr_t tesseraShardingAttrGetNumDimAxes(MlirAttribute attr, intptr_t dim);
MLIR_CAPI_EXPORTED MlirStringRef tesseraShardingAttrGetDimAxis(MlirAttribute attr, intptr_t dim,
                                                               intptr_t i);
MLIR_CAPI_EXPORTED intptr_t tesseraShardingAttrGetNumPartialAxes(MlirAttribute attr);
MLIR_CAPI_EXPORTED MlirStringRef tesseraShardingAttrGetPartialAxis(MlirAttribute attr,
                                                                   intptr_t i);

//===----------------------------------------------------------------------===//
// Enum attributes: #tgraph.reduction<sum>, #tgraph.transport<nvshmem>,
// #tgraph.compare<ge>, #tsched.collective<all_gather>. Each has IsA, a type
// id, Get (by case name; a null attribute for an unknown name) and GetValue
// (the case name).
//===----------------------------------------------------------------------===//

#define TESSERA_DECLARE_CAPI_ENUM_ATTR(NAME)                                          \
  MLIR_CAPI_EXPORTED bool tesseraAttributeIsA##NAME(MlirAttribute attr);              \
  MLIR_CAPI_EXPORTED MlirTypeID tessera##NAME##AttrGetTypeID(void);                  \
  MLIR_CAPI_EXPORTED MlirAttribute tessera##NAME##AttrGet(MlirContext ctx,            \
                                                          MlirStringRef value);      \
  MLIR_CAPI_EXPORTED MlirStringRef tessera##NAME##AttrGetValue(MlirAttribute attr);

TESSERA_DECLARE_CAPI_ENUM_ATTR(ReductionKind)
TESSERA_DECLARE_CAPI_ENUM_ATTR(Transport)
TESSERA_DECLARE_CAPI_ENUM_ATTR(CompareKind)
TESSERA_DECLARE_CAPI_ENUM_ATTR(CollectiveKind)
TESSERA_DECLARE_CAPI_ENUM_ATTR(Placement)
TESSERA_DECLARE_CAPI_ENUM_ATTR(Mma)

#undef TESSERA_DECLARE_CAPI_ENUM_ATTR

//===----------------------------------------------------------------------===//
// #ttile.pipeline<kind = ..., mma = ..., copies = ..., stages = ..., ...>
//===----------------------------------------------------------------------===//

MLIR_CAPI_EXPORTED bool tesseraAttributeIsAPipeline(MlirAttribute attr);
MLIR_CAPI_EXPORTED MlirTypeID tesseraPipelineAttrGetTypeID(void);
/// Enum parameters by case name; a null attribute (with a diagnostic) for an
/// unknown name or an invalid combination.
MLIR_CAPI_EXPORTED MlirAttribute tesseraPipelineAttrGet(
    MlirContext ctx, MlirStringRef kind, MlirStringRef mma, MlirStringRef copies,
    int64_t stages, int64_t lag, bool producer, bool pingpong, bool issueAhead);
MLIR_CAPI_EXPORTED MlirStringRef tesseraPipelineAttrGetKind(MlirAttribute attr);
MLIR_CAPI_EXPORTED MlirStringRef tesseraPipelineAttrGetMma(MlirAttribute attr);
MLIR_CAPI_EXPORTED MlirStringRef tesseraPipelineAttrGetCopies(MlirAttribute attr);
MLIR_CAPI_EXPORTED int64_t tesseraPipelineAttrGetStages(MlirAttribute attr);
MLIR_CAPI_EXPORTED int64_t tesseraPipelineAttrGetLag(MlirAttribute attr);
MLIR_CAPI_EXPORTED bool tesseraPipelineAttrGetProducer(MlirAttribute attr);
MLIR_CAPI_EXPORTED bool tesseraPipelineAttrGetPingpong(MlirAttribute attr);
MLIR_CAPI_EXPORTED bool tesseraPipelineAttrGetIssueAhead(MlirAttribute attr);

#ifdef __cplusplus
}
#endif

#endif // TESSERA_C_DIALECTS_H
