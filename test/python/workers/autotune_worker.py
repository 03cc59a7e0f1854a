"""Autotuning in a 2-rank job: a data-parallel gradient compiled with
autotune=True, then a 2-stage pipeline with microbatches="auto"; every rank
prints its rank, the gradient's sum and the microbatch count it runs, and
the ranks must agree on the candidates and the choices (rank 0 reports
them).

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

from tessera import graph, pipeline
pp = dist.Mesh(axes=["pp"], shape=(2,))
@graph.stage("layer")
def layer(w, h):
    return op.tanh(op.matmul(h, w))
@pipeline.run(mesh=pp, axis="pp", microbatches="auto")
def pipelined(ws, batch):
    return ts.value_and_grad(lambda ws: op.mean(layer(ws[1], layer(ws[0], batch))))(ws)
ws = [rng.standard_normal((32, 32)).astype(np.float32) / 6 for _ in range(2)]
loss, _ = pipelined(ws, rng.standard_normal((16, 32)).astype(np.float32))
print(f"rank {pp.rank} microbatches {pipelined.microbatches} loss {float(loss)!r}", flush=True)
