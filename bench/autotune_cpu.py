"""Autotuned against default compile options: the example GPT's training step
(examples/train_gpt.py) on one CPU rank, in one run.

The autotuned step searches on its first call (every candidate of the CPU
space measured, TESSERA_AUTOTUNE_CANDIDATES=9, in a fresh cache so nothing
stored is reused); then both steps run `--steps` times, alternating, and the
median of each is printed with their ratio and the options chosen.

    python bench/autotune_cpu.py [--width 128] [--depth 2] [--batch 32] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))

from cpu_ranks import commit_and_date, write_results  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = ap.parse_args()
    os.environ["TESSERA_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera-autotune-bench-")
    os.environ["TESSERA_AUTOTUNE_CANDIDATES"] = "9"

    import tessera as ts
    from tessera import autotune
    import train_gpt as ex

    heads = 4
    params = ex.init_params(args.width, args.depth, heads, 2 * args.length, 0)
    opt = ts.optim.AdamW(lr=3e-3)
    state, scaler = opt.init(params), ts.optim.loss_scale_init(1.0)
    batches = [ex.make_batch(np.random.default_rng(0), args.batch, args.length)]
    steps = {"default": ex.make_step(opt, heads, "fp32", clip=1.0),
             "autotuned": ex.make_step(opt, heads, "fp32", clip=1.0, autotune=True)}
    started = time.perf_counter()
    outputs = {name: step(params, state, scaler, batches) for name, step in steps.items()}
    first_s = time.perf_counter() - started
    loss = {name: float(out[0]) for name, out in outputs.items()}
    times = {name: [] for name in steps}
    for _ in range(args.steps):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step(params, state, scaler, batches)
            times[name].append(time.perf_counter() - t0)
    median = {name: statistics.median(t) for name, t in times.items()}
    (entry,) = autotune.entries().values()
    choice = " ".join(f"{k}={v}" for k, v in entry["choice"].items()) or "the default options"
    text = "\n".join([
        f"autotune: example GPT w{args.width} d{args.depth}, batch {args.batch} x "
        f"{2 * args.length} tokens, 1 rank, training step (median of {args.steps})",
        "",
        "| step | ms |",
        "|---|---:|",
        f"| default options | {median['default'] * 1e3:.2f} |",
        f"| autotuned ({choice}) | {median['autotuned'] * 1e3:.2f} |",
        f"| ratio | {median['autotuned'] / median['default']:.2f}x |",
        "",
        f"search: {entry['measured']} of {entry['candidates']} candidates, "
        f"{entry['search_s']:.1f} s ({entry['ranking']}); during it the choice measured "
        f"{entry['best_s'] * 1e3:.2f} ms against {entry['default_s'] * 1e3:.2f} ms",
        f"both first calls (compile, search) {first_s:.1f} s; losses {loss['default']:.6f} "
        f"and {loss['autotuned']:.6f}"])
    print(text)
    if not args.no_save:
        commit, today = commit_and_date()
        write_results(f"autotune_cpu-w{args.width}d{args.depth}", commit, today,
                      f"{text}\n\ncommit {commit}, {today}",
                      {"config": vars(args), "median_s": median, "choice": entry["choice"],
                       "search": {k: entry[k] for k in ("measured", "candidates", "search_s",
                                                         "best_s", "default_s", "ranking")}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
