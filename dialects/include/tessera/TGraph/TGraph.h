//===- TGraph.h - Tessera Graph IR dialect ---------------------*- C++ -*-===//
#ifndef TESSERA_TGRAPH_TGRAPH_H
#define TESSERA_TGRAPH_TGRAPH_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "tessera/TGraph/TGraphDialect.h.inc"
#include "tessera/TGraph/TGraphEnums.h.inc"
#define GET_ATTRDEF_CLASSES
#include "tessera/TGraph/TGraphAttrs.h.inc"
#define GET_OP_CLASSES
#include "tessera/TGraph/TGraphOps.h.inc"

#endif // TESSERA_TGRAPH_TGRAPH_H
