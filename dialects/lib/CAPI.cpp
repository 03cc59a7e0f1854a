//===- CAPI.cpp - C API registration of Tessera's dialects ----------------===//

#include "tessera-c/Dialects.h"

#include "mlir/CAPI/Registration.h"
#include "tessera/TGraph/TGraph.h"
#include "tessera/TSched/TSched.h"
#include "tessera/TTile/TTile.h"

MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(TGraph, tgraph, tessera::tgraph::TGraphDialect)
MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(TSched, tsched, tessera::tsched::TSchedDialect)
MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(TTile, ttile, tessera::ttile::TTileDialect)
