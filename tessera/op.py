"""Tensor operators (`tessera.op`).

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
import math

import numpy as np

from tessera_mlir import ir
from tessera_compiler.ir import graph_builder as gb

from . import dtypes
from ._checks import is_int, is_number
from ._source import SourceLine, user_frame
from ._trace import (Traced, as_traced, autocast_dtype, current, current_location, element_type,
                     is_tensor, not_a_tensor)
from .errors import ArgumentError, ShapeError

__all__ = [
    "matmul", "add", "sub", "mul", "div", "neg", "pow", "maximum", "minimum",
    "exp", "log", "tanh", "sqrt", "rsqrt", "relu", "gelu", "silu", "sigmoid", "square",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "where",
    "isfinite", "cast", "sum", "mean", "max", "softmax", "log_softmax", "layernorm",
    "rmsnorm", "embedding", "attention", "flash_attention", "cross_entropy", "reshape",
    "transpose", "split", "concat", "index", "transformer_block", "autodiff", "linear",
    "kernel", "moe", "topk",
]


class DTypeError(ShapeError, TypeError):
    """Operands whose element types an op cannot take."""


builtins_sum = builtins.sum        # (this module defines its own `sum`)

# ----------------------------------------------------------------------------
# Operand handling
# ----------------------------------------------------------------------------

def _where_called(name: str) -> SourceLine:
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


def _tensor(name: str, x, src: SourceLine, like: Traced | None = None) -> Traced:
    """`x` as a traced tensor: Python numbers take `like`'s dtype (f32 if none)."""
    return as_traced(f"op.{name}", x, src, like)


def _out(value, src) -> Traced:
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
        return _out(gb.cast(x.value, element_type(dtype)), src)


def _broadcast_shapes(name: str, src, *xs: Traced) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*[x.shape for x in xs]))
    except ValueError:
        raise ShapeError(f"op.{name}: shapes {' and '.join(str(list(x.shape)) for x in xs)} do not "
                         f"broadcast (numpy rules: trailing dimensions must match or be 1)  "
                         f"[{src}]") from None


def _require_float(name, src, *xs: Traced) -> None:
    for x in xs:
        if not dtypes.is_float(x.dtype):
            raise DTypeError(f"op.{name}: needs floating-point operands, got {_describe(x)}  [{src}]")


def _elementwise_operands(name: str, src, *xs, floats: bool = True) -> list[Traced]:
    """Traced, dtype-promoted and broadcast operands of an elementwise op."""
    like = next((x for x in xs if isinstance(x, Traced)), None)
    ts = [_tensor(name, x, src, like) for x in xs]
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
                t = _out(gb.broadcast(t.value, list(shape)), src)
            out.append(t)
    return out


def _binary(kind: str, name: str, a, b) -> Traced:
    src = _where_called(name)
    a, b = _elementwise_operands(name, src, a, b)
    with current_location(src):
        return _out(gb.binary(kind, a.value, b.value), src)


def _unary(kind: str, name: str, x) -> Traced:
    src = _where_called(name)
    (x,) = _elementwise_operands(name, src, x)
    with current_location(src):
        return _out(gb.unary(kind, x.value), src)


# ----------------------------------------------------------------------------
# Elementwise
# ----------------------------------------------------------------------------

def add(a, b) -> Traced:
    """a + b (broadcasting)."""
    return _binary("add", "add", a, b)


def sub(a, b) -> Traced:
    """a - b (broadcasting)."""
    return _binary("sub", "sub", a, b)


def mul(a, b) -> Traced:
    """a * b (broadcasting)."""
    return _binary("mul", "mul", a, b)


def div(a, b) -> Traced:
    """a / b (broadcasting)."""
    return _binary("div", "div", a, b)


def maximum(a, b) -> Traced:
    """Elementwise max(a, b)."""
    return _binary("max", "maximum", a, b)


def minimum(a, b) -> Traced:
    """Elementwise min(a, b) = -max(-a, -b)."""
    # Promoted first: a Python number beside a bf16 tensor is bf16 (numpy's
    # rule); negated alone it would become an f32 tensor.
    a, b = _elementwise_operands("minimum", _where_called("minimum"), a, b)
    return neg(maximum(neg(a), neg(b)))


def neg(x) -> Traced:
    return _unary("neg", "neg", x)


def exp(x) -> Traced:
    return _unary("exp", "exp", x)


def log(x) -> Traced:
    return _unary("log", "log", x)


def tanh(x) -> Traced:
    return _unary("tanh", "tanh", x)


def sqrt(x) -> Traced:
    return _unary("sqrt", "sqrt", x)


def rsqrt(x) -> Traced:
    """1 / sqrt(x)."""
    return _unary("rsqrt", "rsqrt", x)


def relu(x) -> Traced:
    """max(x, 0)."""
    return _unary("relu", "relu", x)


def square(x) -> Traced:
    (x,) = _elementwise_operands("square", _where_called("square"), x)
    return mul(x, x)


def pow(x, p) -> Traced:
    """x ** p for a small non-negative integer p, or p = 0.5 / -0.5."""
    if p == 0.5:
        return sqrt(x)
    if p == -0.5:
        return rsqrt(x)
    if isinstance(p, int) and 0 <= p <= 8:
        result = 1.0
        for _ in range(p):
            result = x if isinstance(result, float) else mul(result, x)
        return result if not isinstance(result, float) else mul(x, 0.0) + 1.0
    raise ShapeError(f"op.pow: exponent {p!r} is not supported (integers 0..8, 0.5, -0.5)  "
                     f"[{user_frame()}]")


def sigmoid(x) -> Traced:
    """1 / (1 + exp(-x))."""
    (x,) = _elementwise_operands("sigmoid", _where_called("sigmoid"), x)
    return div(1.0, add(exp(neg(x)), 1.0))


def silu(x) -> Traced:
    """x * sigmoid(x)."""
    (x,) = _elementwise_operands("silu", _where_called("silu"), x)
    return mul(x, sigmoid(x))


