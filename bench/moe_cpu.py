"""An expert-parallel MoE layer on 4 CPU ranks (ep = 4): Tessera's `op.moe`
forward + backward against the same layer in PyTorch (tokens routed locally,
dispatched and combined with `all_to_all_single` on gloo), in the same run.

The layer: tokens x [T, D] split over the 4 ranks, a router [D, E], E GELU
experts `gelu(x @ w1[e]) @ w2[e]` (w1 [E, D, F], w2 [E, F, D]) split over the
ranks, top-k routing, dropless. One step is the loss `sum(y * R)` (R a fixed
random [T, D]) and its gradient with respect to x, the router and the experts
(the router's gradient summed over the ranks).

  * Tessera: `tessera launch -n 4`, `ts.jit(mesh=ep4)` of `op.moe(...,
    mesh=mesh)` and `ts.grad`; the all-to-all share is the runtime's own
    timing of its collectives (`tessera_runtime.profiler`).
  * PyTorch: `mpiexec -n 4` processes joined by gloo over loopback; route,
    sort the choices by expert, exchange per-expert counts, then the rows with
    variable splits (`all_to_all_single`), grouped per local expert, GEMMs,
    back, weighted sum — an autograd Function around each exchange, timed.

Both start from the same inputs; the losses must agree to 1e-4 (relative) and
the router gradients to 1e-3, or the script exits 1. The ratio printed is
Tessera / PyTorch (> 1: Tessera is slower). Results go to
bench/results/moe_cpu-<date>.json/.md.

    .venv/bin/python bench/moe_cpu.py --torch-python /path/to/python-with-torch
    .venv/bin/python bench/moe_cpu.py --tokens 1024 --steps 3        # quick

Threads: one BLAS / torch thread per rank (4 ranks share the machine's cores).
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
for _p in ("runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import numpy as np  # noqa: E402

from cpu_ranks import (add_worker_arguments, commit_and_date, run_ranks,  # noqa: E402
                       run_worker, torch_ranks, write_results)

RANKS = 4


def inputs(cfg: dict) -> dict:
    """The layer's global inputs (every process draws the same)."""
    rng = np.random.default_rng(cfg["seed"])
    T, D, F, E = cfg["tokens"], cfg["D"], cfg["F"], cfg["E"]
    return {"x": rng.standard_normal((T, D)).astype(np.float32),
            "R": rng.standard_normal((T, D)).astype(np.float32),
            "router": (rng.standard_normal((D, E)) / np.sqrt(D)).astype(np.float32),
            "w1": (rng.standard_normal((E, D, F)) / np.sqrt(D)).astype(np.float32),
            "w2": (rng.standard_normal((E, F, D)) / np.sqrt(F)).astype(np.float32)}


def timed(step, steps: int):
    """(first call's seconds, the median of `steps` further calls in ms, the last result)."""
    t0 = time.perf_counter()
    result = step()
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        result = step()
        times.append(time.perf_counter() - t0)
    return first, 1e3 * statistics.median(times), sum(times), result


# -- Tessera, one rank of `tessera launch -n 4` ---------------------------------------

def tessera_worker(cfg: dict, out: Path) -> None:
    import tessera as ts
    from tessera import dist, op
    from tessera_runtime import profiler
    mesh = dist.Mesh(axes=["ep"], shape=(RANKS,))
    g = inputs(cfg)
    by_rank = dist.ShardSpec((0,), ("ep",))
    x, R = (dist.from_tree(g[n], by_rank, mesh) for n in ("x", "R"))
    experts = dist.from_tree({n: g[n] for n in ("router", "w1", "w2")},
                             lambda path, a: by_rank if path != "router" else None, mesh)

    @ts.jit(mesh=mesh)
    def step(x, R, ex):
        y = op.moe(x, experts=ex, k=cfg["k"], mesh=mesh)
        value = op.sum(op.mul(y, R))
        return value, ts.grad(value, [x, ex])

    def run():
        value, grads = step(x, R, experts)
        return value, grads

    t0 = time.perf_counter()
    run()
    compile_s = time.perf_counter() - t0
    profiler.start()
    first, step_ms, total, (value, (_, gex)) = timed(run, cfg["steps"])
    profile = profiler.stop().totals()
    # The profile counts timed's first call too.
    comm = sum(s for key, (s, _) in profile.items() if key.startswith("collective:"))
    report = {"loss": float(np.asarray(value)), "compile_s": compile_s, "step_ms": step_ms,
              "comm_share": comm / (first + total),
              "router_grad": np.asarray(gex["router"]).tolist(),
              "profile": {k: v[0] for k, v in sorted(profile.items(), key=lambda kv: -kv[1][0])[:8]}}
    (out / f"tessera-rank{mesh.rank}.json").write_text(json.dumps(report))


