"""Random Tessera programs for differential testing: a hypothesis strategy,
a printer that writes a program as runnable Python, and its float64 numpy
reference.

A program is straight-line code over the op set (elementwise and
broadcasting, reductions with `dim=`/`axis=`/keepdim, reshape, transpose,
slicing, concat, split, matmul of ranks 1-4, softmax, layernorm,
attention along any sequence dimension, cross-entropy, casts to and from bf16, an input's round trip through FP8
e4m3, mixtures of experts) with small shapes, zero-size
dimensions included. Tessera runs exactly the text `Program.source()`
prints (it is exec'd from a file of its own), so a failure's repro is that
text. Hypothesis shrinks a failing program to a minimal one: fewer steps,
smaller shapes, earlier op kinds in `UNARY`/`STEPS`.

Tolerances (documented in docs/testing.md): results are compared with
|tessera - numpy| <= atol + rtol * |numpy| elementwise, where numpy runs in
float64 (rounding to bf16 where the program's values are bf16) and `atol`
scales with the largest magnitude any intermediate value reached, since
float32 rounding errors of intermediates (not of the result) are what
survive cancellation: float32 rtol 1e-4, atol 1e-5 x scale; a program
that touches bf16: rtol 3e-2, atol 3e-2 x scale. NaNs and infinities must
appear in the same places, with the same signs.
"""

from __future__ import annotations

import itertools
import linecache
import math
import re
import warnings
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from tessera_runtime import random as philox

MAX_ELEMENTS = 120          # per value: programs stay fast to compile and to check
# Shrinks toward 1; a zero-size dimension one time in 20.
DIM_SIZES = st.sampled_from([1, 2, 3, 4, 5, 2, 3, 4, 1, 2, 3, 4, 5, 2, 3, 4, 3, 4, 2, 0])


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple
    dtype: str              # "f32", "bf16" or "i32" (cross-entropy targets)
    bound: float            # |value| <= bound on inputs drawn from N(0, 1) clipped at 3
    ignore: int = -100      # cross-entropy targets: the ignore_index some rows have


@dataclass(frozen=True)
class Step:
    out: Value
    text: str               # the right-hand side, as Tessera source
    ref: object             # numpy float64 implementation: ref(env) -> array


@dataclass
class Program:
    inputs: list = field(default_factory=list)      # Values
    steps: list = field(default_factory=list)       # Steps
    results: list = field(default_factory=list)     # Values
    wrt: list = field(default_factory=list)         # inputs differentiated (a gradient program)
    specs: dict = field(default_factory=dict)       # argument -> (partition, mesh_axes, partial)
    #: (first step, end step, policy): those steps as a ts.remat region
    remat: tuple | None = None
    #: argument -> the dimension a sharded run splits first, when it splits
    #: one (attention's sequence: context parallelism)
    prefer: dict = field(default_factory=dict)
    #: `TargetOptions.context_parallel` a sharded run compiles with
    context_parallel: str = "auto"

    @property
    def elementwise_exact(self) -> bool:
        """No reduction, matmul, norm, attention or MoE anywhere and no
        partial argument: every result element is computed by the same float
        operations however the arguments are split, so a sharded run must
        give the replicated run's bits. (Attention's and MoE's dot products
        sum over a dimension a ShardSpec may split.)"""
        combining = ("op.sum", "op.mean", "op.max", "@", "op.matmul", "softmax", "norm(",
                     "cross_entropy", "op.attention", "op.moe")
        return not self.wrt and not any(spec[2:] and spec[2] for spec in self.specs.values()) \
            and not any(c in s.text for s in self.steps for c in combining)

    @property
    def uses_bf16(self) -> bool:
        return any(s.out.dtype == "bf16" for s in self.steps)

    # -- text ----------------------------------------------------------------
    def function_source(self) -> str:
        args = ", ".join(v.name for v in self.arguments())
        lines = [f"def program({args}):"]
        lines += [f"    {s.out.name} = {s.text}" for s in self.steps]
        if self.remat is not None:
            first, end, policy = self.remat
            before = [v.name for v in self.arguments()] + [s.out.name for s in self.steps[:first]]
            made = ", ".join(s.out.name for s in self.steps[first:end]) + ","
            lines[1 + first:1 + end] = (
                [f"    def region({', '.join(before)}):"]
                + [f"        {s.out.name} = {s.text}" for s in self.steps[first:end]]
                + [f"        return {made}",
                   f"    {made} = ts.remat(region, policy={policy!r})({', '.join(before)})"])
        if self.wrt:
            lines.append(f"    loss = op.sum(op.mul({self.results[0].name}, weight))")
            lines.append(f"    return ts.grad(loss, [{', '.join(v.name for v in self.wrt)}])")
        else:
            lines.append(f"    return {', '.join(v.name for v in self.results)}"
                         + ("," if len(self.results) == 1 else ""))
        return "\n".join(lines) + "\n"

    def source(self, seed: int = 0, mesh: str | None = None) -> str:
        """The program as a script that runs it (on `mesh`, a `dist.Mesh(...)`
        expression, with the inputs' ShardSpecs) and compares with numpy."""
        inputs = self.arguments()
        out = ["import numpy as np", "import tessera as ts", "from tessera import dist, op", ""]
        out.append(self.function_source())
        out.append(f"rng = np.random.default_rng({seed})")
        for v in inputs:
            out.append(f"{v.name} = {_input_text(v)}")
        names = [v.name for v in inputs]
        if mesh:
            out.append(f"mesh = {mesh}")
            names = [f"dist.from_numpy({v.name}, {spec_text(*self.specs[v.name])}, mesh)"
                     if v.name in self.specs else v.name for v in inputs]
        target = "" if self.context_parallel == "auto" else \
            f"target=ts.TargetOptions(context_parallel={self.context_parallel!r})"
        out.append(f"print(ts.jit(program{', ' + target if target else ''})({', '.join(names)}))")
        return "\n".join(out) + "\n"

    def arguments(self) -> list:
        """The function's arguments: the inputs, and a gradient program's weight."""
        return self.inputs + ([Value("weight", self.results[0].shape, "f32", 1.0)] if self.wrt else [])

    def function(self, filename: str):
        """The Tessera function, exec'd from the text `function_source` prints
        (registered with linecache, so that errors name its lines)."""
        import tessera as ts
        from tessera import dist, op
        text = self.function_source()
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        namespace = {"ts": ts, "op": op, "dist": dist, "np": np}
        exec(compile(text, filename, "exec"), namespace)
        return namespace["program"]

    # -- data and reference --------------------------------------------------
    def draw_inputs(self, seed: int) -> dict:
        rng = np.random.default_rng(seed)
        arrays = {}
        for v in self.arguments():
            arrays[v.name] = _draw(rng, v)
        return arrays

    def reference(self, arrays: dict) -> tuple[list, float]:
        """The results in float64 (values rounded to bf16 where the program's
        are), and the largest magnitude of any finite intermediate (the
        tolerance's scale)."""
        env = {name: np.asarray(a, np.float64) if a.dtype.kind == "f" or a.dtype == ml_dtypes.bfloat16
               else a for name, a in arrays.items()}
        scale = max([1.0] + [finite_max(a) for a in env.values()])
        for s in self.steps:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)   # numpy's mean of nothing
                value = np.asarray(s.ref(env), np.float64 if s.out.dtype != "i32" else np.int64)
            if s.out.dtype == "bf16":
                value = value.astype(ml_dtypes.bfloat16).astype(np.float64)
            env[s.out.name] = value
            scale = max(scale, finite_max(value))
        return [env[v.name] for v in self.results], scale

    def loss(self, arrays: dict) -> float:
        """A gradient program's loss, sum(result * weight), in float64."""
        results, _ = self.reference(arrays)
        return float(np.sum(results[0] * arrays["weight"]))


