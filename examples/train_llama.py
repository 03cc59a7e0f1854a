"""Train a small Llama with Tessera on text every machine has: the bytes of
the Python standard library's own sources.

    python examples/train_llama.py                          # from scratch, bytes as tokens
    python examples/train_llama.py --steps 300 --width 256  # longer, wider
    python examples/train_llama.py --from-pretrained DIR    # fine-tune an HF checkpoint
    python examples/train_llama.py --save out/              # write an HF checkpoint at the end
    tessera launch -n 4 examples/train_llama.py --dp 2 --tp 2    # data x tensor parallel
    tessera launch -n 2 examples/train_llama.py --pp 2 --microbatches 4   # pipeline stages
    python examples/train_llama.py --experts 4 --top-k 2    # Mixtral: 4 SwiGLU experts a layer
    tessera launch -n 4 examples/train_llama.py --experts 4 --ep 2 --dp 2   # expert parallel
    tessera launch -n 2 examples/train_llama.py --cp 2 --seq 256   # sequence split (context parallel)

The model is `tessera.models`' Llama (RMSNorm, rotate-half RoPE, grouped-query
attention, SwiGLU) under Hugging Face's parameter names: a from-scratch run
starts from a checkpoint folder written with random weights (`transformers`
reads it, and reads what `--save` writes), and `--from-pretrained` starts
from yours (Llama, Mistral, Mixtral or Qwen2; its vocabulary must hold the
256 byte values, which are the tokens here). The `.py` files under
`sysconfig.get_paths()["stdlib"]` are read in sorted order; every tenth
file is held out for validation, so the validation loss is measured on code
the model never trained on. Every step draws `--batch` windows of
`--seq` + 1 bytes from the training files (`--seed`); the validation loss
is the mean over `--val-batches` fixed windows, every `--eval-every` steps.
At the end it writes a loss plot (PNG) and prints a greedy continuation.

On a dp x tp mesh the model code does not change: the projections are laid
out Megatron-style over `tp` (q, k, v, gate and up split their output rows,
o and down their input columns, the embedding and the head the vocabulary)
and each batch is split over `dp`; the compiler partitions the step. With
`--pp P` the step's forward is cut into P stages of about equal cost
(`pipeline.run(stages=P)`: the model code names no stage), one per rank of
a `pp` axis, each batch run as `--microbatches` microbatches under
`--schedule`; clipping and AdamW follow as a second compiled function.
With `--experts E` each layer's MLP is Mixtral's mixture of E experts
(`op.moe`, `--top-k` per token); `--ep N` splits them over an `ep` axis
(each rank reads and updates its E/N experts; tokens travel to their
experts and back by all-to-all) and the batch over `dp` x `ep`. With
`--cp N` each window's bytes split over a `cp` axis (context parallelism):
every rank holds and computes 1/N of each sequence, attention included
(its heads exchanged for the sequence by all-to-all, or with
`--cp-attention ring` key/value blocks passed around the cp ranks).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import dist, models, op, pipeline, simulation
from tessera.pretrained import LlamaConfig, Pretrained

BYTES = 256                     # the tokens: byte values


# -- data ------------------------------------------------------------------------

def stdlib_text(limit_mb: float = 8.0) -> tuple[np.ndarray, np.ndarray, int]:
    """(training bytes, validation bytes, files read): the standard
    library's .py files in sorted order (the first `limit_mb` MiB of them),
    every tenth one held out for validation."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, valid, total, files = [], [], 0, 0
    for i, path in enumerate(sorted(root.rglob("*.py"))):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        (valid if i % 10 == 0 else train).append(data)
        files += 1
        total += len(data)
        if total > limit_mb * 2 ** 20:
            break
    return (np.frombuffer(b"\n".join(train), np.uint8), np.frombuffer(b"\n".join(valid), np.uint8),
            files)


def windows(data: np.ndarray, starts: np.ndarray, seq: int) -> dict:
    """Inputs [B, seq] and next-byte targets [B, seq] at `starts`."""
    rows = np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int32)
    return {"inputs": rows[:, :-1], "targets": rows[:, 1:]}


# -- model -----------------------------------------------------------------------

