"""What observability costs: the example GPT's training step run by the
runtime of this commit with profiling off and on, against the runtime of a
commit before the profiler and flight recorder existed (`--base`, default
98bddeb), on the same compiled bundle, in one invocation.

The step is `examples/train_gpt.py`'s (width 128, depth 2, batch 32): the
script runs it for 2 steps on `--ranks` ranks (1: the README's example; 4:
dp 2 x tp 2, where every collective goes through the flight recorder's
bounded wait), and the bundle of its training step (the one with the most
instructions) is then run through `tessera_runtime.load_bundle` alone,
`--runs` times per variant after 3 warm-up runs, variants interleaved in
rounds (each variant first in turn) so that drift hits each alike. Prints the median step time of each
variant and the ratio to the base; writes bench/results/profile_overhead-<date>.json/.md.

    .venv/bin/python bench/profile_overhead.py              # 1 rank
    .venv/bin/python bench/profile_overhead.py --ranks 4    # dp 2 x tp 2
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
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs one variant's timing inside each rank (plain Python: the runtime only).
RUNNER = r"""
import json, sys, time
import numpy as np
import tessera_runtime as rt
from tessera_runtime import world
bundle, variant, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
prog = rt.load_bundle(bundle)
rng = np.random.default_rng(0)
def make(spec):
    if spec.dtype.kind in "iu":
        return rng.integers(0, 4, spec.local_shape).astype(spec.dtype)
    return (rng.standard_normal(spec.local_shape) * 0.02).astype(spec.dtype)
inputs = [make(s) for s in prog.inputs]
if variant == "on":
    from tessera_runtime import profiler
    profiler.start()
for _ in range(3):
    prog.run(inputs)
times = []
for _ in range(runs):
    t0 = time.perf_counter()
    prog.run(inputs)
    times.append(time.perf_counter() - t0)
if world()[0] == 0:
    print(json.dumps(times))
"""


def _mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1, choices=[1, 4])
    ap.add_argument("--runs", type=int, default=20, help="timed runs per variant and round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--base", default="98bddeb", help="commit of the runtime to compare with")
    opts = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tessera-overhead-"))
    env = {**os.environ, "TESSERA_CACHE_DIR": str(work / "cache"), "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    gpt = [sys.executable, str(REPO / "examples" / "train_gpt.py"), "--steps", "2"]
    if opts.ranks == 4:
        gpt = [sys.executable, "-m", "tessera", "launch", "-n", "4", *gpt[1:], "--tp", "2"]
    print(f"[bench] compiling the example GPT step on {opts.ranks} rank(s)", flush=True)
    subprocess.run(gpt, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    bundle = max((work / "cache" / "bundles").glob("*.tsb"),
                 key=lambda b: len(json.loads((b / "program.json").read_text())["instructions"]))
    n_instr = len(json.loads((bundle / "program.json").read_text())["instructions"])

    base = work / "base"
    base.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", opts.base, "runtime"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
    paths = {"base": str(base / "runtime"), "off": str(REPO / "runtime"),
             "on": str(REPO / "runtime")}
    times: dict = {k: [] for k in paths}
    print(f"[bench] bundle {bundle.name}: {n_instr} instructions; {opts.rounds} rounds x "
          f"{opts.runs} runs per variant", flush=True)
    order = list(paths)
    for rnd in range(opts.rounds):
        order = order[1:] + order[:1]           # each variant takes each place in turn
        for variant in order:
            path = paths[variant]
            cmd = [sys.executable, "-c", RUNNER, str(bundle), variant, str(opts.runs)]
            if opts.ranks > 1:
                cmd = [_mpiexec(), "-n", str(opts.ranks), *cmd]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=work,
                                 env={**env, "PYTHONPATH": path})
            times[variant] += json.loads(out.stdout.strip().splitlines()[-1])
        print(f"[bench] round {rnd + 1}/{opts.rounds} done", flush=True)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    rows = [(k, med[k], med[k] / med["base"]) for k in ("base", "off", "on")]
    lines = [f"# Observability overhead, example GPT step on {opts.ranks} rank(s)", "",
             f"machine: {platform.node()} ({os.cpu_count()} cores), commit {commit}, base "
             f"{opts.base}, {datetime.date.today()}; {len(times['base'])} runs per variant",
             "", "| runtime | median step (ms) | vs base |", "|---|---:|---:|"]
    names = {"base": f"{opts.base} (no profiler, no flight recorder)",
             "off": "this commit, profiling off (flight recorder on)",
             "on": "this commit, profiling on"}
    lines += [f"| {names[k]} | {ms:.2f} | {ratio:.3f}x |" for k, ms, ratio in rows]
    text = "\n".join(lines)
    print(text)
    out = REPO / "bench" / "results" / f"profile_overhead-{datetime.date.today()}-{opts.ranks}rank"
    out.with_suffix(".md").write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps({"commit": commit, "base": opts.base,
                                                    "ranks": opts.ranks, "median_ms": med,
                                                    "times_s": times}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
