"""The op primitives behind `tessera.op` (the namespace, which adds the
models and the per-rank and gradient spellings above them).

Inside a function compiled by Tessera (`ts.jit`, `ts.function`,
`tessera.compile`) each call records Graph IR at the caller's source line.
Operands may be traced tensors, Python numbers, numpy arrays or DTensors (the
last two become extra arguments of the compiled function). Elementwise ops
broadcast like numpy. Shape and dtype errors name the op, the operands' shapes
and the caller's line.

Composite operators (softmax, norms, attention, cross-entropy, GELU, ...) are
written here in terms of Graph IR primitives, so `tessera-autodiff` needs a
rule only per primitive and `tessera-lower-to-tile` fuses their elementwise
and row-reduction parts into a few kernels.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import math

import numpy as np

from tessera_compiler.ir import graph_builder as gb

from . import dtypes
from ._checks import is_int, is_number
from ._pytree import flatten
from ._source import SourceLine, user_frame
from ._trace import (Traced, as_traced, autocast_dtype, current, current_location, element_type,
                     is_tensor, not_a_tensor)
from .compiler import CompiledFunction
from .errors import ArgumentError, ShapeError

__all__ = [
    "matmul", "add", "sub", "mul", "div", "neg", "pow", "maximum", "minimum", "exp", "log",
    "tanh", "sqrt", "rsqrt", "relu", "gelu", "silu", "sigmoid", "square", "equal", "not_equal",
    "less", "less_equal", "greater", "greater_equal", "where", "isfinite", "cast", "sum", "mean",
    "max", "softmax", "log_softmax", "layernorm", "rmsnorm", "embedding", "attention",
    "flash_attention", "cross_entropy", "reshape", "transpose", "split", "concat", "index",
    "linear", "topk", "sin", "cos", "erf", "abs", "sign", "floor", "ceil", "arange",
    "broadcast_to", "min", "argmax", "argmin", "take_along_axis", "cumsum", "dynamic_slice",
    "dynamic_update_slice", "dropout",
]


class DTypeError(ShapeError, TypeError):
    """Operands whose element types an op cannot take."""


builtins_sum = builtins.sum        # (this module defines its own `sum`)


# ----------------------------------------------------------------------------
# Eager calls: an op called outside a compiled function on numpy arrays or
# DTensors (the design docs' `Y = op.matmul(X, W)` at top level) runs as a
# one-op compiled program, cached per op and signature like any compiled
# function: DTensors in, DTensors out (in the layout the partitioner gives
# the result); numpy in, numpy out. Every op is defined under `@eager`.
# ----------------------------------------------------------------------------

_EAGER: dict = {}


def _no_tensor(fn, args, kwargs) -> Exception:
    """An op called outside a compiled function with no tensor operand
    (`op.relu("x")`, `op.add(1.0, 2.0)`): there is nothing to compute on."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs).arguments
        given = ", ".join(f"{k}={v!r:.60}" for k, v in bound.items())
    except TypeError:
        given = ", ".join(f"{a!r:.60}" for a in args)
    return ArgumentError(f"op.{fn.__name__}: no operand is a tensor ({given}); outside a "
                         "compiled function an op computes on numpy arrays or DTensors (inside "
                         f"one, on traced tensors)  [{user_frame()}]")


def eager(fn):
    """Op `fn` made callable outside a compiled function too: inside one it
    records its Graph IR as it is; outside, on numpy arrays or DTensors, it
    runs as a one-op compiled program (cached per op, mesh and signature)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if current() is not None:
            return fn(*args, **kwargs)
        leaves, _ = flatten((args, kwargs))
        if not any(is_tensor(x) for x in leaves):
            raise _no_tensor(fn, args, kwargs)
        mesh = kwargs.get("mesh")              # op.moe(..., mesh=mesh): compiled for it
        compiled = _EAGER.get((fn.__name__, mesh))
        if compiled is None:
            compiled = _EAGER[fn.__name__, mesh] = CompiledFunction(fn, mesh, numpy_results=True)
            compiled.eager = True
        return compiled(*args, **kwargs)
    return call


# ----------------------------------------------------------------------------
# Operand handling
# ----------------------------------------------------------------------------

def where_called(name: str) -> SourceLine:
    src = user_frame()
    if current() is None:
        raise RuntimeError(f"op.{name} at {src} was called outside a function compiled by "
                           "tessera (ts.jit, ts.function or tessera.compile); decorate the "
                           "function that calls it")
    return src


def _describe(x) -> str:
    if isinstance(x, Traced):
        return f"{list(x.shape)} {x.dtype.name}"
    return type(x).__name__


def operand(name: str, x, src: SourceLine, like: Traced | None = None) -> Traced:
    """`x` as a traced tensor: Python numbers take `like`'s dtype (f32 if none)."""
    return as_traced(f"op.{name}", x, src, like)


def result_of(value, src) -> Traced:
    shape = gb.shape_of(value)
    return Traced(value, shape, _np_of(gb.element_of(value)), src)


def _np_of(element) -> np.dtype:
    from tessera_compiler.ir.types import ELEMENT_TYPES
    return dtypes.as_dtype(ELEMENT_TYPES[str(element)])


def _cast_to(x: Traced, dtype, src) -> Traced:
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    with current_location(src):
        return result_of(gb.cast(x.value, element_type(dtype)), src)


def _broadcast_shapes(name: str, src, *xs: Traced) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*[x.shape for x in xs]))
    except ValueError:
        raise ShapeError(f"op.{name}: shapes {' and '.join(str(list(x.shape)) for x in xs)} do not "
                         f"broadcast (numpy rules: trailing dimensions must match or be 1)  "
                         f"[{src}]") from None


def require_float(name, src, *xs: Traced) -> None:
    for x in xs:
        if not dtypes.is_float(x.dtype):
            raise DTypeError(f"op.{name}: needs floating-point operands, got {_describe(x)}  [{src}]")


def _elementwise_operands(name: str, src, *xs, floats: bool = True) -> list[Traced]:
    """Traced, dtype-promoted and broadcast operands of an elementwise op."""
    like = next((x for x in xs if isinstance(x, Traced)), None)
    ts = [operand(name, x, src, like) for x in xs]
    dtype = ts[0].dtype
    for t in ts[1:]:
        dtype = dtypes.promote(dtype, t.dtype)
    if floats and not dtypes.is_float(dtype):
        raise DTypeError(f"op.{name}: needs floating-point operands, got "
                         f"{', '.join(_describe(t) for t in ts)}  [{src}]")
    shape = _broadcast_shapes(name, src, *ts)
    out = []
    with current_location(src):
        for t in ts:
            t = _cast_to(t, dtype, src)
            if t.shape != shape:
                t = result_of(gb.broadcast(t.value, list(shape)), src)
            out.append(t)
    return out


def _binary(kind: str, name: str, a, b) -> Traced:
    src = where_called(name)
    a, b = _elementwise_operands(name, src, a, b)
    with current_location(src):
        return result_of(gb.binary(kind, a.value, b.value), src)


def _unary(kind: str, name: str, x) -> Traced:
    src = where_called(name)
    (x,) = _elementwise_operands(name, src, x)
    with current_location(src):
        return result_of(gb.unary(kind, x.value), src)


# ----------------------------------------------------------------------------
# Elementwise
# ----------------------------------------------------------------------------

@eager
def add(a, b) -> Traced:
    """a + b (broadcasting)."""
    return _binary("add", "add", a, b)


@eager
def sub(a, b) -> Traced:
    """a - b (broadcasting)."""
    return _binary("sub", "sub", a, b)


@eager
def mul(a, b) -> Traced:
    """a * b (broadcasting)."""
    return _binary("mul", "mul", a, b)


@eager
def div(a, b) -> Traced:
    """a / b (broadcasting)."""
    return _binary("div", "div", a, b)


@eager
def maximum(a, b) -> Traced:
    """Elementwise max(a, b)."""
    return _binary("max", "maximum", a, b)


@eager
def minimum(a, b) -> Traced:
    """Elementwise min(a, b) = -max(-a, -b)."""
    # Promoted first: a Python number beside a bf16 tensor is bf16 (numpy's
    # rule); negated alone it would become an f32 tensor.
    a, b = _elementwise_operands("minimum", where_called("minimum"), a, b)
    return neg(maximum(neg(a), neg(b)))


@eager
def neg(x) -> Traced:
    """-x, elementwise."""
    return _unary("neg", "neg", x)


@eager
def exp(x) -> Traced:
    """e ** x, elementwise."""
    return _unary("exp", "exp", x)