def live_values(p: Program) -> set:
    """The names of the inputs and steps the results depend on. The compiler
    drops the other steps, and with them the value checks they hold (a
    cross-entropy's check of its targets)."""
    live = {v.name for v in p.results}
    for s in reversed(p.steps):
        if s.out.name in live:
            live |= set(re.findall(r"\b[xv]\d+\b", s.text))
    return live


def spec_text(partition, mesh_axes, partial=()) -> str:
    args = [f"partition={tuple(partition)}", f"mesh_axes={tuple(mesh_axes)}"] if partition else []
    return f"dist.ShardSpec({', '.join(args + ([f'partial={tuple(partial)}'] if partial else []))})"


def finite_max(a) -> float:
    a = np.asarray(a, np.float64)
    finite = a[np.isfinite(a)]
    return float(np.abs(finite).max()) if finite.size else 0.0


def _draw(rng, v: Value) -> np.ndarray:
    if v.dtype == "i32" and v.bound < 0:     # embedding ids in [0, V)
        return rng.integers(0, int(-v.bound), size=v.shape).astype(np.int32)
    if v.dtype == "i32":     # targets: classes in [0, V), sometimes ignore_index
        classes = v.bound
        t = rng.integers(0, int(classes), size=v.shape) if classes else np.zeros(v.shape, np.int64)
        return np.where(rng.random(v.shape) < 0.2, v.ignore, t).astype(np.int32)
    x = np.clip(rng.standard_normal(v.shape), -3, 3).astype(np.float32)
    return x.astype(ml_dtypes.bfloat16) if v.dtype == "bf16" else x


def _input_text(v: Value) -> str:
    if v.dtype == "i32":
        return f"rng.integers(0, {abs(int(v.bound))}, size={v.shape}).astype(np.int32)"
    text = f"np.clip(rng.standard_normal({v.shape}), -3, 3).astype(np.float32)"
    return f"{text}.astype(ts.bf16)" if v.dtype == "bf16" else text


def compare(got, ref: np.ndarray, scale: float, bf16: bool) -> str | None:
    """None when `got` matches the float64 reference, else what differs."""
    got = np.asarray(got)
    if got.shape != ref.shape:
        return f"shape {list(got.shape)}, numpy {list(ref.shape)}"
    g = got.astype(np.float64)
    for what, mask in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        if not np.array_equal(mask(g), mask(ref)):
            return f"{what} at different places: tessera {g.ravel()[:8]}, numpy {ref.ravel()[:8]}"
    rtol, atol = (3e-2, 3e-2 * scale) if bf16 else (1e-4, 1e-5 * scale)
    finite = np.isfinite(ref)
    err = np.abs(g - ref)[finite]
    bad = err > atol + rtol * np.abs(ref[finite])
    if bad.any():
        return (f"max |diff| {err.max():.3g} (atol {atol:.3g}, rtol {rtol:g}); "
                f"tessera {g[finite][bad][:4]}, numpy {ref[finite][bad][:4]}")
    return None


# ----------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------

def _size(shape) -> int:
    return int(np.prod(shape)) if shape else 1


class _Builder:
    """The program under construction: values so far, and fresh names."""

    def __init__(self, draw, allow_bf16: bool, allow_int: bool):
        self.draw, self.allow_bf16, self.allow_int = draw, allow_bf16, allow_int
        self.program = Program()
        self.counter = itertools.count()
        self.values: list[Value] = []

    def new_input(self, shape, dtype="f32", bound=3.0, ignore=-100) -> Value:
        v = Value(f"x{len(self.program.inputs)}", tuple(shape), dtype, bound, ignore)
        self.program.inputs.append(v)
        if dtype != "i32":
            self.values.append(v)
        return v

    def step(self, text, ref, shape, dtype, bound) -> Value:
        v = Value(f"v{next(self.counter)}", tuple(shape), dtype, float(bound))
        self.program.steps.append(Step(v, text, ref))
        self.values.append(v)
        return v

    def shape(self, min_dims=0, max_dims=4) -> tuple:
        ndim = self.draw(st.integers(min_dims, max_dims))
        dims = []
        for _ in range(ndim):
            dims.append(self.draw(DIM_SIZES))
            if _size(dims) > MAX_ELEMENTS:
                dims[-1] = 1
        return tuple(dims)

    def pick(self, ok=lambda v: True, optional: bool = False) -> Value | None:
        """A value `ok` accepts: the latest such, half the time (programs are
        chains more than fans), else any (shrinking toward the latest). When
        there is none: None if `optional`, else the step is skipped."""
        choices = [v for v in self.values if ok(v)][::-1]
        if not choices:
            if optional:
                return None
            raise _Skip
        return choices[0] if self.draw(st.booleans()) else self.draw(st.sampled_from(choices))

    def need(self, allowed: bool) -> None:
        """Skips the step unless `allowed` (a kind of value this program may not hold)."""
        if not allowed:
            raise _Skip


