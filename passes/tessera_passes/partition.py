"""tessera-partition: SPMD-partition Graph IR.

Rewrites each distributed function from global to per-rank (local) shapes.
For every op it asks the sharding rules (`sharding_rules.py`) which
layout each operand must have and inserts what moves the operand there:

  replicated -> split          tgraph.axis_slice (a local copy, no communication;
                               a broadcast or fill is re-created at the local shape)
  split on d -> split on e     tgraph.all_to_all
  pending partial sum          all_reduce, or reduce_scatter when the target
                               splits a dimension over that axis
  split -> less split          all_gather

A partial sum is kept lazy: it is reduced only when a consumer (a nonlinear
op, a matmul against another partial value) needs the full value. Results
keep the layout they are computed in, with pending sums reduced, unless a
`tgraph.sharding` result attribute asks for another. Every inserted
collective carries the location of the op that needed it, so a report can
point at the Python line. The function is marked `tgraph.partitioned`.

Function attributes: `tgraph.deterministic` (every reduction gets a fixed
order, and sums are reduced before any op that is not an add) and
`tgraph.scatter_partials` (axes whose sums are reduce-scattered: ZeRO).
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph

from tessera_compiler.ir import graph_builder as gb
from tessera_compiler.ir.locations import location_name
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.sharding import Mesh, Sharding, results_attr
from tessera_compiler.ir.spmd import body_of
from tessera_compiler.ir.support import (PassError, arg_attr_dicts, function_type,
                                         ops_of, run_reporting, set_dict_entry,
                                         set_function_type, symbol_of)
from tessera_compiler.ir.types import enum_of

from .sharding_rules import (SHARDING, Context, argument_shardings, context_of,
                             distributed_functions, op_rule, read_sharding, result_shardings,
                             scatter_axes_of, use_counts)



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
    """Inserts the ops that move a local value from one sharding to another."""

    def __init__(self, ctx: Context, current: dict):
        self.ctx = ctx                    # the mesh, deterministic mode, global shapes
        self.mesh = ctx.mesh
        self.deterministic = ctx.deterministic
        self.current = current            # value -> its sharding (the partitioner's map)
        # (value, target) -> resharded value: a value several ops need in the
        # same layout is moved once. Ops are visited in order, so the first
        # reshard dominates every later user.
        self.done: dict = {}

    def __call__(self, value: ir.Value, current: Sharding, target: Sharding,
                 before: ir.Operation, loc: ir.Location | None = None) -> ir.Value:
        if current == target:
            return value
        key = (value, target)
        if key not in self.done:
            self.done[key] = self._move(value, current, target, before, loc)
        return self.done[key]

    def _move(self, value, current, target, before, loc=None) -> ir.Value:
        remade = self._remake(value, target, before)
        if remade is not None:
            return remade
        # The reshard's Python line (profiles, flight recorder, errors): its
        # reader's, except a return's, which is the function's `def`: there
        # the op that produced the value says more.
        owner = getattr(value.owner, "operation", value.owner)
        if loc is None:
            loc = before.location
            if before.name == "func.return" and isinstance(owner, ir.Operation):
                loc = owner.location
        with ir.InsertionPoint(before), loc:
            dims = [list(d) for d in current.dims]
            want = [list(d) for d in target.dims]
            used = lambda: {a for d in dims for a in d}  # noqa: E731
            # 1. An axis that moves from one dimension to another: all_to_all.
            moved = True
            while moved:
                moved = False
                for e, have in enumerate(dims):
                    if not have or want[e][: len(have)] == have:
                        continue
                    axis = have[-1]
                    for d in range(len(dims)):
                        if d != e and want[d][: len(dims[d]) + 1] == dims[d] + [axis]:
                            value = self._all_to_all(value, axis, d, e)
                            dims[e].pop()
                            dims[d].append(axis)
                            moved = True
                            break
                    if moved:
                        break
            # 2. Local slices first: they shrink what any later collective moves.
            value = self._slices(value, dims, want, used, current.partial)
            # 3. Pending sums the target does not keep.
            for axis in current.partial:
                if axis in target.partial:
                    continue
                scatter_dim = next((d for d in range(len(dims))
                                    if want[d][: len(dims[d]) + 1] == dims[d] + [axis]), None)
                if scatter_dim is not None:
                    value = self._reduce_scatter(value, axis, scatter_dim)
                    dims[scatter_dim].append(axis)
                else:
                    value = self._all_reduce(value, "sum", axis)
            if set(target.partial) - set(current.partial):
                raise PassError(f"cannot turn a value with sharding {current.describe()} "
                                f"into a partial sum {target.describe()}", before.location)
            # 4. Gather what the target splits less (innermost axis first) ...
            for d in range(len(dims)):
                while dims[d] != want[d][: len(dims[d])]:
                    value = self._all_gather(value, dims[d].pop(), d)
            # 5. ... and slice what it splits more.
            value = self._slices(value, dims, want, used, ())
        return value

    def _remake(self, value, target: Sharding, before) -> ir.Value | None:
        """A fill, an iota along a dimension the target does not split, or
        a broadcast of a smaller value, is made again in the target layout
        (moving only the broadcast's input) rather than moving or slicing
        its large result: a broadcast bias or norm weight never travels,
        and a one-hot's [tokens, vocabulary] column numbers are made at
        the size of this rank's tokens."""
        owner = value.owner
        owner = getattr(owner, "operation", owner)
        if target.partial or not isinstance(owner, ir.Operation) or \
                owner.name not in ("tgraph.fill", "tgraph.broadcast", "tgraph.iota"):
            return None
        if owner.name == "tgraph.iota" and \
                target.dims[ir.IntegerAttr(owner.attributes["dim"]).value]:
            return None
        shape = self.ctx.shape(value)
        t = ir.RankedTensorType(value.type)
        local = ir.RankedTensorType.get(self.mesh.local_shape(shape, target), t.element_type)
        with ir.InsertionPoint(before), before.location:
            if owner.name == "tgraph.fill":
                return tgraph.FillOp(local, owner.attributes["value"]).result
            if owner.name == "tgraph.iota":
                return tgraph.IotaOp(local, owner.attributes["dim"]).result
            src = owner.operands[0]
            src_shape = self.ctx.shape(src)
            dims = [target.dims[d] if src_shape[d] == shape[d] else () for d in range(len(shape))]
            moved = self(src, self.current[src], Sharding(target.mesh, tuple(dims)), before)
            return tgraph.BroadcastOp(local, moved).result

    def _slices(self, value, dims, want, used, partial):
        for d in range(len(dims)):
            while (len(dims[d]) < len(want[d]) and dims[d] == want[d][: len(dims[d])]
                   and want[d][len(dims[d])] not in used() | set(partial)):
                axis = want[d][len(dims[d])]
                value = self._axis_slice(value, axis, d)
                dims[d].append(axis)
        return value

    def _all_reduce(self, value, kind, axis):
        return gb.all_reduce(value, kind, self.ctx.mesh.name, axis, self.deterministic)

    def _all_gather(self, value, axis, dim):
        return gb.all_gather(value, self.ctx.mesh.name, axis, dim, self.mesh.axis_size(axis))

    def _reduce_scatter(self, value, axis, dim):
        return gb.reduce_scatter(value, self.ctx.mesh.name, axis, dim,
                                 self.mesh.axis_size(axis), self.deterministic)

    def _all_to_all(self, value, axis, split_dim, concat_dim):
        return gb.all_to_all(value, self.ctx.mesh.name, axis, split_dim, concat_dim,
                             self.mesh.axis_size(axis))

    def _axis_slice(self, value, axis, dim):
        return gb.axis_slice(value, self.ctx.mesh.name, axis, dim, self.mesh.axis_size(axis))


def partition_function(func_op: ir.Operation, mesh: Mesh, options=None, target=None) -> None:
    block = func_op.regions[0].blocks[0]
    ftype = function_type(func_op)
    ctx = context_of(func_op, mesh, options, target)
    scatter = scatter_axes_of(func_op)
    current: dict = {}
    reshard = Resharder(ctx, current)

    arg_dicts = arg_attr_dicts(func_op, "arg_attrs")
    new_inputs = []
    for i, (arg, s) in enumerate(zip(block.arguments, argument_shardings(func_op, mesh))):
        local = _local_type(arg.type, mesh, s, f"argument #{i} ({_arg_label(arg)})", arg.location)
        ctx.global_shapes[arg] = list(ir.RankedTensorType(arg.type).shape)
        arg.set_type(local)
        new_inputs.append(local)
        current[arg] = s
        arg_dicts[i] = set_dict_entry(arg_dicts[i], SHARDING, s.to_attr())

    wanted_results = result_shardings(func_op, ftype.results)
    final_results = []
    inlined = []              # the local-view bodies inlined, erased at the end
    uses = use_counts(func_op)
    body_ops = ops_of(func_op)
    for index, op in enumerate(body_ops):
        if op.name != "func.return":
            # As propagation reads it (the Resharder's memo makes one reduction
            # serve every reader of a value).
            for i, v in enumerate(list(op.operands)):
                target = read_sharding(v, current[v], uses, ctx, scatter)
                if target != current[v]:
                    nv = op.operands[i] = reshard(v, current[v], target, op)
                    current[nv] = target
                    ctx.global_shapes[nv] = ctx.shape(v)
        if op.name == "func.return":
            for i, (v, want) in enumerate(zip(list(op.operands), wanted_results)):
                want = want or current[v].with_partial(())
                op.operands[i] = reshard(v, current[v], want, op)
                final_results.append(want)
            continue
        if op.name == "tgraph.spmd":
            inlined.append(_inline_spmd(op, reshard, current, ctx))
            continue
        if op.name == "tgraph.shard":
            target = Sharding.from_attr(op.attributes["sharding"])
            src = op.operands[0]
            new_value = reshard(src, current[src], target, op)
            current[new_value] = target
            ctx.global_shapes[new_value] = ctx.shape(src)
            op.results[0].replace_all_uses_with(new_value)
            op.erase()
            continue
        operands = [current[v] for v in op.operands]
        rule, staged = op_rule(op, operands, ctx, scatter)
        for i, v in enumerate(list(op.operands)):
            moved = reshard(v, operands[i], staged[i], op)
            moved = op.operands[i] = reshard(moved, staged[i], rule.operands[i], op)
            if moved not in current:
                current[moved] = rule.operands[i]
                ctx.global_shapes[moved] = ctx.shape(v)
        for r, s in zip(op.results, rule.of_results(op)):
            ctx.global_shapes[r] = ctx.shape(r)
            r.set_type(_local_type(r.type, mesh, s, f"the result of {op.name}", op.location))
            current[r] = s
        result = op.results[0]
        for name, value in rule.attrs.items():
            op.attributes[name] = ir.ArrayAttr.get([ir.StringAttr.get(a) for a in value])
        op.attributes[SHARDING] = results_attr(rule.of_results(op))
        if rule.post:
            # E.g. a max over a split dimension: all-reduce the local maxima
            # right away and let every later user read the reduced value.
            users = [(u.owner, u.operand_number) for u in result.uses]
            value = result
            with ir.InsertionPoint.after(op), op.location:
                for kind, axis in rule.post:
                    value = reshard._all_reduce(value, kind, axis)
            for owner, operand in users:
                owner.operands[operand] = value
            current[value] = rule.result
            ctx.global_shapes[value] = ctx.global_shapes[result]
        if rule.restore:
            _restore(op, rule, body_ops[index + 1], reshard, current, ctx, uses)

    for op in ops_of(func_op):
        if op.name == "tgraph.matmul" and "transport" in op.attributes:
            _hand_transport(op)
    for body in inlined:
        body.erase()
    res_dicts = arg_attr_dicts(func_op, "res_attrs")
    res_dicts = [set_dict_entry(d, SHARDING, s.to_attr()) for d, s in zip(res_dicts, final_results)]
    ret = ops_of(func_op)[-1]
    set_function_type(func_op, new_inputs, [v.type for v in ret.operands])
    func_op.attributes["arg_attrs"] = ir.ArrayAttr.get(list(arg_dicts))
    func_op.attributes["res_attrs"] = ir.ArrayAttr.get(list(res_dicts))
    func_op.attributes["tgraph.partitioned"] = ir.UnitAttr.get()


def _restore(op: ir.Operation, rule, following: ir.Operation, reshard, current: dict,
             ctx, uses: dict) -> None:
    """Moves each result of `op` to the sharding `rule.restore` gives it,
    before `following` (the next op) and at `op`'s Python line, and points
    its readers there (it has their count, `uses`, for read_sharding). A
    reader wanting the computed layout again (the attention backward reading
    its forward's out and lse) gets the computed value from the Resharder's
    memo, with no move back. (A rule with `post` has no `restore`.)"""
    assert not rule.post, "a rule both reduces its result (post) and moves it (restore)"
    for r, computed, wanted in zip(list(op.results), rule.of_results(op), rule.restore):
        if computed == wanted:
            continue
        readers = [(u.owner, u.operand_number) for u in r.uses]
        if not readers:          # (an unread lse: no collective for nothing)
            continue
        value = reshard(r, computed, wanted, following, loc=op.location)
        for owner, index in readers:
            owner.operands[index] = value
        current[value] = wanted
        ctx.global_shapes[value] = ctx.global_shapes[r]
        uses[value] = uses.get(r, 0)
        reshard.done[(value, computed)] = r


def _inline_spmd(op: ir.Operation, reshard, current: dict, ctx) -> str:
    """A `tgraph.spmd` call of a local-view body: each operand resharded to
    its in-sharding becomes the body's argument (its block is what the body
    computes on), the body's ops move here unchanged (they are per-rank
    already, their collectives explicit), and what the body returns stands
    for the op's results in their out-shardings. Returns the (now empty) body."""
    body = body_of(op)
    name = symbol_of(body)
    block = body.regions[0].blocks[0]
    for v, arg, attr in zip(list(op.operands), block.arguments,
                            ir.ArrayAttr(op.attributes["in_shardings"])):
        arg.replace_all_uses_with(reshard(v, current[v], Sharding.from_attr(attr), op))
    inner = [o.operation for o in block.operations]
    for o in inner[:-1]:
        o.move_before(op)
    for result, value, attr in zip(op.results, list(inner[-1].operands),
                                   ir.ArrayAttr(op.attributes["out_shardings"])):
        sharding = Sharding.from_attr(attr)
        if current.get(value, sharding) != sharding:
            raise PassError(f"the local-view function {name} returns one block as two results "
                            "with different layouts; return a copy for each", op.location)
        current[value] = sharding
        ctx.global_shapes[value] = list(ir.RankedTensorType(result.type).shape)
        result.replace_all_uses_with(value)
    op.erase()
    return body


def _hand_transport(matmul: ir.Operation) -> None:
    """Hands a matmul's `transport` to the collectives next to it that the
    partitioner inserted and tessera-lower-to-schedule can fuse with it: the
    all_gather of its lhs rows (a sequence-parallel input to a
    column-parallel weight) and the reduce_scatter of its partial sums over
    rows (a row-parallel weight's output made sequence-parallel). An
    explicit `nvshmem` that finds neither is an error: a request that
    silently did nothing would hide a sharding the user did not intend (or
    a lhs of rank above 2: the fused kernels take a 2-D lhs)."""
    rows = len(ir.RankedTensorType(matmul.results[0].type).shape) - 2
    lhs_owner = matmul.operands[0].owner
    neighbours = []
    if rows == 0:
        if not isinstance(lhs_owner, ir.Block):
            neighbours.append((lhs_owner, "tgraph.all_gather"))
        neighbours += [(u.owner, "tgraph.reduce_scatter") for u in matmul.results[0].uses]
    handed = False
    for op, wanted in neighbours:
        if op.name == wanted and ir.IntegerAttr(op.attributes["dim"]).value == rows:
            op.attributes["transport"] = matmul.attributes["transport"]
            handed = True
    if not handed and enum_of(matmul, "transport") == "nvshmem":
        raise PassError("transport = nvshmem: this matmul has no collective to fuse on this "
                        "mesh (neither an all-gather of its lhs rows nor a reduce-scatter of "
                        "its product over rows; the fused kernels take a 2-D lhs); use 'auto' "
                        "to fuse only where one applies", matmul.location)


def _arg_label(arg: ir.Value) -> str:
    """The Python parameter name when the frontend recorded one (a NameLoc)."""
    return location_name(arg.location) or arg.get_name()


def run(op, pass_, options: TargetOptions):
    def body():
        for f, mesh in distributed_functions(op):
            partition_function(f, mesh, options, options.resolved_target(op, default="cpu"))
    run_reporting(op, pass_, body)
