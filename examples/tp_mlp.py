"""A tensor-parallel MLP on a 1-D `tp` mesh: a column-parallel matmul, relu, and a
row-parallel matmul. The compiler inserts the one all_reduce over `tp` that the
row-parallel matmul's partial sum needs, and fuses the relu into the first
matmul's kernel.

    tessera launch -n 2 examples/tp_mlp.py
"""

import numpy as np

import tessera as ts
from tessera import dist, op

mesh = dist.Mesh(axes=["tp"], devices=range(2))

rng = np.random.default_rng(0)          # every rank draws the same global values
x = rng.standard_normal((64, 128), dtype=np.float32)
w1 = (rng.standard_normal((128, 256)) / np.sqrt(128)).astype(np.float32)
w2 = (rng.standard_normal((256, 128)) / np.sqrt(256)).astype(np.float32)

X = dist.from_numpy(x, layout=dist.ShardSpec(partition=(), mesh_axes=()), mesh=mesh)  # replicated
W1 = dist.from_numpy(w1, layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)
W2 = dist.from_numpy(w2, layout=dist.ShardSpec(partition=("row",), mesh_axes=("tp",)), mesh=mesh)


@ts.compile(mesh=mesh)
def mlp(x, w1, w2):
    return op.matmul(op.relu(op.matmul(x, w1)), w2)


Y = mlp(X, W1, W2)
reference = np.maximum(x.astype(np.float64) @ w1, 0) @ w2
err = np.abs(Y.numpy() - reference).max()
ok = np.allclose(Y.numpy(), reference, rtol=1e-5, atol=1e-5)

rank = mesh.rank
print(f"[rank {rank}] {mesh.topology}: W1 local {W1.local().shape}, W2 local {W2.local().shape}, "
      f"Y {Y.shape} (local {Y.local().shape}); max |Y - numpy| = {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
if rank == 0:
    trace = ts.graph.trace(mlp, X, W1, W2)
    collectives = [line.strip() for line in trace.partitioned.splitlines() if "tgraph.all_" in line]
    print("[rank 0] collectives the compiler inserted:", *collectives, sep="\n  ")
raise SystemExit(0 if ok else 1)
