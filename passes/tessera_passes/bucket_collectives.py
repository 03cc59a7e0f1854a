"""tessera-bucket-collectives: fuse all-reduces that can wait for each other.

Every all_reduce costs a synchronization of its group and a message latency,
whatever its size; a training step all-reduces one gradient per parameter.
This pass groups all_reduces of one kind (axis, reduction, deterministic,
element type) whose operands all exist before any of their results is first
used, and replaces each group by one all_reduce of the concatenated values
(flattened), sliced apart afterwards:

    %a' = all_reduce %a    %b' = all_reduce %b      (both used later)
      ->  %c = concat(reshape %a, reshape %b); %r = all_reduce %c;
          %a' = reshape(slice %r), %b' = reshape(slice %r)

A group never includes an all_reduce whose operand depends on another's
result (its operand would not exist yet), so the order of computation is
kept. Elementwise reductions commute with concatenation, and a deterministic
tree is per element, so the results are the same bits. Groups are capped at
the `bucket-elements` option (default 2^24 elements, 64 MiB of float32).
Runs on partitioned functions (after tessera-partition), except pipelined
ones: their all_reduces belong to different ranks' stages until
tessera-pipeline-schedule has placed them, which then buckets them itself
(`bucket_all_reduces`), buckets within one rank's stage action, the new
ops in that action.
"""

from __future__ import annotations

import math

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph

from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.packing import pack, unpack
from tessera_compiler.ir.pipeline import ACTION, copy_action
from tessera_compiler.ir.support import functions, ops_of, partitioned_all_reduces, run_reporting

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


def run(op, pass_, options: TargetOptions):
    def body():
        for f in list(functions(op)):
            if partitioned_all_reduces(f, "tessera-bucket-collectives"):
                bucket_all_reduces(f, options.bucket_elements)
    run_reporting(op, pass_, body)
