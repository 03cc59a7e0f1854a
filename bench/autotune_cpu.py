"""Autotuned against default compile options: the example GPT's training step
(examples/train_gpt.py) on one CPU rank, in one run; with `--pp N`, its
pipelined gradients on N ranks with `microbatches="auto"` against one
microbatch per stage rank.

The autotuned step searches on its first call (every candidate of the CPU
space measured, TESSERA_AUTOTUNE_CANDIDATES=9, in a fresh cache so nothing
stored is reused); then both steps run `--steps` times, alternating, and the
median of each is printed with their ratio and the options chosen.

    python bench/autotune_cpu.py [--width 128] [--depth 2] [--batch 32] [--steps 30]
    python bench/autotune_cpu.py --pp 2 --batch 64     # the microbatch count, 2 ranks

With --pp, `tessera launch -n N` runs the example's `make_pipeline_step(...)
.gradients` (1F1B, one block per stage, depth = N) twice per rank: with
microbatches="auto" (searched on its first call: the counts dividing the
batch from N to 8N, at most TESSERA_AUTOTUNE_CANDIDATES=5) and with N
microbatches; both then run alternating, and rank 0 prints the medians
(the slowest rank's step).
"""

from __future__ import annotations

import argparse
import json
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

from cpu_ranks import commit_and_date, run_ranks, run_worker, write_results  # noqa: E402


def pipeline_worker(cfg: dict, out: Path) -> None:
    """One rank of the --pp run: {"median_s": {...}, "entry": the stored choice}."""
    import tessera as ts
    import train_gpt as ex
    from mpi4py import MPI
    from tessera import autotune, dist
    p = cfg["pp"]
    mesh = dist.Mesh(axes=["dp", "tp", "pp"], shape=(1, 1, p))
    params = ex.init_params(cfg["width"], p, 4, 2 * cfg["length"], 0)
    batch = ex.make_batch(np.random.default_rng(0), cfg["batch"], cfg["length"])
    opt = ts.optim.AdamW(lr=3e-3)
    steps = {f"{p} microbatches": ex.make_pipeline_step(opt, 4, mesh, "1F1B", p, 1.0).gradients,
             "auto": ex.make_pipeline_step(opt, 4, mesh, "1F1B", "auto", 1.0).gradients}
    started = time.perf_counter()
    loss = {name: float(step(params, batch)[0]) for name, step in steps.items()}
    first_s = time.perf_counter() - started
    comm = MPI.COMM_WORLD
    times = {name: [] for name in steps}
    for _ in range(cfg["steps"]):
        for name, step in steps.items():
            comm.Barrier()
            t0 = time.perf_counter()
            step(params, batch)
            times[name].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    comm.Barrier()                      # (rank 0 has stored the choice)
    (entry,) = autotune.entries().values()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"tessera-rank{comm.Get_rank()}.json").write_text(json.dumps({
        "median_s": {n: statistics.median(t) for n, t in times.items()}, "loss": loss,
        "first_s": first_s, "chosen": steps["auto"].microbatches, "entry": entry}))


def main_pipeline(args) -> int:
    cfg = {"pp": args.pp, "width": args.width, "batch": args.batch, "length": args.length,
           "steps": args.steps}
    os.environ["TESSERA_AUTOTUNE_CANDIDATES"] = "5"
    with tempfile.TemporaryDirectory() as out:
        reports = run_ranks(__file__, "tessera", args.pp, cfg, Path(out))
    if not reports:
        return 1
    r = reports[0]
    ref = f"{args.pp} microbatches"
    entry = r["entry"]
    text = "\n".join([
        f"autotune, pipeline microbatch count: example GPT w{args.width}, {args.pp} stages "
        f"(one block each) on {args.pp} CPU ranks, batch {args.batch} x {2 * args.length} "
        f"tokens, 1F1B, loss and gradients (median of {args.steps}, slowest rank)",
        "",
        "| step | ms |",
        "|---|---:|",
        f"| {ref} (one per stage rank) | {r['median_s'][ref] * 1e3:.2f} |",
        f"| microbatches=\"auto\" (chose {r['chosen']}) | {r['median_s']['auto'] * 1e3:.2f} |",
        f"| ratio | {r['median_s']['auto'] / r['median_s'][ref]:.2f}x |",
        "",
        f"search: {entry['measured']} counts ({', '.join(map(str, entry['key']['counts']))}), "
        f"{entry['search_s']:.1f} s; during it the choice measured {entry['best_s'] * 1e3:.2f} "
        f"ms against {entry['default_s'] * 1e3:.2f} ms with {entry['reference']}",
        f"both first calls (compile, search) {r['first_s']:.1f} s; losses "
        + " and ".join(f"{v:.6f}" for v in r["loss"].values())])
    print(text)
    if not args.no_save:
        commit, today = commit_and_date()
        write_results(f"autotune_cpu-pp{args.pp}-w{args.width}", commit, today,
                      f"{text}\n\ncommit {commit}, {today}", {"config": cfg, **r})
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results")
    ap.add_argument("--pp", type=int, default=0,
                    help="tune a pipeline's microbatch count on this many ranks instead")
    ap.add_argument("--worker", choices=["tessera"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if run_worker(args, {"tessera": pipeline_worker}):
        return 0
    os.environ["TESSERA_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera-autotune-bench-")
    if args.pp:
        return main_pipeline(args)
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
