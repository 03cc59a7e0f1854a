"""Shared helpers for the Python-level tests: running scripts as MPI jobs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"

# The live comparison with transformers runs where it is installed; elsewhere
# (CI) the file is not collected at all, rather than skipped: the committed
# fixtures are the check there (test_pretrained.py).
collect_ignore = [] if all(importlib.util.find_spec(m) for m in ("torch", "transformers")) \
    else ["test_transformers_live.py"]


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
        # One BLAS thread per rank and one str hash, as `tessera launch` sets:
        # N ranks each spinning one thread per core oversubscribe the machine.
        full_env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                    "PYTHONHASHSEED": "0", **os.environ,
                    "TESSERA_CACHE_DIR": str(tmp_path / "cache"), **(env or {})}
        return subprocess.run([mpiexec, "-n", str(n), sys.executable, str(script), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=str(REPO))
    return run


@pytest.fixture
def tessera_launch():
    """tessera_launch(*args, env=None, timeout=120) -> CompletedProcess of
    `tessera launch ARGS`, as a user runs it (from the repository root)."""
    def run(*args, env=None, timeout=120):
        return subprocess.run([sys.executable, "-m", "tessera", "launch", *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, cwd=str(REPO),
                              env={**os.environ, **(env or {})})
    return run


#: Cache kinds whose files are named by the hash of everything they are
#: built from (source, compiler and its version, flags, linked libraries):
#: a file there is the same whichever test built it, as in ccache.
SHARED_BUILD_KINDS = ("kernels", "emulated", "nvrtc")


@pytest.fixture(scope="session")
def _shared_builds(tmp_path_factory):
    return tmp_path_factory.mktemp("builds")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch, _shared_builds):
    """Each test has its own cache (bundles, calibrations, autotuning), so
    none sees another's programs; compiled kernels, content-addressed, are
    shared by the session (the same GPT step's kernels were built a dozen
    times otherwise). A test that checks when builds happen sets
    TESSERA_CACHE_DIR itself."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for kind in SHARED_BUILD_KINDS:
        (_shared_builds / kind).mkdir(exist_ok=True)
        (cache / kind).symlink_to(_shared_builds / kind, target_is_directory=True)
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(cache))


@pytest.fixture
def built_cleanly():
    """check(source, arch="sm_90a", spill_bytes=0, serialized_by=None):
    nvcc builds the CUDA `source` for `arch`, and ptxas reports for every
    kernel at most `spill_bytes` of spill stores and loads, and no
    serialized wgmma (which makes the asynchronous kernel a synchronous
    one) unless for the known reason `serialized_by`. Returns ptxas's
    report per (extern "C") kernel; skips the test where nvcc is missing."""
    from tessera_compiler.codegen.build import kernel_resources, nvcc

    def check(source: str, arch: str = "sm_90a", spill_bytes: int = 0,
              serialized_by: str | None = None) -> dict:
        if nvcc() is None:
            pytest.skip("nvcc is not installed on this machine")
        # Mangled names are library device functions ptxas reports beside the
        # kernels (NVSHMEM's, in relocatable builds): not Tessera's to judge.
        reports = {k: r for k, r in kernel_resources(source, arch).items()
                   if not k.startswith("_Z")}
        assert reports, "ptxas reported no kernel"
        for kernel, used in reports.items():
            assert used.get("spill_stores", 0) <= spill_bytes, (arch, kernel, used)
            assert used.get("spill_loads", 0) <= spill_bytes, (arch, kernel, used)
            assert used.get("wgmma_serialized", serialized_by) == serialized_by, \
                (arch, kernel, used)
        return reports
    return check
