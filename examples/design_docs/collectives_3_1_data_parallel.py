"""Collectives guide 3.1 (data parallel), on 2 ranks. The snippet's four
lines run inside a compiled step: `out` and `labels` are the data filled in
(a linear model over a dp-split batch), and `op.autodiff` needs the trace
(gradients of the captured parameters). `dist.all_reduce(grads, axis="dp")`
returns the gradients the partitioner already summed over dp. Checked
against numpy's gradient of the mean cross-entropy.

    tessera launch -n 2 examples/design_docs/collectives_3_1_data_parallel.py
"""
import numpy as np

import tessera as ts
from tessera import dist, op

mesh = dist.Mesh(axes=["dp"], devices=range(2))
rng = np.random.default_rng(0)
x_all = rng.standard_normal((8, 5)).astype(np.float32)
labels_all = rng.integers(0, 3, 8).astype(np.int32)
w = rng.standard_normal((5, 3)).astype(np.float32)
batch = dist.ShardSpec((0,), ("dp",))
X = dist.from_numpy(x_all, batch, mesh)
Y = dist.from_numpy(labels_all, batch, mesh)


@ts.compile(mesh=mesh)
def step(x, labels):
    out = op.matmul(x, w)
    with dist.deterministic(reduce_tree="binary"):
        loss = op.cross_entropy(out, labels)
        grads = op.autodiff(loss)
        grads = dist.all_reduce(grads, axis="dp")
    return loss, grads


loss, grads = step(X, Y)
(g,) = grads.values()
logits = x_all.astype(np.float64) @ w
p = np.exp(logits - logits.max(1, keepdims=True))
p /= p.sum(1, keepdims=True)
np.testing.assert_allclose(float(loss), -np.mean(np.log(p[np.arange(8), labels_all])), rtol=1e-5)
p[np.arange(8), labels_all] -= 1
np.testing.assert_allclose(g.numpy(), x_all.T @ p / 8, rtol=1e-4, atol=1e-6)
if mesh.rank == 0:
    print("OK collectives_3_1_data_parallel")
