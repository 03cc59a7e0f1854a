"""Attention as models use it (`op.attention` with grouped key/value heads,
queries at an offset, boolean and additive masks, packed documents, a
sliding window), compiled to the flash-attention kernels, forward and
backward, against a float64 numpy reference on fresh random inputs. Many
variants share one compiled step (one C++ build)."""

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera_runtime import random


def reference(q, k, v, R, scale, causal=False, mask=None, segments=None, window=None,
              softcap=None, dropout=None):
    """out and d(sum(out * R))/d(q, k, v) in float64 over [B, H, S, D]
    operands; k and v may have fewer heads (each serves H // Hkv query
    heads) and another length (queries are the last Sq positions); `mask`
    is boolean or additive (-1000 or less masks), broadcast to [B, H, Sq,
    Sk]; `segments` a pair of [B, S] ids; `softcap` caps the scaled scores
    (c tanh(s / c)) before the masks; `dropout` = (p, (seed, step)) drops
    the probabilities by op.dropout's mask of [B, H, Sq, Sk]. A row with no
    key gives 0 and passes no gradient."""
    q, k, v, R = (np.asarray(t, np.float64) for t in (q, k, v, R))
    B, H, Sq, _ = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    G = H // Hk
    kr, vr = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, kr) * scale
    slope = 1.0
    if softcap is not None:
        th = np.tanh(s / softcap)
        s, slope = softcap * th, 1 - th * th
    pos, keys = np.arange(Sq)[:, None] + Sk - Sq, np.arange(Sk)[None, :]
    allowed = np.ones((B, H, Sq, Sk), bool)
    if causal:
        allowed &= keys <= pos
    if window is not None:
        allowed &= pos - keys < window
    if segments is not None:
        qs, ks = segments
        allowed &= qs[:, None, :, None] == ks[:, None, None, :]
    if mask is not None and mask.dtype == bool:
        allowed &= np.broadcast_to(mask, allowed.shape)
    s = np.where(allowed, s, -np.inf)
    if mask is not None and mask.dtype != bool:     # at or below -1000: masked
        s = s + np.where(mask <= -1000, -np.inf, mask)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isneginf(m), 0, m))
    l = p.sum(-1, keepdims=True)
    p /= np.where(l == 0, 1, l)
    z = 1.0
    if dropout is not None:
        rate, key = dropout
        z = random.dropout_keep(key, rate, p.shape) * float(np.float32(1 / (1 - rate)))
    out = (p * z) @ vr
    dv = np.swapaxes(p * z, -1, -2) @ R
    dp = (R @ np.swapaxes(vr, -1, -2)) * z
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * slope
    dq = ds @ kr * scale
    dk = np.swapaxes(ds, -1, -2) @ q * scale

    def grouped(g):                     # a key/value head sums its query heads
        return g.reshape(B, Hk, G, *g.shape[2:]).sum(2)
    return out, dq, grouped(dk), grouped(dv)


def _check(got, want, what):
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=2e-4, atol=3e-5,
                                   err_msg=f"{what}: {name}")


def _with_grads(attend):
    """(out, dq, dk, dv) of attend(q, k, v) for a cotangent R."""
    def step(q, k, v, R):
        def loss(q, k, v):
            return op.sum(op.mul(attend(q, k, v), R))
        return (attend(q, k, v),) + tuple(ts.grad(loss(q, k, v), [q, k, v]))
    return step


def _qkvr(rng, B, H, Hk, Sq, Sk, D=16, Dv=16):
    q = rng.standard_normal((B, H, Sq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hk, Sk, D)).astype(np.float32)
    v = rng.standard_normal((B, Hk, Sk, Dv)).astype(np.float32)
    R = rng.standard_normal((B, H, Sq, Dv)).astype(np.float32)
    return q, k, v, R