# -- PyTorch, one rank of `mpiexec -n 4` (a Python with torch, no Tessera) ---------

def torch_worker(cfg: dict, out: Path) -> None:
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    rank, size = torch_ranks(29519)
    g = inputs(cfg)
    T, E, k = cfg["tokens"] // size, cfg["E"], cfg["k"]
    local = E // size
    mine = slice(rank * T, (rank + 1) * T)
    x = torch.tensor(g["x"][mine], requires_grad=True)
    R = torch.tensor(g["R"][mine])
    wr = torch.tensor(g["router"], requires_grad=True)
    w1 = torch.tensor(g["w1"][rank * local:(rank + 1) * local], requires_grad=True)
    w2 = torch.tensor(g["w2"][rank * local:(rank + 1) * local], requires_grad=True)
    a2a_seconds = [0.0]

    def exchange(t, send, recv):
        out = t.new_empty((sum(recv),) + tuple(t.shape[1:]))
        t0 = time.perf_counter()
        tdist.all_to_all_single(out, t.contiguous(), recv, send)
        a2a_seconds[0] += time.perf_counter() - t0
        return out

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, send, recv):
            ctx.splits = send, recv
            return exchange(t, send, recv)

        @staticmethod
        def backward(ctx, grad):
            send, recv = ctx.splits
            return exchange(grad, recv, send), None, None

    def layer():
        logits = x @ wr                                                  # [T, E]
        top, chosen = logits.topk(k, dim=-1)
        gates = torch.softmax(top, -1)
        flat = chosen.reshape(-1)                                        # [T k]
        order = torch.argsort(flat, stable=True)                         # by expert
        rows = x.repeat_interleave(k, 0)[order]
        per_expert = torch.bincount(flat, minlength=E)                   # [E]
        got = torch.empty_like(per_expert)                               # [source x local]
        t0 = time.perf_counter()
        tdist.all_to_all_single(got, per_expert)                         # counts first
        a2a_seconds[0] += time.perf_counter() - t0
        send = per_expert.view(size, local).sum(1).tolist()
        got = got.view(size, local)
        recv = got.sum(1).tolist()
        arrived = AllToAll.apply(rows, send, recv)                       # [source][expert]
        # Group by local expert: (source, expert) blocks -> (expert, source).
        starts = torch.cumsum(got.reshape(-1), 0) - got.reshape(-1)
        by_expert = torch.cat([torch.arange(int(starts[s * local + e]),
                                            int(starts[s * local + e] + got[s, e]))
                               for e in range(local) for s in range(size)])
        grouped = arrived[by_expert]
        sizes = got.sum(0).tolist()
        outs = torch.cat([F.gelu(h @ w1[e], approximate="tanh") @ w2[e]
                          for e, h in enumerate(torch.split(grouped, sizes))])
        back = torch.empty_like(outs).index_copy(0, by_expert, outs)     # [source][expert]
        returned = AllToAll.apply(back, recv, send)
        unsorted = torch.empty_like(returned).index_copy(0, order, returned)
        y = (unsorted.view(T, k, -1) * gates.unsqueeze(-1)).sum(1)
        return y

    def run():
        for p in (x, wr, w1, w2):
            p.grad = None
        loss = (layer() * R).sum()
        loss.backward()
        t0 = time.perf_counter()
        tdist.all_reduce(wr.grad)                     # the replicated router's gradient
        a2a_seconds[0] += time.perf_counter() - t0
        total = loss.detach().clone()
        tdist.all_reduce(total)
        return float(total)

    run()
    tdist.barrier()
    a2a_seconds[0] = 0.0
    first, step_ms, total, loss = timed(run, cfg["steps"])
    report = {"loss": loss, "step_ms": step_ms, "comm_share": a2a_seconds[0] / (first + total),
              "router_grad": wr.grad.numpy().tolist()}
    (out / f"torch-rank{rank}.json").write_text(json.dumps(report))
    tdist.destroy_process_group()


