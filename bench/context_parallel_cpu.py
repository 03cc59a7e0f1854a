"""Context-parallel attention on CPU ranks: a causal grouped-query attention
layer, forward + backward, with its sequence split over cp = 1, 2 and 4
ranks, as a ring (key/value blocks passed around the ranks, striped for
balanced causal work) and as all-to-all over heads (Ulysses), in one run;
PyTorch's context parallelism beside it where it runs on the CPU.

The layer: q [B, S, H, D], k and v [B, S, Hkv, D] (S split over cp), the
loss `sum(attention(q, k, v, causal) * R)` and its gradients by q, k, v.
Per scheme and cp: the median step of the slowest rank, each rank's
planned peak memory (the compiler's memory plan for the step), the share
of the step in collectives (the runtime's profiler: on the CPU a
collective progresses inside its wait, so that share is not hidden), and
the gradients' largest difference from cp = 1's (the same inputs).

  * Tessera: `tessera launch -n CP`, `ts.jit` with
    `TargetOptions(context_parallel="ring" | "ulysses")`.
  * PyTorch (with --torch-python, a Python with torch): its context
    parallelism, `torch.distributed.tensor.experimental.context_parallel`
    (ring attention, load-balanced for causal), on gloo under mpiexec, one
    thread per rank, SDPA over [B, H, S, D] with K/V heads repeated to H
    (`repeat_interleave`) where they are fewer. As shipped (torch 2.13)
    it does not run on the CPU: SDPA's CPU op
    `aten._scaled_dot_product_flash_attention_for_cpu` has no
    context-parallel handler ("does not have a sharding strategy
    registered"), so this script registers one for it and its backward
    that calls torch's own ring templates (`_cpu_ring_handlers`), the
    smallest change that lets the peer run; its rotate method is
    "alltoall" (the faster of the two on this machine).

    .venv/bin/python bench/context_parallel_cpu.py                  # S 2048
    .venv/bin/python bench/context_parallel_cpu.py --seq 4096 --steps 3

Results go to bench/results/context_parallel_cpu-<date>.json/.md. Threads:
one BLAS thread per rank (the ranks share the machine's cores).
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

CPS = (1, 2, 4)
SCHEMES = ("ring", "ulysses")


def inputs(cfg: dict) -> dict:
    """The layer's global inputs (every process draws the same)."""
    rng = np.random.default_rng(cfg["seed"])
    B, S, H, Hkv, D = cfg["batch"], cfg["seq"], cfg["heads"], cfg["kv_heads"], cfg["dim"]
    return {"q": rng.standard_normal((B, S, H, D)).astype(np.float32),
            "k": rng.standard_normal((B, S, Hkv, D)).astype(np.float32),
            "v": rng.standard_normal((B, S, Hkv, D)).astype(np.float32),
            "R": rng.standard_normal((B, S, H, D)).astype(np.float32)}


def tessera_worker(cfg: dict, out: Path) -> None:
    import tessera as ts
    from tessera import dist, op
    from tessera_runtime import profiler
    cp = cfg["cp"]
    mesh = dist.Mesh(axes=["cp"], shape=(cp,))
    g = inputs(cfg)
    seq = dist.ShardSpec((1,), ("cp",))
    args = [dist.from_numpy(g[n], seq, mesh) for n in ("q", "k", "v", "R")]

    @ts.jit(mesh=mesh, target=ts.TargetOptions(context_parallel=cfg["scheme"]))
    def step(q, k, v, R):
        value = op.sum(op.mul(op.attention(q, k, v, causal=True, seq_dim=1), R))
        return value, ts.grad(value, [q, k, v])

    t0 = time.perf_counter()
    step(*args)
    compile_s = time.perf_counter() - t0
    plans = ts.graph.trace(step, *args).attention
    peak = step.memory_report(*args).rank(mesh.rank).peak
    profiler.start()
    times = []
    for _ in range(cfg["steps"]):
        t0 = time.perf_counter()
        value, grads = step(*args)
        times.append(time.perf_counter() - t0)
    profile = profiler.stop().totals()
    comm = sum(s for key, (s, _) in profile.items() if key.startswith("collective:"))
    report = {"value": float(np.asarray(value)), "compile_s": compile_s,
              "step_ms": 1e3 * statistics.median(times), "comm_share": comm / sum(times),
              "peak_bytes": int(peak), "attention": plans,
              "grads": [np.asarray(x).ravel()[:4096].tolist() for x in grads]}
    (out / f"tessera-rank{mesh.rank}.json").write_text(json.dumps(report))


def _cpu_ring_handlers() -> None:
    """Context-parallel handlers for SDPA's CPU op and its backward (torch
    ships them for the CUDA ops only), calling torch's ring templates."""
    import torch
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental._context_parallel import _attention as cpa
    aten = torch.ops.aten
    fwd_op = aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd_op = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    def wrap(mesh, tensors):
        return tuple(DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in tensors)

    def forward(op_call, args, kwargs):
        q, k, v = args[:3]
        causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
        out, lse = cpa._templated_ring_attention(
            q.device_mesh.get_group(), 2, fwd_op, local(q), local(k), local(v),
            is_causal=causal, dropout_p=0.0, scale=kwargs.get("scale"))
        return wrap(q.device_mesh, (out, lse))

    def backward(op_call, args, kwargs):
        dout, q, k, v, out, lse, dropout_p, causal = args[:8]
        grads = cpa._templated_ring_attention_backward(
            q.device_mesh.get_group(), 2, bwd_op, grad_out=local(dout), grad_out_name="grad_out",
            query=local(q), key=local(k), value=local(v), out=local(out), logsumexp=local(lse),
            is_causal=causal, dropout_p=dropout_p, scale=kwargs.get("scale"))
        return wrap(q.device_mesh, grads)

    cpa.custom_ops[fwd_op] = forward
    cpa.custom_ops[bwd_op] = backward


