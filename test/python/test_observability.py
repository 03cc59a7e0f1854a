"""Seeing what a distributed step does (issue 29): `tessera launch --profile`
and `dist.profile` (one Perfetto trace for all ranks, a balance per rank),
and the flight recorder that names the rank a hang waits for."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from tessera.profiling import balance, perfetto_trace
from tessera_runtime.flight import diagnose

WORKERS = Path(__file__).parent / "workers"


def _slice(stream, cat, t0, t1, **args):
    return [stream, f"{cat} slice", cat, t0, t1, args]


def test_balance_splits_each_rank_s_window_into_its_parts():
    # Rank 0 starts tp all_reduce #1 at 2.0, rank 1 only at 3.0: rank 0 waits
    # 1.0 of its 1.5 blocked seconds for rank 1, the remaining 0.5 is transfer.
    group = {"tp": [0, 1]}
    r0 = {"rank": 0, "t_start": 0.0, "t_stop": 10.0, "groups": group, "slices": [
        _slice("host", "run", 0.5, 6.0),
        _slice("host", "copy", 0.5, 1.0, bytes=64),             # its inputs to the device
        _slice("compute", "compute", 1.0, 2.0, key="k"),
        _slice("comm", "comm", 2.0, 4.0, axis="tp", seq=1, wait_seconds=1.5),
        _slice("compute", "compute", 2.0, 2.5, key="k"),        # hidden under the collective
        _slice("compute", "compute", 4.0, 5.0, key="k")]}
    r1 = {"rank": 1, "t_start": 0.0, "t_stop": 10.0, "groups": group, "slices": [
        _slice("host", "run", 3.0, 4.0),
        _slice("comm", "comm", 3.0, 4.0, axis="tp", seq=1, wait_seconds=1.0)]}
    b0, b1 = balance([r0, r1], steps=None)
    assert b0["steps"] == 1 and b0["window"] == 10.0
    assert b0["compute"] == pytest.approx(2.5) and b0["hidden"] == pytest.approx(0.5)
    assert b0["waiting"] == pytest.approx(1.0) and b0["transfer"] == pytest.approx(0.5)
    assert b0["overhead"] == pytest.approx(1.0)               # run 5.5 - busy 4.0 - copy 0.5
    assert b0["copies"] == pytest.approx(0.5) and b1["copies"] == 0.0
    assert b0["idle"] == pytest.approx(4.5)
    assert b0["overlap"] == pytest.approx(0.25)               # 0.5 of the 2.0 in flight
    assert b1["waiting"] == 0.0 and b1["transfer"] == pytest.approx(1.0)
    for b in (b0, b1):
        assert b["compute"] + b["transfer"] + b["waiting"] + b["overhead"] + b["copies"] + \
            b["idle"] == pytest.approx(b["window"])
    trace = perfetto_trace([r0, r1], [0.0, 0.0])
    gaps = [e for e in trace["traceEvents"] if e.get("cat") == "idle" and e["pid"] == 1]
    assert [(g["ts"], g["dur"]) for g in gaps] == [(0.0, 3e6), (4e6, 6e6)]


def test_launch_profile_writes_one_perfetto_trace_of_every_rank_and_stream(tessera_launch,
                                                                            tmp_path):
    out = tmp_path / "prof"
    proc = tessera_launch("-n", 2, "--profile", out, "examples/tp_mlp.py")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "[tessera profile] 2 ranks" in proc.stdout
    summary = (out / "summary.txt").read_text()
    assert re.search(r"^0 .*%.*\n1 .*%", summary, re.M), summary
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((out / "trace.json").read_text())
    assert set(trace["otherData"]["clock_offsets_s"]) == {"0", "1"}
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X"}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(p, s) for p in (0, 1) for s in ("host", "compute", "comm")}
    tids = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    for e in (e for e in events if e["ph"] == "X"):
        assert (e["pid"], e["tid"]) in tids and e["ts"] >= 0 and e["dur"] >= 0, e
        assert isinstance(e["name"], str) and isinstance(e["args"], dict), e
    # Each run spans its inputs' copy in and its outputs' copy out.
    runs = [e for e in events if e.get("cat") == "run"]
    copies = [e for e in events if e.get("cat") == "copy"]
    assert len(copies) == 2 * len(runs) > 0 and all(c["args"]["bytes"] > 0 for c in copies)
    for c in copies:
        assert any(r["pid"] == c["pid"] and r["ts"] <= c["ts"] and
                   c["ts"] + c["dur"] <= r["ts"] + r["dur"] + 0.002 for r in runs), c
    comm = [e for e in events if e.get("cat") == "comm"]
    assert len(comm) == 2                       # the one all_reduce, on each rank
    for e in comm:
        assert e["args"]["op"] == "all_reduce" and e["args"]["axis"] == "tp"
        assert e["args"]["bytes"] == 64 * 128 * 4
        assert re.fullmatch(r".*examples/tp_mlp\.py:\d+", e["args"]["source"])
        assert e["args"]["schedule_op"].startswith("tsched.collective_start")
    launches = [e for e in events if e.get("cat") == "compute"]
    assert {e["pid"] for e in launches} == {0, 1}
    assert all(e["args"]["schedule_op"].startswith("tsched.launch @") for e in launches)


def test_a_skipped_collective_is_named_by_the_flight_recorder_within_the_timeout(
        tessera_launch):
    t0 = time.monotonic()
    proc = tessera_launch("-n", 3, WORKERS / "skip_collective_worker.py",
                          env={"TESSERA_COLLECTIVE_TIMEOUT": "2"}, timeout=90)
    took = time.monotonic() - t0
    assert proc.returncode != 0
    where = r"\(skip_collective_worker\.py:\d+\)"
    assert re.search(rf"\[tessera\] tp all_reduce #3 {where}: ranks 0,2 waiting, rank 1 never "
                     rf"started it; rank 1 last completed tp all_reduce #2 {where}",
                     proc.stderr), proc.stderr[-3000:]
    assert "CollectiveTimeout" in proc.stderr
    assert took < 60


def test_a_rank_that_never_calls_the_compiled_function_is_named_within_the_timeout(
        tessera_launch):
    """Before a compiled function's first run the ranks compare their
    programs: a rank that never comes (stuck before the call) is named by
    the others' CollectiveTimeout within the timeout, and the job stops."""
    proc = tessera_launch("-n", 2, WORKERS / "absent_rank_worker.py",
                          env={"TESSERA_COLLECTIVE_TIMEOUT": "3"}, timeout=90)
    ended = time.time()
    assert proc.returncode != 0, proc.stdout[-2000:]
    called = float(re.search(r"calling at ([\d.]+)", proc.stdout).group(1))
    assert ended - called < 3 + 10, ended - called
    assert re.search(r"CollectiveTimeout: the program agreement before the first run of step "
                     r"\(called at \S*absent_rank_worker\.py:\d+\): the ranks check that they "
                     r"traced the same program: rank 1 never arrived within 3 s "
                     r"\(TESSERA_COLLECTIVE_TIMEOUT\); rank 0 waited there", proc.stderr), \
        proc.stderr[-3000:]
    # The launcher's diagnosis from the flight recorders: rank 1 never started it.
    assert re.search(r"\[tessera\] world the program agreement of step #1 "
                     r"\(absent_rank_worker\.py:\d+\): rank 0 waiting, rank 1 never started it",
                     proc.stderr), proc.stderr[-3000:]
    assert "returned from a call" not in proc.stderr


