//===- TesseraDialects.cpp - Python classes for Tessera's types/attributes ===//
//
// `_tesseraDialects`: typed Python access to Tessera's custom type and
// attributes, as MLIR's out-of-tree example does for its custom type:
//
//   TileType            !ttile.tile<16x32xf32>: shape, element_type
//   ShardingAttr        #tgraph.sharding<@mesh, [[...]], partial = [...]>:
//                       mesh, dims, partial
//   ReductionKindAttr, TransportAttr, CompareKindAttr (tgraph),
//   CollectiveKindAttr (tsched), PlaceAttr and MmaAttr (ttile): value (the case
//   name)
//   PipelineAttr        #ttile.pipeline<...>: kind, mma, copies, stages, lag,
//                       producer, pingpong, issue_ahead
//
// Importing the module registers each class with the bindings' type and
// attribute casters, so `value.type` and `op.attributes[...]` come back as
// these classes. `tessera_mlir.dialects.{ttile,tgraph,tsched}` re-export
// them. Everything goes through the C API (dialects/lib/CAPI.cpp).
//
//===----------------------------------------------------------------------===//

#include <string>
#include <vector>

#include "mlir-c/Diagnostics.h"
#include "mlir-c/IR.h"
#include "mlir/Bindings/Python/Nanobind.h"
#include "mlir/Bindings/Python/NanobindAdaptors.h"
#include "tessera-c/Dialects.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using namespace mlir::python::nanobind_adaptors;

namespace {

std::string toString(MlirStringRef s) { return std::string(s.data, s.length); }

MlirStringRef toRef(const std::string &s) { return mlirStringRefCreate(s.data(), s.size()); }

/// Runs `make` with the context's diagnostics collected; a null result
/// raises ValueError with them (never an abort: the C API uses getChecked).
template <typename T, typename Make>
T checked(MlirContext ctx, const char *what, Make make) {
  std::string messages;
  auto handler = [](MlirDiagnostic diagnostic, void *data) {
    auto *out = static_cast<std::string *>(data);
    mlirDiagnosticPrint(
        diagnostic,
        [](MlirStringRef s, void *d) { static_cast<std::string *>(d)->append(s.data, s.length); },
        out);
    out->append("\n");
    return mlirLogicalResultSuccess();
  };
  MlirDiagnosticHandlerID id = mlirContextAttachDiagnosticHandler(ctx, handler, &messages,
                                                                   nullptr);
  T result = make();
  mlirContextDetachDiagnosticHandler(ctx, id);
  bool null;
  if constexpr (std::is_same_v<T, MlirType>)
    null = mlirTypeIsNull(result);
  else
    null = mlirAttributeIsNull(result);
  if (null) {
    while (!messages.empty() && messages.back() == '\n')
      messages.pop_back();
    throw nb::value_error((std::string("invalid ") + what +
                           (messages.empty() ? "" : ": " + messages)).c_str());
  }
  return result;
}

template <typename IsA, typename TypeID, typename Get, typename Value>
void enumAttr(nb::module_ &m, const char *name, const char *syntax, IsA isa, TypeID typeID,
              Get get, Value value) {
  mlir_attribute_subclass(m, name, isa, typeID)
      .def_classmethod(
          "get",
          [get, syntax](nb::object cls, const std::string &v, MlirContext ctx) {
            MlirAttribute attr = get(ctx, toRef(v));
            if (mlirAttributeIsNull(attr))
              throw nb::value_error(
                  (std::string("'") + v + "' is not a value of " + syntax).c_str());
            return cls(attr);
          },
          nb::arg("cls"), nb::arg("value"), nb::arg("context") = nb::none(),
          (std::string("The ") + syntax + " attribute with this value.").c_str())
      .def_property_readonly(
          "value", [value](MlirAttribute attr) { return toString(value(attr)); },
          "The case name (`sum` of #tgraph.reduction<sum>).");
}

} // namespace

