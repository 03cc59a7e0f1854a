"""What the ranks' argument check costs (TESSERA_CHECK_INPUTS), on the
example GPT's training step on a dp = 2 mesh of 2 CPU ranks.

Before the first run of each compiled signature the ranks compare an xxh3
checksum of every argument they must pass alike (the replicated parameters'
and optimizer moments' blocks, the loss scaler; the dp-split batch blocks
are not compared). This script measures, in one `tessera launch -n 2` run:

  * the first call of the step as a user meets it (a fresh compile cache:
    trace, compile, the program agreement, the argument check, the run), and
    the argument check alone on the same arguments (the median of repeats
    of `_rank_agreement.agree_on_inputs`): the check's share of the first call
    (goal: under 2%);
  * later calls in the default mode against TESSERA_CHECK_INPUTS=never, in
    alternating blocks of steps (the check is not run again: goal, no
    difference beyond noise), and in the "always" mode (a check every call).

Both sides run in the same processes, interleaved; the ratios are medians
of the blocks' ratios. Results go to bench/results/input_check-<date>.json/.md.

    .venv/bin/python bench/input_check.py                 # width 128, depth 2
    .venv/bin/python bench/input_check.py --width 512 --depth 4
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

ROOT = Path(__file__).resolve().parent.parent
for _p in ("examples", "runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

from cpu_ranks import (add_gpt_arguments, add_worker_arguments, commit_and_date,  # noqa: E402
                       run_ranks, run_worker, write_results)


def tessera_worker(cfg: dict, out: Path) -> None:
    import numpy as np

    import tessera as ts
    import train_gpt as ex
    from tessera import dist
    from tessera._rank_agreement import agree_on_inputs
    from tessera_runtime import world

    rank = world()[0]
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    params = ex.init_params(cfg["width"], cfg["depth"], cfg["heads"], 2 * cfg["length"], 0)
    opt = ts.optim.AdamW(lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)
    params, state = ex.distribute(mesh, params, opt.init(params))
    scaler = ts.optim.loss_scale_init(1.0)
    batch = ex.make_batch(np.random.default_rng(0), cfg["batch"], cfg["length"])
    micro = [ex.shard_batch(mesh, batch)]
    step = ex.make_step(opt, cfg["heads"], "fp32", clip=1.0)

    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Barrier()
    t0 = time.perf_counter()
    step(params, state, scaler, micro)                 # compiles, agrees, checks, runs
    first_s = time.perf_counter() - t0

    # The check alone, as the first call ran it: the same inputs, repeated.
    prepared = step._prepare((params, state, scaler, micro), {})
    traced = step._programs[prepared.key][1]
    inputs = prepared.agreed() + list(zip(traced.captured_names, traced.captured))
    checked_bytes = sum(int(np.asarray(leaf.local() if isinstance(leaf, dist.DTensor)
                                       else leaf).nbytes) for _, leaf in inputs)
    checks = []
    for _ in range(cfg["repeats"]):
        comm.Barrier()
        t0 = time.perf_counter()
        agree_on_inputs("train_step", inputs, mesh)
        checks.append(time.perf_counter() - t0)

    def block(mode: str) -> float:
        os.environ["TESSERA_CHECK_INPUTS"] = mode
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(cfg["steps"]):
            step(params, state, scaler, micro)
        return (time.perf_counter() - t0) / cfg["steps"]

    for _ in range(2):                                  # warm
        block("never")
    rounds = {"first": [], "never": [], "always": []}
    for r in range(cfg["rounds"]):
        order = ["first", "never", "always"] if r % 2 == 0 else ["always", "never", "first"]
        for mode in order:
            rounds[mode].append(block(mode))
    (out / f"tessera-rank{rank}.json").write_text(json.dumps({
        "first_call_s": first_s, "check_s": statistics.median(checks),
        "checked_arguments": len(inputs), "checked_bytes": checked_bytes, "rounds": rounds}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt_arguments(ap)
    ap.add_argument("--steps", type=int, default=20, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of blocks")
    ap.add_argument("--repeats", type=int, default=20, help="timings of the check alone")
    add_worker_arguments(ap)
    args = ap.parse_args()
    if run_worker(args, {"tessera": tessera_worker}):
        return 0
    cfg = {k: getattr(args, k) for k in ("width", "depth", "heads", "batch", "length", "steps",
                                         "rounds", "repeats")}
    with tempfile.TemporaryDirectory() as tmp:
        # A fresh cache: the first call compiles, as a user's first run does.
        os.environ["TESSERA_CACHE_DIR"] = str(Path(tmp) / "cache")
        reports = run_ranks(__file__, "tessera", 2, cfg, Path(tmp))
    if reports is None:
        return 1
    first = max(r["first_call_s"] for r in reports)
    check = max(r["check_s"] for r in reports)
    rounds = reports[0]["rounds"]
    later = statistics.median(f / n for f, n in zip(rounds["first"], rounds["never"]))
    always = statistics.median(a / n for a, n in zip(rounds["always"], rounds["never"]))
    step_ms = statistics.median(rounds["never"]) * 1e3
    lines = [
        f"input check (TESSERA_CHECK_INPUTS), example GPT w{args.width} d{args.depth}, "
        f"batch {args.batch} x {2 * args.length}, dp=2 (2 CPU ranks)",
        f"  arguments checked: {reports[0]['checked_arguments']} "
        f"({reports[0]['checked_bytes'] / 2**20:.2f} MiB per rank)",
        f"  first call (fresh cache): {first:.2f} s; the check alone: {check * 1e3:.2f} ms "
        f"= {100 * check / first:.3f}% of it (goal < 2%)",
        f"  later calls, default ('first') / 'never': {later:.3f}x (median of "
        f"{args.rounds} rounds of {args.steps} steps; step {step_ms:.1f} ms)",
        f"  later calls, 'always' / 'never': {always:.3f}x",
    ]
    text = "\n".join(lines)
    print(text)
    commit, today = commit_and_date()
    write_results("input_check", commit, today, text, {
        "config": cfg, "first_call_s": first, "check_s": check,
        "check_share_of_first_call": check / first, "later_ratio_first_vs_never": later,
        "later_ratio_always_vs_never": always, "reports": reports})
    return 0


if __name__ == "__main__":
    sys.exit(main())