class _Skip(Exception):
    """The step has no operand it can take in this program: it adds nothing."""


def _float(v: Value) -> bool:
    return v.dtype in ("f32", "bf16")


# Unary ops: (name, tessera text, numpy, new bound from old, largest operand bound).
def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _gelu(x):   # tanh approximation, as op.gelu
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


UNARY = [
    ("neg", "op.neg({x})", lambda x: -x, lambda b: b, math.inf),
    ("relu", "op.relu({x})", lambda x: np.maximum(x, 0), lambda b: b, math.inf),
    ("tanh", "op.tanh({x})", np.tanh, lambda b: 1.0, math.inf),
    ("sigmoid", "op.sigmoid({x})", _sigmoid, lambda b: 1.0, math.inf),
    ("exp", "op.exp({x})", np.exp, math.exp, 8.0),
    ("square", "op.square({x})", np.square, lambda b: b * b, 1e4),
    ("silu", "op.silu({x})", lambda x: x * _sigmoid(x), lambda b: b, math.inf),
    ("gelu", "op.gelu({x})", _gelu, lambda b: b, math.inf),
    ("log", "op.log(op.add(op.square({x}), 1.0))", lambda x: np.log(x * x + 1),
     lambda b: math.log(b * b + 1), 1e4),
    ("sqrt", "op.sqrt(op.add(op.square({x}), 1.0))", lambda x: np.sqrt(x * x + 1),
     lambda b: math.sqrt(b * b + 1), 1e4),
    ("rsqrt", "op.rsqrt(op.add(op.square({x}), 1.0))", lambda x: 1 / np.sqrt(x * x + 1),
     lambda b: 1.0, 1e4),
    ("scale", "op.mul({x}, 0.5)", lambda x: x * 0.5, lambda b: b * 0.5, math.inf),
    ("sin", "op.sin({x})", np.sin, lambda b: 1.0, 10.0),
    ("cos", "op.cos({x})", np.cos, lambda b: 1.0, 10.0),
    ("erf", "op.erf({x})", lambda x: np.vectorize(math.erf, otypes=[np.float64])(x),
     lambda b: 1.0, math.inf),
    ("abs", "abs({x})", np.abs, lambda b: b, math.inf),
    ("gelu_exact", "op.gelu({x}, approximate='none')",
     lambda x: 0.5 * x * (1 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2))),
     lambda b: b, math.inf),
]

BINARY = [
    ("add", "op.add({a}, {b})", np.add, lambda p, q: p + q),
    ("sub", "{a} - {b}", np.subtract, lambda p, q: p + q),
    ("mul", "{a} * {b}", np.multiply, lambda p, q: p * q),
    ("div", "op.div({a}, op.add(op.square({b}), 1.0))", lambda a, b: a / (b * b + 1),
     lambda p, q: p),
    ("maximum", "op.maximum({a}, {b})", np.maximum, max),
    ("minimum", "op.minimum({a}, {b})", np.minimum, max),
]


def _unary(b: _Builder):
    x = b.pick(_float)
    name, text, ref, bound, limit = b.draw(st.sampled_from([u for u in UNARY if x.bound <= u[4]]))
    b.step(text.format(x=x.name), lambda env, n=x.name, f=ref: f(env[n]), x.shape, x.dtype,
           bound(x.bound))


def _broadcast_partner(b: _Builder, shape) -> tuple:
    """A shape broadcasting with `shape`: some dims made 1, some leading ones dropped."""
    dims = [1 if b.draw(st.booleans()) else n for n in shape]
    drop = b.draw(st.integers(0, len(dims)))
    return tuple(dims[drop:])


def _binary(b: _Builder):
    a = b.pick(_float)
    name, text, ref, bound = b.draw(st.sampled_from(BINARY))
    how = b.draw(st.sampled_from(["value", "scalar", "broadcast", "same"]))
    if how == "scalar":
        c = b.draw(st.sampled_from([2.0, -0.5, 1.5]))
        if name == "div":     # a Python number, not op.square of one (an f32 tensor)
            text, ref, c = "op.div({a}, {b})", np.divide, c * c + 1
        other = Value(repr(c), (), a.dtype, abs(c))
        value_of = (lambda env, c=c: c)
    else:
        other = b.pick(lambda v: v.dtype == a.dtype and v.shape == a.shape and v is not a,
                       optional=True) if how == "value" else None
        if other is None:
            other = b.new_input(a.shape if how == "same" else _broadcast_partner(b, a.shape),
                                a.dtype)
        value_of = (lambda env, n=other.name: env[n])
    lhs, rhs = (lambda env, n=a.name: env[n]), value_of
    left, right = a, other
    if how != "scalar" and b.draw(st.booleans()):       # either operand order
        lhs, rhs, left, right = rhs, lhs, right, left
    b.step(text.format(a=left.name, b=right.name), lambda env, f=ref, p=lhs, q=rhs: f(p(env), q(env)),
           np.broadcast_shapes(a.shape, other.shape), a.dtype, bound(left.bound, right.bound))


def _reduction(b: _Builder):
    x = b.pick(lambda v: _float(v) and v.shape != ())
    kind = b.draw(st.sampled_from(["sum", "mean", "max"]))
    dims = tuple(sorted(b.draw(st.sets(st.integers(0, len(x.shape) - 1), min_size=1,
                                       max_size=len(x.shape)))))
    keep = b.draw(st.booleans())
    spelled = b.draw(st.sampled_from(["dim", "axis", "all"]))
    if spelled == "all":
        dims, arg = tuple(range(len(x.shape))), ""
    else:
        d = dims[0] - len(x.shape) if b.draw(st.booleans()) and len(dims) == 1 else dims[0]
        arg = f", {spelled}={d if len(dims) == 1 else dims}"
    if keep:
        arg += ", keepdim=True"
    if kind == "max" and any(x.shape[d] == 0 for d in dims):
        kind = "sum"                   # numpy and Tessera refuse it (a regression test checks)
    numpy = {"sum": np.sum, "mean": np.mean, "max": np.max}[kind]
    shape = tuple(1 if i in dims else n for i, n in enumerate(x.shape) if keep or i not in dims)
    n = _size([x.shape[d] for d in dims])
    bound = x.bound * (n if kind == "sum" else 1)
    b.step(f"op.{kind}({x.name}{arg})",
           lambda env, nm=x.name, f=numpy, d=dims, k=keep: f(env[nm], axis=d, keepdims=k),
           shape, x.dtype, bound)


