"""The ops real models are written with (issue 62, item 1), as their authors
write them, against float64 numpy on fresh random inputs, values and
gradients: numpy's basic indexing (`...`, `None`, negative and stepped
slices), `op.linear` with PyTorch's [out, in] weights, `op.arange`,
`op.broadcast_to` and batch-broadcasting `matmul`. (The elementwise ops —
sin, cos, erf, abs, sign, floor, ceil, pow with any exponent — are checked
by test_op_table.py from the op table, on both emitters, and by the
differential fuzzers.)"""

import numpy as np
import pytest

import tessera as ts
from tessera import op


def _rng():
    return np.random.default_rng()


KEYS = {
    "ellipsis_then_slice": (Ellipsis, slice(None, 2)),
    "none_then_int": (None, 1),
    "none_in_the_middle_and_step": (slice(None), None, slice(None, None, 2)),
    "negative_bounds_step_and_index": (slice(1, -1), slice(None, None, 3), -1),
    "steps_around_an_ellipsis": (slice(None, None, 2), Ellipsis, slice(1, None, 2)),
    "last_row": (-1,),
    "trailing_none": (Ellipsis, None),
    "empty": (slice(2, 2),),
    "step_longer_than_the_dimension": (slice(None, None, 10), 0),
    "offset_step_not_dividing": (slice(1, 5, 3), slice(0, 6, 4), slice(None, None, 5)),
}


@pytest.mark.parametrize("name", sorted(KEYS))
def test_basic_indexing_matches_numpy_with_its_gradient(name):
    key = KEYS[name]
    x = _rng().standard_normal((4, 5, 6))
    want = x[key]
    r = _rng().standard_normal(want.shape)

    def f(x):
        y = x[key]
        return y, ts.grad(op.sum(y * r), x)
    got, grad = ts.jit(f)(x)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    expected = np.zeros_like(x)
    expected[key] = r
    np.testing.assert_array_equal(grad, expected)


def test_linear_takes_pytorch_out_in_weights():
    rng = _rng()
    x, w, b = rng.standard_normal((3, 5, 8)), rng.standard_normal((6, 8)), rng.standard_normal(6)

    def f(x, w, b):
        y = op.linear(x, w, b, weight_layout="out_in")
        return y, ts.grad(op.sum(y * y), w)
    y, dw = ts.jit(f)(x, w, b)
    want = x @ w.T + b
    np.testing.assert_allclose(y, want, rtol=1e-12)
    np.testing.assert_allclose(dw, np.einsum("bso,bsi->oi", 2 * want, x), rtol=1e-12)


def test_arange_as_numpy_in_and_out_of_a_compiled_function():
    assert op.arange(5).dtype == np.int32 and list(op.arange(5)) == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(op.arange(1.0, 2.0, 0.25), np.arange(1.0, 2.0, 0.25))
    assert op.arange(3, 0).shape == (0,)
    x = _rng().standard_normal((2, 7))
    got = ts.jit(lambda x: x * op.arange(7, dtype=ts.f64) + op.arange(-1.5, 2.0, 0.5,
                                                                      dtype=ts.f64))(x)
    np.testing.assert_allclose(got, x * np.arange(7) + np.arange(-1.5, 2.0, 0.5), rtol=1e-12)
    # RoPE's angles, as Llama's code builds them: positions x inverse frequencies.
    d, s = 8, 5
    inv = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    got = ts.jit(lambda inv: op.reshape(op.arange(s, dtype=ts.f64), s, 1) * inv)(inv)
    np.testing.assert_allclose(got, np.arange(s)[:, None] * inv, rtol=1e-12)


def test_broadcast_to_matches_numpy_and_its_gradient_sums():
    x = _rng().standard_normal((3, 1))
    r = _rng().standard_normal((2, 3, 4))

    def f(x):
        y = op.broadcast_to(x, (2, 3, 4))
        return y, ts.grad(op.sum(y * r), x)
    y, g = ts.jit(f)(x)
    np.testing.assert_array_equal(y, np.broadcast_to(x, (2, 3, 4)))
    np.testing.assert_allclose(g, r.sum(axis=(0, 2))[:, None], rtol=1e-12)


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 4, 5), (2, 1, 5, 6)),
                                             ((4, 5), (3, 5, 2)),
                                             ((1, 4, 5), (3, 5, 2))])
def test_matmul_broadcasts_batch_dimensions_as_numpy(a_shape, b_shape):
    rng = _rng()
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    r = rng.standard_normal(np.matmul(a, b).shape)

    def f(a, b):
        y = op.matmul(a, b)
        return [y] + list(ts.grad(op.sum(y * r), (a, b)))
    y, da, db = ts.jit(f)(a, b)
    np.testing.assert_allclose(y, a @ b, rtol=1e-12)
    # The gradients of broadcast operands sum over the dimensions they were repeated on.
    full_da = r @ np.swapaxes(np.broadcast_to(b, np.broadcast_shapes(
        b.shape[:-2], a.shape[:-2]) + b.shape[-2:]), -1, -2)
    full_db = np.swapaxes(np.broadcast_to(a, np.broadcast_shapes(
        a.shape[:-2], b.shape[:-2]) + a.shape[-2:]), -1, -2) @ r
    np.testing.assert_allclose(da, _sum_to(full_da, a.shape), rtol=1e-10)
    np.testing.assert_allclose(db, _sum_to(full_db, b.shape), rtol=1e-10)


