"""Forward numerics of the op set against float64 numpy references on fresh
random inputs, and the API's shape/dtype checks and error messages."""

import math

import numpy as np
import pytest

import tessera as ts
from tessera import op


def rng():
    return np.random.default_rng()


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _layernorm(x, w, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _attention(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        S = q.shape[-2]
        s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    return _softmax(s) @ v


CASES = {
    "add_broadcast": (lambda a, b: a + b, lambda a, b: a + b, [(4, 1, 6), (5, 6)]),
    "sub_scalar": (lambda a: 2.0 - a, lambda a: 2.0 - a, [(3, 7)]),
    "mul_div": (lambda a, b: a * b / (b * b + 1.0), lambda a, b: a * b / (b * b + 1), [(6, 5), (6, 5)]),
    "exp_log_tanh": (lambda a: op.log(op.exp(a) + 1.0) + op.tanh(a),
                     lambda a: np.log(np.exp(a) + 1) + np.tanh(a), [(5, 9)]),
    "sqrt_rsqrt": (lambda a: op.sqrt(a * a + 1.0) * op.rsqrt(a * a + 2.0),
                   lambda a: np.sqrt(a * a + 1) / np.sqrt(a * a + 2), [(4, 4)]),
    "relu_gelu_silu": (lambda a: op.relu(a) + op.gelu(a) + op.silu(a),
                       lambda a: np.maximum(a, 0) + _gelu(a) + a / (1 + np.exp(-a)), [(3, 33)]),
    "minimum_where": (lambda a, b: op.where(a > 0.0, op.minimum(a, b), b),
                      lambda a, b: np.where(a > 0, np.minimum(a, b), b), [(8, 3), (8, 3)]),
    "sum_mean_max": (lambda a: op.sum(a, 0) + op.mean(a, 0) * op.max(a, 0),
                     lambda a: a.sum(0) + a.mean(0) * a.max(0), [(37, 5)]),
    "sum_keepdim_all": (lambda a: op.sum(a, (0, 2), keepdim=True) + op.sum(a),
                        lambda a: a.sum((0, 2), keepdims=True) + a.sum(), [(3, 4, 5)]),
    "softmax": (lambda a: op.softmax(a, -1), lambda a: _softmax(a), [(6, 11)]),
    "softmax_dim0": (lambda a: op.softmax(a, 0), lambda a: _softmax(a, 0), [(6, 11)]),
    "log_softmax": (lambda a: op.log_softmax(a), lambda a: np.log(_softmax(a)), [(3, 50)]),
    "layernorm": (op.layernorm, _layernorm, [(2, 5, 16), (16,), (16,)]),
    "rmsnorm": (op.rmsnorm, lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
                [(7, 12), (12,)]),
    "matmul": (op.matmul, lambda a, b: a @ b, [(5, 7), (7, 3)]),
    "matmul_batched": (op.matmul, lambda a, b: a @ b, [(2, 3, 5, 7), (2, 3, 7, 4)]),
    "linear_rank3": (lambda x, w, b: op.linear(x, w, b), lambda x, w, b: x @ w + b,
                     [(2, 3, 8), (8, 5), (5,)]),
    "reshape_transpose": (lambda a: op.transpose(op.reshape(a, 2, 3, 4), 0, 2).reshape(-1, 6),
                          lambda a: a.reshape(2, 3, 4).transpose(2, 1, 0).reshape(-1, 6), [(6, 4)]),
    "split_concat": (lambda a: op.concat(op.split(a, [1, 3, 2], dim=1)[::-1], dim=1),
                     lambda a: np.concatenate([a[:, 4:], a[:, 1:4], a[:, :1]], 1), [(3, 6)]),
    "attention": (lambda q, k, v: ts.nn.flash_attention(q, k, v, causal=True),
                  lambda q, k, v: _attention(q, k, v, True), [(2, 2, 5, 4)] * 3),
    "attention_full": (lambda q, k, v: op.attention(q, k, v),
                       lambda q, k, v: _attention(q, k, v, False), [(1, 3, 6, 8)] * 3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_numpy_float64(name):
    fn, ref, shapes = CASES[name]
    r = rng()
    xs = [r.standard_normal(s) for s in shapes]
    got = ts.jit(fn)(*xs)
    np.testing.assert_allclose(got, ref(*xs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_and_embedding(dtype):
    r = rng()
    table = r.standard_normal((11, 6)).astype(dtype)
    ids = r.integers(0, 11, (3, 4)).astype(np.int32)
    targets = r.integers(0, 11, (3, 4)).astype(np.int32)
    targets[0, 1] = -100
    w = r.standard_normal((6, 11)).astype(dtype)

    @ts.jit
    def f(table, w, ids, targets):
        logits = op.embedding(ids, table) @ w
        return ts.nn.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), ignore_index=-100)

    logits = (table.astype(np.float64)[ids] @ w).reshape(-1, 11)
    t = targets.reshape(-1)
    keep = t != -100
    ref = -np.log(_softmax(logits)[keep, t[keep]]).mean()
    np.testing.assert_allclose(f(table, w, ids, targets), ref,
                               rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("ignore_index", [-100, 0, 7])
def test_cross_entropy_leaves_out_ignored_targets(ignore_index):
    """Rows whose target is `ignore_index` (a real class too: 0, 7) count
    zero and leave the mean; the loss and its gradient against float64
    numpy (softmax minus the one-hot, over the kept rows)."""
    r = rng()
    logits = r.standard_normal((5, 4, 11)).astype(np.float32)
    targets = r.integers(0, 11, (5, 4)).astype(np.int32)
    targets[0, :2] = ignore_index
    targets[1, 3] = ignore_index
    loss = ts.jit(lambda x, t: op.cross_entropy(x, t, ignore_index=ignore_index))
    grad = ts.jit(lambda x, t: ts.grad(op.cross_entropy(x, t, ignore_index=ignore_index), x))
    x, t = logits.astype(np.float64).reshape(-1, 11), targets.reshape(-1)
    keep = t != ignore_index
    p = _softmax(x)
    want = -np.log(p[keep, t[keep]]).mean()
    onehot = np.zeros_like(x)
    onehot[np.flatnonzero(keep), t[keep]] = 1
    want_grad = (p - onehot) * keep[:, None] / keep.sum()
    np.testing.assert_allclose(loss(logits, targets), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad(logits, targets)).reshape(-1, 11), want_grad,
                               atol=1e-7)


def test_cross_entropy_targets_out_of_range_fail_the_step(monkeypatch):
    """A target outside [0, C) that is not ignore_index (C, -1, -5, a large
    one) fails the step once it has run: ts.ValueCheckError names the row of
    the flattened targets (the first bad one), the target, C and the line,
    for the loss and for a step that returns only a gradient (the loss
    itself unused), run as straight-line code and by the interpreting loop
    (profiled runs). The compiled steps keep working afterwards."""
    from tessera_runtime.executor import ScheduleExecutor
    r = rng()
    logits = r.standard_normal((5, 4, 11)).astype(np.float32)
    w = r.standard_normal((11, 11)).astype(np.float32)
    targets = r.integers(0, 11, (5, 4)).astype(np.int32)
    targets[0, :2] = -100
    loss = ts.jit(lambda x, t: op.cross_entropy(x, t))
    grad_only = ts.jit(lambda x, w, t: ts.grad(ts.nn.cross_entropy(x @ w, t), w))
    steps = {"loss": lambda t: loss(logits, t), "gradient": lambda t: grad_only(logits, w, t)}
    for bad in (11, -1, -5, 2**31 - 1):
        monkeypatch.setattr(ScheduleExecutor, "straight_line", bad != -5)
        t = targets.copy()
        t[2, 1] = bad                                   # row 9
        t[3, 0] = 12                                    # a later bad row: the first is named
        for what, step in steps.items():
            with pytest.raises(ts.ValueCheckError, match=(
                    rf"^ts.nn.cross_entropy at \S*test_ops.py:\d+: target {bad} in row 9 is out "
                    r"of range for 11 classes \(targets must be in \[0, 11\) or "
                    r"ignore_index=-100\)$")) as err:
                step(t)
            e = err.value
            assert (e.row, e.value, e.low, e.high, e.allowed) == (9, bad, 0, 11, (-100,)), what
            assert isinstance(e, ts.TesseraError) and isinstance(e, ValueError)
    x, t = logits.astype(np.float64).reshape(-1, 11), targets.reshape(-1)
    keep = t != -100
    np.testing.assert_allclose(loss(logits, targets),
                               -np.log(_softmax(x)[keep, t[keep]]).mean(), rtol=1e-5)
    p = _softmax(x @ w)
    p[np.flatnonzero(keep), t[keep]] -= 1
    np.testing.assert_allclose(grad_only(logits, w, targets),
                               x.T @ (p * keep[:, None]) / keep.sum(), rtol=1e-4, atol=1e-6)


def test_cross_entropy_with_a_real_class_ignored_checks_every_other_value():
    """ignore_index a class (7): -100 is then out of range like any other."""
    targets = np.array([[7, 3], [-100, 1]], np.int32)
    loss = ts.jit(lambda x, t: op.cross_entropy(x, t, ignore_index=7))
    with pytest.raises(ts.ValueCheckError, match=r"target -100 in row 2 is out of range for 11 "
                                                 r"classes \(targets must be in \[0, 11\)\)$"):
        loss(np.zeros((2, 2, 11), np.float32), targets)


def test_transformer_block_matches_numpy():
    r = rng()
    B, S, D, H = 2, 5, 16, 4
    params = ts.nn.init_transformer(2, D, seed=int(r.integers(100)), dtype=np.float64)
    x = r.standard_normal((B, S, D))

    def ref(x):
        for p in params:
            h = _layernorm(x, p["ln1_w"], p["ln1_b"])
            qkv = (h @ p["wqkv"]).reshape(B, S, H, 3, D // H)    # columns grouped by head
            q, k, v = (qkv[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
            a = _attention(q, k, v, True).transpose(0, 2, 1, 3).reshape(B, S, D)
            x = x + a @ p["wo"]
            h = _layernorm(x, p["ln2_w"], p["ln2_b"])
            x = x + _gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return x

    got = ts.jit(lambda x, p: op.transformer_block(x, depth=2, params=p, heads=H))(x, params)
    np.testing.assert_allclose(got, ref(x), rtol=1e-9, atol=1e-11)


def test_bf16_matmul_under_autocast_accumulates_in_fp32():
    r = rng()
    a, b = r.standard_normal((16, 64)).astype(np.float32), r.standard_normal((64, 8)).astype(np.float32)

    @ts.jit
    def f(a, b):
        with ts.autocast(dtype=ts.bf16):
            return op.matmul(a, b)

    got = f(a, b)
    assert got.dtype == ts.bf16
    a16, b16 = (x.astype(ts.bf16).astype(np.float64) for x in (a, b))
    ref = (a16 @ b16).astype(np.float32).astype(ts.bf16).astype(np.float64)
    np.testing.assert_array_equal(got.astype(np.float64), ref)
    # ...and is far closer to fp32 than bf16 inputs would allow without fp32 accumulation.
    assert np.abs(got.astype(np.float64) - a @ b.astype(np.float64)).max() < 0.2


def test_bf16_elementwise_rounds_like_ml_dtypes():
    r = rng()
    x = r.standard_normal((4, 9)).astype(ts.bf16)
    got = ts.jit(lambda x: x * x + 1.0)(x)
    ref = ((x.astype(np.float32) * x.astype(np.float32)).astype(ts.bf16).astype(np.float32)
           + 1.0).astype(ts.bf16)
    assert got.dtype == ts.bf16
    np.testing.assert_array_equal(got.astype(np.float32), ref.astype(np.float32))


def test_isfinite_and_where():
    x = np.array([1.0, np.inf, -np.inf, np.nan, -2.0], np.float32)
    got = ts.jit(lambda x: op.where(ts.isfinite(x), x, 0.0))(x)
    np.testing.assert_array_equal(got, [1.0, 0, 0, 0, -2.0])


# -- signatures and errors ----------------------------------------------------------

def test_tensor_annotations_are_checked_with_argument_and_dimension():
    @ts.function
    def f(x: ts.Tensor["B", "S", ts.int32], y: ts.Tensor["B", "S", ts.int32]):
        return op.add(op.cast(x, ts.f32), op.cast(y, ts.f32))

    ok = np.zeros((2, 3), np.int32)
    assert f(ok, ok).shape == (2, 3)
    with pytest.raises(ts.ShapeError, match=r"argument 'y' dimension 1 \('S'\) is 4, but 'x' has "
                                            r"S = 3.*test_ops.py:\d+"):
        f(ok, np.zeros((2, 4), np.int32))
    with pytest.raises(ts.ShapeError, match=r"argument 'x' has dtype float32 but is annotated"):
        f(ok.astype(np.float32), ok)
    with pytest.raises(ts.ShapeError, match=r"argument 'x' has shape \[6\] but is annotated"):
        f(np.zeros(6, np.int32), ok)


def test_shape_error_names_op_shapes_and_line():
    with pytest.raises(ts.ShapeError) as e:
        ts.jit(lambda a, b: a + b)(np.zeros((3, 4)), np.zeros((5, 4)))
    assert "op.add: shapes [3, 4] and [5, 4] do not broadcast" in str(e.value)
    assert "test_ops.py:" in str(e.value)


def test_dtype_error_names_op_and_dtypes():
    with pytest.raises(ts.ShapeError, match=r"op.matmul: operand dtypes differ: \[2, 2\] float32 "
                                            r"and \[2, 2\] float64"):
        ts.jit(op.matmul)(np.zeros((2, 2), np.float32), np.zeros((2, 2)))
    with pytest.raises(ts.ShapeError, match=r"op.exp: needs floating-point operands, got \[3\] int32"):
        ts.jit(op.exp)(np.zeros(3, np.int32))


def test_pow_takes_any_real_exponent_as_numpy_does():
    """x ** p for float and tensor exponents (`tgraph.pow`), small integer
    ones as products (exact for negative x too), 2 ** x, against float64
    numpy; NaN where numpy gives NaN (a negative base, a fractional power)."""
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 5))
    p = rng.uniform(-2, 3, (3, 5))
    got = ts.jit(lambda x, p: [x ** 2.5, abs(x) ** p, x ** 3, 2.0 ** x, x ** -1.0, op.pow(x, p)])(
        x, p)
    with np.errstate(invalid="ignore"):          # numpy's NaN for x < 0 is the reference
        want = [x ** 2.5, np.abs(x) ** p, x ** 3, 2.0 ** x, x ** -1.0, np.power(x, p)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, equal_nan=True)
    assert np.isnan(got[0][x < 0]).all() and np.isfinite(got[2]).all()


def test_gelu_exact_and_tanh_forms_match_their_definitions():
    from math import erf, pi, sqrt
    x = np.random.default_rng().standard_normal((4, 7))
    exact, tanh = ts.jit(lambda x: [op.gelu(x, approximate="none"), op.gelu(x)])(x)
    np.testing.assert_allclose(exact, 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2))), rtol=1e-12)
    np.testing.assert_allclose(
        tanh, 0.5 * x * (1 + np.tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))), rtol=1e-12)


