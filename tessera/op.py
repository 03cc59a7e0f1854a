"""Tensor operators (`tessera.op`).

Inside a function compiled by Tessera (`ts.jit`, `ts.function`,
`tessera.compile`) each call records Graph IR at the caller's source line;
outside one, on numpy arrays or DTensors, it runs as a one-op program.
Operands may be traced tensors, Python numbers, numpy arrays or DTensors (the
last two become extra arguments of the compiled function). Elementwise ops
broadcast like numpy. Shape and dtype errors name the op, the operands' shapes
and the caller's line.

The namespace: the primitives are `_primitives`', the models
(`transformer_block`, `moe`) `models`'; `kernel` and `autodiff` are the
tutorials' names for `dist.spmd` and `ts.grad`.
"""

from __future__ import annotations

from ._primitives import (DTypeError, TRANSPORTS, add, attention, cast, concat,
                          cross_entropy, div, embedding, equal, exp, flash_attention, gelu,
                          greater, greater_equal, index, isfinite, layernorm, less, less_equal,
                          linear, log, log_softmax, matmul, max, maximum, mean, minimum, mul, neg,
                          not_equal, pow, relu, reshape, rmsnorm, rsqrt, sigmoid, silu, softmax,
                          split, sqrt, square, sub, sum, tanh, topk, transpose, where)
from .autodiff import grad
from .local_view import spmd
from .models import MULTI_QP_CHANNELS, moe, transformer_block

__all__ = [
    "matmul", "add", "sub", "mul", "div", "neg", "pow", "maximum", "minimum",
    "exp", "log", "tanh", "sqrt", "rsqrt", "relu", "gelu", "silu", "sigmoid", "square",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "where",
    "isfinite", "cast", "sum", "mean", "max", "softmax", "log_softmax", "layernorm",
    "rmsnorm", "embedding", "attention", "flash_attention", "cross_entropy", "reshape",
    "transpose", "split", "concat", "index", "transformer_block", "autodiff", "linear",
    "kernel", "moe", "topk",
]


#: `@op.kernel`, the tutorials' name for `dist.spmd` (a per-rank function
#: with explicit collectives), and `op.autodiff(loss)`, theirs for `ts.grad`.
kernel = spmd
autodiff = grad
