"""Performance guide 7.4, as written on 2 dp ranks: per-rank `W_local` and
`X_local` (the data filled in, different on each rank), an eager matmul and
an all_reduce over dp. Checked against the sum of both ranks' products.

    tessera launch -n 2 examples/design_docs/performance_7_4_collectives.py
"""
import numpy as np

from tessera import dist, op

mesh = dist.Mesh(axes=["dp"], devices=range(2))
rank = mesh.rank
W_local = np.random.default_rng(10 + rank).standard_normal((3, 4)).astype(np.float32)
X_local = np.random.default_rng(20 + rank).standard_normal((4, 2)).astype(np.float32)

Y_local = op.matmul(W_local, X_local)
Y_global = dist.all_reduce(Y_local, axis="dp")   # combine across data-parallel axis

expected = sum(np.random.default_rng(10 + r).standard_normal((3, 4)).astype(np.float32)
               @ np.random.default_rng(20 + r).standard_normal((4, 2)).astype(np.float32)
               for r in range(2))
np.testing.assert_allclose(Y_global, expected, rtol=1e-5, atol=1e-6)
if rank == 0:
    print("OK performance_7_4_collectives")
