"""The cost model against measurement: the example GPT's training step on a
dp x tp mesh of CPU ranks (default 2 x 2, 4 ranks), predicted by `trace.cost("cpu")` and
measured by `dist.profile()` in the same run.

What it does:
  1. the machine description of this host running dp x tp ranks (`tessera
     calibrate -n 4`, measured once and cached; `--recalibrate` measures again);
  2. `tessera launch -n 4` (dp x tp) of a worker that builds the example's step
     (`examples/train_gpt.py`: Megatron-style tp layout, batch split over dp),
     warms it up, and profiles `--steps` steps; rank 0 also traces the step
     and asks the cost model;
  3. prints, per part of the step (compute, comm exposed = transfer +
     waiting, runtime = the executor's own work, call = outside the runs), the
     measured and predicted milliseconds per step and the error, and writes
     bench/results/cost_model-<date>-<config>[-N].md/.json with machine, commit and date.

    .venv/bin/python bench/cost_model.py                 # width 128, depth 2
    .venv/bin/python bench/cost_model.py --width 256 --batch 16
    .venv/bin/python bench/cost_model.py --dp 1 --tp 2    # 2 ranks: one core each
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in ("examples", "runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

from cpu_ranks import add_gpt_arguments, new_stem  # noqa: E402

PARTS = (("compute", ("compute",), "compute"),
         ("comm exposed", ("transfer", "waiting"), "comm_exposed"),
         ("runtime", ("overhead", "copies"), "runtime"),
         ("call (outside runs)", ("idle",), "call"))


def worker(cfg: dict, steps: int, out: Path) -> None:
    import numpy as np
    import tessera as ts
    import tessera_runtime
    from tessera import dist
    import train_gpt as ex

    mesh = dist.Mesh(axes=["dp", "tp"], shape=(cfg["dp"], cfg["tp"]))
    params = ex.init_params(cfg["width"], cfg["depth"], cfg["heads"], 2 * cfg["length"], 0)
    batch = ex.make_batch(np.random.default_rng(0), cfg["batch"], cfg["length"])
    opt = ts.optim.AdamW(lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)
    state = opt.init(params)
    params, state = ex.distribute(mesh, params, state)
    scaler = ts.optim.loss_scale_init(1.0)
    step = ex.make_step(opt, cfg["heads"], "fp32", clip=1.0)
    micro = [ex.shard_batch(mesh, batch)]
    for _ in range(3):
        step(params, state, scaler, micro)                  # compile, warm up
    with dist.profile(trace=None, steps=steps, show=False) as prof:
        for _ in range(steps):
            step(params, state, scaler, micro)
    if tessera_runtime.world()[0] == 0:
        cost = ts.graph.trace(step, params, state, scaler, micro).cost("cpu")
        measured_kinds: dict = {}
        for key, (seconds, _) in prof._recorder.totals().items():
            kind = key.split(":", 1)[1] if key.startswith("library:") else \
                "generated kernels" if ":" not in key else None
            if kind:
                measured_kinds[kind] = measured_kinds.get(kind, 0.0) + seconds / steps
        predicted_kinds: dict = {}
        for _, what, category, seconds, _ in cost.ranks[0].items:
            if category == "compute":
                kind = what.split("[")[1].rstrip("]") if "[" in what else "generated kernels"
                predicted_kinds[kind] = predicted_kinds.get(kind, 0.0) + seconds
        per_kernel = {k: v[0] / steps for k, v in prof._recorder.totals().items()}
        predicted_kernel: dict = {}
        for _, what, category, seconds, _ in cost.ranks[0].items:
            if category == "compute":
                name = what.split(" [")[0]
                predicted_kernel[name] = predicted_kernel.get(name, 0.0) + seconds
        out.write_text(json.dumps({
            "kernels": {k: [per_kernel.get(k, 0.0), predicted_kernel[k]] for k in predicted_kernel},
            "kinds": {k: [measured_kinds.get(k, 0.0), predicted_kinds.get(k, 0.0)]
                      for k in sorted(set(measured_kinds) | set(predicted_kinds))},
            "measured": prof.ranks,
            "predicted": [{"rank": p.rank, "step_s": p.step_s, **p.parts} for p in cost.ranks],
            "machine": cost.machine.to_json(), "table": cost.table()}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt_arguments(ap)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5,
                    help="measure in this many separate jobs (ranks sharing cores vary "
                         "from job to job): the table holds the median of each part, and "
                         "every job's step error is listed")
    ap.add_argument("--recalibrate", action="store_true")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cfg = {"width": args.width, "depth": args.depth, "heads": args.heads, "batch": args.batch,
           "length": args.length, "dp": args.dp, "tp": args.tp}
    ranks = args.dp * args.tp
    if args.worker:
        worker(cfg, args.steps, Path(args.worker))
        return 0

    from tessera.machine import calibrate, machine
    described = calibrate(ranks) if args.recalibrate else machine("cpu", ranks=ranks)
    out = ROOT / "bench" / "results" / ".cost-model.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(ROOT / p) for p in ("build/dev/python_packages", ".", "passes", "runtime", "examples"))
        + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "tessera", "launch", "--timeout", "900", "-n", str(ranks), __file__,
           *(argv if argv is not None else sys.argv[1:]), "--worker", str(out)]
    jobs = []
    for _ in range(max(1, args.repeats)):
        subprocess.run(cmd, check=True, env=env, cwd=str(ROOT))
        jobs.append(json.loads(out.read_text()))
        out.unlink()
    result = jobs[-1]

    def mean(rows, keys):
        return sum(sum(r[k] for k in keys) / r["steps"] for r in rows) / len(rows)

    def step(rows):
        return sum(r["window"] / r["steps"] for r in rows) / len(rows)

    predicted = result["predicted"]
    rows = []
    for label, mkeys, pkey in PARTS:
        m = statistics.median(mean(job["measured"], mkeys) for job in jobs)
        p = sum(r[pkey] for r in predicted) / len(predicted)
        rows.append((label, m, p))
    p_step = max(r["step_s"] for r in predicted)
    steps = [step(job["measured"]) for job in jobs]
    rows.append(("step", statistics.median(steps), p_step))
    errors = [(p_step - m) / m for m in steps]
    within = sum(abs(e) <= 0.25 for e in errors)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    date = datetime.date.today().isoformat()
    head = (f"cost model vs dist.profile: GPT w{args.width} d{args.depth}, batch {args.batch} x "
            f"{2 * args.length} tokens, dp={args.dp} x tp={args.tp} on {ranks} CPU ranks, "
            f"{args.steps} steps\n"
            f"machine: {platform.node()} ({os.cpu_count()} cores), commit {commit}, {date}\n"
            f"machine description: {described.source}\n")
    lines = [head, f"| part (per step, mean over ranks; median of {len(jobs)} jobs) | "
                   "measured ms | predicted ms | error |", "|---|---:|---:|---:|"]
    for label, m, p in rows:
        err = (p - m) / m if m else float("nan")
        lines.append(f"| {label} | {m * 1e3:.2f} | {p * 1e3:.2f} | {err:+.0%} |")
    lines += ["", "step per job: " + ", ".join(
        f"{m * 1e3:.1f} ms ({e:+.0%})" for m, e in zip(steps, errors))
        + f"; the prediction is within 25% of {within} of {len(jobs)} jobs"]
    lines += ["", "compute by kind, rank 0 (last job):", "",
              "| kind | measured ms | predicted ms | error |", "|---|---:|---:|---:|"]
    for kind, (m, p) in result["kinds"].items():
        err = f"{(p - m) / m:+.0%}" if m else "n/a"
        lines.append(f"| {kind} | {m * 1e3:.2f} | {p * 1e3:.2f} | {err} |")
    text = "\n".join(lines)
    print(text)
    print("\n" + result["table"])
    results = ROOT / "bench" / "results"
    stem = new_stem(                        # (-2, -3, ... for another run the same day)
        results, f"cost_model-{date}-w{args.width}d{args.depth}-dp{args.dp}tp{args.tp}")
    stem.with_suffix(".md").write_text(text + "\n\n```\n" + result["table"] + "\n```\n")
    stem.with_suffix(".json").write_text(json.dumps({
        "config": cfg, "steps": args.steps, "commit": commit, "date": date,
        "jobs_step_s": steps, "jobs_error": errors,
        "host": platform.node(), "rows": [{"part": label, "measured_s": m, "predicted_s": p}
                                          for label, m, p in rows],
        "measured": [job["measured"] for job in jobs], "predicted": predicted, "machine": result["machine"],
        "kernels_rank0_s": result["kernels"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
