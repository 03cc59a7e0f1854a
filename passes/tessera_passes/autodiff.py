"""tessera-autodiff: replace each `tgraph.grad` with its backward computation.

For `%g:n = tgraph.grad %loss wrt %w1, ..., %wn` the pass walks, in reverse
program order, the ops that lie on a path from some `%wi` to `%loss`, and
emits each op's vector-Jacobian product (VJP) right before the `tgraph.grad`:
given the cotangent of an op's result it adds the cotangents of its float
operands. The seed is d loss / d loss = 1. Cotangents reaching the same value
are summed; a `%wi` that `%loss` does not depend on gets a zero gradient.

Recomputation (`tessera.remat`): forward ops marked `tgraph.remat = {region
= R, policy = P}` are not kept for the backward. When the reverse walk
reaches region R's last op, the region's forward is copied right there (each
copy marked `tgraph.recompute = R`, which keeps CSE from merging it back
into the original) and the region's VJP rules read the copies; the
originals die with their last forward use. The copies are the same ops on
the same inputs, so they compute the same bits (the CPU kernels round every
op, whatever it is fused with). They are not sunk to their first readers:
a block's second half reads its first half, so that would not shrink the
working set, and it breaks the fused runs (measured: 1.25 MiB more at the
peak of an 8-block GPT). What a policy keeps instead
of recomputing: `nothing_saveable` nothing (only the region's inputs, which
are defined outside it), `dots_saveable` matmul products, `selective`
everything but attention (Megatron's selective recomputation of the
attention core); `none` marks a candidate region that is kept (the memory
budget may choose a policy for it). Copies nothing reads fold away.

Backward ops take the location of the forward op they come from, named
`tessera.backward` (which tessera-pipeline-schedule reads to tell a stage's
backward from its forward). Every rule below is Graph IR built with
`graph_builder`, so the backward code is partitioned, scheduled, fused and
tiled like the forward code. The rules
are checked against float64 finite differences in test/python/test_autodiff.py.
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import func, tgraph

from tessera_compiler.ir import graph_builder as gb
from tessera_compiler.ir import ops
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.pipeline import backward_location, recompute_location
from tessera_compiler.ir.remat import REMAT, RECOMPUTED, mark_copy, remat_of
from tessera_compiler.ir.sharding import Sharding, meshes_of
from tessera_compiler.ir.spmd import (PER_RANK_COLLECTIVES, Varying, axis_of, body_of,
                                     new_local_function, returned)
from tessera_compiler.ir.support import PassError, functions, ops_of, run_reporting, symbol_of
from tessera_compiler.ir.types import enum_of


def _attr_list(op, name) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _perm_inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _rematerialize(v: ir.Value) -> ir.Value:
    """A constant the backward code needs is made again where it is needed, so
    the forward kernel need not keep a buffer of it alive."""
    owner = v.owner
    if not isinstance(owner, ir.Block) and owner.name == "tgraph.fill":
        return gb.fill(gb.shape_of(v), gb.element_of(v), ir.FloatAttr(owner.attributes["value"]).value)
    return v


class Undifferentiable:
    """A VJP rule's answer for a float operand it gives no cotangent (the
    additive mask of attention): fine for a constant, an error where the
    operand depends on a value being differentiated (a silent zero would
    be a wrong gradient)."""

    def __init__(self, what: str):
        self.what = what


#: A unit attribute on an op whose results carry no gradient back (op.moe's
#: FP8 scales: a rounding's scale is a constant to the derivative).
NO_GRADIENT = "tgraph.no_gradient"


def vjp(op: ir.Operation, gs: list[ir.Value | None],
        differentiated=frozenset()) -> list[ir.Value | None]:
    """Cotangents of `op`'s operands given the cotangents `gs` of its results
    (None for a result the loss does not depend on); None for operands
    without one (integers, conditions, indices)."""
    name = op.name.split(".", 1)[1]
    x = [_rematerialize(v) for v in op.operands]
    out, g = op.results[0], gs[0]
    if any(c is not None for c in gs[1:]) and name != "attention":
        raise PassError(f"tessera-autodiff: cannot differentiate through '{op.name}'",
                        op.location)
    elementwise = ops.GRAPH_ELEMENTWISE.get(op.name)
    if elementwise is not None:      # the op table's rule (None: no derivative)
        return elementwise.vjp(x, out, g, op) if elementwise.vjp else [None] * len(x)
    if name == "broadcast":
        return [gb.sum_to(g, gb.shape_of(x[0]))]
    if name == "reduce":
        kind = enum_of(op)
        shape = gb.shape_of(x[0])
        if kind == "sum":
            return [gb.broadcast(g, shape)]
        if kind == "max":
            # The gradient flows to the elements equal to the maximum, split
            # evenly between ties (JAX's rule): tied copies of one value (an
            # embedding row looked up twice) then pass its derivative once.
            hit = gb.compare("eq", x[0], gb.broadcast(out, shape))
            zeros = gb.zeros_like(x[0])
            ties = gb.reduce(gb.select(hit, gb.fill(shape, gb.element_of(x[0]), 1.0), zeros),
                             "sum", list(ir.DenseI64ArrayAttr(op.attributes["dims"])))
            share = gb.broadcast(gb.binary("div", g, ties), shape)
            return [gb.select(hit, share, zeros)]
        raise PassError(f"tessera-autodiff: no derivative for a '{kind}' reduction", op.location)
    if name == "reshape":
        return [gb.reshape(g, gb.shape_of(x[0]))]
    if name == "transpose":
        return [gb.transpose(g, _perm_inverse(_attr_list(op, "perm")))]
    if name == "slice":
        return [gb.pad(g, _attr_list(op, "offsets"), gb.shape_of(x[0]))]
    if name == "pad":
        return [gb.slice_(g, _attr_list(op, "offsets"), gb.shape_of(x[0]))]
    if name == "concat":
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        grads, start = [], 0
        for v in x:
            shape = gb.shape_of(v)
            offsets = [0] * len(shape)
            offsets[dim] = start
            grads.append(gb.slice_(g, offsets, shape))
            start += shape[dim]
        return grads
    if name == "matmul":
        if len(gb.shape_of(x[1])) < len(gb.shape_of(x[0])):   # a weight shared by the rows
            return [gb.matmul(g, gb.swap_last(x[1])), gb.contract_rows(x[0], g)]
        return [gb.matmul(g, gb.swap_last(x[1])), gb.matmul(gb.swap_last(x[0]), g)]
    if name == "contract_rows":          # result[k, n] = sum over rows of a[r, k] b[r, n]
        return [gb.matmul(x[1], gb.swap_last(g)), gb.matmul(x[0], g)]
    if name == "gather":
        return [gb.scatter_add(g, x[1], gb.shape_of(x[0])[0]), None]
    if name == "scatter_add":
        return [gb.gather(g, x[1]), None]
    if name in ("dynamic_slice", "dynamic_update_slice"):
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        if name == "dynamic_slice":     # the block's cotangent in place, zeros around it
            return [gb.dynamic_update_slice(gb.zeros_like(x[0]), x[1], g, dim), None]
        size = gb.shape_of(x[2])[dim]   # the overwritten block passes nothing to x
        return [gb.dynamic_update_slice(g, x[1], gb.zeros_like(x[2]), dim), None,
                gb.dynamic_slice(g, x[1], dim, size)]
    if name == "dropout":     # the same mask and scale on the cotangent (the key: integers)
        return [gb.dropout(g, x[1], ir.FloatAttr(op.attributes["p"]).value), None]
    if name == "attention":
        if gs[1] is not None:
            raise PassError("tessera-autodiff: the log-sum-exp result of tgraph.attention "
                            "is not differentiable", op.location)
        # delta = rowsum(dout * out) in f32 (f64): the softmax Jacobian's
        # diagonal term, computed once here instead of in every backward tile
        # (with dropout too: rowsum(P * (Z * dP)) is dout . out).
        stat = gb.statistic_element(x[0])
        delta = gb.reduce(gb.binary("mul", gb.cast(g, stat), gb.cast(out, stat)), "sum",
                          [len(gb.shape_of(out)) - 1])
        spec = gb.AttentionSpec.of(op)
        grads = gb.attention_grad(*x[:3], g, op.results[1], delta, spec)
        mask = [Undifferentiable("the mask of tgraph.attention")] if spec.mask is not None else []
        return grads + mask + [None] * (len(spec.sides) - len(mask))   # (integers)
    if name in ("moe_dispatch", "moe_collect"):
        # Transposes of each other: a dispatched row's cotangent goes back to
        # its (token, choice), a collected one's to its row (sizes: none).
        layout = gb.DispatchLayout.of(op)
        routing = [None] * (len(x) - 1)           # experts (and base): integers
        if name == "moe_collect":
            return [gb.moe_dispatch(g, x[1], layout)[0]] + routing
        back = gb.moe_collect(g, x[1], layout)
        if len(gb.shape_of(x[0])) == 2:           # one row per token: sum its choices
            back = gb.reshape(gb.reduce(back, "sum", [1]), gb.shape_of(x[0]))
        return [back] + routing
    if name == "grouped_matmul":
        transposed = "transpose_rhs" in op.attributes
        groups = gb.shape_of(x[1])[0]
        dx = gb.grouped_matmul(g, x[1], x[2], transpose_rhs=not transposed)
        dw = gb.grouped_outer(g, x[0], x[2], groups) if transposed else \
            gb.grouped_outer(x[0], g, x[2], groups)
        return [dx, dw, None]
    if name in ("iota", "fill", "topk", "check_range"):     # (check_range: integers)
        return [None] * len(x)
    if name == "spmd":
        return _spmd_vjp(op, gs, differentiated)
    raise PassError(f"tessera-autodiff: no derivative rule for '{op.name}'", op.location)


# -- per-rank (local-view) code ----------------------------------------------------

def _spmd_vjp(op: ir.Operation, gs: list, differentiated) -> list:
    """The cotangents of a `tgraph.spmd`'s operands: another `tgraph.spmd`
    whose per-rank body runs reverse mode over a copy of the forward body;
    the forward values its code reads then come from the forward call
    (`_take_residuals`, `_with_results`) and the copy's unread rest is
    erased. A cotangent that differs between the ranks along an axis its input is
    not split over is a sum of the ranks' contributions (JAX's rule for
    values used by every rank): its out-sharding is partial over that axis,
    and the partitioner reduces it where it is read."""
    body = body_of(op)
    p2p = next((o for o in ops_of(body) if o.name in ("tgraph.send", "tgraph.recv")), None)
    if p2p is not None:
        # The backward would recompute the forward's communication and send
        # cotangents the other way, on every rank's program at once: not yet.
        raise PassError(f"tessera-autodiff: no derivative through per-rank sends and receives "
                        f"('{p2p.name}' in {symbol_of(body)}); take gradients of a function "
                        "without dist.send / dist.recv, or move the values with collectives",
                        p2p.location)
    in_specs = [Sharding.from_attr(a) for a in ir.ArrayAttr(op.attributes["in_shardings"])]
    out_specs = [Sharding.from_attr(a) for a in ir.ArrayAttr(op.attributes["out_shardings"])]
    mesh = meshes_of(body.parent)[(in_specs + out_specs)[0].mesh]
    wanted = [i for i, g in enumerate(gs) if g is not None]
    block = body.regions[0].blocks[0]
    n_in = len(block.arguments)
    outs = returned(body)
    types = [a.type for a in block.arguments] + [outs[i].type for i in wanted]
    backward = new_local_function(body.parent.regions[0].blocks[0], symbol_of(body) + "_vjp",
                                  types, body.location)
    entry = backward.regions[0].blocks[0]
    varying = Varying({a: _split_axes(s) | set(s.partial) for a, s in
                       zip(entry.arguments, in_specs)})
    for k, i in enumerate(wanted):          # a cotangent is uniform over summed axes
        varying.known[entry.arguments[n_in + k]] = _split_axes(out_specs[i])
    with ir.InsertionPoint(entry), op.location:
        mapping = dict(zip(block.arguments, entry.arguments[:n_in]))
        cloned = []
        for inner in _feeding(list(block.operations)[:-1], [outs[i] for i in wanted]):
            copy = inner.operation.clone(ip=ir.InsertionPoint(entry))
            for index, v in enumerate(inner.operation.operands):
                copy.operands[index] = mapping.get(v, v)
            mapping.update(zip(inner.operation.results, copy.results))
            cloned.append(copy)
        arguments = set(entry.arguments)

        def summed(value, g):
            # A value every rank holds alike, whose cotangent differs by rank,
            # was used by each rank's own computation: its cotangent is the
            # sum of theirs (an argument's sum is left to its out-sharding).
            if value not in arguments:
                for axis in sorted(varying(g) - varying(value)):
                    g = gb.all_reduce(g, "sum", mesh.name, axis)
            return g

        def rule(inner, cts, inner_differentiated):
            if inner.name in PER_RANK_COLLECTIVES:
                return _collective_vjp(inner, cts[0], varying, mesh)
            return vjp(inner, cts, inner_differentiated)

        seeds = [(mapping.get(outs[i], outs[i]), entry.arguments[n_in + k])
                 for k, i in enumerate(wanted)]
        # (The body's arguments whose operands really are differentiated.)
        checked = [a for a, v in zip(entry.arguments[:n_in], op.operands) if v in differentiated]
        cotangent = backprop(cloned, entry.arguments[:n_in], seeds, rule, summed, checked)
        grads = [cotangent.get(a) if a in cotangent else gb.zeros_like(a)
                 for a in entry.arguments[:n_in]]
        func.ReturnOp(grads)
    # The forward values the backward reads come from the forward call
    # (residuals) instead of its recomputed copies, unless the call is in a
    # recomputation region (ts.remat) or its body has other callers.
    inverse = {c: v for v, c in mapping.items() if not isinstance(v.owner, ir.Block)}
    residuals = [] if remat_of(op) is not None or _callers(body) != 1 else \
        _take_residuals(cloned, entry, varying, inverse)
    types += [arg.type for arg, _ in residuals]
    backward.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        types, [g.type for g in grads]))
    # A residual the body returns already (attention's output, read by its
    # gradient) comes back through that result in its out-sharding; the
    # others are returned as new per-rank results.
    returned_at = {v: i for i, v in enumerate(outs)}
    extra = [v for _, v in residuals if v not in returned_at]
    first_extra = len(op.results)
    if extra:
        op = _with_results(op, body, extra, mesh)
    results_attrs = list(ir.ArrayAttr(op.attributes["out_shardings"]))
    fresh = iter(range(first_extra, first_extra + len(extra)))
    taken = [returned_at[v] if v in returned_at else next(fresh) for _, v in residuals]
    out_attrs = []
    for g, spec in zip(grads, in_specs):
        summed = sorted(varying(g) - _split_axes(spec))
        out_attrs.append(Sharding(spec.mesh, spec.dims, tuple(summed)).to_attr())
    in_attrs = [s.to_attr() for s in in_specs] + \
        [out_specs[i].with_partial(()).to_attr() for i in wanted] + \
        [results_attrs[i] for i in taken]
    call = tgraph.SpmdOp([v.type for v in op.operands],
                         ir.FlatSymbolRefAttr.get(symbol_of(backward)),
                         list(op.operands) + [gs[i] for i in wanted]
                         + [op.results[i] for i in taken],
                         ir.ArrayAttr.get(in_attrs), ir.ArrayAttr.get(out_attrs))
    return list(call.results)


def _callers(body: ir.Operation) -> int:
    """How many tgraph.spmd ops call the per-rank function `body`."""
    module = body.parent
    name = symbol_of(body)
    count = 0
    for f in module.regions[0].blocks[0].operations:
        if f.operation.name != "func.func" or not f.operation.regions[0].blocks:
            continue
        for o in f.operation.regions[0].blocks[0].operations:
            if o.operation.name == "tgraph.spmd" and \
                    ir.FlatSymbolRefAttr(o.operation.attributes["body"]).value == name:
                count += 1
    return count


def _take_residuals(cloned: list, entry: ir.Block, varying: Varying, inverse: dict) -> list:
    """Replaces each value of the recomputed forward (`cloned`) that the
    backward code reads by a new argument of the backward body, erases the
    recomputation that is left unread, and returns (argument, forward value)
    pairs. (Ranked values only: a scalar stays recomputed, with what it
    needs.) Each argument varies as the value did."""
    inside = set(cloned)
    taken = []
    for c in cloned:
        for r in c.results:
            users = [u.owner for u in r.uses]
            if r not in inverse or not ir.RankedTensorType(r.type).shape or \
                    all(getattr(u, "operation", u) in inside for u in users):
                continue
            arg = entry.add_argument(r.type, r.location)
            varying.known[arg] = varying(r)
            r.replace_all_uses_with(arg)
            taken.append((arg, inverse[r]))
    for c in reversed(cloned):
        if not any(list(r.uses) for r in c.results):
            c.erase()
    return taken


def _with_results(op: ir.Operation, body: ir.Operation, extra: list, mesh) -> ir.Operation:
    """`op` (a tgraph.spmd) with the body values `extra` returned too, each
    as a result split over every mesh axis along its dimension 0 (a per-rank
    value: each rank's block its own); `op`'s uses go to the new op."""
    ret = list(body.regions[0].blocks[0].operations)[-1]
    with ir.InsertionPoint(ret), ret.location:
        func.ReturnOp(list(ret.operands) + extra)
    ret.erase()
    ftype = ir.FunctionType(ir.TypeAttr(body.attributes["function_type"]).value)
    body.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        list(ftype.inputs), list(ftype.results) + [v.type for v in extra]))
    every = tuple(mesh.axes)
    specs, types = [], []
    for v in extra:
        t = ir.RankedTensorType(v.type)
        shape = list(t.shape)
        shape[0] *= mesh.parts(every)
        types.append(ir.RankedTensorType.get(shape, t.element_type))
        specs.append(Sharding(mesh.name, (every,) + ((),) * (len(shape) - 1)).to_attr())
    with ir.InsertionPoint(op), op.location:
        new = tgraph.SpmdOp([r.type for r in op.results] + types, op.attributes["body"],
                            list(op.operands), op.attributes["in_shardings"],
                            ir.ArrayAttr.get(list(ir.ArrayAttr(op.attributes["out_shardings"]))
                                             + specs))
    for a in op.attributes:
        name = a if isinstance(a, str) else a.name
        if name not in ("body", "in_shardings", "out_shardings"):
            new.operation.attributes[name] = op.attributes[name]
    for old, r in zip(op.results, new.results):
        old.replace_all_uses_with(r)
    # (Erased once the pass is done: the reverse walk that asked for this
    # VJP still reads the old op's operands.)
    _REPLACED.append(op)
    return new.operation


#: Forward tgraph.spmd ops replaced by a copy returning residuals, erased at
#: the end of the pass.
_REPLACED: list = []


def _collective_vjp(op: ir.Operation, g: ir.Value, varying: Varying, mesh) -> list:
    """A per-rank collective's VJP, for the cotangent `g` of its result (the
    same on every rank when the result is: see accumulate). For an operand
    that differs by rank: an all_reduce passes the cotangent on, an
    all_gather hands each rank its block of it, a reduce_scatter all-gathers
    it, an all_to_all sends it back. An operand every rank holds alike was
    combined as each rank's own copy, so its cotangent is summed over the
    axis too (JAX's transpose of the implicit pbroadcast)."""
    axis = axis_of(op)
    n = mesh.axis_size(axis)
    if op.name == "tgraph.all_reduce":
        if enum_of(op) != "sum":
            raise PassError(f"tessera-autodiff: no derivative for a '{enum_of(op)}' "
                            "all_reduce", op.location)
        ct = g
    elif op.name == "tgraph.all_gather":
        ct = gb.axis_slice(g, mesh.name, axis, ir.IntegerAttr(op.attributes["dim"]).value, n)
    elif op.name == "tgraph.reduce_scatter":
        ct = gb.all_gather(g, mesh.name, axis, ir.IntegerAttr(op.attributes["dim"]).value, n)
    elif op.name == "tgraph.all_to_all":
        # Sent back the way it came: an MoE exchange's backward uses its
        # forward's transport, and a ragged one's counts swap (what came
        # from rank i goes back to it).
        counts = list(op.operands)[1:]
        ct = gb.all_to_all(g, mesh.name, axis, ir.IntegerAttr(op.attributes["concat_dim"]).value,
                           ir.IntegerAttr(op.attributes["split_dim"]).value, n,
                           enum_of(op, "transport") if "transport" in op.attributes else None,
                           (counts[1], counts[0]) if counts else None,
                           ir.IntegerAttr(op.attributes["channels"]).value
                           if "channels" in op.attributes else None)
    else:
        raise PassError(f"tessera-autodiff: no derivative rule for '{op.name}'", op.location)
    if axis not in varying(op.operands[0]):
        ct = gb.all_reduce(ct, "sum", mesh.name, axis)
    return [ct]


def _feeding(body: list, targets) -> list:
    """The ops of `body` whose results `targets` depend on, in order: the
    forward work a backward body must recompute (the rest is dead there)."""
    needed, kept = set(targets), []
    for op in reversed(body):
        op = op.operation
        if any(r in needed for r in op.results):
            kept.append(op)
            needed.update(op.operands)
    return list(reversed(kept))


def _split_axes(sharding: Sharding) -> set:
    return {a for d in sharding.dims for a in d}


def _ops_between(body: list, sources, targets) -> list:
    """The ops of `body` on a path from some `sources` value to some `targets` value."""
    depends = set(sources)
    forward = []
    for op in body:
        if any(v in depends for v in op.operands):
            forward.append(op)
            depends.update(op.results)
    return _feeding(forward, targets)


#: ops never copied: a per-rank body's VJP recomputes its body itself
NOT_RECOMPUTED = {"tgraph.spmd", "tgraph.grad"}


class Recompute:
    """The recomputed copies of the regions' forward ops, made the first time
    the reverse walk needs one (at the region's last op: right before its
    backward, so the copies live only as long as the backward reads them)."""

    def __init__(self, body: list):
        self.regions: dict = {}
        for op in body:
            marked = remat_of(op)
            if marked is not None and marked[1] != "none":
                self.regions.setdefault(marked[0], (marked[1], []))[1].append(op)
        self.copies: dict = {}          # forward op -> its copy
        self.done: set = set()

    def primal(self, op: ir.Operation) -> ir.Operation:
        """The op whose operands and results `op`'s VJP should read."""
        marked = remat_of(op)
        if marked is None or marked[0] not in self.regions:
            return op
        if marked[0] not in self.done:
            self.done.add(marked[0])
            self._copy(marked[0])
        return self.copies.get(op, op)

    def _copy(self, region: int) -> None:
        policy, region_ops = self.regions[region]
        recomputed = RECOMPUTED[policy]
        mapping: dict = {}
        for op in region_ops:
            if op.name in NOT_RECOMPUTED or not recomputed(op):
                continue
            copy = op.clone()
            for index, v in enumerate(op.operands):
                copy.operands[index] = mapping.get(v, v)
            copy.location = recompute_location(op.location)
            mark_copy(copy, region)
            mapping.update(zip(op.results, copy.results))
            self.copies[op] = copy


def _pieces(g: ir.Value):
    """(input, offsets) of a `tgraph.pad` result, else None."""
    op = g.owner
    if isinstance(op, ir.Block) or op.name != "tgraph.pad":
        return None
    return op.operands[0], _attr_list(op, "offsets")


def _joined_pads(a: ir.Value, b: ir.Value) -> ir.Value | None:
    """a + b where both are pads (of zeros) of boxes that differ along one
    dimension only and meet there: a pad of their inputs' concatenation, or
    that concatenation where it fills the shape. The cotangents of slices
    that split a tensor (qkv into q, k, v) then sum into one concat, not
    three full-size pads and two adds; each element is its one piece's
    (x + 0 = x: the same values, and no add kernel)."""
    pa, pb = _pieces(a), _pieces(b)
    if pa is None or pb is None or a.type != b.type:
        return None
    (xa, oa), (xb, ob) = pa, pb
    sa, sb = gb.shape_of(xa), gb.shape_of(xb)
    differ = [d for d in range(len(oa)) if (oa[d], sa[d]) != (ob[d], sb[d])]
    if len(differ) != 1:
        return None
    d = differ[0]
    if oa[d] + sa[d] == ob[d]:
        first, second, offsets = xa, xb, oa
    elif ob[d] + sb[d] == oa[d]:
        first, second, offsets = xb, xa, ob
    else:
        return None
    parts = []
    for x in (first, second):            # a concatenation along d joins flat
        inner = x.owner
        flat = not isinstance(inner, ir.Block) and inner.name == "tgraph.concat" and \
            ir.IntegerAttr(inner.attributes["dim"]).value == d
        parts += list(inner.operands) if flat else [x]
    return gb.pad(gb.concat(parts, d), offsets, gb.shape_of(a))


def backprop(body: list, sources, seeds, rule=None, adjust=None, checked=None) -> dict:
    """Reverse mode over the ops of `body` on a path from `sources` to the
    seeded values: `seeds` are (value, cotangent) pairs; `rule(op, cts,
    differentiated)` gives an op's operand cotangents (default `vjp`;
    `differentiated`: the values a cotangent can reach from the sources);
    `adjust(value, ct)` may change a cotangent before it is added to
    `value`'s; `checked`: the
    sources an `Undifferentiable` operand may not depend on (default: all).
    Builds at the current insertion point; returns every value's summed
    cotangent."""
    rule = rule or vjp
    recompute = Recompute(body)
    cotangent: dict = {}

    def accumulate(value, g):
        if adjust is not None:
            g = adjust(value, g)
        if value in cotangent:
            joined = _joined_pads(cotangent[value], g)
            g = gb.binary("add", cotangent[value], g) if joined is None else joined
        cotangent[value] = g

    for value, g in seeds:
        accumulate(value, g)
    between = _ops_between(body, sources, [v for v, _ in seeds])
    # Values a cotangent can reach: float results of ops with such an operand
    # (a comparison's boolean result carries none).
    differentiated = set(sources if checked is None else checked)
    for op in between:
        if any(v in differentiated for v in op.operands) and NO_GRADIENT not in op.attributes:
            differentiated.update(r for r in op.results if gb.is_float(r))
    for op in reversed(between):
        cts = [cotangent.get(r) for r in op.results]
        if all(g is None for g in cts) or NO_GRADIENT in op.attributes:
            continue
        with backward_location(op.location):
            for operand, ct in zip(op.operands, rule(recompute.primal(op), cts, differentiated)):
                if isinstance(ct, Undifferentiable):
                    if operand in differentiated:
                        raise PassError(f"tessera-autodiff: {ct.what} depends on a value being "
                                        "differentiated, and it has no gradient (pass it as a "
                                        "constant, or compute the scores in its place)",
                                        op.location)
                elif ct is not None and gb.is_float(operand):
                    accumulate(operand, ct)
    return cotangent


def differentiate(grad_op: ir.Operation) -> None:
    loss, *wrt = list(grad_op.operands)
    block_ops = ops_of(grad_op.parent)
    with ir.InsertionPoint(grad_op), backward_location(grad_op.location):
        seeds = [(loss, gb.fill([], gb.element_of(loss), 1.0))] if wrt else []
        cotangent = backprop(block_ops[: block_ops.index(grad_op)], wrt, seeds)
        grads = [cotangent[w] if w in cotangent else gb.zeros_like(w) for w in wrt]
    for result, g in zip(grad_op.results, grads):
        result.replace_all_uses_with(g)
    grad_op.erase()


def run(op, pass_, options: TargetOptions):
    def body():
        _REPLACED.clear()
        for f in list(functions(op)):     # (differentiating adds per-rank bodies)
            for o in ops_of(f):
                if o.name == "tgraph.grad":
                    differentiate(o)
        while _REPLACED:
            _REPLACED.pop().erase()
        for f in functions(op):           # the regions are consumed
            for o in ops_of(f):
                if REMAT in o.attributes:
                    del o.attributes[REMAT]
    run_reporting(op, pass_, body)
