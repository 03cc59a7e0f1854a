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

from . import _primitives
from ._primitives import *  # noqa: F403  (every primitive: one list, _primitives.__all__)
from ._primitives import DTypeError, TRANSPORTS  # noqa: F401  (op.DTypeError, op.TRANSPORTS)
from .autodiff import grad
from .local_view import spmd
from .models import MULTI_QP_CHANNELS, moe, transformer_block  # noqa: F401

__all__ = _primitives.__all__ + ["transformer_block", "moe", "autodiff", "kernel"]


#: `@op.kernel`, the tutorials' name for `dist.spmd` (a per-rank function
#: with explicit collectives), and `op.autodiff(loss)`, theirs for `ts.grad`.
kernel = spmd
autodiff = grad
