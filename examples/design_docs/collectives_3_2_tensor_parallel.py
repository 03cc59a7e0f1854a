"""Collectives guide 3.2 (tensor parallel), as written on a 2 x 1 tp x dp
mesh (the guide's 16 devices need 16 ranks), top level, eager: a
column-split weight, `op.matmul`, `dist.all_gather`. `H` and `X` are the
data filled in. Checked against numpy.

    tessera launch -n 2 examples/design_docs/collectives_3_2_tensor_parallel.py
"""
import numpy as np

from tessera import dist, op

H = 8
X = np.random.default_rng(1).standard_normal((4, H)).astype(np.float32)

mesh = dist.Mesh(axes=["tp","dp"], devices=range(2))
W = dist.tensor((H, 4*H), layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)
Y = op.matmul(X, W)                  # sharded GEMM
Y = dist.all_gather(Y, axis="tp")    # or fused epilogue gather

np.testing.assert_allclose(Y.local(), X @ W.numpy(), rtol=1e-5, atol=1e-5)
if mesh.rank == 0:
    print("OK collectives_3_2_tensor_parallel")
