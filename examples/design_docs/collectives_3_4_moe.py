"""Collectives guide 3.4 (MoE with DeepEP/NVSHMEM), on 4 ranks.

`op.moe` as written over an `ep` x `dp` = 2 x 2 mesh instead of 64
devices, eager at top level on numpy arrays: 8 experts split over `ep` (4
per rank), the 64 tokens over `ep` and `dp`, top-2 routing; checked against
a float64 numpy MoE. The transport dict is accepted and checked; on the CPU
the exchange runs over the communicator's all-to-all (MPI here; on the GPU
target it is NVSHMEM exchange kernels), and what travels is packed as the
dict asks: the dispatched rows in FP8 e4m3 with a scale per row, the
experts' outputs in bf16; the check allows that rounding.

Then the guide's `@schedule(pipeline=True, overlap=True,
comm_backend="nvshmem", epoch="soft")` line as written, on a `train_step`
that has something to schedule (the guide's returns the `y` computed
above): two MoE layers (op.moe naming no transport) as the stages of a
pipeline over a `pp` x `ep` = 2 x 2 mesh of the same ranks, returning the
loss and its gradients. `pipeline=True` makes it a pipelined step (4
microbatches: the guide's 3.3 tip, at least 2 per stage, set with
`schedule.pipeline_microbatches`); `overlap=True` overlaps its
collectives with compute; `comm_backend="nvshmem"` makes the layers'
exchanges NVSHMEM kernels on the GPU target, and on the CPU, which has
none, says so (a ScheduleWarning) and runs them over MPI; `epoch="soft"`
is how Tessera ends every routing epoch already (a stream-ordered
barrier). Checked: the loss against float64 numpy, the gradients against
the same step compiled without `@schedule` (unpipelined).

    tessera launch -n 4 examples/design_docs/collectives_3_4_moe.py
"""
import warnings

import numpy as np

rng = np.random.default_rng(11)
T, D, F, E = 64, 16, 32, 8


def make_experts(D, F, E):
    return {"router": rng.standard_normal((D, E)).astype(np.float32),
            "w1": (rng.standard_normal((E, D, F)) / 4).astype(np.float32),
            "w2": (rng.standard_normal((E, F, D)) / 6).astype(np.float32)}


x = rng.standard_normal((T, D)).astype(np.float32)
experts = make_experts(D, F, E)

from tessera import op, dist, schedule
mesh = dist.Mesh(axes=["ep","dp"], devices=range(4))
y = op.moe(x, experts=experts, router="topk", k=2,
           transport={"type":"nvshmem","multi_qp":True,"pack_dtype":"fp8_e4m3"},
           deterministic=True, mesh=mesh)


def numpy_moe(x, experts):
    """float64: each token's two largest router logits pick its experts,
    weighted by the softmax over those two; an expert is gelu(x @ w1[e]) @ w2[e]."""
    x = x.astype(np.float64)
    logits = x @ experts["router"]
    top = np.argsort(-logits, axis=1, kind="stable")[:, :2]
    picked = np.take_along_axis(logits, top, 1)
    gates = np.exp(picked - picked.max(1, keepdims=True))
    gates /= gates.sum(1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(len(x)):
        for j, e in enumerate(top[t]):
            h = x[t] @ experts["w1"][e]
            h = 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))
            out[t] += gates[t, j] * (h @ experts["w2"][e])
    return out


expected = numpy_moe(x, experts)
# The rows travel rounded to e4m3 (3 bits of mantissa: up to 6% of a value,
# a few % after the experts' sums), the outputs to bf16.
err = np.abs(np.asarray(y) - expected).max() / np.abs(expected).max()
assert err < 0.05, f"largest error {err:.3g} of the largest output"

# -- the guide's @schedule(...) line, on a two-layer MoE training step --------------
import tessera as ts
from tessera import graph

schedule.pipeline_microbatches(4)
step_mesh = dist.Mesh(axes=["pp", "ep"], devices=range(4))
layers = [make_experts(8, 16, 4) for _ in range(2)]
batch = {"x": rng.standard_normal((16, 8)).astype(np.float32),
         "y": rng.standard_normal((16, 8)).astype(np.float32)}


@graph.stage("moe")
def moe_layer(experts, h):
    return h + op.moe(h, experts=experts, router="topk", k=2, mesh=step_mesh)


def loss_and_grads(layers, batch):
    def loss_fn(layers):
        h = batch["x"]
        for experts in layers:
            h = moe_layer(experts, h)
        return op.mean((h - batch["y"]) ** 2)
    return ts.value_and_grad(loss_fn)(layers)


with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always", schedule.ScheduleWarning)

    @schedule(pipeline=True, overlap=True, comm_backend="nvshmem", epoch="soft")
    @ts.compile(mesh=step_mesh)
    def train_step(layers, batch): return loss_and_grads(layers, batch)

    loss, grads = train_step(layers, batch)

unscheduled = ts.compile(loss_and_grads, mesh=step_mesh)
loss_ref, grads_ref = unscheduled(layers, batch)

h = batch["x"].astype(np.float64)
for experts in layers:
    h = h + numpy_moe(h, experts)
np.testing.assert_allclose(float(loss), np.mean((h - batch["y"]) ** 2), rtol=1e-5)
for ours, theirs in zip(grads, grads_ref):
    for name in ours:
        np.testing.assert_allclose(np.asarray(ours[name]), np.asarray(theirs[name]),
                                   rtol=1e-4, atol=1e-6, err_msg=name)
assert isinstance(train_step, ts.pipeline.PipelinedFunction)
assert train_step.microbatches == 4 and train_step.overlap
if step_mesh.rank == 0:            # (rank 0 compiles, and says why NVSHMEM is not used)
    assert any("the CPU target has no NVSHMEM kernels" in str(w.message) for w in said), \
        [str(w.message) for w in said]
    print(train_step.pipeline_report())
    print("OK collectives_3_4_moe")
