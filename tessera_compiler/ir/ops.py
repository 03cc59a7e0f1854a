"""The elementwise op table: one entry per elementwise op of Graph IR and
Tile IR, with every fact the compiler needs about it:

    tracer          graph_builder builds `tgraph.<name>` (tessera.op wraps it)
    sharding rules  `linear`: which pending partial sums pass through the op
    autodiff        `vjp`: the vector-Jacobian product, in Graph IR
    tile lowering   `tgraph.<name>` becomes `ttile.<name>`
    emitters        `c`: the element's C/CUDA expression
    cost model      `cost`: its op class (`op_class`: transcendental or compute)
    tests           `numpy`: the float64 reference; `domain` of test inputs

Adding an elementwise op: its ODS definition in TGraph.td and TTile.td (with
the `Elementwise` trait) and one entry here; `test/python/test_op_table.py`
checks that every `Pure`, `Elementwise` op of the dialects has one and that
every consumer takes it from here (and computes it right, against numpy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tessera_mlir import ir

from . import graph_builder as gb


@dataclass(frozen=True)
class Elementwise:
    name: str                       # tgraph.<name> and ttile.<name>
    operands: int
    summary: str
    #: The element's C expression: c(emitter, op, ctype, *operand expressions).
    #: `emitter.math(fn, x)` is the C library's function, `emitter.fast(ctype,
    #: fn, x)` the emitter's fastest accurate one (CPU: vectorizable; GPU:
    #: the special-function unit).
    c: Callable[..., str]
    #: The float64 reference: numpy(*operands, op attributes).
    numpy: Callable
    #: Cotangents of the operands given the result's: vjp(operands, result,
    #: cotangent, op) (Graph IR, at the current insertion point); None where
    #: the op has no derivative (its operands get none).
    vjp: Callable | None
    #: How a pending partial sum over a mesh axis passes through the op:
    #: "same" (add, sub: when every operand has the same one), "unary" (neg),
    #: "one" (mul: linear in whichever one operand has it), "first" (div:
    #: x / c), "select" (the two values, not the condition), "" (none).
    linear: str = ""
    #: Whether Graph IR has the op (exp2 is Tile IR only: flash attention's
    #: base-2 softmax).
    graph: bool = True
    #: Inputs for numeric tests: "real", "positive" (log, sqrt, rsqrt),
    #: "nonzero" (div: a divisor near 0 puts a pole within finite
    #: differences' step, e.g. d/db = -8e5 at b ~ 1e-3).
    domain: str = "real"
    #: Its op class for the cost model (`op_class`): "transcendental" (a libm
    #: call or a polynomial per element: exp, log, division, ...) or "compute".
    cost: str = "compute"


def _select_vjp(x, out, g, op):
    zero = gb.zeros_like(g)
    return [None, gb.select(x[0], g, zero), gb.select(x[0], zero, g)]


def _max_vjp(x, out, g, op):
    take_lhs = gb.compare("ge", x[0], x[1])
    zero = gb.zeros_like(g)
    return [gb.select(take_lhs, g, zero), gb.select(take_lhs, zero, g)]


def _div_vjp(x, out, g, op):
    ga = gb.binary("div", g, x[1])
    return [ga, gb.unary("neg", gb.binary("mul", ga, out))]     # -g a / b^2 = -(g/b) (a/b)


def _tanh_vjp(x, out, g, op):
    one = gb.fill(gb.shape_of(out), gb.element_of(out), 1.0)
    return [gb.binary("mul", g, gb.binary("sub", one, gb.binary("mul", out, out)))]


#: GELU's tanh approximation: 0.5 x (1 + tanh(C (x + K x^3)))
GELU_C, GELU_K = 0.7978845608028654, 0.044715


def _gelu_c(em, op, ct, a):
    inner = f"({ct}){GELU_C!r} * ({a} + ({ct}){GELU_K!r} * {a} * {a} * {a})"
    return f"({ct})0.5 * {a} * (({ct})1 + {em.fast(ct, 'tanh', inner)})"


def _gelu_numpy(a, op):
    return 0.5 * a * (1 + np.tanh(GELU_C * (a + GELU_K * a ** 3)))


def _gelu_vjp(x, out, g, op):
    # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) C (1 + 3 K x^2), t = tanh(C (x + K x^3)):
    # from the input alone, so the backward keeps nothing else (it fuses into one kernel).
    x0 = x[0]

    def c(v):
        return gb.full_like(x0, v)

    def mul(a, b):
        return gb.binary("mul", a, b)
    x2 = mul(x0, x0)
    t = gb.unary("tanh", mul(c(GELU_C), gb.binary("add", x0, mul(c(GELU_K), mul(x2, x0)))))
    left = mul(c(0.5), gb.binary("add", c(1.0), t))
    slope = mul(c(GELU_C), gb.binary("add", c(1.0), mul(c(3 * GELU_K), x2)))
    right = mul(mul(mul(c(0.5), x0), gb.binary("sub", c(1.0), mul(t, t))), slope)
    return [mul(g, gb.binary("add", left, right))]


def _sqrt_vjp(x, out, g, op):
    half = gb.fill(gb.shape_of(out), gb.element_of(out), 0.5)
    return [gb.binary("div", gb.binary("mul", g, half), out)]


def _rsqrt_vjp(x, out, g, op):                                  # -x^(-3/2) / 2
    c = gb.fill(gb.shape_of(out), gb.element_of(out), -0.5)
    return [gb.binary("mul", gb.binary("mul", g, c),
                      gb.binary("mul", out, gb.binary("mul", out, out)))]


def _relu_vjp(x, out, g, op):
    positive = gb.compare("gt", x[0], gb.zeros_like(x[0]))
    return [gb.select(positive, g, gb.zeros_like(g))]


#: C comparison operators by #tgraph.compare case.
COMPARE_C = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
COMPARE_NUMPY = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
                 "gt": np.greater, "ge": np.greater_equal}


def _compare_c(em, op, ct, a, b):
    from .types import enum_of
    return f"({a} {COMPARE_C[enum_of(op)]} {b})"


def _compare_numpy(a, b, op):
    from .types import enum_of
    return COMPARE_NUMPY[enum_of(op)](a, b)


def _cast_vjp(x, out, g, op):
    """The cotangent of a cast's operand, in the operand's type; of an FP8
    operand (an MoE layer's packed rows, cast back to float) in bf16
    instead: an unscaled gradient would vanish in e4m3 (its smallest step is
    2^-9), so the backward of a packed exchange moves bf16, as DeepEP's does."""
    elt = gb.element_of(x[0])
    return [gb.cast(g, ir.BF16Type.get() if isinstance(elt, ir.Float8E4M3FNType) else elt)]


def _pow_vjp(x, out, g, op):
    # d/da a^b = b a^(b-1); d/db a^b = a^b log a (NaN for a < 0, as numpy's)
    one = gb.full_like(x[1], 1.0)
    ga = gb.binary("mul", g, gb.binary("mul", x[1], gb.binary("pow", x[0],
                                                              gb.binary("sub", x[1], one))))
    return [ga, gb.binary("mul", g, gb.binary("mul", out, gb.unary("log", x[0])))]


def _erf_numpy(a):
    # numpy has no erf; the standard library's, element by element (tests only)
    return np.vectorize(math.erf, otypes=[np.float64])(a)


#: 2 / sqrt(pi): erf's derivative is 2/sqrt(pi) e^(-x^2)
_TWO_OVER_SQRT_PI = 1.1283791670955126


def _erf_vjp(x, out, g, op):
    minus_square = gb.unary("neg", gb.binary("mul", x[0], x[0]))
    slope = gb.binary("mul", gb.full_like(x[0], _TWO_OVER_SQRT_PI), gb.unary("exp", minus_square))
    return [gb.binary("mul", g, slope)]


def _sign_c(em, op, ct, a) -> str:
    # NaN stays NaN (numpy's sign); -0.0 and 0.0 give 0
    return f"({a} != {a} ? {a} : ({ct})(({a} > 0) - ({a} < 0)))"


_TABLE = [
    Elementwise("add", 2, "a + b", lambda em, op, ct, a, b: f"{a} + {b}",
                lambda a, b, op: a + b, lambda x, out, g, op: [g, g], linear="same"),
    Elementwise("sub", 2, "a - b", lambda em, op, ct, a, b: f"{a} - {b}",
                lambda a, b, op: a - b, lambda x, out, g, op: [g, gb.unary("neg", g)],
                linear="same"),
    Elementwise("mul", 2, "a * b", lambda em, op, ct, a, b: f"{a} * {b}",
                lambda a, b, op: a * b,
                lambda x, out, g, op: [gb.binary("mul", g, x[1]), gb.binary("mul", g, x[0])],
                linear="one"),
    Elementwise("div", 2, "a / b", lambda em, op, ct, a, b: f"{a} / {b}",
                lambda a, b, op: a / b, _div_vjp, linear="first", domain="nonzero",
                cost="transcendental"),
    Elementwise("max", 2, "the larger of a and b",
                lambda em, op, ct, a, b: f"({a} > {b} || {a} != {a} ? {a} : {b})",  # NaN wins
                lambda a, b, op: np.maximum(a, b), _max_vjp),
    Elementwise("neg", 1, "-x", lambda em, op, ct, a: f"-{a}", lambda a, op: -a,
                lambda x, out, g, op: [gb.unary("neg", g)], linear="unary"),
    Elementwise("relu", 1, "max(x, 0)", lambda em, op, ct, a: f"({a} < 0 ? 0 : {a})",  # NaN stays
                lambda a, op: np.maximum(a, 0), _relu_vjp),
    Elementwise("exp", 1, "e^x", lambda em, op, ct, a: em.fast(ct, "exp", a),
                lambda a, op: np.exp(a), lambda x, out, g, op: [gb.binary("mul", g, out)],
                cost="transcendental"),
    Elementwise("exp2", 1, "2^x", lambda em, op, ct, a: em.fast(ct, "exp2", a),
                lambda a, op: np.exp2(a), None, graph=False, cost="transcendental"),
    Elementwise("log", 1, "natural logarithm", lambda em, op, ct, a: em.math("log", a),
                lambda a, op: np.log(a), lambda x, out, g, op: [gb.binary("div", g, x[0])],
                domain="positive", cost="transcendental"),
    Elementwise("tanh", 1, "hyperbolic tangent", lambda em, op, ct, a: em.fast(ct, "tanh", a),
                lambda a, op: np.tanh(a), _tanh_vjp, cost="transcendental"),
    Elementwise("gelu", 1, "GELU (tanh approximation)", _gelu_c, _gelu_numpy, _gelu_vjp,
                 cost="transcendental"),
    Elementwise("sqrt", 1, "square root", lambda em, op, ct, a: em.math("sqrt", a),
                lambda a, op: np.sqrt(a), _sqrt_vjp, domain="positive",
                cost="transcendental"),
    Elementwise("rsqrt", 1, "1 / sqrt(x)",
                lambda em, op, ct, a: f"({ct})1 / {em.math('sqrt', a)}",
                lambda a, op: 1 / np.sqrt(a), _rsqrt_vjp, domain="positive",
                cost="transcendental"),
    Elementwise("pow", 2, "a ** b, any real exponent (NaN for a < 0 and a non-integer b)",
                lambda em, op, ct, a, b: em.math("pow", f"{a}, {b}"),
                lambda a, b, op: np.power(a, b), _pow_vjp, domain="positive",
                cost="transcendental"),
    Elementwise("sin", 1, "sine", lambda em, op, ct, a: em.math("sin", a),
                lambda a, op: np.sin(a),
                lambda x, out, g, op: [gb.binary("mul", g, gb.unary("cos", x[0]))],
                cost="transcendental"),
    Elementwise("cos", 1, "cosine", lambda em, op, ct, a: em.math("cos", a),
                lambda a, op: np.cos(a),
                lambda x, out, g, op: [gb.unary("neg", gb.binary("mul", g,
                                                                 gb.unary("sin", x[0])))],
                cost="transcendental"),
    Elementwise("erf", 1, "the error function", lambda em, op, ct, a: em.math("erf", a),
                lambda a, op: _erf_numpy(a), _erf_vjp, cost="transcendental"),
    Elementwise("abs", 1, "|x|", lambda em, op, ct, a: em.math("fabs", a),
                lambda a, op: np.abs(a),
                lambda x, out, g, op: [gb.binary("mul", g, gb.unary("sign", x[0]))]),
    # sign, floor, ceil: piecewise constant, so no VJP (their operand gets
    # no gradient: zero almost everywhere, as PyTorch's and JAX's).
    Elementwise("sign", 1, "-1, 0 or 1 by the sign of x", _sign_c, lambda a, op: np.sign(a),
                None),
    Elementwise("floor", 1, "the largest integer not above x",
                lambda em, op, ct, a: em.math("floor", a), lambda a, op: np.floor(a), None),
    Elementwise("ceil", 1, "the smallest integer not below x",
                lambda em, op, ct, a: em.math("ceil", a), lambda a, op: np.ceil(a), None),
    Elementwise("compare", 2, "a <kind> b (an i1 tensor)", _compare_c, _compare_numpy,
                None),
    Elementwise("select", 3, "cond ? a : b", lambda em, op, ct, c, a, b: f"({c} ? {a} : {b})",
                lambda c, a, b, op: np.where(c, a, b), _select_vjp, linear="select"),
    # bf16 results compute in float (the emitter rounds them); i1 is "nonzero".
    Elementwise("cast", 1, "x converted to the result's element type",
                lambda em, op, ct, a: f"({a} != 0)" if ct == "bool" else f"({ct})({a})",
                lambda a, op: a, _cast_vjp),
]

#: Every elementwise op, by name.
ELEMENTWISE: dict[str, Elementwise] = {e.name: e for e in _TABLE}
#: Those of Graph IR, by op name (`tgraph.add`).
GRAPH_ELEMENTWISE: dict[str, Elementwise] = {f"tgraph.{e.name}": e for e in _TABLE if e.graph}

#: Graph IR ops a fused CPU/GPU kernel computes (tessera-lower-to-tile fuses
#: consecutive launches of these; tessera-hoist-selects moves selects next to them)
TILEABLE = frozenset(GRAPH_ELEMENTWISE) | {"tgraph.fill", "tgraph.iota", "tgraph.broadcast",
                                          "tgraph.reduce"}
#: All of them as Tile IR ops (`ttile.add`).
TILE_ELEMENTWISE: dict[str, Elementwise] = {f"ttile.{e.name}": e for e in _TABLE}


#: Tile IR ops that move data and compute nothing (the cost model counts
#: their bytes as the kernel's, not their elements as work).
TILE_MOVES = frozenset({"ttile.load", "ttile.store", "ttile.return", "ttile.program_id",
                        "ttile.barrier", "ttile.fill", "ttile.iota"})


def op_class(name: str) -> str:
    """The cost model's class of Tile IR op `name`: "move" (TILE_MOVES),
    "transcendental" (an elementwise op whose `cost` says so) or "compute"
    (every other: arithmetic, reductions, dots)."""
    if name in TILE_MOVES:
        return "move"
    e = TILE_ELEMENTWISE.get(name)
    return e.cost if e is not None else "compute"


def of(op: ir.Operation) -> Elementwise | None:
    """The table's entry for `op` (a tgraph or ttile op), or None."""
    return GRAPH_ELEMENTWISE.get(op.name) or TILE_ELEMENTWISE.get(op.name)


def sample_inputs(domain: str, shape, rng) -> np.ndarray:
    """Random float64 test inputs of `domain`: "real" (standard normal),
    "positive" (at least 0.5), "nonzero" (either sign, at least 0.5 from 0)."""
    x = rng.standard_normal(shape)
    if domain == "positive":
        return np.abs(x) + 0.5
    return x + 0.5 * np.sign(x) if domain == "nonzero" else x

