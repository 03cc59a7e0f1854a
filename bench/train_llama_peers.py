"""examples/train_llama.py's model and data in Tessera, PyTorch and JAX in one
run: the same initial checkpoint, the same windows of the standard
library's bytes in the same order, AdamW with the same hyperparameters and
gradient clipping (torch's `clip_grad_norm_`). PyTorch runs `transformers`'
LlamaForCausalLM (eager, SDPA attention); JAX runs Hugging Face's Llama
written in `jax.numpy` (RMSNorm, rotate-half RoPE, grouped-query causal
attention, SwiGLU; `jax.jit` of `jax.value_and_grad`) with optax's AdamW.
Prints each peer's loss curve's largest relative gap to Tessera's over
`--steps` and each side's time per step (the median after its first step,
which compiles), and the ratios. A peer that is not installed is said so
and skipped.

    pip install torch transformers safetensors jax optax   # beside Tessera
    python bench/train_llama_peers.py                      # 100 steps, the example's model
    python bench/train_llama_peers.py --steps 30 --width 256 --threads 2

`--threads` sets Tessera's, torch's and XLA's threads alike (XLA_FLAGS,
before JAX is imported). fp32 sums in another order drift apart over many
AdamW steps; a wrong gradient or optimizer is off by far more within a few.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def llama_loss(jnp, jax, config):
    """The loss of HF's LlamaForCausalLM (no bias, untied head) over
    parameters under HF's names, in jax.numpy."""
    c = config
    h, kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim

    def rmsnorm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + c.rms_norm_eps) * w

    def loss(p, inputs, targets):
        batch, length = inputs.shape
        x = p["model.embed_tokens.weight"][inputs]
        inv = 1.0 / c.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
        angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv[None, :]
        angles = jnp.concatenate([angles, angles], -1)[None, :, None, :]
        cos, sin = jnp.cos(angles), jnp.sin(angles)

        def rope(t):
            half = t.shape[-1] // 2
            return t * cos + jnp.concatenate([-t[..., half:], t[..., :half]], -1) * sin
        causal = jnp.tril(jnp.ones((length, length), bool))
        for i in range(c.num_hidden_layers):
            pre = f"model.layers.{i}."
            a = rmsnorm(x, p[pre + "input_layernorm.weight"])

            def proj(v, name):
                return v @ p[pre + name + ".weight"].T

            q = rope(proj(a, "self_attn.q_proj").reshape(batch, length, h, d))
            k = rope(proj(a, "self_attn.k_proj").reshape(batch, length, kv, d))
            v = proj(a, "self_attn.v_proj").reshape(batch, length, kv, d)
            k, v = (jnp.repeat(t, h // kv, axis=2) for t in (k, v))
            s = jnp.einsum("bihd,bjhd->bhij", q, k) / jnp.sqrt(jnp.float32(d))
            s = jnp.where(causal, s, -jnp.inf)
            out = jnp.einsum("bhij,bjhd->bihd", jax.nn.softmax(s, -1), v)
            x = x + proj(out.reshape(batch, length, h * d), "self_attn.o_proj")
            m = rmsnorm(x, p[pre + "post_attention_layernorm.weight"])
            x = x + (jax.nn.silu(proj(m, "mlp.gate_proj")) * proj(m, "mlp.up_proj")) @ \
                p[pre + "mlp.down_proj.weight"].T
        logits = rmsnorm(x, p["model.norm.weight"]) @ p["lm_head.weight"].T
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))
    return loss



def run_torch(folder, batches, args):
    """Losses and seconds per step of transformers' Llama in PyTorch eager."""
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                           attn_implementation="sdpa")
    hf.train()
    opt = torch.optim.AdamW(hf.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    losses, seconds = [], []
    for batch in batches:
        start = time.perf_counter()
        opt.zero_grad()
        logits = hf(input_ids=torch.tensor(batch["inputs"]).long()).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.tensor(batch["targets"]).long().reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - start)
    return losses, seconds, f"torch {torch.__version__}, transformers {transformers.__version__}"


