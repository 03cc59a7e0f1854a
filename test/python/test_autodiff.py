"""Every vector-Jacobian rule of tessera-autodiff against float64 central
finite differences, on fresh random inputs.

Each case compiles `loss(x...) = sum(f(x...) * R)` (R a fixed random
cotangent) and its gradient `ts.grad(loss, x_i)`; the gradient must match
(loss(x + h e_j) - loss(x - h e_j)) / 2h for every element j. Both run
through the whole compiler (autodiff, fusion, tiling, generated C++, BLAS).
"""

import numpy as np
import pytest

import tessera as ts
from tessera import op

H = 1e-6


def _fd_check(fn, inputs, wrt=(0,), seed=0, rtol=2e-6, atol=2e-7):
    rng = np.random.default_rng(seed)
    probe = ts.jit(lambda *xs: fn(*xs))
    out_shape = np.shape(probe(*inputs))
    R = rng.standard_normal(out_shape)

    def loss(*xs):
        return op.sum(op.mul(fn(*xs), R))

    loss_c = ts.jit(loss)
    grad_c = ts.jit(lambda *xs: ts.grad(loss(*xs), [xs[i] for i in wrt]))
    grads = grad_c(*inputs)
    for k, i in enumerate(wrt):
        x = inputs[i]
        fd = np.zeros_like(x)
        for j in np.ndindex(x.shape):
            plus, minus = [a.copy() for a in inputs], [a.copy() for a in inputs]
            plus[i][j] += H
            minus[i][j] -= H
            fd[j] = (float(loss_c(*plus)) - float(loss_c(*minus))) / (2 * H)
        np.testing.assert_allclose(grads[k], fd, rtol=rtol, atol=atol,
                                   err_msg=f"gradient wrt input {i}")


def _r(*shape, seed=1, positive=False, spread=1.0):
    x = np.random.default_rng(seed + sum(shape)).standard_normal(shape) * spread
    return np.abs(x) + 0.5 if positive else x


PRIMITIVES = {
    "add": (lambda a, b: a + b, [_r(3, 4), _r(3, 4, seed=2)], (0, 1)),
    "sub": (lambda a, b: a - b, [_r(3, 4), _r(3, 4, seed=2)], (0, 1)),
    "mul": (lambda a, b: a * b, [_r(3, 4), _r(3, 4, seed=2)], (0, 1)),
    "div": (lambda a, b: a / b, [_r(3, 4), _r(3, 4, seed=2, positive=True)], (0, 1)),
    "maximum": (op.maximum, [_r(3, 4), _r(3, 4, seed=2)], (0, 1)),
    "neg": (op.neg, [_r(3, 4)], (0,)),
    "exp": (op.exp, [_r(3, 4)], (0,)),
    "log": (op.log, [_r(3, 4, positive=True)], (0,)),
    "tanh": (op.tanh, [_r(3, 4)], (0,)),
    "sqrt": (op.sqrt, [_r(3, 4, positive=True)], (0,)),
    "rsqrt": (op.rsqrt, [_r(3, 4, positive=True)], (0,)),
    "relu": (op.relu, [_r(3, 4)], (0,)),
    "where": (lambda a, b: op.where(a > b, a * 2.0, b), [_r(3, 4), _r(3, 4, seed=2)], (0, 1)),
    "broadcast": (lambda a, b: a + b, [_r(3, 1), _r(3, 4, seed=2)], (0, 1)),
    "broadcast_rank": (lambda a, b: a * b, [_r(4), _r(2, 3, 4, seed=2)], (0, 1)),
    "sum": (lambda a: op.sum(a, 1), [_r(3, 4)], (0,)),
    "sum_all": (lambda a: op.sum(a), [_r(2, 3, 2)], (0,)),
    "max": (lambda a: op.max(a, -1), [_r(3, 5)], (0,)),
    "max_rows": (lambda a: op.max(a, 0, keepdim=True), [_r(4, 3)], (0,)),
    "mean": (lambda a: op.mean(a, (0, 2)), [_r(2, 3, 2)], (0,)),
    "reshape": (lambda a: op.reshape(a, 4, 3) * op.reshape(a, 4, 3), [_r(2, 6)], (0,)),
    "transpose": (lambda a: op.transpose(a, 0, 2) * 1.5, [_r(2, 3, 4)], (0,)),
    "split": (lambda a: op.split(a, 3, dim=-1)[1] * op.split(a, 3, dim=-1)[2], [_r(2, 6)], (0,)),
    "concat": (lambda a, b: op.concat([a, b * b], dim=1), [_r(2, 3), _r(2, 2, seed=2)], (0, 1)),
    "matmul": (op.matmul, [_r(3, 4), _r(4, 5, seed=2)], (0, 1)),
    "matmul_batched": (op.matmul, [_r(2, 3, 4), _r(2, 4, 2, seed=2)], (0, 1)),
    "matmul_linear": (op.matmul, [_r(2, 3, 4), _r(4, 2, seed=2)], (0, 1)),
}

