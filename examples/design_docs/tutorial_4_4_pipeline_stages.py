"""Tutorial 4.4 (pipeline stages), as written on 2 `pp` ranks: `encoder`
and `decoder` are stages, each `op.transformer_block(x, depth=12)`, and
`graph.pipeline` runs `model` over them. The one change: the tutorial
leaves out the blocks' weights, which `op.transformer_block` takes as
`params=` (12 layers each, made by `ts.nn.init_transformer` at width 16,
2 heads, their projections scaled up so every layer moves the output).
Checked against a float64 numpy transformer.

    tessera launch -n 2 examples/design_docs/tutorial_4_4_pipeline_stages.py
"""
import numpy as np

import tessera as ts
from tessera import dist, op

mesh = dist.Mesh(axes=["pp"], devices=range(2))
B, S, D, HEADS = 2, 8, 16, 2
x = np.random.default_rng(6).standard_normal((B, S, D)).astype(np.float32)


def weights(seed):
    """12 pre-norm decoder layers; init_transformer's projections (std 0.02)
    times 10, so that each layer changes the residual stream measurably."""
    return [{k: v * 10 if k in ("wqkv", "wo", "w1", "w2") else v for k, v in layer.items()}
            for layer in ts.nn.init_transformer(depth=12, width=D, seed=seed)]


enc_params, dec_params = weights(1), weights(2)

from tessera import graph

@graph.stage("encoder")
def encoder(x): return op.transformer_block(x, depth=12, params=enc_params, heads=HEADS)

@graph.stage("decoder")
def decoder(x): return op.transformer_block(x, depth=12, params=dec_params, heads=HEADS)

@graph.pipeline(stages=[encoder, decoder], mesh=mesh, axis="pp")
def model(x): return decoder(encoder(x))

y = np.asarray(model(x))


def layernorm(h, w, b):
    centered = h - h.mean(-1, keepdims=True)
    return centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-5) * w + b


def gelu(u):
    return 0.5 * u * (1 + np.tanh(0.7978845608028654 * (u + 0.044715 * u ** 3)))


def block(h, p):
    """op.transformer_block's layer: causal attention with wqkv's columns
    grouped per head as [heads, (q, k, v), D // heads], then the MLP."""
    dh = D // HEADS
    qkv = (layernorm(h, p["ln1_w"], p["ln1_b"]) @ p["wqkv"]).reshape(B, S, HEADS, 3, dh)
    q, k, v = (qkv[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))     # [B, H, S, dh]
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    scores[..., np.triu(np.ones((S, S), bool), 1)] = -np.inf
    attn = np.exp(scores - scores.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    h = h + (attn @ v).transpose(0, 2, 1, 3).reshape(B, S, D) @ p["wo"]
    u = layernorm(h, p["ln2_w"], p["ln2_b"]) @ p["w1"] + p["b1"]
    return h + gelu(u) @ p["w2"] + p["b2"]


h = x.astype(np.float64)
for p in enc_params + dec_params:
    h = block(h, {k: v.astype(np.float64) for k, v in p.items()})
assert np.abs(h - x).max() > 1.0                    # the blocks do change the input
np.testing.assert_allclose(y, h, rtol=1e-4, atol=1e-4)
if mesh.rank == 0:
    print("OK tutorial_4_4_pipeline_stages")
