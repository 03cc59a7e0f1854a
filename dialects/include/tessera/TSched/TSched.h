//===- TSched.h - Tessera Schedule IR dialect ------------------*- C++ -*-===//
#ifndef TESSERA_TSCHED_TSCHED_H
#define TESSERA_TSCHED_TSCHED_H

#include "tessera/TGraph/TGraph.h"

#include "tessera/TSched/TSchedDialect.h.inc"
#include "tessera/TSched/TSchedEnums.h.inc"
#define GET_TYPEDEF_CLASSES
#include "tessera/TSched/TSchedTypes.h.inc"
#define GET_ATTRDEF_CLASSES
#include "tessera/TSched/TSchedAttrs.h.inc"
#define GET_OP_CLASSES
#include "tessera/TSched/TSchedOps.h.inc"

#endif // TESSERA_TSCHED_TSCHED_H
