"""Tutorial 4.4 (pipeline stages), as written, on 2 `pp` ranks: `encoder`
and `decoder` are stages, `graph.pipeline` runs `model` over them. The doc's
`op.transformer_block(x, depth=12)` is a one-layer MLP block here (Tessera
has no transformer_block op); checked against numpy.

    tessera launch -n 2 examples/design_docs/tutorial_4_4_pipeline_stages.py
"""
import numpy as np

from tessera import dist, op

mesh = dist.Mesh(axes=["pp"], devices=range(2))
rng = np.random.default_rng(6)
W_enc, W_dec = [(rng.standard_normal((8, 8)) * 0.4).astype(np.float32) for _ in range(2)]
x = rng.standard_normal((8, 8)).astype(np.float32)


class op_:                                  # the stand-in for op.transformer_block
    @staticmethod
    def transformer_block(x, depth):
        w = W_enc if depth == "enc" else W_dec
        return x + op.relu(op.matmul(x, w))


from tessera import graph

@graph.stage("encoder")
def encoder(x): return op_.transformer_block(x, depth="enc")

@graph.stage("decoder")
def decoder(x): return op_.transformer_block(x, depth="dec")

@graph.pipeline(stages=[encoder, decoder], mesh=mesh, axis="pp")
def model(x): return decoder(encoder(x))

y = np.asarray(model(x))
h = x.astype(np.float64)
for w in (W_enc, W_dec):
    h = h + np.maximum(h @ w, 0)
np.testing.assert_allclose(y, h, rtol=1e-5, atol=1e-5)
if mesh.rank == 0:
    print("OK tutorial_4_4_pipeline_stages")
