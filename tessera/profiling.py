"""`dist.profile()`: where a distributed step's time goes, on every rank.

    with dist.profile("step.json") as prof:       # every rank enters and leaves together
        for _ in range(5):
            loss = step(params, batch)
    print(prof.table)                               # rank 0 also prints it on exit

    prof = dist.profile("step.json").start()      # the same, without a block
    ...
    prof.stop()                                     # (or, if never called, the process' exit)

While it runs the runtime records every kernel launch, library call,
collective (start to completion, bytes, axis), transfer and blocking wait, per
rank and per stream (`tessera_runtime.profiler`). When it stops every rank's
record is gathered and

- `prof.ranks` holds each rank's balance, `prof.table` prints it: compute;
  communication exposed (the host blocked on it) split into *waiting* for the
  group's last rank to arrive and the *transfer* itself; communication hidden
  under compute; runtime overhead (the executor's own work between launches);
  idle (time outside Tessera: the user's Python, data loading); each as ms per
  step and share of the step, and the share of communication overlapped;
- rank 0 writes one Chrome / Perfetto trace (`traceEvents`): a process per
  rank, a thread per stream (`host` holds program runs and the gaps between
  them), `X` slices whose `args` name the op, axis, bytes, the Schedule IR
  instruction and the user's Python line. Clocks are aligned across ranks by
  offsets measured when the block starts (the minimum-round-trip ping-pong of
  NTP against rank 0), so a collective lines up across processes.

`tessera launch --profile DIR script.py` profiles a whole run the same way
(TESSERA_PROFILE=DIR) and writes DIR/trace.json and DIR/summary.txt.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
import warnings
import weakref
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tessera_runtime
from tessera_runtime import env, flight, profiler

from ._mpi import allgather_text, world_comm
from ._source import user_frame
from .errors import ArgumentError

if TYPE_CHECKING:
    from ._source import SourceLine

__all__ = ["profile", "ProfileError", "ProfileWarning"]

_PINGS = 8


def _clock_offsets(comm) -> list[float]:
    """offsets[r] = rank r's perf_counter minus rank 0's at the same instant,
    from the ping-pong with the smallest round trip (its error is at most
    half that round trip)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    offsets = np.zeros(size)
    stamp = np.zeros(1)
    for peer in range(1, size):
        if rank == 0:
            best = np.inf
            for _ in range(_PINGS):
                t0 = time.perf_counter()
                comm.Send(np.array([t0]), dest=peer, tag=7101)
                comm.Recv(stamp, source=peer, tag=7102)
                t1 = time.perf_counter()
                if t1 - t0 < best:
                    best, offsets[peer] = t1 - t0, stamp[0] - (t0 + t1) / 2
        elif rank == peer:
            for _ in range(_PINGS):
                comm.Recv(stamp, source=0, tag=7101)
                comm.Send(np.array([time.perf_counter()]), dest=0, tag=7102)
    comm.Bcast(offsets, root=0)
    return offsets.tolist()


class ProfileWarning(UserWarning):
    """A `dist.profile()` made but never started: it records nothing."""


try:
    from .errors import TesseraError
    _ERROR_BASES: tuple = (TesseraError, RuntimeError)
except ImportError:             # this file loaded alone (bench/gpu_kit.py): no package
    _ERROR_BASES = (RuntimeError,)


class ProfileError(*_ERROR_BASES):
    """A profile started twice, or stopped without having been started: a
    TesseraError. (The package's other modules are imported only where a
    profile is made: bench/gpu_kit.py loads this file alone, for `balance`
    and `perfetto_trace`, on a machine without the compiler; there this is a
    plain RuntimeError.)"""


def _user_line() -> "SourceLine":
    return user_frame()


def _argument_error(text: str) -> Exception:
    """tessera's ArgumentError at the user's line (imported here, not at the
    top: see ProfileError)."""
    return ArgumentError(f"{text}  [{_user_line()}]")


