"""Many tensors moved as one: flattened and concatenated before a
collective, sliced apart and reshaped after it (tessera-bucket-collectives'
all_reduce buckets, `bucket_all_reduces`, also run by
tessera-pipeline-schedule, whose result broadcasts are packed too). Every
function builds at the current insertion point and location and returns
the ops it made, so a pass can place them."""

from __future__ import annotations

import math

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph

from .pipeline import ACTION, copy_action
from .support import ops_of


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


# -- all_reduce buckets (tessera-bucket-collectives; see its docstring) ------------

def _key(op: ir.Operation):
    t = ir.RankedTensorType(op.results[0].type)
    return (ir.StringAttr(op.attributes["axis"]).value, str(op.attributes["kind"]),
            "deterministic" in op.attributes, str(op.attributes["mesh"]), str(t.element_type),
            # A pipeline's: its rank and stage action (a bucket of one action
            # keeps the schedule's F -> B -> W order; the dp gradients' all
            # end in the last one).
            str(op.attributes[ACTION]) if ACTION in op.attributes else None)


def _groups(func_op: ir.Operation, bucket_elements: int) -> list[list[ir.Operation]]:
    ops = ops_of(func_op)
    position = {op: i for i, op in enumerate(ops)}

    def defined_at(value) -> int:
        owner = value.owner
        owner = getattr(owner, "operation", owner)
        return position.get(owner, -1) if isinstance(owner, ir.Operation) else -1

    def first_use(op) -> int:
        users = [getattr(u.owner, "operation", u.owner) for u in op.results[0].uses]
        return min((position[u] for u in users if u in position),
                   default=len(ops))

    open_groups: dict = {}       # key -> (members, deadline, elements)
    done = []
    for op in ops:
        if op.name != "tgraph.all_reduce":
            continue
        key = _key(op)
        size = math.prod(ir.RankedTensorType(op.results[0].type).shape)
        members, deadline, elements = open_groups.get(key, ([], -1, 0))
        if members and defined_at(op.operands[0]) < deadline and \
                elements + size <= bucket_elements:
            open_groups[key] = (members + [op], min(deadline, first_use(op)), elements + size)
            continue
        if len(members) > 1:
            done.append(members)
        open_groups[key] = ([op], first_use(op), size)
    done.extend(members for members, _, _ in open_groups.values() if len(members) > 1)
    return done


def _fuse(members: list[ir.Operation], func_op: ir.Operation) -> None:
    ops = ops_of(func_op)
    position = {op: i for i, op in enumerate(ops)}
    defs = [getattr(m.operands[0].owner, "operation", m.operands[0].owner) for m in members]
    last = max((d for d in defs if isinstance(d, ir.Operation) and d in position),
               key=lambda d: position[d], default=None)
    point = ir.InsertionPoint.after(last) if last is not None else \
        ir.InsertionPoint.at_block_begin(func_op.regions[0].blocks[0])
    first = members[0]
    with point, first.location:
        packing, joined = pack([m.operands[0] for m in members])
        reduced = tgraph.AllReduceOp(joined, first.attributes["kind"], first.attributes["mesh"],
                                     first.attributes["axis"],
                                     deterministic=True if "deterministic" in first.attributes
                                     else None)
        unpacking, outs = unpack(reduced.result, [m.results[0].type for m in members])
    copy_action(first, *packing, reduced, *unpacking)
    for m, out in zip(members, outs):
        m.results[0].replace_all_uses_with(out)
        m.erase()


def bucket_all_reduces(func_op: ir.Operation, bucket_elements: int) -> None:
    """Fuses `func_op`'s all_reduces into buckets (see the module docstring);
    in a scheduled pipeline, only those one rank runs, into ops on that rank."""
    for members in _groups(func_op, bucket_elements):
        _fuse(members, func_op)