@eager
def log(x) -> Traced:
    """The natural logarithm of x, elementwise."""
    return _unary("log", "log", x)


@eager
def tanh(x) -> Traced:
    """The hyperbolic tangent of x, elementwise."""
    return _unary("tanh", "tanh", x)


@eager
def sqrt(x) -> Traced:
    """The square root of x, elementwise."""
    return _unary("sqrt", "sqrt", x)


@eager
def rsqrt(x) -> Traced:
    """1 / sqrt(x)."""
    return _unary("rsqrt", "rsqrt", x)


@eager
def relu(x) -> Traced:
    """max(x, 0)."""
    return _unary("relu", "relu", x)


@eager
def square(x) -> Traced:
    """x * x, elementwise."""
    (x,) = _elementwise_operands("square", where_called("square"), x)
    return mul(x, x)


@eager
def pow(x, p) -> Traced:
    """x ** p, elementwise, for any real exponent `p` (a number or a tensor,
    broadcast): NaN where x < 0 and p is not an integer, as numpy's. An
    integer exponent from 0 to 8 is a product of x's, 0.5 a sqrt and -0.5 an
    rsqrt: exact, and cheaper than `tgraph.pow`."""
    if isinstance(p, (int, float)) and not isinstance(p, bool):
        if p == 0.5:
            return sqrt(x)
        if p == -0.5:
            return rsqrt(x)
        if float(p).is_integer() and 0 <= p <= 8:
            result = 1.0
            for _ in range(int(p)):
                result = x if isinstance(result, float) else mul(result, x)
            return result if not isinstance(result, float) else mul(x, 0.0) + 1.0
    return _binary("pow", "pow", x, p)


@eager
def sigmoid(x) -> Traced:
    """1 / (1 + exp(-x))."""
    (x,) = _elementwise_operands("sigmoid", where_called("sigmoid"), x)
    return div(1.0, add(exp(neg(x)), 1.0))


@eager
def silu(x) -> Traced:
    """x * sigmoid(x)."""
    (x,) = _elementwise_operands("silu", where_called("silu"), x)
    return mul(x, sigmoid(x))


#: GELU's forms (`gelu(approximate=)`), PyTorch's names
GELU_FORMS = ("tanh", "none")


@eager
def gelu(x, approximate: str = "tanh") -> Traced:
    """GELU, by default its tanh form; `approximate="none"` is the exact one
    (PyTorch's default). `approximate="tanh"` (as JAX's and GPT-2's):
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), one op (`tgraph.gelu`)
    whose backward keeps only its input. `approximate="none"` (PyTorch's
    default, `F.gelu(x)`; BERT's and Llama-era MLPs' "gelu"): the exact
    x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))). They differ by up to 5e-4."""
    if approximate == "tanh":
        return _unary("gelu", "gelu", x)
    if approximate != "none":
        raise ArgumentError(f"op.gelu: approximate={approximate!r} must be one of "
                            f"{', '.join(map(repr, GELU_FORMS))}  [{where_called('gelu')}]")
    (x,) = _elementwise_operands("gelu", where_called("gelu"), x)
    return mul(mul(x, 0.5), add(erf(mul(x, 0.7071067811865476)), 1.0))


@eager
def sin(x) -> Traced:
    """The sine of x (radians), elementwise."""
    return _unary("sin", "sin", x)


@eager
def cos(x) -> Traced:
    """The cosine of x (radians), elementwise."""
    return _unary("cos", "cos", x)


@eager
def erf(x) -> Traced:
    """The error function, elementwise: 2/sqrt(pi) times the integral of
    e^(-t^2) from 0 to x."""
    return _unary("erf", "erf", x)


@eager
def abs(x) -> Traced:  # noqa: A001  (op.abs, as numpy's; `abs(t)` on a tensor calls it)
    """|x|, elementwise; its gradient is sign(x) (0 at 0, as PyTorch's)."""
    return _unary("abs", "abs", x)


@eager
def sign(x) -> Traced:
    """-1, 0 or 1 by the sign of x (NaN stays NaN), elementwise; no gradient
    flows through it (zero almost everywhere)."""
    return _unary("sign", "sign", x)


@eager
def floor(x) -> Traced:
    """The largest integer not above x, elementwise (a float); no gradient
    flows through it."""
    return _unary("floor", "floor", x)


@eager
def ceil(x) -> Traced:
    """The smallest integer not below x, elementwise (a float); no gradient
    flows through it."""
    return _unary("ceil", "ceil", x)


def _compare(kind: str, name: str, a, b) -> Traced:
    src = where_called(name)
    a, b = _elementwise_operands(name, src, a, b, floats=False)
    with current_location(src):
        return result_of(gb.compare(kind, a.value, b.value), src)


@eager
def equal(a, b) -> Traced:
    """a == b, elementwise (broadcast), as a bool tensor."""
    return _compare("eq", "equal", a, b)


@eager
def not_equal(a, b) -> Traced:
    """a != b, elementwise (broadcast), as a bool tensor."""
    return _compare("ne", "not_equal", a, b)


@eager
def less(a, b) -> Traced:
    """a < b, elementwise (broadcast), as a bool tensor."""
    return _compare("lt", "less", a, b)


@eager
def less_equal(a, b) -> Traced:
    """a <= b, elementwise (broadcast), as a bool tensor."""
    return _compare("le", "less_equal", a, b)


@eager
def greater(a, b) -> Traced:
    """a > b, elementwise (broadcast), as a bool tensor."""
    return _compare("gt", "greater", a, b)


@eager
def greater_equal(a, b) -> Traced:
    """a >= b, elementwise (broadcast), as a bool tensor."""
    return _compare("ge", "greater_equal", a, b)


@eager
def where(cond, a, b) -> Traced:
    """`cond ? a : b` elementwise (broadcasting); `cond` is a boolean tensor."""
    src = where_called("where")
    c = operand("where", cond, src)
    if c.dtype != dtypes.bool_:
        raise DTypeError(f"op.where: condition must be boolean (a comparison), got "
                         f"{_describe(c)}  [{src}]")
    a, b = _elementwise_operands("where", src, a, b, floats=False)
    shape = _broadcast_shapes("where", src, c, a)
    with current_location(src):
        cv = gb.broadcast(c.value, list(shape))
        av, bv = gb.broadcast(a.value, list(shape)), gb.broadcast(b.value, list(shape))
        return result_of(gb.select(cv, av, bv), src)


@eager
def isfinite(x) -> Traced:
    """True where x is neither inf nor nan (x - x == 0 holds exactly then)."""
    src = where_called("isfinite")
    x = operand("isfinite", x, src)
    require_float("isfinite", src, x)
    d = sub(x, x)
    return equal(d, 0.0)


@eager
def cast(x, dtype) -> Traced:
    """x converted to `dtype` (ts.f32, ts.bf16, ...); float to float rounds to nearest."""
    src = where_called("cast")
    return _cast_to(operand("cast", x, src), dtypes.as_dtype(dtype), src)


# ----------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------

def _dims(name, x: Traced, dim, src) -> list[int]:
    if dim is None:
        return list(range(x.ndim))
    dims = [dim] if isinstance(dim, (int, np.integer, str)) or not hasattr(dim, "__iter__") \
        else list(dim)
    out = []
    for d in dims:
        if not is_int(d):
            raise ArgumentError(f"op.{name}: dim {d!r} is not a dimension index (an int, a "
                                f"tuple of them, or None for all) of {list(x.shape)}  [{src}]")
        if not -x.ndim <= d < x.ndim:
            raise ShapeError(f"op.{name}: dim {d} is out of range for shape {list(x.shape)}  [{src}]")
        out.append(int(d) % x.ndim)
    return out


def _dim_or_axis(name: str, dim, axis, default=None):
    """`axis=` (numpy's, JAX's name) is accepted wherever `dim=` (the design
    docs', PyTorch's) is."""
    if axis is not None and dim is not None and dim != default:
        raise ArgumentError(f"op.{name}: give dim= or axis=, not both (got dim={dim!r}, "
                            f"axis={axis!r})  [{where_called(name)}]")
    return axis if axis is not None else dim


def _is_flag(x) -> bool:
    """True, False (or numpy's, or 0 and 1): not a string, whose truth is its length."""
    return isinstance(x, (bool, np.bool_)) or (isinstance(x, (int, np.integer)) and x in (0, 1))


