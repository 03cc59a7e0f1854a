"""A weight whose split dimension does not divide over the mesh axis."""

import numpy as np

from tessera import dist

mesh = dist.Mesh(axes=["tp"], devices=range(2))
w1 = np.zeros((16, 15), dtype=np.float32)
W1 = dist.from_numpy(w1, layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)
print("unreachable")
