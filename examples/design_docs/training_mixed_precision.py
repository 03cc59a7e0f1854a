"""Training guide, mixed precision, with the two changes a compiled function
needs (the table in README.md says so): the overflow check `if
ts.isfinite(grad_norm):` branches on a value the trace does not have yet,
so it is `ts.where` on the weights and the loss scale; and the loss scale
is returned instead of assigned into `optimizer_state` (an assignment would
be lost, and is an error naming it). The print in the overflow branch goes
with the branch. Filled in: the single-GPU script's model, SGD as
`apply_optimizer_update`, the global gradient norm. Checked: the loss
against numpy's float64 loss of the bf16 model (to bf16 rounding), the loss
scale growing by 1.0001 after a finite step, and after an overflowing one
(a 3e38 scale with a 100x head makes the scaled gradients overflow) the
weights unchanged and the scale halved.

    python examples/design_docs/training_mixed_precision.py
"""
from typing import Dict

import numpy as np

import tessera as ts
from tessera import op

VOCAB, WIDTH = 16, 12


def transformer_model(inputs, weights):
    return op.matmul(op.embedding(inputs, weights["embed"]), weights["head"])


def compute_gradient_norm(gradients):
    return op.sqrt(sum(op.sum(g * g) for g in gradients.values()))


def apply_optimizer_update(weights, gradients, optimizer_state):
    return {k: w - 0.1 * gradients[k] for k, w in weights.items()}


@ts.function
def mixed_precision_step(
    model_fn: callable,
    batch: Dict[str, ts.Tensor],
    weights: Dict[str, ts.Tensor],
    optimizer_state: Dict[str, ts.Tensor]
) -> tuple[ts.Tensor, Dict[str, ts.Tensor], Dict[str, ts.Tensor]]:
    """Training step with automatic mixed precision."""

    # Enable automatic mixed precision
    with ts.autocast(dtype=ts.bf16, enabled=True):
        # Forward pass in reduced precision
        logits = model_fn(batch["input_ids"], weights)
        loss = ts.nn.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            batch["labels"].reshape(-1)
        )

    # Scale loss to prevent gradient underflow
    scaled_loss = loss * optimizer_state["loss_scale"]

    # Backward pass (gradients computed in FP32)
    gradients = ts.grad(scaled_loss, weights)

    # Unscale gradients
    gradients = {k: v / optimizer_state["loss_scale"] for k, v in gradients.items()}

    # Check for overflow
    grad_norm = compute_gradient_norm(gradients)

    finite = ts.isfinite(grad_norm)
    # Update weights, or skip the update
    stepped = apply_optimizer_update(weights, gradients, optimizer_state)
    updated_weights = {k: ts.where(finite, stepped[k], weights[k]) for k in weights}
    # Gradually increase loss scale, or reduce it
    loss_scale = ts.where(finite,
                          ts.minimum(optimizer_state["loss_scale"] * 1.0001,
                                     ts.tensor(65536.0)),   # Max loss scale
                          optimizer_state["loss_scale"] * 0.5)
    return loss, updated_weights, {**optimizer_state, "loss_scale": loss_scale}


rng = np.random.default_rng(2)
weights = {"embed": (0.5 * rng.standard_normal((VOCAB, WIDTH))).astype(np.float32),
           "head": (0.5 * rng.standard_normal((WIDTH, VOCAB))).astype(np.float32)}
ids = rng.integers(0, VOCAB, (4, 8))
batch = {"input_ids": ids.astype(np.int32), "labels": ((3 * ids + 1) % VOCAB).astype(np.int32)}

loss, stepped, state = mixed_precision_step(transformer_model, batch, weights,
                                            {"loss_scale": np.float32(1024.0)})
h = weights["embed"].astype(ts.bf16).astype(np.float64)[ids.ravel()]
logits = h @ weights["head"].astype(ts.bf16).astype(np.float64)
logp = logits - logits.max(1, keepdims=True)
logp -= np.log(np.exp(logp).sum(1, keepdims=True))
np.testing.assert_allclose(float(loss), -logp[np.arange(32), batch["labels"].ravel()].mean(),
                           rtol=2e-2)
np.testing.assert_allclose(float(state["loss_scale"]), 1024.0 * 1.0001, rtol=1e-6)
assert not np.array_equal(stepped["head"], weights["head"])

big = {"embed": weights["embed"], "head": 100 * weights["head"]}
loss, kept, state = mixed_precision_step(transformer_model, batch, big,
                                         {"loss_scale": np.float32(3e38)})
assert all(np.array_equal(kept[k], big[k]) for k in big)
np.testing.assert_allclose(float(state["loss_scale"]), 1.5e38, rtol=1e-6)
print("OK training_mixed_precision")
