"""Training guide, tensor parallelism, as written on 2 tp ranks (the
guide's file ends inside `tensor_parallel_attention`; it is finished with
the row-parallel output projection and an all_reduce). Data filled in: bf16
DTensors, the weights split by output columns (`w_qkv` grouped so that each
rank's columns hold its heads' q, k and v) and `w_out` by input rows.
`ts.distribute(strategy="tensor_parallel")` without layouts makes each a
per-rank function of its arguments' blocks. Checked against float64 numpy.

    tessera launch -n 2 examples/design_docs/training_tensor_parallel.py
"""
import numpy as np

import tessera as ts
from tessera import dist

@ts.function
@ts.distribute(strategy="tensor_parallel", mesh_axes=["tp"])
def tensor_parallel_linear(
    x: ts.Tensor["B", "S", "D_in", ts.bf16],
    weight: ts.Tensor["D_in", "D_out", ts.bf16],
    bias: ts.Tensor["D_out", ts.bf16] = None
) -> ts.Tensor["B", "S", "D_out", ts.bf16]:
    """Tensor parallel linear layer."""
    partial_output = ts.matmul(x, weight)
    if bias is not None:
        partial_output = partial_output + bias
    complete_output = ts.distributed.all_gather(partial_output, axis="tp")
    return complete_output


@ts.function
@ts.distribute(strategy="tensor_parallel", mesh_axes=["tp"])
def tensor_parallel_attention(
    x: ts.Tensor["B", "S", "D", ts.bf16],
    w_qkv: ts.Tensor["D", "3*D_head*H", ts.bf16],
    w_out: ts.Tensor["D_head*H", "D", ts.bf16],
    num_heads: int
) -> ts.Tensor["B", "S", "D", ts.bf16]:
    B, S, D = x.shape
    local_heads = num_heads // ts.mesh.current().size  # Heads per GPU
    head_dim = D // num_heads
    local_qkv = ts.matmul(x, w_qkv)  # [B, S, 3*D_head*local_heads]
    q, k, v = ts.split(local_qkv, sections=3, dim=-1)
    q = q.reshape(B, S, local_heads, head_dim).transpose(1, 2)
    k = k.reshape(B, S, local_heads, head_dim).transpose(1, 2)
    v = v.reshape(B, S, local_heads, head_dim).transpose(1, 2)
    local_attn_out = ts.nn.flash_attention(q, k, v, causal=True)
    local_attn_out = local_attn_out.transpose(1, 2).reshape(B, S, -1)
    return dist.all_reduce(ts.matmul(local_attn_out, w_out), axis="tp")


mesh = dist.Mesh(axes=["tp"], devices=range(2))
rng = np.random.default_rng(11)
x = rng.standard_normal((2, 3, 8)).astype(ts.bf16)
weight = rng.standard_normal((8, 6)).astype(ts.bf16)
bias = rng.standard_normal((6,)).astype(ts.bf16)
w_qkv = (0.3 * rng.standard_normal((8, 24))).astype(ts.bf16)
w_out = (0.3 * rng.standard_normal((8, 8))).astype(ts.bf16)
cols, rows = dist.ShardSpec(("col",), ("tp",)), dist.ShardSpec(("row",), ("tp",))

y = tensor_parallel_linear(dist.from_numpy(x, mesh=mesh), dist.from_numpy(weight, cols, mesh),
                           dist.from_numpy(bias, cols, mesh))
f64 = [a.astype(np.float64) for a in (x, weight, bias, w_qkv, w_out)]
np.testing.assert_allclose(np.asarray(y.local(), np.float64), f64[0] @ f64[1] + f64[2],
                           rtol=1e-2, atol=3e-2)

att = tensor_parallel_attention(dist.from_numpy(x, mesh=mesh), dist.from_numpy(w_qkv, cols, mesh),
                                dist.from_numpy(w_out, rows, mesh), 4)
B, S, D, heads = 2, 3, 8, 4
width, local = D // heads, heads // 2
expected = np.zeros((B, S, D))
for r in range(2):          # rank r's heads: its column block of w_qkv, row block of w_out
    q, k, v = np.split(f64[0] @ f64[3][:, 12 * r:12 * (r + 1)], 3, axis=-1)
    q, k, v = (t.reshape(B, S, local, width).transpose(0, 2, 1, 3) for t in (q, k, v))
    s = np.where(np.tril(np.ones((S, S), bool)), q @ k.transpose(0, 1, 3, 2) / np.sqrt(width),
                 -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(B, S, local * width)
    expected += o @ f64[4][local * width * r:local * width * (r + 1)]
np.testing.assert_allclose(np.asarray(att.local(), np.float64), expected, rtol=5e-2, atol=5e-2)
if mesh.rank == 0:
    print("OK training_tensor_parallel")
