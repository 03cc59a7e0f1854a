"""Collectives guide 3.4 (MoE), on 4 ranks: `op.moe` as written over an
`ep` x `dp` = 2 x 2 mesh instead of 64 devices, eager at top level on numpy
arrays: 8 experts split over `ep` (4 per rank), the 64 tokens over `ep` and
`dp`, top-2 routing; checked against a float64 numpy MoE. The transport
dict is accepted and checked; on the CPU the exchange runs over the
communicator's all-to-all (MPI here; on the GPU target it is NVSHMEM
exchange kernels), and what travels is packed as the dict asks: the
dispatched rows in FP8 e4m3 with a scale per row, the experts' outputs in
bf16; the check allows that rounding.
The `@schedule(pipeline=True, overlap=True, comm_backend="nvshmem",
epoch="soft")` decorator that follows in the guide is not scripted:
`tessera.schedule` holds defaults (performance guide 7.7), not a decorator.

    tessera launch -n 4 examples/design_docs/collectives_3_4_moe.py
"""
import numpy as np

rng = np.random.default_rng(11)
T, D, F, E = 64, 16, 32, 8
x = rng.standard_normal((T, D)).astype(np.float32)
experts = {"router": rng.standard_normal((D, E)).astype(np.float32),
           "w1": (rng.standard_normal((E, D, F)) / 4).astype(np.float32),
           "w2": (rng.standard_normal((E, F, D)) / 6).astype(np.float32)}

from tessera import op, dist, schedule
mesh = dist.Mesh(axes=["ep","dp"], devices=range(4))
y = op.moe(x, experts=experts, router="topk", k=2,
           transport={"type":"nvshmem","multi_qp":True,"pack_dtype":"fp8_e4m3"},
           deterministic=True, mesh=mesh)

# float64: each token's two largest router logits pick its experts, weighted
# by the softmax over those two; an expert is gelu(x @ w1[e]) @ w2[e].
logits = x.astype(np.float64) @ experts["router"]
top = np.argsort(-logits, axis=1, kind="stable")[:, :2]
picked = np.take_along_axis(logits, top, 1)
gates = np.exp(picked - picked.max(1, keepdims=True))
gates /= gates.sum(1, keepdims=True)
expected = np.zeros((T, D))
for t in range(T):
    for j, e in enumerate(top[t]):
        h = x[t].astype(np.float64) @ experts["w1"][e]
        h = 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))
        expected[t] += gates[t, j] * (h @ experts["w2"][e])
# The rows travel rounded to e4m3 (3 bits of mantissa: up to 6% of a value,
# a few % after the experts' sums), the outputs to bf16.
err = np.abs(np.asarray(y) - expected).max() / np.abs(expected).max()
assert err < 0.05, f"largest error {err:.3g} of the largest output"
if mesh.rank == 0:
    print("OK collectives_3_4_moe")
