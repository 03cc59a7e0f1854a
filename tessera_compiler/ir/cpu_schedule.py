"""The CPU schedule's attributes (TTile.td, "The CPU schedule"): what the
passes tessera-cpu-in-place and tessera-cpu-fuse decide and the C++ printer
(codegen/tile_emitter.py) reads, as Python values.

    ttile.in_place    on a ttile.load: the tile is the loaded block itself (a
                      pointer into the buffer, no copy); on a ttile.store: the
                      stored tile was computed in the block it stores (the
                      store copies nothing)
    ttile.accumulate  on a ttile.dot: it adds into its accumulator's array (no
                      copy of the accumulator first)
    ttile.fused       on consecutive elementwise ops, fills, iotas, dropout
                      factors, broadcasts and in-place loads of one block:
                      the number of the one element loop they share (a value
                      only that loop reads is a scalar in it, not an array)

A missing attribute means the plain form: a load copies, a store copies, a
dot copies its accumulator, an op has a loop of its own. So the printer is
correct on any Tile IR; the passes make it fast.
"""

from __future__ import annotations

import math

from tessera_mlir import ir
from tessera_mlir.dialects import ttile

from .types import STORED_AS_BITS

IN_PLACE, ACCUMULATE, FUSED = "ttile.in_place", "ttile.accumulate", "ttile.fused"
#: Every CPU schedule attribute (the passes remove them before deciding afresh).
ATTRIBUTES = (IN_PLACE, ACCUMULATE, FUSED)

def in_place(op: ir.Operation) -> bool:
    return IN_PLACE in op.attributes


def accumulates(dot: ir.Operation) -> bool:
    return ACCUMULATE in dot.attributes


def fused(op: ir.Operation) -> int | None:
    """The number of the fused element loop `op` is in, or None."""
    return ir.IntegerAttr(op.attributes[FUSED]).value if FUSED in op.attributes else None


def clear(kernel: ir.Operation, names=ATTRIBUTES) -> None:
    """Removes the schedule attributes `names` from the ops in `kernel`."""
    def visit(op):
        for name in names:
            if name in op.attributes:
                del op.attributes[name]
        return ir.WalkResult.ADVANCE
    kernel.walk(visit, ir.WalkOrder.PRE_ORDER)


def stored_in_place_by(value: ir.Value) -> ir.Operation | None:
    """The `ttile.store {ttile.in_place}` that makes `value`'s tile the
    block it stores, or None."""
    for use in value.uses:
        op = use.owner.operation
        if op.name == "ttile.store" and use.operand_number == 0 and in_place(op):
            return op
    return None


# -- facts the passes and the printer share --------------------------------------

def tile_shape(t: ir.Type) -> list[int]:
    """The shape of a `!ttile.tile` (types.tile_of without the element
    type's name, which costs more than the rest: the passes ask often)."""
    return list(ttile.TileType(t).shape)


def placed_shape(access: ir.Operation, tile_shape: list[int], rank: int) -> list[int]:
    """A `ttile.load` / `ttile.store`'s tile shape padded to its buffer's
    `rank`: at its `dims`, else in the trailing dimensions (1 elsewhere)."""
    if "dims" not in access.attributes:
        return [1] * (rank - len(tile_shape)) + list(tile_shape)
    placed = [1] * rank
    for d, n in zip(ir.DenseI64ArrayAttr(access.attributes["dims"]), tile_shape):
        placed[d] = n
    return placed


def contiguous(tile_shape: list[int], shape: list[int]) -> bool:
    """Whether a tile of `tile_shape` (padded to the buffer's rank) is one
    contiguous block of a row-major buffer of `shape`: whole in every
    dimension after its first of extent > 1."""
    first = next((d for d, n in enumerate(tile_shape) if n > 1), len(shape))
    return all(tile_shape[d] == shape[d] for d in range(first + 1, len(shape)))


def block_of(access: ir.Operation, tile: ir.Value, buffer: ir.Value) -> bool:
    """Whether the tile `access` (a load or store) moves is one contiguous
    block of a buffer that is not 0-d and not held as converted bits."""
    mt = ir.MemRefType(buffer.type)
    shape = list(mt.shape)
    if not shape or str(mt.element_type) in STORED_AS_BITS:
        return False
    return contiguous(placed_shape(access, tile_shape(tile.type), len(shape)), shape)


def broadcast_index(op: ir.Operation, row: str, column: str, e: str) -> str | None:
    """Where a `ttile.broadcast` in a fused loop reads its source, the loop
    running over rows of the result's last dimension (`row`, `column`; `e`
    the flat element): the source's element `row` when it is one column,
    `column` when one row, the row's place in the source when the source is
    the result's trailing dimensions (a [1, 16, 128] position table over a
    [2, 16, 128] tile), `e` when it is the result's shape, 0 for one value;
    None for other broadcasts (a loop of their own)."""
    shape, src_shape = tile_shape(op.results[0].type), tile_shape(op.operands[0].type)
    source = [1] * (len(shape) - len(src_shape)) + list(src_shape)
    if source == list(shape):
        return e
    if source[-1] == 1 and source[:-1] == list(shape[:-1]):
        return row
    lead = next((d for d, n in enumerate(source) if n != 1), len(source))
    if lead == len(source):
        return "0"                              # one value
    if source[lead:] == list(shape[lead:]):
        rows = math.prod(source) // shape[-1]
        return column if rows == 1 else f"({row} % {rows}) * {shape[-1]} + {column}"
    return None