def test_diagnose_names_a_rank_in_another_collective_and_a_silent_one():
    def entry(seq, op, state, nbytes=64):
        return {"seq": seq, "op": op, "axis": "dp", "nbytes": nbytes, "state": state,
                "source": "/x/train.py:7", "peer": None}
    group = {"dp": [0, 1, 2]}
    dumps = {0: {"rank": 0, "reason": "timeout", "groups": group,
                 "entries": [entry(4, "all_reduce", "completed"),
                             entry(5, "all_reduce", "timed out")]},
             1: {"rank": 1, "reason": "asked by the launcher", "groups": group,
                 "entries": [entry(5, "all_gather", "started", 128)]}}
    (line,) = diagnose(dumps, 3)
    assert line == ("dp all_reduce #5 (train.py:7): rank 0 waiting, rank 1 is in all_gather "
                    "of 128 B under that number instead, rank 2 left no flight record")


def test_a_profile_inside_a_profiled_run_sees_its_block_and_the_outer_one_everything():
    """`dist.profile()` in a script run under `tessera launch --profile`
    (which profiles the whole process): the inner block reports its own
    runs, the outer recording keeps every run, the inner ones included."""
    from tessera_runtime import profiler
    import tessera as ts
    from tessera import dist, op
    f = ts.jit(lambda x: op.tanh(x) * 2.0)
    x = np.ones(64, np.float32)
    outer = profiler.start()
    f(x)
    with dist.profile(None, show=False) as inner:
        f(x)
        f(x)
    f(x)
    assert profiler.stop(outer) is outer and profiler.active() is None
    runs = [s for s in outer.slices if s[2] == "run"]
    assert len(runs) == 4
    assert inner.ranks[0]["steps"] == 2


