"""Runs a matmul with its collective over a 2-rank tp mesh on the GPU target,
with the kernels in the CUDA emulator (TESSERA_CUDA_EMULATE=1, set by the
test), and writes one JSON line per rank (result.rankR.json in OUT_DIR): the
max error against a float64 numpy reference, and the kernels and collectives
the program ran.

KIND `gather`: `op.matmul(x, w, transport=...)` with x [M, K] split by rows
and w [K, N] by columns, so x is all-gathered (inside the GEMM with NVSHMEM).
With a last argument `epilogue` the program is gelu(x @ w) + r (r split by
columns like the output), whose elementwise ops belong in the GEMM kernel.

KIND `scatter`: `r + op.matmul(x, w, transport=...)` with x [M, K] split by
columns, w [K, N] by rows and r [M, N] by rows: the product's partial sums
are reduce-scattered over rows (inside the GEMM with NVSHMEM) and the
residual add runs on the summed tile. With `epilogue`: gelu(r + x @ w).

With `largest-tiles` the GEMM takes the largest tensor-core tiles that divide
it (128x256 wgmma for bf16 when they fit) rather than enough tiles for every
SM of an H100. The mesh has as many ranks as the MPI job.

    mpiexec -n P python collective_gemm_worker.py KIND SEED M K N DTYPE TRANSPORT OUT_DIR \
        [epilogue] [largest-tiles]"""

import json
import sys

import numpy as np
from mpi4py import MPI

import tessera as ts
from tessera import dist, op

kind = sys.argv[1]
seed, m, k, n = (int(a) for a in sys.argv[2:6])
dtype, transport, out_dir = sys.argv[6], sys.argv[7], sys.argv[8]
epilogue = "epilogue" in sys.argv[9:]
options = ts.TargetOptions(target="gpu")
if "largest-tiles" in sys.argv[9:]:
    options = options.with_(target_blocks=1)

mesh = dist.Mesh(axes=["tp"], devices=range(MPI.COMM_WORLD.Get_size()))
rng = np.random.default_rng(seed)
if dtype == "bf16":
    import ml_dtypes
    np_dtype = ml_dtypes.bfloat16
else:
    np_dtype = np.dtype({"f32": "float32"}.get(dtype, dtype))
x = rng.standard_normal((m, k)).astype(np_dtype)
w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np_dtype)
r = rng.standard_normal((m, n)).astype(np_dtype)
split = {"gather": ("row", "col", "col"), "scatter": ("col", "row", "row")}[kind]
X, W, R = (dist.from_numpy(a, layout=dist.ShardSpec(partition=(p,), mesh_axes=("tp",)), mesh=mesh)
           for a, p in zip((x, w, r), split))


@ts.compile(mesh=mesh, target=options)
def column_parallel(x, w, r):
    y = op.matmul(x, w, transport=transport)
    return op.gelu(y) + r if epilogue else y


@ts.compile(mesh=mesh, target=options)
def row_parallel(x, w, r):
    y = r + op.matmul(x, w, transport=transport)
    return op.gelu(y) if epilogue else y


def gelu(v):
    return 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3)))


def rounded(v):
    """`v` as the kernel holds it between ops: in bf16 every op's result is rounded."""
    return v.astype(np_dtype).astype(np.float64) if dtype == "bf16" else v


program = column_parallel if kind == "gather" else row_parallel
Y = program(X, W, R)
Y2 = program(X, W, R)      # the second call reuses the symmetric buffers
ref = x.astype(np.float64) @ w.astype(np.float64)
if kind == "gather" and epilogue:
    ref = gelu(rounded(ref)) + r.astype(np.float64)
elif kind == "scatter":
    ref = rounded(ref) + r.astype(np.float64)
    ref = gelu(rounded(ref)) if epilogue else ref
levels = program.lower(X, W, R, target="gpu")
schedule, tile = levels.schedule, levels.tile
# The Tile IR kernel that puts tiles to the peers (the fused GEMM).
fused_kernel = next((k for k in tile.split("ttile.kernel @")[1:] if "ttile.put" in k), "")
got, again = Y.numpy().astype(np.float64), Y2.numpy().astype(np.float64)
with open(f"{out_dir}/result.rank{mesh.rank}.json", "w") as f:
    f.write(json.dumps({
        "rank": mesh.rank,
        "max_err": float(np.abs(got - ref).max()),
        "scale": float(np.abs(ref).max()),
        "repeat_identical": bool(np.array_equal(got, again)),
        "y_shape": list(Y.shape), "y_local": list(Y.local().shape),
        "fused_launches": schedule.count("gather_matmul") + schedule.count("matmul_scatter"),
        "symmetric_allocs": tile.count("tsched.alloc {symmetric}"),
        "collectives": schedule.count("tsched.collective_start"),
        "kernels": tile.count("ttile.kernel @"),
        "epilogue_in_fused_gemm": ("ttile.gelu" in fused_kernel) == epilogue
                                  and "ttile.add" in fused_kernel,
    }))
