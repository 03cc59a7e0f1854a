"""NCCL worker for test_nccl.py: `mpiexec -n 2 python nccl_worker.py`. Every
collective over NCCL (cupy buffers) against numpy, and the deterministic
all_reduce (f32 and bf16) against the MPI engine's on the same inputs, bit for
bit. Prints `PASS rank=R NAME;` per check; any failure aborts the job."""

import sys
import traceback

import numpy as np
from mpi4py import MPI


def _abort(kind, value, tb):
    traceback.print_exception(kind, value, tb)
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)


sys.excepthook = _abort

import cupy as cp                                                   # noqa: E402

from tessera_runtime import axis_comms, nccl_comm                 # noqa: E402
from tessera_runtime.mesh import MeshInfo                          # noqa: E402

WORLD = MPI.COMM_WORLD
ME, N = WORLD.Get_rank(), WORLD.Get_size()
cp.cuda.Device(ME % cp.cuda.runtime.getDeviceCount()).use()
mesh = MeshInfo(["dp"], shape=[N])
gpu = nccl_comm.make_axis_communicators(mesh)["dp"]
cpu = axis_comms.make_axis_communicators(mesh)["dp"]


def data(seed, rank, shape):
    x = np.random.default_rng([seed, rank]).standard_normal(shape)
    return (x * 10.0 ** np.random.default_rng([seed, rank, 1]).uniform(-4, 4, shape)).astype(np.float32)


def ok(name):
    print(f"PASS rank={ME} {name};", flush=True)


everyone = [data(1, r, (6, 8)) for r in range(N)]
src = cp.asarray(everyone[ME])
dst = cp.empty_like(src)
gpu.all_reduce(src, dst, "sum").wait()
np.testing.assert_allclose(cp.asnumpy(dst), np.sum(everyone, 0), rtol=1e-5, atol=1e-3)
ok("all_reduce sum")

gathered = cp.empty((6, 8 * N), cp.float32)
gpu.all_gather(src, gathered, 1).wait()
np.testing.assert_array_equal(cp.asnumpy(gathered), np.concatenate(everyone, 1))
ok("all_gather dim=1")

scattered = cp.empty((6, 8 // N), cp.float32)
gpu.reduce_scatter(src, scattered, 1, "sum").wait()
np.testing.assert_allclose(cp.asnumpy(scattered), np.split(np.sum(everyone, 0), N, 1)[ME],
                           rtol=1e-5, atol=1e-3)
ok("reduce_scatter dim=1")

moved = cp.empty((6 * N, 8 // N), cp.float32)
gpu.all_to_all(src, moved, 1, 0).wait()
np.testing.assert_array_equal(cp.asnumpy(moved),
                              np.concatenate([np.split(e, N, 1)[ME] for e in everyone], 0))
ok("all_to_all 1->0")

# The same deterministic all_reduce on both engines: the same bits.
gpu_det = cp.empty_like(src)
gpu.all_reduce(src, gpu_det, "sum", deterministic=True).wait()
cpu_det = np.empty_like(everyone[ME])
cpu.all_reduce(everyone[ME], cpu_det, "sum", deterministic=True).wait()
assert np.array_equal(cp.asnumpy(gpu_det), cpu_det), "NCCL and MPI deterministic sums differ"
ok("deterministic all_reduce: NCCL bits == MPI bits")

# bf16 (uint16 bits on the device, ml_dtypes arrays for MPI): the same bits.
import ml_dtypes                                                    # noqa: E402

mine16 = everyone[ME].astype(ml_dtypes.bfloat16)
gpu16 = cp.empty(mine16.shape, cp.uint16)
gpu.all_reduce(cp.asarray(mine16.view(np.uint16)), gpu16, "sum", deterministic=True).wait()
cpu16 = np.empty_like(mine16)
cpu.all_reduce(mine16, cpu16, "sum", deterministic=True).wait()
assert np.array_equal(cp.asnumpy(gpu16), cpu16.view(np.uint16)), "bf16 deterministic sums differ"
ok("deterministic all_reduce bf16: NCCL bits == MPI bits")
