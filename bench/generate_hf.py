"""Greedy generation: Tessera's `Pretrained.generate` (a prefill, then one
compiled decode step per token against a fixed-size KV cache) against
Hugging Face `transformers`' `generate(do_sample=False)` on the same
checkpoint, in one run on the CPU.

    pip install torch transformers safetensors        # beside Tessera
    python bench/generate_hf.py                       # a small random Llama
    python bench/generate_hf.py --layers 4 --width 512 --new 64 --batch 4

Makes a Llama checkpoint with random weights (a fixed seed), loads it in
both, checks that they emit the same tokens, and prints the decode tokens
per second of each (new tokens x batch / time of the whole `generate`,
prefill included; the best of `--runs`, after a warm-up run that compiles
Tessera's steps) and their ratio. torch and Tessera get the same number of
threads (`--threads`).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path


def best_seconds(fn, runs: int) -> float:
    fn()                                              # warm-up (Tessera compiles here)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("TESSERA_NUM_THREADS", str(args.threads))

    import numpy as np
    import torch
    import transformers

    import tessera as ts
    from tessera import models

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.width, intermediate_size=args.width * 8 // 3,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=args.prompt + args.new,
        tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(config).eval()
    rng = np.random.default_rng(1)
    ids = rng.integers(0, args.vocab, size=(args.batch, args.prompt)).astype(np.int64)
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder, safe_serialization=True)
        m = models.from_pretrained(Path(folder))
        # Never stop early: both run all --new steps.
        m.eos_token_ids = ()
        hf.generation_config.eos_token_id = None

        def ours():
            return m.generate(ids.astype(np.int32), max_new_tokens=args.new)

        def theirs():
            with torch.no_grad():
                return hf.generate(torch.tensor(ids), attention_mask=torch.ones_like(
                    torch.tensor(ids)), max_new_tokens=args.new, do_sample=False,
                    min_new_tokens=args.new, pad_token_id=0).numpy()
        same = np.array_equal(ours(), theirs())
        t_ours, t_theirs = best_seconds(ours, args.runs), best_seconds(theirs, args.runs)
    tokens = args.new * args.batch
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, "
          f"{args.threads} thread(s); tessera {commit}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print(f"Llama {args.layers} layers, width {args.width}, {args.heads} heads "
          f"({args.kv_heads} key/value), vocabulary {args.vocab}; batch {args.batch}, prompt "
          f"{args.prompt}, {args.new} new tokens; same tokens: {same}")
    print(f"tessera       {tokens / t_ours:8.1f} tokens/s  ({t_ours * 1e3:.1f} ms)")
    print(f"transformers  {tokens / t_theirs:8.1f} tokens/s  ({t_theirs * 1e3:.1f} ms)")
    print(f"ratio (tessera / transformers tokens/s): {t_theirs / t_ours:.2f}")
    del ts


if __name__ == "__main__":
    main()
