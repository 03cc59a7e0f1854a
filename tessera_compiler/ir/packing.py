"""Many tensors moved as one: flattened and concatenated before a
collective, sliced apart and reshaped after it (tessera-bucket-collectives'
all_reduce buckets, tessera-pipeline-schedule's result broadcasts). Every
function builds at the current insertion point and location and returns
the ops it made, so a pass can place them."""

from __future__ import annotations

import math

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph


def pack(values: list) -> tuple[list, ir.Value]:
    """`values` (one element type) as one 1-D tensor, in order."""
    elem = ir.RankedTensorType(values[0].type).element_type
    made, flats = [], []
    for v in values:
        n = math.prod(ir.RankedTensorType(v.type).shape)
        if list(ir.RankedTensorType(v.type).shape) != [n]:
            r = tgraph.ReshapeOp(ir.RankedTensorType.get([n], elem), v)
            made.append(r.operation)
            v = r.result
        flats.append(v)
    total = sum(ir.RankedTensorType(f.type).shape[0] for f in flats)
    joined = tgraph.ConcatOp(ir.RankedTensorType.get([total], elem), flats,
                             ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0))
    made.append(joined.operation)
    return made, joined.result


def unpack(joined: ir.Value, types: list) -> tuple[list, list]:
    """`joined` (what `pack` made, or a collective's result of it) cut back
    into tensors of `types`, in order."""
    elem = ir.RankedTensorType(joined.type).element_type
    made, outs, offset = [], [], 0
    for t in types:
        n = math.prod(ir.RankedTensorType(t).shape)
        piece = tgraph.SliceOp(ir.RankedTensorType.get([n], elem), joined,
                               ir.DenseI64ArrayAttr.get([offset]))
        made.append(piece.operation)
        out = piece.result
        if out.type != t:
            shaped = tgraph.ReshapeOp(t, out)
            made.append(shaped.operation)
            out = shaped.result
        outs.append(out)
        offset += n
    return made, outs


def _piece(value: ir.Value):
    """(joined, offset, size) when `value` is an `unpack` piece: a 1-D slice
    of a 1-D tensor, possibly reshaped (and reshaped back); else None."""
    owner = value.owner
    while not isinstance(owner, ir.Block) and owner.name == "tgraph.reshape":
        owner = owner.operands[0].owner
    if isinstance(owner, ir.Block) or owner.name != "tgraph.slice":
        return None
    source = owner.operands[0]
    if len(ir.RankedTensorType(source.type).shape) != 1:
        return None
    offset = ir.DenseI64ArrayAttr(owner.attributes["offsets"])[0]
    return source, offset, ir.RankedTensorType(owner.results[0].type).shape[0]


def fold_repacks(ops: list) -> None:
    """A `pack` of the pieces of one `unpack`, all of them in order (a
    pipeline's results packed for their broadcast right after their dp
    all_reduce was bucketed), is the packed value itself: its concat is
    replaced by it, and what fed only the concat is erased."""
    for op in ops:
        if op.name != "tgraph.concat":
            continue
        pieces = [_piece(v) for v in op.operands]
        if any(p is None for p in pieces) or len({id(p[0].owner) for p in pieces}) != 1:
            continue
        joined, offset = pieces[0][0], 0
        for _, at, size in pieces:
            if at != offset:
                break
            offset += size
        else:
            if offset != ir.RankedTensorType(joined.type).shape[0] or \
                    joined.type != op.results[0].type:
                continue
            feeding = [v.owner for v in op.operands]
            op.results[0].replace_all_uses_with(joined)
            op.erase()
            while feeding:                  # reshapes and slices nothing else reads
                made = feeding.pop()
                if not isinstance(made, ir.Block) and made.name in ("tgraph.reshape", "tgraph.slice") \
                        and not list(made.results[0].uses):
                    feeding.append(made.operands[0].owner)
                    made.erase()
