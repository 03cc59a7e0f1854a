"""Tutorial 4.3 (collectives in per-rank code), as written on 2 dp ranks:
`@op.kernel` runs `dp_step` on each rank's rows of `x` (the data filled in)
and `dist.allreduce` sums the local x x^T over dp. Checked against numpy.

    tessera launch -n 2 examples/design_docs/tutorial_4_3_collectives.py
"""
import numpy as np

from tessera import dist, op

mesh = dist.Mesh(axes=["dp"], devices=range(2))
data = np.random.default_rng(3).standard_normal((6, 4)).astype(np.float32)
x = dist.from_numpy(data, dist.ShardSpec((0,), ("dp",)), mesh)


@op.kernel
def dp_step(x):
    # Local gradient
    grad = op.matmul(x, x.T)
    # Global sync across data-parallel axis
    grad = dist.allreduce(grad, axis="dp")
    return grad


grad = dp_step(x)
np.testing.assert_allclose(grad.local(), data[:3] @ data[:3].T + data[3:] @ data[3:].T,
                           rtol=1e-5, atol=1e-5)
if mesh.rank == 0:
    print("OK tutorial_4_3_collectives")
