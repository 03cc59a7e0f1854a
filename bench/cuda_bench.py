"""What the GPU benchmarks share: CUDA-event timing, the compiled kernels of
a `ts.jit` function, and the results files (device, driver, commit, date)."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


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


def cuda_engine(compiled):
    """The `cuda` engine of the program `compiled` (a `ts.jit` function,
    called once) last ran."""
    program = compiled._programs[compiled._last_key][0]
    return program._executor.engine


def torch_bf16(x: np.ndarray):
    """A bf16 numpy array (ml_dtypes) as a CUDA torch tensor, bit for bit."""
    import torch
    t = torch.from_numpy(x.view(np.uint16).astype(np.int32)).to(torch.int16)
    return t.view(torch.bfloat16).cuda()


def write_results(name: str, title: str, header: list[str], rows: list[dict],
                  columns: list, cp) -> Path:
    """Writes bench/results/<name>-<date>.{json,md}: `rows` with the device,
    driver, commit and date; the table has `header` and, per row, the
    formatted `columns` (callables of a row)."""
    props = cp.cuda.runtime.getDeviceProperties(0)
    meta = {"device": props["name"].decode(), "driver": cp.cuda.runtime.driverGetVersion(),
            "date": datetime.date.today().isoformat(),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                     capture_output=True, text=True).stdout.strip()}
    out = ROOT / "bench" / "results" / f"{name}-{meta['date']}"
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# {title} ({meta['device']}, driver {meta['driver']}, commit {meta['commit']}, "
             f"{meta['date']})", "", "| " + " | ".join(header) + " |",
             "| " + " | ".join("---:" for _ in header) + " |"]
    lines += ["| " + " | ".join(col(r) for col in columns) + " |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return out