def jax_training(config, lr: float):
    """(optax AdamW, the jitted step(p, opt_state, inputs, targets) -> (loss,
    p, opt_state)) of the Llama in JAX, clipped as torch's clip_grad_norm_."""
    import jax
    import jax.numpy as jnp
    import optax
    jax.config.update("jax_default_matmul_precision", "highest")
    loss_fn = llama_loss(jnp, jax, config)
    tx = optax.adamw(lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1)

    @jax.jit
    def step(p, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(loss_fn)(p, inputs, targets)
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
        scale = jnp.minimum(1.0, 1.0 / (norm + 1e-6))
        updates, opt_state = tx.update(jax.tree.map(lambda g: g * scale, grads), opt_state, p)
        return loss, optax.apply_updates(p, updates), opt_state
    return tx, step


def run_jax(params, config, batches, args):
    """Losses and seconds per step of the same Llama in JAX (optax AdamW)."""
    import jax
    import jax.numpy as jnp
    import optax
    tx, step = jax_training(config, args.lr)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    losses, seconds = jax_losses(step, p, tx.init(p), batches)
    return losses, seconds, f"jax {jax.__version__}, optax {optax.__version__}"


def jax_losses(step, p, opt_state, batches, put=lambda x: x):
    """(losses, seconds per step) of JAX `step` over `batches` (each array
    placed by `put` first)."""
    losses, seconds = [], []
    for batch in batches:
        start = time.perf_counter()
        loss, p, opt_state = step(p, opt_state, put(batch["inputs"]), put(batch["targets"]))
        losses.append(float(loss))                  # (waits for the step)
        seconds.append(time.perf_counter() - start)
    return losses, seconds


def model_arguments(ap, steps: int) -> None:
    """The flags of the model, data and optimizer both Llama benches take."""
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap, steps=100)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("TESSERA_NUM_THREADS", str(args.threads))
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen="
                               f"{'true' if args.threads > 1 else 'false'} "
                               f"intra_op_parallelism_threads={args.threads}").strip()

    import numpy as np

    import tessera as ts
    from tessera import models
    import train_llama

    train_bytes, _, _ = train_llama.stdlib_text(2.0)
    rng = np.random.default_rng(0)
    batches = [train_llama.windows(train_bytes, rng.integers(0, len(train_bytes) - args.seq - 1,
                                                            args.batch), args.seq)
               for _ in range(args.steps)]
    runs, versions = {}, []
    with tempfile.TemporaryDirectory() as scratch:
        folder = train_llama.new_checkpoint(Path(scratch) / "init", args.width, args.depth,
                                            args.heads, args.kv_heads, args.seq, 0)
        model = models.from_pretrained(folder)
        opt = ts.optim.AdamW(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        step = train_llama.make_step(model, opt, clip=1.0)
        params, state, losses, seconds = model.params, opt.init(model.params), [], []
        for batch in batches:
            start = time.perf_counter()
            loss, params, state = step(params, state, batch)
            losses.append(float(loss))
            seconds.append(time.perf_counter() - start)
        runs["tessera"] = (losses, seconds)
        for peer, needs, run in (("torch", "transformers",
                                  lambda: run_torch(folder, batches, args)),
                                 ("jax", "optax",
                                  lambda: run_jax(model.params, model.config, batches, args))):
            if importlib.util.find_spec(peer) is None or importlib.util.find_spec(needs) is None:
                print(f"{peer}: not installed ({peer} and {needs} needed); skipped")
                continue
            losses, seconds, version = run()
            runs[peer] = (losses, seconds)
            versions.append(version)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, {args.threads} thread(s); "
          f"tessera {commit}; {'; '.join(versions)}")
    print(f"Llama {args.depth} layers, width {args.width}, {args.heads} heads "
          f"({args.kv_heads} key/value), bytes; batch {args.batch} x {args.seq}; "
          f"{args.steps} AdamW steps (lr {args.lr}, clip 1.0)")
    ours = np.array(runs["tessera"][0])
    per = {name: float(np.median(s[1:] if len(s) > 1 else s)) for name, (_, s) in runs.items()}
    for name, (losses, _) in runs.items():
        losses = np.array(losses)
        line = f"{name:8s} loss: step 1 {losses[0]:.4f}, step {args.steps} {losses[-1]:.4f}; " \
               f"{per[name] * 1e3:.1f} ms/step"
        if name != "tessera":
            gap = np.abs(ours - losses) / np.abs(losses)
            line += (f"; gap to tessera: largest {gap.max():.2e} (step {int(gap.argmax()) + 1}), "
                     f"first 20 steps {gap[:20].max():.2e}; {name} / tessera time "
                     f"{per[name] / per['tessera']:.2f}")
        print(line)


if __name__ == "__main__":
    main()
