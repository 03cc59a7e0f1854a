"""Runs the tensor-parallel MLP on fresh random inputs and prints one JSON line
per rank (result.rankR.json in OUT_DIR): the max error against a float64 numpy reference and the shapes."""

import json
import sys

import numpy as np

import tessera as ts
from tessera import dist, op

seed, batch, d_model, d_ff = (int(a) for a in sys.argv[1:5])
out_dir = sys.argv[5]
save_to = sys.argv[6] if len(sys.argv) > 6 else None

mesh = dist.Mesh(axes=["tp"], devices=range(2))
rng = np.random.default_rng(seed)
x = rng.standard_normal((batch, d_model)).astype(np.float32)
w1 = rng.standard_normal((d_model, d_ff)).astype(np.float32)
w2 = rng.standard_normal((d_ff, d_model)).astype(np.float32)
X = dist.from_numpy(x, layout=dist.ShardSpec(partition=(), mesh_axes=()), mesh=mesh)
W1 = dist.from_numpy(w1, layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)
W2 = dist.from_numpy(w2, layout=dist.ShardSpec(partition=("row",), mesh_axes=("tp",)), mesh=mesh)


@ts.compile(mesh=mesh)
def mlp(x, w1, w2):
    return op.matmul(op.relu(op.matmul(x, w1)), w2)


Y = mlp(X, W1, W2)
Y2 = mlp(X, W1, W2)     # second call reuses the loaded program
ref = np.maximum(x.astype(np.float64) @ w1.astype(np.float64), 0) @ w2.astype(np.float64)
got = Y.numpy()
if save_to and mesh.rank == 0:
    from pathlib import Path
    out = Path(save_to)
    mlp.save(out / "mlp.tsb")
    for name, arr in (("x", x), ("w1", w1), ("w2", w2), ("ref", ref)):
        np.save(out / f"{name}.npy", arr)
result = json.dumps({
    "rank": mesh.rank,
    "ok": bool(np.allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())),
    "max_err": float(np.abs(got - ref).max()),
    "repeat_identical": bool(np.array_equal(Y.local(), Y2.local())),
    "local_w1": list(W1.local().shape), "local_w2": list(W2.local().shape),
    "y_shape": list(Y.shape), "y_local": list(Y.local().shape),
})
# One file per rank: mpiexec interleaves the ranks' stdout.
with open(f"{out_dir}/result.rank{mesh.rank}.json", "w") as f:
    f.write(result)
