"""What the GPU benchmarks share: CUDA-event timing, compiled GPU bundles
(built here or taken from a kit folder), their `cuda` engine, and the
results files (device, driver, commit, date).

A GPU machine may have no MLIR toolchain (the lent ones here have Python
3.12 and no package index): with `--kit DIR --build-only` a benchmark
compiles its bundles into DIR on any machine with the compiler and nvcc,
and with `--kit DIR` alone it runs the bundles found there, importing only
the runtime (PYTHONPATH=runtime)."""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def add_kit_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--kit", type=Path, default=None, metavar="DIR",
                    help="folder of compiled bundles: run those found there (no compiler "
                         "needed); compile the missing ones into it")
    ap.add_argument("--build-only", action="store_true",
                    help="compile the bundles into --kit and stop (no GPU needed)")
    ap.add_argument("--append", action="store_true",
                    help="add the rows to today's results file (same device and commit) "
                         "instead of replacing it")


def gpu_bundle(kit: Path | None, name: str, fn, *example, options=None) -> Path:
    """The GPU-target bundle of `fn` for arguments shaped like `example`,
    compiled with `options` (a TargetOptions; default: the GPU target's
    defaults). Where the compiler is installed: compiled now (the bundle
    cache makes an unchanged one free) and, with a kit, copied to kit/name
    over any older copy, so a kit never keeps a bundle an older compiler or
    other options wrote. Without it (the GPU machine): kit/name."""
    try:
        import tessera as ts
    except ImportError:
        if kit is not None and (kit / name / "manifest.json").exists():
            return kit / name
        raise SystemExit(f"no bundle {name} in the kit ({kit}) and no compiler here to build "
                         "it: build the kit where the compiler is (bench/gpu_kit.py build)")
    path, _ = ts.jit(fn, target=options if options is not None else "gpu").build(*example)
    if kit is None:
        return path
    kit.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(kit / name, ignore_errors=True)
    shutil.copytree(path, kit / name, ignore=shutil.ignore_patterns("ir"))   # not needed to run
    return kit / name


def bundle_engine(path: Path):
    """The `cuda` engine with the bundle at `path` loaded."""
    import tessera_runtime
    return tessera_runtime.load_bundle(path, engine="cuda")._executor.engine


def time_cuda(fn, iters: int, cp, stream=None) -> float:
    """Median seconds of `fn()` over `iters` runs, timed with CUDA events on
    `stream` (default: the legacy default stream), after 3 warm-up runs."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        fn()
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(times))


def torch_bf16(x: np.ndarray):
    """A bf16 numpy array (ml_dtypes) as a CUDA torch tensor, bit for bit."""
    import torch
    t = torch.from_numpy(x.view(np.uint16).astype(np.int32)).to(torch.int16)
    return t.view(torch.bfloat16).cuda()


def results_meta(cp, kit: Path | None = None) -> dict:
    """Device, driver, date and commit for a results file. With a kit, the
    commit is the one the kit was built from (its build.json): what ran is
    the kit, and the GPU machine's copy of the tree may carry a stale git
    HEAD (the first H100 run recorded the session's base commit)."""
    props = cp.cuda.runtime.getDeviceProperties(0)
    commit = ""
    if kit is not None and (kit / "build.json").exists():
        commit = json.loads((kit / "build.json").read_text()).get("commit") or ""
    if not commit:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    return {"device": props["name"].decode(), "driver": cp.cuda.runtime.driverGetVersion(),
            "date": datetime.date.today().isoformat(), "commit": commit or "unknown"}


def write_results(name: str, title: str, columns: dict, rows: list[dict],
                  meta: dict, key: tuple[str, ...], append: bool = False,
                  folder: Path = ROOT / "bench" / "results") -> Path:
    """Writes <folder>/<name>-<date>.{json,md}: `rows` with `meta` (from
    results_meta); the table has a column per `columns` entry (its header:
    a callable formatting a row). With `append`, the rows join those
    already in the day's file (from the same device and commit), replacing
    any with the same `key` fields: how one variant per process adds up."""
    out = folder / f"{name}-{meta['date']}"
    if append and out.with_suffix(".json").exists():
        old = json.loads(out.with_suffix(".json").read_text())
        if {k: old["meta"].get(k) for k in ("device", "commit")} == \
                {k: meta[k] for k in ("device", "commit")}:
            fresh = {tuple(r[k] for k in key) for r in rows}
            rows = [r for r in old["rows"] if tuple(r[k] for k in key) not in fresh] + rows
    rows = sorted(rows, key=lambda r: tuple(r[k] for k in key))
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# {title} ({meta['device']}, driver {meta['driver']}, commit {meta['commit']}, "
             f"{meta['date']})", "", "| " + " | ".join(columns) + " |",
             "| " + " | ".join("---:" for _ in columns) + " |"]
    lines += ["| " + " | ".join(col(r) for col in columns.values()) + " |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return out
