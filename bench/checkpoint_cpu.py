"""How long `checkpoint.save` holds the training step: a synchronous save
against an asynchronous one (`async_io=True`: the call returns after copying
the values; a background thread writes and commits), for the example GPT's
parameters and AdamW state and for a 100M-parameter tree, in one process.
Beside them, the floor: the same bytes written by `safetensors.numpy.save_file`
into one file and fsynced.

    .venv/bin/python bench/checkpoint_cpu.py [--params 100e6] [--repeat 3] [--dir DIR]

Prints per tree: bytes, synchronous save s, async save's blocking s (and its
share of the synchronous time), async total until committed s, the
safetensors floor s. Results go to bench/results/checkpoint_cpu-<date>.json/.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
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

from cpu_ranks import commit_and_date, write_results  # noqa: E402


def gpt_tree():
    import train_gpt as ex
    import tessera as ts
    params = ex.init_params(128, 2, 4, 32, 0)
    return {"tensors": params, "optimizer": ts.optim.AdamW().init(params)}


def big_tree(n: float):
    """`n` float32 parameters in 4M-element matrices (a 100M model has ~25 of them)."""
    rng = np.random.default_rng(0)
    count = max(1, int(round(n / (2048 * 2048))))
    return {"tensors": {f"layer{i}": rng.standard_normal((2048, 2048), dtype=np.float32)
                        for i in range(count)}}


def measure(tree: dict, directory: Path, repeat: int) -> dict:
    from safetensors.numpy import save_file
    from tessera import checkpoint
    from tessera._pytree import flatten, paths
    leaves = {p: np.asarray(v) for name, t in tree.items()
              for p, v in zip(paths(t, name), flatten(t)[0])}
    nbytes = sum(v.nbytes for v in leaves.values())
    sync, blocked, total, floor = [], [], [], []
    for i in range(repeat):
        t0 = time.perf_counter()
        checkpoint.save(f"sync{i}", directory=directory, keep=1, **tree)
        sync.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        handle = checkpoint.save(f"async{i}", directory=directory, keep=1, async_io=True, **tree)
        blocked.append(time.perf_counter() - t0)
        handle.wait()
        total.append(time.perf_counter() - t0)
        path = directory / "floor.safetensors"
        t0 = time.perf_counter()
        save_file(leaves, str(path))
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        floor.append(time.perf_counter() - t0)
        path.unlink()
    med = statistics.median
    return {"bytes": nbytes, "sync_s": med(sync), "async_blocked_s": med(blocked),
            "async_total_s": med(total), "floor_s": med(floor),
            "blocked_share": med(blocked) / med(sync)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=float, default=100e6, help="parameters of the big tree")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args(argv)
    directory = Path(args.dir or tempfile.mkdtemp(prefix="checkpoint_cpu-"))
    rows = {}
    for name, tree in (("example GPT (w128 d2) + AdamW", gpt_tree()),
                       (f"{args.params / 1e6:.0f}M parameters (fp32)", big_tree(args.params))):
        rows[name] = measure(tree, directory / name.split()[0], args.repeat)
        print(name, json.dumps(rows[name]), flush=True)
    shutil.rmtree(directory, ignore_errors=True) if args.dir is None else None
    commit, today = commit_and_date()
    lines = [f"checkpoint_cpu: one process, median of {args.repeat}; {platform.node()} "
             f"({os.cpu_count()} cores), commit {commit}, {today}", "",
             "| tree | MiB | sync save s | async: blocks s | blocks / sync | async: committed s "
             "| safetensors + fsync floor s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['bytes'] / 2**20:.1f} | {r['sync_s']:.3f} | "
                     f"{r['async_blocked_s']:.4f} | {100 * r['blocked_share']:.1f}% | "
                     f"{r['async_total_s']:.3f} | {r['floor_s']:.3f} |")
    text = "\n".join(lines)
    print(text)
    write_results("checkpoint_cpu", commit, today, text, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
