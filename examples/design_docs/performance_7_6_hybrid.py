"""Performance guide 7.6 (hybrid parallel training step), as written on 4
ranks: a 3-D tp x pp x dp mesh of 2 x 2 x 1 instead of 72 devices, W
(64 x 64 instead of 100,000 x 100,000) split by rows over tp and by columns
over pp, and the `transformer` the guide leaves to the user written here:
one decoder block, causal self-attention over the input and an MLP whose
weight is W (`x + gelu(x W)`), giving the logits the loss reads. The step's
batch is split over dp as the guide describes (dp has 1 rank here). W's
2-D layout runs as any ShardSpec: the partitioner gathers and reduces
what the matmul needs over tp and pp. As the snippet writes it, pp holds a
piece of a weight, not a pipeline stage; a pipelined dp x tp x pp step is
`examples/train_gpt.py --dp 2 --tp 2 --pp 2`. Checked: the loss and W's
gradient against float64 numpy.

    tessera launch -n 4 examples/design_docs/performance_7_6_hybrid.py
"""
import numpy as np

from tessera import dist, graph, op

B, S, H = 2, 8, 64
rng = np.random.default_rng(76)
inputs = (rng.standard_normal((B, S, H)) * 0.2).astype(np.float32)
labels = rng.integers(0, H, (B, S)).astype(np.int32)


def transformer(x, W):
    """One decoder block: causal self-attention, then an MLP whose weight is W."""
    h = x + op.attention(x, x, x, causal=True)
    return h + op.gelu(op.matmul(h, W))


# Define 3D mesh: tensor × pipeline × data parallel
mesh = dist.Mesh(axes=["tp","pp","dp"], devices=range(4))

# Shard transformer weights across tp × pp
W = dist.tensor((H, H),
                layout=dist.ShardSpec(partition=("row","col"),
                                      mesh_axes=("tp","pp")),
                mesh=mesh)

# Training step with hybrid parallelism
@graph.training_step(module="Transformer")
def step(batch):
    out = transformer(batch["input"], W)
    loss = op.cross_entropy(out, batch["labels"])
    grads = graph.backward(loss)
    return grads, {"loss": loss}


on_dp = dist.ShardSpec((0,), ("dp",))
batch = {"input": dist.from_numpy(inputs, on_dp, mesh),
         "labels": dist.from_numpy(labels, on_dp, mesh)}
grads, metrics = step(batch)

# float64 numpy: the block, the mean cross-entropy over every position, and
# d loss / d W = h^T (d logits * gelu'(h W)).
w = W.numpy().astype(np.float64)
x = inputs.astype(np.float64)
scores = x @ x.transpose(0, 2, 1) / np.sqrt(H)
scores[:, np.triu(np.ones((S, S), bool), 1)] = -np.inf
attn = np.exp(scores - scores.max(-1, keepdims=True))
attn /= attn.sum(-1, keepdims=True)
h = x + attn @ x
u = h @ w
c = 0.7978845608028654
t = np.tanh(c * (u + 0.044715 * u ** 3))
logits = h + 0.5 * u * (1 + t)
p = np.exp(logits - logits.max(-1, keepdims=True))
p /= p.sum(-1, keepdims=True)
rows = np.arange(B)[:, None], np.arange(S)[None, :]
loss = -np.mean(np.log(p[rows + (labels,)]))
d_logits = p.copy()
d_logits[rows + (labels,)] -= 1
d_logits /= B * S
gelu_grad = 0.5 * (1 + t) + 0.5 * u * (1 - t ** 2) * c * (1 + 3 * 0.044715 * u ** 2)
d_w = np.einsum("bsi,bsj->ij", h, d_logits * gelu_grad)

np.testing.assert_allclose(float(metrics["loss"]), loss, rtol=1e-5)
assert set(grads) == {"W"}, set(grads)
np.testing.assert_allclose(np.asarray(grads["W"]), d_w, rtol=1e-4, atol=1e-6)
if mesh.rank == 0:
    print(f"{mesh.topology}: loss {float(metrics['loss']):.5f} (numpy {loss:.5f})")
    print("OK performance_7_6_hybrid")
