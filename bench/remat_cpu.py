"""Activation recomputation on the CPU: memory saved and time paid, per policy.

What it measures, for the example GPT (`examples/train_gpt.py`) at each
--depths: the training step (forward, backward, clipping, AdamW) compiled
with every block under each recomputation policy (`op.transformer_block(
remat=...)`: none, selective, dots_saveable, nothing_saveable) and with a
memory budget the compiler meets by choosing per block
(`ts.jit(memory_budget=...)`, the budget halfway between the no-remat and
the nothing_saveable peaks). For each:

  * the plan's peak bytes per rank, the activation bytes the forward stores
    for the backward (live where the backward starts) and the activation
    peak (the most live at any instruction: with recomputation, during a
    recomputed block's backward), read from the compiled schedule; the
    runtime's own count of the bytes it held (which must equal the plan);
  * the median step time over --steps steps (after a first, compiling call);
  * the loss of the first step, which must equal the no-remat loss bit for
    bit (exit 1 otherwise).

The peer: PyTorch eager, the same model (bench/train_step_cpu.py's
TorchStep), with and without `torch.utils.checkpoint` around every block,
timed in the same run; its overhead ratio is printed beside Tessera's
(skipped when torch is not importable).

Goals (issue 33): nothing_saveable cuts the activation peak by at least
(depth - 1)/depth of the stored activations, for at most 1.4x the step
time; the budget's plan is no slower than the fastest fixed policy that
fits the budget.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/remat_cpu.py               # depths 8 and 16
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/remat_cpu.py --depths 2 --steps 3   # quick

Results go to bench/results/remat_cpu-<date>.json/.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in ("bench", "examples", "runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import numpy as np  # noqa: E402

import tessera as ts  # noqa: E402
import train_gpt  # noqa: E402  (examples/train_gpt.py)

POLICIES = {"none": None, "selective": "selective", "dots_saveable": "dots_saveable",
            "nothing_saveable": "nothing_saveable"}


def tessera_variant(cfg: dict, remat=None, budget=None) -> dict:
    """Plan, first loss and median step time of one compiled variant."""
    params = train_gpt.init_params(cfg["width"], cfg["depth"], cfg["heads"], 2 * cfg["length"], 0)
    opt = ts.optim.AdamW(lr=3e-3)
    state, scaler = opt.init(params), ts.optim.loss_scale_init(1.0)
    batch = [train_gpt.make_batch(np.random.default_rng(1), cfg["batch"], cfg["length"])]
    step = train_gpt.make_step(opt, cfg["heads"], "fp32", 1.0, remat=remat, memory_budget=budget)
    t0 = time.perf_counter()
    plan = step.memory_report(params, state, scaler, batch)
    loss, params, state, scaler, _ = step(params, state, scaler, batch)
    compile_s = time.perf_counter() - t0
    program = step._programs[step._last_key][0]
    times = []
    for _ in range(cfg["steps"]):
        t = time.perf_counter()
        _, params, state, scaler, _ = step(params, state, scaler, batch)
        times.append(time.perf_counter() - t)
    rank = plan.ranks[0]
    return {"peak_bytes": plan.peak, "activation_peak_bytes": rank.category_peaks["activations"],
            "stored_activation_bytes": rank.stored_activations,
            "runtime_peak_bytes": program.memory["peak_bytes"],
            "step_s": statistics.median(times), "compile_s": compile_s,
            "loss_bits": np.asarray(loss, np.float32).view(np.uint32).item(),
            "loss": float(loss), "remat": {str(k): v for k, v in plan.remat.items()}}


def torch_ratio(cfg: dict) -> dict | None:
    """PyTorch eager step time without and with torch.utils.checkpoint per block."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.utils.checkpoint import checkpoint
        from train_step_cpu import TorchStep
    except (ImportError, SystemExit):
        return None
    params = train_gpt.init_params(cfg["width"], cfg["depth"], cfg["heads"], 2 * cfg["length"], 0)
    batch = train_gpt.make_batch(np.random.default_rng(1), cfg["batch"], cfg["length"])

    class CheckpointedStep(TorchStep):
        def loss(self):
            p, tokens = self.params, self.inputs
            B, S = tokens.shape
            D = p["wte"].shape[1]
            H, Dh = self.heads, D // self.heads

            def block(x, blk):
                h = F.layer_norm(x, (D,), blk["ln1_w"], blk["ln1_b"], eps=1e-5)
                q, k, v = ((h @ blk["wqkv"]).reshape(B, S, H, 3, Dh)[:, :, :, i].transpose(1, 2)
                           for i in range(3))
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + a.transpose(1, 2).reshape(B, S, D) @ blk["wo"]
                h = F.layer_norm(x, (D,), blk["ln2_w"], blk["ln2_b"], eps=1e-5)
                return x + (F.gelu(h @ blk["w1"] + blk["b1"], approximate="tanh") @ blk["w2"]
                            + blk["b2"])
            x = F.embedding(tokens, p["wte"]) + p["wpe"]
            for blk in p["blocks"]:
                x = checkpoint(block, x, blk, use_reentrant=False)
            x = F.layer_norm(x, (D,), p["lnf_w"], p["lnf_b"], eps=1e-5)
            return F.cross_entropy((x @ p["head"]).reshape(-1, train_gpt.VOCAB),
                                   self.targets.reshape(-1), ignore_index=-100)

    out = {}
    for name, cls in (("none", TorchStep), ("checkpoint", CheckpointedStep)):
        step = cls(params, batch, cfg["heads"])
        step()
        times = []
        for _ in range(cfg["steps"]):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times)
    out["ratio"] = out["checkpoint"] / out["none"]
    out["torch_version"] = torch.__version__
    return out