def _never_started(src: SourceLine) -> None:
    """A profile object was collected (or the process ended) without being
    entered or started: say so at the line that made it."""
    warnings.warn_explicit(
        "dist.profile() was never started, so it recorded nothing: use "
        "`with dist.profile() as prof:` around the steps, or `prof = dist.profile().start()` "
        f"... `prof.stop()`  [{src}]", ProfileWarning, src.filename, src.line)


#: the profile a bare `dist.profile()` statement started (stopped at exit,
#: or by `dist.profile().stop()`)
_STATEMENT: list = []


def _result_discarded(frame) -> bool:
    """Whether the call `frame` is making is a statement of its own: the
    next instruction pops its result (not a `with`, an assignment or a
    `.start()`). False where the bytecode says otherwise or cannot tell (an
    interactive prompt prints the result instead)."""
    import dis
    for ins in dis.get_instructions(frame.f_code):
        if ins.offset > frame.f_lasti and ins.opname not in ("CACHE", "EXTENDED_ARG"):
            return ins.opname == "POP_TOP"
    return False


class profile:
    """Profile the ranks' work (see the module docs), in one of two forms:

        with dist.profile() as prof:        # the steps inside the block
            ...
        prof = dist.profile().start()       # from start() to stop()
        ...
        prof.stop()                         # (or the process' exit)

    Every rank starts and stops together (both exchange clocks or records).
    A profile started and not stopped is stopped when the process exits
    (its table printed then), as `tessera launch --profile` does. A bare
    `dist.profile()` statement (the tutorial's 4.6 wording, whose object
    nobody keeps) starts one that lasts to the process' exit, or to
    `dist.profile().stop()`. One made some other way and never started
    records nothing and says so (a ProfileWarning naming the line that made
    it) when it is collected.

    trace:  where rank 0 writes the Perfetto trace JSON (None: no file)
    steps:  how many steps the profile covers, for the per-step columns
            (default: the number of runs of the program that ran most often)
    show:   rank 0 prints the table when the profile stops
    """

    def __init__(self, trace: str | Path | None = "tessera_trace.json", steps: int | None = None,
                 show: bool = True):
        if trace is not None and not isinstance(trace, (str, os.PathLike)):
            raise _argument_error(f"dist.profile: trace={trace!r} must be a file path (a str or "
                                  f"Path) or None")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or steps < 1):
            raise _argument_error(f"dist.profile: steps={steps!r} must be a number of steps (an "
                                  f"int >= 1) or None")
        self.trace_path = Path(trace) if trace is not None else None
        self.steps, self.show = steps, show
        self.ranks: list[dict] = []
        self.table = ""
        self._comm = None
        self._recorder = None
        self._stopped = False
        self._source = _user_line()
        # (A finalizer, not __del__: it also runs at exit for a profile
        # still referenced then, and holds no reference to the profile.)
        self._unstarted = weakref.finalize(self, _never_started, self._source)
        if _result_discarded(sys._getframe(1)):
            # `dist.profile()` as a statement (the tutorial's 4.6 wording):
            # what it means is "profile the rest of the run", so it starts
            # now and ends at the process' exit, or at `dist.profile().stop()`.
            _STATEMENT.append(self.start())

    # -- the two forms ----------------------------------------------------------
    def start(self) -> "profile":
        """Starts recording on every rank (each must call it); returns the
        profile. Until `stop()`, or the process' exit."""
        if self._recorder is not None:
            state = "stopped" if self._stopped else "running"
            raise ProfileError(f"dist.profile (made at {self._source}) was already started and "
                               f"is {state}; make a new dist.profile() for another window  "
                               f"[{_user_line()}]")
        self._unstarted.detach()
        rank, size = tessera_runtime.world()
        self.rank = rank
        if size > 1:
            self._comm = world_comm()
            self._offsets = _clock_offsets(self._comm)
        else:
            self._offsets = [0.0]
        self._recorder = profiler.start()
        atexit.register(self._stop_at_exit)
        return self

    def stop(self) -> "profile":
        """Stops recording, gathers every rank's record (each must call it),
        fills `ranks` and `table`, writes the trace (rank 0) and prints the
        table (rank 0, with `show`); returns the profile."""
        if self._stopped:
            raise ProfileError(f"dist.profile.stop(): the profile made at {self._source} was "
                               "already stopped; make a new dist.profile() for another window  "
                               f"[{_user_line()}]")
        if self._recorder is None and _STATEMENT:
            # `dist.profile().stop()`: the profile a bare `dist.profile()` started
            self._unstarted.detach()
            return _STATEMENT.pop().stop()
        if self._recorder is None:
            raise ProfileError(f"dist.profile.stop(): the profile made at {self._source} was "
                               "never started; start it with .start() (or use `with "
                               f"dist.profile() as prof:`)  [{_user_line()}]")
        self._finish(profiler.stop(self._recorder))
        return self

    def __enter__(self) -> "profile":
        return self.start()

    def __exit__(self, kind, value, tb) -> None:
        if kind is not None:
            # The block raised on this rank: gathering now would wait for ranks
            # that may never get here (the error aborts the job instead).
            self._stopped = True
            atexit.unregister(self._stop_at_exit)
            profiler.stop(self._recorder)
            return
        self.stop()

    def _stop_at_exit(self) -> None:
        if not self._stopped:
            if self.rank == 0:
                print(f"[tessera] dist.profile() started at {self._source} was not stopped; "
                      "stopping it at exit", file=sys.stderr, flush=True)
            self.stop()

    def _finish(self, rec) -> None:
        self._stopped = True
        atexit.unregister(self._stop_at_exit)
        mine = json.dumps({"rank": self.rank, "t_start": rec.t_start, "t_stop": rec.t_stop,
                           "groups": flight.RECORDER.groups,
                           "slices": [list(s) for s in rec.slices]})
        if self._comm is not None:
            records = [json.loads(t) for t in allgather_text(
                self._comm, mine, what="the merge of dist.profile's records", axis="profile")]
        else:
            records = [json.loads(mine)]
        for r in records:
            shift = self._offsets[r["rank"]]       # onto rank 0's clock
            r["t_start"] -= shift
            r["t_stop"] -= shift
            for s in r["slices"]:
                s[3] -= shift
                s[4] -= shift
        self.ranks = balance(records, self.steps)
        self.table = _table(self.ranks)
        if self.rank == 0:
            if self.trace_path is not None:
                self.trace_path.parent.mkdir(parents=True, exist_ok=True)
                self.trace_path.write_text(json.dumps(perfetto_trace(records, self._offsets)))
                self.table += f"\ntrace (open in ui.perfetto.dev): {self.trace_path}"
            if self.show:
                print(self.table, flush=True)


