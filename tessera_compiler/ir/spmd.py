"""Per-rank (local-view) bodies: the `func.func` a `tgraph.spmd` calls, and
which mesh axes each of its values differs along.

A value in a per-rank body may differ between the ranks along some mesh
axes ("varies"): an input along the axes its spec splits or sums over; an
op's result along its operands' union; an all_reduce or all_gather over `a`
makes it the same along `a` (uniform), a reduce_scatter, all_to_all or
axis_slice over `a` makes it differ. The frontend checks out-shardings with
it; tessera-autodiff decides with it where a cotangent must be summed over
the ranks.
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import func

from .support import symbol_of

#: collectives after which a value is the same on every rank of the axis
UNIFORM_AFTER = ("tgraph.all_reduce", "tgraph.all_gather")
#: ops after which a value differs along the axis
VARYING_AFTER = ("tgraph.reduce_scatter", "tgraph.all_to_all", "tgraph.axis_slice",
                 "tgraph.ring_shift")
#: every per-rank op over one mesh axis
PER_RANK_COLLECTIVES = UNIFORM_AFTER + VARYING_AFTER


def body_of(spmd_op: ir.Operation) -> ir.Operation:
    """The `tgraph.local` function a `tgraph.spmd` calls."""
    module = spmd_op.parent
    while module.name != "builtin.module":
        module = module.parent
    name = ir.FlatSymbolRefAttr(spmd_op.attributes["body"]).value
    return ir.SymbolTable(module)[name].operation


def unique_symbol(module_block: ir.Block, base: str, but: ir.Operation | None = None) -> str:
    """`base`, with a number added if a symbol of the module (other than
    `but`) has that name."""
    taken = {symbol_of(o.operation) for o in module_block.operations
             if "sym_name" in o.operation.attributes and (but is None or o.operation != but)}
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    return name


def new_local_function(module_block: ir.Block, base: str, arg_types, loc: ir.Location,
                       arg_locs=None) -> ir.Operation:
    """An empty private per-rank function (`tgraph.local`) at the end of the
    module, named `base` (with a number added if that name is taken); its
    entry block has arguments of `arg_types` and no terminator yet."""
    name = unique_symbol(module_block, base)
    with ir.InsertionPoint(module_block), loc:
        f = func.FuncOp(name, (list(arg_types), []))
        f.attributes["sym_visibility"] = ir.StringAttr.get("private")
        f.attributes["tgraph.local"] = ir.UnitAttr.get()
        f.add_entry_block(arg_locs=arg_locs)
    return f.operation


def varies(op: ir.Operation, operand_axes: list[set]) -> set:
    """The axes `op`'s results vary along, given its operands'."""
    axes = set().union(*operand_axes) if operand_axes else set()
    if op.name in UNIFORM_AFTER:
        axes.discard(axis_of(op))
    elif op.name in VARYING_AFTER:
        axes.add(axis_of(op))
    return axes


def axis_of(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["axis"]).value


def varying_axes(body: ir.Operation, arg_axes: list[set]) -> "Varying":
    """Which axes `body`'s values vary along (call it on a value), given
    its arguments'."""
    block = body.regions[0].blocks[0]
    return Varying({arg: set(a) for arg, a in zip(block.arguments, arg_axes)})


def returned(body: ir.Operation) -> list[ir.Value]:
    """What the body returns."""
    return list(list(body.regions[0].blocks[0].operations)[-1].operands)


class Varying:
    """Which axes values of one per-rank body vary along, computed on demand
    from their defining ops (so it covers ops added after the body was
    traced, such as its backward code); `known` seeds the block arguments."""

    def __init__(self, known: dict):
        self.known = dict(known)

    def __call__(self, value: ir.Value) -> set:
        stack = [value]
        while stack:
            v = stack[-1]
            if v in self.known:
                stack.pop()
                continue
            if isinstance(v.owner, ir.Block):
                self.known[v] = set()
                stack.pop()
                continue
            op = v.owner.operation if hasattr(v.owner, "operation") else v.owner
            missing = [o for o in op.operands if o not in self.known]
            if missing:
                stack.extend(missing)
                continue
            axes = varies(op, [self.known[o] for o in op.operands])
            for r in op.results:
                self.known[r] = axes
            stack.pop()
        return self.known[value]
