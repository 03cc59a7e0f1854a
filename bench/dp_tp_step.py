"""One GPT training step on a 2 x 2 (dp x tp) mesh of 4 CPU ranks: Tessera
against JAX (GSPMD) with the same model, the same sharding and 4 host devices.

What it measures: the median wall time of one training step (forward,
backward, global-norm clipping, AdamW) of the example GPT
(`examples/train_gpt.py`), parameters laid out Megatron-style over `tp`
(`train_gpt.tp_layout`) and the batch split over `dp`:

  * Tessera: `tessera launch -n 4`, one process per device, MPI collectives.
    It also reports, from the runtime's profile, the share of the step in
    which a rank has a collective in flight (started, not yet waited:
    "communication share") and the share it spends starting and waiting for
    them ("exposed": the part no compute overlaps).
  * JAX 0.10 on CPU with `--xla_force_host_platform_device_count=4`: one
    process, `jax.jit` with NamedShardings for the same layouts, so XLA's
    SPMD partitioner places the collectives.

Both start from the same parameters and batch; the first-step losses must
agree to 1e-4 (relative) or the script exits 1. Both run in this one
invocation on the same machine, in `--rounds` alternating rounds (Tessera
then JAX, then JAX then Tessera, ...) of `--steps` timed steps each: the
ratio printed, Tessera / JAX (> 1: Tessera is slower), is the median of the
rounds' ratios, so a drift of the machine's speed during the run (this VM's
is +-15% over minutes) falls on both peers of a round alike. Results go to
bench/results/dp_tp_step-<date>[-N].json/.md.

    .venv/bin/python bench/dp_tp_step.py                # width 128, depth 2, batch 32 x 16
    .venv/bin/python bench/dp_tp_step.py --steps 10 --rounds 1     # quick

Threads: each Tessera rank's BLAS runs on 1 thread (4 ranks share the cores);
JAX runs its 4 devices in one process with XLA's default thread pool.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in ("examples", "runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

from cpu_ranks import checkout_env, new_stem  # noqa: E402
import numpy as np  # noqa: E402


def config(args) -> dict:
    return {"width": args.width, "depth": args.depth, "heads": args.heads,
            "batch": args.batch, "length": args.length, "dp": 2, "tp": 2, "seed": 0}


def setup(cfg):
    """Parameters, AdamW state and one batch, identical for both peers."""
    import train_gpt as ex
    params = ex.init_params(cfg["width"], cfg["depth"], cfg["heads"], 2 * cfg["length"],
                            cfg["seed"])
    batch = ex.make_batch(np.random.default_rng(cfg["seed"]), cfg["batch"], cfg["length"])
    return params, batch


# -- Tessera (one process per rank) -------------------------------------------------

def tessera_worker(cfg: dict, steps: int, out: Path) -> None:
    import tessera as ts
    import tessera_runtime
    from tessera import dist
    from tessera_runtime import profiler
    import train_gpt as ex

    mesh = dist.Mesh(axes=["dp", "tp"], shape=(cfg["dp"], cfg["tp"]))
    params, batch = setup(cfg)
    opt = ts.optim.AdamW(lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)
    state = opt.init(params)
    params, state = ex.distribute(mesh, params, state)
    scaler = ts.optim.loss_scale_init(1.0)
    step = ex.make_step(opt, cfg["heads"], "fp32", clip=1.0)
    micro = [ex.shard_batch(mesh, batch)]
    loss, *_ = step(params, state, scaler, micro)          # compiles
    first_loss = float(loss)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    for _ in range(3):
        step(params, state, scaler, micro)
    # Timed steps run as a user's do, unprofiled (the profiler's per-launch
    # stamps cost the interpreting loop); the communication share comes
    # from separate profiled steps.
    times = []
    for _ in range(steps):
        comm.Barrier()
        t0 = time.perf_counter()
        step(params, state, scaler, micro)
        times.append(time.perf_counter() - t0)
    profiled = max(1, min(steps, 10))
    comm.Barrier()
    t0 = time.perf_counter()
    profiler.start()
    for _ in range(profiled):
        step(params, state, scaler, micro)
    rec = profiler.stop()
    prof = rec.totals()
    profiled_s = time.perf_counter() - t0
    exposed_s = sum(prof.get(k, [0.0])[0] for k in ("collective:start", "collective:wait"))
    flight_s = _covered([(t0, t1) for _, _, cat, t0, t1, _ in rec.slices if cat == "comm"])
    calls = prof.get("collective:start", [0, 0])[1] // profiled
    mine = np.array([statistics.median(times), exposed_s, profiled_s, flight_s])
    everyone = np.empty((comm.Get_size(), 4))
    comm.Allgather(mine, everyone)
    if tessera_runtime.world()[0] == 0:
        out.write_text(json.dumps({
            "first_loss": first_loss, "median_step_s": float(np.max(everyone[:, 0])),
            "comm_share": float(np.mean(everyone[:, 3] / everyone[:, 2])),
            "exposed_comm_share": float(np.mean(everyone[:, 1] / everyone[:, 2])),
            "collectives_per_step": int(calls)}))


def _covered(spans) -> float:
    """Seconds covered by the union of the (t0, t1) spans."""
    total, end = 0.0, float("-inf")
    for t0, t1 in sorted(spans):
        if t1 > end:
            total += t1 - max(t0, end)
            end = t1
    return total


def run_tessera(cfg, steps) -> dict:
    out = ROOT / "bench" / "results" / ".tessera-dp-tp.json"
    env = checkout_env(OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tessera", "launch", "--timeout", "1200", "-n", "4", __file__,
           "--tessera-worker", json.dumps(cfg), str(steps), str(out)]
    subprocess.run(cmd, check=True, env=env, cwd=str(ROOT))
    result = json.loads(out.read_text())
    out.unlink()
    return result


# -- JAX (4 host devices, one process) ----------------------------------------------

def jax_worker(cfg: dict, steps: int, out: Path) -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import train_gpt as ex

    params, batch = setup(cfg)
    devices = np.array(jax.devices()).reshape(cfg["dp"], cfg["tp"])
    mesh = Mesh(devices, ("dp", "tp"))
    H, lr, (b1, b2), eps, wd = cfg["heads"], 3e-3, (0.9, 0.98), 1e-8, 0.01

    def spec(path, a):
        s = ex.tp_layout(path, a)
        if s is None:
            return P()
        axes = [None] * a.ndim
        for part, axis in zip(s.partition, s.mesh_axes):
            axes[{"row": a.ndim - 2, "col": a.ndim - 1}.get(part, part)] = axis
        return P(*axes)

    def paths(tree, prefix=""):
        if isinstance(tree, dict):
            return {k: paths(v, f"{prefix}.{k}" if prefix else k) for k, v in tree.items()}
        if isinstance(tree, list):
            return [paths(v, f"{prefix}.{i}") for i, v in enumerate(tree)]
        return prefix

    names = paths(params)
    shard = jax.tree.map(lambda n, a: NamedSharding(mesh, spec(n, a)), names, params)

    def layernorm(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * w + b

    def gelu(x):
        return 0.5 * x * (1 + jnp.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))

    def loss_fn(p, inputs, targets):
        B, S = inputs.shape
        D = p["wte"].shape[1]
        x = p["wte"][inputs] + p["wpe"]
        mask = jnp.tril(jnp.ones((S, S), bool))
        for blk in p["blocks"]:
            h = layernorm(x, blk["ln1_w"], blk["ln1_b"])
            qkv = (h @ blk["wqkv"]).reshape(B, S, H, 3, D // H)
            q, k, v = (qkv[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
            s = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // H), -jnp.inf)
            a = jax.nn.softmax(s, -1) @ v
            x = x + a.transpose(0, 2, 1, 3).reshape(B, S, D) @ blk["wo"]
            h = layernorm(x, blk["ln2_w"], blk["ln2_b"])
            x = x + gelu(h @ blk["w1"] + blk["b1"]) @ blk["w2"] + blk["b2"]
        logits = (layernorm(x, p["lnf_w"], p["lnf_b"]) @ p["head"]).reshape(B * S, -1)
        t = targets.reshape(-1)
        valid = t >= 0
        logp = jax.nn.log_softmax(logits, -1)
        nll = -jnp.take_along_axis(logp, jnp.where(valid, t, 0)[:, None], 1)[:, 0]
        return jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.sum(valid)

    def step(p, m, v, count, inputs, targets):
        loss, g = jax.value_and_grad(loss_fn)(p, inputs, targets)
        norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g)))
        g = jax.tree.map(lambda x: x * jnp.minimum(1.0 / (norm + 1e-6), 1.0), g)
        t = count + 1.0
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        new = jax.tree.map(lambda p, m, v: p - ((m * lr / c1) / (jnp.sqrt(v) / jnp.sqrt(c2) + eps)
                                                + wd * lr * p), p, m, v)
        finite = jnp.isfinite(norm)
        new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, p)
        return loss, new, m, v, t

    data = NamedSharding(mesh, P("dp", None))
    rep = NamedSharding(mesh, P())
    jstep = jax.jit(step, in_shardings=(shard, shard, shard, rep, data, data),
                    out_shardings=(rep, shard, shard, shard, rep))
    put = lambda tree: jax.tree.map(lambda a, s: jax.device_put(a, s), tree, shard)  # noqa: E731
    p = put(params)
    m = put(jax.tree.map(np.zeros_like, params))
    v = put(jax.tree.map(np.zeros_like, params))
    count = jax.device_put(np.float32(0), rep)
    inputs, targets = (jax.device_put(batch[k], data) for k in ("inputs", "targets"))
    t0 = time.perf_counter()
    loss, *_ = jstep(p, m, v, count, inputs, targets)     # traces, compiles, runs
    first_loss = float(loss)
    first_call_s = time.perf_counter() - t0
    for _ in range(3):
        jax.block_until_ready(jstep(p, m, v, count, inputs, targets))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(jstep(p, m, v, count, inputs, targets))
        times.append(time.perf_counter() - t0)
    out.write_text(json.dumps({"first_loss": first_loss,
                               "median_step_s": statistics.median(times),
                               "first_call_s": first_call_s, "jax": jax.__version__}))


def run_jax(cfg, steps) -> dict:
    """The JAX worker in a process of its own, on cfg["dp"] x cfg["tp"] host
    devices (bench/train_step_cpu.py and bench/compile_time.py run it on one):
    {"first_loss", "median_step_s", "first_call_s", "jax"}."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={cfg['dp'] * cfg['tp']}"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "jax.json"
        subprocess.run([sys.executable, __file__, "--jax-worker", json.dumps(cfg), str(steps),
                        str(out)], check=True, env=env, cwd=str(ROOT))
        return json.loads(out.read_text())


