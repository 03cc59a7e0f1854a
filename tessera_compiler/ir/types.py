"""Element types, buffer types, tile types and enum attributes, read as
Python values through the typed classes of `tessera_mlir.dialects`
(`TileType`, `ReductionKindAttr`, ...), never by parsing printed IR."""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph, tsched, ttile

#: Element types Tessera handles, by MLIR name, as numpy dtype names.
ELEMENT_TYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16",
                 "f8E4M3FN": "float8_e4m3fn",
                 "i32": "int32", "i64": "int64", "i8": "int8", "i1": "bool"}

#: Bytes per element of each element type (i1 is stored as one byte).
ELEMENT_BYTES = {"f64": 8, "i64": 8, "f32": 4, "i32": 4, "bf16": 2, "f16": 2, "f8E4M3FN": 1,
                 "i8": 1, "i1": 1}

#: Element types that generated code stores as their raw bits (no C++ or
#: CUDA arithmetic type holds them) and converts per element on load and
#: store: a tile of them is never the buffer's block itself.
STORED_AS_BITS = frozenset({"bf16", "f8E4M3FN"})

#: Bytes per element of each numpy dtype name Tessera handles (the bundle's
#: and the cost model's spelling), from the two tables above.
DTYPE_BYTES = {ELEMENT_TYPES[t]: n for t, n in ELEMENT_BYTES.items()}

#: The enum attributes of Tessera's dialects.
ENUM_ATTRS = (tgraph.ReductionKindAttr, tgraph.TransportAttr, tgraph.CompareKindAttr,
              tsched.CollectiveKindAttr)


def memref_of(tensor_type: ir.Type) -> ir.MemRefType:
    """The buffer type holding a ranked tensor type."""
    t = ir.RankedTensorType(tensor_type)
    return ir.MemRefType.get(list(t.shape), t.element_type)


def shape_of(v: ir.Value) -> list[int]:
    """The static shape of a tensor or buffer value."""
    return list(ir.ShapedType(v.type).shape)


def is_tile(t: ir.Type) -> bool:
    return ttile.TileType.isinstance(t)


def tile_of(t: ir.Type) -> tuple[list[int], str]:
    """(shape, element type name) of a `!ttile.tile<8x16xf32>`."""
    tile = ttile.TileType(t)
    return list(tile.shape), str(tile.element_type)


def tile_type(shape, element) -> ir.Type:
    """`!ttile.tile<{shape}x{element}>` (`element` an ir.Type or its name)."""
    if not isinstance(element, ir.Type):
        element = ir.Type.parse(str(element))
    return ttile.TileType.get(list(shape), element)


def enum_of(op: ir.Operation, attr: str = "kind") -> str:
    """The value of an enum attribute of `op`: `sum` of
    `#tgraph.reduction<sum>`, `nvshmem` of `#tgraph.transport<nvshmem>`."""
    a = op.attributes[attr]
    for cls in ENUM_ATTRS:
        if cls.isinstance(a):
            return cls(a).value
    raise TypeError(f"attribute '{attr}' of '{op.name}' is not a Tessera enum: {a}")
