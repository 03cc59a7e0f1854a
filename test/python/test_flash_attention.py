"""Fused attention (`tgraph.attention`, `tgraph.attention_grad`) compiled to
flash-attention Tile IR kernels, forward and backward, against a float64
numpy reference on fresh random inputs: on the CPU engine (generated C++)
and on the GPU target's generated CUDA run by the CPU emulator."""

import re

import numpy as np
import pytest

import tessera as ts
from tessera import op

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16


def reference(q, k, v, R, causal, scale):
    """out and d(sum(out * R))/d(q, k, v) in float64."""
    q, k, v, R = (np.asarray(t, np.float64) for t in (q, k, v, R))
    s = np.einsum("...id,...jd->...ij", q, k) * scale
    if causal:
        S = q.shape[-2]
        s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = p @ v
    dv = np.swapaxes(p, -1, -2) @ R
    dp = R @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return out, ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv


def _inputs(shape_q, dv, dtype, rng):
    q, k = (rng.standard_normal(shape_q).astype(dtype) for _ in range(2))
    v = rng.standard_normal(shape_q[:-1] + (dv,)).astype(dtype)
    R = rng.standard_normal(shape_q[:-1] + (dv,)).astype(np.float32)
    return q, k, v, R


def _step(causal, scale=None):
    def step(q, k, v, R):
        def loss(q, k, v):
            out = op.attention(q, k, v, causal=causal, scale=scale)
            return op.sum(op.mul(op.cast(out, ts.f32), R))
        out = op.attention(q, k, v, causal=causal, scale=scale)
        return (out,) + tuple(ts.grad(loss(q, k, v), [q, k, v]))
    return step


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape_q,dv", [((2, 3, 192, 16), 16), ((130, 8), 24)],
                         ids=["BHSD-3blocks", "SD-v-wider"])
def test_flash_attention_forward_and_backward_fp32_cpu(causal, shape_q, dv):
    """Several key/value blocks per query block (S=192 with 64-row blocks),
    a value width other than the query width, and a sequence length (130)
    that blocks unevenly."""
    rng = np.random.default_rng()
    q, k, v, R = _inputs(shape_q, dv, np.float32, rng)
    scale = float(rng.uniform(0.1, 0.5))
    got = ts.jit(_step(causal, scale))(q, k, v, R)
    for name, g, want in zip(("out", "dq", "dk", "dv"), got, reference(q, k, v, R, causal, scale)):
        np.testing.assert_allclose(np.asarray(g, np.float64), want, rtol=2e-4, atol=2e-5,
                                   err_msg=name)


def _along(seq_dim, causal):
    """_step over [B, S, H, D] operands attending along `seq_dim` (1 or -3)."""
    def step(q, k, v, R):
        def loss(q, k, v):
            out = op.attention(q, k, v, causal=causal, seq_dim=seq_dim)
            return op.sum(op.mul(out, R))
        return (op.attention(q, k, v, causal=causal, seq_dim=seq_dim),) + \
            tuple(ts.grad(loss(q, k, v), [q, k, v]))
    return step


def _heads_first(*arrays):
    return tuple(np.swapaxes(t, 1, 2) for t in arrays)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("seq_dim", [1, -3])
def test_attention_along_seq_dim_reads_rows_where_they_lie_cpu(causal, seq_dim):
    """`seq_dim=1` over [B, S, H, D] operands (a projection reshaped per
    head) equals attention over the [B, H, S, D] transposes, forward and
    backward, and compiles to no transpose at all: the kernels' tiles take
    every H-th row (`ttile.load {dims}`). S=96 blocks unevenly (48-row
    blocks, two per sequence)."""
    rng = np.random.default_rng()
    q, k, v, R = _inputs((2, 96, 3, 16), 16, np.float32, rng)
    compiled = ts.jit(_along(seq_dim, causal))
    got = compiled(q, k, v, R)
    want = reference(*_heads_first(q, k, v, R), causal, 1 / np.sqrt(16))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.swapaxes(w, 1, 2),
                                   rtol=2e-4, atol=2e-5, err_msg=name)
    levels = compiled.lower(q, k, v, R)
    assert "transpose" not in levels.schedule
    assert "dims = array<i64: 1, 3>" in levels.tile