def test_unsupported_operation_names_op_and_line():
    with pytest.raises(ts.TracingError, match=r"with ts.where\(cond, a, b\).*test_ops.py:\d+"):
        ts.jit(lambda a: a if a > 0 else -a)(np.ones(3))


def test_nested_functions_inline_and_static_arguments_recompile():
    @ts.function
    def inner(x, scale):
        return x * scale

    calls = []

    @ts.jit
    def outer(x, cfg):
        calls.append(cfg["scale"])
        return inner(x, cfg["scale"]) + 1.0

    x = np.ones(3)
    np.testing.assert_array_equal(outer(x, {"scale": 2.0}), 3.0)
    np.testing.assert_array_equal(outer(x, {"scale": 2.0}), 3.0)
    np.testing.assert_array_equal(outer(x, {"scale": 3.0}), 4.0)
    assert calls == [2.0, 3.0]          # traced once per static value


def test_float32_exp_and_tanh_are_accurate_including_edge_cases():
    """The generated kernels use vectorizable exp/tanh for float32; they must
    stay within a few ulp of float64 libm and keep IEEE edge cases."""
    x = np.concatenate([np.linspace(-110, 95, 20001), np.linspace(-1, 1, 2001),
                        [0.0, -0.0, 1e-30, -1e-30, 88.72, 88.73, -103.9, -104.1]]).astype(np.float32)
    edge = np.array([np.inf, -np.inf, np.nan], np.float32)
    e, t = ts.jit(lambda x: (op.exp(x), op.tanh(x)))(np.concatenate([x, edge]))
    ref_e, ref_t = np.exp(x.astype(np.float64)), np.tanh(x.astype(np.float64))
    normal = (ref_e > 1.2e-38) & (ref_e < 3.4e38)
    assert np.max(np.abs(e[:len(x)][normal] / ref_e[normal] - 1)) < 4e-7
    assert np.all(e[:len(x)][ref_e >= 3.5e38] == np.inf)
    assert np.all(np.abs(e[:len(x)][ref_e < 1.2e-38]) < 1.2e-38)
    assert np.max(np.abs(t[:len(x)] - ref_t) / np.maximum(np.abs(ref_t), 1e-30)) < 4e-7
    assert e[-3] == np.inf and e[-2] == 0 and np.isnan(e[-1])
    assert t[-3] == 1 and t[-2] == -1 and np.isnan(t[-1])


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_fp8_e4m3_casts_round_as_ml_dtypes(target, monkeypatch):
    """`op.cast(x, "fp8_e4m3")` (what op.moe's FP8 packing sends) rounds to
    nearest even exactly as ml_dtypes' float8_e4m3fn: every one of the 256
    codes, the edges (448, the tie at 464, past it and infinities to NaN,
    subnormals and their ties, -0) and random magnitudes over 7 decades;
    in the C++ kernels and in the CUDA ones (on the emulator)."""
    if target == "gpu":
        monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    import ml_dtypes
    rng = np.random.default_rng()
    edge = np.array([0, -0.0, 1, 448, 449, 463.9, 464, 464.1, 479, 480, 1e6, np.inf, -np.inf,
                     np.nan, 2 ** -9, 2 ** -10, 3 * 2 ** -10, 2 ** -6, 2 ** -6 - 2 ** -12, 240,
                     256, 272, -5.5], np.float32)
    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    noise = rng.standard_normal(2000) * 10.0 ** rng.uniform(-4, 3, 2000)
    x = np.concatenate([edge, codes, noise.astype(np.float32)])
    got = np.asarray(ts.jit(lambda x: op.cast(op.cast(x, "fp8_e4m3"), "f32"), target=target)(x))
    want = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), (x[~same][:8], got[~same][:8], want[~same][:8])


