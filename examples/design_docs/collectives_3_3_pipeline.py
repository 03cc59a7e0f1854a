"""Collectives guide 3.3 (pipeline), as written, on 4 `pp` ranks: compose
marks b0..b3 as stages (in the list `stages`, so the loop calls them), and
`pipeline.run` splits the batch into 16 microbatches over the 1F1B
schedule. The stages are small matmul + tanh layers (the doc leaves them
open); checked against numpy.

    tessera launch -n 4 examples/design_docs/collectives_3_3_pipeline.py
"""
import numpy as np

from tessera import dist, op

rng = np.random.default_rng(5)
W = [(rng.standard_normal((8, 8)) * 0.4).astype(np.float32) for _ in range(4)]
b0, b1, b2, b3 = [lambda x, w=w: op.tanh(op.matmul(x, w)) for w in W]
data = rng.standard_normal((32, 8)).astype(np.float32)

from tessera import pipeline
stages = [b0,b1,b2,b3]
pipe = pipeline.compose(stages=4, assign=stages)

@pipeline.run(mesh_axes=("pp",), schedule="1F1B", microbatches=16)
def step(x):
    for b in stages: x = b(x)
    return x

y = np.asarray(step(data))
expected = data.astype(np.float64)
for w in W:
    expected = np.tanh(expected @ w)
np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
if dist.Mesh(axes=["pp"], devices=range(4)).rank == 0:
    print(step.pipeline_report())
    print("OK collectives_3_3_pipeline")
