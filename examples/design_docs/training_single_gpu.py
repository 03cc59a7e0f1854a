"""Training guide, single-GPU training, as written. Filled in: the helpers
the guide leaves to the user (a small embedding + linear language model,
SGD with weight decay as `optimizer_step`, global-norm gradient clipping, a
seeded dataloader, `save_checkpoint` writing .npz without pickle, the
config's `gradient_checkpointing` as `ts.remat` around the model) and a
config shrunk to 30 steps of a 4 x 8 batch. Checked: the first loss equals
numpy's cross-entropy of the same model, and training lowers the loss.

    python examples/design_docs/training_single_gpu.py
"""
import shutil
import tempfile
from pathlib import Path

import numpy as np
from typing import Dict, Any

import tessera as ts
from tessera import op

VOCAB, WIDTH = 16, 12
CHECKPOINTS = Path(tempfile.mkdtemp(prefix="tessera-single-gpu-"))
losses = []


# -- what the guide leaves to the user ------------------------------------------

def transformer_model(inputs, weights):
    # "gradient_checkpointing" in the config: the backward recomputes the
    # model's forward instead of keeping its activations (ts.remat).
    checkpointing = create_training_config()["gradient_checkpointing"]
    forward = ts.remat(_forward) if checkpointing else _forward
    return forward(inputs, weights)


def _forward(inputs, weights):
    return op.matmul(op.embedding(inputs, weights["embed"]), weights["head"])


def initialize_model_weights(config):
    rng = np.random.default_rng(0)
    return {"embed": (0.5 * rng.standard_normal((VOCAB, WIDTH))).astype(np.float32),
            "head": (0.5 * rng.standard_normal((WIDTH, VOCAB))).astype(np.float32)}


def initialize_optimizer_state(weights, config):
    return {"step": np.zeros((), np.float32)}


def create_dataloader(config):
    rng = np.random.default_rng(1)
    while True:     # a fixed next-token task: token t is followed by (3 t + 1) mod V
        ids = rng.integers(0, VOCAB, (config["batch_size"], config["sequence_length"]))
        yield {"input_ids": ids.astype(np.int32), "labels": ((3 * ids + 1) % VOCAB).astype(np.int32)}


def clip_gradients(gradients, max_norm):
    norm = op.sqrt(sum(op.sum(g * g) for g in gradients.values()))
    scale = op.minimum(max_norm / (norm + 1e-6), 1.0)
    return {k: g * scale for k, g in gradients.items()}


def optimizer_step(weights, gradients, optimizer_state, config):
    lr, decay = config["learning_rate"], config["weight_decay"]
    updated = {k: w - lr * (gradients[k] + decay * w) for k, w in weights.items()}
    return updated, {"step": optimizer_state["step"] + 1.0}


def save_checkpoint(weights, optimizer_state, step):
    np.savez(CHECKPOINTS / f"step{step}.npz", **weights, **optimizer_state)


# -- the guide's code, as written (config and loop length shrunk) ------------------

@ts.function
def compute_loss(
    model_fn: callable,
    inputs: ts.Tensor["B", "S", ts.int32],
    targets: ts.Tensor["B", "S", ts.int32],
    weights: Dict[str, ts.Tensor]
) -> ts.Tensor[ts.f32]:
    """Compute cross-entropy loss for language modeling."""
    logits = model_fn(inputs, weights)  # [B, S, vocab_size]
    logits_flat = logits.reshape(-1, logits.shape[-1])  # [B*S, vocab_size]
    targets_flat = targets.reshape(-1)  # [B*S]
    loss = ts.nn.cross_entropy(logits_flat, targets_flat, ignore_index=-100)
    return loss


@ts.function
def training_step(
    model_fn: callable,
    batch: Dict[str, ts.Tensor],
    weights: Dict[str, ts.Tensor],
    optimizer_state: Dict[str, ts.Tensor],
    config: Dict[str, Any]
) -> tuple[ts.Tensor, Dict[str, ts.Tensor], Dict[str, ts.Tensor]]:
    """Single training step with gradient computation."""
    loss = compute_loss(model_fn, batch["input_ids"], batch["labels"], weights)
    gradients = ts.grad(loss, weights)
    if config.get("gradient_clip_norm", 0) > 0:
        gradients = clip_gradients(gradients, config["gradient_clip_norm"])
    updated_weights, updated_optimizer_state = optimizer_step(
        weights, gradients, optimizer_state, config
    )
    return loss, updated_weights, updated_optimizer_state


def create_training_config():
    """Create training configuration (shrunk: 30 steps of 4 x 8 tokens)."""
    return {"learning_rate": 0.5, "weight_decay": 0.01, "gradient_clip_norm": 1.0,
            "warmup_steps": 0, "total_steps": 30, "batch_size": 4, "sequence_length": 8,
            "mixed_precision": False, "gradient_checkpointing": True}


def train_single_gpu():
    """Complete single GPU training example."""
    config = create_training_config()
    model_weights = initialize_model_weights(config)
    optimizer_state = initialize_optimizer_state(model_weights, config)
    dataloader = create_dataloader(config)
    compiled_step = ts.jit(training_step)
    for step, batch in enumerate(dataloader):
        if step >= config["total_steps"]:
            break
        loss, model_weights, optimizer_state = compiled_step(
            model_fn=transformer_model, batch=batch, weights=model_weights,
            optimizer_state=optimizer_state, config=config)
        losses.append(float(loss.item()))
        if step % 10 == 0:
            print(f"Step {step}: Loss = {loss.item():.4f}")
        if step % 5000 == 0:
            save_checkpoint(model_weights, optimizer_state, step)
    return model_weights


train_single_gpu()
first = next(create_dataloader(create_training_config()))
w = initialize_model_weights(None)
logits = w["embed"].astype(np.float64)[first["input_ids"]] @ w["head"]
logits = logits.reshape(-1, VOCAB)
logp = logits - logits.max(1, keepdims=True)
logp -= np.log(np.exp(logp).sum(1, keepdims=True))
np.testing.assert_allclose(losses[0], -logp[np.arange(32), first["labels"].ravel()].mean(),
                           rtol=1e-5)
assert losses[-1] < 0.5 * losses[0], losses
assert sorted(np.load(CHECKPOINTS / "step0.npz").files) == ["embed", "head", "step"]
shutil.rmtree(CHECKPOINTS)
print("OK training_single_gpu")
