"""Element types, buffer types, tile types and enum attributes, read as
Python values."""

from __future__ import annotations

from tessera_mlir import ir

#: Element types Tessera handles, by MLIR name, as numpy dtype names.
ELEMENT_TYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16",
                 "i32": "int32", "i64": "int64", "i8": "int8", "i1": "bool"}

#: Bytes per element of each element type (i1 is stored as one byte).
ELEMENT_BYTES = {"f64": 8, "i64": 8, "f32": 4, "i32": 4, "bf16": 2, "f16": 2, "i8": 1, "i1": 1}


def memref_of(tensor_type: ir.Type) -> ir.MemRefType:
    """The buffer type holding a ranked tensor type."""
    t = ir.RankedTensorType(tensor_type)
    return ir.MemRefType.get(list(t.shape), t.element_type)


def shape_of(v: ir.Value) -> list[int]:
    """The static shape of a tensor or buffer value."""
    return list(ir.ShapedType(v.type).shape)


def is_tile(t: ir.Type) -> bool:
    return str(t).startswith("!ttile.tile")


def tile_of(t: ir.Type) -> tuple[list[int], str]:
    """(shape, element type name) of a `!ttile.tile<8x16xf32>`."""
    text = str(t)
    body = text[len("!ttile.tile<"):-1]
    *dims, elt = body.split("x")
    return [int(d) for d in dims], elt


def enum_of(op: ir.Operation, attr: str = "kind") -> str:
    """The value of an enum attribute: `sum` of `#tgraph.reduction<sum>`,
    `nvshmem` of `#tgraph.transport<nvshmem>`."""
    return str(op.attributes[attr]).split("<")[1].rstrip(">")
