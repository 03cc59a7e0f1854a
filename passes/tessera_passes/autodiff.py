"""tessera-autodiff: replace each `tgraph.grad` with its backward computation.

For `%g:n = tgraph.grad %loss wrt %w1, ..., %wn` the pass walks, in reverse
program order, the ops that lie on a path from some `%wi` to `%loss`, and
emits each op's vector-Jacobian product (VJP) right before the `tgraph.grad`:
given the cotangent of an op's result it adds the cotangents of its float
operands. The seed is d loss / d loss = 1. Cotangents reaching the same value
are summed; a `%wi` that `%loss` does not depend on gets a zero gradient.

Every rule below is Graph IR built with `graph_builder`, so the backward code
is partitioned, scheduled, fused and tiled like the forward code. The rules
are checked against float64 finite differences in test/python/test_autodiff.py.
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.ir import graph_builder as gb
from tessera_compiler.ir import ops
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.support import PassError, functions, ops_of, run_reporting
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


def vjp(op: ir.Operation, gs: list[ir.Value | None]) -> list[ir.Value | None]:
    """Cotangents of `op`'s operands given the cotangents `gs` of its results
    (None for a result the loss does not depend on); None for operands
    without one (integers, conditions, indices)."""
    name = op.name.split(".", 1)[1]
    x = [_rematerialize(v) for v in op.operands]
    out, g = op.results[0], gs[0]
    if len(gs) > 1 and name != "attention":
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
            # The gradient flows to the elements equal to the maximum.
            hit = gb.compare("eq", x[0], gb.broadcast(out, shape))
            return [gb.select(hit, gb.broadcast(g, shape), gb.zeros_like(x[0]))]
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
        return [gb.matmul(g, gb.swap_last(x[1])), gb.matmul(gb.swap_last(x[0]), g)]
    if name == "gather":
        return [gb.scatter_add(g, x[1], gb.shape_of(x[0])[0]), None]
    if name == "scatter_add":
        return [gb.gather(g, x[1]), None]
    if name == "attention":
        if gs[1] is not None:
            raise PassError("tessera-autodiff: the log-sum-exp result of tgraph.attention "
                            "is not differentiable", op.location)
        # delta = rowsum(dout * out) in f32 (f64): the softmax Jacobian's
        # diagonal term, computed once here instead of in every backward tile.
        stat = gb.statistic_element(x[0])
        delta = gb.reduce(gb.binary("mul", gb.cast(g, stat), gb.cast(out, stat)), "sum",
                          [len(gb.shape_of(out)) - 1])
        return gb.attention_grad(*x, g, op.results[1], delta, "causal" in op.attributes,
                                 ir.FloatAttr(op.attributes["scale"]).value)
    if name in ("iota", "fill"):
        return [None] * len(x)
    raise PassError(f"tessera-autodiff: no derivative rule for '{op.name}'", op.location)


def _relevant_ops(body: list[ir.Operation], wrt: list[ir.Value], loss: ir.Value) -> list:
    """Ops on a path from some `wrt` value to `loss`, in program order."""
    depends = set(wrt)           # values that depend on some wrt value
    forward = []
    for op in body:
        if any(v in depends for v in op.operands):
            forward.append(op)
            depends.update(op.results)
    needed = {loss}
    relevant = []
    for op in reversed(forward):
        if any(r in needed for r in op.results):
            relevant.append(op)
            needed.update(v for v in op.operands if v in depends)
    return list(reversed(relevant))


def differentiate(grad_op: ir.Operation) -> None:
    loss, *wrt = list(grad_op.operands)
    block_ops = ops_of(grad_op.parent)
    body = block_ops[: block_ops.index(grad_op)]
    ops = _relevant_ops(body, wrt, loss)
    cotangent: dict = {}

    def accumulate(value, g):
        if value in cotangent:
            g = gb.binary("add", cotangent[value], g)
        cotangent[value] = g

    with ir.InsertionPoint(grad_op), grad_op.location:
        if wrt:
            accumulate(loss, gb.fill([], gb.element_of(loss), 1.0))
        for op in reversed(ops):
            gs = [cotangent.get(r) for r in op.results]
            if all(g is None for g in gs):
                continue
            with op.location:
                for operand, ct in zip(op.operands, vjp(op, gs)):
                    if ct is not None and gb.is_float(operand):
                        accumulate(operand, ct)
        grads = [cotangent[w] if w in cotangent else gb.zeros_like(w) for w in wrt]
    for result, g in zip(grad_op.results, grads):
        result.replace_all_uses_with(g)
    grad_op.erase()


def run(op, pass_, options: TargetOptions):
    def body():
        for f in functions(op):
            for o in ops_of(f):
                if o.name == "tgraph.grad":
                    differentiate(o)
    run_reporting(op, pass_, body)