def _reshape(b: _Builder):
    x = b.pick(_float)
    shape = list(x.shape)
    how = b.draw(st.sampled_from(["flatten", "merge", "split", "unsqueeze"]))
    if how == "flatten" or (how == "merge" and len(shape) < 2):
        new = [_size(shape)]
    elif how == "merge":
        i = b.draw(st.integers(0, len(shape) - 2))
        new = shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2:]
    elif how == "split" and any(n in (4, 6) for n in shape):
        i = next(i for i, n in enumerate(shape) if n in (4, 6))
        new = shape[:i] + [2, shape[i] // 2] + shape[i + 1:]
    else:
        i = b.draw(st.integers(0, len(shape)))
        new = shape[:i] + [1] + shape[i:]
    spelled = list(new)
    if _size(new) and b.draw(st.booleans()) and new:
        spelled[b.draw(st.integers(0, len(new) - 1))] = -1
    args = ", ".join(map(str, spelled))
    b.step(f"op.reshape({x.name}{', ' if args else ''}{args})",
           lambda env, n=x.name, s=tuple(new): env[n].reshape(s), new, x.dtype, x.bound)


def _transpose(b: _Builder):
    x = b.pick(lambda v: _float(v) and len(v.shape) >= 2)
    perm = tuple(b.draw(st.permutations(range(len(x.shape)))))
    b.step(f"op.transpose({x.name}, {perm})", lambda env, n=x.name, p=perm: env[n].transpose(p),
           tuple(x.shape[p] for p in perm), x.dtype, x.bound)


def _slice(b: _Builder):
    x = b.pick(lambda v: _float(v) and v.shape and v.shape[0] >= 1)
    n = x.shape[0]
    if b.draw(st.booleans()):
        i = b.draw(st.integers(0, n - 1))
        b.step(f"{x.name}[{i}]", lambda env, nm=x.name, i=i: env[nm][i], x.shape[1:], x.dtype, x.bound)
        return
    lo = b.draw(st.integers(0, n))
    hi = b.draw(st.integers(lo, n))
    b.step(f"{x.name}[{lo}:{hi}]", lambda env, nm=x.name, lo=lo, hi=hi: env[nm][lo:hi],
           (hi - lo,) + x.shape[1:], x.dtype, x.bound)


def _concat(b: _Builder):
    x = b.pick(lambda v: _float(v) and v.shape)
    d = b.draw(st.integers(0, len(x.shape) - 1))
    other_shape = list(x.shape)
    other_shape[d] = b.draw(st.integers(0, 3))
    y = b.new_input(other_shape, x.dtype)
    spelled = b.draw(st.sampled_from(["axis", "dim"]))
    out = list(x.shape)
    out[d] += other_shape[d]
    b.step(f"op.concat([{x.name}, {y.name}], {spelled}={d})",
           lambda env, p=x.name, q=y.name, d=d: np.concatenate([env[p], env[q]], axis=d),
           out, x.dtype, max(x.bound, y.bound))


def _split(b: _Builder):
    x = b.pick(lambda v: _float(v) and any(n % 2 == 0 and n for n in v.shape))
    d = b.draw(st.sampled_from([i for i, n in enumerate(x.shape) if n % 2 == 0 and n]))
    part = b.draw(st.integers(0, 1))
    shape = list(x.shape)
    shape[d] //= 2
    b.step(f"op.split({x.name}, 2, dim={d})[{part}]",
           lambda env, n=x.name, d=d, p=part: np.split(env[n], 2, axis=d)[p],
           shape, x.dtype, x.bound)


def _matmul(b: _Builder):
    a = b.pick(lambda v: _float(v) and 1 <= len(v.shape) <= 4)
    k = a.shape[-1]
    if len(a.shape) == 1:
        rank = b.draw(st.integers(1, 3))
    else:
        rank = b.draw(st.sampled_from([1, 2, len(a.shape)]))
    n = b.draw(st.integers(1, 4))
    if rank == 1:
        shape = (k,)
    elif rank == 2 or len(a.shape) == 1:
        shape = (*((b.draw(st.integers(1, 3)),) * (rank - 2)), k, n)
    else:
        shape = (*a.shape[:-2], k, n)
    if _size(shape) > MAX_ELEMENTS:
        shape = (k,)
    w = b.new_input(shape, a.dtype)
    out = np.matmul(np.zeros(a.shape), np.zeros(shape)).shape
    left = b.draw(st.booleans()) and len(a.shape) == 1 == len(shape)
    text = f"{a.name} @ {w.name}" if b.draw(st.booleans()) else f"op.matmul({a.name}, {w.name})"
    if left:
        text = f"op.matmul({w.name}, {a.name})"
    b.step(text, lambda env, p=a.name, q=w.name: np.matmul(env[p], env[q]), out, a.dtype,
           a.bound * w.bound * max(k, 1))


def _log_softmax(v, axis=-1):
    shifted = v - (v.max(axis=axis, keepdims=True) if v.size else 0)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _normalize(b: _Builder):
    x = b.pick(lambda v: _float(v) and v.shape)
    kind = b.draw(st.sampled_from(["softmax", "log_softmax", "layernorm", "rmsnorm"]))
    last = x.shape[-1]
    if kind in ("softmax", "log_softmax"):
        d = b.draw(st.integers(-len(x.shape), len(x.shape) - 1))
        spelled = b.draw(st.sampled_from(["dim", "axis"]))

        def ref(env, n=x.name, d=d, log=kind == "log_softmax"):
            v = _log_softmax(env[n], d)
            return v if log else np.exp(v)
        b.step(f"op.{kind}({x.name}, {spelled}={d})", ref, x.shape, "f32",
               1.0 if kind == "softmax" else 2 * x.bound + math.log(max(last, 1)) + 1)
        return
    affine = b.draw(st.booleans())
    w = b.new_input((last,), x.dtype) if affine else None
    bias = b.new_input((last,), x.dtype) if affine and kind == "layernorm" else None
    eps = 1e-5 if kind == "layernorm" else 1e-6

    def norm(env, n=x.name, kind=kind, w=w and w.name, bias=bias and bias.name, eps=eps):
        v = env[n]
        if kind == "layernorm":
            c = v - v.mean(axis=-1, keepdims=True)
            y = c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)
        else:
            y = v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + eps)
        y = y * env[w] if w else y
        return y + env[bias] if bias else y
    args = "".join(f", {p.name}" for p in (w, bias) if p is not None)
    b.step(f"op.{kind}({x.name}{args})", norm, x.shape, "f32",
           math.sqrt(max(last, 1)) * 3 * 3 + 3)


