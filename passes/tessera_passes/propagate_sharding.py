"""tessera-propagate-sharding: give every tgraph value a sharding.

Starts from the `tgraph.sharding` attributes of function arguments (an
argument without one is replicated) and walks the body forward, applying the
per-op rules of `sharding_rules.py`. Each op gets a `tgraph.sharding`
attribute describing its result as computed (its readers see the rule's
`restore` where it has one: attention over a sequence split); `tgraph.shard` pins a value's sharding, and
a `tgraph.spmd` gives its results its `out_shardings`.
Collectives are per-rank ops and may only appear after partitioning.
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.sharding import Mesh, Sharding, results_attr
from tessera_compiler.ir.support import ops_of, run_reporting

from .sharding_rules import (SHARDING, argument_shardings, context_of, distributed_functions,
                             op_rule, read_sharding, scatter_axes_of, use_counts)


def propagate(func_op: ir.Operation, mesh: Mesh, options=None, target=None) -> dict:
    """Maps every SSA value of the function to its sharding; annotates ops."""
    shardings = {}
    ctx = context_of(func_op, mesh, options, target)
    scatter = scatter_axes_of(func_op)
    uses = use_counts(func_op)
    block = func_op.regions[0].blocks[0]
    for arg, s in zip(block.arguments, argument_shardings(func_op, mesh)):
        shardings[arg] = s
    for op in ops_of(func_op):
        if op.name == "func.return":
            continue
        if op.name == "tgraph.spmd":      # results as its out_shardings say
            for r, attr in zip(op.results, ir.ArrayAttr(op.attributes["out_shardings"])):
                shardings[r] = Sharding.from_attr(attr)
            continue
        if op.name == "tgraph.shard":
            each = seen = [Sharding.from_attr(op.attributes["sharding"])]
        else:
            read = [read_sharding(v, shardings[v], uses, ctx, scatter) for v in op.operands]
            rule = op_rule(op, read, ctx, scatter)[0]
            each, seen = rule.of_results(op), rule.as_read(op)
        op.attributes[SHARDING] = results_attr(each)
        for r, s in zip(op.results, seen):
            shardings[r] = s
    return shardings


def run(op, pass_, options: TargetOptions):
    def body():
        for f, mesh in distributed_functions(op):
            propagate(f, mesh, options, options.resolved_target(op, default="cpu"))
    run_reporting(op, pass_, body)
