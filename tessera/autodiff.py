"""Differentiation in the Python API: `ts.grad`, `graph.backward`, `op.autodiff`.

Each records a `tgraph.grad` op; the `tessera-autodiff` pass replaces it with
the backward computation when the function is compiled.
"""

from __future__ import annotations

import functools

from tessera_compiler.ir import graph_builder as gb

from . import dtypes
from ._checks import check_callable, is_int
from ._pytree import flatten, unflatten
from ._source import user_frame
from ._trace import Traced, current, current_location
from .errors import ArgumentError, ShapeError


class ArgumentIndexError(ArgumentError, IndexError):
    """An argument number out of range (`ts.grad(fn, argnums=3)` of a
    function called with fewer positional arguments): an ArgumentError, and
    an IndexError as Python's own indexing would raise."""


def grad(loss, wrt=None, *, argnums=None):
    """Gradients of a scalar.

    * `ts.grad(loss, wrt)` inside a compiled function: d loss / d wrt, where `wrt`
      is a tensor or a dict/list/tuple of tensors; returns the same structure.
      Without `wrt`: with respect to every float tensor the function captured
      from outside (its parameters), as a dict by name.
    * `ts.grad(fn, wrt=0)` (or JAX's spelling, `argnums=0`): a function
      returning the gradient of `fn`'s (scalar) result with respect to its
      positional argument number `wrt` (an int: that argument's gradient), or
      numbers (a tuple: a tuple of gradients).
    """
    if callable(loss) and not isinstance(loss, Traced):
        return _grad_of_function(loss, _argnums("ts.grad", wrt, argnums, default=0))
    if argnums is not None:
        raise ArgumentError(f"ts.grad: argnums= numbers the arguments of a function "
                        f"(ts.grad(fn, argnums=0)); for a loss tensor pass the tensors as wrt=  "
                        f"[{user_frame()}]")
    src = user_frame()
    state = current()
    if state is None:
        raise ArgumentError(f"ts.grad: loss is a {type(loss).__name__}, not a traced tensor: "
                            "ts.grad(loss, wrt) differentiates inside a function compiled by "
                            "tessera (ts.jit, ts.function, tessera.compile); outside one, "
                            f"differentiate a function: ts.grad(fn)(*args)  [{src}]")
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


def _argnums(api: str, wrt, argnums, default):
    """The argument numbers `wrt=` or its JAX synonym `argnums=` give (not
    both): an int or a tuple of ints."""
    if wrt is not None and argnums is not None:
        raise ArgumentError(f"{api}: got both wrt={wrt!r} and argnums={argnums!r}; they are the same "
                        f"setting (argnums= is JAX's name for it), give one  [{user_frame()}]")
    numbers = default if wrt is None and argnums is None else wrt if wrt is not None else argnums
    name = "wrt" if wrt is not None else "argnums"
    if isinstance(numbers, list):
        numbers = tuple(numbers)
    ok = is_int(numbers) or (isinstance(numbers, tuple) and numbers
                                and all(is_int(i) for i in numbers))
    if not ok:
        raise ArgumentError(f"{api}: {name}= must be an argument number or a non-empty tuple of "
                        f"them, got {numbers!r}  [{user_frame()}]")
    return numbers


def _differentiated(api: str, fn, args, argnums):
    """The positional arguments `argnums` names (one, or a tuple)."""
    for i in (argnums,) if isinstance(argnums, int) else argnums:
        if not -len(args) <= i < len(args):
            raise ArgumentIndexError(f"{api}: argument number {i} is out of range: "
                             f"{getattr(fn, '__name__', 'fn')} got {len(args)} positional "
                             f"argument{'s' * (len(args) != 1)}  [{user_frame()}]")
    return args[argnums] if isinstance(argnums, int) else tuple(args[i] for i in argnums)


def _grad_of_function(fn, argnums):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        loss = fn(*args, **kwargs)
        return grad(loss, _differentiated("ts.grad", fn, args, argnums))
    return wrapper


def value_and_grad(fn, wrt=None, *, argnums=None):
    """Like `grad(fn, wrt)` (`argnums=` too; default: argument 0), returning
    `(loss, grads)`."""
    check_callable("ts.value_and_grad", fn)
    argnums = _argnums("ts.value_and_grad", wrt, argnums, default=0)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        loss = fn(*args, **kwargs)
        return loss, grad(loss, _differentiated("ts.value_and_grad", fn, args, argnums))
    return wrapper