def _reduce(kind: str, name: str, x, dim, keepdim) -> Traced:
    src = where_called(name)
    x = operand(name, x, src)
    if not _is_flag(keepdim):
        raise ArgumentError(f"op.{name}: keepdim={keepdim!r} must be True or False  [{src}]")
    dims = _dims(name, x, dim, src)
    if kind == "max" and any(x.shape[d] == 0 for d in dims):
        raise ShapeError(f"op.{name}: reduction over a zero-size dimension of {list(x.shape)} has "
                         f"no identity (numpy raises too)  [{src}]")
    with current_location(src):
        v = gb.reduce(x.value, kind, dims)
        if not keepdim:
            v = gb.reshape(v, [s for d, s in enumerate(x.shape) if d not in dims])
        return result_of(v, src)


@eager
def sum(x, dim=None, keepdim: bool = False, *, axis=None) -> Traced:  # noqa: A001
    """Sum over `dim` (an int, a tuple, or None for all; `axis=` is the same);
    over a zero-size dimension, 0."""
    return _reduce("sum", "sum", x, _dim_or_axis("sum", dim, axis), keepdim)


@eager
def max(x, dim=None, keepdim: bool = False, *, axis=None) -> Traced:  # noqa: A001
    """Maximum over `dim` (or `axis`); a zero-size dimension is an error, as in numpy."""
    return _reduce("max", "max", x, _dim_or_axis("max", dim, axis), keepdim)


@eager
def min(x, dim=None, keepdim: bool = False, *, axis=None) -> Traced:  # noqa: A001
    """Minimum over `dim` (or `axis`): -max(-x); a zero-size dimension is an
    error, as in numpy."""
    (x,) = _elementwise_operands("min", where_called("min"), x)
    return neg(_reduce("max", "min", neg(x), _dim_or_axis("min", dim, axis), keepdim))


def _one_dim(name: str, x: Traced, dim, src) -> int:
    """`dim` of an op along one dimension of `x` (at least 1-D), as an index >= 0."""
    if not is_int(dim) or not x.ndim or not -x.ndim <= dim < x.ndim:
        raise ArgumentError(f"op.{name}: dim={dim!r} must be a dimension of {list(x.shape)}  "
                            f"[{src}]")
    return int(dim) % x.ndim


def _moved_last(x: Traced, d: int) -> tuple[Traced, list[int] | None]:
    """`x` with dimension `d` moved last, and the permutation that moves a
    result of the same rank back (None: nothing moved)."""
    if d == x.ndim - 1:
        return x, None
    perm = [i for i in range(x.ndim) if i != d] + [d]
    return transpose(x, perm), [perm.index(i) for i in range(x.ndim)]


def _arg_extreme(name: str, x, dim, keepdim, largest: bool) -> Traced:
    src = where_called(name)
    x = operand(name, x, src)
    require_float(name, src, x)
    if not _is_flag(keepdim):
        raise ArgumentError(f"op.{name}: keepdim={keepdim!r} must be True or False  [{src}]")
    d = _one_dim(name, x, dim, src)
    if x.shape[d] == 0:
        raise ShapeError(f"op.{name}: dimension {d} of {list(x.shape)} is empty (numpy raises "
                         f"too)  [{src}]")
    last, _ = _moved_last(x, d)
    _, indices = topk(last if largest else neg(last), 1)
    shape = [n for i, n in enumerate(x.shape) if i != d]
    if keepdim:
        shape.insert(d, 1)
    return reshape(indices, *shape) if shape else reshape(indices)


@eager
def argmax(x, dim: int = -1, keepdim: bool = False) -> Traced:
    """The index (int32) of the largest entry along `dim`; ties: the lowest
    index, as numpy's. No gradient (an index)."""
    return _arg_extreme("argmax", x, dim, keepdim, largest=True)


@eager
def argmin(x, dim: int = -1, keepdim: bool = False) -> Traced:
    """The index (int32) of the smallest entry along `dim`; ties: the lowest
    index, as numpy's. No gradient (an index)."""
    return _arg_extreme("argmin", x, dim, keepdim, largest=False)


@eager
def mean(x, dim=None, keepdim: bool = False, *, axis=None) -> Traced:
    """Mean over `dim` (or `axis`); over a zero-size dimension NaN (0 / 0),
    numpy's result (numpy also warns)."""
    src = where_called("mean")
    x = operand("mean", x, src)
    dim = _dim_or_axis("mean", dim, axis)
    n = int(np.prod([x.shape[d] for d in _dims("mean", x, dim, src)]))
    return div(sum(x, dim, keepdim), float(n))


# ----------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------

@eager
def reshape(x, *shape) -> Traced:
    """`x` with a new shape (one dimension may be -1)."""
    src = where_called("reshape")
    x = operand("reshape", x, src)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    for s in shape:
        if not is_int(s) or s < -1:
            raise ArgumentError(f"op.reshape: shape entry {s!r} of {list(shape)} is not a size "
                                f"(an int >= 0, or -1 for the one inferred)  [{src}]")
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1:
        raise ShapeError(f"op.reshape: at most one -1 in {shape}  [{src}]")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if known == 0 or x.size % known:
            raise ShapeError(f"op.reshape: cannot reshape {list(x.shape)} to {shape}  [{src}]")
        shape[shape.index(-1)] = x.size // known
    if int(np.prod(shape)) != x.size:
        raise ShapeError(f"op.reshape: cannot reshape {list(x.shape)} ({x.size} elements) to "
                         f"{shape} ({int(np.prod(shape))} elements)  [{src}]")
    with current_location(src):
        return result_of(gb.reshape(x.value, shape), src)


@eager
def transpose(x, *dims) -> Traced:
    """`transpose(x)` reverses the dimensions; `transpose(x, a, b)` swaps two;
    `transpose(x, perm)` permutes."""
    src = where_called("transpose")
    x = operand("transpose", x, src)
    given = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    for d in given:
        if not is_int(d) or not -x.ndim <= d < builtins.max(x.ndim, 1):
            raise ArgumentError(f"op.transpose: dimension {d!r} of {list(dims)} is not a "
                                f"dimension index of {list(x.shape)} (-{x.ndim} to "
                                f"{x.ndim - 1})  [{src}]")
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        perm = [d % x.ndim for d in dims[0]]
    elif len(dims) == 2:
        a, b = (d % x.ndim for d in dims)
        perm = list(range(x.ndim))
        perm[a], perm[b] = perm[b], perm[a]
    elif not dims:
        perm = list(reversed(range(x.ndim)))
    else:
        perm = [d % x.ndim for d in dims]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"op.transpose: {list(dims)} is not a permutation of the "
                         f"{x.ndim} dimensions of {list(x.shape)}  [{src}]")
    with current_location(src):
        return result_of(gb.transpose(x.value, perm), src)