# ---------------------------------------------------------------------------
# Intervals
# ---------------------------------------------------------------------------

def _union(spans) -> list[tuple[float, float]]:
    out: list = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _length(spans) -> float:
    return sum(b - a for a, b in spans)


def _intersect(xs, ys) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


# ---------------------------------------------------------------------------
# The balance table
# ---------------------------------------------------------------------------

_COLUMNS = (("compute", "compute"), ("transfer", "comm exposed"), ("waiting", "waiting"),
            ("overhead", "runtime"), ("copies", "host copies"), ("idle", "outside runs"))


def balance(records: list[dict], steps: int | None) -> list[dict]:
    """Each rank's time in seconds by kind (the columns add up to the window)."""
    def collective(r: dict, args: dict) -> tuple:
        """One collective across its group: (axis, group's ranks, number)."""
        return args["axis"], tuple(r["groups"].get(args["axis"], [r["rank"]])), args["seq"]

    # When the last rank of each group started each of its collectives.
    arrivals: dict = {}
    for r in records:
        for stream, name, cat, t0, t1, args in r["slices"]:
            if cat == "comm" and "seq" in args:
                key = collective(r, args)
                arrivals[key] = max(arrivals.get(key, t0), t0)
    runs = Counter(name for r in records if r["rank"] == records[0]["rank"]
                   for _, name, cat, *_ in r["slices"] if cat == "run")
    n_steps = steps or (max(runs.values()) if runs else 1)
    out = []
    for r in sorted(records, key=lambda r: r["rank"]):
        by = {"compute": [], "comm": [], "run": [], "copy": []}
        waiting = 0.0
        for stream, name, cat, t0, t1, args in r["slices"]:
            if cat in ("compute", "run", "copy"):
                by[cat].append((t0, t1))
            elif cat in ("comm", "p2p"):
                by["comm"].append((t0, t1))
                if "seq" in args and cat == "comm":
                    late = arrivals[collective(r, args)] - t0
                    waiting += min(max(0.0, late), args.get("wait_seconds", 0.0))
        compute, comm, run, copies = (_union(by[k]) for k in ("compute", "comm", "run", "copy"))
        busy = _union(compute + comm)
        # Host copies (a GPU run's inputs in, outputs out) outside the busy time.
        worked = _union(busy + copies)
        window = r["t_stop"] - r["t_start"]
        hidden = _length(_intersect(comm, compute))
        exposed = _length(busy) - _length(compute)
        waiting = min(waiting, exposed)
        total_comm = _length(comm)
        out.append({
            "rank": r["rank"], "steps": n_steps, "window": window,
            "compute": _length(compute), "transfer": exposed - waiting, "waiting": waiting,
            "hidden": hidden,
            "overhead": max(0.0, _length(run) - _length(_intersect(worked, run))),
            "copies": _length(worked) - _length(busy),
            "idle": max(0.0, window - _length(_union(busy + run))),
            "overlap": hidden / total_comm if total_comm else None,
        })
    return out


