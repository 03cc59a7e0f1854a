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