def attention_reference(q, k, v, seq_dim: int, causal: bool, window=None,
                        mask=None, softcap=None, dropout=None, segments=None) -> np.ndarray:
    """softmax(q k^T / sqrt(D) [masks]) v with the sequence along `seq_dim`;
    k and v may have fewer heads (leading dimensions dividing q's) and
    another length (queries are the last positions); `mask` is boolean
    [lead..., Sq | 1, Sk]; `dropout` = (p, key) drops the probabilities by
    op.dropout's mask of [lead..., Sq, Sk]; `segments` document ids
    [prefix of lead..., S] (a query sees keys of its own document). A row
    with no key gives 0."""
    q, k, v = (np.moveaxis(np.asarray(t, np.float64), seq_dim, -2) for t in (q, k, v))
    for axis in range(q.ndim - 2):
        k, v = (np.repeat(t, q.shape[axis] // k.shape[axis], axis) for t in (k, v))
    s = np.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    sq, sk = s.shape[-2:]
    pos, keys = np.arange(sq)[:, None] + sk - sq, np.arange(sk)[None, :]
    allowed = np.ones((sq, sk), bool)
    if causal:
        allowed &= keys <= pos
    if window is not None:
        allowed &= pos - keys < window
    if mask is not None:
        allowed = allowed & mask
    if segments is not None:
        ids = np.asarray(segments)
        ids = ids.reshape(ids.shape[:-1] + (1,) * (q.ndim - 1 - ids.ndim) + ids.shape[-1:])
        allowed = allowed & (ids[..., :, None] == ids[..., None, :])
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isneginf(m), 0, m))
    total = p.sum(-1, keepdims=True)
    p = p / np.where(total == 0, 1, total)
    if dropout is not None:
        rate, key = dropout
        p = p * philox.dropout_keep(key, rate, p.shape) * float(np.float32(1 / (1 - rate)))
    return np.moveaxis(p @ v, -2, seq_dim)


def _attention(b: _Builder):
    """Grouped key/value heads (leading dimensions dividing q's), another
    key length, a sliding window, a soft cap, a boolean mask and packed
    documents (segment ids, where q and k have one length), each at times.
    A sharded run splits q's and k's sequence first where it splits them
    (context parallelism: all-to-all or ring attention)."""
    q = b.pick(lambda v: v.dtype == "f32" and len(v.shape) >= 2 and 0 not in v.shape)
    rank = len(q.shape)
    seq_dim = b.draw(st.integers(0, rank - 2))
    spelled = seq_dim - rank if b.draw(st.booleans()) else seq_dim      # -2, -3, ... too
    causal = b.draw(st.booleans())
    kv_shape = list(q.shape)
    for d in range(rank - 1):
        if d != seq_dim:
            kv_shape[d] = b.draw(st.sampled_from([n for n in range(1, q.shape[d] + 1)
                                                  if q.shape[d] % n == 0]))
    kv_shape[seq_dim] = b.draw(st.sampled_from([q.shape[seq_dim], b.draw(DIM_SIZES) or 1]))
    k = b.new_input(tuple(kv_shape))
    v = b.new_input(tuple(kv_shape[:-1]) + (b.draw(st.integers(1, 4)),))
    window = b.draw(st.integers(1, 4)) if causal and b.draw(st.booleans()) else None
    softcap = b.draw(st.sampled_from([None, None, 1.0, 4.0]))
    extra, mask_name = "", None
    if window is not None:
        extra += f", window={window}"
    if softcap is not None:
        extra += f", softcap={softcap}"
    if b.draw(st.booleans()):
        lead = [n for d, n in enumerate(q.shape[:-1]) if d != seq_dim]
        rows = b.draw(st.sampled_from([1, q.shape[seq_dim]]))
        m = b.new_input(tuple(n if b.draw(st.booleans()) else 1 for n in lead) +
                        (rows, kv_shape[seq_dim]))
        mask_name = m.name
        extra += f", mask={m.name} > 0"
    dropout = None
    if b.draw(st.integers(0, 3)) == 0:
        dropout = (b.draw(st.sampled_from([0.25, 0.5])), (b.draw(st.integers(0, 2**40)), 1))
        extra += f", dropout_p={dropout[0]}, dropout_key={dropout[1]}"
    segments = None
    if kv_shape[seq_dim] == q.shape[seq_dim] and b.draw(st.booleans()):
        segments = b.new_input((q.shape[seq_dim],), "i32", bound=-3)     # 3 documents
        extra += f", segment_ids={segments.name}"
    for x in (q, k, v):
        b.program.prefer.setdefault(x.name, seq_dim)
    out_shape = q.shape[:-1] + (v.shape[-1],)
    b.step(f"op.attention({q.name}, {k.name}, {v.name}, causal={causal}, seq_dim={spelled}"
           f"{extra})",
           lambda env, n=(q.name, k.name, v.name), mk=mask_name, sg=segments: attention_reference(
               *(env[x] for x in n), seq_dim, causal, window,
               None if mk is None else env[mk] > 0, softcap, dropout,
               None if sg is None else env[sg.name]), out_shape, "f32",
           v.bound * (2 if dropout else 1))


def _attention_of_one_tensor(b: _Builder):
    """q, k and v as slices of one tensor at indices of one dimension (a
    fused projection's `qkv[:, :, :, i]`): tessera-fold-slices has the
    attention kernels read them in place, and their gradients' concat
    written in place, instead of copying them out and back."""
    def ok(v):
        return v.dtype == "f32" and len(v.shape) >= 3 and 0 not in v.shape \
            and any(n >= 2 for n in v.shape[:-1])
    x = b.pick(ok, optional=True)
    if x is None or b.draw(st.booleans()):
        # (4 or 5 dimensions: q, k and v keep a head dimension after the
        # sequence's, which the kernels read strided: what the fold needs)
        shape = b.shape(min_dims=4, max_dims=5)
        if 0 in shape or not any(n >= 2 for n in shape[:-1]):
            raise _Skip
        x = b.new_input(shape)
    d = b.draw(st.sampled_from([i for i, n in enumerate(x.shape[:-1]) if n >= 2]))
    picks = [b.draw(st.integers(0, x.shape[d] - 1)) for _ in range(3)]
    rank = len(x.shape) - 1
    seq_dim = b.draw(st.integers(0, rank - 2))
    causal = b.draw(st.booleans())
    q, k, v = (f"{x.name}[{', '.join([':'] * d + [str(i)])}]" for i in picks)
    b.step(f"op.attention({q}, {k}, {v}, causal={causal}, seq_dim={seq_dim})",
           lambda env, n=x.name, d=d, i=picks, s=seq_dim, c=causal: attention_reference(
               *(np.take(env[n], j, axis=d) for j in i), s, c),
           x.shape[:d] + x.shape[d + 1:], "f32", x.bound)