def test_attention_reads_q_k_v_from_the_projection_and_writes_its_gradient_there(monkeypatch,
                                                                                tmp_path):
    """tessera-fold-slices: q, k, v = qkv[:, :, :, i] of one [B, S, H, 3, D]
    buffer (op.transformer_block's projection) reach attention along
    seq_dim=1 with no slice copies: the kernels read qkv at index i of
    dimension 3. The gradient of qkv is no concat: the backward kernels
    store dq, dk and dv into it at their index. Output and gradient match
    float64 numpy, with the bits of the program compiled without the pass."""
    from tessera_compiler import lowering
    rng = np.random.default_rng()
    qkv = rng.standard_normal((2, 96, 3, 3, 16)).astype(np.float32)
    R = rng.standard_normal((2, 96, 3, 16)).astype(np.float32)

    def step(qkv, R):
        def attend(qkv):
            return op.attention(*(qkv[:, :, :, i] for i in range(3)), causal=True, seq_dim=1)
        return attend(qkv), ts.grad(op.sum(op.mul(attend(qkv), R)), [qkv])[0]

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "folded"))
    folded = ts.jit(step)
    out, grad = folded(qkv, R)
    tile = folded.lower(qkv, R).tile
    assert 'tsched.library = "slice"' not in tile and 'tsched.library = "concat"' not in tile
    want = reference(*_heads_first(*(qkv[:, :, :, i] for i in range(3)), R), True,
                     1 / np.sqrt(16))
    np.testing.assert_allclose(np.asarray(out, np.float64), np.swapaxes(want[0], 1, 2),
                               rtol=2e-4, atol=2e-5)
    for i, name in enumerate("qkv"):
        np.testing.assert_allclose(np.asarray(grad, np.float64)[:, :, :, i],
                                   np.swapaxes(want[1 + i], 1, 2), rtol=2e-4, atol=2e-5,
                                   err_msg=f"d{name}")
    monkeypatch.setattr(lowering, "STAGES", [(stage, [f for f in flags if f != "tessera-fold-slices"])
                                             for stage, flags in lowering.STAGES])
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "plain"))
    plain = ts.jit(step)
    assert 'tsched.library = "slice"' in plain.lower(qkv, R).tile
    for a, b in zip(plain(qkv, R), (out, grad)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_attention_seq_dim_must_come_before_the_head_width():
    x = np.zeros((2, 8, 3, 4), np.float32)
    for bad in (3, -1, 4, -5):
        with pytest.raises(ts.errors.ShapeError, match=rf"seq_dim={bad} is not a dimension"):
            ts.jit(lambda q: op.attention(q, q, q, seq_dim=bad))(x)


def test_flash_attention_bf16_under_autocast_cpu():
    """bf16 operands (tensor-core precision): f32 softmax and accumulation,
    probabilities rounded to bf16 before they multiply V."""
    rng = np.random.default_rng()
    q, k, v, R = _inputs((1, 2, 128, 32), 32, np.float32, rng)

    def step(q, k, v, R):
        with ts.autocast(dtype=ts.bf16):
            return _step(True)(q, k, v, R)
    got = ts.jit(step)(q, k, v, R)
    assert np.asarray(got[0]).dtype == BF16
    for name, g, want in zip(("out", "dq", "dk", "dv"), got,
                             reference(*(t.astype(BF16) for t in (q, k, v)), R, True,
                                       1 / np.sqrt(32))):
        err = np.abs(np.asarray(g, np.float64) - want).max() / np.abs(want).max()
        assert err < 0.03, (name, err)


def test_attention_never_materializes_the_score_matrix():
    """The compiled program holds no [S, S] buffer, forward or backward, and
    causal kernels stop their key loop at the diagonal block. The CPU's
    backward is one kernel (`_bwd`: dQ added in its buffer from the blocks
    that make dK and dV), the GPU's the pair `_dkdv`, `_dq`."""
    rng = np.random.default_rng()
    q, k, v, R = _inputs((1, 2, 256, 16), 16, np.float32, rng)
    levels = ts.jit(_step(True)).lower(q, k, v, R)
    assert "256x256" not in levels.schedule and "256x256" not in levels.tile
    tile = levels.tile
    kernels = re.findall(r"ttile\.kernel @(\w+)\(", tile)
    assert any(re.fullmatch(r"\w+_attention_\d+", k) for k in kernels), kernels
    assert [k for k in kernels if "attention_grad" in k and k.endswith("_bwd")], kernels
    assert not [k for k in kernels if k.endswith(("_dkdv", "_dq"))], kernels
    gpu = ts.jit(_step(True), target="gpu").lower(q, k, v, R).tile
    gpu_kernels = re.findall(r"ttile\.kernel @(\w+)\(", gpu)
    for suffix in ("_dkdv", "_dq"):
        assert [k for k in gpu_kernels if k.endswith(suffix)], (suffix, gpu_kernels)
    assert tile.count("ttile.transpose") >= 4           # K^T, V^T, P^T, dS^T
    assert "arith.divui" in tile                          # causal loop bounds


def test_attention_lowering_errors_name_the_line():
    with pytest.raises(ts.errors.ShapeError, match=r"op.attention: q \[4, 8\].*test_flash"):
        ts.jit(lambda q, k: op.attention(q, k, k))(np.zeros((4, 8), np.float32),
                                                   np.zeros((5, 7), np.float32))
    with pytest.raises(op.DTypeError, match="op.attention: operand dtypes differ"):
        ts.jit(lambda q, k: op.attention(q, k, k))(np.zeros((4, 8), np.float32),
                                                   np.zeros((4, 8), np.float64))


@pytest.mark.parametrize("dtype,d,causal,seq,arch", [
    ("fp32", 32, True, 128, "sm_90a"), ("bf16", 32, True, 128, "sm_90a"),
    ("bf16", 96, True, 128, "sm_90a"), ("bf16", 128, True, 192, "sm_90a"),
    ("bf16", 128, True, 192, "sm_90"), ("bf16", 64, False, 192, "sm_90a")],
    ids=["fp32-32", "bf16-32", "bf16-96", "bf16-128-wgmma", "bf16-128-plain-sm90",
         "bf16-64-full-3blocks-wgmma"])
def test_flash_attention_cuda_kernels_emulated(dtype, d, causal, seq, arch, monkeypatch):
    """The GPU target's attention kernels (forward, dK/dV, dQ), generated as
    CUDA and run by the CPU emulator, against float64. In bf16 every dot
    runs on tensor cores (64x64 blocks, except the backward's at D=96 and
    128: 64x32, 32x64 for dK/dV), and the loops keep their tiles in
    registers (register_loop.py); three 64-key blocks per query block
    (S=192) run the ring through a full cycle. At head widths that are
    whole 128-byte swizzle atoms (64, 128) every dot is a wgmma on sm_90a
    (B from the swizzled ring, N-major or K-major, which TMA fills, or
    cp.async for dK/dV at D=128; A from registers or, when invariant, from
    shared memory), and mma.sync on plain sm_90 with cp.async (where dK/dV's
    key block is in shared memory at D=128: its accumulators take the
    registers)."""
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    monkeypatch.setenv("TESSERA_EMULATE_ARCH", arch)
    rng = np.random.default_rng()
    q, k, v, R = _inputs((2, 1, seq, d), d, np.float32, rng)

    def step(q, k, v, R):
        if dtype == "bf16":
            with ts.autocast(dtype=ts.bf16):
                return _step(causal)(q, k, v, R)
        return _step(causal)(q, k, v, R)
    compiled = ts.jit(step, target="gpu")
    got = compiled(q, k, v, R)
    if dtype == "bf16":
        source = (compiled._bundles[compiled._last_key] / "kernels" / "kernels.cu").read_text()
        attention = source[source.index("_attention_"):]
        assert attention.count("scf.for with its tiles in registers") == 3
        assert "on tensor cores (mma.sync.m16n8k16) from shared memory" not in attention
        assert attention.count("A from shared memory (ldmatrix)") == (1 if d == 128 else 0)
        assert "on CUDA cores" not in attention
        # forward 2 dots, dK/dV 4, dQ 3; the invariant A operands (Q; K, V; Q, dO) from shared memory
        assert attention.count(" on wgmma: A from") == (9 if d % 64 == 0 else 0)
        assert attention.count("on wgmma: A from its swizzled shared-memory copy") == \
            (5 if d % 64 == 0 else 0)
        # TMA fills the wgmma loops' rings, but dK/dV's at D=128 (it would spill).
        assert attention.count("(TMA for wgmma, cp.async for mma.sync,") == \
            {64: 3, 128: 2}.get(d, 0)
    ops = (q, k, v) if dtype == "fp32" else tuple(t.astype(BF16) for t in (q, k, v))
    tol = 2e-4 if dtype == "fp32" else 0.03
    for name, g, want in zip(("out", "dq", "dk", "dv"), got,
                             reference(*ops, R, causal, 1 / np.sqrt(d))):
        err = np.abs(np.asarray(g, np.float64) - want).max() / np.abs(want).max()
        assert err < tol, (name, err)


def test_attention_along_seq_dim_on_the_gpu_target_emulated(monkeypatch):
    """The GPU kernels read [..., S, D] tiles: on the GPU target
    tessera-lower-to-schedule transposes a `seq_dim=1` attention's operands
    there and its results back, and the CUDA (run by the emulator) gives
    the CPU's answer."""
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    monkeypatch.setenv("TESSERA_EMULATE_ARCH", "sm_90a")
    rng = np.random.default_rng()
    q, k, v, R = _inputs((1, 64, 2, 16), 16, np.float32, rng)
    compiled = ts.jit(_along(1, True), target="gpu")
    got = compiled(q, k, v, R)
    assert "transpose" in compiled.lower(q, k, v, R).schedule
    want = reference(*_heads_first(q, k, v, R), True, 1 / np.sqrt(16))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        err = np.abs(np.asarray(g, np.float64) - np.swapaxes(w, 1, 2)).max() / np.abs(w).max()
        assert err < 2e-4, (name, err)


@pytest.mark.parametrize("d, arch", [(64, "sm_90a"), (128, "sm_90a"), (128, "sm_90")])
def test_bf16_attention_kernels_compile_for_sm90_without_spills(d, arch, built_cleanly):
    """The benchmark's shapes (causal, bf16, D=64 and 128) compiled by nvcc
    for sm_90a (every dot a wgmma) and, at D=128 where registers are
    tightest, plain sm_90 (mma.sync): every attention kernel builds, and
    none spills registers (ptxas -v), so the register-resident loops fit
    the register file."""
    q = np.zeros((1, 2, 256, d), BF16)

    def step(q, k, v, do):
        def loss(q, k, v):
            return op.sum(op.mul(op.cast(op.attention(q, k, v, causal=True), ts.f32),
                                 op.cast(do, ts.f32)))
        return (op.attention(q, k, v, causal=True),) + tuple(ts.grad(loss(q, k, v), [q, k, v]))
    source = ts.jit(step).lower(q, q, q, q, target="gpu").cuda
    attention = source[source.index("_attention_"):]
    assert attention.count("scf.for with its tiles in registers") == 3
    assert attention.count(" on wgmma: A from") == 9        # sm_90a's branch of the 3 loops
    reports = [k for k in built_cleanly(source, arch) if "_attention_" in k]
    assert len(reports) == 3, reports


def _emulated_causal_forward(d: int, monkeypatch, **changes):
    """The causal bf16 attention forward (S=256, D=d) compiled for the GPU
    with the TargetOptions `changes` and run by the CPU emulator for
    sm_90a: (its CUDA source, its largest error relative to float64)."""
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    monkeypatch.setenv("TESSERA_EMULATE_ARCH", "sm_90a")
    rng = np.random.default_rng()
    q, k, v, R = _inputs((1, 2, 256, d), d, np.float32, rng)
    q, k, v = (t.astype(BF16) for t in (q, k, v))
    compiled = ts.jit(lambda q, k, v: op.attention(q, k, v, causal=True),
                      target=ts.TargetOptions(target="gpu", **changes))
    got = compiled(q, k, v)
    source = (compiled._bundles[compiled._last_key] / "kernels" / "kernels.cu").read_text()
    want = reference(q, k, v, R, True, 1 / np.sqrt(d))[0]
    return source, np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max()


@pytest.mark.parametrize("pingpong", [False, True], ids=["", "pingpong"])
@pytest.mark.parametrize("d", [64, 128])
def test_forward_blocks_of_two_warpgroups_emulated(d, pingpong, monkeypatch, built_cleanly):
    """Forward blocks of 128 query rows (tile/flash_attention.py: MAX_WARPS = 8
    warps of 16 rows: two warpgroups, each a wgmma of M = 64 on the same
    staged key/value tiles), as the benchmark's `wgmma:128x64` variant
    asks, and with the warpgroups taking turns at the tensor cores
    (`wgmma-pingpong:128x64`: each waits on its named barrier before issuing
    a wgmma and hands the turn over after; warpgroup 1 gives warpgroup 0
    the first turn, warpgroup 0 takes the last hand-over): the causal bf16
    forward, generated as CUDA and run by the CPU emulator for sm_90a
    (which stops on a named barrier wait nobody completes, or arrivals
    left at the block's end), against float64; at D=128 nvcc builds it
    for sm_90a without spilling."""
    source, err = _emulated_causal_forward(
        d, monkeypatch, pingpong=pingpong,
        attention_forward_blocks={64: (128, 64), 128: (128, 64), 256: (16, 16)})
    assert "block (256)" in source and "8 warps x 16 rows" in source
    assert source.count("ttile.dot 128x") == 4          # Q K^T and P V, on wgmma and mma.sync
    assert source.count(" on wgmma: A from") == 2
    turns = ["tessera_named_barrier_sync(1 + (threadIdx.x >> 7), 256);",
             "tessera_named_barrier_arrive(2 - (threadIdx.x >> 7), 256);"]
    assert [source.count(t) for t in turns] == [2 * pingpong] * 2      # around both wgmmas
    assert ("if (it == 0 && (threadIdx.x >> 7) == 1) tessera_named_barrier_arrive(1, 256);"
            in source) == pingpong
    assert ("if (n_it > 0 && (threadIdx.x >> 7) == 0) tessera_named_barrier_sync(1, 256);"
            in source) == pingpong
    assert err < 0.03, err
    if d == 128:
        built_cleanly(source)


def test_pingpong_on_a_loop_without_two_wgmma_warpgroups_is_an_emit_error(monkeypatch):
    """`ttile.pingpong` asks the register loop's two warpgroups to take
    turns issuing wgmmas: on a loop whose dots run on mma.sync it cannot
    be honoured, and the CUDA emitter says so at the loop instead of
    dropping it."""
    from tessera_compiler.codegen.tile_emitter import EmitError
    from tessera_compiler.translate import ttile_to_cuda
    from tessera_mlir import ir
    options = ts.TargetOptions(target="gpu", pingpong=True, attention_forward_blocks={
        64: (128, 64), 128: (128, 64), 256: (16, 16)})
    q = np.zeros((1, 2, 256, 64), BF16)
    tile = ts.graph.trace(lambda q, k, v: op.attention(q, k, v, causal=True), q, q, q,
                          target=options).tile
    assert "{ttile.pingpong}" in tile
    mma_sync = tile.replace(", wgmma}", "}").replace(" {tma}", "")
    assert mma_sync.count("wgmma") == 0 and "tma}" not in mma_sync
    with ir.Context(), pytest.raises(EmitError, match="ttile.pingpong on a loop that is not "
                                                      "wgmma over two warpgroups"):
        ttile_to_cuda(ir.Module.parse(mma_sync))


@pytest.mark.parametrize("blocks, d", [((64, 64), 64), ((64, 64), 128), ((128, 64), 64)])
def test_forward_issuing_the_next_scores_ahead_emulated(blocks, d, monkeypatch, built_cleanly):
    """TargetOptions.issue_ahead (the bench's `wgmma-ahead`
    variants): the forward loop on a 3-stage TMA ring waits for its own
    S = Q K^T, then issues the next iteration's from the next slot once
    that slot's copies have landed, and computes its softmax and P V
    under it; the next scores move to the current ones at the iteration's
    end. Run by the CPU emulator for sm_90a (where a wgmma reads its
    operands only when waited for, and a TMA slot reads as NaN until its
    phase is waited on) against float64, and built for sm_90a without
    spilling."""
    source, err = _emulated_causal_forward(
        d, monkeypatch, issue_ahead=True,
        attention_forward_blocks={64: blocks, 128: blocks, 256: (16, 16)})
    assert "staged through 3 shared-memory buffers" in source
    assert "the first dot of the next iteration issued before this one's rest" in source
    assert "tessera_mbarrier_wait(&full[(it + 1) % 3], (unsigned)((it + 1) / 3) & 1);" in source
    assert err < 0.03, err
    built_cleanly(source)
