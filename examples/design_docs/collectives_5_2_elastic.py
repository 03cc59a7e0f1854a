"""Collectives guide 5.2 (elastic collectives), on 2 `pp` ranks: the snippet
with `as job` added (train_epoch marks its safe points on the handle). The
epoch trains a 2-stage pipelined model (1F1B, 4 microbatches); each step
ends at a pipeline boundary, where the weights and the data position are
checkpointed. The first attempt fails at step 3 (as a lost rank would make
it); the job enters `dist.elastic` again, as `tessera launch --elastic`
would restart it, resumes from the last checkpoint and ends with the same
bits as an epoch that never stopped, within float32 rounding of float64
numpy. Checkpoints go to a temporary directory the ranks share (the
default is ./checkpoints).

    tessera launch -n 2 examples/design_docs/collectives_5_2_elastic.py
"""
import os
import shutil
import tempfile

import numpy as np

import tessera as ts
from tessera import dist, graph, op, pipeline

mesh = dist.Mesh(axes=["pp"], devices=range(2))
name = np.frombuffer(tempfile.mkdtemp().encode().ljust(256), np.uint8) if mesh.rank == 0 else None
os.chdir(bytes(dist.broadcast(name, mesh=mesh).numpy()).decode().strip())

STEPS, LR = 6, 0.2
init = np.random.default_rng(11)
W0 = [(init.standard_normal((8, 8)) * 0.4).astype(np.float32) for _ in range(2)]


@graph.stage("block")
def block(w, x):
    return op.tanh(op.matmul(x, w))


@pipeline.run(mesh=mesh, axis="pp", schedule="1F1B", microbatches=4)
def step(ws, x, y):
    def loss_fn(ws):
        h = x
        for w in ws:
            h = block(w, h)
        return op.mean((h - y) * (h - y))
    return ts.value_and_grad(loss_fn)(ws)


def batch(rng):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    return x, np.sin(x[:, ::-1]).copy()


class Failure(Exception):
    pass


def train_epoch(fail_at=None):
    saved = job.resume(tensors=list(W0), extra={"rng": np.random.default_rng(5)})
    ws, rng = saved.tensors, saved.extra["rng"]
    for i in range(job.step + 1, STEPS + 1):
        if i == fail_at:
            raise Failure(f"step {i}")
        loss, grads = step(ws, *batch(rng))
        ws = [w - LR * np.asarray(g) for w, g in zip(ws, grads)]
        job.safe_point(i, tensors=ws, extra={"rng": rng})
    return ws


try:
    with dist.elastic(rejoin=True, safe_point="pipeline_boundary") as job:
        train_epoch(fail_at=3)
except Failure:
    pass
with dist.elastic(rejoin=True, safe_point="pipeline_boundary") as job:   # the restart
    resumed = train_epoch()
assert job.step == STEPS

with dist.elastic(rejoin=True, safe_point="pipeline_boundary",
                  directory="straight") as job:                         # never stopped
    straight = train_epoch()
for a, b in zip(resumed, straight):
    assert a.tobytes() == b.tobytes()

rng, ws = np.random.default_rng(5), [w.astype(np.float64) for w in W0]
for _ in range(STEPS):                                  # float64 reference
    x, y = batch(rng)
    hs = [x.astype(np.float64)]
    for w in ws:
        hs.append(np.tanh(hs[-1] @ w))
    d = 2 * (hs[-1] - y) / y.size
    grads = []
    for k in (1, 0):
        d = d * (1 - hs[k + 1] ** 2)
        grads.insert(0, hs[k].T @ d)
        d = d @ ws[k].T
    ws = [w - LR * g for w, g in zip(ws, grads)]
for a, b in zip(resumed, ws):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
if mesh.rank == 0:
    shutil.rmtree(os.getcwd())
    print("OK collectives_5_2_elastic")