def test_comparisons_are_traced_on_either_side_and_where_equals_numpy():
    """`==` and `!=` build comparisons like `<` does (Python's default `==`
    compared identities: `ts.where(t == 0, ...)` failed and `if s == 6.0:`
    was silently never taken), with numbers on either side and integer or
    float tensors; the selected values equal numpy's."""
    r = rng()
    t = r.integers(0, 3, (4, 5)).astype(np.int32)
    x = r.standard_normal((4, 5)).astype(np.float32)
    y = r.standard_normal((5,)).astype(np.float32)
    k = int(r.integers(0, 3))

    @ts.jit
    def f(t, x, y):
        return (ts.where(t == k, x, -x), ts.where(k != t, x, 0.0), ts.where(x == x, 1.0, 0.0),
                ts.where(x != y, x, y), t == t, 2.0 == op.sum(x * 0.0 + 2.0) / 20.0)

    a, b, c, d, same, scalar = f(t, x, y)
    np.testing.assert_array_equal(a, np.where(t == k, x, -x))
    np.testing.assert_array_equal(b, np.where(k != t, x, 0.0))
    np.testing.assert_array_equal(c, np.ones_like(x))
    np.testing.assert_array_equal(d, np.where(x != y, x, y))
    assert same.dtype == np.bool_ and same.all() and scalar.dtype == np.bool_ and scalar
    # Not a tensor or a number: not equal, as numpy says.
    seen = []
    ts.jit(lambda x: seen.append((x == None, x != "x")) or x)(x)  # noqa: E711
    assert seen == [(False, True)]


