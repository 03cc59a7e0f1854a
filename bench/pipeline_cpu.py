"""Pipeline schedules on 4 CPU ranks (`--ranks`; one pipeline stage each): Tessera's
measured idle share per rank against the cost model's two predictions of it
and (p-1)/(m+p-1), and its step time against PyTorch's
`torch.distributed.pipelining` (ScheduleGPipe / Schedule1F1B on gloo) with the
same model, the same microbatches, in the same run.

What it measures, per schedule: the median wall time of one pipelined
forward + backward (the loss and every parameter's gradient of one batch, no
optimizer step) of the example GPT (`examples/train_gpt.py`: embedding with
the first stage, one transformer block per stage, the head and loss with the
last), and for Tessera each rank's share of the step spent blocked waiting for
a transfer or collective (the runtime's own timing, `tessera_runtime.profiler`
"collective:wait") beside the share running kernels, and the share of the
step it was runnable without a core (Linux schedstat's run delay, anywhere
in the step: with more ranks than cores, a woken rank waits for a core
before its wait ends, so part of the measured idle is that).

The two predictions: "schedule" is `pipeline_report().bubble`, the schedule
simulated at its stage actions' FLOP costs (the compiler's); "compiled
step" simulates the stage ranks' compiled programs together on this
machine's calibration (`tessera_compiler.cost.predict_ranks`: every kernel,
transfer, result broadcast and executor instruction, a core per rank), its
idle being each rank's time blocked in waits (transfers finishing there and
peers starting late) over its step, as measured.

  * Tessera: `tessera launch -n 4` on a `pp` mesh of 4, `train_gpt.
    make_pipeline_step(...).gradients` (schedules gpipe, 1F1B, zero_bubble).
  * PyTorch: `mpiexec -n 4` processes joined by gloo over loopback, each
    holding one stage (`PipelineStage` of an `nn.Module` with the same
    parameters), `ScheduleGPipe` / `Schedule1F1B` with the same microbatch
    count (PyTorch has no zero-bubble schedule for one stage per rank
    outside its IR-based API; its row is empty).

Both start from the same parameters and batch; the losses must agree to 1e-4
(relative) or the script exits 1. The ratio printed is Tessera / PyTorch
(> 1: Tessera is slower). Both are timed without a profiler; each framework's
CPU time per step (user + system, summed over the ranks) is printed beside
the wall time: 4 ranks share 2 cores, so the step is about the CPU time / 2
plus the cores the schedule's bubbles leave idle, and every transfer can
wait for its sender's next time slice; `--ranks 2` gives each rank a core of
its own. Tessera's profiled steps
(run after the timed ones) then split each rank's step into matmul,
generated kernels, other library routines, transfer starts and waits, and
the executor's own time (the rest). Results go to
bench/results/pipeline_cpu-<date>.json/.md.

    .venv/bin/python bench/pipeline_cpu.py --torch-python /path/to/python-with-torch
    .venv/bin/python bench/pipeline_cpu.py --steps 5               # quick

Threads: one BLAS / torch thread per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in ("examples", "runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import numpy as np  # noqa: E402

from cpu_ranks import (add_worker_arguments, commit_and_date, run_ranks,  # noqa: E402
                       run_worker, torch_ranks, write_results)

SCHEDULES = ("gpipe", "1F1B", "zero_bubble")
TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1F1B": "Schedule1F1B"}


def config(args) -> dict:
    return {"ranks": args.ranks, "width": args.width, "depth": args.ranks, "heads": args.heads,
            "batch": args.batch,
            "length": args.length, "microbatches": args.microbatches, "seed": 0,
            "steps": args.steps}


def setup(cfg):
    import train_gpt as ex
    params = ex.init_params(cfg["width"], cfg["depth"], cfg["heads"], 2 * cfg["length"],
                            cfg["seed"])
    batch = ex.make_batch(np.random.default_rng(cfg["seed"]), cfg["batch"], cfg["length"])
    return params, batch


def cpu_seconds() -> float:
    """This process's CPU time so far (user + system, all its threads): a
    rank that spins while it waits spends the cores the others compute on."""
    t = os.times()
    return t.user + t.system


def _mean_share(shares) -> str:
    known = [x for x in shares if x is not None]
    return f"{100 * statistics.mean(known):.1f}%" if known else "-"


def run_delay_seconds() -> float | None:
    """How long this thread has been runnable without a core so far (Linux
    schedstat; None where the kernel does not keep it): with more ranks
    than cores, part of a wait is the woken rank waiting for a core, not
    for its data."""
    try:
        return int(open("/proc/thread-self/schedstat").read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


# -- Tessera, one rank of `tessera launch -n 4` ---------------------------------------

def tessera_worker(cfg: dict, out: Path) -> None:
    import tessera as ts
    import train_gpt as ex
    from tessera import dist
    from tessera_runtime import profiler
    mesh = dist.Mesh(axes=["dp", "tp", "pp"], shape=(1, 1, cfg["ranks"]))
    params, batch = setup(cfg)
    opt = ts.optim.AdamW(lr=3e-3)
    report = {}
    for schedule in SCHEDULES:
        grads_of = ex.make_pipeline_step(opt, cfg["heads"], mesh, schedule,
                                         cfg["microbatches"], clip=1.0).gradients
        t0 = time.perf_counter()
        loss, _ = grads_of(params, batch)
        compile_s = time.perf_counter() - t0
        # Timed without the profiler (as the peer runs), then profiled for
        # the shares: recording ~700 slices a step costs the step time.
        times, cpu0 = [], cpu_seconds()
        for _ in range(cfg["steps"]):
            t0 = time.perf_counter()
            loss, _ = grads_of(params, batch)
            times.append(time.perf_counter() - t0)
        cpu_ms = 1e3 * (cpu_seconds() - cpu0) / cfg["steps"]
        profiler.start()
        t0, delay0 = time.perf_counter(), run_delay_seconds()
        for _ in range(cfg["steps"]):
            grads_of(params, batch)
        total, delay1 = time.perf_counter() - t0, run_delay_seconds()
        profile = profiler.stop().totals()
        waiting = profile.get("collective:wait", [0.0])[0]
        compute = sum(s for k, (s, _) in profile.items() if not k.startswith("collective:"))
        parts = {"matmul": profile.get("library:matmul", [0.0])[0],
                 "kernels": sum(s for k, (s, _) in profile.items() if ":" not in k),
                 "other library": sum(s for k, (s, _) in profile.items()
                                      if k.startswith("library:") and k != "library:matmul"),
                 "transfer start": profile.get("collective:start", [0.0])[0],
                 "transfer wait": waiting}
        parts["executor"] = total - sum(parts.values())
        plan = grads_of.pipeline_report()
        report[schedule] = {
            "loss": float(np.asarray(loss)), "compile_s": compile_s,
            "step_ms": 1e3 * statistics.median(times), "cpu_ms": cpu_ms,
            "wait_share": waiting / total, "compute_share": compute / total,
            "no_core_share": None if delay0 is None else (delay1 - delay0) / total,
            "model_bubble": plan.bubble, "formula": plan.formula,
            "grid": str(plan),
            "top": {k: v[0] / cfg["steps"] for k, v in
                    sorted(profile.items(), key=lambda kv: -kv[1][0])[:10]},
            "launches": sum(v[1] for v in profile.values()) / cfg["steps"],
            "parts_ms": {k: 1e3 * v / cfg["steps"] for k, v in parts.items()}}
    (out / f"tessera-rank{mesh.rank}.json").write_text(json.dumps(report))


# -- PyTorch, one rank of `mpiexec -n 4` (a Python with torch, no Tessera) ---------

def torch_worker(cfg: dict, out: Path) -> None:
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch.distributed import pipelining
    rank, size = torch_ranks(29517)
    saved = np.load(out / "model.npz")           # the driver's (no Tessera import here)
    params = {k: saved[k] for k in ("wte", "wpe", "lnf_w", "lnf_b", "head")}
    params["blocks"] = [{k.split(".")[2]: saved[k] for k in saved.files
                         if k.startswith(f"blocks.{i}.")} for i in range(cfg["depth"])]
    batch = {"inputs": saved["inputs"], "targets": saved["targets"]}
    heads = cfg["heads"]

    class Stage(torch.nn.Module):
        """Block `rank` of the GPT; the embedding on the first stage, the
        final norm and head on the last (as train_gpt.gpt places them)."""

        def __init__(self):
            super().__init__()
            t = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in
                 params["blocks"][rank].items()}
            self.blk = torch.nn.ParameterDict(t)
            extra = (["wte", "wpe"] if rank == 0 else []) + \
                (["lnf_w", "lnf_b", "head"] if rank == size - 1 else [])
            self.extra = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(params[k]))
                                                 for k in extra})

        def forward(self, x):
            e, b = self.extra, self.blk
            if rank == 0:
                x = F.embedding(x, e["wte"]) + e["wpe"]
            B, S, D = x.shape
            H, Dh = heads, D // heads
            h = F.layer_norm(x, (D,), b["ln1_w"], b["ln1_b"], eps=1e-5)
            qkv = (h @ b["wqkv"]).reshape(B, S, H, 3, Dh)
            q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(B, S, D) @ b["wo"]
            h = F.layer_norm(x, (D,), b["ln2_w"], b["ln2_b"], eps=1e-5)
            x = x + (F.gelu(h @ b["w1"] + b["b1"], approximate="tanh") @ b["w2"] + b["b2"])
            if rank == size - 1:
                x = F.layer_norm(x, (D,), e["lnf_w"], e["lnf_b"], eps=1e-5) @ e["head"]
            return x

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-100)

    inputs = torch.from_numpy(batch["inputs"]).long()
    targets = torch.from_numpy(batch["targets"]).long()
    m = cfg["microbatches"]
    report = {}
    for schedule, cls in TORCH_SCHEDULES.items():
        module = Stage()
        stage = pipelining.PipelineStage(module, rank, size, torch.device("cpu"))
        runner = getattr(pipelining, cls)(stage, n_microbatches=m, loss_fn=loss_fn)

        def step():
            module.zero_grad(set_to_none=True)
            losses = []
            if rank == 0:
                runner.step(inputs)
            elif rank == size - 1:
                runner.step(target=targets, losses=losses)
            else:
                runner.step()
            return float(torch.stack(losses).detach().mean()) if losses else None

        t0 = time.perf_counter()
        loss = step()
        first_s = time.perf_counter() - t0
        times, cpu = [], 0.0
        for _ in range(cfg["steps"]):
            tdist.barrier()
            t0, cpu0 = time.perf_counter(), cpu_seconds()
            loss = step()
            times.append(time.perf_counter() - t0)
            cpu += cpu_seconds() - cpu0
        report[schedule] = {"loss": loss, "first_s": first_s, "cpu_ms": 1e3 * cpu / cfg["steps"],
                            "step_ms": 1e3 * statistics.median(times)}
    (out / f"torch-rank{rank}.json").write_text(json.dumps(report))
    tdist.destroy_process_group()


# -- the cost model's compiled step -----------------------------------------------

def compiled_step_idle(cfg: dict) -> dict:
    """{schedule: each rank's idle share as the cost model predicts the
    compiled step}: the stage ranks' programs simulated together
    (`tessera_compiler.cost.predict_ranks`) on this machine's calibration,
    a core per rank, idle = its time blocked in waits (transfers finishing
    there and peers starting late) over the step, as the profiler measures
    it. Compiled here, in the driver, for the whole mesh."""
    import dataclasses
    import tessera as ts
    import train_gpt as ex
    from tessera import dist, graph
    from tessera.machine import machine as describe
    mesh = dist.Mesh(axes=["dp", "tp", "pp"], shape=(1, 1, cfg["ranks"]))
    params, batch = setup(cfg)
    calibrated = describe("cpu", ranks=cfg["ranks"])
    one_core_each = dataclasses.replace(
        calibrated, cores_per_node=max(calibrated.cores_per_node, cfg["ranks"]))
    out = {}
    for schedule in SCHEDULES:
        step = ex.make_pipeline_step(ts.optim.AdamW(lr=3e-3), cfg["heads"], mesh, schedule,
                                     cfg["microbatches"], clip=1.0).gradients
        cost = graph.trace(step, params, batch).cost(one_core_each)
        out[schedule] = [p.waits_s / p.step_s for p in cost.ranks]
    return out


# -- the driver ------------------------------------------------------------------

def run_torch(cfg: dict, out: Path, python: str) -> list[dict] | None:
    from tessera._pytree import flatten, paths
    params, batch = setup(cfg)
    np.savez(out / "model.npz", **dict(zip(paths(params), flatten(params)[0])), **batch)
    return run_ranks(__file__, "torch", cfg["ranks"], cfg, out, python)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4,
                    help="pipeline stages, one rank each (one block each); 4 ranks share "
                         "a 2-core machine's cores, 2 have a core each")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64, help="sequences per step")
    ap.add_argument("--length", type=int, default=8, help="digits (sequence 2 x this)")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    add_worker_arguments(ap)
    args = ap.parse_args(argv)
    if run_worker(args, {"tessera": tessera_worker, "torch": torch_worker}):
        return 0

    cfg = config(args)
    out = Path(tempfile.mkdtemp(prefix="pipeline_cpu-"))        # the workers' reports
    tess = run_ranks(__file__, "tessera", cfg["ranks"], cfg, out)
    if tess is None:
        return 1
    torch_ranks = run_torch(cfg, out, args.torch_python) if args.torch_python else None
    predicted = compiled_step_idle(cfg)
    p, m = cfg["ranks"], cfg["microbatches"]
    rows, failed = [], False
    for schedule in SCHEDULES:
        t = tess[0][schedule]
        waits = [r[schedule]["wait_share"] for r in tess]
        row = {"schedule": schedule, "tessera_ms": max(r[schedule]["step_ms"] for r in tess),
               "wait_share_per_rank": waits, "measured_bubble": statistics.mean(waits),
               "model_bubble": t["model_bubble"], "formula": (p - 1) / (m + p - 1),
               "compiled_step_idle_per_rank": predicted[schedule],
               "compiled_step_idle": statistics.mean(predicted[schedule]),
               "compute_share_per_rank": [r[schedule]["compute_share"] for r in tess],
               "no_core_share_per_rank": [r[schedule]["no_core_share"] for r in tess],
               "cpu_ms_per_rank": [r[schedule]["cpu_ms"] for r in tess],
               "compile_s": t["compile_s"], "loss": t["loss"]}
        if torch_ranks and schedule in TORCH_SCHEDULES:
            tt = torch_ranks[-1][schedule]
            row["torch_ms"] = max(r[schedule]["step_ms"] for r in torch_ranks)
            row["torch_cpu_ms_per_rank"] = [r[schedule]["cpu_ms"] for r in torch_ranks]
            row["ratio"] = row["tessera_ms"] / row["torch_ms"]
            row["torch_loss"] = tt["loss"]
            if abs(tt["loss"] - t["loss"]) > 1e-4 * abs(t["loss"]):
                print(f"{schedule}: losses differ: Tessera {t['loss']} PyTorch {tt['loss']}",
                      file=sys.stderr)
                failed = True
        rows.append(row)
    commit, today = commit_and_date()
    head = (f"pipeline_cpu: {p} ranks x 1 stage, GPT width {cfg['width']}, batch "
            f"{cfg['batch']} x {2 * cfg['length']} tokens in {m} microbatches; {platform.node()} "
            f"({os.cpu_count()} cores), commit {commit}, {today}")
    lines = [head, "", "| schedule | Tessera ms | PyTorch ms | ratio | idle measured | "
             "idle model: schedule | compiled step | (p-1)/(m+p-1) | idle per rank: measured "
             "| compiled step | runnable, no core | CPU ms per step, all ranks: Tessera | "
             "PyTorch |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|"]
    for r in rows:
        torch_ms = f"{r['torch_ms']:.1f}" if "torch_ms" in r else "-"
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        lines.append(f"| {r['schedule']} | {r['tessera_ms']:.1f} | {torch_ms} | {ratio} | "
                     f"{100 * r['measured_bubble']:.1f}% | {100 * r['model_bubble']:.1f}% | "
                     f"{100 * r['compiled_step_idle']:.1f}% | {100 * r['formula']:.1f}% | "
                     + " ".join(f"{100 * w:.0f}%" for w in r["wait_share_per_rank"]) + " | "
                     + " ".join(f"{100 * w:.0f}%" for w in r["compiled_step_idle_per_rank"])
                     + f" | {_mean_share(r['no_core_share_per_rank'])}"
                     + f" | {sum(r['cpu_ms_per_rank']):.0f} | "
                     + (f"{sum(r['torch_cpu_ms_per_rank']):.0f} |" if "torch_ms" in r else "- |"))
    text = "\n".join(lines)
    print(text)
    for r in rows:
        print(f"\n{r['schedule']} (cost model):\n{tess[0][r['schedule']]['grid']}")
        for rank in (0, p - 1):
            top = tess[rank][r["schedule"]]["top"]
            print(f"rank {rank}'s largest runtime entries (ms a step): "
                  + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in top.items()))
            w = tess[rank][r["schedule"]]
            print(f"rank {rank}, ms a step: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                         w["parts_ms"].items())
                  + f" ({w['launches']:.0f} launches and transfers; the executor: the rest)")
    write_results("pipeline_cpu", commit, today, text, {"config": cfg, "rows": rows})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
