"""What the fuzzers found (and the issue that asked for them listed), each
a named test on fresh random inputs against numpy."""

import numpy as np
import pytest

import tessera as ts
from programs import central_difference
from tessera import op
from tessera.errors import ShapeError


def _rng():
    return np.random.default_rng()


def test_identity_and_pass_through_results_compile():
    """`ts.jit(lambda x: x)` (no op at all) and results that are arguments
    run, as in jax.jit: the Schedule IR function returns the argument's buffer."""
    x = _rng().standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(ts.jit(lambda x: x)(x), x)
    a, b, c = ts.jit(lambda x, y: (y, x + 1.0, x))(x, 2 * x)
    np.testing.assert_array_equal(a, 2 * x)
    np.testing.assert_allclose(b, x + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(c, x)


def test_zero_size_dimensions_give_numpys_results():
    """A sum over a zero-size dimension is 0, a mean NaN (0 / 0, as numpy's),
    a matmul with K = 0 zeros, elementwise ops and softmax of empty tensors
    empty; a max over one is refused (numpy raises too), naming the line."""
    empty = np.zeros((0, 3), np.float32)
    np.testing.assert_array_equal(ts.jit(lambda x: op.sum(x))(empty), np.float32(0))
    np.testing.assert_array_equal(ts.jit(lambda x: op.sum(x, dim=0))(empty), np.zeros(3))
    assert np.isnan(ts.jit(lambda x: op.mean(x, axis=0))(empty)).all()
    a = np.zeros((2, 0), np.float32)
    np.testing.assert_array_equal(ts.jit(lambda a, b: a @ b)(a, empty), np.zeros((2, 3)))
    out = ts.jit(lambda x: op.softmax(op.exp(x) + 1.0, dim=0))(empty)
    assert out.shape == (0, 3) and out.dtype == np.float32
    with pytest.raises(ShapeError, match=r"op.max: reduction over a zero-size dimension of "
                                         r"\[0, 3\] has no identity .*test_fuzz_regressions.py:\d+"):
        ts.jit(lambda x: op.max(x, dim=0))(empty)


def test_zero_row_matmul_gradient_is_zero():
    """The backward of a matmul with no rows contracts over K = 0: dW is zeros."""
    x, w = np.zeros((0, 2), np.float32), _rng().standard_normal((2, 3)).astype(np.float32)
    dw = ts.jit(lambda x, w: ts.grad(op.sum(x @ w), w))(x, w)
    np.testing.assert_array_equal(dw, np.zeros((2, 3)))


def test_embedding_gradient_of_no_ids_is_zero():
    """The backward of an embedding of no ids scatters no rows: the table's
    gradient is zeros. (The scatter moved ahead of the fused kernel before
    it, leaving its zero-size input's allocation behind: "operand does not
    dominate this use".)"""
    table = _rng().standard_normal((3, 2)).astype(np.float32)
    ids, w = np.zeros((2, 0), np.int32), np.ones((2, 0, 2), np.float32)
    grad = ts.jit(lambda t, i, w: ts.grad(op.sum(op.mul(op.embedding(i, t), w)), [t]))(
        table, ids, w)
    np.testing.assert_array_equal(grad[0], np.zeros((3, 2)))


def test_moe_gradient_of_no_tokens_compiles():
    """The same with the two dispatches of an MoE layer over no tokens: both
    read the zero-size expert choice, whose alloc came after the first."""
    rng = _rng()
    x = np.zeros((1, 2, 0, 1), np.float32)
    ex = {n: rng.standard_normal(s).astype(np.float32)
          for n, s in (("router", (1, 1)), ("w1", (1, 1, 1)), ("w2", (1, 1, 1)))}
    grad = ts.jit(lambda x, r, w1, w2: ts.grad(op.sum(op.moe(
        op.neg(x), experts={"router": r, "w1": w1, "w2": w2}, k=1)), [x]))(
        x, ex["router"], ex["w1"], ex["w2"])
    assert np.asarray(grad[0]).shape == (1, 2, 0, 1)


def test_zero_size_dimensions_on_the_gpu_target(built_cleanly, monkeypatch):
    """The GPU target's kernels for the same programs: no zero-size grid
    (Tile IR verifies), the CUDA builds, and on the emulated GPU the results
    are numpy's."""
    def program(x, a):
        return op.sum(x, dim=0), a @ x, op.exp(x), op.mean(x, axis=0)
    x, a = np.zeros((0, 3), np.float32), np.zeros((2, 0), np.float32)
    levels = ts.jit(program).lower(x, a, target="gpu")
    assert "grid = array<i64: 0" not in levels.tile
    built_cleanly(levels.cuda)
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    total, product, e, mean = ts.jit(program, target="gpu")(x, a)
    np.testing.assert_array_equal(total, np.zeros(3))
    np.testing.assert_array_equal(product, np.zeros((2, 3)))
    assert e.shape == (0, 3) and np.isnan(mean).all() and mean.shape == (3,)


def test_empty_slices_are_zero_size_dimensions():
    x = _rng().standard_normal((4, 5)).astype(np.float32)
    a, b = ts.jit(lambda x: (x[2:1], x[:, 3:3]))(x)
    assert a.shape == x[2:1].shape and b.shape == x[:, 3:3].shape


def test_axis_is_accepted_wherever_dim_is():
    """numpy's and JAX's `axis=` beside the design docs' `dim=`, in op.* and
    the tensor methods; both at once is an error."""
    x = _rng().standard_normal((3, 4, 2)).astype(np.float32)

    def program(x):
        return (op.sum(x, axis=1), op.mean(x, axis=(0, 2), keepdim=True), op.max(x, axis=-1),
                op.softmax(x, axis=0), op.log_softmax(x, axis=1), op.concat([x, x], axis=2),
                op.split(x, 2, axis=2)[1], x.sum(axis=0), x.mean(axis=2), x.max(axis=1))
    got = ts.jit(program)(x)
    e = np.exp(x - x.max(0, keepdims=True))
    sh = x - x.max(1, keepdims=True)
    want = (x.sum(1), x.mean((0, 2), keepdims=True), x.max(-1), e / e.sum(0, keepdims=True),
            sh - np.log(np.exp(sh).sum(1, keepdims=True)), np.concatenate([x, x], 2), x[:, :, 1:],
            x.sum(0), x.mean(2), x.max(1))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="op.sum: give dim= or axis=, not both"):
        ts.jit(lambda x: op.sum(x, dim=0, axis=1))(x)