def _packed(rng, B, S):
    """Document ids of packed sequences: one long document and short ones."""
    ids = np.zeros((B, S), np.int32)
    for b in range(B):
        cuts = np.sort(rng.choice(np.arange(S // 2, S), size=3, replace=False))
        for n, c in enumerate(cuts):
            ids[b, c:] = n + 1
    return ids


def test_attention_variants_forward_and_backward_cpu():
    """One compiled step, each variant's output and q/k/v gradients against
    float64: grouped heads (4 query heads over 2 and over 1 key/value heads,
    read in place: the kernels' k buffers keep their heads), a decode step
    (1 query over 40 keys) and a prefill chunk (24 over 64) with causal
    masking at the offset, more queries than keys (the first rows see no
    key: 0), a boolean key-padding mask with a row left empty, an additive
    per-head mask, HF's finite mask (float32's lowest masks a key as -inf
    does: a row masked everywhere gives 0), packed documents
    a sliding window across 3 key blocks (S = 192, window 50) and Gemma
    2's soft cap of the scores (c = 1.5, small enough to bend them)."""
    rng = np.random.default_rng()
    cases = {
        "gqa-causal": (_qkvr(rng, 2, 4, 2, 64, 64), dict(causal=True)),
        "mqa-full": (_qkvr(rng, 1, 4, 1, 48, 48, Dv=8), dict()),
        "decode": (_qkvr(rng, 2, 4, 2, 1, 40), dict(causal=True)),
        "chunk": (_qkvr(rng, 1, 2, 2, 24, 64), dict(causal=True)),
        "more-queries": (_qkvr(rng, 1, 2, 1, 40, 24), dict(causal=True)),
        "window": (_qkvr(rng, 1, 2, 2, 192, 192, D=8, Dv=8), dict(causal=True, window=50)),
    }
    padding = np.ones((2, 1, 1, 32), bool)
    padding[0, :, :, :5] = False                            # left padding
    cases["key-padding"] = (_qkvr(rng, 2, 2, 2, 32, 32), dict(causal=True, mask=padding))
    rows = rng.random((1, 1, 32, 32)) < 0.7
    rows[0, 0, 3] = False                                   # a query with no key
    cases["bool-rows"] = (_qkvr(rng, 1, 2, 1, 32, 32), dict(mask=rows))
    cases["additive"] = (_qkvr(rng, 2, 2, 2, 16, 24),
                         dict(mask=rng.standard_normal((2, 2, 16, 24)).astype(np.float32)))
    lowest = np.where(rng.random((1, 1, 16, 16)) < 0.5, np.finfo(np.float32).min, 0)
    lowest[..., 2, :] = np.finfo(np.float32).min             # a row with no key: 0
    cases["finite-lowest"] = (_qkvr(rng, 1, 2, 2, 16, 16), dict(mask=lowest.astype(np.float32)))
    docs = _packed(rng, 2, 96)
    cases["segments"] = (_qkvr(rng, 2, 2, 1, 96, 96), dict(causal=True, segments=(docs, docs)))
    cases["softcap"] = (_qkvr(rng, 1, 4, 2, 32, 32), dict(causal=True, softcap=1.5))

    def attend(kw, scale):
        def f(q, k, v):
            kw2 = {key: val for key, val in kw.items() if key != "segments"}
            if "segments" in kw:
                kw2["segment_ids"] = kw["segments"][0]
            return op.attention(q, k, v, scale=scale, **kw2)
        return f

    scales = {name: float(rng.uniform(0.1, 0.5)) for name in cases}

    def step(*arrays):
        out = []
        for i, (name, (_, kw)) in enumerate(cases.items()):
            out += _with_grads(attend(kw, scales[name]))(*arrays[4 * i: 4 * i + 4])
        return tuple(out)
    inputs = [t for arrays, _ in cases.values() for t in arrays]
    compiled = ts.jit(step)
    got = compiled(*inputs)
    for i, (name, (arrays, kw)) in enumerate(cases.items()):
        _check(got[4 * i: 4 * i + 4], reference(*arrays, scales[name], **kw), name)
    tile = compiled.lower(*inputs).tile
    assert "memref<2x2x64x16xf32" in tile and "memref<1x1x48x16xf32" in tile   # k read in place
    out = np.asarray(got[4 * list(cases).index("more-queries")])
    assert not out[:, :, :16].any() and (np.abs(out[:, :, 16:]).sum(-1) > 0).all()


def test_attention_along_seq_dim_with_grouped_heads_mask_and_segments_cpu():
    """[B, S, H, D] operands (`seq_dim=1`, as a projection lays them out)
    with 2 key/value heads for 4 query heads, a [B, 1, 1, S] padding mask
    and packed documents: the [B, H, S, D] reference, and no transposes."""
    rng = np.random.default_rng()
    q, k, v, R = _qkvr(rng, 2, 4, 2, 64, 64)
    mask = np.ones((2, 1, 1, 64), bool)
    mask[1, ..., :7] = False
    docs = _packed(rng, 2, 64)

    def attend(q, k, v):
        return op.attention(q, k, v, causal=True, seq_dim=1, mask=mask, segment_ids=docs)
    moved = [np.ascontiguousarray(np.swapaxes(t, 1, 2)) for t in (q, k, v, R)]
    compiled = ts.jit(_with_grads(attend))
    got = compiled(*moved)
    want = reference(q, k, v, R, 0.25, causal=True, mask=mask, segments=(docs, docs))
    _check([np.swapaxes(np.asarray(g), 1, 2) for g in got], want, "seq_dim=1")
    assert "transpose" not in compiled.lower(*moved).schedule


def test_attention_variants_cuda_kernels_emulated(monkeypatch):
    """The GPU target's kernels (generated CUDA run by the CPU emulator)
    with grouped heads, a query block at an offset, a padding mask,
    packed documents, a window and a soft cap: the float64 answer."""
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    monkeypatch.setenv("TESSERA_EMULATE_ARCH", "sm_90a")
    rng = np.random.default_rng()
    q, k, v, R = _qkvr(rng, 1, 4, 2, 32, 64)
    mask = np.ones((1, 1, 1, 64), bool)
    mask[..., :3] = False
    qs, ks = _packed(rng, 1, 64)[:, 32:], _packed(rng, 1, 64)
    qs = ks[:, 32:]

    def attend(q, k, v):
        return op.attention(q, k, v, causal=True, window=20, mask=mask, segment_ids=(qs, ks),
                            softcap=2.0)
    got = ts.jit(_with_grads(attend), target="gpu")(q, k, v, R)
    _check(got, reference(q, k, v, R, 0.25, causal=True, window=20, mask=mask,
                          segments=(qs, ks), softcap=2.0), "gpu")


def test_attention_variant_misuses_are_errors_at_the_callers_line():
    x = np.zeros((1, 4, 8, 16), np.float32)
    k3 = np.zeros((1, 3, 8, 16), np.float32)
    with pytest.raises(ts.errors.ShapeError, match=r"dimension 1 of k and v \(3\) must divide "
                                                   r"q's \(4\).*test_attention_variants"):
        ts.jit(lambda q, k: op.attention(q, k, k))(x, k3)
    with pytest.raises(ts.errors.ShapeError, match=r"mask \[1, 4, 9, 8\] does not broadcast "
                                                   r"to \[1\|1, 1\|4, 1\|8, 8\]"):
        ts.jit(lambda q, m: op.attention(q, q, q, mask=m))(x, np.ones((1, 4, 9, 8), bool))
    with pytest.raises(op.DTypeError, match="mask must be boolean"):
        ts.jit(lambda q, m: op.attention(q, q, q, mask=m))(x, np.ones((1, 1, 8, 8), np.int32))
    with pytest.raises(ts.errors.ArgumentError, match="window=4 must be a positive integer, "
                                                      "with causal=True"):
        ts.jit(lambda q: op.attention(q, q, q, window=4))(x)
    with pytest.raises(ts.errors.ShapeError, match=r"segment_ids \[1, 9\] must be \[1, 8\]"):
        ts.jit(lambda q, s: op.attention(q, q, q, segment_ids=s))(x, np.zeros((1, 9), np.int32))
    with pytest.raises(ts.errors.ArgumentError, match=r"softcap=0.0 must be a positive number"):
        ts.jit(lambda q: op.attention(q, q, q, softcap=0.0))(x)
    with pytest.raises(ts.errors.ShapeError, match=r"pass \(q_segment_ids, kv_segment_ids\)"):
        ts.jit(lambda q, k, s: op.attention(q, k, k, segment_ids=s))(
            x[:, :, :4], x, np.zeros((1, 8), np.int32))


def test_a_mask_that_depends_on_a_differentiated_value_is_an_error():
    """The mask has no gradient: differentiating through one (a learned
    bias) is an error naming it, never a silent zero."""
    x = np.ones((1, 2, 8, 4), np.float32)
    bias = np.zeros((1, 1, 8, 8), np.float32)

    def step(q, b):
        return ts.grad(op.sum(op.attention(q, q, q, mask=op.mul(b, 2.0))), [q, b])
    with pytest.raises(Exception, match="the mask of tgraph.attention depends on a value being "
                                        "differentiated"):
        ts.jit(step)(x, bias)
    # A constant mask is fine, and so is a boolean one made from q (no
    # gradient crosses a comparison): the reference's gradient.
    got = ts.jit(lambda q, b: ts.grad(op.sum(op.attention(q, q, q, mask=b)), [q]))(x, bias)
    assert np.isfinite(np.asarray(got[0])).all()
    rng = np.random.default_rng()
    q, R = rng.standard_normal((1, 2, 8, 4)).astype(np.float32), \
        rng.standard_normal((1, 2, 8, 4)).astype(np.float32)

    def own_mask(q, R):
        keys = op.reshape(q[:, :1, :, 0] > 0, 1, 1, 1, 8)
        return ts.grad(op.sum(op.mul(op.attention(q, q, q, mask=keys), R)), [q])[0]
    got = ts.jit(own_mask)(q, R)
    want = reference(q, q, q, R, 0.5, mask=(q[:, :1, :, 0] > 0).reshape(1, 1, 1, 8))
    np.testing.assert_allclose(np.asarray(got, np.float64), want[1] + want[2] + want[3],
                               rtol=2e-4, atol=3e-5)


def test_int64_segment_ids_out_of_int32_range_fail_the_step():
    x = np.ones((1, 2, 8, 4), np.float32)
    ids = np.zeros((1, 8), np.int64)
    ids[0, 5] = 1 << 40
    with pytest.raises(ts.ValueCheckError, match=r"segment id 1099511627776 .*does not fit in "
                                                 r"int32"):
        ts.jit(lambda q, s: op.attention(q, q, q, segment_ids=s))(x, ids)


def test_bf16_variant_kernels_lower_for_hopper():
    """bf16 with head width 64 on the GPU target (where plain attention's
    loops run on wgmma with TMA-fed, register-resident tiles): grouped
    heads alone, and with a window, a key mask and a query block at an
    offset, and with dropout, lower forward and backward to CUDA (their
    loops in shared memory: no TMA)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng()
    q = rng.standard_normal((1, 8, 128, 64)).astype(bf16)
    k, v = (rng.standard_normal((1, 2, 128, 64)).astype(bf16) for _ in range(2))
    mask = np.ones((1, 1, 1, 128), bool)

    def step(q, k, v):
        def loss(q, k, v):
            grouped = op.attention(q, k, v, causal=True)
            masked = op.attention(q[:, :, 64:], k, v, causal=True, window=32, mask=mask)
            dropped = op.attention(q, k, v, causal=True, dropout_p=0.1, dropout_key=(3, 4))
            return op.add(op.add(op.sum(op.cast(grouped, ts.f32)), op.sum(op.cast(masked, ts.f32))),
                          op.sum(op.cast(dropped, ts.f32)))
        return ts.grad(loss(q, k, v), [q, k, v])
    source = ts.jit(step).lower(q, k, v, target="gpu").cuda
    assert source.count("_attention_") >= 3
    assert source.count("dropout_keeps(") >= 3          # forward, dK/dV and dQ draw the mask


def test_query_and_key_segment_ids_broadcast_each_on_its_own():
    """q's ids shared by the batch ([1, S]) and k's per row ([B, S]), and the
    reverse: each is read with its own leading extent."""
    rng = np.random.default_rng()
    q, k, v, R = _qkvr(rng, 2, 2, 2, 16, 16)
    shared = _packed(rng, 1, 16)
    own = _packed(rng, 2, 16)
    for qs, ks in ((shared, own), (own, shared[0])):
        got = ts.jit(_with_grads(lambda q, k, v: op.attention(q, k, v, segment_ids=(qs, ks))))(
            q, k, v, R)
        want = reference(q, k, v, R, 0.25, segments=(np.broadcast_to(qs, (2, 16)),
                                                      np.broadcast_to(ks, (2, 16))))
        _check(got, want, f"q ids {list(qs.shape)}, k ids {list(np.shape(ks))}")


def test_attention_dropout_forward_and_backward_cpu():
    """Dropout of the probabilities inside the flash kernels: the mask is
    op.dropout's of [B, H, Sq, Sk] (drawn again in the backward), with
    grouped heads and a causal mask, with a padding mask over 3 key blocks,
    and with [B, S, H, D] operands (seq_dim=1: heads indexed the same);
    a step read at run time, values and gradients against float64."""
    rng = np.random.default_rng()
    seed = int(rng.integers(2**40))
    q, k, v, R = _qkvr(rng, 2, 4, 2, 64, 64)
    q2, k2, v2, R2 = _qkvr(rng, 1, 2, 2, 24, 192)
    pad = np.ones((1, 1, 1, 192), bool)
    pad[..., :7] = False

    def step(q, k, v, R, q2, k2, v2, R2, t):
        key = (seed, t)
        gqa = _with_grads(lambda q, k, v: op.attention(q, k, v, causal=True, dropout_p=0.3,
                                                       dropout_key=key))(q, k, v, R)
        padded = _with_grads(lambda q, k, v: op.attention(q, k, v, mask=pad, dropout_p=0.5,
                                                          dropout_key=key))(q2, k2, v2, R2)
        rows = [op.transpose(t, 0, 2, 1, 3) for t in (q, k, v, R)]
        by_rows = _with_grads(lambda q, k, v: op.attention(q, k, v, causal=True, seq_dim=1,
                                                           dropout_p=0.3, dropout_key=key))(*rows)
        return gqa, padded, by_rows

    gqa, padded, by_rows = ts.jit(step)(q, k, v, R, q2, k2, v2, R2, np.int64(3))
    _check(gqa, reference(q, k, v, R, 0.25, causal=True, dropout=(0.3, (seed, 3))), "gqa")
    _check(padded, reference(q2, k2, v2, R2, 0.25, mask=pad, dropout=(0.5, (seed, 3))),
           "padded")
    want = reference(q, k, v, R, 0.25, causal=True, dropout=(0.3, (seed, 3)))
    _check([np.swapaxes(t, 1, 2) for t in by_rows], want, "seq_dim=1")


def test_attention_dropout_cuda_kernels_emulated(monkeypatch):
    """The GPU target's kernels draw the same words (the shared
    philox_word): the CPU's answer, grouped heads and causal."""
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    monkeypatch.setenv("TESSERA_EMULATE_ARCH", "sm_90a")
    rng = np.random.default_rng()
    q, k, v, R = _qkvr(rng, 1, 4, 2, 32, 64)

    def attend(q, k, v):
        return op.attention(q, k, v, causal=True, dropout_p=0.25, dropout_key=(17, 2))
    got = ts.jit(_with_grads(attend), target="gpu")(q, k, v, R)
    _check(got, reference(q, k, v, R, 0.25, causal=True, dropout=(0.25, (17, 2))), "gpu")
