"""examples/train_llama.py's model and data in Tessera and in PyTorch
(`transformers`' LlamaForCausalLM), side by side: the same initial
checkpoint, the same windows of the standard library's bytes in the same
order, AdamW with the same hyperparameters and gradient clipping. Prints
both loss curves' largest relative gap over `--steps` and each side's time
per step (after its first, which compiles Tessera's step).

    pip install torch transformers safetensors        # beside Tessera
    python bench/train_llama_torch.py                 # 100 steps, the example's model
    python bench/train_llama_torch.py --steps 100 --width 256 --threads 2

fp32 sums in another order drift apart over many AdamW steps; a wrong
gradient or optimizer is off by far more within a few.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("TESSERA_NUM_THREADS", str(args.threads))

    import numpy as np
    import torch
    import transformers

    import tessera as ts
    from tessera import models
    import train_llama

    torch.set_num_threads(args.threads)
    train_bytes, _, _ = train_llama.stdlib_text(2.0)
    rng = np.random.default_rng(0)
    batches = [train_llama.windows(train_bytes, rng.integers(0, len(train_bytes) - args.seq - 1,
                                                            args.batch), args.seq)
               for _ in range(args.steps)]
    with tempfile.TemporaryDirectory() as scratch:
        folder = train_llama.new_checkpoint(Path(scratch) / "init", args.width, args.depth,
                                            args.heads, args.kv_heads, args.seq, 0)
        model = models.from_pretrained(folder)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                               attn_implementation="sdpa")
    # Tessera
    opt = ts.optim.AdamW(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    step = train_llama.make_step(model, opt, clip=1.0)
    params, state, ours, t_ours = model.params, opt.init(model.params), [], []
    for batch in batches:
        start = time.perf_counter()
        loss, params, state = step(params, state, batch)
        ours.append(float(loss))
        t_ours.append(time.perf_counter() - start)
    # PyTorch
    hf.train()
    torch_opt = torch.optim.AdamW(hf.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1)
    theirs, t_theirs = [], []
    for batch in batches:
        start = time.perf_counter()
        torch_opt.zero_grad()
        logits = hf(input_ids=torch.tensor(batch["inputs"]).long()).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.tensor(batch["targets"]).long().reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        torch_opt.step()
        theirs.append(loss.item())
        t_theirs.append(time.perf_counter() - start)
    ours, theirs = np.array(ours), np.array(theirs)
    gap = np.abs(ours - theirs) / np.abs(theirs)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, {args.threads} thread(s); "
          f"tessera {commit}, torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"Llama {args.depth} layers, width {args.width}, {args.heads} heads "
          f"({args.kv_heads} key/value), bytes; batch {args.batch} x {args.seq}; "
          f"{args.steps} AdamW steps (lr {args.lr}, clip 1.0)")
    print(f"loss: step 1 {ours[0]:.4f} / {theirs[0]:.4f}, step {args.steps} {ours[-1]:.4f} / "
          f"{theirs[-1]:.4f} (tessera / torch)")
    print(f"largest relative gap: {gap.max():.2e} (step {int(gap.argmax()) + 1}); "
          f"first 20 steps: {gap[:20].max():.2e}")
    per_ours, per_theirs = np.median(t_ours[1:]), np.median(t_theirs[1:])
    print(f"time per step (median after the first): tessera {per_ours * 1e3:.1f} ms, torch "
          f"{per_theirs * 1e3:.1f} ms; ratio (torch / tessera) {per_theirs / per_ours:.2f}")


if __name__ == "__main__":
    main()
