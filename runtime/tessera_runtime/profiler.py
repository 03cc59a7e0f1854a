"""What one rank did, as timestamped slices (read by `dist.profile` and the benchmarks).

While a `Recorder` is active (`start()` .. `stop()`), the executor adds a
slice for every kernel launch and library call (category `compute`), every
collective from its start to its completion (`comm`) and every point-to-point
transfer (`p2p`), each on the program stream it ran on, plus every blocking
wait (`wait`, on the stream that waited) and every program run (`run`, on the
`host` thread, from copying its inputs to the device to copying its outputs
back; the two copies are `copy` slices there). Slices hold seconds on this process' `time.perf_counter`
clock: host engines stamp them directly, the CUDA engine its launches and
collective starts with CUDA events resolved once the run has synchronized
(`Engine.timestamp`); a collective ends when its wait returns on the host.

Off, which is the default, the executor checks `active()` once per run and
runs the same loop as without profiling.
"""

from __future__ import annotations

import time


class Recorder:
    """The slices of one process between `start()` and `stop()`. Recorders
    nest (a `dist.profile()` block inside `tessera launch --profile`): a
    slice added to the innermost one is added to those around it too."""

    def __init__(self, outer: "Recorder | None" = None):
        self.t_start = time.perf_counter()
        self.t_stop: float | None = None
        self._outer = outer
        #: (stream, name, category, t0, t1, args)
        self.slices: list[tuple] = []

    def add(self, stream: str, name: str, category: str, t0: float, t1: float,
            args: dict) -> None:
        self.slices.append((stream, name, category, t0, t1, args))
        if self._outer is not None:
            self._outer.add(stream, name, category, t0, t1, args)

    def totals(self) -> dict:
        """{key: [seconds, calls]}: per kernel (its name), library routine
        (`library:<routine>`), and the host time spent starting and waiting
        for collectives (`collective:start`, `collective:wait`)."""
        out: dict = {}
        for _, _, cat, t0, t1, args in self.slices:
            if cat == "compute":
                key, seconds = args["key"], t1 - t0
            elif cat == "wait":
                key, seconds = "collective:wait", t1 - t0
            elif cat in ("comm", "p2p"):
                key, seconds = "collective:start", args["start_seconds"]
            else:
                continue
            entry = out.setdefault(key, [0.0, 0])
            entry[0] += seconds
            entry[1] += 1
        return out


_stack: list[Recorder] = []


def active() -> Recorder | None:
    """The innermost recording, if any."""
    return _stack[-1] if _stack else None


def start() -> Recorder:
    """Start recording this process' slices (inside any recording already
    active, which keeps receiving them)."""
    rec = Recorder(active())
    _stack.append(rec)
    return rec


def stop(rec: Recorder | None = None) -> Recorder | None:
    """Stop recording `rec` (default: the innermost); returns it."""
    if rec is None:
        rec = _stack[-1] if _stack else None
    if rec is None or rec not in _stack:
        return None
    _stack.remove(rec)
    for inner in _stack:            # a recording started inside it now feeds its outer one
        if inner._outer is rec:
            inner._outer = rec._outer
    rec.t_stop = time.perf_counter()
    return rec