@eager
def split(x, sections, dim: int = -1, *, axis=None) -> list[Traced]:
    """`sections` equal parts (an int) or parts of the given sizes along `dim` (or `axis`)."""
    dim = _dim_or_axis("split", dim, axis, default=-1)
    src = where_called("split")
    x = operand("split", x, src)
    d = _dims("split", x, dim, src)[0]
    n = x.shape[d]
    count = is_int(sections)
    if not (count and sections > 0) and not (
            isinstance(sections, (list, tuple)) and all(is_int(k) and k >= 0 for k in sections)):
        raise ArgumentError(f"op.split: sections {sections!r} must be a number of equal parts "
                            f"(an int >= 1) or a list of part sizes (ints >= 0) adding up to "
                            f"dimension {d} of {list(x.shape)} (size {n})  [{src}]")
    sizes = [n // sections] * sections if count else list(sections)
    if count and n % sections or builtins_sum(sizes) != n:
        raise ShapeError(f"op.split: dimension {d} of {list(x.shape)} (size {n}) does not split "
                         f"into {sections}  [{src}]")
    out, start = [], 0
    with current_location(src):
        for size in sizes:
            offsets = [0] * x.ndim
            offsets[d] = start
            shape = list(x.shape)
            shape[d] = size
            out.append(result_of(gb.slice_(x.value, offsets, shape), src))
            start += size
    return out


@eager
def index(x, key) -> Traced:
    """`x[key]`, numpy's basic indexing: integers (negative ones count from
    the end; an integer drops its dimension), slices with any positive step
    (`x[1:-1]`, `x[::2]`; an empty slice is a zero-size dimension), `...`
    (as many full slices as the other indices leave) and `None` (a new
    dimension of size 1). A negative step (`x[::-1]`) and arrays as indices
    (numpy's advanced indexing) are errors naming the dimension."""
    src = where_called("index")
    x = operand("index", x, src)
    key = key if isinstance(key, tuple) else (key,)
    if builtins_sum(k is Ellipsis for k in key) > 1:
        raise ShapeError(f"op.index: an index can hold one ellipsis ('...'), got {key}  [{src}]")
    taken = builtins_sum(k is not None and k is not Ellipsis for k in key)
    if taken > x.ndim:
        raise ShapeError(f"op.index: {taken} indices for shape {list(x.shape)}  [{src}]")
    if Ellipsis in key:
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (x.ndim - taken) + key[at + 1:]
    offsets, spans, out, strided, d = [0] * x.ndim, list(x.shape), [], [], 0
    for k in key:
        if k is None:
            out.append(1)
            continue
        n = x.shape[d]
        if isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            i = int(k) + (n if k < 0 else 0)
            if not 0 <= i < n:
                raise ShapeError(f"op.index: index {k} is out of range for dimension {d} of "
                                 f"{list(x.shape)}  [{src}]")
            offsets[d], spans[d] = i, 1
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step < 0:
                raise ShapeError(f"op.index: negative steps are not supported, got {k} for "
                                 f"dimension {d} of {list(x.shape)}  [{src}]")
            count = len(range(start, stop, step))
            offsets[d], spans[d] = (start, (count - 1) * step + 1) if count else (0, 0)
            if step > 1 and count > 1:
                strided.append((d, step, count))
            out.append(count)
        else:
            raise ShapeError(f"op.index: cannot index dimension {d} of {list(x.shape)} with a "
                             f"{type(k).__name__} (integers, slices, ... and None)  [{src}]")
        d += 1
    out.extend(x.shape[d:])
    with current_location(src):
        v = gb.slice_(x.value, offsets, spans)
        for d, step, count in strided:
            # Every step-th element: padded to count * step, split into
            # [count, step] and the first of each step kept.
            shape = gb.shape_of(v)
            v = gb.pad(v, [0] * len(shape), shape[:d] + [count * step] + shape[d + 1:])
            v = gb.reshape(v, shape[:d] + [count, step] + shape[d + 1:])
            v = gb.slice_(v, [0] * (len(shape) + 1), shape[:d] + [count, 1] + shape[d + 1:])
            v = gb.reshape(v, shape[:d] + [count] + shape[d + 1:])
        return result_of(gb.reshape(v, out), src)


@eager
def concat(xs, dim: int = 0, *, axis=None) -> Traced:
    """Concatenation along `dim` (or `axis`)."""
    dim = _dim_or_axis("concat", dim, axis, default=0)
    src = where_called("concat")
    if not isinstance(xs, (list, tuple)):
        raise ArgumentError(f"op.concat: xs must be a list or tuple of tensors, got a "
                            f"{type(xs).__name__}  [{src}]")
    if not xs:
        raise ArgumentError(f"op.concat: xs holds no tensors (an empty {type(xs).__name__})  "
                            f"[{src}]")
    for i, x in enumerate(xs):
        if not is_tensor(x) and not isinstance(x, (bool, int, float)):
            raise ArgumentError(f"op.concat: xs[{i}] is a {type(x).__name__}, not a tensor  "
                                f"[{src}]")
    xs = [operand("concat", x, src) for x in xs]
    d = _dims("concat", xs[0], dim, src)[0]
    for x in xs[1:]:
        if x.ndim != xs[0].ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, xs[0].shape))
                                       if i != d):
            raise ShapeError(f"op.concat: operands {', '.join(_describe(t) for t in xs)} differ "
                             f"outside dim {d}  [{src}]")
        if x.dtype != xs[0].dtype:
            raise DTypeError(f"op.concat: operand dtypes differ: "
                             f"{', '.join(_describe(t) for t in xs)}  [{src}]")
    with current_location(src):
        return result_of(gb.concat([x.value for x in xs], d), src)


# ----------------------------------------------------------------------------
# Matmul and layers
# ----------------------------------------------------------------------------

TRANSPORTS = ("auto", "nccl", "nvshmem")