def gelu(x) -> Traced:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    One op (`tgraph.gelu`): its backward keeps only its input."""
    return _unary("gelu", "gelu", x)


def _compare(kind: str, name: str, a, b) -> Traced:
    src = _where_called(name)
    a, b = _elementwise_operands(name, src, a, b, floats=False)
    with current_location(src):
        return _out(gb.compare(kind, a.value, b.value), src)


def equal(a, b): return _compare("eq", "equal", a, b)
def not_equal(a, b): return _compare("ne", "not_equal", a, b)
def less(a, b): return _compare("lt", "less", a, b)
def less_equal(a, b): return _compare("le", "less_equal", a, b)
def greater(a, b): return _compare("gt", "greater", a, b)
def greater_equal(a, b): return _compare("ge", "greater_equal", a, b)


def where(cond, a, b) -> Traced:
    """`cond ? a : b` elementwise (broadcasting); `cond` is a boolean tensor."""
    src = _where_called("where")
    c = _tensor("where", cond, src)
    if c.dtype != dtypes.bool_:
        raise DTypeError(f"op.where: condition must be boolean (a comparison), got "
                         f"{_describe(c)}  [{src}]")
    a, b = _elementwise_operands("where", src, a, b, floats=False)
    shape = _broadcast_shapes("where", src, c, a)
    with current_location(src):
        cv = gb.broadcast(c.value, list(shape))
        av, bv = gb.broadcast(a.value, list(shape)), gb.broadcast(b.value, list(shape))
        return _out(gb.select(cv, av, bv), src)


def isfinite(x) -> Traced:
    """True where x is neither inf nor nan (x - x == 0 holds exactly then)."""
    src = _where_called("isfinite")
    x = _tensor("isfinite", x, src)
    _require_float("isfinite", src, x)
    d = sub(x, x)
    return equal(d, 0.0)


def cast(x, dtype) -> Traced:
    """x converted to `dtype` (ts.f32, ts.bf16, ...); float to float rounds to nearest."""
    src = _where_called("cast")
    return _cast_to(_tensor("cast", x, src), dtypes.as_dtype(dtype), src)


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
                            f"axis={axis!r})  [{_where_called(name)}]")
    return axis if axis is not None else dim


def _is_flag(x) -> bool:
    """True, False (or numpy's, or 0 and 1): not a string, whose truth is its length."""
    return isinstance(x, (bool, np.bool_)) or (isinstance(x, (int, np.integer)) and x in (0, 1))


def _reduce(kind: str, name: str, x, dim, keepdim) -> Traced:
    src = _where_called(name)
    x = _tensor(name, x, src)
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
        return _out(v, src)


def sum(x, dim=None, keepdim: bool = False, *, axis=None) -> Traced:  # noqa: A001
    """Sum over `dim` (an int, a tuple, or None for all; `axis=` is the same);
    over a zero-size dimension, 0."""
    return _reduce("sum", "sum", x, _dim_or_axis("sum", dim, axis), keepdim)


def max(x, dim=None, keepdim: bool = False, *, axis=None) -> Traced:  # noqa: A001
    """Maximum over `dim` (or `axis`); a zero-size dimension is an error, as in numpy."""
    return _reduce("max", "max", x, _dim_or_axis("max", dim, axis), keepdim)


def mean(x, dim=None, keepdim: bool = False, *, axis=None) -> Traced:
    """Mean over `dim` (or `axis`); over a zero-size dimension NaN (0 / 0),
    numpy's result (numpy also warns)."""
    src = _where_called("mean")
    x = _tensor("mean", x, src)
    dim = _dim_or_axis("mean", dim, axis)
    n = int(np.prod([x.shape[d] for d in _dims("mean", x, dim, src)]))
    return div(sum(x, dim, keepdim), float(n))


# ----------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------

def reshape(x, *shape) -> Traced:
    """`x` with a new shape (one dimension may be -1)."""
    src = _where_called("reshape")
    x = _tensor("reshape", x, src)
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
        return _out(gb.reshape(x.value, shape), src)


def transpose(x, *dims) -> Traced:
    """`transpose(x)` reverses the dimensions; `transpose(x, a, b)` swaps two;
    `transpose(x, perm)` permutes."""
    src = _where_called("transpose")
    x = _tensor("transpose", x, src)
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
        return _out(gb.transpose(x.value, perm), src)


def split(x, sections, dim: int = -1, *, axis=None) -> list[Traced]:
    """`sections` equal parts (an int) or parts of the given sizes along `dim` (or `axis`)."""
    dim = _dim_or_axis("split", dim, axis, default=-1)
    src = _where_called("split")
    x = _tensor("split", x, src)
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
            out.append(_out(gb.slice_(x.value, offsets, shape), src))
            start += size
    return out


def index(x, key) -> Traced:
    """`x[key]` for integers and unit-step slices per leading dimension
    (`x[0]`, `x[:, 1:3]`; an empty slice is a zero-size dimension); an
    integer drops its dimension."""
    src = _where_called("index")
    x = _tensor("index", x, src)
    key = key if isinstance(key, tuple) else (key,)
    if len(key) > x.ndim:
        raise ShapeError(f"op.index: {len(key)} indices for shape {list(x.shape)}  [{src}]")
    offsets, shape, keep = [0] * x.ndim, list(x.shape), list(x.shape)
    for d, k in enumerate(key):
        if isinstance(k, (int, np.integer)):
            i = int(k) + (x.shape[d] if k < 0 else 0)
            if not 0 <= i < x.shape[d]:
                raise ShapeError(f"op.index: index {k} is out of range for dimension {d} of "
                                 f"{list(x.shape)}  [{src}]")
            offsets[d], shape[d], keep[d] = i, 1, None
        elif isinstance(k, slice):
            start, stop, step = k.indices(x.shape[d])
            if step != 1:
                raise ShapeError(f"op.index: only unit-step slices are supported, got "
                                 f"{k} for dimension {d} of {list(x.shape)}  [{src}]")
            size = stop - start if stop > start else 0     # x[2:1] is empty, as in numpy
            offsets[d], shape[d], keep[d] = start, size, size
        else:
            raise ShapeError(f"op.index: cannot index with a {type(k).__name__}  [{src}]")
    with current_location(src):
        v = gb.slice_(x.value, offsets, shape)
        return _out(gb.reshape(v, [s for s in keep if s is not None]), src)


def concat(xs, dim: int = 0, *, axis=None) -> Traced:
    """Concatenation along `dim` (or `axis`)."""
    dim = _dim_or_axis("concat", dim, axis, default=0)
    src = _where_called("concat")
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
    xs = [_tensor("concat", x, src) for x in xs]
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
        return _out(gb.concat([x.value for x in xs], d), src)


# ----------------------------------------------------------------------------
# Matmul and layers
# ----------------------------------------------------------------------------

TRANSPORTS = ("auto", "nccl", "nvshmem")


def matmul(a, b, transport: str | None = None) -> Traced:
    """`a[..., M, K] @ b[..., K, N]`; `b` may be 2-D with `a` of any rank >= 2
    (a linear layer). Under `ts.autocast(dtype=ts.bf16)` the operands are cast
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
    src = _where_called("matmul")
    if transport is not None and transport not in TRANSPORTS:
        raise ArgumentError(f"op.matmul: transport must be one of {list(TRANSPORTS)}, got "
                            f"{transport!r}  [{src}]")
    a, b = _tensor("matmul", a, src), _tensor("matmul", b, src)
    half = autocast_dtype()
    if half is not None:
        a, b = _cast_to(a, half, src), _cast_to(b, half, src)
    if a.dtype != b.dtype:
        raise DTypeError(f"op.matmul: operand dtypes differ: {_describe(a)} and {_describe(b)}  "
                         f"[{src}]")
    _require_float("matmul", src, a, b)
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
        if b.ndim == 2 and a.ndim > 2:
            flat = gb.reshape(a.value, [int(np.prod(a.shape[:-1])), a.shape[-1]])
            out = gb.matmul(flat, b.value, transport)
            return _out(gb.reshape(out, list(a.shape[:-1]) + [b.shape[-1]]), src)
        if a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
            raise ShapeError(f"op.matmul: batch dimensions differ: {list(a.shape)} and "
                             f"{list(b.shape)}  [{src}]")
        return _out(gb.matmul(a.value, b.value, transport), src)


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


def linear(x, w, b=None, transport: str | None = None) -> Traced:
    """x @ w (+ b); `transport` as for `matmul`."""
    y = matmul(x, w, transport)
    if b is None:
        return y
    shape = getattr(b, "shape", None)
    if shape is not None and not _broadcasts_to(tuple(shape), y.shape):
        raise ShapeError(f"op.linear: bias b has shape {list(shape)}, which does not broadcast "
                         f"to the output {list(y.shape)} (expected [{y.shape[-1]}])  "
                         f"[{user_frame()}]")
    return add(y, b)


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


def softmax(x, dim: int = -1, *, axis=None) -> Traced:
    """exp(x - max) / sum(exp(x - max)) along `dim` (or `axis`)."""
    src = _where_called("softmax")
    dim = _dim_or_axis("softmax", dim, axis, default=-1)
    x = _float32_for_numerics(_tensor("softmax", x, src), src)
    _require_float("softmax", src, x)
    e = exp(_minus_max(x, dim))
    return div(e, sum(e, dim, keepdim=True))


def log_softmax(x, dim: int = -1, *, axis=None) -> Traced:
    """x - log(sum(exp(x))) along `dim` (or `axis`), computed shifted by the max."""
    src = _where_called("log_softmax")
    dim = _dim_or_axis("log_softmax", dim, axis, default=-1)
    x = _float32_for_numerics(_tensor("log_softmax", x, src), src)
    _require_float("log_softmax", src, x)
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


def layernorm(x, weight=None, bias=None, eps: float = 1e-5) -> Traced:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension."""
    src = _where_called("layernorm")
    x = _float32_for_numerics(_tensor("layernorm", x, src), src)
    _require_float("layernorm", src, x)
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


def rmsnorm(x, weight=None, eps: float = 1e-6) -> Traced:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension."""
    src = _where_called("rmsnorm")
    x = _float32_for_numerics(_tensor("rmsnorm", x, src), src)
    _require_float("rmsnorm", src, x)
    _check_feature("rmsnorm", x, weight, "weight", src)
    _check_eps("rmsnorm", eps, src)
    y = mul(x, rsqrt(add(mean(mul(x, x), -1, keepdim=True), eps)))
    return y if weight is None else mul(y, weight)


def embedding(ids, table) -> Traced:
    """Rows of `table[V, D]` selected by integer `ids` of any shape: `ids.shape + [D]`."""
    src = _where_called("embedding")
    ids, table = _tensor("embedding", ids, src), _tensor("embedding", table, src)
    if dtypes.is_float(ids.dtype):
        raise DTypeError(f"op.embedding: ids must be integers, got {_describe(ids)}  [{src}]")
    if table.ndim != 2:
        raise ShapeError(f"op.embedding: table must be [vocab, dim], got {list(table.shape)}  [{src}]")
    with current_location(src):
        flat = gb.reshape(ids.value, [ids.size])
        rows = gb.gather(table.value, flat)
        return _out(gb.reshape(rows, list(ids.shape) + [table.shape[1]]), src)


def attention(q, k, v, causal: bool = False, scale: float | None = None,
              seq_dim: int = -2) -> Traced:
    """softmax(q k^T * scale [+ causal mask]) v over `[..., S, D]` operands
    (e.g. `[B, H, S, D]`; `v` may have another last dimension); scale
    defaults to 1/sqrt(D).

    `seq_dim` is the dimension the sequence runs along (any but the last;
    the others before the last are batch dimensions): `seq_dim=1` attends
    over `[B, S, H, D]` operands as a projection reshaped per head lays them
    out, with no transposes to `[B, H, S, D]` and back.

    One fused op (`tgraph.attention`): it compiles to flash-attention kernels
    that stream key/value blocks through an online softmax, so the `[S, S]`
    scores never exist in memory, forward or backward. Under
    `ts.autocast(dtype=ts.bf16)` the operands are cast to bf16; the softmax
    runs in fp32."""
    src = _where_called("attention")
    if not _is_flag(causal):
        raise ArgumentError(f"op.attention: causal={causal!r} must be True or False  [{src}]")
    q, k, v = (_tensor("attention", t, src) for t in (q, k, v))
    half = autocast_dtype()
    if half is not None:
        q, k, v = (_cast_to(t, half, src) for t in (q, k, v))
    if q.ndim < 2 or q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        raise ShapeError(f"op.attention: q {list(q.shape)}, k {list(k.shape)} and v "
                         f"{list(v.shape)} must be [..., S, D] with equal q/k shapes  [{src}]")
    if not q.dtype == k.dtype == v.dtype:
        raise DTypeError(f"op.attention: operand dtypes differ: {_describe(q)}, {_describe(k)}, "
                         f"{_describe(v)}  [{src}]")
    _require_float("attention", src, q, k, v)
    if not -q.ndim <= seq_dim < q.ndim or seq_dim % q.ndim == q.ndim - 1:
        raise ShapeError(f"op.attention: seq_dim={seq_dim} is not a dimension of q "
                         f"{list(q.shape)} before its last (the head width)  [{src}]")
    seq_dim %= q.ndim
    if scale is not None and not is_number(scale):
        raise ArgumentError(f"op.attention: scale must be a positive number (or None: "
                            f"1/sqrt(D)), got {scale!r}  [{src}]")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not scale > 0:
        raise ArgumentError(f"op.attention: scale must be positive, got {scale}  [{src}]")
    with current_location(src):
        out, _ = gb.attention(q.value, k.value, v.value, causal, scale, seq_dim)
    return _out(out, src)


flash_attention = attention


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
    src = _where_called("cross_entropy")
    logits = _float32_for_numerics(_tensor("cross_entropy", logits, src), src)
    targets = _tensor("cross_entropy", targets, src)
    if dtypes.is_float(targets.dtype):
        raise DTypeError(f"op.cross_entropy: targets must be integers, got {_describe(targets)}  "
                         f"[{src}]")
    if logits.shape[:-1] != targets.shape:
        raise ShapeError(f"op.cross_entropy: logits {list(logits.shape)} need targets of shape "
                         f"{list(logits.shape[:-1])}, got {list(targets.shape)}  [{src}]")
    V = logits.shape[-1]
    N = int(np.prod(targets.shape))
    logits = reshape(logits, N, V)
    t = _checked_targets(reshape(targets, N), V, ignore_index, src)
    if 0 <= ignore_index < V:           # a real class: its rows count zero too
        t = where(equal(t, ignore_index), -1, t)
    onehot = _one_hot(t, V, logits.dtype, src)                           # [N, V], zero row if ignored
    # Not ignored (t is in [0, V) or ignored, and an ignored class is -1 by
    # now); from the targets, not summed over the vocabulary (no all-reduce
    # where it is split).
    valid = mul(cast(greater_equal(t, 0), logits.dtype), cast(less(t, V), logits.dtype))
    # -log softmax(x)[target] = log(sum(exp(x - max))) - (x - max)[target]: the
    # two sums over the vocabulary are independent, so a vocabulary split over
    # ranks all-reduces them together (log_softmax's needed the first's result).
    shifted = _minus_max(logits, -1)
    total = sum(exp(shifted), -1)                                        # [N]
    chosen = sum(mul(shifted, onehot), -1)                               # [N]
    nll = mul(sub(log(total), chosen), valid)                            # [N]
    count = maximum(sum(valid), 1.0)
    return div(sum(nll), count)


def _checked_targets(t: Traced, classes: int, ignore_index: int, src) -> Traced:
    """Flat targets `t`, checked where the step runs to lie in [0, classes)
    or be `ignore_index` (`tgraph.check_range`: the loss and its gradient
    read its result, so either keeps the check)."""
    allowed = [] if 0 <= ignore_index < classes else [int(ignore_index)]
    rule = f"targets must be in [0, {classes})" + \
        (f" or ignore_index={ignore_index}" if allowed else "")
    message = (f"ts.nn.cross_entropy{{where}}: target {{value}} in row {{row}} is out of range "
               f"for {classes} classes ({rule})")
    with current_location(src):
        return _out(gb.check_range(t.value, 0, classes, message, allowed), src)


def transformer_block(x, depth: int = 1, params=None, heads: int = 1, causal: bool = True,
                      norm: str = "layernorm", remat=None, moe_k: int = 2,
                      capacity_factor=None, return_aux: bool = False):
    """`depth` pre-norm decoder blocks: x + attn(norm(x)), then x + mlp(norm(x)).

    `remat` recomputes each block's forward in the backward instead of
    keeping its activations (see `ts.remat`): True or "full"
    (nothing_saveable), "selective" (attention's core only), "dots_saveable",
    or "auto" (the compile's `memory_budget` chooses). The default, None,
    keeps everything unless the function is compiled with a `memory_budget`,
    which then chooses for every block.

    `params` is a list of `depth` dicts (see `ts.nn.init_transformer`) with
    `ln1_w, ln1_b, wqkv [D, 3D], wo [D, D], ln2_w, ln2_b, w1 [D, F], b1, w2 [F, D], b2`.
    `x` is `[B, S, D]`. A block whose dict holds `moe` (router, w1, w2 of
    `op.moe`) instead of the MLP's weights has a mixture-of-experts MLP with
    `moe_k` experts per token and `capacity_factor`; `return_aux=True` then
    returns `(x, [each such block's op.moe aux])`.

    The columns of `wqkv` are grouped by head: `[D, heads, 3, D // heads]`
    holds each head's q, k and v projections side by side. Splitting its
    columns over a tensor-parallel axis then gives every rank whole heads
    (head-parallel attention, no communication until `wo`)."""
    src = _where_called("transformer_block")
    if norm not in ("layernorm", "rmsnorm"):
        raise ArgumentError(f"op.transformer_block: norm={norm!r} must be 'layernorm' or "
                            f"'rmsnorm'  [{src}]")
    if not is_int(heads) or heads < 1:
        raise ArgumentError(f"op.transformer_block: heads={heads!r} must be a number of "
                            f"attention heads (an int >= 1)  [{src}]")
    if params is None or len(params) != depth:
        raise ShapeError(f"op.transformer_block: needs params= with one dict per layer "
                         f"(depth={depth}); create them with ts.nn.init_transformer  [{src}]")
    x = _tensor("transformer_block", x, src)
    _require_float("transformer_block", src, x)
    if x.ndim != 3:
        raise ShapeError(f"op.transformer_block: x must be [B, S, D], got {list(x.shape)}  [{src}]")
    B, S, D = x.shape
    if D % heads:
        raise ShapeError(f"op.transformer_block: width {D} is not divisible by heads={heads}  [{src}]")
    from .remat import policy_name, region
    policy = policy_name("auto" if remat is None else remat, "op.transformer_block")
    normalize = layernorm if norm == "layernorm" else (lambda h, w, b: rmsnorm(h, w))
    auxes = []
    for p in params:
        with region(policy):
            h = normalize(x, p["ln1_w"], p["ln1_b"])
            qkv = reshape(matmul(h, p["wqkv"]), B, S, heads, 3, D // heads)
            # Each head's q, k, v as [B, S, heads, Dh]: attention runs along
            # dim 1 where they lie, and its output is already [B, S, D].
            q, k, v = (qkv[:, :, :, i] for i in range(3))
            a = reshape(attention(q, k, v, causal=causal, seq_dim=1), B, S, D)
            x = add(x, matmul(a, p["wo"]))
            h = normalize(x, p["ln2_w"], p["ln2_b"])
            if "moe" in p:
                y, aux = moe(h, experts=p["moe"], k=moe_k, capacity_factor=capacity_factor,
                             return_aux=True)
                x = add(x, y)
                auxes.append(aux)
            else:
                x = add(x, add(matmul(gelu(add(matmul(h, p["w1"]), p["b1"])), p["w2"]),
                               p["b2"]))
    return (x, auxes) if return_aux else x


def kernel(fn=None, *, mesh=None, in_specs=None, out_specs=None):
    """`@op.kernel` (the tutorials' name): a per-rank function with explicit
    collectives, `dist.spmd`. Called on DTensors it takes their layouts."""
    from .local_view import spmd
    return spmd(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def autodiff(loss, wrt=None):
    """Gradients of scalar `loss`; see `tessera.grad`. Without `wrt`: with
    respect to every float tensor the function captured (its parameters)."""
    from .autodiff import grad
    return grad(loss, wrt)


# ----------------------------------------------------------------------------
# Mixture of experts (`op.moe`) and top-k selection (`op.topk`)
# ----------------------------------------------------------------------------
# `op.moe(x, experts={"router": Wr, "w1": W1, "w2": W2[, "w3": W3]}, k=2)`
# routes each token of `x[..., D]` to the `k` experts with the largest router
# logits `x @ Wr` and returns the sum of their outputs weighted by the softmax
# of those k logits. Each expert is `gelu(x @ w1[e]) @ w2[e]`, or SwiGLU
# `(silu(x @ w1[e]) * (x @ w3[e])) @ w2[e]` when `w3` is given.
#
# In Graph IR it is a composite: `tgraph.topk` picks the experts,
# `tgraph.moe_dispatch` copies each token's row into an expert-ordered buffer,
# `tgraph.grouped_matmul` runs one GEMM per expert over its rows,
# `tgraph.moe_collect` reads each token's results back, and elementwise ops
# weight and sum them. The gates' derivative flows through a one-hot read of
# the chosen logits; routing itself (which experts) has none, as everywhere.
#
# Capacity (`capacity_factor=c`): each expert keeps
# `ceil(tokens * k * c / E)` rows, filled first choices first, each in token
# order; a dropped choice contributes zero (its gate is not renormalised).
# `capacity_factor=None` drops nothing.
#
# The combine adds a token's k weighted expert outputs in the order of their
# expert indices (`_by_expert_index`): a fixed order, whatever the routing,
# the ranks or the transport, so results are bitwise reproducible.
#
# Expert parallelism (an 'ep' mesh axis): the rows move to their experts'
# ranks and back in two all_to_alls, whatever the transport, so every
# transport gives the same values. The dispatch layout pads each rank's
# block to its worst case (every token to that rank), so the exchanges are
# ragged (`tgraph.all_to_all` with counts, exchanged first): the
# communicator moves only the routed rows, and the elementwise kernels
# between the grouped GEMMs skip the padding (`ttile.kernel` row_segments).
# `transport` picks how they move: "nccl"/"mpi" (the communicator),
# "nvshmem" (GPU target: a kernel that puts each piece into the peer's
# symmetric receive buffer and signals it, see
# passes/tessera_passes/tile/exchange.py; on the CPU the communicator) or
# "auto" (NVSHMEM on the GPU when its buffers fit
# `TargetOptions.nvshmem_auto_max_bytes`). `pack_dtype` rounds what travels:
# "bf16" sends the dispatched rows and the experts' outputs as bf16 (half
# the bytes); "fp8_e4m3" sends the dispatched rows as e4m3 with a float32
# scale per row and the outputs as bf16; None sends them in their own dtype.
# The backward's exchanges move bf16 whenever a pack is asked for.
# `multi_qp` (NVSHMEM): True (MULTI_QP_CHANNELS) or a number of copies per
# peer, each of a range of rows with its own signal (`channels` on the
# all_to_all); False or absent: one. It never changes results.

_TRANSPORTS = ("nccl", "mpi", "nvshmem", "auto")
#: copies per peer of an NVSHMEM exchange with `multi_qp: True`: each moves a
#: quarter of the rows, signalled on its own (DeepEP spreads a peer's traffic
#: over several queue pairs and SMs alike).
MULTI_QP_CHANNELS = 4
_PACK_DTYPES = (None, "fp8_e4m3", "bf16")


def topk(x, k: int):
    """(values, indices) of the `k` largest entries of `x`'s last dimension,
    largest first; equal values: the lower index first. `values` is
    differentiable (a one-hot read of `x`), `indices` is int32."""
    src = _where_called("topk")
    x = as_traced("op.topk", x, src)
    _require_float("topk", src, x)
    n = x.shape[-1] if x.ndim else 0
    if not is_int(k):
        raise ArgumentError(f"op.topk: k={k!r} must be an int in [1, {n}] (the last dimension "
                            f"of {list(x.shape)})  [{src}]")
    if not x.ndim or not 1 <= k <= n:
        raise ShapeError(f"op.topk: k={k} must be in [1, {n}] (the last dimension of "
                         f"{list(x.shape)})  [{src}]")
    with current_location(src):
        indices = _out(gb.topk(x.value, k), src)
    return _read_chosen(x, indices, src), indices


def _one_hot(indices: Traced, n: int, dtype, src) -> Traced:
    """[..., k, n]: 1 where the last index is indices[..., k], else 0."""
    lead = list(indices.shape)
    with current_location(src):
        cols = _out(gb.iota(lead + [n], len(lead), element_type(indices.dtype)), src)
    return cast(equal(reshape(indices, *lead, 1), cols), dtype)


def _read_chosen(x: Traced, indices: Traced, src) -> Traced:
    """x[..., indices[..., j]] as a sum over a one-hot mask (differentiable in x)."""
    n = x.shape[-1]
    hit = _one_hot(indices, n, x.dtype, src)
    return sum(mul(hit, reshape(x, *x.shape[:-1], 1, n)), -1)


def _weight(experts: dict, name: str, src) -> Traced:
    if name not in experts:
        raise ShapeError(f"op.moe: experts has no '{name}' (expected keys 'router', 'w1', 'w2' "
                         f"and optionally 'w3'; got {sorted(experts)})  [{src}]")
    return as_traced(f"op.moe experts['{name}']", experts[name], src)


def _check_transport(transport, src) -> None:
    kind = transport.get("type") if isinstance(transport, dict) else transport
    if kind is not None and kind not in _TRANSPORTS:
        raise ShapeError(f"op.moe: transport {transport!r}: the type must be one of "
                         f"{', '.join(_TRANSPORTS)}  [{src}]")
    if isinstance(transport, dict):
        unknown = set(transport) - {"type", "multi_qp", "pack_dtype"}
        if unknown:
            raise ShapeError(f"op.moe: transport has unknown keys {sorted(unknown)} (known: "
                             f"type, multi_qp, pack_dtype)  [{src}]")
        if transport.get("pack_dtype") not in _PACK_DTYPES:
            raise ShapeError(f"op.moe: pack_dtype {transport['pack_dtype']!r} must be one of "
                             f"{_PACK_DTYPES}  [{src}]")
        qp = transport.get("multi_qp")
        if not (qp is None or isinstance(qp, bool) or (isinstance(qp, int) and 1 <= qp <= 64)):
            raise ShapeError(f"op.moe: multi_qp {qp!r} must be True, False or a number of "
                             f"channels per peer from 1 to 64  [{src}]")


def _expert_mesh(mesh):
    """(mesh, ep size): the mesh `mesh=` names, else the one the function is
    compiled for; ep > 1 when it has an 'ep' axis of more than one rank."""
    if mesh is None:
        mesh = current().mesh
    if mesh is None or "ep" not in mesh.axes:
        return mesh, 1
    return mesh, mesh.axis_size("ep")


def _expert_outputs(tokens: Traced, chosen: Traced, gates: Traced, weights, layout,
                    src, exchange=None) -> tuple[Traced, Traced]:
    """(y [T, D] in the gates' dtype, the kept rows per expert [E]): dispatch,
    the experts' grouped GEMMs, collect, and the gate-weighted sum over each
    token's choices (in expert-index order). `exchange` (expert parallelism) moves
    the dispatched rows to the ranks holding their experts and back."""
    T, k = chosen.shape
    with current_location(src):
        rows, sizes = gb.moe_dispatch(tokens.value, chosen.value, layout)
        rows, kept = _out(rows, src), _out(sizes, src)
    segments = kept
    if exchange is not None:
        segments = exchange.counts(kept)            # first: the exchanges read them
        rows = exchange(rows)

    def grouped(a: Traced, w: Traced) -> Traced:
        with current_location(src):
            return _out(gb.grouped_matmul(a.value, w.value, segments.value), src)

    w1, w2, *w3 = weights
    h = grouped(rows, w1)
    act = gelu(h) if not w3 else mul(silu(h), grouped(rows, w3[0]))
    outs = grouped(act, w2)                                                       # [N, D]
    if exchange is not None:
        outs = exchange(outs, combine=True)                     # back to the rows' ranks
    with current_location(src):
        picked = _out(gb.moe_collect(outs.value, chosen.value, layout), src)     # [T, k, D]
    weighted = mul(cast(picked, gates.dtype), reshape(gates, T, k, 1))
    return sum(_by_expert_index(weighted, chosen), 1), kept


def _by_expert_index(weighted: Traced, chosen: Traced) -> Traced:
    """`weighted` [T, k, D] with each token's k rows in the order of their
    expert indices, so that the combine adds them in that fixed order. Up
    to two rows need no reordering: a + b and b + a are the same bits.
    Otherwise each slot selects its row (exact: a select, not a product)."""
    T, k = chosen.shape
    if k <= 2:
        return weighted
    # The ascending expert order of each token's choices: top-k of -index
    # (distinct experts: no ties).
    _, order = topk(neg(cast(chosen, dtypes.f32)), k)                          # [T, k]
    rows = []
    for slot in range(k):
        row = None
        for j in range(k):
            take = reshape(equal(order[:, slot], np.int32(j)), T, 1)
            row = weighted[:, j] if row is None else where(take, weighted[:, j], row)
        rows.append(reshape(row, T, 1, weighted.shape[-1]))
    return concat(rows, 1)


class _ExpertExchange:
    """Inside the expert-parallel body: the kept-row counts' all-to-all over
    'ep', so each rank learns how many rows of each of its experts every
    source sends (the counts go first: the grouped GEMMs and the exchanges
    read them), then ragged all-to-alls of the dispatch layout's blocks
    (block r holds rank r's experts' rows, padded to the worst case): only
    the routed rows move, and what arrives from each source lies at the
    start of its block."""

    def __init__(self, ep: int, transport=None):
        self.ep = ep
        kind = transport.get("type") if isinstance(transport, dict) else transport
        self.transport = kind if kind in ("nvshmem", "auto") else None
        self.pack = transport.get("pack_dtype") if isinstance(transport, dict) else None
        qp = transport.get("multi_qp") if isinstance(transport, dict) else None
        # NVSHMEM copies per peer (the exchange kernel's instances per peer).
        self.channels = (MULTI_QP_CHANNELS if qp is True else qp or None) \
            if self.transport else None
        self.rows = None         # (sent to, received from) each rank: counts() sets them

    def _move(self, x: Traced, combine: bool, gradient: bool = True) -> Traced:
        """`x` [N, ...]: the rows of block r to rank r (the dispatch; with
        `combine` the rows each rank sent come back); what arrives lies side
        by side in source order. Without `gradient` the exchange sends no
        cotangent back (tessera-autodiff's NO_GRADIENT)."""
        from .local_view import collective
        n = x.shape[0]
        blocks = reshape(x, self.ep, n // self.ep, *x.shape[1:])
        sent, received = self.rows
        moved = collective("all_to_all", blocks, "ep", split_dim=0, concat_dim=1,
                           transport=self.transport, channels=self.channels,
                           counts=(received, sent) if combine else (sent, received))
        return reshape(moved if gradient else _no_gradient(moved), *x.shape)

    def __call__(self, rows: Traced, combine: bool = False) -> Traced:
        """`rows` [N, D] moved (the dispatch, or with `combine` the experts'
        outputs back), packed as `pack_dtype` asks: "bf16" both ways;
        "fp8_e4m3" the dispatch in FP8 with a float32 scale per row (its
        largest magnitude maps to 448, e4m3's largest finite) and the
        combine in bf16."""
        dtype, fp8 = rows.dtype, self.pack == "fp8_e4m3" and not combine
        if self.pack is None or dtype == dtypes.bf16:
            return self._move(rows, combine)
        if not fp8:
            return cast(self._move(cast(rows, dtypes.bf16), combine), dtype)
        wide = cast(rows, dtypes.f32)
        amax = max(maximum(wide, neg(wide)), -1, keepdim=True)                   # [N, 1]
        # The scale is a constant to the derivative (the rounding's gradient
        # is the identity, straight through), and moves with no backward.
        scale = _no_gradient(div(maximum(amax, np.float32(2.0 ** -126)), np.float32(448.0)))
        packed = cast(div(wide, scale), dtypes.fp8_e4m3)
        moved = cast(self._move(packed, combine), dtypes.f32)
        return cast(mul(moved, self._move(scale, combine, gradient=False)), dtype)

    def counts(self, kept: Traced) -> Traced:
        """[source, e]: the rows of this rank's expert e each source sends;
        sets `rows`, the rows of each block sent and received."""
        from .local_view import collective
        per_rank = reshape(kept, self.ep, kept.shape[0] // self.ep)               # [ep, E / ep]
        moved = collective("all_to_all", per_rank, "ep", split_dim=0, concat_dim=1)
        segments = reshape(moved, self.ep, kept.shape[0] // self.ep)              # [source, e]
        self.rows = (sum(per_rank, 1), sum(segments, 1))
        return segments


def _no_gradient(x: Traced) -> Traced:
    """Marks the op making `x` as carrying no gradient back
    (tessera-autodiff's NO_GRADIENT); returns `x`."""
    x.value.owner.attributes["tgraph.no_gradient"] = ir.UnitAttr.get()
    return x


def _fill_base(chosen: Traced, E: int, shards: int, src) -> Traced:
    """[shards, k, E] i32: for each token shard, the rows of each (choice j,
    expert e) that precede its own in the global fill order (every shard's
    choices j' < j of e, and shards before it of choice j), so that each
    rank drops exactly what one device would."""
    T, k = chosen.shape
    hit = _one_hot(chosen, E, dtypes.f32, src)                                    # [T, k, E]
    per_shard = sum(reshape(hit, shards, T // shards, k, E), 1)                   # [S, k, E]

    def strictly_lower(n):                           # [n, n]: 1 where row > column
        with current_location(src):
            rows, cols = (_out(gb.iota([n, n], d, element_type(np.dtype(np.int32))), src)
                          for d in (0, 1))
        return cast(greater(rows, cols), dtypes.f32)
    earlier_shards = matmul(strictly_lower(shards), reshape(per_shard, shards, k * E))
    earlier_choices = matmul(strictly_lower(k), sum(per_shard, 0))                # [k, E]
    base = add(reshape(earlier_shards, shards, k, E), reshape(earlier_choices, 1, k, E))
    return cast(base, np.int32)


def _expert_parallel(tokens, chosen, gates, weights, E: int, capacity: int, mesh, ep: int,
                     src, transport=None) -> tuple[Traced, Traced]:
    """The expert-parallel layer as a local-view body over `mesh`: tokens
    split over the 'ep' (and 'dp') axes, experts over 'ep'; each rank routes
    its tokens, exchanges counts then rows with one all-to-all each, runs its
    experts' grouped GEMMs, sends the results back and combines them."""
    from .dist import ShardSpec
    from .local_view import spmd
    T, D = tokens.shape
    token_axes = tuple(a for a in mesh.axes if a in ("ep", "dp"))
    shards = int(np.prod([mesh.axis_size(a) for a in token_axes]))
    if E % ep:
        raise ShapeError(f"op.moe: experts['w1'] dimension 0 (E={E} experts) does not split "
                         f"over mesh axis 'ep' (size {ep})  [{src}]")
    if T % shards:
        raise ShapeError(f"op.moe: {T} tokens do not split over mesh axes {list(token_axes)} "
                         f"({shards} shards)  [{src}]")
    by_token = ShardSpec(partition=(0,) * len(token_axes), mesh_axes=token_axes)
    by_expert = ShardSpec(partition=(0,), mesh_axes=("ep",))
    args = [tokens, chosen, gates] + list(weights)
    specs = [by_token] * 3 + [by_expert] * len(weights)
    if capacity:
        args.append(_fill_base(chosen, E, shards, src))
        specs.append(by_token)
    n_weights = len(weights)

    def body(tokens, chosen, gates, *rest):
        local_weights, base = rest[:n_weights], rest[n_weights:]
        layout = gb.DispatchLayout(E, capacity, blocks=ep,
                                   base=reshape(base[0], *base[0].shape[1:]).value
                                   if base else None)
        y, kept = _expert_outputs(tokens, chosen, gates, local_weights, layout, src,
                                  _ExpertExchange(ep, transport))
        return y, reshape(kept, 1, E)

    y, kept = spmd(body, mesh=mesh, in_specs=specs, out_specs=(by_token, by_token))(*args)
    return y, sum(kept, 0)


def moe(x, experts: dict, router: str = "topk", k: int = 2, capacity_factor=None,
        return_aux: bool = False, transport=None, deterministic: bool = True, mesh=None):
    """A mixture-of-experts layer over the last dimension of `x[..., D]`.

    `experts` holds `router [D, E]`, `w1 [E, D, F]`, `w2 [E, F, D]` and
    optionally `w3 [E, D, F]` (SwiGLU experts), as arrays, DTensors or traced
    tensors. `router="topk"` with `k` in `1..E`. `capacity_factor`: None
    (dropless) or a number (see the module's doc for the drop policy).
    `return_aux=True` returns `(y, aux)` with `aux["load_balance"]`
    (`E * sum_e f_e P_e`: f the fraction of routed choices that chose e, P
    the mean router probability), `aux["z_loss"]` (mean squared log-sum-exp
    of the router logits) and `aux["dropped"]` (the fraction of choices
    dropped by capacity), and `aux["expert_tokens"]`, the rows each expert
    processed (int32 [E]). The router logits and gates are float32 (float64
    for a float64 `x`).
    `transport` (expert parallelism): "nccl" / "mpi" / "nvshmem" / "auto",
    or a dict {"type": ..., "multi_qp": ..., "pack_dtype": None | "bf16" |
    "fp8_e4m3"}; see the comment above `_TRANSPORTS` for what each does.
    `deterministic=True` is the only mode: the combine order is fixed."""
    src = user_frame()
    _where_called("moe")
    if router != "topk":
        raise ShapeError(f"op.moe: router {router!r} is not supported (router='topk')  [{src}]")
    if not isinstance(experts, dict):
        raise ShapeError(f"op.moe: experts must be a dict of weights, got "
                         f"{type(experts).__name__}  [{src}]")
    _check_transport(transport, src)
    mesh, ep = _expert_mesh(mesh)
    if not deterministic:
        raise ShapeError(f"op.moe: deterministic=False is not offered: the combine order is "
                         f"fixed, which costs nothing  [{src}]")
    x = as_traced("op.moe", x, src)
    wr, w1, w2 = (_weight(experts, n, src) for n in ("router", "w1", "w2"))
    w3 = _weight(experts, "w3", src) if "w3" in experts else None
    if x.ndim < 1:
        raise ShapeError(f"op.moe: x must be [..., D], got a scalar  [{src}]")
    D = x.shape[-1]
    if wr.ndim != 2 or wr.shape[0] != D:
        raise ShapeError(f"op.moe: experts['router'] must be [D={D}, E], got {list(wr.shape)} "
                         f"(dimension 0 must equal x's last dimension)  [{src}]")
    E = wr.shape[1]
    if w1.ndim != 3 or w1.shape[:2] != (E, D):
        raise ShapeError(f"op.moe: experts['w1'] must be [E={E}, D={D}, F], got "
                         f"{list(w1.shape)}  [{src}]")
    F = w1.shape[2]
    for name, w, want in (("w2", w2, (E, F, D)), ("w3", w3, (E, D, F))):
        if w is not None and tuple(w.shape) != want:
            which = next((d for d in range(3) if w.ndim != 3 or w.shape[d] != want[d]), 0)
            raise ShapeError(f"op.moe: experts['{name}'] must be {list(want)} (E from the "
                             f"router, D from x, F from w1), got {list(w.shape)}: dimension "
                             f"{which} differs  [{src}]")
    if not isinstance(k, int) or not 1 <= k <= E:
        raise ShapeError(f"op.moe: k={k!r} must be an integer in [1, E={E}]  [{src}]")
    if capacity_factor is not None and not is_number(capacity_factor):
        raise ArgumentError(f"op.moe: capacity_factor={capacity_factor!r} must be a positive "
                            f"number (or None for dropless)  [{src}]")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ShapeError(f"op.moe: capacity_factor={capacity_factor} must be positive (or None "
                         f"for dropless)  [{src}]")
    _require_float("moe", src, x, wr, w1, w2, *([w3] if w3 is not None else []))

    T = int(np.prod(x.shape[:-1]))
    tokens = reshape(x, T, D)
    dtype = x.dtype
    route = dtypes.f64 if dtype == dtypes.f64 else dtypes.f32       # routing never in half
    logits = matmul(cast(tokens, route), cast(wr, route))                # [T, E]
    gates, chosen = topk(logits, k)                                               # [T, k]
    gates = softmax(gates, -1)       # = softmax over all E, renormalised over the k
    capacity = 0 if capacity_factor is None else math.ceil(T * k * capacity_factor / E)
    weights = [cast(w, dtype) for w in (w1, w2, w3) if w is not None]
    if ep == 1:
        y, sizes = _expert_outputs(tokens, chosen, gates, weights, gb.DispatchLayout(E, capacity),
                                   src)
    else:
        y, sizes = _expert_parallel(tokens, chosen, gates, weights, E, capacity, mesh, ep, src,
                                    transport)
    y = reshape(cast(y, dtype), *x.shape)
    if not return_aux:
        return y
    # Switch / GShard load balance: f_e (routed share, no gradient) times
    # P_e (mean router probability, differentiable), scaled so balance is 1.
    share = div(sum(_one_hot(chosen, E, route, src), (0, 1)), float(T * k))    # [E]
    prob = mean(softmax(logits, -1), 0)                                     # [E]
    top = max(logits, -1, keepdim=True)
    lse = add(log(sum(exp(sub(logits, top)), -1)), reshape(top, T))
    kept = sum(cast(sizes, route))
    aux = {"load_balance": mul(sum(mul(share, prob)), float(E)),
           "z_loss": mean(mul(lse, lse)),
           "dropped": sub(1.0, div(kept, float(T * k))),
           "expert_tokens": sizes}
    return y, aux


# ----------------------------------------------------------------------------
# Eager calls: an op called outside a compiled function on numpy arrays or
# DTensors (the design docs' `Y = op.matmul(X, W)` at top level) runs as a
# one-op compiled program, cached per op and signature like any compiled
# function: DTensors in, DTensors out (in the layout the partitioner gives
# the result); numpy in, numpy out.
# ----------------------------------------------------------------------------

_EAGER: dict = {}


def _no_tensor(fn, args, kwargs) -> Exception:
    """An op called outside a compiled function with no tensor operand
    (`op.relu("x")`, `op.add(1.0, 2.0)`): there is nothing to compute on."""
    import inspect
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs).arguments
        given = ", ".join(f"{k}={v!r:.60}" for k, v in bound.items())
    except TypeError:
        given = ", ".join(f"{a!r:.60}" for a in args)
    return ArgumentError(f"op.{fn.__name__}: no operand is a tensor ({given}); outside a "
                         "compiled function an op computes on numpy arrays or DTensors (inside "
                         f"one, on traced tensors)  [{user_frame()}]")


def _eager(fn):
    import functools

    from ._pytree import flatten

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
            from .compiler import CompiledFunction
            compiled = _EAGER[fn.__name__, mesh] = CompiledFunction(fn, mesh, numpy_results=True)
            compiled.eager = True
        return compiled(*args, **kwargs)
    return call


for _name in __all__:
    if _name not in ("autodiff", "kernel") and callable(globals().get(_name)):
        globals()[_name] = _eager(globals()[_name])
flash_attention = attention
del _name