def _table(ranks: list[dict]) -> str:
    if not ranks:
        return ""
    steps = ranks[0]["steps"]
    head = f"[tessera profile] {len(ranks)} rank{'s' * (len(ranks) > 1)}, {steps} step" \
           f"{'s' * (steps > 1)}: ms per step (share of the step)"
    cols = [label for _, label in _COLUMNS] + ["step", "comm hidden", "overlapped"]
    lines = [head, "rank" + "".join(f"{c:>15}" for c in cols)]
    for r in ranks:
        share = (lambda s: s / r["window"] * 100) if r["window"] else (lambda s: 0.0)
        cells = [f"{r[k] / steps * 1e3:.2f} ({share(r[k]):.0f}%)" for k, _ in _COLUMNS]
        cells.append(f"{r['window'] / steps * 1e3:.2f}")
        cells.append(f"{r['hidden'] / steps * 1e3:.2f}")
        cells.append("-" if r["overlap"] is None else f"{r['overlap'] * 100:.0f}%")
        lines.append(f"{r['rank']:<4}" + "".join(f"{c:>15}" for c in cells))
    lines.append("comm exposed: blocked on a collective or transfer once its whole group was in "
                 "it; waiting: blocked until the group's last rank arrived; runtime: the "
                 "executor between launches; host copies: a run's inputs to the device and "
                 "its outputs back; outside runs: Python, compiling, data; comm "
                 "hidden: in flight under compute (not in the step's sum)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The Perfetto trace
# ---------------------------------------------------------------------------

def perfetto_trace(records: list[dict], offsets: list[float]) -> dict:
    origin = min(r["t_start"] for r in records)
    events = []

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    for r in sorted(records, key=lambda r: r["rank"]):
        pid = r["rank"]
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"rank {pid}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
        streams = ["host"] + sorted({s[0] for s in r["slices"]} - {"host"})
        for tid, stream in enumerate(streams):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": stream}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
        tids = {s: i for i, s in enumerate(streams)}
        runs = []
        for stream, name, cat, t0, t1, args in r["slices"]:
            if cat == "run":
                runs.append((t0, t1))
            shown = {k: v for k, v in args.items() if v is not None and k != "key"}
            events.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tids[stream],
                           "ts": us(t0), "dur": round(max(t1 - t0, 0.0) * 1e6, 3),
                           "args": shown})
        # The host gaps: time between runs inside the profiled block.
        edge = r["t_start"]
        for a, b in _union(runs) + [(r["t_stop"], r["t_stop"])]:
            if a > edge:
                events.append({"ph": "X", "name": "outside Tessera", "cat": "idle", "pid": pid,
                               "tid": 0, "ts": us(edge), "dur": round((a - edge) * 1e6, 3),
                               "args": {"what": "host gap: the user's Python between runs"}})
            edge = max(edge, b)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "tessera dist.profile",
                          "clock_offsets_s": {str(r): o for r, o in enumerate(offsets)}}}


