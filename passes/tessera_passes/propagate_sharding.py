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
from tessera_compiler.sharding import Mesh, Sharding, meshes_of, rule_for

SHARDING = "tgraph.sharding"


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


def result_shardings(func_op: ir.Operation, mesh: Mesh, types) -> list[Sharding]:
    """Required shardings of the results (replicated unless annotated)."""
    out = []
    for t, d in zip(types, arg_attr_dicts(func_op, "res_attrs")):
        out.append(Sharding.from_attr(d[SHARDING]) if SHARDING in d
                   else Sharding.replicated(mesh.name, ir.RankedTensorType(t).rank))
    return out


def op_result_sharding(op: ir.Operation, operands: list[Sharding], mesh: Mesh) -> Sharding:
    name = op.name
    if name == "tgraph.shard":
        return Sharding.from_attr(op.attributes["sharding"])
    if name in ("tgraph.all_reduce", "tgraph.all_gather", "tgraph.reduce_scatter"):
        raise PassError(f"'{name}' is a per-rank collective and appears only after "
                        "tessera-partition; before it, change a layout with tgraph.shard",
                        op.location)
    if name == "tgraph.grad":
        raise PassError("run tessera-autodiff before tessera-propagate-sharding "
                        "(tgraph.grad is still here)", op.location)
    if not name.startswith("tgraph.") or len(op.results) != 1:
        raise PassError(f"tessera-propagate-sharding does not know how to shard '{name}'",
                        op.location)
    return rule_for(op, operands, mesh.name).result


def propagate(func_op: ir.Operation, mesh: Mesh) -> dict:
    """Maps every SSA value of the function to its sharding; annotates ops."""
    shardings = {}
    block = func_op.regions[0].blocks[0]
    for arg, s in zip(block.arguments, argument_shardings(func_op, mesh)):
        shardings[arg] = s
    for op in ops_of(func_op):
        if op.name == "func.return":
            continue
        operands = [shardings[v] for v in op.operands]
        s = op_result_sharding(op, operands, mesh)
        op.attributes[SHARDING] = s.to_attr()
        shardings[op.results[0]] = s
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
