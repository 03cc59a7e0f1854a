"""Generated kernel sources compile: C++ with the host compiler (and run, in the
other tests), CUDA C++ with nvcc for sm_90 where nvcc exists."""

import subprocess

import numpy as np
import pytest

from tessera import dist, graph, op
from tessera_compiler.codegen.build import KernelBuildError, build_cuda_object, nvcc


def _trace():
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    rng = np.random.default_rng(0)
    x = dist.from_numpy(rng.standard_normal((64, 96)).astype(np.float32), mesh=mesh)
    w1 = dist.from_numpy(rng.standard_normal((96, 256)).astype(np.float32),
                         dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh)
    w2 = dist.from_numpy(rng.standard_normal((256, 96)).astype(np.float32),
                         dist.ShardSpec(partition=("row",), mesh_axes=("tp",)), mesh)

    def mlp(x, w1, w2):
        return op.matmul(op.relu(op.matmul(x, w1)), w2)
    return graph.trace(mlp, x, w1, w2, mesh=mesh, target="gpu")


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed on this machine")
def test_generated_cuda_compiles_for_sm90():
    trace = _trace()
    obj = build_cuda_object(trace.cuda)
    assert obj.stat().st_size > 0
    symbols = subprocess.run(["nm", str(obj)], capture_output=True, text=True).stdout
    for kernel in ("mlp_matmul_0_fused2", "mlp_matmul_2"):
        assert kernel in symbols


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed on this machine")
def test_nvcc_errors_are_reported():
    with pytest.raises(KernelBuildError, match="nvcc failed"):
        build_cuda_object('extern "C" __global__ void broken() { this is not cuda; }')


def test_kernel_library_is_cached_by_content(tmp_path, monkeypatch):
    from tessera_compiler.codegen.build import build_cpu_library
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    src = _trace().cpp
    first = build_cpu_library(src)
    mtime = first.stat().st_mtime_ns
    assert build_cpu_library(src) == first and first.stat().st_mtime_ns == mtime
    assert build_cpu_library(src + "\n// changed\n") != first
