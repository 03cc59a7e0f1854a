"""Tensor operators (`tessera.op`). Inside a function compiled by
`tessera.compile`, each call records a Graph IR op at the caller's source line."""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph

from ._trace import Traced, current_location, require_tracing
from .errors import ShapeError

__all__ = ["matmul", "relu", "add"]


def _result_type(shape, like: Traced) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), ir.RankedTensorType(like.value.type).element_type)


def _check_dtypes(name, src, *xs):
    if len({x.dtype for x in xs}) > 1:
        raise ShapeError(f"op.{name}: operand dtypes differ: "
                         f"{', '.join(str(x.dtype) for x in xs)}  [{src}]")


def matmul(a: Traced, b: Traced) -> Traced:
    """`a[..., M, K] @ b[..., K, N]`."""
    src = require_tracing("matmul", a, b)
    _check_dtypes("matmul", src, a, b)
    if a.ndim < 2 or a.ndim != b.ndim:
        raise ShapeError(f"op.matmul: operands must have the same rank >= 2, got shapes "
                         f"{a.shape} and {b.shape}  [{src}]")
    if a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"op.matmul: batch dimensions differ: {a.shape} and {b.shape}  [{src}]")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"op.matmul: contraction dimensions differ: lhs {a.shape} has K = "
                         f"{a.shape[-1]}, rhs {b.shape} has K = {b.shape[-2]}  [{src}]")
    shape = a.shape[:-1] + (b.shape[-1],)
    with current_location(src):
        value = tgraph.MatmulOp(_result_type(shape, a), a.value, b.value).result
    return Traced(value, shape, a.dtype, src)


def relu(x: Traced) -> Traced:
    """max(x, 0), elementwise."""
    src = require_tracing("relu", x)
    with current_location(src):
        value = tgraph.ReluOp(x.value).result
    return Traced(value, x.shape, x.dtype, src)


def add(a: Traced, b: Traced) -> Traced:
    """a + b, elementwise (same shapes)."""
    src = require_tracing("add", a, b)
    _check_dtypes("add", src, a, b)
    if a.shape != b.shape:
        raise ShapeError(f"op.add: shapes differ: {a.shape} and {b.shape}; op.add takes "
                         f"operands of equal shape  [{src}]")
    with current_location(src):
        value = tgraph.AddOp(a.value, b.value).result
    return Traced(value, a.shape, a.dtype, src)
