//===- Dialects.h - C API for Tessera's dialects ----------------*- C -*-===//
#ifndef TESSERA_C_DIALECTS_H
#define TESSERA_C_DIALECTS_H

#include "mlir-c/IR.h"

#ifdef __cplusplus
extern "C" {
#endif

MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(TGraph, tgraph);
MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(TSched, tsched);
MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(TTile, ttile);

#ifdef __cplusplus
}
#endif

#endif // TESSERA_C_DIALECTS_H
