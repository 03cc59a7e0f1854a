"""tessera-propagate-sharding: give every tgraph value a sharding.

Starts from the `tgraph.sharding` attributes of function arguments (an
argument without one is replicated) and walks the body forward, applying the
per-op rules of `tessera_compiler.sharding`. Each op gets a `tgraph.sharding`
attribute describing its result; `tgraph.shard` pins a value's sharding.
Collectives are per-rank ops and may only appear after partitioning.
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.passes_common import (PassError, arg_attr_dicts, functions,
                                            ops_of, run_reporting)
from tessera_compiler.sharding import (PER_RANK_OPS, Context, Mesh, Rule, Sharding, meshes_of,
                                      rule_for)

SHARDING = "tgraph.sharding"
#: Function attribute: reduce pending sums in a fixed order (see Context).
DETERMINISTIC = "tgraph.deterministic"
#: Function attribute: mesh axes whose pending sums are reduce-scattered (each
#: rank keeps a block) rather than all-reduced when a consumer needs them
#: summed; the ZeRO strategy sets it to the data-parallel axis.
SCATTER_AXES = "tgraph.scatter_partials"


def function_mesh(func_op: ir.Operation, meshes: dict[str, Mesh]) -> Mesh | None:
    """The mesh a function is distributed over: the one its argument shardings
    name, or the module's only mesh."""
    names = set()
    for d in arg_attr_dicts(func_op, "arg_attrs") + arg_attr_dicts(func_op, "res_attrs"):
        if SHARDING in d:
            names.add(Sharding.from_attr(d[SHARDING]).mesh)
    if len(names) > 1:
        raise PassError(f"function uses several meshes ({', '.join(sorted(names))}); "
                        "one function must run on one mesh", func_op.location)
    if names:
        return meshes[names.pop()]
    return next(iter(meshes.values())) if len(meshes) == 1 else None


def argument_shardings(func_op: ir.Operation, mesh: Mesh) -> list[Sharding]:
    block = func_op.regions[0].blocks[0]
    result = []
    for arg, d in zip(block.arguments, arg_attr_dicts(func_op, "arg_attrs")):
        rank = ir.RankedTensorType(arg.type).rank
        result.append(Sharding.from_attr(d[SHARDING]) if SHARDING in d
                      else Sharding.replicated(mesh.name, rank))
    return result


def result_shardings(func_op: ir.Operation, types) -> list[Sharding | None]:
    """The annotated shardings of the results; None where a result keeps the
    layout it is computed in (with any pending sum reduced)."""
    return [Sharding.from_attr(d[SHARDING]) if SHARDING in d else None
            for _, d in zip(types, arg_attr_dicts(func_op, "res_attrs"))]


def context_of(func_op: ir.Operation, mesh: Mesh) -> Context:
    return Context(mesh, deterministic=DETERMINISTIC in func_op.attributes)


def scatter_axes_of(func_op: ir.Operation) -> tuple[str, ...]:
    if SCATTER_AXES not in func_op.attributes:
        return ()
    return tuple(ir.StringAttr(a).value for a in ir.ArrayAttr(func_op.attributes[SCATTER_AXES]))


def _check_shardable(op: ir.Operation) -> None:
    name = op.name
    if name in PER_RANK_OPS:
        raise PassError(f"'{name}' is a per-rank collective and appears only after "
                        "tessera-partition; before it, change a layout with tgraph.shard",
                        op.location)
    if name == "tgraph.grad":
        raise PassError("run tessera-autodiff before tessera-propagate-sharding "
                        "(tgraph.grad is still here)", op.location)
    if not name.startswith("tgraph."):
        raise PassError(f"'{name}' has no sharding rule: only tgraph ops can be distributed",
                        op.location)