def llama_config(width: int, depth: int, heads: int, kv_heads: int, seq: int,
                 experts: int = 0, top_k: int = 2, ffn: int | None = None) -> dict:
    """A Llama's config.json, its MLP `ffn` wide (default 8/3 of the width;
    a Mixtral's with `experts`: each MLP `experts` SwiGLU experts of half
    the model width, `top_k` per token)."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "vocab_size": BYTES, "hidden_size": width, "intermediate_size": ffn or width * 8 // 3,
              "num_hidden_layers": depth, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "max_position_embeddings": seq,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
              "bos_token_id": None, "eos_token_id": None, "torch_dtype": "float32"}
    if experts:
        del config["mlp_bias"]
        config.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                      intermediate_size=width // 2, num_local_experts=experts,
                      num_experts_per_tok=top_k, sliding_window=None,
                      output_router_logits=False, router_jitter_noise=0.0)
    return config


def new_checkpoint(folder: Path, width: int, depth: int, heads: int, kv_heads: int,
                   seq: int, seed: int, experts: int = 0, top_k: int = 2,
                   ffn: int = 0) -> Path:
    """A Llama checkpoint folder with random weights (normal(0, 0.02)
    matrices, unit norms, as transformers initialises them): config.json
    and model.safetensors under HF's names (`llama_config`)."""
    from safetensors.numpy import save_file
    config = llama_config(width, depth, heads, kv_heads, seq, experts, top_k, ffn)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    parsed = LlamaConfig.from_json(config, str(folder))
    rng = np.random.default_rng(seed)
    weights = {name: (np.ones(shape, np.float32) if name.endswith("norm.weight") else
                      (rng.standard_normal(shape) * 0.02).astype(np.float32))
               for name, shape in parsed.parameter_shapes().items()}
    # (Mixtral's experts fused in memory, per expert in the file)
    save_file(Pretrained(parsed, weights, folder).to_checkpoint(weights),
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def batch_loss(model, params, batch):
    """The mean next-byte cross-entropy of `batch` (traced)."""
    logits = model.config.forward(params, batch["inputs"], None, None)
    return op.cross_entropy(logits, batch["targets"])


def make_step(model, opt, clip: float, cp_attention: str = "auto"):
    """The compiled training step: (loss, params, opt_state). `cp_attention`:
    how attention runs over a sequence split (`TargetOptions.context_parallel`)."""
    @ts.jit(target=ts.TargetOptions(context_parallel=cp_attention))
    def train_step(params, opt_state, batch):
        loss, grads = ts.value_and_grad(lambda p: batch_loss(model, p, batch))(params)
        grads, _ = ts.optim.clip_by_global_norm(grads, clip)
        params, opt_state = opt.update(params, grads, opt_state)
        return loss, params, opt_state
    return train_step


def make_pipeline_step(model, opt, clip: float, mesh, schedule: str, microbatches: int):
    """The training step over a mesh with a `pp` axis: loss and gradients of
    one batch pipelined in `microbatches` over stages the compiler cuts (no
    @graph.stage in the model: `stages=` cuts its ops by forward cost),
    then clipping and AdamW. step(params, opt_state, batch) -> (loss,
    params, opt_state)."""
    @pipeline.run(mesh=mesh, axis="pp", schedule=schedule, microbatches=microbatches,
                  batch="batch", stages=mesh.axis_size("pp"))
    def gradients(params, batch):
        return ts.value_and_grad(lambda p: batch_loss(model, p, batch))(params)

    @ts.jit
    def update(params, opt_state, grads):
        grads, _ = ts.optim.clip_by_global_norm(grads, clip)
        return opt.update(params, grads, opt_state)

    def step(params, opt_state, batch):
        loss, grads = gradients(params, batch)
        params, opt_state = update(params, opt_state, grads)
        return loss, params, opt_state
    return step


def make_eval(model):
    @ts.jit
    def eval_loss(params, batch):
        return batch_loss(model, params, batch)
    return eval_loss


# -- reporting -------------------------------------------------------------------

def plot(train: list, valid: list, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no loss plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.arange(1, len(train) + 1), train, lw=1, label="train")
    if valid:
        steps, losses = zip(*valid)
        ax.plot(steps, losses, "o-", lw=1, label="validation")
    ax.set(xlabel="step", ylabel="loss (nats per byte)",
           title="Llama on the Python standard library's bytes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"loss plot written to {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8, help="windows per step")
    ap.add_argument("--seq", type=int, default=128, help="bytes per window")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2, help="key/value heads (grouped query)")
    ap.add_argument("--ffn", type=int, default=0,
                    help="MLP width (default 8/3 of --width; Llama 3 8B: --width 4096 --ffn 14336)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--from-pretrained", default=None, metavar="DIR",
                    help="start from this Hugging Face checkpoint folder instead of random "
                         "weights (the model flags are then its config's)")
    ap.add_argument("--save", default=None, metavar="DIR",
                    help="write the trained model there as an HF checkpoint folder")
    ap.add_argument("--eval-every", type=int, default=25, metavar="N")
    ap.add_argument("--val-batches", type=int, default=4, metavar="N")
    ap.add_argument("--data-mb", type=float, default=8.0,
                    help="MiB of the standard library's sources to read")
    ap.add_argument("--dp", type=int, default=None,
                    help="data-parallel ranks (default: the ranks left after --tp, --pp, --ep, "
                         "--cp)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks")
    ap.add_argument("--pp", type=int, default=1,
                    help="pipeline stages, one per rank of a pp axis (cut by forward cost)")
    ap.add_argument("--microbatches", type=int, default=4,
                    help="with --pp: microbatches per step (they divide --batch)")
    ap.add_argument("--schedule", default="1F1B", choices=["gpipe", "1F1B", "zero_bubble"],
                    help="with --pp: the pipeline schedule")
    ap.add_argument("--experts", type=int, default=0, metavar="E",
                    help="a Mixtral: each MLP a mixture of E SwiGLU experts (from scratch)")
    ap.add_argument("--top-k", type=int, default=2, help="with --experts: experts per token")
    ap.add_argument("--ep", type=int, default=1,
                    help="expert-parallel ranks: the experts split over an ep axis")
    ap.add_argument("--cp", type=int, default=1,
                    help="context-parallel ranks: each window's bytes split over a cp axis")
    ap.add_argument("--cp-attention", default="auto", choices=["auto", "ring", "ulysses"],
                    help="with --cp: attention by a ring of key/value blocks, by all-to-all "
                         "over heads (Ulysses), or whichever moves fewer bytes (auto)")
    ap.add_argument("--plot", default="llama_loss.png", help="loss plot PNG to write")
    args = ap.parse_args(argv)
    if args.experts and args.from_pretrained:
        ap.error("--experts makes a Mixtral from scratch; --from-pretrained takes the "
                 "checkpoint's own (a Mixtral's experts come with it)")
    if args.experts and not 1 <= args.top_k <= args.experts:
        ap.error(f"--top-k {args.top_k} must be in [1, --experts {args.experts}]")
    if args.ep > 1 and not (args.experts or args.from_pretrained):
        ap.error("--ep splits experts: pass --experts E (or a Mixtral --from-pretrained)")
    if args.ep > 1 and args.pp > 1:
        ap.error("--ep does not run pipelined (--pp) yet")
    if args.dp is None:
        args.dp = max(1, dist.world_size() // (args.tp * args.pp * args.ep * args.cp))
    if args.seq % args.cp:
        ap.error(f"--cp {args.cp} must divide --seq {args.seq} (each rank holds --seq / --cp "
                 f"bytes of every window)")
    mesh = None
    if args.dp * args.ep * args.tp * args.pp * args.cp > 1:
        takers = args.dp * args.ep      # expert-parallel ranks take different tokens
        if args.batch % takers:
            ap.error(f"--batch {args.batch} must be a multiple of --dp x --ep ({takers})")
        if args.pp > 1 and (args.batch // args.dp) % args.microbatches:
            ap.error(f"--microbatches {args.microbatches} must divide each dp rank's batch "
                     f"({args.batch // args.dp})")
        sizes = {"dp": args.dp, "ep": args.ep, "cp": args.cp, "tp": args.tp, "pp": args.pp}
        axes = [a for a, n in sizes.items() if n > 1 or a in ("dp", "tp")]
        shape = tuple(sizes[a] for a in axes)
        mesh = dist.Mesh(axes=axes, shape=shape)
        mesh.require_rank(" ".join(f"--{a} {n}" for a, n in zip(axes, shape)))
    lead = mesh is None or mesh.rank == 0
    say = print if lead else (lambda *a, **k: None)

    train_bytes, valid_bytes, files = stdlib_text(args.data_mb)
    say(f"data: {files} standard-library files, {len(train_bytes) / 2**20:.1f} MiB to train "
        f"on, {len(valid_bytes) / 2**20:.1f} MiB held out")
    with tempfile.TemporaryDirectory() as scratch:
        if simulation.active() is not None and not args.from_pretrained:
            # `tessera simulate`: the parameters are placeholders (shapes only)
            config = LlamaConfig.from_json(llama_config(
                args.width, args.depth, args.heads, args.kv_heads, args.seq, args.experts,
                args.top_k, args.ffn), scratch)
            model = Pretrained(config, {name: simulation.placeholder(shape) for name, shape
                                        in config.parameter_shapes().items()}, Path(scratch))
        else:
            folder = Path(args.from_pretrained) if args.from_pretrained else new_checkpoint(
                Path(scratch) / "init", args.width, args.depth, args.heads, args.kv_heads,
                args.seq, args.seed, args.experts, args.top_k, args.ffn)
            model = models.from_pretrained(folder)
        if args.ep > 1 and not getattr(model.config, "experts", 0):
            ap.error("--ep splits experts: pass --experts E (or a Mixtral --from-pretrained)")
        if model.config.vocab_size < BYTES:
            ap.error(f"--from-pretrained {folder}: a vocabulary of {model.config.vocab_size} "
                     f"does not hold the {BYTES} byte values this example trains on")
        say(f"model: {model.config.describe()}; "
            f"{sum(int(np.prod(p.shape)) for p in model.params.values()):,} parameters"
            + (f"; {mesh.topology}" if mesh else ""))
        opt = ts.optim.AdamW(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        params, opt_state = model.params, opt.init(model.params)
        if mesh is not None:
            layout = model.layout(mesh)     # Megatron over tp, the experts over ep
            params = dist.from_tree(params, layout, mesh)
            opt_state = dist.from_tree(opt_state, layout, mesh)
        step = make_step(model, opt, 1.0, args.cp_attention) if args.pp == 1 else make_pipeline_step(
            model, opt, 1.0, mesh, args.schedule, args.microbatches)
        evaluate = make_eval(model)

        rng = np.random.default_rng(args.seed)
        starts = np.random.default_rng(args.seed + 1).integers(
            0, len(valid_bytes) - args.seq - 1, (args.val_batches, args.batch))

        # windows over dp x ep, each window's bytes over cp
        split = [(0, a) for a in ("dp", "ep") if mesh is not None and a in mesh.axes]
        split += [(1, "cp")] if args.cp > 1 else []

        def shard(batch):
            return batch if mesh is None else dist.from_tree(
                batch, dist.ShardSpec(tuple(d for d, _ in split), tuple(a for _, a in split)),
                mesh)

        def validation() -> float:
            return float(np.mean([float(evaluate(params, shard(windows(valid_bytes, s, args.seq))))
                                  for s in starts]))

        losses, valid = [], [(0, validation())]
        say(f"step    0: validation {valid[0][1]:.4f} (ln 256 = {math.log(BYTES):.3f})")
        start = time.perf_counter()
        for i in range(1, args.steps + 1):
            batch = windows(train_bytes, rng.integers(0, len(train_bytes) - args.seq - 1,
                                                      args.batch), args.seq)
            loss, params, opt_state = step(params, opt_state, shard(batch))
            losses.append(float(loss))
            if i == 1:
                say(f"compiled the training step in {time.perf_counter() - start:.1f} s")
                start = time.perf_counter()
            if i % args.eval_every == 0 or i == args.steps:
                valid.append((i, validation()))
                rate = args.batch * args.seq * (i - 1) / max(time.perf_counter() - start, 1e-9)
                say(f"step {i:4d}: loss {np.mean(losses[-args.eval_every:]):.3f}, validation "
                    f"{valid[-1][1]:.4f}, {rate:,.0f} tokens/s")
        if lead:
            plot(losses, valid, args.plot)
        model.params = {k: np.asarray(v) for k, v in params.items()}
        prompt = b"def main():\n    "
        out = model.generate(np.frombuffer(prompt, np.uint8).astype(np.int32)[None],
                             max_new_tokens=48)
        say("greedy continuation of 'def main():':\n" +
            bytes(int(t) % BYTES for t in out[0]).decode("utf-8", "replace"))
        if args.save and lead:
            say(f"saved to {model.save_pretrained(args.save)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
