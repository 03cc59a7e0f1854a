"""tessera-partition: SPMD-partition Graph IR.

Rewrites each distributed function from global to per-rank (local) shapes.
For every op it asks the sharding rules which layout each operand must have
and inserts the collectives that move the operand there:

  pending partial sum  -> all_reduce, or reduce_scatter when the target also
                          splits a dimension over that axis (one collective)
  split dimension      -> all_gather along it (when the target splits it less)

A partial sum is kept lazy: it is reduced only when a consumer (a nonlinear
op, a matmul against another partial value, or the function's result) needs
the full value. Function results are replicated unless their `tgraph.sharding`
result attribute says otherwise. The function is marked `tgraph.partitioned`.
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph

from tessera_compiler.passes_common import (PassError, arg_attr_dicts,
                                            function_type, location_name, ops_of, run_reporting,
                                            set_dict_entry, set_function_type)
from tessera_compiler.sharding import Mesh, Sharding, rule_for

from .propagate_sharding import (SHARDING, argument_shardings, distributed_functions,
                                 result_shardings)


def _local_type(global_type: ir.Type, mesh: Mesh, s: Sharding, what: str,
                loc: ir.Location) -> ir.RankedTensorType:
    t = ir.RankedTensorType(global_type)
    shape = list(t.shape)
    for d, (size, axes) in enumerate(zip(shape, s.dims)):
        parts = mesh.parts(axes)
        if size % parts:
            raise PassError(
                f"dimension {d} of {what} (size {size}) is not divisible by mesh axis "
                f"{'*'.join(repr(a) for a in axes)} (size {parts})", loc)
    return ir.RankedTensorType.get(mesh.local_shape(shape, s), t.element_type)


class Resharder:
    """Inserts the collectives that move a local value between shardings."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.mesh_ref = ir.FlatSymbolRefAttr.get(mesh.name)
        self.sum = ir.Attribute.parse("#tgraph.reduction<sum>")

    def __call__(self, value: ir.Value, current: Sharding, target: Sharding,
                 before: ir.Operation) -> ir.Value:
        if current == target:
            return value
        loc = before.location
        with ir.InsertionPoint(before), loc:
            dims = [list(d) for d in current.dims]
            # 1. Pending partial sums the target does not keep.
            for axis in current.partial:
                if axis in target.partial:
                    continue
                scatter_dim = next((d for d, t in enumerate(target.dims)
                                    if list(t) == dims[d] + [axis]), None)
                if scatter_dim is not None:
                    value = self._reduce_scatter(value, axis, scatter_dim)
                    dims[scatter_dim].append(axis)
                else:
                    value = tgraph.AllReduceOp(value, self.sum, self.mesh_ref,
                                               ir.StringAttr.get(axis)).result
            if set(target.partial) - set(current.partial):
                raise PassError(f"cannot turn a value with sharding {current.describe()} "
                                f"into a partial sum {target.describe()}", loc)
            # 2. Split dimensions the target splits less (innermost axis first).
            for d, want in enumerate(target.dims):
                want = list(want)
                if dims[d] == want:
                    continue
                if dims[d][: len(want)] != want:
                    raise PassError(
                        f"resharding dimension {d} from {current.describe()} to "
                        f"{target.describe()} needs a local slice, which tessera-partition "
                        "does not insert yet; annotate the producer with the target layout",
                        loc)
                while len(dims[d]) > len(want):
                    value = self._all_gather(value, dims[d].pop(), d)
        return value

    def _all_gather(self, value, axis, dim):
        t = ir.RankedTensorType(value.type)
        shape = list(t.shape)
        shape[dim] *= self.mesh.axis_size(axis)
        result = ir.RankedTensorType.get(shape, t.element_type)
        return tgraph.AllGatherOp(result, value, self.mesh_ref, ir.StringAttr.get(axis),
                                  ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim)).result

    def _reduce_scatter(self, value, axis, dim):
        t = ir.RankedTensorType(value.type)
        shape = list(t.shape)
        shape[dim] //= self.mesh.axis_size(axis)
        result = ir.RankedTensorType.get(shape, t.element_type)
        return tgraph.ReduceScatterOp(result, value, self.sum, self.mesh_ref,
                                      ir.StringAttr.get(axis),
                                      ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim)).result


def partition_function(func_op: ir.Operation, mesh: Mesh) -> None:
    block = func_op.regions[0].blocks[0]
    ftype = function_type(func_op)
    reshard = Resharder(mesh)
    current: dict = {}

    arg_dicts = arg_attr_dicts(func_op, "arg_attrs")
    new_inputs = []
    for i, (arg, s) in enumerate(zip(block.arguments, argument_shardings(func_op, mesh))):
        local = _local_type(arg.type, mesh, s, f"argument #{i} ({_arg_label(arg)})", arg.location)
        arg.set_type(local)
        new_inputs.append(local)
        current[arg] = s
        arg_dicts[i] = set_dict_entry(arg_dicts[i], SHARDING, s.to_attr())

    wanted_results = result_shardings(func_op, mesh, ftype.results)
    for op in ops_of(func_op):
        if op.name == "func.return":
            for i, (v, want) in enumerate(zip(list(op.operands), wanted_results)):
                op.operands[i] = reshard(v, current[v], want, op)
            continue
        if op.name == "tgraph.shard":
            target = Sharding.from_attr(op.attributes["sharding"])
            src = op.operands[0]
            new_value = reshard(src, current[src], target, op)
            current[new_value] = target
            op.results[0].replace_all_uses_with(new_value)
            op.erase()
            continue
        if not op.name.startswith("tgraph.") or len(op.results) != 1:
            raise PassError(f"tessera-partition does not know how to partition '{op.name}'",
                            op.location)
        rule = rule_for(op, [current[v] for v in op.operands], mesh.name)
        for i, (v, want) in enumerate(zip(list(op.operands), rule.operands)):
            op.operands[i] = reshard(v, current[v], want, op)
        result = op.results[0]
        result.set_type(_local_type(result.type, mesh, rule.result, f"the result of {op.name}",
                                    op.location))
        op.attributes[SHARDING] = rule.result.to_attr()
        current[result] = rule.result

    res_dicts = arg_attr_dicts(func_op, "res_attrs")
    res_dicts = [set_dict_entry(d, SHARDING, s.to_attr()) for d, s in zip(res_dicts, wanted_results)]
    ret = ops_of(func_op)[-1]
    set_function_type(func_op, new_inputs, [v.type for v in ret.operands])
    func_op.attributes["arg_attrs"] = ir.ArrayAttr.get(list(arg_dicts))
    func_op.attributes["res_attrs"] = ir.ArrayAttr.get(list(res_dicts))
    func_op.attributes["tgraph.partitioned"] = ir.UnitAttr.get()


def _arg_label(arg: ir.Value) -> str:
    """The Python parameter name when the frontend recorded one (a NameLoc)."""
    return location_name(arg.location) or arg.get_name()


def run(op, pass_):
    def body():
        for f, mesh in distributed_functions(op):
            partition_function(f, mesh)
    run_reporting(op, pass_, body)
