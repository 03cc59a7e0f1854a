"""Running a generated program in Tessera and judging it against its oracles."""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, settings

from programs import Program, compare, finite_difference

# TESSERA_FUZZ_EXAMPLES=N: a developer's longer run, N examples per fuzz
# test, from a fresh random seed (hypothesis' database, .hypothesis/, replays
# what failed before). Unset: the suite's fixed-seed run.
DEVELOPER_EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "0") or 0)


def fuzz_settings(examples: int) -> settings:
    """`examples` programs from a fixed seed (the suite), or the developer's N."""
    if DEVELOPER_EXAMPLES:
        return settings(max_examples=DEVELOPER_EXAMPLES, deadline=None, print_blob=True,
                        suppress_health_check=list(HealthCheck))
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def run(p: Program, arrays: dict, filename: str, call=None) -> list:
    """The program's results from Tessera (`call(fn, *arguments)`, by default
    ts.jit's), as numpy arrays."""
    import tessera as ts
    fn = p.function(filename)
    args = [arrays[v.name] for v in p.arguments()]
    out = (call or (lambda f, *a: ts.jit(f)(*a)))(fn, *args)
    return [o.numpy() if isinstance(o, ts.dist.DTensor) else np.asarray(o) for o in out]


def judge_forward(p: Program, arrays: dict, got: list) -> str | None:
    """What is wrong with `got` (Tessera's results), or None."""
    refs, scale = p.reference(arrays)
    for i, (g, ref, v) in enumerate(zip(got, refs, p.results)):
        if g.dtype.name != {"f32": "float32", "bf16": "bfloat16", "i32": "int32"}[v.dtype]:
            return f"result {i} ({v.name}): dtype {g.dtype}, expected {v.dtype}"
        wrong = compare(g, ref, scale, p.uses_bf16)
        if wrong:
            return f"result {i} ({v.name}): {wrong}"
    return None


def judge_gradient(p: Program, arrays: dict, got: list) -> str | None:
    """Tessera's gradients against central differences of the float64 loss,
    where the loss is differentiable."""
    for g, v in zip(got, p.wrt):
        fd, smooth = finite_difference(p, arrays, v)
        g = np.asarray(g, np.float64)
        if g.shape != fd.shape:
            return f"d loss / d {v.name}: shape {list(g.shape)}, expected {list(fd.shape)}"
        scale = 1.0 + (np.abs(fd[smooth]).max() if smooth.any() else 0.0)
        err = np.abs(g - fd)[smooth]
        bad = err > 1e-3 * scale + 1e-3 * np.abs(fd[smooth])
        if not np.isfinite(g[smooth]).all() or bad.any():
            return (f"d loss / d {v.name}: tessera {g[smooth][bad][:4]}, finite differences "
                    f"{fd[smooth][bad][:4]} (max |diff| {err.max():.3g})")
    return None


def agree(comm, verdict: str | None, shown: str) -> None:
    """Every rank's verdict on one example (None: nothing wrong), gathered so
    that all ranks decide alike; the first wrong one raised, with `shown`
    (the example, as a user would rerun it)."""
    wrong = [(r, v) for r, v in enumerate(comm.allgather(verdict)) if v]
    if wrong:
        rank, what = wrong[0]
        raise AssertionError(f"rank {rank}: {what}\n--- {shown}")


def run_and_report(test, comm, out, count: list) -> None:
    """Runs a hypothesis test in every rank; rank 0 writes out/result.json
    ({programs, seconds, failure}) for the pytest side to read."""
    import json
    import time
    start, failure = time.time(), None
    try:
        test()
    except AssertionError as e:
        failure = str(e)
    if comm.rank == 0:
        (out / "result.json").write_text(json.dumps(
            {"programs": count[0], "seconds": time.time() - start, "failure": failure}))