def _cross_entropy(b: _Builder):
    """Targets in [0, V), some of them ignore_index: -100, or a class (its
    rows are left out too). Targets outside both fail the step
    (test_fuzz_programs' out-of-range test): never drawn here."""
    b.need(b.allow_int)
    x = b.pick(lambda v: _float(v) and len(v.shape) == 2 and v.shape[1] >= 1)
    n, classes = x.shape
    ignore = b.draw(st.sampled_from([-100, 0, classes - 1]))
    t = b.new_input((n,), "i32", bound=classes, ignore=ignore)

    def ref(env, lg=x.name, t=t.name, ignore=ignore):
        v, tg = env[lg], env[t]
        valid = (tg >= 0) & (tg < v.shape[1]) & (tg != ignore)
        if not v.size:
            return np.float64(0.0)
        shifted = v - v.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        nll = -logp[np.arange(len(tg)), np.where(valid, tg, 0)] * valid
        return nll.sum() / max(valid.sum(), 1)
    keyword = "" if ignore == -100 else f", ignore_index={ignore}"
    b.step(f"ts.nn.cross_entropy({x.name}, {t.name}{keyword})", ref, (), "f32",
           2 * x.bound + math.log(classes) + 1)


def _cast(b: _Builder):
    b.need(b.allow_bf16)
    x = b.pick(_float)
    to = "f32" if x.dtype == "bf16" else "bf16"
    b.step(f"op.cast({x.name}, ts.{'float32' if to == 'f32' else 'bf16'})",
           lambda env, n=x.name: env[n], x.shape, to, x.bound)


def _fp8_round(b: _Builder):
    """A fresh float32 input cast to FP8 e4m3 and back (what op.moe's FP8
    packing does to what it sends): exact against ml_dtypes' rounding, since
    the input is the same float32 on both sides. (Not in gradient programs:
    finite differences of a rounding are zero or a jump, its derivative the
    identity, straight through.)"""
    b.need(b.allow_bf16)
    x = b.new_input(b.shape(), "f32")
    b.step(f"op.cast(op.cast({x.name}, 'fp8_e4m3'), ts.float32)",
           lambda env, n=x.name: env[n].astype(ml_dtypes.float8_e4m3fn).astype(np.float64),
           x.shape, "f32", x.bound * 1.0625)


def _select(b: _Builder):
    """where(a > b, a, b) (or <, >=, <=, ==, != and either order of the branches)."""
    a = b.pick(_float)
    other = b.pick(lambda v: v.dtype == a.dtype and v.shape == a.shape and v is not a,
                   optional=True) or b.new_input(_broadcast_partner(b, a.shape), a.dtype)
    name, numpy = b.draw(st.sampled_from([("greater", np.greater), ("less", np.less),
                                          ("greater_equal", np.greater_equal),
                                          ("less_equal", np.less_equal), ("equal", np.equal),
                                          ("not_equal", np.not_equal)]))
    swap = b.draw(st.booleans())
    first, second = (other, a) if swap else (a, other)
    b.step(f"op.where(op.{name}({a.name}, {other.name}), {first.name}, {second.name})",
           lambda env, p=a.name, q=other.name, f=numpy, s=swap:
           np.where(f(env[p], env[q]), *((env[q], env[p]) if s else (env[p], env[q]))),
           np.broadcast_shapes(a.shape, other.shape), a.dtype, max(a.bound, other.bound))


def _power(b: _Builder):
    x = b.pick(lambda v: _float(v) and v.bound <= 30)
    p = b.draw(st.sampled_from([2, 3, 0, 1, 0.5, -0.5, 1.5, -1.0, 2.7, -2.5]))
    if p in (0.5, -0.5, 1.5, -1.0, 2.7, -2.5):          # of a positive value
        text, ref = (f"op.pow(op.add(op.square({x.name}), 1.0), {p})",
                     lambda env, n=x.name, p=p: (env[n] ** 2 + 1) ** p)
        bound = max((x.bound ** 2 + 1) ** p, 1.0)
    else:
        text, ref = f"op.pow({x.name}, {p})", (lambda env, n=x.name, p=p: env[n] ** p)
        bound = max(x.bound ** p, 1.0)
    b.step(text, ref, x.shape, x.dtype, bound)


def _cumsum(b: _Builder):
    x = b.pick(lambda v: _float(v) and v.shape != ())
    d = b.draw(st.integers(-len(x.shape), len(x.shape) - 1))
    b.step(f"op.cumsum({x.name}, {d})", lambda env, n=x.name, d=d: np.cumsum(env[n], axis=d),
           x.shape, x.dtype, x.bound * max(x.shape[d], 1))


def _dynamic_slices(b: _Builder):
    """A block read (op.dynamic_slice) or written (op.dynamic_update_slice)
    along one dimension at a start that is an input of the program."""
    b.need(b.allow_int)
    x = b.pick(lambda v: v.dtype == "f32" and v.shape != () and 0 not in v.shape)
    d = b.draw(st.integers(0, len(x.shape) - 1))
    size = b.draw(st.integers(0, x.shape[d]))
    start = b.new_input((), "i32", bound=-(x.shape[d] - size + 1))
    block = x.shape[:d] + (size,) + x.shape[d + 1:]

    def box(s):
        return (slice(None),) * d + (slice(int(s), int(s) + size),)
    if b.draw(st.booleans()):
        b.step(f"op.dynamic_slice({x.name}, {start.name}, {size}, dim={d})",
               lambda env, n=x.name, t=start.name: env[n][box(env[t])], block, "f32", x.bound)
        return
    u = b.new_input(block)

    def written(env, n=x.name, t=start.name, u=u.name):
        y = np.array(env[n], copy=True)
        y[box(env[t])] = env[u]
        return y
    b.step(f"op.dynamic_update_slice({x.name}, {u.name}, {start.name}, dim={d})", written,
           x.shape, "f32", max(x.bound, u.bound))


