//===- TesseraExtension.cpp - registers Tessera's dialects in Python ------===//
//
// Loaded by `tessera_mlir._mlir_libs` at import (as `_site_initialize_0`): its
// `register_dialects` adds tgraph/tsched/ttile to the registry every Context
// is created with, so `ir.Context()` parses Tessera IR with no extra step.
//
//===----------------------------------------------------------------------===//

#include "mlir-c/IR.h"
#include "mlir/Bindings/Python/Nanobind.h"
#include "mlir/Bindings/Python/NanobindAdaptors.h"
#include "tessera-c/Dialects.h"

namespace nb = nanobind;

NB_MODULE(_site_initialize_0, m) {
  m.doc() = "Registers Tessera's tgraph, tsched and ttile dialects.";
  m.def(
      "register_dialects",
      [](MlirDialectRegistry registry) {
        mlirDialectHandleInsertDialect(mlirGetDialectHandle__tgraph__(), registry);
        mlirDialectHandleInsertDialect(mlirGetDialectHandle__tsched__(), registry);
        mlirDialectHandleInsertDialect(mlirGetDialectHandle__ttile__(), registry);
      },
      nb::arg("registry"));
}
