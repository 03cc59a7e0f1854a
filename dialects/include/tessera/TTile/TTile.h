//===- TTile.h - Tessera Tile IR dialect -----------------------*- C++ -*-===//
#ifndef TESSERA_TTILE_TTILE_H
#define TESSERA_TTILE_TTILE_H

#include "mlir/Interfaces/CallInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "tessera/TGraph/TGraph.h"

#include "tessera/TTile/TTileDialect.h.inc"
#include "tessera/TTile/TTileEnums.h.inc"
#define GET_ATTRDEF_CLASSES
#include "tessera/TTile/TTileAttrs.h.inc"
#define GET_TYPEDEF_CLASSES
#include "tessera/TTile/TTileTypes.h.inc"
#define GET_OP_CLASSES
#include "tessera/TTile/TTileOps.h.inc"

#endif // TESSERA_TTILE_TTILE_H