@eager
def matmul(a, b, transport: str | None = None) -> Traced:
    """`a[..., M, K] @ b[..., K, N]`, the batch dimensions broadcast as
    numpy's; `b` may be 2-D with `a` of any rank >= 2 (a linear layer, one
    GEMM over every row). Under `ts.autocast(dtype=ts.bf16)` the operands are cast
    to bf16 and accumulated in fp32.

    `transport` picks how the collective next to this matmul moves data:
    "nccl" as a separate collective, "nvshmem" inside the GEMM kernel (GPU
    target), or "auto" (pick by size). It matters in two cases of 2-D
    operands. When `a` is split on M (sequence-parallel) over the mesh axis
    `b` is split on N (a column-parallel weight), `a` is all-gathered
    (instead of the weight); with "nvshmem" the GEMM reads peers' rows as
    they arrive. When K is split (a row-parallel weight) and a consumer
    wants the product split on M (`x + matmul(h, w)` with `x` split by
    rows), the partial products are reduce-scattered over rows; with
    "nvshmem" the GEMM pushes each partial tile to the rank owning its rows
    and sums what arrives for its own. "nvshmem" where neither case arises
    is a compile error at this call; "auto" is then a no-op."""
    src = where_called("matmul")
    if transport is not None and transport not in TRANSPORTS:
        raise ArgumentError(f"op.matmul: transport must be one of {list(TRANSPORTS)}, got "
                            f"{transport!r}  [{src}]")
    a, b = operand("matmul", a, src), operand("matmul", b, src)
    half = autocast_dtype()
    if half is not None:
        a, b = _cast_to(a, half, src), _cast_to(b, half, src)
    if a.dtype != b.dtype:
        raise DTypeError(f"op.matmul: operand dtypes differ: {_describe(a)} and {_describe(b)}  "
                         f"[{src}]")
    require_float("matmul", src, a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"op.matmul: operands must have rank >= 1, got shapes {list(a.shape)} "
                         f"and {list(b.shape)} (a scalar factor is op.mul)  [{src}]")
    k_rhs = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if a.shape[-1] != k_rhs:
        raise ShapeError(f"op.matmul: contraction dimensions differ: lhs {list(a.shape)} has "
                         f"K = {a.shape[-1]}, rhs {list(b.shape)} has K = {k_rhs}  [{src}]")
    if a.ndim == 1 or b.ndim == 1:
        return _matmul_vector(a, b, transport)
    with current_location(src):
        if b.ndim == 2 and a.ndim > 2 and transport == "nvshmem" and \
                all(n == 1 for n in a.shape[:-2]):
            # (the fused NVSHMEM GEMMs take a 2-D lhs: [1, S, K] rows as [S, K])
            flat = gb.reshape(a.value, [a.shape[-2], a.shape[-1]])
            out = gb.matmul(flat, b.value, transport)
            return result_of(gb.reshape(out, list(a.shape[:-1]) + [b.shape[-1]]), src)
        if b.ndim == 2:     # (one weight for every batch: tgraph.matmul's shared rhs)
            return result_of(gb.matmul(a.value, b.value, transport), src)
        av, bv = a.value, b.value
        if a.shape[:-2] != b.shape[:-2]:
            # Batch dimensions broadcast as numpy's (a [H, S, D] @ b [D, T]
            # above, a [B, H, S, D] @ b [B, 1, D, T] here).
            try:
                batch = list(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
            except ValueError:
                raise ShapeError(f"op.matmul: batch dimensions {list(a.shape[:-2])} and "
                                 f"{list(b.shape[:-2])} do not broadcast (operands "
                                 f"{list(a.shape)} and {list(b.shape)})  [{src}]") from None
            av = gb.broadcast(av, batch + list(a.shape[-2:]))
            bv = gb.broadcast(bv, batch + list(b.shape[-2:]))
        return result_of(gb.matmul(av, bv, transport), src)


def _matmul_vector(a: Traced, b: Traced, transport) -> Traced:
    """numpy's rules for a 1-D operand: on the left it is a row [1, K], on
    the right a column [K, 1], and that added dimension leaves the result.
    A vector times a batch of matrices is the batch's transposes times the
    vector as a column."""
    k = a.shape[-1]
    if a.ndim == 1 and b.ndim > 2:
        out = matmul(transpose(b, -1, -2), reshape(a, k, 1), transport)
        return reshape(out, *b.shape[:-2], b.shape[-1])
    lhs = reshape(a, 1, k) if a.ndim == 1 else a
    rhs = reshape(b, k, 1) if b.ndim == 1 else b
    out = matmul(lhs, rhs, transport)
    shape = (a.shape[:-1] if a.ndim > 1 else ()) + (b.shape[-1:] if b.ndim > 1 else ())
    return reshape(out, *shape)


@eager
def linear(x, w, b=None, transport: str | None = None, weight_layout: str = "in_out") -> Traced:
    """x @ w (+ b); `transport` as for `matmul`. `weight_layout="in_out"`
    (the default): w is [in, out]; `"out_in"`: w is [out, in], as PyTorch's
    `nn.Linear.weight` and Hugging Face checkpoints hold it (x @ w.T, the
    transpose folded into the GEMM by tessera-fold-transposes)."""
    if weight_layout not in WEIGHT_LAYOUTS:
        raise ArgumentError(f"op.linear: weight_layout={weight_layout!r} must be one of "
                            f"{', '.join(map(repr, WEIGHT_LAYOUTS))}  [{user_frame()}]")
    if weight_layout == "out_in":
        w = operand("linear", w, where_called("linear"))
        if w.ndim != 2:
            raise ShapeError(f"op.linear: weight_layout='out_in' needs a 2-D weight [out, in], "
                             f"got w {list(w.shape)}  [{user_frame()}]")
        w = transpose(w, 1, 0)
    y = matmul(x, w, transport)
    if b is None:
        return y
    shape = getattr(b, "shape", None)
    if shape is not None and not _broadcasts_to(tuple(shape), y.shape):
        raise ShapeError(f"op.linear: bias b has shape {list(shape)}, which does not broadcast "
                         f"to the output {list(y.shape)} (expected [{y.shape[-1]}])  "
                         f"[{user_frame()}]")
    return add(y, b)


#: `op.linear`'s weight layouts: [in, out] (Tessera's) and [out, in] (PyTorch's)
WEIGHT_LAYOUTS = ("in_out", "out_in")


def arange(start, stop=None, step=1, dtype=None):
    """Evenly spaced values as numpy's `arange`: from start by step, below
    stop (`arange(n)`: 0 to n-1). Integer arguments give int32 (as JAX), any float one float32;
    `dtype` chooses. Inside a compiled function a traced tensor (`tgraph.iota`,
    no buffer read), outside one a numpy array."""
    tracing = current() is not None
    src = where_called("arange") if tracing else user_frame()
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if not is_number(v):
            raise ArgumentError(f"op.arange: {name}={v!r:.60} must be a number  [{src}]")
    if step == 0:
        raise ArgumentError(f"op.arange: step=0 would never reach stop={stop!r}  [{src}]")
    integral = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
    dtype = dtypes.as_dtype(dtype if dtype is not None else (np.int32 if integral else np.float32))
    n = builtins.max(0, math.ceil((stop - start) / step))
    if not tracing:
        return (start + step * np.arange(n)).astype(dtype)
    with current_location(src):
        i = result_of(gb.iota([n], 0, element_type(dtype)), src)
    if step != 1:
        i = mul(i, step)
    return i if start == 0 else add(i, start)


@eager
def broadcast_to(x, shape) -> Traced:
    """x broadcast to `shape` (numpy's rules: leading dimensions are added,
    dimensions of size 1 repeat); no copy is made until an op needs one."""
    src = where_called("broadcast_to")
    x = operand("broadcast_to", x, src)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if not all(is_int(n) and n >= 0 for n in shape):
        raise ArgumentError(f"op.broadcast_to: shape {shape!r} must be sizes (ints >= 0)  "
                            f"[{src}]")
    if not _broadcasts_to(tuple(x.shape), tuple(int(n) for n in shape)):
        raise ShapeError(f"op.broadcast_to: x of shape {list(x.shape)} does not broadcast to "
                         f"{list(shape)} (numpy rules: trailing dimensions must match or be 1)  "
                         f"[{src}]")
    with current_location(src):
        return result_of(gb.broadcast(x.value, [int(n) for n in shape]), src)


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


def _float32_for_numerics(x: Traced, src) -> Traced:
    """Norms, softmax and losses compute in fp32 when given half precision."""
    return _cast_to(x, dtypes.f32, src) if x.dtype in (dtypes.bf16, dtypes.f16) else x


def _minus_max(x: Traced, dim) -> Traced:
    """x - max(x) along `dim` (softmax's shift, for exp not to overflow); an
    empty `x` (its max has no identity) has nothing to shift."""
    return x if 0 in x.shape else sub(x, max(x, dim, keepdim=True))


@eager
def softmax(x, dim: int = -1, *, axis=None) -> Traced:
    """exp(x - max) / sum(exp(x - max)) along `dim` (or `axis`)."""
    src = where_called("softmax")
    dim = _dim_or_axis("softmax", dim, axis, default=-1)
    x = _float32_for_numerics(operand("softmax", x, src), src)
    require_float("softmax", src, x)
    e = exp(_minus_max(x, dim))
    return div(e, sum(e, dim, keepdim=True))


@eager
def log_softmax(x, dim: int = -1, *, axis=None) -> Traced:
    """x - log(sum(exp(x))) along `dim` (or `axis`), computed shifted by the max."""
    src = where_called("log_softmax")
    dim = _dim_or_axis("log_softmax", dim, axis, default=-1)
    x = _float32_for_numerics(operand("log_softmax", x, src), src)
    require_float("log_softmax", src, x)
    shifted = _minus_max(x, dim)
    return sub(shifted, log(sum(exp(shifted), dim, keepdim=True)))


def _check_feature(name, x: Traced, p, what, src) -> None:
    """A norm's weight or bias: None, or a tensor of shape [D] (x's last
    dimension); a traced one, or an array or DTensor it will capture."""
    if p is None:
        return
    shape = getattr(p, "shape", None) if is_tensor(p) else None
    if shape is None:
        raise not_a_tensor(f"op.{name}", p, src)
    if tuple(shape) != (x.shape[-1],):
        raise ShapeError(f"op.{name}: {what} has shape {list(shape)}, expected "
                         f"[{x.shape[-1]}] for input {list(x.shape)}  [{src}]")


def _check_eps(name, eps, src) -> None:
    if is_tensor(eps):
        return
    if not is_number(eps):
        raise ArgumentError(f"op.{name}: eps={eps!r:.60} is a {type(eps).__name__}, not a "
                            f"number  [{src}]")
    if not eps >= 0:
        raise ArgumentError(f"op.{name}: eps={eps!r} must be >= 0 (it is added to the "
                            f"variance)  [{src}]")


@eager
def layernorm(x, weight=None, bias=None, eps: float = 1e-5) -> Traced:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension."""
    src = where_called("layernorm")
    x = _float32_for_numerics(operand("layernorm", x, src), src)
    require_float("layernorm", src, x)
    _check_feature("layernorm", x, weight, "weight", src)
    _check_feature("layernorm", x, bias, "bias", src)
    _check_eps("layernorm", eps, src)
    centered = sub(x, mean(x, -1, keepdim=True))
    y = mul(centered, rsqrt(add(mean(mul(centered, centered), -1, keepdim=True), eps)))
    if weight is not None:
        y = mul(y, weight)
    if bias is not None:
        y = add(y, bias)
    return y


@eager
def rmsnorm(x, weight=None, eps: float = 1e-6) -> Traced:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension."""
    src = where_called("rmsnorm")
    x = _float32_for_numerics(operand("rmsnorm", x, src), src)
    require_float("rmsnorm", src, x)
    _check_feature("rmsnorm", x, weight, "weight", src)
    _check_eps("rmsnorm", eps, src)
    y = mul(x, rsqrt(add(mean(mul(x, x), -1, keepdim=True), eps)))
    return y if weight is None else mul(y, weight)


@eager
def embedding(ids, table) -> Traced:
    """Rows of `table[V, D]` selected by integer `ids` of any shape: `ids.shape + [D]`."""
    src = where_called("embedding")
    ids, table = operand("embedding", ids, src), operand("embedding", table, src)
    if dtypes.is_float(ids.dtype):
        raise DTypeError(f"op.embedding: ids must be integers, got {_describe(ids)}  [{src}]")
    if table.ndim != 2:
        raise ShapeError(f"op.embedding: table must be [vocab, dim], got {list(table.shape)}  [{src}]")
    # (ids as they are, not flattened: a split of any of their dimensions,
    # the sequence's under context parallelism, carries over to the rows)
    with current_location(src):
        return result_of(gb.gather(table.value, ids.value), src)


@eager
def attention(q, k, v, causal: bool = False, scale: float | None = None,
              seq_dim: int = -2, *, mask=None, segment_ids=None,
              window: int | None = None, softcap: float | None = None,
              dropout_p: float = 0.0, dropout_key=None) -> Traced:
    """softmax(q k^T * scale + masks) v over `[..., S, D]` operands (e.g.
    `[B, H, S, D]`; `v` may have another last dimension); scale defaults to
    1/sqrt(D).

    `seq_dim` is the dimension the sequence runs along (any but the last;
    the others before the last are batch dimensions, "leading"): `seq_dim=1`
    attends over `[B, S, H, D]` operands as a projection reshaped per head
    lays them out, with no transposes to `[B, H, S, D]` and back.

    `k` and `v` may have fewer heads than `q` (grouped-query attention;
    multi-query with one): each leading dimension of `k`/`v` divides `q`'s,
    and query head `h` attends with key/value head `h // (Hq // Hkv)`, read
    in place (no copies). They may also be longer or shorter than `q`
    (`Sk != Sq`): the queries are the last `Sq` positions of the `Sk` keys
    (a decode step, a chunk of a prefill), which is where `causal` and
    `window` put them.

    `softcap=c` caps the scaled scores smoothly before any mask, as Gemma 2:
    `c * tanh(scale * q k^T / c)`.

    `dropout_p=p` with `dropout_key=(seed, step)` drops probabilities after
    the softmax, as PyTorch's SDPA in training: the mask is
    `op.dropout(probabilities, p, dropout_key)`'s on the `[L..., Sq, Sk]`
    probabilities, drawn inside the flash kernels (forward and backward)
    and never stored; the same on any mesh.

    What a query attends to (all optional, combined):

    * `causal=True`: keys at or before its position;
    * `window=W` (with `causal`): only the last `W` positions, its own
      included (Mistral's sliding window: key j when pos - j < W);
    * `mask`: boolean (True = attend, as PyTorch's SDPA) or an additive float
      bias (-inf masks), broadcastable to `[L..., Sq, Sk]`, `L` being q's
      leading dimensions in order (`[B, H]` for `[B, H, S, D]` and, with
      `seq_dim=1`, for `[B, S, H, D]`): `[B, 1, 1, Sk]` for key padding,
      `[B, 1, Sq, Sk]` per query;
    * `segment_ids`: integer document ids `[B, S]` (a leading prefix of q's
      leading dimensions, then the sequence) for packed documents: a query
      attends to keys of its own document only. With `Sk != Sq` pass
      `(q_ids, kv_ids)`.

    A query left with no key at all (a padding row whose mask is all False)
    gives 0 and passes no gradient, as PyTorch's SDPA (Hugging Face's
    default attention) and FlashAttention do; the textbook formula would
    give NaN. An additive mask entry at or below -1000 masks its key as
    -inf does. Beside a key whose biased score is above -896 that changes
    nothing (exp(-104) is 0 in float32 either way); it decides the rows
    with no key above -1000, which give 0 as a fully masked row does: with
    HF's `finfo.min` masks the formula would average every value there,
    with a gradient float32 cannot represent (its log-sum-exp drowns in
    the mask). The mask gets no gradient (an error where it depends on a
    value being differentiated).

    One fused op (`tgraph.attention`): it compiles to flash-attention kernels
    that stream key/value blocks through an online softmax, so the `[Sq, Sk]`
    scores never exist in memory, forward or backward (only a mask the
    caller passes has that size). Under `ts.autocast(dtype=ts.bf16)` the
    operands are cast to bf16; the softmax and the mask run in fp32."""
    src = where_called("attention")
    if not _is_flag(causal):
        raise ArgumentError(f"op.attention: causal={causal!r} must be True or False  [{src}]")
    q, k, v = (operand("attention", t, src) for t in (q, k, v))
    half = autocast_dtype()
    if half is not None:
        q, k, v = (_cast_to(t, half, src) for t in (q, k, v))
    shapes = f"q {list(q.shape)}, k {list(k.shape)} and v {list(v.shape)}"
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim or k.shape[-1] != q.shape[-1] \
            or k.shape[:-1] != v.shape[:-1]:
        raise ShapeError(f"op.attention: {shapes} must be [..., Sq, D], [..., Sk, D] and "
                         f"[..., Sk, Dv]  [{src}]")
    if not q.dtype == k.dtype == v.dtype:
        raise DTypeError(f"op.attention: operand dtypes differ: {_describe(q)}, {_describe(k)}, "
                         f"{_describe(v)}  [{src}]")
    require_float("attention", src, q, k, v)
    if not -q.ndim <= seq_dim < q.ndim or seq_dim % q.ndim == q.ndim - 1:
        raise ShapeError(f"op.attention: seq_dim={seq_dim} is not a dimension of q "
                         f"{list(q.shape)} before its last (the head width)  [{src}]")
    seq_dim %= q.ndim
    lead_dims = [d for d in range(q.ndim - 1) if d != seq_dim]
    for d in lead_dims:
        if k.shape[d] == 0 or q.shape[d] % k.shape[d]:
            raise ShapeError(f"op.attention: dimension {d} of k and v ({k.shape[d]}) must divide "
                             f"q's ({q.shape[d]}): {shapes} (grouped heads: query head h reads "
                             f"key/value head h // (Hq // Hkv))  [{src}]")
    if scale is not None and not is_number(scale):
        raise ArgumentError(f"op.attention: scale must be a positive number (or None: "
                            f"1/sqrt(D)), got {scale!r}  [{src}]")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not scale > 0:
        raise ArgumentError(f"op.attention: scale must be positive, got {scale}  [{src}]")
    if window is not None and (not _is_count(window) or window < 1 or not causal):
        raise ArgumentError(f"op.attention: window={window!r} must be a positive integer, with "
                            f"causal=True (the last W positions)  [{src}]")
    if softcap is not None and (not is_number(softcap) or not softcap > 0
                                or not math.isfinite(softcap)):
        raise ArgumentError(f"op.attention: softcap={softcap!r} must be a positive number (or "
                            f"None)  [{src}]")
    lead = [q.shape[d] for d in lead_dims]
    sq, sk = q.shape[seq_dim], k.shape[seq_dim]
    rate, seeds = _attention_dropout(dropout_p, dropout_key, lead, src)
    spec = gb.AttentionSpec(scale, bool(causal), seq_dim, None if window is None else int(window),
                            _attention_mask(mask, q, lead, sq, sk, src),
                            _segment_ids(segment_ids, lead, sq, sk, src),
                            None if softcap is None else float(softcap), rate, seeds)
    with current_location(src):
        out, _ = gb.attention(q.value, k.value, v.value, spec)
    return result_of(out, src)


def _attention_dropout(p, key, lead: list, src):
    """op.attention's dropout: (rate, the i64 seeds [L..., 1, 3] holding
    (seed, step, h) per head, h its flat index in L), or (None, None)."""
    if not is_number(p) or not 0 <= p < 1:
        raise ArgumentError(f"op.attention: dropout_p={p!r:.60} must be a number in [0, 1)  "
                            f"[{src}]")
    if p == 0:
        return None, None
    if key is None:
        raise ArgumentError(f"op.attention: dropout_p={p} needs dropout_key=(seed, step) (the "
                            f"step as an array of the program: a new mask each step)  [{src}]")
    k = _dropout_key(key, src, "op.attention: dropout_key")
    heads = reshape(_cast_to(arange(math.prod(lead)), np.int64, src), *lead, 1, 1)
    pair = broadcast_to(reshape(k, *([1] * len(lead)), 1, 2), (*lead, 1, 2))
    return float(p), concat([pair, heads], dim=-1).value


def _is_count(n) -> bool:
    return isinstance(n, (int, np.integer)) and not isinstance(n, bool)


#: An additive attention mask entry at or below this masks its key (-inf).
MASKED_BELOW = -1000.0


def _attention_mask(mask, q: Traced, lead: list, sq: int, sk: int, src):
    """op.attention's `mask` as the op's additive f32 (f64) bias
    `[L..., Sq | 1, Sk]` (None: no mask)."""
    if mask is None:
        return None
    mask = operand("attention", mask, src)
    want = lead + [sq, sk]
    shown = "[" + ", ".join(f"1|{n}" for n in lead + [sq]) + f", {sk}]"
    if mask.ndim > len(want) or any(m not in (1, w) for m, w in
                                    zip(reversed(mask.shape), reversed(want))):
        raise ShapeError(f"op.attention: mask {list(mask.shape)} does not broadcast to "
                         f"{shown} (q's leading dimensions, then Sq, Sk)  [{src}]")
    stat = dtypes.as_dtype(np.float64 if q.dtype == np.dtype(np.float64) else np.float32)
    if mask.dtype == np.dtype(bool):
        mask = cast(where(mask, 0.0, float("-inf")), stat)
    elif dtypes.is_float(mask.dtype):
        mask = cast(mask, stat)
        mask = where(mask <= MASKED_BELOW, float("-inf"), mask)
    else:
        raise DTypeError(f"op.attention: mask must be boolean (True = attend) or an additive "
                         f"float bias, got {_describe(mask)}  [{src}]")
    mask = reshape(mask, *([1] * (len(want) - mask.ndim) + list(mask.shape)))
    if mask.shape[-1] != sk:    # one bias for every key: spelled out
        mask = broadcast_to(mask, list(mask.shape[:-1]) + [sk])
    return mask.value


def _segment_ids(ids, lead: list, sq: int, sk: int, src):
    """op.attention's `segment_ids` as the op's i32 `[L..., S, 1]` pair (None)."""
    if ids is None:
        return None
    pair = isinstance(ids, (tuple, list))
    if not pair and sq != sk:
        raise ShapeError(f"op.attention: segment_ids for {sq} queries over {sk} keys: pass "
                         f"(q_segment_ids, kv_segment_ids)  [{src}]")
    if pair and len(ids) != 2:
        raise ArgumentError(f"op.attention: segment_ids must be one array or a pair "
                            f"(q_segment_ids, kv_segment_ids), got {len(ids)}  [{src}]")
    out = []
    for t, n, name in zip(ids if pair else (ids, ids), (sq, sk), ("q", "kv")):
        t = operand("attention", t, src)
        if t.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise DTypeError(f"op.attention: segment_ids must be int32 or int64, got "
                             f"{_describe(t)}  [{src}]")
        prefix = list(t.shape[:-1])
        if not t.ndim or t.shape[-1] != n or len(prefix) > len(lead) or \
                any(p not in (1, l) for p, l in zip(prefix, lead)):
            shown = "[" + ", ".join(str(l) for l in lead[:1]) + (", " if lead else "") + f"{n}]"
            raise ShapeError(f"op.attention: {name} segment_ids {list(t.shape)} must be "
                             f"{shown}: a prefix of q's leading dimensions {lead}, then the "
                             f"{n} positions  [{src}]")
        if t.dtype == np.dtype(np.int64):
            message = ("op.attention{where}: segment id {value} at position {row} does not fit "
                       "in int32")
            with current_location(src):
                t = result_of(gb.check_range(t.value, -(1 << 31), 1 << 31, message), src)
            t = cast(t, dtypes.as_dtype(np.int32))
        shape = prefix + [1] * (len(lead) - len(prefix)) + [n, 1]
        out.append(reshape(t, *shape).value)
    return tuple(out)


flash_attention = attention


@eager
def cross_entropy(logits, targets, ignore_index: int = -100) -> Traced:
    """Mean over non-ignored rows of -log softmax(logits)[target]. `logits` is
    `[N, V]` (or `[..., V]` with `targets` `[...]`); rows whose target is
    `ignore_index` (a class in `[0, V)` too) count zero and are left out of
    the mean. Any other target outside `[0, V)` is an error: the step that
    computes the loss, or only its gradient, raises `ts.ValueCheckError`
    once it has run, naming the row (of the flattened targets), the target
    and V. The check runs where the targets are (on a GPU without
    synchronizing the step; each rank of a data-parallel step checks its
    own rows)."""
    src = where_called("cross_entropy")
    logits = _float32_for_numerics(operand("cross_entropy", logits, src), src)
    targets = operand("cross_entropy", targets, src)
    if dtypes.is_float(targets.dtype):
        raise DTypeError(f"op.cross_entropy: targets must be integers, got {_describe(targets)}  "
                         f"[{src}]")
    if logits.shape[:-1] != targets.shape:
        raise ShapeError(f"op.cross_entropy: logits {list(logits.shape)} need targets of shape "
                         f"{list(logits.shape[:-1])}, got {list(targets.shape)}  [{src}]")
    # (rows in the targets' shape, not flattened: a split of any of their
    # dimensions, the sequence's under context parallelism, carries over)
    V = logits.shape[-1]
    t = _checked_targets(targets, V, ignore_index, src)
    if 0 <= ignore_index < V:           # a real class: its rows count zero too
        t = where(equal(t, ignore_index), -1, t)
    onehot = one_hot(t, V, logits.dtype, src)                       # [..., V], zero row if ignored
    # Not ignored (t is in [0, V) or ignored, and an ignored class is -1 by
    # now); from the targets, not summed over the vocabulary (no all-reduce
    # where it is split).
    valid = mul(cast(greater_equal(t, 0), logits.dtype), cast(less(t, V), logits.dtype))
    # -log softmax(x)[target] = log(sum(exp(x - max))) - (x - max)[target]: the
    # two sums over the vocabulary are independent, so a vocabulary split over
    # ranks all-reduces them together (log_softmax's needed the first's result).
    shifted = _minus_max(logits, -1)
    total = sum(exp(shifted), -1)                                        # [...]
    chosen = sum(mul(shifted, onehot), -1)                               # [...]
    nll = mul(sub(log(total), chosen), valid)                            # [...]
    count = maximum(sum(valid), 1.0)
    return div(sum(nll), count)


def _checked_targets(t: Traced, classes: int, ignore_index: int, src) -> Traced:
    """Targets `t`, checked where the step runs to lie in [0, classes)
    or be `ignore_index` (`tgraph.check_range`: the loss and its gradient
    read its result, so either keeps the check)."""
    allowed = [] if 0 <= ignore_index < classes else [int(ignore_index)]
    rule = f"targets must be in [0, {classes})" + \
        (f" or ignore_index={ignore_index}" if allowed else "")
    message = (f"ts.nn.cross_entropy{{where}}: target {{value}} in row {{row}} is out of range "
               f"for {classes} classes ({rule})")
    with current_location(src):
        return result_of(gb.check_range(t.value, 0, classes, message, allowed), src)


@eager
def cumsum(x, dim: int = -1) -> Traced:
    """Running sums along `dim`, as numpy's `cumsum` (floating-point x): one
    GEMM with an upper-triangular matrix of ones (n x n work per row of n;
    a sequence's positions, a mask's count, not long scans). Its gradient is
    the reversed running sum."""
    src = where_called("cumsum")
    x = operand("cumsum", x, src)
    require_float("cumsum", src, x)
    d = _one_dim("cumsum", x, dim, src)
    n = x.shape[d]
    last, back = _moved_last(x, d)
    with current_location(src):
        rows = result_of(gb.iota([n, n], 0, element_type(np.dtype(np.int32))), src)
        cols = result_of(gb.iota([n, n], 1, element_type(np.dtype(np.int32))), src)
    y = matmul(last, cast(less_equal(rows, cols), x.dtype))
    return y if back is None else transpose(y, back)


@eager
def take_along_axis(x, indices, dim: int) -> Traced:
    """numpy's `take_along_axis`: out[..., j, ...] = x[..., indices[..., j,
    ...], ...] along `dim`. `indices` (int32 or int64) has x's rank; its other
    dimensions broadcast with x's; negative indices count from the end. An
    index outside [-n, n) fails the step with ts.ValueCheckError naming its
    row and value (checked where the step runs; numpy raises IndexError).
    Differentiable in x: a one-hot read, k x n work per row, no gather op."""
    src = where_called("take_along_axis")
    x, idx = operand("take_along_axis", x, src), operand("take_along_axis", indices, src)
    require_float("take_along_axis", src, x)
    if idx.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise DTypeError(f"op.take_along_axis: indices must be int32 or int64, got "
                         f"{_describe(idx)}  [{src}]")
    if idx.ndim != x.ndim or not x.ndim:
        raise ShapeError(f"op.take_along_axis: indices {list(idx.shape)} must have the rank of "
                         f"x {list(x.shape)} (at least 1)  [{src}]")
    d = _one_dim("take_along_axis", x, dim, src)
    n = x.shape[d]
    lead_x = [m for i, m in enumerate(x.shape) if i != d]
    lead_i = [m for i, m in enumerate(idx.shape) if i != d]
    try:
        np.broadcast_shapes(tuple(lead_x), tuple(lead_i))
    except ValueError:
        raise ShapeError(f"op.take_along_axis: indices {list(idx.shape)} and x {list(x.shape)} "
                         f"do not broadcast outside dimension {d}  [{src}]") from None
    message = (f"op.take_along_axis{{where}}: index {{value}} in row {{row}} is out of range "
               f"for dimension {d} of size {n} (indices must be in [{-n}, {n}))")
    with current_location(src):
        checked = result_of(gb.check_range(idx.value, -n, n, message), src)
    xt, back = _moved_last(x, d)
    it, _ = _moved_last(checked, d)
    # Wrapped as floats (exact below 2^24, else float64): Graph IR has no
    # integer arithmetic. The read broadcasts the other dimensions.
    at = cast(it, dtypes.as_dtype(np.float32 if n < 1 << 24 else np.float64))
    out = read_chosen(xt, where(less(at, 0.0), add(at, float(n)), at), src)
    return out if back is None else transpose(out, back)


def _dynamic_start(name: str, x: Traced, start, d: int, size: int, src) -> Traced:
    """`start` (a Python int or an integer scalar of the program) as the i32
    scalar a dynamic slice reads, checked where the step runs to leave room
    for `size` along dimension `d` (ts.ValueCheckError naming the value)."""
    room = x.shape[d] - size
    if is_int(start) and not 0 <= start <= room:
        raise ArgumentError(f"op.{name}: start={start} leaves no room for {size} along dimension "
                            f"{d} of {list(x.shape)} (0 to {room})  [{src}]")
    s = operand(name, np.int32(start) if is_int(start) else start, src)
    if s.dtype not in (np.dtype(np.int32), np.dtype(np.int64)) or s.shape != ():
        raise DTypeError(f"op.{name}: start must be an integer scalar (int32 or int64), got "
                         f"{_describe(s)}  [{src}]")
    message = (f"op.{name}{{where}}: start {{value}} leaves no room for {size} along "
               f"dimension {d} of {list(x.shape)} (0 to {room}; a scalar: row {{row}})")
    with current_location(src):
        checked = result_of(gb.check_range(s.value, 0, room + 1, message), src)
    return cast(checked, dtypes.as_dtype(np.int32))


@eager
def dynamic_slice(x, start, size: int, dim: int = 0) -> Traced:
    """`x`'s block of `size` along `dim` from `start`, XLA's `dynamic_slice`
    along one dimension: `start` may be a value of the program (an integer
    scalar: a decode step's position), read when the step runs. A start
    that leaves no room for the block fails the step with
    ts.ValueCheckError (XLA clamps it: a different block, silently).
    Differentiable in x."""
    src = where_called("dynamic_slice")
    x = operand("dynamic_slice", x, src)
    d = _one_dim("dynamic_slice", x, dim, src)
    if not is_int(size) or not 0 <= size <= x.shape[d]:
        raise ArgumentError(f"op.dynamic_slice: size={size!r} must be an integer in [0, "
                            f"{x.shape[d]}] (dimension {d} of {list(x.shape)})  [{src}]")
    at = _dynamic_start("dynamic_slice", x, start, d, int(size), src)
    with current_location(src):
        return result_of(gb.dynamic_slice(x.value, at.value, d, int(size)), src)


@eager
def dynamic_update_slice(x, update, start, dim: int = 0) -> Traced:
    """`x` with the block of `update` written along `dim` at `start`
    (`update` has x's shape but along `dim`), XLA's `dynamic_update_slice`
    along one dimension: `start` may be a value of the program, read when
    the step runs (a KV cache written at a decode step's position, one
    compiled step for every position). A start that leaves no room fails
    the step with ts.ValueCheckError. Differentiable in x and update."""
    src = where_called("dynamic_update_slice")
    x = operand("dynamic_update_slice", x, src)
    update = operand("dynamic_update_slice", update, src, like=x)
    d = _one_dim("dynamic_update_slice", x, dim, src)
    if update.dtype != x.dtype:
        raise DTypeError(f"op.dynamic_update_slice: update is {_describe(update)}, x "
                         f"{_describe(x)}: one dtype  [{src}]")
    if update.ndim != x.ndim or update.shape[d] > x.shape[d] or \
            any(u != n for i, (u, n) in enumerate(zip(update.shape, x.shape)) if i != d):
        raise ShapeError(f"op.dynamic_update_slice: update {list(update.shape)} must have x's "
                         f"shape {list(x.shape)} but along dim {d}  [{src}]")
    at = _dynamic_start("dynamic_update_slice", x, start, d, update.shape[d], src)
    with current_location(src):
        return result_of(gb.dynamic_update_slice(x.value, at.value, update.value, d), src)


# ----------------------------------------------------------------------------
# Dropout (counter-based random bits: tessera_runtime/random.py)
# ----------------------------------------------------------------------------

def _dropout_key(key, src, what: str = "op.dropout: key") -> Traced:
    """`key` as the int64 [seed, step] pair tgraph.dropout reads: an int (a
    seed, step 0), a (seed, step) pair of ints or integer scalars of the
    program, or an integer [2] tensor. `what` names the parameter in errors."""
    def bad(why):
        return ArgumentError(f"{what}={key!r:.80} {why}; give a seed, a (seed, step) "
                             f"pair (ints or integer scalars of the program: pass the step as "
                             f"an array to compile once) or an integer [2] tensor  [{src}]")
    if is_int(key):
        key = (key, 0)
    if isinstance(key, (tuple, list)):
        if len(key) != 2:
            raise bad(f"has {len(key)} parts")
        if all(is_int(k) for k in key):
            if not all(0 <= k < 1 << 63 for k in key):
                raise bad("must hold integers in [0, 2**63)")
            return operand("dropout", np.array(key, np.int64), src)
        parts = []
        for k in key:
            k = operand("dropout", np.int64(k) if is_int(k) else k, src)
            if k.dtype.kind not in "iu" or k.shape != ():
                raise bad(f"has a part {_describe(k)}, not an integer scalar")
            parts.append(reshape(_cast_to(k, np.int64, src), 1))
        return concat(parts)
    key = operand("dropout", key, src)
    if key.dtype.kind not in "iu" or key.shape != (2,):
        raise bad(f"is {_describe(key)}, not an integer [2] tensor")
    return _cast_to(key, np.int64, src)


@eager
def dropout(x, p: float, key) -> Traced:
    """`x` with each element zeroed with probability `p` and the others
    scaled by 1/(1-p) (PyTorch's `F.dropout` in training; p=0 returns x, p=1
    zeros). The element's fate is a counter-based random word (Philox-4x32,
    tessera_runtime/random.py) of `key` = (seed, step) and its index in the
    global tensor, so the mask is the same on one rank and on any mesh that
    splits x, and the same when recomputed (its gradient applies it again).
    `key` is a seed, a (seed, step) pair of ints or of integer scalars of the
    program (pass the step as an array: one compiled step for every step),
    or an integer [2] tensor. Different steps draw independent masks."""
    src = where_called("dropout")
    x = operand("dropout", x, src)
    require_float("dropout", src, x)
    if not is_number(p) or not 0 <= p <= 1:
        raise ArgumentError(f"op.dropout: p={p!r:.60} must be a number in [0, 1]  [{src}]")
    k = _dropout_key(key, src)
    if p == 0:
        return x
    with current_location(src):
        if p == 1:
            return result_of(gb.zeros_like(x.value), src)
        return result_of(gb.dropout(x.value, k.value, float(p)), src)


# ----------------------------------------------------------------------------
# Top-k selection (`op.topk`; `models.moe` routes with it)
# ----------------------------------------------------------------------------

@eager
def topk(x, k: int):
    """(values, indices) of the `k` largest entries of `x`'s last dimension,
    largest first; equal values: the lower index first. `values` is
    differentiable (a one-hot read of `x`), `indices` is int32."""
    src = where_called("topk")
    x = as_traced("op.topk", x, src)
    require_float("topk", src, x)
    n = x.shape[-1] if x.ndim else 0
    if not is_int(k):
        raise ArgumentError(f"op.topk: k={k!r} must be an int in [1, {n}] (the last dimension "
                            f"of {list(x.shape)})  [{src}]")
    if not x.ndim or not 1 <= k <= n:
        raise ShapeError(f"op.topk: k={k} must be in [1, {n}] (the last dimension of "
                         f"{list(x.shape)})  [{src}]")
    with current_location(src):
        indices = result_of(gb.topk(x.value, k), src)
    return read_chosen(x, indices, src), indices


def one_hot(indices: Traced, n: int, dtype, src) -> Traced:
    """[..., k, n]: 1 where the last index is indices[..., k], else 0."""
    lead = list(indices.shape)
    with current_location(src):
        cols = result_of(gb.iota(lead + [n], len(lead), element_type(indices.dtype)), src)
    return cast(equal(reshape(indices, *lead, 1), cols), dtype)


def read_chosen(x: Traced, indices: Traced, src) -> Traced:
    """x[..., indices[..., j]] as a sum over a one-hot mask (differentiable in x)."""
    n = x.shape[-1]
    hit = one_hot(indices, n, x.dtype, src)
    return sum(mul(hit, reshape(x, *x.shape[:-1], 1, n)), -1)
