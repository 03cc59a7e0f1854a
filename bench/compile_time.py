"""Compile time of the example GPT's training step: Tessera against `jax.jit`,
at several depths, on one CPU device.

What it measures, each in a fresh process so that nothing is warm but the
operating system's file cache:

  * Tessera cold: the first call of `train_gpt.make_step`'s step (forward,
    backward, clipping, AdamW) with an empty cache directory — trace,
    lower through every IR level, compile the C++ kernels, load, run once.
    The passes' and g++'s shares come from the same call.
    The runtime part of every CPU kernel library (the OpenMP team, the
    GEMM, the row copies: the same C++ in every library) is not in it:
    tools/bootstrap.sh compiles it when Tessera is installed.
  * Tessera warm: the same first call in a second process over the cache
    the cold one filled (the bundle is found by its content: no lowering,
    no compiling) — what a user's second run of a script pays.
  * JAX: the first call of the same step under `jax.jit` (trace, XLA
    compile, run once), from `bench/dp_tp_step.py`'s JAX worker on one
    device.

Imports are left out of every number (each process imports first, then
the clock starts). The ratio printed is Tessera cold / JAX (> 1: Tessera
compiles slower). Results go to bench/results/compile_time-<date>.json/.md.

    .venv/bin/python bench/compile_time.py                  # depths 2, 8, 24
    .venv/bin/python bench/compile_time.py --depths 2 8     # quicker

Needs `jax` in the same interpreter (`pip install jax`); without it the
JAX column is left out and said so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in ("examples", "runtime", "passes", ".", "bench"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import dp_tp_step  # noqa: E402  (its JAX worker and git_commit)
from cpu_ranks import new_stem  # noqa: E402


def config(args, depth: int) -> dict:
    return {"width": args.width, "depth": depth, "heads": args.heads, "batch": args.batch,
            "length": args.length, "dp": 1, "tp": 1, "seed": 0}


def tessera_worker(cfg: dict, out: Path) -> None:
    """Times the step's first call in this process (imports excluded), with
    the time the compiler spent in its passes and in g++ (a cProfile-free
    split: the two entry points are wrapped)."""
    import numpy as np
    import tessera as ts
    import train_gpt as ex
    from tessera import compiler
    from tessera_compiler import bundle

    spent = {"lower_s": 0.0, "cxx_s": 0.0}

    def timed(fn, key):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] += time.perf_counter() - t0
        return wrapper

    compiler.CompiledFunction._lower = timed(compiler.CompiledFunction._lower, "lower_s")
    bundle.build_cpu_library = timed(bundle.build_cpu_library, "cxx_s")
    params = ex.init_params(cfg["width"], cfg["depth"], cfg["heads"], 2 * cfg["length"],
                            cfg["seed"])
    batch = ex.make_batch(np.random.default_rng(cfg["seed"]), cfg["batch"], cfg["length"])
    opt = ts.optim.AdamW(lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)
    state, scaler = opt.init(params), ts.optim.loss_scale_init(1.0)
    step = ex.make_step(opt, cfg["heads"], "fp32", clip=1.0)
    t0 = time.perf_counter()
    loss, *_ = step(params, state, scaler, [batch])
    first_loss = float(loss)
    out.write_text(json.dumps({"first_call_s": time.perf_counter() - t0,
                               "first_loss": first_loss, **spent}))


def _tessera_worker(cfg: dict, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([sys.executable, __file__, "--tessera-worker", json.dumps(cfg), str(out)],
                       check=True, env=env, cwd=str(ROOT))
        return json.loads(out.read_text())


def run_tessera(cfg: dict) -> dict:
    """Cold (empty cache) and warm (second process, same cache) first calls."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(ROOT / p) for p in ("build/dev/python_packages", ".", "passes", "runtime"))
        + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # A user's second run finds Python's bytecode caches as well as
    # Tessera's: with PYTHONDONTWRITEBYTECODE (set on these VMs) every
    # process compiles the modules the first call imports lazily again
    # (7 of them, a tenth of a warm start).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as cache:
        env["TESSERA_CACHE_DIR"] = cache
        return {"cold": _tessera_worker(cfg, env), "warm": _tessera_worker(cfg, env)}


def run_jax(cfg: dict) -> dict | None:
    """bench/dp_tp_step.py's JAX worker on one device (one step timed: only
    its first call counts here); None without jax."""
    try:
        import jax  # noqa: F401
    except ImportError:
        return None
    return dp_tp_step.run_jax(cfg, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 8, 24])
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--tessera-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.tessera_worker:
        cfg, out = args.tessera_worker
        tessera_worker(json.loads(cfg), Path(out))
        return 0

    rows, results, status = [], [], 0
    header = ["| depth | Tessera cold (s) | of it: passes | g++ | Tessera warm (s) | "
              "jax.jit (s) | cold / JAX |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    print("\n".join(header), flush=True)
    for depth in args.depths:
        cfg = config(args, depth)
        tess, jx = run_tessera(cfg), run_jax(cfg)
        cold, warm = tess["cold"], tess["warm"]
        ratio = cold["first_call_s"] / jx["first_call_s"] if jx else None
        row = (f"| {depth} | {cold['first_call_s']:.2f} | {cold['lower_s']:.2f} | "
               f"{cold['cxx_s']:.2f} | {warm['first_call_s']:.2f} | "
               + (f"{jx['first_call_s']:.2f} | {ratio:.2f} |" if jx else "(no jax) | - |"))
        print(row, flush=True)
        rows.append(row)
        if jx:
            rel = abs(cold["first_loss"] - jx["first_loss"]) / abs(jx["first_loss"])
            if rel > 1e-4:
                print(f"depth {depth}: first losses differ by {rel:.2e} (relative): not the "
                      f"same computation", file=sys.stderr)
                status = 1
        results.append({"config": cfg, "tessera": tess, "jax": jx, "ratio_cold_over_jax": ratio})
    date = datetime.date.today().isoformat()
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "python": platform.python_version()}
    jax_version = next((r["jax"]["jax"] for r in results if r["jax"]), None)
    stem = new_stem(Path(args.out), f"compile_time-{date}")
    commit = dp_tp_step.git_commit()
    stem.with_suffix(".json").write_text(json.dumps(
        {"date": date, "commit": commit, "machine": machine, "jax": jax_version,
         "results": results}, indent=1) + "\n")
    stem.with_suffix(".md").write_text(
        f"# Compile time of the example GPT's training step, {date}, commit {commit}\n\n"
        f"Machine: {machine}. JAX {jax_version or 'not installed'}. Width {args.width}, "
        f"{args.heads} heads, batch {args.batch} x {2 * args.length} tokens, fp32, one device. "
        f"Command: `.venv/bin/python bench/compile_time.py --depths "
        f"{' '.join(map(str, args.depths))}`.\n\n"
        "First call of the step in a fresh process (imports excluded): Tessera with an empty "
        "cache (trace, passes, g++, load, run) and again over the filled cache (warm); JAX: "
        "trace, XLA compile, run.\n\n" + "\n".join(header + rows) + "\n")
    print(f"written: {stem}.json, .md")
    return status


if __name__ == "__main__":
    sys.exit(main())