def test_the_emulated_gpu_engine_profiles_kernels_and_host_copies(tmp_path, monkeypatch):
    """dist.profile on the GPU target's engine, emulated here (on a GPU the
    stamps are CUDA events: bench/gpu_kit.py's profile step): every kernel
    of the run is a compute slice on its stream, and the run spans its
    inputs' copy to the device and its outputs' copy back."""
    import tessera as ts
    from tessera import dist, op
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    rng = np.random.default_rng()
    x, w = rng.standard_normal((32, 16), np.float32), rng.standard_normal((16, 8), np.float32)
    f = ts.jit(lambda x, w: op.relu(op.matmul(x, w)), target="gpu")
    f(x, w)                                     # compiled outside the profile
    with dist.profile(tmp_path / "trace.json", show=False) as prof:
        y = f(x, w)
    np.testing.assert_allclose(np.asarray(y), np.maximum(x.astype(np.float64) @ w, 0),
                               rtol=1e-4, atol=1e-5)
    events = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
              if e["ph"] == "X"]
    run = [e for e in events if e["cat"] == "run"]
    copies = sorted((e for e in events if e["cat"] == "copy"), key=lambda e: e["ts"])
    kernels = [e for e in events if e["cat"] == "compute"]
    assert len(run) == 1 and len(kernels) >= 1 and len(copies) == 2
    assert [c["args"]["bytes"] for c in copies] == [x.nbytes + w.nbytes, 32 * 8 * 4]
    assert copies[0]["ts"] + copies[0]["dur"] <= min(k["ts"] for k in kernels) + 0.002
    assert max(k["ts"] + k["dur"] for k in kernels) <= copies[1]["ts"] + 0.002
    r = prof.ranks[0]
    assert r["compute"] > 0 and r["copies"] > 0
    assert r["compute"] + r["transfer"] + r["waiting"] + r["overhead"] + r["copies"] + \
        r["idle"] == pytest.approx(r["window"])


def test_importing_tessera_starts_no_profile_until_the_first_compiled_call(tmp_path):
    """TESSERA_PROFILE=DIR (what `tessera launch --profile DIR` gives each
    rank's script) profiles from the first compiled call on: importing
    tessera starts nothing and writes nothing. (What the profile writes at
    exit: test_launch_profile_writes_one_perfetto_trace_of_every_rank_and_stream.)"""
    import os
    import subprocess
    import sys
    script = ("import os, numpy as np, tessera as ts\n"
              "from tessera_runtime import profiler\n"
              "assert profiler.active() is None and not os.path.exists(os.environ['TESSERA_PROFILE'])\n"
              "ts.jit(lambda x: x + 1.0)(np.ones(4, np.float32))\n"
              "assert profiler.active() is not None, 'the first call started no profile'\n"
              "os._exit(0)     # (before the profile's own exit handler writes it)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "TESSERA_PROFILE": str(tmp_path / "prof")}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
