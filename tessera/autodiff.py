"""Differentiation in the Python API: `ts.grad`, `graph.backward`, `op.autodiff`.

Each records a `tgraph.grad` op; the `tessera-autodiff` pass replaces it with
the backward computation when the function is compiled.
"""

from __future__ import annotations

import functools

from tessera_compiler.ir import graph_builder as gb

from . import dtypes
from ._pytree import flatten, unflatten
from ._source import user_frame
from ._trace import Traced, current, current_location
from .errors import ShapeError


def grad(loss, wrt=None):
    """Gradients of a scalar.

    * `ts.grad(loss, wrt)` inside a compiled function: d loss / d wrt, where `wrt`
      is a tensor or a dict/list/tuple of tensors; returns the same structure.
      Without `wrt`: with respect to every float tensor the function captured
      from outside (its parameters), as a dict by name.
    * `ts.grad(fn, wrt=0)`: a function returning the gradient of `fn`'s (scalar)
      result with respect to its argument(s) number `wrt` (an int or a tuple).
    """
    if callable(loss) and not isinstance(loss, Traced):
        return _grad_of_function(loss, 0 if wrt is None else wrt)
    src = user_frame()
    state = current()
    if state is None:
        raise RuntimeError(f"ts.grad(loss, ...) at {src} must be called inside a function compiled "
                           "by tessera (ts.jit, ts.function, tessera.compile)")
    if not isinstance(loss, Traced) or loss.shape != () or not dtypes.is_float(loss.dtype):
        what = f"a tensor of shape {list(loss.shape)} {loss.dtype.name}" if isinstance(loss, Traced) \
            else f"a {type(loss).__name__}"
        raise ShapeError(f"ts.grad: the loss must be a float scalar (shape []), got {what}; "
                         f"reduce it first, e.g. op.mean(loss)  [{src}]")
    if wrt is None:
        wrt = {t.name: t for _, t in state.captured if dtypes.is_float(t.dtype)}
        if not wrt:
            raise ShapeError(f"ts.grad(loss) without wrt= differentiates with respect to the "
                             f"parameters the function uses from outside; it uses none. Pass "
                             f"wrt= explicitly  [{src}]")
    leaves, structure = flatten(wrt)
    for i, w in enumerate(leaves):
        if not isinstance(w, Traced) or not dtypes.is_float(w.dtype):
            raise ShapeError(f"ts.grad: wrt leaf #{i} is {w!r}; gradients exist only for float "
                             f"tensors of the compiled function  [{src}]")
    with current_location(src):
        grads = gb.grad(loss.value, [w.value for w in leaves])
    return unflatten(structure, [Traced(g, w.shape, w.dtype, src) for g, w in zip(grads, leaves)])


def _grad_of_function(fn, argnums):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        loss = fn(*args, **kwargs)
        if isinstance(argnums, int):
            return grad(loss, args[argnums])
        return tuple(grad(loss, args[i]) for i in argnums)
    return wrapper


def value_and_grad(fn, wrt=0):
    """Like `grad(fn, wrt)`, returning `(loss, grads)`."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        loss = fn(*args, **kwargs)
        target = args[wrt] if isinstance(wrt, int) else tuple(args[i] for i in wrt)
        return loss, grad(loss, target)
    return wrapper
