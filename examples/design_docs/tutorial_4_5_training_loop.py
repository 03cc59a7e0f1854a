"""Tutorial 4.5 (the training loop), as written on 2 tp ranks. `model` and
the batch are the data filled in: a two-layer MLP whose weights are DTensors
split Megatron-style over tp (W1 by columns, W2 by rows), which the step
captures, so its mesh comes from them. Checked against numpy's loss and
gradients of the mean cross-entropy.

    tessera launch -n 2 examples/design_docs/tutorial_4_5_training_loop.py
"""
import numpy as np

from tessera import dist, graph, op

mesh = dist.Mesh(axes=["tp"], devices=range(2))
rng = np.random.default_rng(5)
w1, w2 = rng.standard_normal((6, 8)) * 0.5, rng.standard_normal((8, 4)) * 0.5
W1 = dist.from_numpy(w1.astype(np.float32), dist.ShardSpec(("col",), ("tp",)), mesh)
W2 = dist.from_numpy(w2.astype(np.float32), dist.ShardSpec(("row",), ("tp",)), mesh)


def model(x):
    return op.matmul(op.relu(op.matmul(x, W1)), W2)


@graph.training_step(module="DistTransformer")
def step(batch):
    out = model(batch["input"])
    loss = op.cross_entropy(out, batch["labels"])
    grads = graph.backward(loss)
    return grads, {"loss": loss}


batch = {"input": rng.standard_normal((5, 6)).astype(np.float32),
         "labels": rng.integers(0, 4, 5).astype(np.int32)}
grads, metrics = step(batch)

x, y = batch["input"].astype(np.float64), batch["labels"]
h = np.maximum(x @ w1, 0)
logits = h @ w2
p = np.exp(logits - logits.max(1, keepdims=True))
p /= p.sum(1, keepdims=True)
np.testing.assert_allclose(float(metrics["loss"]), -np.mean(np.log(p[np.arange(5), y])),
                           rtol=1e-5)
d = p.copy()
d[np.arange(5), y] -= 1
d /= 5
np.testing.assert_allclose(np.asarray(grads["W2"]), h.T @ d, rtol=1e-4, atol=1e-6)
np.testing.assert_allclose(np.asarray(grads["W1"]), x.T @ ((d @ w2.T) * (x @ w1 > 0)),
                           rtol=1e-4, atol=1e-6)
if mesh.rank == 0:
    print("OK tutorial_4_5_training_loop")