# -- the driver ------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096, help="global tokens T")
    ap.add_argument("--D", type=int, default=256, help="model width")
    ap.add_argument("--F", type=int, default=512, help="expert hidden width")
    ap.add_argument("--E", type=int, default=8, help="experts")
    ap.add_argument("--k", type=int, default=2, help="experts per token")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    add_worker_arguments(ap)
    args = ap.parse_args(argv)
    if run_worker(args, {"tessera": tessera_worker, "torch": torch_worker}):
        return 0

    cfg = {"tokens": args.tokens, "D": args.D, "F": args.F, "E": args.E, "k": args.k,
           "steps": args.steps, "seed": args.seed}
    out = Path(tempfile.mkdtemp(prefix="moe_cpu-"))          # the workers' reports
    tess = run_ranks(__file__, "tessera", RANKS, cfg, out)
    if tess is None:
        return 1
    peer = run_ranks(__file__, "torch", RANKS, cfg, out, args.torch_python) \
        if args.torch_python else None
    row = {"tessera_ms": max(r["step_ms"] for r in tess), "compile_s": tess[0]["compile_s"],
           "tessera_comm_share": statistics.mean(r["comm_share"] for r in tess),
           "loss": tess[0]["loss"], "tessera_profile_rank0": tess[0]["profile"]}
    failed = False
    if peer:
        row.update(torch_ms=max(r["step_ms"] for r in peer),
                   torch_comm_share=statistics.mean(r["comm_share"] for r in peer),
                   torch_loss=peer[0]["loss"])
        row["ratio"] = row["tessera_ms"] / row["torch_ms"]
        ga, gb = np.array(tess[0]["router_grad"]), np.array(peer[0]["router_grad"])
        row["router_grad_rel_err"] = float(np.max(np.abs(ga - gb)) / np.max(np.abs(gb)))
        if abs(row["torch_loss"] - row["loss"]) > 1e-4 * abs(row["loss"]) \
                or row["router_grad_rel_err"] > 1e-3:
            print(f"moe_cpu: the layers differ: loss Tessera {row['loss']} PyTorch "
                  f"{row['torch_loss']}, router gradient {row['router_grad_rel_err']:.2e}",
                  file=sys.stderr)
            failed = True
    commit, today = commit_and_date()
    head = (f"moe_cpu: ep={RANKS} ranks, tokens {cfg['tokens']}, D {cfg['D']}, F {cfg['F']}, "
            f"E {cfg['E']}, k {cfg['k']}, dropless, forward+backward; {platform.node()} "
            f"({os.cpu_count()} cores), commit {commit}, {today}")
    pct = lambda s: f"{100 * s:.1f}%"                                    # noqa: E731
    lines = [head, "", "| | Tessera | PyTorch (gloo) | ratio |", "|---|---:|---:|---:|",
             f"| step ms (median of {cfg['steps']}, slowest rank) | {row['tessera_ms']:.1f} | "
             f"{row.get('torch_ms', float('nan')):.1f} | "
             + (f"{row['ratio']:.2f}x |" if "ratio" in row else "- |"),
             f"| all-to-all (+ router all-reduce) share | {pct(row['tessera_comm_share'])} | "
             + (f"{pct(row['torch_comm_share'])} | |" if peer else "- | |"),
             "", f"Tessera first call (trace + compile + run): {row['compile_s']:.1f} s; "
             "rank 0's largest runtime entries (s over the timed calls): "
             + ", ".join(f"{k} {v:.3f}" for k, v in row["tessera_profile_rank0"].items())]
    text = "\n".join(lines)
    print(text)
    write_results("moe_cpu", commit, today, text, {"config": cfg, "row": row})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
