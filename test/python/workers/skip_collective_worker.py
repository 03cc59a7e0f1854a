"""Rank 1 skips the third call of a tensor-parallel step, so the others
wait in its all_reduce until TESSERA_COLLECTIVE_TIMEOUT; run under
`tessera launch`, whose flight recorder names rank 1."""
import numpy as np

import tessera as ts
from tessera import dist, op

mesh = dist.Mesh(axes=["tp"], devices=range(3))
rng = np.random.default_rng(0)
X = dist.from_numpy(rng.standard_normal((4, 6), dtype=np.float32), mesh=mesh)
W = dist.from_numpy(rng.standard_normal((6, 4), dtype=np.float32),
                    layout=dist.ShardSpec(partition=(0,), mesh_axes=("tp",)), mesh=mesh)


@ts.compile(mesh=mesh)
def row_parallel(x, w):
    return op.matmul(x, w)          # a partial sum over tp: one all_reduce


for step in range(3):
    if mesh.rank == 1 and step == 2:
        continue
    row_parallel(X, W)
print(f"rank {mesh.rank} done", flush=True)