@pytest.mark.parametrize("a_shape, b_shape", [((4,), (4, 3)), ((2, 4), (4,)), ((4,), (4,)),
                                              ((4,), (2, 4, 3)), ((2, 3, 4), (4,))])
def test_one_dimensional_matmul_follows_numpy_forward_and_backward(a_shape, b_shape):
    """A 1-D operand is a row on the left, a column on the right, and that
    dimension leaves the result (numpy's and JAX's rules); the gradients
    match central differences of the float64 product."""
    rng = _rng()
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    w = rng.standard_normal(np.matmul(a, b).shape).astype(np.float32)

    def program(a, b, w):
        out = op.matmul(a, b)
        return out, ts.grad(op.sum(out * w), [a, b])
    out, (da, db) = ts.jit(program)(a, b, w)
    ref = np.matmul(a.astype(np.float64), b)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    want_da, _ = central_difference(lambda x: np.sum(np.matmul(x, b) * w), a)
    want_db, _ = central_difference(lambda x: np.sum(np.matmul(a, x) * w), b)
    np.testing.assert_allclose(da, want_da, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, want_db, rtol=1e-4, atol=1e-4)


def test_from_numpy_with_a_partial_layout_holds_the_value():
    """`dist.from_numpy(x, ShardSpec(partial=...))` is the value x held as a
    pending sum (found by the distributed fuzzer: every rank held all of x,
    so the value was x times the axis size): the ranks at coordinate 0 of
    the partial axes hold their block, the others zeros."""
    from tessera import dist
    mesh = dist.Mesh(axes=["dp", "tp"], devices=[[0, 1], [2, 3]])
    x = _rng().standard_normal((4, 6)).astype(np.float32)
    t = dist.from_numpy(x, dist.ShardSpec(partition=(1,), mesh_axes=("tp",), partial=("dp",)), mesh)
    blocks = {r: t.block(r) for r in range(4)}          # rank r = 2 * dp + tp
    for tp in (0, 1):
        np.testing.assert_array_equal(blocks[tp], x[:, 3 * tp:3 * tp + 3])
        np.testing.assert_array_equal(blocks[2 + tp], np.zeros((4, 3)))


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_relu_maximum_and_max_propagate_nan(target, monkeypatch):
    """NaN in, NaN out, as in numpy and PyTorch (found by the forward fuzzer
    as relu(mean of nothing) = 0): relu, op.maximum / op.minimum and max
    reductions on both targets (the GPU's on the emulated engine)."""
    if target == "gpu":
        monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    x = _rng().standard_normal((4, 40)).astype(np.float32)
    x[1, 3] = x[2, 39] = np.nan
    y = _rng().standard_normal((4, 40)).astype(np.float32)

    def program(x, y):
        return op.relu(x), op.maximum(x, y), op.maximum(y, x), op.minimum(x, y), op.max(x, dim=1)
    got = ts.jit(program, target=target)(x, y)
    want = (np.maximum(x, 0), np.maximum(x, y), np.maximum(y, x), np.minimum(x, y), x.max(1))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_minimum_of_bf16_and_a_number_stays_bf16():
    """A Python number beside a bf16 tensor is bf16 (numpy's rule), in
    op.minimum too (found by the forward fuzzer: it negated the number
    alone, an f32 tensor, and the result became f32)."""
    x = _rng().standard_normal(5).astype(ts.bf16)
    for got in ts.jit(lambda x: (op.minimum(x, 0.5), op.minimum(0.5, x), op.maximum(x, 0.5)))(x):
        assert got.dtype == ts.bf16
    np.testing.assert_array_equal(ts.jit(lambda x: op.minimum(x, 0.5))(x),
                                  np.minimum(x.astype(np.float32), 0.5).astype(ts.bf16))
