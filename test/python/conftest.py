"""Shared helpers for the Python-level tests: running scripts as MPI jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"


def mpiexec_path() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


@pytest.fixture
def run_mpi(tmp_path):
    """run_mpi(n, script, *args, env=None, timeout=120) -> CompletedProcess."""
    mpiexec = mpiexec_path()
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install mpich)")

    def run(n, script, *args, env=None, timeout=120):
        # One BLAS thread per rank, as `tessera launch` sets: N ranks each
        # spinning one thread per core oversubscribe the machine badly.
        full_env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **os.environ,
                    "TESSERA_CACHE_DIR": str(tmp_path / "cache"), **(env or {})}
        return subprocess.run([mpiexec, "-n", str(n), sys.executable, str(script), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=str(REPO))
    return run


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