COMPOSITES = {
    "softmax": (lambda a: op.softmax(a, -1), [_r(3, 5)], (0,)),
    "log_softmax": (lambda a: op.log_softmax(a, -1), [_r(3, 5)], (0,)),
    "layernorm": (lambda a, w, b: op.layernorm(a, w, b), [_r(3, 6), _r(6, seed=2), _r(6, seed=3)],
                  (0, 1, 2)),
    "rmsnorm": (lambda a, w: op.rmsnorm(a, w), [_r(3, 6), _r(6, seed=2)], (0, 1)),
    "gelu": (op.gelu, [_r(3, 4)], (0,)),
    "silu": (op.silu, [_r(3, 4)], (0,)),
    "sigmoid": (op.sigmoid, [_r(3, 4)], (0,)),
    "attention_causal": (lambda q, k, v: op.attention(q, k, v, causal=True),
                         [_r(1, 2, 3, 4), _r(1, 2, 3, 4, seed=2), _r(1, 2, 3, 4, seed=3)],
                         (0, 1, 2)),
}


@pytest.mark.parametrize("name", sorted(PRIMITIVES))
def test_vjp_rule_matches_finite_differences(name):
    fn, inputs, wrt = PRIMITIVES[name]
    _fd_check(fn, [x.copy() for x in inputs], wrt)


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composite_gradient_matches_finite_differences(name):
    fn, inputs, wrt = COMPOSITES[name]
    _fd_check(fn, [x.copy() for x in inputs], wrt)


def test_embedding_gradient_scatters_rows():
    """gather's rule (scatter_add): repeated ids accumulate."""
    table = _r(5, 3)
    ids = np.array([[0, 3], [3, 4]], np.int32)
    _fd_check(lambda t: op.embedding(ids, t), [table], (0,))


def test_cross_entropy_gradient_with_ignored_rows():
    logits = _r(4, 5)
    targets = np.array([1, -100, 4, 0], np.int32)
    _fd_check(lambda x: op.cross_entropy(x, targets), [logits], (0,))