# -- report --------------------------------------------------------------------------

def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=str(ROOT)).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each peer per round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating rounds of both peers; the ratio is their median")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=8)
    ap.add_argument("--tessera-worker", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--jax-worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.tessera_worker:
        cfg, steps, out = args.tessera_worker
        tessera_worker(json.loads(cfg), int(steps), Path(out))
        return 0
    if args.jax_worker:
        cfg, steps, out = args.jax_worker
        jax_worker(json.loads(cfg), int(steps), Path(out))
        return 0

    cfg = config(args)
    print(f"GPT width {cfg['width']}, depth {cfg['depth']}, {cfg['heads']} heads, batch "
          f"{cfg['batch']} x {2 * cfg['length']} tokens on a dp=2 x tp=2 mesh (4 CPU ranks); "
          f"{args.steps} timed steps each, {args.rounds} rounds", flush=True)
    rounds = []
    for r in range(max(1, args.rounds)):
        runs = [("tessera", run_tessera), ("jax", run_jax)]
        got = {name: run(cfg, args.steps) for name, run in (runs if r % 2 == 0 else runs[::-1])}
        got["ratio"] = got["tessera"]["median_step_s"] / got["jax"]["median_step_s"]
        print(f"round {r + 1}: Tessera {got['tessera']['median_step_s'] * 1e3:.2f} ms, JAX "
              f"{got['jax']['median_step_s'] * 1e3:.2f} ms, ratio {got['ratio']:.2f}", flush=True)
        rounds.append(got)
    ratio = statistics.median(g["ratio"] for g in rounds)
    middle = min(rounds, key=lambda g: abs(g["ratio"] - ratio))     # the median round
    tess, jx = dict(middle["tessera"]), dict(middle["jax"])
    for name, peer in (("tessera", tess), ("jax", jx)):
        peer["median_step_s"] = statistics.median(g[name]["median_step_s"] for g in rounds)
    rel = abs(tess["first_loss"] - jx["first_loss"]) / abs(jx["first_loss"])
    result = {
        "date": datetime.date.today().isoformat(), "commit": git_commit(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "config": cfg, "steps": args.steps, "tessera": tess, "jax": jx,
        "first_loss_rel_diff": rel, "ratio_tessera_over_jax": ratio,
        "rounds": [{"tessera_step_s": g["tessera"]["median_step_s"],
                    "jax_step_s": g["jax"]["median_step_s"], "ratio": g["ratio"]} for g in rounds],
    }
    lines = ["| peer | median step (ms) | first loss |", "| --- | ---: | ---: |",
             f"| Tessera (4 MPI ranks) | {tess['median_step_s'] * 1e3:.2f} | {tess['first_loss']:.7f} |",
             f"| JAX {jx['jax']} (4 host devices) | {jx['median_step_s'] * 1e3:.2f} | "
             f"{jx['first_loss']:.7f} |"]
    summary = (f"ratio Tessera / JAX: {ratio:.2f} (median of {len(rounds)} alternating rounds: "
               + " / ".join(f"{g['ratio']:.2f}" for g in rounds) + "; the step times are the "
               f"medians over the rounds); Tessera has collectives in flight "
               f"{tess['comm_share']:.0%} of the step ({tess['collectives_per_step']} per step), "
               f"exposed (the rank starting or waiting for them) "
               f"{tess['exposed_comm_share']:.0%}")
    print("\n".join(lines) + "\n" + summary)
    folder = ROOT / "bench" / "results"
    stem = new_stem(folder, f"dp_tp_step-{result['date']}")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(
        f"# dp x tp GPT step, {result['date']}, commit {result['commit']}\n\n"
        f"Machine: {result['machine']}. Config: {cfg}. Command: "
        f"`.venv/bin/python bench/dp_tp_step.py --steps {args.steps} --rounds {args.rounds}`.\n\n"
        + "\n".join(lines) + f"\n\n{summary}.\n")
    if rel > 1e-4:
        print(f"first-step losses differ by {rel:.2e} (relative): not the same computation",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
