"""What this process is doing now, for the modules below the tracer and the
simulator to ask without importing them: the function this thread is
tracing (a `_trace.TraceState`, or None) and the simulation the process
runs under (`tessera simulate`: a `simulation.Simulation`, or None).

It holds the state only; `_trace` and `simulation` set it."""

from __future__ import annotations

import threading

_thread = threading.local()
_simulation = None


def trace_state():
    """The trace (a `_trace.TraceState`) this thread records ops into, or None."""
    return getattr(_thread, "trace", None)


def set_trace_state(state):
    """Makes `state` (or None) the current trace; returns the one it replaces."""
    previous, _thread.trace = trace_state(), state
    return previous


def simulation():
    """The simulation this process runs under (`tessera simulate`), or None."""
    return _simulation


def set_simulation(sim) -> None:
    global _simulation
    _simulation = sim
