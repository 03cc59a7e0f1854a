"""op.dropout (issue 62, item 1): a counter-based mask keyed by (seed, step,
global element index). The generator is checked against Random123's
published answers for Philox-4x32-10; dropout against a numpy reference
drawn from it, its statistics, its gradient, a step passed at run time, and
blocks of a split tensor (the same words as the whole; the 4-rank dp x tp
run is in test_end_to_end's mesh2d job)."""

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera_runtime import random


# Random123's kat_vectors for philox4x32_R(10, counter, key) -> words.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


@pytest.mark.parametrize("counter, key, want", KAT)
def test_philox_matches_random123s_known_answers(counter, key, want):
    got = random.philox4x32([np.uint32(c) for c in counter], [np.uint32(k) for k in key])
    assert [int(w) for w in got] == list(want)


def _reference(x, p, seed, step):
    """Dropout by its definition, one element at a time from the generator."""
    flat = x.reshape(-1)
    out = np.zeros_like(flat)
    for e in range(flat.size):
        c = [np.uint32(e // 4 & 0xffffffff), np.uint32(e // 4 >> 32),
             np.uint32(step & 0xffffffff), np.uint32(step >> 32)]
        word = int(random.philox4x32(c, [np.uint32(seed & 0xffffffff),
                                         np.uint32(seed >> 32)])[e % 4])
        if word >> 8 >= round(p * 2 ** 24):
            out[e] = flat[e] * np.float32(1 / (1 - p))
    return out.reshape(x.shape)


def test_blocks_of_a_split_tensor_draw_the_words_of_the_whole():
    key = np.array([7, 3], np.int64)
    shape = (6, 10, 12)
    whole = random.random_words(key, random.global_index(shape))
    for blocks in ([(1, 2), (0, 1), (2, 3)], [(0, 3), (4, 5), (0, 1)], [(0, 1), (1, 2), (1, 4)]):
        local = tuple(n // c for n, (_, c) in zip(shape, blocks))
        box = tuple(slice(i * n, (i + 1) * n) for n, (i, _) in zip(local, blocks))
        got = random.random_words(key, random.global_index(local, blocks))
        assert np.array_equal(got, whole[box]), blocks       # aligned and unaligned runs


@pytest.mark.parametrize("shape, p", [((5, 7), 0.5), ((3, 4, 8), 0.1), ((33,), 0.9)])
def test_dropout_matches_its_definition(shape, p):
    seed, step = int(np.random.SeedSequence().entropy % 2**40), 5
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    got = ts.jit(lambda x: op.dropout(x, p, (seed, step)))(x)
    np.testing.assert_array_equal(got, _reference(x, p, seed, step))


def test_dropout_drops_at_its_rate_and_keeps_the_mean():
    x = np.ones((256, 256), np.float32)
    for p in (0.1, 0.5):
        y = op.dropout(x, p, 11)                    # eagerly, outside ts.jit
        dropped = float((y == 0).mean())
        assert abs(dropped - p) < 6 * np.sqrt(p * (1 - p) / x.size), (p, dropped)
        assert abs(float(y.mean()) - 1.0) < 0.02
        assert set(np.unique(y)) == {0.0, np.float32(1 / (1 - p))}


def test_a_step_passed_at_run_time_draws_a_new_mask_each_step():
    x = np.random.default_rng().standard_normal((8, 16)).astype(np.float32)
    step_fn = ts.jit(lambda x, step: op.dropout(x, 0.5, (3, step)))
    masks = []
    for step in range(3):
        got = step_fn(x, np.int64(step))
        np.testing.assert_array_equal(got, _reference(x, 0.5, 3, step))
        masks.append(got != 0)
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
    # The same key again: the same mask (reproducible), from a [2] tensor too.
    again = ts.jit(lambda x, k: op.dropout(x, 0.5, k))(x, np.array([3, 1], np.int64))
    assert np.array_equal(again != 0, masks[1])


def test_the_gradient_applies_the_same_mask():
    rng = np.random.default_rng()
    x = rng.standard_normal((6, 12)).astype(np.float32)
    r = rng.standard_normal((6, 12)).astype(np.float32)

    @ts.jit
    def step(x, r):
        y = op.dropout(op.tanh(x), 0.3, (9, 2))
        return y, ts.grad(op.sum(op.mul(y, r)), [x])[0]

    y, dx = step(x, r)
    keep = _reference(np.ones_like(x), 0.3, 9, 2)     # 0 or 1/(1-p)
    np.testing.assert_allclose(y, np.tanh(x) * keep, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, r * keep * (1 - np.tanh(x.astype(np.float64)) ** 2),
                               rtol=1e-5, atol=1e-6)


def test_rates_zero_and_one():
    x = np.array([[1.0, np.inf], [-2.0, 3.0]], np.float32)
    np.testing.assert_array_equal(ts.jit(lambda x: op.dropout(x, 0.0, 1))(x), x)
    np.testing.assert_array_equal(ts.jit(lambda x: op.dropout(x, 1.0, 1))(x), np.zeros_like(x))


def test_the_gpu_target_draws_the_same_mask(monkeypatch):
    """The GPU engine runs the same generator over its array module (the
    CUDA emulator here): the CPU's bits, value and gradient."""
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    monkeypatch.setenv("TESSERA_EMULATE_ARCH", "sm_90a")
    x = np.random.default_rng().standard_normal((4, 24)).astype(np.float32)

    def step(x):
        return ts.grad(op.sum(op.mul(op.dropout(x, 0.4, (5, 6)), x)), [x])[0]
    np.testing.assert_array_equal(ts.jit(step, target="gpu")(x), ts.jit(step)(x))
    np.testing.assert_allclose(ts.jit(step, target="gpu")(x),
                               2 * x * _reference(np.ones_like(x), 0.4, 5, 6), rtol=1e-6)
