"""Autotuning in a 2-rank job: a data-parallel gradient compiled with
autotune=True; every rank prints its rank and the gradient's sum, and the
ranks must agree on the candidates and the choice (rank 0 reports them).

    tessera launch -n 2 autotune_worker.py SEED
"""
import sys

import numpy as np, tessera as ts
from tessera import dist, op
mesh = dist.Mesh(axes=["dp"], shape=(2,))
rng = np.random.default_rng(int(sys.argv[1]))
x = dist.from_numpy(rng.standard_normal((64, 32)).astype(np.float32), layout=dist.ShardSpec(partition=(0,), mesh_axes=("dp",)), mesh=mesh)
w = rng.standard_normal((32, 32)).astype(np.float32)
def step(w, x):
    return ts.grad(lambda w: op.mean(op.gelu(op.matmul(x, w))), 0)(w)
g = ts.compile(step, mesh=mesh, autotune=True)(w, x)
print(f"rank {mesh.rank} sum {float(np.asarray(g).sum())!r}", flush=True)