def test_slices_that_split_a_tensor_take_their_cotangents_as_one_concat():
    """q, k and v split out of one [B, S, H, 3, Dh] projection, as
    op.transformer_block does: the projection's gradient is one concat of
    theirs (no pad, no add), equal to numpy's, and overlapping slices'
    cotangents still add."""
    rng = np.random.default_rng()
    qkv, w = rng.standard_normal((2, 4, 3, 3, 5)), rng.standard_normal((2, 4, 3, 5))

    def f(qkv, w):
        q, k, v = (qkv[:, :, :, i] for i in range(3))
        return ts.grad(op.sum(q * k * w + op.exp(v)), [qkv])
    fn = ts.jit(f)
    got = np.asarray(fn(qkv.astype(np.float32), w.astype(np.float32))[0], np.float64)
    q, k, v = (qkv[:, :, :, i] for i in range(3))
    want = np.stack([k * w, q * w, np.exp(v)], axis=3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    backward = fn.lower(qkv.astype(np.float32), w.astype(np.float32)).tile
    assert "pad" not in backward and "concat" in backward
    x = _r(2, 6)
    g = ts.jit(lambda x: ts.grad(op.sum(x[:, 0:4] * x[:, 2:6]), [x]))(x)[0]
    np.testing.assert_allclose(g, np.concatenate([x[:, 2:4], x[:, 4:6] + x[:, 0:2],
                                                  x[:, 2:4]], axis=1), rtol=1e-6)


def test_gradient_of_unused_input_is_zero():
    g = ts.jit(lambda a, b: ts.grad(op.sum(a * a), [a, b]))(_r(2, 2), _r(3))
    assert np.all(g[1] == 0) and g[1].shape == (3,)


def test_grad_of_function_and_value_and_grad():
    a = _r(3, 4)
    f = lambda x: op.sum(op.tanh(x))  # noqa: E731
    g = ts.jit(ts.grad(f))(a)
    np.testing.assert_allclose(g, 1 - np.tanh(a) ** 2, rtol=1e-12)
    loss, g2 = ts.jit(ts.value_and_grad(f))(a)
    np.testing.assert_allclose(loss, np.tanh(a).sum(), rtol=1e-12)
    np.testing.assert_allclose(g2, g, rtol=1e-12)


def test_grad_of_non_scalar_is_an_error_naming_the_line():
    with pytest.raises(ts.ShapeError, match=r"loss must be a float scalar.*test_autodiff.py:\d+"):
        ts.jit(lambda a: ts.grad(a * 2.0, a))(_r(2, 2))


def test_cast_gradient_is_cast_back():
    """d/da sum(cast(a, f32) * R) = R in a's dtype (finite differences would
    only see f32 rounding steps)."""
    a, R = _r(3, 4), _r(3, 4, seed=5).astype(np.float32)
    g = ts.jit(lambda x: ts.grad(op.sum(op.cast(x, ts.f32) * R), x))(a)
    assert g.dtype == np.float64
    np.testing.assert_array_equal(g, R.astype(np.float64))


def test_local_view_backward_reads_the_forward_instead_of_recomputing_it():
    """The backward of a dist.spmd body takes the forward values it needs
    from the forward call (residuals): the body's all_gather runs once, not
    again in the backward. (The values: test_moe.py's expert-parallel
    gradients against one device, on 4 ranks.)"""
    from tessera import dist
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    rows = dist.ShardSpec((0,), ("dp",))

    @dist.spmd(mesh=mesh, in_specs=(rows,), out_specs=rows)
    def body(x):                      # y = x * sum over every rank's rows of x^2
        everyone = dist.all_gather(x, axis="dp", dim=0)
        return op.mul(x, op.sum(op.mul(everyone, everyone)))

    x = np.random.default_rng().standard_normal((8, 4)).astype(np.float32)
    trace = ts.graph.trace(lambda x: ts.grad(op.sum(body(x)), [x]), x, mesh=mesh)
    assert trace.schedule.count("collective_start <all_gather>") == 1


def test_local_view_backward_reads_a_returned_value_through_its_result():
    """A residual the body also returns (attention's output, which its
    gradient reads) comes back through the forward call's result in its
    out-sharding (heads split over tp), not as a second result with another
    layout. (Values: test_end_to_end's 4-rank mesh2d job.)"""
    from tessera import dist
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    heads, whole = dist.ShardSpec((1,), ("tp",)), dist.ShardSpec((), ())

    @dist.spmd(mesh=mesh, in_specs=(heads, whole), out_specs=heads)
    def attend(q, m):
        return op.attention(q, q, q, causal=True, mask=m)

    q = np.random.default_rng().standard_normal((2, 4, 8, 4)).astype(np.float32)
    mask = np.ones((2, 1, 1, 8), bool)
    trace = ts.graph.trace(lambda q, m: ts.grad(op.sum(op.mul(attend(q, m), attend(q, m))), [q]),
                           q, mask, mesh=mesh)
    assert "tgraph.attention_grad" in trace.partitioned
