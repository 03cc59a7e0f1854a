"""The `cuda` engine on a real GPU (skipped without cupy and a device): the
GPU-target GPT training step against the CPU engine, a tensor-core GEMM
against cupy.matmul (cuBLAS) and the wgmma GEMMs against numpy, on fresh
random inputs."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:                       # no cupy, no driver, no device
        return False


pytestmark = pytest.mark.skipif(not _gpu_available(), reason="needs cupy and a GPU")


def _gemm_inputs(m: int, k: int, n: int):
    """Fresh bf16 x [m, k], w [k, n] (scaled so x @ w is about unit size), bias [n]."""
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng()
    return (rng.standard_normal((m, k)).astype(bf16),
            (rng.standard_normal((k, n)) / np.sqrt(k)).astype(bf16),
            rng.standard_normal(n).astype(bf16))


def test_bf16_gemm_with_epilogue_matches_cublas():
    import cupy as cp
    import ml_dtypes
    import tessera as ts
    from tessera import op
    bf16 = ml_dtypes.bfloat16
    x, w, b = _gemm_inputs(1024, 512, 768)
    f = ts.jit(lambda x, w, b: op.relu(op.matmul(x, w) + b), target="gpu")
    out = np.asarray(f(x, w, b), np.float64)
    ref = cp.asnumpy(cp.matmul(cp.asarray(x.astype(np.float32)), cp.asarray(w.astype(np.float32))))
    ref = np.maximum(ref.astype(bf16).astype(np.float64) + b.astype(np.float64), 0)
    np.testing.assert_allclose(out, ref, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("config", [(128, 256, 64, (8, 1), 4, True, True),
                                    (128, 128, 64, (8, 1), 3, True, True),
                                    (128, 256, 64, (8, 1), 4, True, False)],
                         ids=["128x256x64-s4-wgmma-tma", "128x128x64-s3-wgmma-tma",
                              "128x256x64-s4-wgmma-cp.async"])
def test_wgmma_gemm_with_epilogue_matches_numpy(config, monkeypatch):
    """The Hopper main loop (wgmma from swizzled shared memory, fed by TMA
    or cp.async, emulated in CI) on the GPU itself: forced onto a small
    GEMM + bias + GELU, against a float64 reference on fresh inputs. This is
    the check of the descriptor, swizzle and tensor-map layouts the emulator
    implements from the PTX ISA and the driver API's documentation."""
    import tessera as ts
    from tessera import op
    options = ts.TargetOptions(target="gpu", target_blocks=1,
                               gemm_configs=(ts.GemmConfig(*config),))
    x, w, b = _gemm_inputs(512, 640, 512)
    f = ts.jit(lambda x, w, b: op.gelu(op.matmul(x, w) + b), target=options)
    out = np.asarray(f(x, w, b), np.float64)
    h = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    ref = 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))
    np.testing.assert_allclose(out, ref, rtol=0.03, atol=0.03)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gpt_training_step_on_gpu_matches_cpu(precision):
    import tessera as ts
    sys.path.insert(0, str(ROOT / "examples"))
    import train_gpt as g
    step, args = g.step_case(128, 2, 4, 8, 32, precision,
                             seed=int(np.random.default_rng().integers(1 << 30)))
    cpu = step(*args)
    gpu = ts.jit(step.fn, target="gpu")(*args)
    np.testing.assert_allclose(float(gpu[0]), float(cpu[0]), rtol=1e-3 if precision == "bf16" else 1e-5)
    for a, c in zip(ts._pytree.flatten(gpu[1])[0], ts._pytree.flatten(cpu[1])[0]):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(c, np.float64),
                                   atol=5e-4 if precision == "bf16" else 1e-4)