def summed(s: Sharding, shape, ctx: Context, scatter_axes=(), only=None) -> Sharding:
    """`s` with its pending sums reduced (those in `only`, default all): a sum
    over one of `scatter_axes` is reduce-scattered, splitting the first
    dimension that divides evenly; any other is all-reduced."""
    dims = [list(d) for d in s.dims]
    partial = list(s.partial)
    for axis in (s.partial if only is None else only):
        partial.remove(axis)
        if axis not in scatter_axes:
            continue
        for d, size in enumerate(shape):
            if size % (ctx.mesh.parts(dims[d]) * ctx.mesh.axis_size(axis)) == 0:
                dims[d].append(axis)
                break
    return Sharding(s.mesh, tuple(tuple(d) for d in dims), tuple(partial))


def use_counts(func_op: ir.Operation) -> dict:
    """How many operands read each value (a value read twice by one op counts twice)."""
    uses: dict = {}
    for op in ops_of(func_op):
        for v in op.operands:
            uses[v] = uses.get(v, 0) + 1
    return uses


def read_sharding(value, s: Sharding, uses: dict, ctx: Context, scatter_axes=()) -> Sharding:
    """The sharding an op reads `value` in. A pending sum several ops read is
    reduced once, before its first reader, rather than carried lazily into
    each (each would then reduce its own copy); a single reader keeps it lazy."""
    if s.partial and uses.get(value, 0) > 1:
        return summed(s, ctx.shape(value), ctx, scatter_axes)
    return s


def op_rule(op: ir.Operation, operands: list[Sharding], ctx: Context,
            scatter_axes=()) -> tuple[Rule, list[Sharding]]:
    """The rule for `op`, and the sharding each operand passes through first.

    The second list differs from `operands` only for a pending sum over one of
    `scatter_axes` that the op needs summed: it is reduce-scattered along its
    first evenly divisible dimension, and the rule is asked again for the
    now split operand (so the op, too, runs on one block per rank)."""
    _check_shardable(op)
    try:
        rule = rule_for(op, operands, ctx)
    except KeyError:
        raise PassError(f"no sharding rule for '{op.name}'", op.location) from None
    if not scatter_axes:
        return rule, operands
    staged = list(operands)
    for i, (have, want) in enumerate(zip(operands, rule.operands)):
        drop = [a for a in have.partial if a in scatter_axes and a not in want.partial
                and a not in {x for d in want.dims for x in d}]
        if drop:
            staged[i] = summed(have, ctx.shape(op.operands[i]), ctx, scatter_axes, only=drop)
    if staged != operands:
        rule = rule_for(op, staged, ctx)
    return rule, staged


def propagate(func_op: ir.Operation, mesh: Mesh) -> dict:
    """Maps every SSA value of the function to its sharding; annotates ops."""
    shardings = {}
    ctx = context_of(func_op, mesh)
    scatter = scatter_axes_of(func_op)
    uses = use_counts(func_op)
    block = func_op.regions[0].blocks[0]
    for arg, s in zip(block.arguments, argument_shardings(func_op, mesh)):
        shardings[arg] = s
    for op in ops_of(func_op):
        if op.name == "func.return":
            continue
        if op.name == "tgraph.shard":
            s = Sharding.from_attr(op.attributes["sharding"])
        else:
            read = [read_sharding(v, shardings[v], uses, ctx, scatter) for v in op.operands]
            s = op_rule(op, read, ctx, scatter)[0].result
        op.attributes[SHARDING] = s.to_attr()
        for r in op.results:
            shardings[r] = s
    return shardings


def distributed_functions(module_op: ir.Operation):
    """(function, mesh) for each not-yet-partitioned function that runs on a mesh."""
    meshes = meshes_of(module_op)
    for f in list(functions(module_op)):
        if "tgraph.partitioned" in f.attributes:
            continue
        mesh = function_mesh(f, meshes)
        if mesh is not None:
            yield f, mesh


def run(op, pass_):
    def body():
        for f, mesh in distributed_functions(op):
            propagate(f, mesh)
    run_reporting(op, pass_, body)
