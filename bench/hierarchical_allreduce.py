"""Hierarchical all-reduce (tessera-hierarchical-collectives): measured on this
host and predicted at scale, in one run.

1. Measured: a data-parallel gradient step (an MLP's weights, `--params`
   floats) on 4 CPU ranks as 2 "nodes" of 2 (`tessera launch --ranks-per-node
   2`), flat and hierarchical in the same job: the median step of each and
   their ratio. On one host every "node" shares the same memory, so this
   shows the cost of three collectives instead of one, not a network's.
2. Predicted (the cost model, `trace.cost("h100-node")`): the same step's
   gradient all-reduce on dp = 16, 128 and 1024 H100s (8 per node), flat
   and hierarchical, traced in this one process.

    python bench/hierarchical_allreduce.py [--params 1048576] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_ranks import add_worker_arguments, commit_and_date, run_ranks, run_worker, write_results  # noqa: E402

import tessera as ts                   # noqa: E402
from tessera import dist, op           # noqa: E402


def _step(w, x):
    return ts.grad(lambda w: op.sum(op.tanh(op.matmul(x, w))), 0)(w)


def _inputs(mesh, cfg, rng):
    side = int(cfg["params"] ** 0.5)
    x = dist.from_numpy(rng.standard_normal((cfg["rows"] * mesh.size, side)).astype(np.float32),
                        layout=dist.ShardSpec(partition=(0,), mesh_axes=("dp",)), mesh=mesh)
    return rng.standard_normal((side, side)).astype(np.float32), x


def tessera_worker(cfg: dict, out: Path) -> None:
    mesh = dist.Mesh(axes=["dp"], shape=(dist.world_size(),))
    w, x = _inputs(mesh, cfg, np.random.default_rng(0))
    report = {}
    results = {}
    for name, options in (("flat", ts.TargetOptions(target="cpu", hierarchical_collectives=False)),
                          ("hierarchical", ts.TargetOptions(target="cpu", ranks_per_node=2))):
        step = ts.compile(_step, mesh=mesh, target=options)
        results[name] = np.asarray(step(w, x))          # compile and warm up
        times = []
        for _ in range(cfg["steps"]):
            t0 = time.perf_counter()
            step(w, x)
            times.append(time.perf_counter() - t0)
        report[name] = statistics.median(times)
    report["max_diff"] = float(np.abs(results["flat"] - results["hierarchical"]).max())
    (out / f"tessera-rank{mesh.rank}.json").write_text(json.dumps(report))


def predicted(cfg: dict, devices: int) -> dict:
    mesh = dist.Mesh(axes=["dp"], devices=range(devices))
    w, x = _inputs(mesh, {**cfg, "rows": 1}, np.random.default_rng(0))
    out = {}
    for name, options in (("flat", ts.TargetOptions(target="gpu", hierarchical_collectives=False)),
                          ("hierarchical", ts.TargetOptions(target="gpu", ranks_per_node=8))):
        cost = ts.graph.trace(ts.compile(_step, mesh=mesh, target=options), w, x) \
            .cost("h100-node")
        out[name] = sum(s for _, _, cat, s, _ in cost.ranks[0].items if cat == "comm")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=1 << 20, help="gradient floats (a square)")
    ap.add_argument("--rows", type=int, default=64, help="batch rows per rank")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results")
    add_worker_arguments(ap)
    args = ap.parse_args()
    if run_worker(args, {"tessera": tessera_worker}):
        return 0
    cfg = {"params": args.params, "rows": args.rows, "steps": args.steps}
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        import os
        os.environ["TESSERA_RANKS_PER_NODE"] = "2"          # what --ranks-per-node sets
        ranks = run_ranks(__file__, "tessera", 4, cfg, Path(tmp))
    if ranks is None:
        return 1
    flat = max(r["flat"] for r in ranks)
    tiered = max(r["hierarchical"] for r in ranks)
    lines = [f"hierarchical all-reduce: MLP gradient of {args.params} floats "
             f"({args.params * 4 / 2**20:.1f} MiB), dp = 4 ranks as 2 nodes of 2",
             "",
             "| measured on this host (slowest rank, median of "
             f"{args.steps}) | flat ms | hierarchical ms | ratio |",
             "|---|---:|---:|---:|",
             f"| gradient step | {flat * 1e3:.2f} | {tiered * 1e3:.2f} | {tiered / flat:.2f}x |",
             "",
             f"results differ by at most {max(r['max_diff'] for r in ranks):.2e}",
             "",
             "| predicted on h100-node (8 GPUs a node), cost model | flat ms | hierarchical ms "
             "| ratio |",
             "|---|---:|---:|---:|"]
    record = {"config": cfg, "measured": {"flat_s": flat, "hierarchical_s": tiered},
              "predicted": {}}
    for devices in (16, 128, 1024):
        p = predicted(cfg, devices)
        record["predicted"][devices] = p
        lines.append(f"| dp = {devices} all-reduce | {p['flat'] * 1e3:.3f} | "
                     f"{p['hierarchical'] * 1e3:.3f} | {p['hierarchical'] / p['flat']:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if not args.no_save:
        commit, today = commit_and_date()
        write_results("hierarchical_allreduce", commit, today,
                      f"{text}\n\nmachine: see the .json; commit {commit}, {today}", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
