"""Runs `op.matmul(x, w, transport=...)` with x split by rows and w by columns
over a 2-rank tp mesh on the GPU target, with the kernels in the CUDA
emulator (TESSERA_CUDA_EMULATE=1, set by the test), and writes one JSON
line per rank (result.rankR.json in OUT_DIR): the max error against a
float64 numpy reference, and the kernels and collectives the program ran."""

import json
import sys

import numpy as np

import tessera as ts
from tessera import dist, op

seed, m, k, n = (int(a) for a in sys.argv[1:5])
dtype, transport, out_dir = sys.argv[5], sys.argv[6], sys.argv[7]

mesh = dist.Mesh(axes=["tp"], devices=range(2))
rng = np.random.default_rng(seed)
if dtype == "bf16":
    import ml_dtypes
    np_dtype = ml_dtypes.bfloat16
else:
    np_dtype = np.dtype({"f32": "float32"}.get(dtype, dtype))
x = rng.standard_normal((m, k)).astype(np_dtype)
w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np_dtype)
X = dist.from_numpy(x, layout=dist.ShardSpec(partition=("row",), mesh_axes=("tp",)), mesh=mesh)
W = dist.from_numpy(w, layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)


@ts.compile(mesh=mesh, target="gpu")
def column_parallel(x, w):
    return op.matmul(x, w, transport=transport)


Y = column_parallel(X, W)
Y2 = column_parallel(X, W)      # the second call reuses the symmetric buffers
ref = x.astype(np.float64) @ w.astype(np.float64)
levels = column_parallel.lower(X, W, target="gpu")
schedule, tile = levels.schedule, levels.tile
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
    }))
