"""Performance guide 7.4, as written after 7.2's tp x dp mesh, on 2 x 2
ranks instead of 4 x 4: per-rank `W_local` and `X_local` (the data filled
in, different on each rank), an eager matmul and an all_reduce over dp,
which must sum each tp row's two dp ranks (those with its tp coordinate)
and leave the tp rows apart. Checked against the sum of those ranks'
products.

The all_reduce's group comes from the default mesh, the mesh made last
(7.2's); the eager matmul, a one-op program on the job's ranks, does not
change it.

    tessera launch -n 4 examples/design_docs/performance_7_4_collectives.py
"""
import numpy as np

from tessera import dist, op

# (7.2, on 2 x 2 devices)
mesh = dist.Mesh(axes=["tp", "dp"], devices=range(4))


def local_data(rank: int):
    """(W_local, X_local) of `rank`: different on every rank."""
    return (np.random.default_rng(10 + rank).standard_normal((3, 4)).astype(np.float32),
            np.random.default_rng(20 + rank).standard_normal((4, 2)).astype(np.float32))


W_local, X_local = local_data(mesh.rank)

Y_local = op.matmul(W_local, X_local)
Y_global = dist.all_reduce(Y_local, axis="dp")   # combine across data-parallel axis

# The devices fill the mesh row-major: rank = 2 * tp + dp.
tp = mesh.coords["tp"]
assert mesh.rank == 2 * tp + mesh.coords["dp"]
expected = sum(np.matmul(*local_data(2 * tp + dp)) for dp in range(2))
np.testing.assert_allclose(Y_global, expected, rtol=1e-5, atol=1e-6)
if mesh.rank == 0:
    print("OK performance_7_4_collectives")