def _dropout(b: _Builder):
    """op.dropout at a drawn rate and key: the reference applies the mask of
    tessera_runtime.random (checked against Random123's answers), which a
    split tensor must reproduce on any mesh."""
    x = b.pick(lambda v: v.dtype == "f32")
    p = b.draw(st.sampled_from([0.0, 0.25, 0.5, 0.9]))
    seed, step = b.draw(st.integers(0, 2**40)), b.draw(st.integers(0, 3))

    def dropped(env, n=x.name):
        keep = philox.dropout_keep((seed, step), p, np.shape(env[n]))
        return np.where(keep, env[n] * float(np.float32(1 / (1 - p))), 0.0)
    b.step(f"op.dropout({x.name}, {p}, ({seed}, {step}))", dropped, x.shape, "f32",
           x.bound / (1 - p))


def _rounding(b: _Builder):
    """floor, ceil or sign of an input: piecewise constant, so only of values
    both sides hold exactly (an input; an intermediate rounded differently
    in float32 than in the float64 reference could step across an integer)."""
    x = b.pick(lambda v: v.name.startswith("x") and v.dtype == "f32")
    name = b.draw(st.sampled_from(["floor", "ceil", "sign"]))
    b.step(f"op.{name}({x.name})", lambda env, n=x.name, f=getattr(np, name): f(env[n]),
           x.shape, x.dtype, x.bound + 1)


def _embedding(b: _Builder):
    b.need(b.allow_int)
    table = b.pick(lambda v: _float(v) and len(v.shape) == 2 and v.shape[0] >= 1)
    ids = b.new_input(b.shape(min_dims=1, max_dims=2), "i32", bound=-table.shape[0])
    b.step(f"op.embedding({ids.name}, {table.name})",
           lambda env, i=ids.name, t=table.name: env[t][env[i]],
           ids.shape + table.shape[1:], table.dtype, table.bound)


def moe_reference(x, ex, k, capacity_factor=None):
    """(y, aux) of the MoE layer in float64, written from its definition."""
    x = np.asarray(x, np.float64)
    lead, D = x.shape[:-1], x.shape[-1]
    t = x.reshape(-1, D)
    T = t.shape[0]
    w = {n: np.asarray(v, np.float64) for n, v in ex.items()}
    E = w["router"].shape[1]
    logits = t @ w["router"]
    chosen = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    gates = np.exp(_log_softmax(np.take_along_axis(logits, chosen, 1)))
    cap = math.inf if capacity_factor is None else math.ceil(T * k * capacity_factor / E)
    used, kept = np.zeros(E, int), np.zeros((T, k), bool)
    for j in range(k):                       # first choices first, each in token order
        for i in range(T):
            e = chosen[i, j]
            if used[e] < cap:
                used[e] += 1
                kept[i, j] = True
    y = np.zeros_like(t)
    for i in range(T):
        for j in range(k):
            if kept[i, j]:
                e = chosen[i, j]
                h = t[i] @ w["w1"][e]
                a = h * _sigmoid(h) * (t[i] @ w["w3"][e]) if "w3" in w else _gelu(h)
                y[i] += gates[i, j] * (a @ w["w2"][e])
    share = np.bincount(chosen.ravel(), minlength=E) / (T * k)
    log_p = _log_softmax(logits)
    lse = logits[:, 0] - log_p[:, 0]                 # log p = logit - log-sum-exp
    aux = {"load_balance": E * np.sum(share * np.exp(log_p).mean(0)),
           "z_loss": np.mean(lse ** 2), "dropped": 1 - kept.sum() / (T * k)}
    return y.reshape(*lead, D), aux


def _moe_bound(x: float, D: int, F: int, swiglu: bool) -> float:
    h = x * 3 * max(D, 1)                           # |x @ w1| (weights within 3)
    return (h * h if swiglu else h) * 3 * max(F, 1)


def _moe(b: _Builder):
    x = b.pick(lambda v: v.dtype == "f32" and v.shape and v.shape[-1] >= 1)
    D = x.shape[-1]
    E = b.draw(st.integers(1, 4))
    k = b.draw(st.integers(1, E))
    F = b.draw(st.integers(1, 4))
    capacity = b.draw(st.sampled_from([None, 0.5, 1.0]))
    names = ["router", "w1", "w2"] + (["w3"] if b.draw(st.booleans()) else [])
    shapes = {"router": (D, E), "w1": (E, D, F), "w2": (E, F, D), "w3": (E, D, F)}
    ws = {n: b.new_input(shapes[n], "f32") for n in names}
    experts = "{" + ", ".join(f"{n!r}: {w.name}" for n, w in ws.items()) + "}"
    b.step(f"op.moe({x.name}, experts={experts}, k={k}, capacity_factor={capacity})",
           lambda env, n=x.name, ws=ws, k=k, c=capacity: moe_reference(
               env[n], {m: env[w.name] for m, w in ws.items()}, k, c)[0],
           x.shape, "f32", _moe_bound(x.bound, D, F, "w3" in ws))


STEPS = [_unary, _binary, _reduction, _reshape, _transpose, _matmul, _slice, _concat, _split,
         _normalize, _cross_entropy, _cast, _select, _power, _embedding, _moe, _fp8_round,
         _attention, _attention_of_one_tensor, _rounding, _cumsum, _dynamic_slices,
         _dropout]


@st.composite
def programs(draw, max_steps: int = 8, allow_bf16: bool = True, allow_int: bool = True,
             steps=tuple(STEPS), min_rank: int = 0):
    """A random program; the last value it made is its result (and, at
    random, one more). Shrinks toward fewer steps, smaller shapes and the
    earlier entries of `steps`."""
    b = _Builder(draw, allow_bf16, allow_int)
    b.new_input(b.shape(min_dims=min_rank), "f32")
    for _ in range(draw(st.integers(2, max_steps))):
        try:
            draw(st.sampled_from(list(steps)))(b)
        except _Skip:
            pass
    p = b.program
    last = p.steps[-1].out if p.steps else p.inputs[0]
    p.results = [last]
    extra = [v for v in b.values if v is not last]
    if extra and draw(st.booleans()):
        p.results.append(draw(st.sampled_from(extra)))
    return p