def _sum_to(x, shape):
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead)))
    return x.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_min_argmax_argmin_match_numpy_ties_included(dim):
    x = _rng().standard_normal((3, 5, 4))
    x[1, 2, :] = x[1, 0, :]          # ties: numpy takes the lowest index, and so must we
    x[2, :, 3] = 0.5

    y = _rng().standard_normal((3, 5, 4))          # no ties: min's gradient is one-hot

    def f(x, y):
        return [op.min(x, dim), op.argmax(x, dim), op.argmin(x, dim),
                op.argmax(x, dim, keepdim=True), ts.grad(op.sum(op.min(y, dim)), y)]
    m, amax, amin, kept, g = ts.jit(f)(x, y)
    np.testing.assert_array_equal(m, x.min(axis=dim))
    np.testing.assert_array_equal(amax, x.argmax(axis=dim))
    np.testing.assert_array_equal(amin, x.argmin(axis=dim))
    np.testing.assert_array_equal(kept, np.expand_dims(x.argmax(axis=dim), dim))
    assert amax.dtype == np.int32
    want = np.zeros_like(y)
    np.put_along_axis(want, np.expand_dims(y.argmin(axis=dim), dim), 1.0, dim)
    np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_take_along_axis_matches_numpy_negative_indices_and_broadcast_included(dim):
    rng = _rng()
    x = rng.standard_normal((3, 4, 5))
    shape = list(x.shape)
    shape[dim] = 2
    shape[(dim + 1) % 3] = 1                      # broadcasts against x there
    n = x.shape[dim]
    idx = rng.integers(-n, n, size=shape).astype(np.int64)
    r = rng.standard_normal(np.take_along_axis(x, idx, dim).shape)

    def f(x, idx):
        y = op.take_along_axis(x, idx, dim)
        return y, ts.grad(op.sum(y * r), x)
    y, g = ts.jit(f)(x, idx)
    np.testing.assert_array_equal(y, np.take_along_axis(x, idx, dim))
    want = np.zeros_like(x)
    np.add.at(want, tuple(np.broadcast_to(idx % n if a == dim % 3 else np.arange(x.shape[a])
                                          .reshape([-1 if b == a else 1 for b in range(3)]),
                                          r.shape) for a in range(3)), r)
    np.testing.assert_allclose(g, want, rtol=1e-12)


def test_take_along_axis_out_of_range_fails_the_step_naming_the_index():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ts.ValueCheckError, match=r"index 3 in row 1 is out of range for "
                                                 r"dimension 1 of size 3 \(indices must be in "
                                                 r"\[-3, 3\)\)"):
        ts.jit(lambda x, i: op.take_along_axis(x, i, 1))(x, np.array([[0], [3]], np.int32))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_matches_numpy_and_its_gradient_is_the_reversed_running_sum(dim):
    rng = _rng()
    x, r = rng.standard_normal((3, 5, 4)), rng.standard_normal((3, 5, 4))

    def f(x):
        y = op.cumsum(x, dim)
        return y, ts.grad(op.sum(y * r), x)
    y, g = ts.jit(f)(x)
    np.testing.assert_allclose(y, np.cumsum(x, axis=dim), rtol=1e-12, atol=1e-12)
    reversed_sum = np.flip(np.cumsum(np.flip(r, axis=dim), axis=dim), axis=dim)
    np.testing.assert_allclose(g, reversed_sum, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_dynamic_slice_and_update_at_a_run_time_start_match_numpy_with_gradients(dim):
    """One compiled step for every start (an input of the program): the
    block read and the block written match numpy, and so do the gradients
    (the read block's cotangent lands in place; the overwritten block of x
    gets none, the update all of it)."""
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    d = dim % 3
    size = 2
    u = rng.standard_normal(x.shape[:d] + (size,) + x.shape[d + 1:]).astype(np.float32)
    R, S = rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(u.shape).astype(
        np.float32)

    def step(x, u, at, R, S):
        written = op.dynamic_update_slice(x, u, at, dim=dim)
        read = op.dynamic_slice(x, at, size, dim=dim)
        loss = op.add(op.sum(op.mul(written, R)), op.sum(op.mul(read, S)))
        return (written, read) + tuple(ts.grad(loss, [x, u]))
    compiled = ts.jit(step)
    for at in range(x.shape[d] - size + 1):
        box = (slice(None),) * d + (slice(at, at + size),)
        written, read, dx, du = compiled(x, u, np.int32(at), R, S)
        want = x.copy()
        want[box] = u
        assert np.array_equal(written, want) and np.array_equal(read, x[box])
        want_dx = R.copy()
        want_dx[box] = S
        np.testing.assert_allclose(dx, want_dx, rtol=1e-6)
        assert np.array_equal(du, R[box])
    assert len(compiled._bundles) == 1


def test_a_dynamic_start_with_no_room_fails_the_step_naming_it():
    x = np.zeros((2, 6), np.float32)
    step = ts.jit(lambda x, at: op.dynamic_update_slice(x, np.ones((2, 3), np.float32), at, dim=1))
    with pytest.raises(ts.ValueCheckError, match=r"op.dynamic_update_slice at .*test_model_ops.py"
                                                 r":\d+: start 4 leaves no room for 3 along "
                                                 r"dimension 1 of \[2, 6\] \(0 to 3"):
        step(x, np.int32(4))
    with pytest.raises(ts.ArgumentError, match=r"start=-1 leaves no room"):
        op.dynamic_slice(x, -1, 2, dim=1)
