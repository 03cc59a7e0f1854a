"""The NCCL engine's communicators, on a machine with a GPU (skipped
otherwise): 2 ranks on the available GPU(s), every collective against numpy,
and deterministic all_reduce bit for bit against the MPI engine."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _gpu_available() -> bool:
    try:
        import cupy
        from cupy.cuda import nccl  # noqa: F401
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:                       # no cupy, no driver, no device
        return False


@pytest.mark.skipif(not _gpu_available(), reason="needs cupy with NCCL and a GPU")
def test_nccl_collectives_and_deterministic_bits_match_mpi():
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = shutil.which("mpiexec")
    env = {**os.environ, "NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, str(HERE / "nccl_worker.py")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("all_reduce sum", "all_gather dim=1", "reduce_scatter dim=1", "all_to_all 1->0",
                 "deterministic all_reduce: NCCL bits == MPI bits",
                 "deterministic all_reduce bf16: NCCL bits == MPI bits"):
        assert proc.stdout.count(f" {name};") == 2, proc.stdout