@st.composite
def gradient_programs(draw, max_steps: int = 5, steps=tuple(STEPS)):
    """A program and the inputs to differentiate sum(result * weight) by
    (float32 only: the oracle is a finite difference of the float64 reference)."""
    p = draw(programs(max_steps=max_steps, allow_bf16=False, allow_int=True, steps=steps))
    floats = [v for v in p.inputs if v.dtype == "f32"]
    p.results = p.results[:1]
    p.wrt = draw(st.lists(st.sampled_from(floats), min_size=1, max_size=len(floats), unique=True))
    if p.steps and draw(st.booleans()):         # some steps recomputed in the backward
        first = draw(st.integers(0, len(p.steps) - 1))
        end = draw(st.integers(first + 1, len(p.steps)))
        p.remat = (first, end, draw(st.sampled_from(
            ["nothing_saveable", "dots_saveable", "selective"])))
    return p


def central_difference(loss, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(central difference of the float64 function `loss` at each element
    of `x`, mask of the elements where it is differentiable: its one-sided
    differences agree; a relu at 0, tied maxima are not)."""
    x = np.asarray(x, np.float64)
    grad, smooth = np.zeros(x.shape), np.zeros(x.shape, bool)
    base = loss(x)
    h = 1e-6
    for i in np.ndindex(x.shape):
        shifted = {}
        for sign in (1, -1):
            y = x.copy()
            y[i] += sign * h
            shifted[sign] = loss(y)
        forward, backward = (shifted[1] - base) / h, (base - shifted[-1]) / h
        grad[i] = (shifted[1] - shifted[-1]) / (2 * h)
        smooth[i] = abs(forward - backward) <= 1e-3 * (1 + abs(grad[i]))
    return grad, smooth


def finite_difference(p: Program, arrays: dict, wrt: Value) -> tuple[np.ndarray, np.ndarray]:
    """`central_difference` of a gradient program's loss by input `wrt`."""
    return central_difference(lambda x: p.loss({**arrays, wrt.name: x}), arrays[wrt.name])


@st.composite
def context_parallel_programs(draw, axes: dict):
    """Attention whose q, k and v are split along the sequence over one axis
    of `axes` (context parallelism: all-to-all or ring attention), laid out
    [B, S, H, D] or [B, H, S, D]: grouped key/value heads, causal and packed
    documents (segment ids [B, S]) each at times, sequences the axis divides
    once or twice (a causal ring stripes only the latter), then a few random
    steps; a gradient program by q, k and v half the time; compiled with
    `context_parallel="ring"` half the time (auto takes Ulysses wherever a
    head or batch dimension divides). The other arguments get
    `sharded_programs`' random ShardSpecs."""
    axis, n = draw(st.sampled_from(sorted(axes.items())))
    b = _Builder(draw, allow_bf16=False, allow_int=True)
    seq_dim = draw(st.sampled_from([1, 2]))
    B, H, D = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 3))
    S = n * draw(st.sampled_from([1, 2, n, 2 * n]))
    heads = draw(st.sampled_from([h for h in (1, 2, 4) if H % h == 0]))

    def shape(h):
        return (B, S, h, D) if seq_dim == 1 else (B, h, S, D)
    q, k, v = b.new_input(shape(H)), b.new_input(shape(heads)), b.new_input(shape(heads))
    causal = draw(st.booleans())
    segments = b.new_input((B, S), "i32", bound=-3) if draw(st.booleans()) else None
    extra = f", segment_ids={segments.name}" if segments is not None else ""
    out = b.step(f"op.attention({q.name}, {k.name}, {v.name}, causal={causal}, seq_dim={seq_dim}"
                 f"{extra})",
                 lambda env, sg=segments: attention_reference(
                     env[q.name], env[k.name], env[v.name], seq_dim, causal,
                     segments=None if sg is None else env[sg.name]),
                 shape(H), "f32", 3.0)
    for _ in range(draw(st.integers(0, 2))):
        try:
            draw(st.sampled_from([_unary, _binary, _reduction]))(b)
        except _Skip:
            pass
    p = b.program
    p.results = [p.steps[-1].out if p.steps else out]
    if draw(st.booleans()):
        p.wrt = draw(st.lists(st.sampled_from([q, k, v]), min_size=1, max_size=3, unique=True))
    p.context_parallel = draw(st.sampled_from(["ring", "auto"]))
    for x in (q, k, v):
        p.specs[x.name] = ((seq_dim,), (axis,), ())
        head = 3 - seq_dim
        others = [(a, m) for a, m in axes.items() if a != axis]
        if others and draw(st.booleans()) and H % others[0][1] == 0 and heads % others[0][1] == 0:
            p.specs[x.name] = ((seq_dim, head), (axis, others[0][0]), ())
    return p


@st.composite
def sharded_programs(draw, axes: dict, context_parallel: bool = False):
    """A program (a third of them gradient programs) and a ShardSpec for
    each argument over a mesh with `axes` (name -> size): each axis splits
    at most one dimension it divides, or none (replicated); an axis that
    splits nothing may hold a float argument as a partial sum. With
    `context_parallel`, a `context_parallel_programs` program (its q, k and
    v already placed)."""
    p = draw(context_parallel_programs(axes) if context_parallel else
             gradient_programs() if draw(st.integers(0, 2)) == 0 else programs())
    for v in p.arguments():
        if v.name in p.specs:
            continue
        parts = [1] * len(v.shape)
        partition, mesh_axes = [], []
        preferred = p.prefer.get(v.name)
        for axis, size in axes.items():
            fits = [d for d, n in enumerate(v.shape) if n % (parts[d] * size) == 0]
            # (an attention operand's sequence half the time it can be split)
            d = draw(st.sampled_from([None] + fits + [preferred] * len(fits)
                                     if preferred in fits else [None] + fits))
            if d is not None:
                parts[d] *= size
                partition.append(d)
                mesh_axes.append(axis)
        partial = tuple(a for a in axes if a not in mesh_axes and v.dtype != "i32"
                        and draw(st.integers(0, 3)) == 0)
        p.specs[v.name] = (tuple(partition), tuple(mesh_axes), partial)
    return p
