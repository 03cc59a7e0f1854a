"""Runs `op.matmul(x, w, transport=...)` with x split by rows and w by columns
over a 2-rank tp mesh on the GPU target, with the kernels in the CUDA
emulator (TESSERA_CUDA_EMULATE=1, set by the test), and writes one JSON
line per rank (result.rankR.json in OUT_DIR): the max error against a
float64 numpy reference, and the kernels and collectives the program ran.
With a last argument `epilogue`, the program is gelu(x @ w) + r (r split by
columns like the output), whose elementwise ops belong in the GEMM kernel.

    mpiexec -n 2 python gathered_gemm_worker.py SEED M K N DTYPE TRANSPORT OUT_DIR [epilogue]"""

import json
import sys

import numpy as np

import tessera as ts
from tessera import dist, op

seed, m, k, n = (int(a) for a in sys.argv[1:5])
dtype, transport, out_dir = sys.argv[5], sys.argv[6], sys.argv[7]
epilogue = sys.argv[8:] == ["epilogue"]

mesh = dist.Mesh(axes=["tp"], devices=range(2))
rng = np.random.default_rng(seed)
if dtype == "bf16":
    import ml_dtypes
    np_dtype = ml_dtypes.bfloat16
else:
    np_dtype = np.dtype({"f32": "float32"}.get(dtype, dtype))
x = rng.standard_normal((m, k)).astype(np_dtype)
w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np_dtype)
r = rng.standard_normal((m, n)).astype(np_dtype)
X = dist.from_numpy(x, layout=dist.ShardSpec(partition=("row",), mesh_axes=("tp",)), mesh=mesh)
W = dist.from_numpy(w, layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)
R = dist.from_numpy(r, layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)


@ts.compile(mesh=mesh, target="gpu")
def column_parallel(x, w, r):
    y = op.matmul(x, w, transport=transport)
    return op.gelu(y) + r if epilogue else y


Y = column_parallel(X, W, R)
Y2 = column_parallel(X, W, R)      # the second call reuses the symmetric buffers
ref = x.astype(np.float64) @ w.astype(np.float64)
if epilogue:
    if dtype == "bf16":     # the GEMM's output is rounded before the epilogue
        ref = ref.astype(np_dtype).astype(np.float64)
    ref = 0.5 * ref * (1 + np.tanh(0.7978845608028654 * (ref + 0.044715 * ref ** 3))) \
        + r.astype(np.float64)
levels = column_parallel.lower(X, W, R, target="gpu")
schedule, tile = levels.schedule, levels.tile
# The Tile IR kernel that puts rows to the peers (the gathered GEMM).
gathered_kernel = next((k for k in tile.split("ttile.kernel @")[1:] if "ttile.put" in k), "")
got, again = Y.numpy().astype(np.float64), Y2.numpy().astype(np.float64)
with open(f"{out_dir}/result.rank{mesh.rank}.json", "w") as f:
    f.write(json.dumps({
        "rank": mesh.rank,
        "max_err": float(np.abs(got - ref).max()),
        "scale": float(np.abs(ref).max()),
        "repeat_identical": bool(np.array_equal(got, again)),
        "y_shape": list(Y.shape), "y_local": list(Y.local().shape),
        "fused_launches": schedule.count("gather_matmul"),
        "symmetric_allocs": tile.count("tsched.alloc {symmetric}"),
        "collectives": schedule.count("tsched.collective_start"),
        "kernels": tile.count("ttile.kernel @"),
        "epilogue_in_gathered_gemm": "ttile.tanh" in gathered_kernel and "ttile.add" in gathered_kernel,
    }))