def torch_worker(cfg: dict, out: Path) -> None:
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method
    rank, size = torch_ranks(29531)
    g = inputs(cfg)
    groups = cfg["heads"] // cfg["kv_heads"]
    # [B, S, H, D] -> SDPA's [B, H, S, D]; K/V heads repeated to q's
    q, R = (torch.from_numpy(g[n]).transpose(1, 2).contiguous() for n in ("q", "R"))
    k, v = (torch.from_numpy(g[n]).transpose(1, 2).repeat_interleave(groups, 1).contiguous()
            for n in ("k", "v"))
    if size > 1:
        _cpu_ring_handlers()
        set_rotate_method("alltoall")
        _cp_options.enable_load_balance = True
        mesh = DeviceMesh("cpu", list(range(size)), mesh_dim_names=("cp",))

    def step():
        cq, ck, cv, cr = (t.clone() for t in (q, k, v, R))
        if size == 1:
            for t in (cq, ck, cv):
                t.requires_grad_(True)
            value = (F.scaled_dot_product_attention(cq, ck, cv, is_causal=True) * cr).sum()
            value.backward()
            return value
        with context_parallel(mesh, buffers=[cq, ck, cv, cr], buffer_seq_dims=[2, 2, 2, 2],
                              no_restore_buffers={cq, ck, cv, cr}):
            for t in (cq, ck, cv):
                t.requires_grad_(True)
            value = (F.scaled_dot_product_attention(cq, ck, cv, is_causal=True) * cr).sum()
            value.backward()
        total = value.detach().clone()
        tdist.all_reduce(total)
        return total

    step()
    times = []
    for _ in range(cfg["steps"]):
        t0 = time.perf_counter()
        value = step()
        times.append(time.perf_counter() - t0)
    report = {"value": float(value), "step_ms": 1e3 * statistics.median(times)}
    (out / f"torch-rank{rank}.json").write_text(json.dumps(report))
    if size > 1:
        tdist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=2048, help="sequence length S")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8, help="query heads")
    ap.add_argument("--kv-heads", type=int, default=4, help="key/value heads")
    ap.add_argument("--dim", type=int, default=32, help="head width")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    add_worker_arguments(ap)
    args = ap.parse_args(argv)
    if run_worker(args, {"tessera": tessera_worker, "torch": torch_worker}):
        return 0
    base = {"seq": args.seq, "batch": args.batch, "heads": args.heads,
            "kv_heads": args.kv_heads, "dim": args.dim, "steps": args.steps, "seed": args.seed}
    out = Path(tempfile.mkdtemp(prefix="context_parallel_cpu-"))
    rows, reference, failed = [], None, False
    for cp in CPS:
        for scheme in SCHEMES if cp > 1 else SCHEMES[:1]:
            cfg = {**base, "cp": cp, "scheme": scheme}
            print(f"context_parallel_cpu: cp {cp}, {scheme if cp > 1 else 'one rank'} ...",
                  file=sys.stderr, flush=True)
            ranks = run_ranks(__file__, "tessera", cp, cfg, out)
            if ranks is None:
                return 1
            value = ranks[0]["value"]
            if reference is None:
                reference = value
            gap = abs(value - reference) / max(abs(reference), 1e-30)
            failed |= gap > 1e-4
            rows.append({"cp": cp, "scheme": scheme if cp > 1 else "-",
                         "step_ms": max(r["step_ms"] for r in ranks),
                         "peak_mib": max(r["peak_bytes"] for r in ranks) / 2**20,
                         "comm_share": statistics.mean(r["comm_share"] for r in ranks),
                         "compile_s": ranks[0]["compile_s"], "loss_gap": gap,
                         "attention": ranks[0]["attention"]})
        if args.torch_python:
            cfg = {**base, "cp": cp}
            print(f"context_parallel_cpu: cp {cp}, PyTorch ...", file=sys.stderr, flush=True)
            peer = run_ranks(__file__, "torch", cp, cfg, out, args.torch_python)
            if peer is None:
                return 1
            gap = abs(peer[0]["value"] - reference) / max(abs(reference), 1e-30)
            failed |= gap > 1e-4
            rows.append({"cp": cp, "scheme": "PyTorch ring" if cp > 1 else "PyTorch",
                         "step_ms": max(r["step_ms"] for r in peer), "peak_mib": None,
                         "comm_share": None, "loss_gap": gap, "attention": []})
    commit, today = commit_and_date()
    head = (f"context_parallel_cpu: causal attention [B {base['batch']}, S {base['seq']}, "
            f"H {base['heads']} (K/V {base['kv_heads']}), D {base['dim']}], forward+backward, "
            f"sequence over cp ranks; {platform.node()} ({os.cpu_count()} cores), commit "
            f"{commit}, {today}")
    lines = [head, "", "| cp | scheme | step ms (median, slowest rank) | planned peak MiB per rank "
             "| collectives' share of the step | loss vs cp 1 |", "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.2f}"
        share = "-" if r["comm_share"] is None else f"{100 * r['comm_share']:.1f}%"
        lines.append(f"| {r['cp']} | {r['scheme']} | {r['step_ms']:.1f} | {peak} | {share} | "
                     f"{r['loss_gap']:.1e} |")
    lines += ["", "What each attention took (rank 0, cp 4):"]
    lines += [f"- {a}" for r in rows if r["cp"] == CPS[-1] for a in r["attention"][:1]]
    text = "\n".join(lines)
    print(text)
    write_results("context_parallel_cpu", commit, today, text, {"config": base, "rows": rows})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
