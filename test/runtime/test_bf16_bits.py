"""bf16 as bit patterns (tessera_runtime.bf16), with numpy standing in for
cupy: the conversions and the per-step rounding the NCCL engine's
deterministic tree uses give ml_dtypes' bits, so NCCL and MPI agree."""

import numpy as np
import pytest

from tessera_runtime import bf16
from tessera_runtime.comm import tree_reduce

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16


def _wide(rng, shape):
    """Values over 8 decades, so sums depend on their order and rounding."""
    return rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 4, shape)


def test_conversions_round_to_nearest_even_like_ml_dtypes():
    rng = np.random.default_rng()
    x = np.concatenate([_wide(rng, 4096), [0.0, -0.0, np.inf, -np.inf, 1 + 2 ** -8,
                                           1 + 3 * 2 ** -8, 3.4e38]]).astype(np.float32)
    bits = bf16.from_f32(np, x)
    assert np.array_equal(bits, x.astype(BF16).view(np.uint16))
    assert np.array_equal(bf16.to_f32(np, bits), x.astype(BF16).astype(np.float32))
    assert np.isnan(bf16.to_f32(np, bf16.from_f32(np, np.array([np.nan], np.float32))))


@pytest.mark.parametrize("ranks", [2, 3, 4, 5])
@pytest.mark.parametrize("reduction", ["add", "maximum", "multiply"])
def test_tree_over_bits_matches_the_tree_over_ml_dtypes_arrays(ranks, reduction):
    """What the NCCL engine computes for a deterministic bf16 reduction (uint16
    blocks, `bits_ufunc`) and what the MPI engine computes (ml_dtypes arrays,
    numpy's ufunc) are the same bits, for every tree shape up to 5 ranks."""
    rng = np.random.default_rng()
    ufunc = getattr(np, reduction)
    values = [(_wide(rng, (64, 33)) if reduction != "multiply"
               else 0.75 + 0.5 * rng.random((64, 33))).astype(BF16) for _ in range(ranks)]
    on_host = np.empty((64, 33), BF16)
    tree_reduce(values, ufunc, on_host)
    over_bits = np.empty((64, 33), np.uint16)
    tree_reduce(np.stack([v.view(np.uint16) for v in values]), bf16.bits_ufunc(np, ufunc),
                over_bits)
    assert np.array_equal(over_bits, on_host.view(np.uint16))
    # and it is a bf16 reduction: within bf16 rounding of the float64 one
    exact = ufunc.reduce(np.stack(values).astype(np.float64), axis=0)
    if reduction != "add":          # sums of wide values may cancel
        np.testing.assert_allclose(on_host.astype(np.float64), exact, rtol=ranks * 2.0 ** -8)
