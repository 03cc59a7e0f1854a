"""op.moe on an 'ep' mesh of the MPI job's ranks, compiled for the GPU
target with the kernels in the CUDA emulator (TESSERA_CUDA_EMULATE=1, set
by the test), once per transport: the communicator's all-to-all ("nccl")
and the NVSHMEM exchange kernels ("nvshmem"), each unpacked and with
`pack_dtype="bf16"` and `"fp8_e4m3"` (that one also with `multi_qp`). Forward and gradients (x, router, w1, w2). Rank 0
writes OUT as JSON: per case the largest relative error against the
float64 reference, whether its values equal the "nccl" case's of the same
pack bit for bit, and what the compiled program holds (exchange kernels,
all_to_all collectives, symmetric allocations).

    mpiexec -n P python moe_exchange_worker.py SEED OUT
"""

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))

import tessera as ts                     # noqa: E402
from tessera import dist, op             # noqa: E402
from programs import moe_reference       # noqa: E402

seed, out = int(sys.argv[1]), Path(sys.argv[2])
ranks = MPI.COMM_WORLD.Get_size()
mesh = dist.Mesh(axes=["ep"], shape=(ranks,))
T, D, F, E, K = 16 * ranks, 8, 12, 2 * ranks, 2
rng = np.random.default_rng(seed)        # every rank draws the same inputs
x = rng.standard_normal((T, D)).astype(np.float32)
experts = {"router": rng.standard_normal((D, E)).astype(np.float32),
           "w1": (rng.standard_normal((E, D, F)) / np.sqrt(D)).astype(np.float32),
           "w2": (rng.standard_normal((E, F, D)) / np.sqrt(F)).astype(np.float32)}
R = rng.standard_normal((T, D)).astype(np.float32)
gpu = ts.TargetOptions(target="gpu")


def make(transport):
    @ts.jit(mesh=mesh, target=gpu)
    def step(x, ex):
        y = op.moe(x, experts=ex, k=K, transport=transport, mesh=mesh)
        value = op.sum(op.mul(y, R))
        return y, ts.grad(value, [x, ex])
    return step


def flat(result):
    y, (gx, gex) = result
    named = {"y": y, "grad.x": gx, **{f"grad.{n}": g for n, g in gex.items()}}
    return {n: np.asarray(v) for n, v in named.items()}


ref_y, _ = moe_reference(x, experts, K)
verdict, seen = {}, {}
for name, transport in (("nccl", "nccl"), ("nvshmem", "nvshmem"),
                        ("nccl bf16", {"type": "nccl", "pack_dtype": "bf16"}),
                        ("nvshmem bf16", {"type": "nvshmem", "pack_dtype": "bf16"}),
                        ("nccl fp8", {"type": "nccl", "pack_dtype": "fp8_e4m3"}),
                        ("nvshmem fp8", {"type": "nvshmem", "pack_dtype": "fp8_e4m3"}),
                        # the design docs' transport: 4 copies per peer
                        ("nvshmem fp8 multi_qp", {"type": "nvshmem", "multi_qp": True,
                                                  "pack_dtype": "fp8_e4m3"})):
    step = make(transport)
    got = flat(step(x, experts))
    again = flat(step(x, experts))       # the second call reuses the symmetric buffers
    levels = step.lower(x, experts)
    seen[name] = got
    base = seen[name.replace("nvshmem", "nccl").replace(" multi_qp", "")]
    verdict[name] = {
        "y vs float64": float(np.max(np.abs(got["y"] - ref_y)) / np.max(np.abs(ref_y))),
        "same bits as nccl": all(np.array_equal(got[n], base[n]) for n in got),
        "repeat identical": all(np.array_equal(got[n], again[n]) for n in got),
        "grads vs nccl": max(float(np.max(np.abs(got[n] - seen["nccl"][n]))
                                   / (np.max(np.abs(seen["nccl"][n])) + 1e-30)) for n in got),
        "exchange kernels": sum(1 for k in levels.tile.split("ttile.kernel @")[1:]
                                if "ttile.put" in k),
        # ragged: every put (and get) moves the rows a count read in the kernel says
        "ragged exchange kernels": sum(
            1 for k in levels.tile.split("ttile.kernel @")[1:]
            if "ttile.put" in k and "ttile.load_scalar" in k
            and all(" rows " in line for line in k.splitlines()
                    if "ttile.put " in line or "ttile.get " in line)),
        # in place: the expert GEMMs read the symmetric receive buffer (no copy out)
        "in-place exchange kernels": sum(1 for k in levels.tile.split("ttile.kernel @")[1:]
                                         if "ttile.put" in k and "ttile.get" not in k),
        "exchange grids": sorted({int(k.split("grid = array<i64: ")[1].split(">")[0])
                                  for k in levels.tile.split("ttile.kernel @")[1:]
                                  if "ttile.put" in k}),
        "exchange launches": sum(1 for line in levels.tile.splitlines()
                                 if "tsched.launch" in line and "_exchange_" in line),
        "all_to_all collectives": levels.schedule.count("collective_start <all_to_all>"),
        "symmetric allocs": levels.tile.count("tsched.alloc {symmetric}"),
    }
if mesh.rank == 0:
    out.write_text(json.dumps(verdict, indent=1))
