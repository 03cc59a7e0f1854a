"""Performance guide 7.7 (overlap), as written: the two `schedule` calls set
the defaults of pipelined steps compiled afterwards (8 microbatches, the
gradients' collectives overlapped). A 2-stage training step on 2 `pp` ranks
picks them up; its loss and gradients are checked against numpy.

    tessera launch -n 2 examples/design_docs/performance_7_7_overlap.py
"""
import numpy as np

import tessera as ts
from tessera import dist, graph, op, pipeline, schedule

schedule.all_reduce_overlap(True)   # gradient sync overlaps with compute
schedule.pipeline_microbatches(8)   # interleave forward/backward

mesh = dist.Mesh(axes=["pp"], devices=range(2))


@graph.stage("layer")
def layer(w, x):
    return op.tanh(op.matmul(x, w))


@pipeline.run(mesh=mesh, axis="pp")
def step(ws, x, y):
    def loss_fn(ws):
        return op.mean((layer(ws[1], layer(ws[0], x)) - y) ** 2)
    return ts.value_and_grad(loss_fn)(ws)


rng = np.random.default_rng(7)
ws = [(rng.standard_normal((4, 4)) * 0.5).astype(np.float32) for _ in range(2)]
x, y = [rng.standard_normal((16, 4)).astype(np.float32) for _ in range(2)]
loss, grads = step(ws, x, y)
h1 = np.tanh(x.astype(np.float64) @ ws[0])
h2 = np.tanh(h1 @ ws[1])
g2 = 2 * (h2 - y) / h2.size * (1 - h2 ** 2)
g1 = (g2 @ ws[1].T) * (1 - h1 ** 2)
np.testing.assert_allclose(float(np.asarray(loss)), np.mean((h2 - y) ** 2), rtol=1e-5)
np.testing.assert_allclose(np.asarray(grads[0]), x.T @ g1, rtol=1e-4, atol=1e-6)
np.testing.assert_allclose(np.asarray(grads[1]), h1.T @ g2, rtol=1e-4, atol=1e-6)
assert step.microbatches == 8
if mesh.rank == 0:
    print("OK performance_7_7_overlap")