# ---------------------------------------------------------------------------
# `tessera launch --profile DIR`
# ---------------------------------------------------------------------------

#: colours of the timeline picture, by slice category
_COLOURS = {"compute": "#4c72b0", "comm": "#dd8452", "p2p": "#c44e52", "wait": "#bbbbbb",
            "copy": "#55a868",
            "run": "#e8e8e8", "idle": "#f5f5f5"}


def timeline_png(trace: dict, path: str | Path, ranks: int = 8) -> Path:
    """A picture of a Perfetto `trace` (dist.profile's or tessera simulate's):
    a row per rank and stream (the first `ranks` ranks), each slice coloured
    by what it is (compute, collective, transfer, waiting, host copies, a
    program run),
    from the first program run to the last.
    For a look without a browser; ui.perfetto.dev shows the same trace with
    every slice's details. Needs matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    events = trace["traceEvents"]
    pids = sorted({e["pid"] for e in events if e.get("ph") == "X"})[:ranks]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("name") == "thread_name"}
    rows = [(p, t) for p, t in sorted(names) if p in pids]
    y = {row: i for i, row in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(rows) + 1.2))
    # One collection per row and category: an artist per slice took a
    # minute for a 12-step, 4-rank profile (20,000 slices).
    bars: dict = {}
    for e in events:
        row = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "X" and row in y:
            bars.setdefault((row, e.get("cat")), []).append(
                (e["ts"] / 1e3, max(e["dur"] / 1e3, 1e-4)))
    for (row, cat), spans in sorted(bars.items(), key=lambda kv: kv[0][1] != "run"):
        # runs first: drawn under their parts
        ax.broken_barh(spans, (y[row] - 0.4, 0.8), facecolors=_COLOURS.get(cat, "#8172b3"),
                       edgecolor="none")
    # Zoom on the program runs: a whole-process profile is mostly imports
    # and compiling before the first run.
    runs = [(e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("ph") == "X" and e.get("cat") == "run" and e.get("pid") in pids]
    if runs:
        lo, hi = min(a for a, _ in runs) / 1e3, max(b for _, b in runs) / 1e3
        pad = 0.02 * max(hi - lo, 1e-3)
        ax.set_xlim(lo - pad, hi + pad)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {p} {names[p, t]}" for p, t in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    producer = trace.get("otherData", {}).get("producer", "")
    ax.set_title(f"{producer}: {len(pids)} rank(s)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in _COLOURS.items()],
              loc="upper right", fontsize=7, ncol=len(_COLOURS))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


_from_env_checked = False


def profile_from_env() -> None:
    """With TESSERA_PROFILE=DIR, profile the rest of the process from its
    first compiled call on (`CompiledFunction.__call__` asks, once; importing
    tessera starts nothing): DIR/trace.json and DIR/summary.txt at exit, and
    DIR/timeline.png where matplotlib is installed."""
    global _from_env_checked
    if _from_env_checked:
        return
    _from_env_checked = True
    folder = env.get("TESSERA_PROFILE")
    if not folder:
        return
    prof = profile(Path(folder) / "trace.json").start()

    def finish():               # (registered after start(): runs before its own stop at exit)
        prof.stop()
        if prof.rank == 0:
            (Path(folder) / "summary.txt").write_text(prof.table + "\n")
            try:
                timeline_png(json.loads((Path(folder) / "trace.json").read_text()),
                             Path(folder) / "timeline.png")
            except ImportError:
                pass                        # matplotlib is optional
    atexit.register(finish)