NB_MODULE(_tesseraDialects, m) {
  m.doc() = "Typed access to Tessera's custom types and attributes.";

  mlir_type_subclass(m, "TileType", tesseraTypeIsATile, tesseraTileTypeGetTypeID)
      .def_classmethod(
          "get",
          [](nb::object cls, const std::vector<int64_t> &shape, MlirType element,
             MlirContext ctx) {
            return cls(checked<MlirType>(ctx, "tile type", [&] {
              return tesseraTileTypeGet(ctx, shape.size(), shape.data(), element);
            }));
          },
          nb::arg("cls"), nb::arg("shape"), nb::arg("element_type"),
          nb::arg("context") = nb::none(), "!ttile.tile<shape x element_type>.")
      .def_property_readonly(
          "shape",
          [](MlirType t) {
            std::vector<int64_t> shape;
            for (intptr_t d = 0, n = tesseraTileTypeGetRank(t); d < n; ++d)
              shape.push_back(tesseraTileTypeGetDimSize(t, d));
            return shape;
          },
          "The tile's shape, a list of ints.")
      .def_property_readonly("rank", [](MlirType t) { return tesseraTileTypeGetRank(t); })
      .def_property_readonly(
          "element_type", [](MlirType t) { return tesseraTileTypeGetElementType(t); },
          "The element type (an ir.Type).");

  mlir_attribute_subclass(m, "ShardingAttr", tesseraAttributeIsASharding,
                          tesseraShardingAttrGetTypeID)
      .def_classmethod(
          "get",
          [](nb::object cls, const std::string &mesh,
             const std::vector<std::vector<std::string>> &dims,
             const std::vector<std::string> &partial, MlirContext ctx) {
            std::vector<intptr_t> counts;
            std::vector<MlirStringRef> axes, partialRefs;
            for (const auto &d : dims) {
              counts.push_back(d.size());
              for (const auto &a : d)
                axes.push_back(toRef(a));
            }
            for (const auto &a : partial)
              partialRefs.push_back(toRef(a));
            return cls(checked<MlirAttribute>(ctx, "sharding", [&] {
              return tesseraShardingAttrGet(ctx, toRef(mesh), counts.size(), counts.data(),
                                            axes.data(), partialRefs.size(),
                                            partialRefs.data());
            }));
          },
          nb::arg("cls"), nb::arg("mesh"), nb::arg("dims"),
          nb::arg("partial") = std::vector<std::string>(), nb::arg("context") = nb::none(),
          "#tgraph.sharding<@mesh, dims, partial = partial>: dims lists, per tensor "
          "dimension, the mesh axes splitting it.")
      .def_property_readonly(
          "mesh", [](MlirAttribute a) { return toString(tesseraShardingAttrGetMesh(a)); },
          "The mesh's symbol name.")
      .def_property_readonly(
          "dims",
          [](MlirAttribute a) {
            std::vector<std::vector<std::string>> dims;
            for (intptr_t d = 0, n = tesseraShardingAttrGetRank(a); d < n; ++d) {
              dims.emplace_back();
              for (intptr_t i = 0, k = tesseraShardingAttrGetNumDimAxes(a, d); i < k; ++i)
                dims.back().push_back(toString(tesseraShardingAttrGetDimAxis(a, d, i)));
            }
            return dims;
          },
          "Per tensor dimension, the mesh axes splitting it (outermost first).")
      .def_property_readonly(
          "partial",
          [](MlirAttribute a) {
            std::vector<std::string> axes;
            for (intptr_t i = 0, n = tesseraShardingAttrGetNumPartialAxes(a); i < n; ++i)
              axes.push_back(toString(tesseraShardingAttrGetPartialAxis(a, i)));
            return axes;
          },
          "The mesh axes over which the value is a pending sum.");

  enumAttr(m, "ReductionKindAttr", "#tgraph.reduction", tesseraAttributeIsAReductionKind,
           tesseraReductionKindAttrGetTypeID, tesseraReductionKindAttrGet,
           tesseraReductionKindAttrGetValue);
  enumAttr(m, "TransportAttr", "#tgraph.transport", tesseraAttributeIsATransport,
           tesseraTransportAttrGetTypeID, tesseraTransportAttrGet, tesseraTransportAttrGetValue);
  enumAttr(m, "CompareKindAttr", "#tgraph.compare", tesseraAttributeIsACompareKind,
           tesseraCompareKindAttrGetTypeID, tesseraCompareKindAttrGet,
           tesseraCompareKindAttrGetValue);
  enumAttr(m, "CollectiveKindAttr", "#tsched.collective", tesseraAttributeIsACollectiveKind,
           tesseraCollectiveKindAttrGetTypeID, tesseraCollectiveKindAttrGet,
           tesseraCollectiveKindAttrGetValue);
  enumAttr(m, "PlaceAttr", "#ttile.place", tesseraAttributeIsAPlacement,
           tesseraPlacementAttrGetTypeID, tesseraPlacementAttrGet, tesseraPlacementAttrGetValue);
  enumAttr(m, "MmaAttr", "#ttile.mma", tesseraAttributeIsAMma, tesseraMmaAttrGetTypeID,
           tesseraMmaAttrGet, tesseraMmaAttrGetValue);

  mlir_attribute_subclass(m, "PipelineAttr", tesseraAttributeIsAPipeline,
                          tesseraPipelineAttrGetTypeID)
      .def_classmethod(
          "get",
          [](nb::object cls, const std::string &kind, const std::string &mma,
             const std::string &copies, int64_t stages, int64_t lag, bool producer,
             bool pingpong, bool issueAhead, MlirContext ctx) {
            return cls(checked<MlirAttribute>(ctx, "pipeline", [&] {
              return tesseraPipelineAttrGet(ctx, toRef(kind), toRef(mma), toRef(copies), stages,
                                            lag, producer, pingpong, issueAhead);
            }));
          },
          nb::arg("cls"), nb::arg("kind"), nb::arg("mma"), nb::arg("copies"), nb::arg("stages"),
          nb::arg("lag") = 0, nb::arg("producer") = false, nb::arg("pingpong") = false,
          nb::arg("issue_ahead") = false, nb::arg("context") = nb::none(),
          "#ttile.pipeline<kind, mma, copies, stages, lag, producer, pingpong, issue_ahead>.")
      .def_property_readonly(
          "kind", [](MlirAttribute a) { return toString(tesseraPipelineAttrGetKind(a)); },
          "gemm or registers.")
      .def_property_readonly(
          "mma", [](MlirAttribute a) { return toString(tesseraPipelineAttrGetMma(a)); },
          "mma_sync or wgmma.")
      .def_property_readonly(
          "copies", [](MlirAttribute a) { return toString(tesseraPipelineAttrGetCopies(a)); },
          "cp_async or tma.")
      .def_property_readonly("stages", tesseraPipelineAttrGetStages)
      .def_property_readonly("lag", tesseraPipelineAttrGetLag)
      .def_property_readonly("producer", tesseraPipelineAttrGetProducer)
      .def_property_readonly("pingpong", tesseraPipelineAttrGetPingpong)
      .def_property_readonly("issue_ahead", tesseraPipelineAttrGetIssueAhead);
}