def run_depth(cfg: dict) -> dict:
    rows = {}
    for name, remat in POLICIES.items():
        rows[name] = tessera_variant(cfg, remat=remat)
        print(f"  depth {cfg['depth']:>2} {name:<16} peak {rows[name]['peak_bytes'] / 2**20:8.2f} MiB"
              f"  activations {rows[name]['activation_peak_bytes'] / 2**20:8.2f} MiB"
              f"  step {rows[name]['step_s'] * 1e3:8.1f} ms", flush=True)
    budget = (rows["none"]["peak_bytes"] + rows["nothing_saveable"]["peak_bytes"]) // 2
    rows["budget"] = tessera_variant(cfg, budget=budget)
    rows["budget"]["budget_bytes"] = budget
    print(f"  depth {cfg['depth']:>2} {'budget':<16} peak {rows['budget']['peak_bytes'] / 2**20:8.2f} MiB"
          f"  (budget {budget / 2**20:.2f} MiB)  step {rows['budget']['step_s'] * 1e3:8.1f} ms",
          flush=True)
    none, full = rows["none"], rows["nothing_saveable"]
    fitting = [n for n in POLICIES if rows[n]["peak_bytes"] <= budget]
    fastest_fitting = min(fitting, key=lambda n: rows[n]["step_s"])
    summary = {
        # The goal: the peak of activation bytes falls by at least (d-1)/d of
        # what the forward stores without remat.
        "activation_cut": (none["activation_peak_bytes"] - full["activation_peak_bytes"])
        / none["stored_activation_bytes"],
        "stored_cut": 1 - full["stored_activation_bytes"] / none["stored_activation_bytes"],
        "activation_cut_goal": (cfg["depth"] - 1) / cfg["depth"],
        "full_time_ratio": full["step_s"] / none["step_s"],
        "fastest_fitting_policy": fastest_fitting,
        "budget_time_ratio": rows["budget"]["step_s"] / rows[fastest_fitting]["step_s"],
        "bitwise_losses": all(r["loss_bits"] == none["loss_bits"] for r in rows.values()),
        "plan_equals_runtime": all(r["peak_bytes"] == r["runtime_peak_bytes"] for r in rows.values()),
    }
    peer = torch_ratio(cfg)
    return {"config": cfg, "tessera": rows, "summary": summary, "pytorch": peer}


def markdown(results: list, meta: dict) -> str:
    lines = [f"# Activation recomputation on the CPU ({meta['date']})", "",
             f"- machine: {meta['machine']}; commit {meta['commit']}; "
             f"OPENBLAS_NUM_THREADS={meta['openblas_threads']}",
             f"- command: `{meta['command']}`", ""]
    for r in results:
        c, s = r["config"], r["summary"]
        lines += [f"## depth {c['depth']} (width {c['width']}, {c['heads']} heads, batch "
                  f"{c['batch']} x {2 * c['length']} tokens, median of {c['steps']} steps)", "",
                  "| policy | planned peak | activations stored for the backward | activation peak "
                  "| runtime peak | step | vs none |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        none = r["tessera"]["none"]
        for name, row in r["tessera"].items():
            label = name if name != "budget" else f"budget {row['budget_bytes'] / 2**20:.2f} MiB"
            lines.append(f"| {label} | {row['peak_bytes'] / 2**20:.2f} MiB | "
                         f"{row['stored_activation_bytes'] / 2**20:.2f} MiB | "
                         f"{row['activation_peak_bytes'] / 2**20:.2f} MiB | "
                         f"{row['runtime_peak_bytes'] / 2**20:.2f} MiB | "
                         f"{row['step_s'] * 1e3:.1f} ms | {row['step_s'] / none['step_s']:.2f}x |")
        lines += ["",
                  f"- nothing_saveable: the activations the forward stores for the backward fall by "
                  f"{s['stored_cut']:.1%}; the activation peak (which includes the recomputed "
                  f"block's working set) falls by {s['activation_cut']:.1%} of the stored "
                  f"activations (goal >= {s['activation_cut_goal']:.1%} = (depth-1)/depth); "
                  f"step time {s['full_time_ratio']:.2f}x (goal <= 1.4x)",
                  f"- the budget's plan: {s['budget_time_ratio']:.2f}x the step time of the fastest "
                  f"fixed policy that fits ({s['fastest_fitting_policy']}) (goal <= 1.0x)",
                  f"- losses bitwise equal to no remat: {s['bitwise_losses']}; plan equals the "
                  f"runtime's count: {s['plan_equals_runtime']}"]
        if r["pytorch"]:
            p = r["pytorch"]
            lines.append(f"- peer: PyTorch {p['torch_version']} eager {p['none'] * 1e3:.1f} ms, "
                         f"with torch.utils.checkpoint per block {p['checkpoint'] * 1e3:.1f} ms: "
                         f"{p['ratio']:.2f}x (Tessera nothing_saveable: {s['full_time_ratio']:.2f}x)")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=8, help="digits (sequence 2 x this)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    from train_step_cpu import git_commit, machine
    meta = {"date": datetime.date.today().isoformat(), "machine": machine(),
            "commit": git_commit(), "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "all"),
            "command": "python bench/remat_cpu.py " + " ".join(sys.argv[1:])}
    results = []
    for depth in args.depths:
        cfg = {"depth": depth, "width": args.width, "heads": args.heads, "batch": args.batch,
               "length": args.length, "steps": args.steps}
        results.append(run_depth(cfg))
        print(markdown(results[-1:], meta))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"remat_cpu-{meta['date']}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    stem.with_suffix(".md").write_text(markdown(results, meta))
    print(f"written to {stem}.json/.md")
    ok = all(r["summary"]["bitwise_losses"] and r["summary"]["plan_equals_runtime"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