def _tracing_error(call) -> str:
    with pytest.raises(ts.TracingError) as err:
        call()
    text = str(err.value)
    assert "test_ops.py:" in text, text
    return text


def test_a_python_branch_or_number_from_a_traced_value_is_an_error_at_the_users_line():
    """bool(), int(), float(), an index and np.asarray of a traced tensor raise
    TracingError naming the conversion and the user's line, in ts.jit, in
    per-rank code (where the hint names the rank as a Python number), in a
    pipeline stage and in a remat region."""
    from tessera import dist, graph, pipeline
    x = np.arange(6, dtype=np.float32)

    def branch(x):
        if op.sum(x) == 15.0:           # was silently never taken
            return x
        return -x
    text = _tracing_error(lambda: ts.jit(branch)(x))
    assert text.startswith("bool() (an `if`, `while`, `and`, `or`, `not` or assert on it) of a "
                           "traced tensor ([] bool): it has no value while branch is being "
                           "compiled"), text
    assert "ts.where(cond, a, b)" in text
    for conversion, fn in (("int()", lambda x: x[: int(op.sum(x))]),
                           ("float()", lambda x: x * float(op.max(x))),
                           ("an integer index", lambda x: x[: range(op.sum(x))[0]]),
                           ("a numpy array", lambda x: np.exp(x) + x),
                           ("bool()", lambda x: x if 0.0 < x[0] < 1.0 else -x)):
        assert _tracing_error(lambda: ts.jit(fn)(x)).startswith(conversion)

    one = dist.Mesh(axes=["dp"], devices=range(1))

    @dist.spmd(mesh=one)
    def per_rank(x):
        if dist.axis_index("dp") == 0:
            x = dist.all_reduce(x, axis="dp")
        return x
    text = _tracing_error(lambda: per_rank(x))
    assert "ts.mesh.current().coords[axis] (dist.axis_index is a traced tensor)" in text

    @dist.spmd(mesh=one)
    def per_rank_where(x):               # the traced form: a comparison of the coordinate
        return dist.all_reduce(ts.where(dist.axis_index("dp") == 0, x, x * 0.0), axis="dp")
    np.testing.assert_array_equal(per_rank_where(x).numpy(), x)

    @graph.stage("branching")
    def stage(w, h):
        return h if op.sum(h) > 0.0 else -h

    mesh2 = dist.Mesh(axes=["pp"], devices=range(2))

    @pipeline.run(mesh=mesh2, axis="pp", microbatches=2)
    def step(ws, h):
        return ts.value_and_grad(lambda ws: op.sum(stage(ws[1], stage(ws[0], h))))(ws)
    _tracing_error(lambda: step.lower([np.ones((2, 2), np.float32)] * 2,
                                      np.ones((4, 2), np.float32)))

    @ts.jit
    def rematted(x):
        @ts.remat
        def region(x):
            return x * 2.0 if op.max(x) != 0.0 else x
        return region(x)
    _tracing_error(lambda: rematted(x))


def test_traced_tensors_iterate_by_rows_and_are_unhashable():
    x = rng().standard_normal((3, 2)).astype(np.float32)
    rows = ts.jit(lambda x: [r * 2.0 for r in x] + [x * float(len(x))])(x)
    np.testing.assert_allclose(np.stack(rows[:3]), 2 * x)
    np.testing.assert_allclose(rows[3], 3 * x)
    with pytest.raises(TypeError, match="unhashable"):
        ts.jit(lambda x: {x: 1} and x)(x)
