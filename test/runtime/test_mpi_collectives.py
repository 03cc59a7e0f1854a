"""MPI collectives and multi-rank programs, run with `mpiexec -n N` in a subprocess.

The checks themselves live in mpi_worker_collectives.py (each rank compares
against numpy); this file launches it and checks that every rank finished.
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_bundle_util import (TP_KERNELS, compile_kernels, dp_tp_program, find_mpiexec,
                                 kernels_cpp, subprocess_env, tp_program, write_bundle)

WORKER = Path(__file__).resolve().parent / "mpi_worker_collectives.py"
MPIEXEC = find_mpiexec()
TIMEOUT_S = 120

pytestmark = pytest.mark.skipif(MPIEXEC is None,
                                reason="no mpiexec next to sys.executable or on PATH")


def run_mpi(n: int, *args) -> dict[int, list[str]]:
    """Run the worker on n ranks; return {rank: [names of passed checks]}."""
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(WORKER), *map(str, args)]
    # Own session, so that on timeout the whole launcher + ranks tree is killed.
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} timed out after {TIMEOUT_S}s\n{out}\n{err}")
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode})\n{out}\n{err}"
    passed: dict[int, list[str]] = {r: [] for r in range(n)}
    done: dict[int, int] = {}
    # Records end with ';' because the ranks' output can interleave mid-line.
    for r, name in re.findall(r"PASS rank=(\d+) ([^;\n]*);", out):
        passed[int(r)].append(name)
    for r, k in re.findall(r"DONE rank=(\d+) checks=(\d+);", out):
        done[int(r)] = int(k)
    assert sorted(done) == list(range(n)), f"not every rank finished:\n{out}\n{err}"
    for r in range(n):
        assert len(passed[r]) == done[r] > 0, f"rank {r}: {passed[r]}"
        assert passed[r] == passed[0], f"rank {r} ran different checks"
    return passed


def test_collectives_2_ranks():
    names = run_mpi(2, "collectives")[0]
    for expected in ["world:all_reduce sum float32", "world:all_reduce max float32",
                     "world:all_reduce min int32", "world:all_reduce prod float64",
                     "world:all_reduce in place",
                     "world:all_gather dim=0", "world:all_gather dim=1", "world:all_gather dim=2",
                     "world:reduce_scatter sum dim=0", "world:reduce_scatter sum dim=1",
                     "world:reduce_scatter max dim=1",
                     "world:deterministic all_reduce sum bitwise identical",
                     "world:deterministic reduce_scatter dim=1 bitwise",
                     "world:all_to_all 0->1", "world:all_to_all 2->0",
                     "world:all_to_all contiguous blocks", "world:ragged all_to_all 0->1",
                     "world:ragged all_to_all 1->0",
                     "world:ragged all_to_all counts past a block refused",
                     "world:broadcast every root", "world:shift +1", "world:shift -1",
                     "world:overlapping collectives",
                     "world:all_reduce sum bfloat16", "world:all_reduce max bfloat16",
                     "world:reduce_scatter sum bfloat16",
                     "world:all_gather, all_to_all, shift, broadcast bfloat16"]:
        assert expected in names


def test_mesh_2x2_axis_communicators():
    names = run_mpi(4, "mesh2x2")[0]
    for axis in ("dp", "tp", "world"):
        assert f"{axis}:all_gather dim=1" in names
        assert f"{axis}:reduce_scatter sum dim=1" in names
        assert f"{axis}:all_to_all 1->0" in names
        assert f"{axis}:ragged all_to_all 0->1" in names
        assert f"{axis}:shift +1" in names
        assert f"{axis}:deterministic all_reduce sum bitwise identical" in names
    assert "mesh:both axes in flight" in names
    assert "mesh:communicators made again reuse the shared-memory groups" in names
    assert "tp again:overlapping collectives" in names


@pytest.mark.parametrize("n", [2, 4])
def test_shared_memory_collectives(n):
    """shm_comm: every collective (bits of the deterministic tree as MPI's),
    interleaved with MPI fallbacks, broadcasts and transfers in pieces of a
    slot, backlogged posts, transfers that a busy
    receiver still takes, and waits that sleep instead of spinning."""
    names = run_mpi(n, "shm")[0]
    for expected in ["shm:all_reduce sum float32", "shm:deterministic all_reduce sum bitwise identical",
                     "shm:deterministic reduce_scatter dim=1 bitwise", "shm:ragged all_to_all 0->1",
                     "shm:broadcast every root", "shm:shift -1", "shm:overlapping collectives",
                     "shm:all_gather, all_to_all, shift, broadcast bfloat16",
                     "shm+mpi:overlapping collectives", "shm+mpi:all_gather dim=2",
                     "shm:more collectives in flight than slot sets",
                     "shm:sends past the channel's slots",
                     "shm:broadcasts and transfers larger than a slot go in pieces",
                     "shm:a receiver in a collective lets its sender go on",
                     "shm:a waiting rank sleeps"]:
        assert expected in names
    assert ("shm:transfers between ranks that are not neighbours" in names) == (n > 2)


@pytest.fixture(scope="module")
def tp_lib(tmp_path_factory):
    return compile_kernels(kernels_cpp(**TP_KERNELS), tmp_path_factory.mktemp("tp_kernels"))


def test_program_tp_2_ranks(tmp_path, tp_lib):
    bundle = write_bundle(tmp_path / "tp.tsb", tp_program(), tp_lib, entry="tp_mlp")
    names = run_mpi(2, "program", bundle)[0]
    assert {"program tp_mlp:y run=1", "program tp_mlp:z run=1", "program tp_mlp:g run=1"} <= set(names)


def test_program_dp_tp_4_ranks(tmp_path, tp_lib):
    bundle = write_bundle(tmp_path / "dptp.tsb", dp_tp_program(), tp_lib, entry="dp_tp_mlp")
    names = run_mpi(4, "program", bundle)[0]
    assert {"program dp_tp_mlp:y run=1", "program dp_tp_mlp:full run=1"} <= set(names)
