"""Training guide, data parallel training, as written on 2 ranks. Filled
in: the helpers the guide leaves to the user (the single-GPU script's small
language model, `adam_optimizer` as one SGD step since the snippet passes it
no optimizer state, a seeded dataloader of global batches) and a global
`config`, which `train_data_parallel` reads but the guide never defines
there. The strategy splits `batch` over the ranks and averages the
gradients. Checked: each step's global loss and the weights after the first
step against numpy on the whole batch.

    tessera launch -n 2 examples/design_docs/training_data_parallel.py
"""
from typing import Any, Dict

import numpy as np

import tessera as ts

VOCAB, WIDTH = 16, 12
steps_seen = []


def transformer_model(inputs, weights):
    return ts.matmul(ts.op.embedding(inputs, weights["embed"]), weights["head"])


def adam_optimizer(weights, gradients, config):
    return {k: w - config["learning_rate"] * gradients[k] for k, w in weights.items()}


def create_training_config():
    return {"learning_rate": 0.5, "batch_size": 4, "sequence_length": 8, "steps": 5}


def initialize_model_weights(config):
    rng = np.random.default_rng(0)
    return {"embed": (0.5 * rng.standard_normal((VOCAB, WIDTH))).astype(np.float32),
            "head": (0.5 * rng.standard_normal((WIDTH, VOCAB))).astype(np.float32)}


def initialize_optimizer_state(weights, config):
    return {}


def create_distributed_dataloader(config, mesh):
    rng = np.random.default_rng(1)
    for _ in range(config["steps"]):   # global batches; the strategy splits them
        ids = rng.integers(0, VOCAB, (config["global_batch_size"], config["sequence_length"]))
        yield {"input_ids": ids.astype(np.int32), "labels": ((3 * ids + 1) % VOCAB).astype(np.int32)}


config = create_training_config()


# -- the guide's code, as written ----------------------------------------------------

@ts.function
@ts.distribute(strategy="data_parallel")
def data_parallel_step(
    model_fn: callable,
    batch: Dict[str, ts.Tensor],
    weights: Dict[str, ts.Tensor],
    config: Dict[str, Any]
) -> tuple[ts.Tensor, Dict[str, ts.Tensor]]:
    """Data parallel training step with automatic gradient synchronization."""
    logits = model_fn(batch["input_ids"], weights)
    loss = ts.nn.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        batch["labels"].reshape(-1)
    )
    gradients = ts.grad(loss, weights)
    updated_weights = adam_optimizer(weights, gradients, config)
    return loss, updated_weights


def setup_data_parallel_training():
    """Setup multi-GPU data parallel training."""
    mesh = ts.mesh.auto()
    print(f"Detected {mesh.size} GPUs: {mesh.device_ids}")
    config = create_training_config()
    config["global_batch_size"] = config["batch_size"] * mesh.size
    config["batch_size_per_gpu"] = config["batch_size"]
    model_weights = initialize_model_weights(config)
    optimizer_state = initialize_optimizer_state(model_weights, config)
    dataloader = create_distributed_dataloader(config, mesh)
    return mesh, model_weights, optimizer_state, dataloader


def train_data_parallel():
    """8-GPU data parallel training example."""
    mesh, weights, optimizer_state, dataloader = setup_data_parallel_training()
    compiled_step = ts.jit(data_parallel_step)
    for step, batch in enumerate(dataloader):
        loss, weights = compiled_step(
            model_fn=transformer_model,
            batch=batch,
            weights=weights,
            config=config
        )
        steps_seen.append((batch, float(loss.item()), weights))
        if step % 100 == 0:
            print(f"Step {step}: Global Loss = {loss.item():.4f}")
    return mesh


mesh = train_data_parallel()


def numpy_loss_and_grads(batch, w):
    ids, labels = batch["input_ids"].ravel(), batch["labels"].ravel()
    h = w["embed"].astype(np.float64)[ids]
    logits = h @ w["head"]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(len(ids)), labels]).mean()
    d = p.copy()
    d[np.arange(len(ids)), labels] -= 1
    d /= len(ids)
    d_embed = np.zeros_like(w["embed"], dtype=np.float64)
    np.add.at(d_embed, ids, d @ w["head"].T)
    return loss, {"head": h.T @ d, "embed": d_embed}


w = initialize_model_weights(config)
for step, (batch, loss, updated) in enumerate(steps_seen):
    expected, grads = numpy_loss_and_grads(batch, w)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)      # the global batch's loss
    updated = {k: v.numpy() for k, v in updated.items()}        # DTensors, replicated
    if step == 0:                                                # averaged gradients, one step
        for k in w:
            np.testing.assert_allclose(updated[k], w[k] - 0.5 * grads[k], rtol=1e-4, atol=1e-6)
    w = updated
if mesh.rank == 0:
    print("OK training_data_parallel")
