"""The flight recorder: every rank's latest collectives and transfers, so that
a hang names the rank it waits for.

Each communicator numbers its collectives (`seq`, from 1, per mesh axis; the
ranks of an axis group issue them in the same order, so #17 on one rank is
#17 on the others) and records each one here: op, axis, bytes, the user's
Python line, and its state (`started`, `completed`, `timed out`). The ring keeps the last TESSERA_FLIGHT_RING.

A watchdog thread (started with the first communicator; the wait itself
stays the backend's blocking one, so recording costs nothing measurable)
looks at the waits in flight a few times a second. One blocked longer than
TESSERA_COLLECTIVE_TIMEOUT seconds dumps the ring, prints a
`CollectiveTimeout` error and ends the process with status 1 (a thread
cannot interrupt a blocked MPI or CUDA call; PyTorch's NCCL watchdog ends
the process too). Under `tessera launch` (TESSERA_FLIGHT_DIR set) the dump
is a file `rank-<r>.json` there; every rank's watchdog also dumps when the
launcher asks (a file `dump-requested` there) and every rank at exit, and the
launcher merges them with `diagnose`:

    [tessera] tp all_reduce #17 (train.py:42): ranks 0,1,3 waiting, rank 2 never
    started it; rank 2 last completed tp all_reduce #16 (train.py:42)

Recording costs one small object per collective; nothing is written unless
something goes wrong (or the job ends under the launcher).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path

from . import env
from .errors import TesseraError


#: the launcher creates it in TESSERA_FLIGHT_DIR to ask every rank for its ring
REQUEST_FILE = "dump-requested"


class CollectiveTimeout(TesseraError, RuntimeError):
    """A collective or transfer, or an exchange every rank must make (the
    program agreement, an eager collective, a checkpoint commit), did not
    complete within TESSERA_COLLECTIVE_TIMEOUT; the message names the ranks
    that never arrived. (`ts.CollectiveTimeout` is this class.)"""


class Entry:
    """One collective or transfer as the flight recorder keeps it."""

    __slots__ = ("seq", "op", "axis", "nbytes", "state", "source", "peer", "t_start", "t_end",
                 "waiting_since")
    _SAVED = __slots__[:-1]

    def __init__(self, seq, op, axis, nbytes, source, peer=None):
        self.seq, self.op, self.axis, self.nbytes = seq, op, axis, nbytes
        self.source, self.peer = source, peer
        self.state, self.t_start, self.t_end = "started", time.time(), None
        #: time.monotonic() when a wait for it began (the watchdog's clock)
        self.waiting_since: float | None = None

    def as_json(self) -> dict:
        return {k: getattr(self, k) for k in self._SAVED}


def timeout_seconds() -> float:
    return env.number("TESSERA_COLLECTIVE_TIMEOUT")


class FlightRecorder:
    """This process' ring (one per process: every communicator writes to it)."""

    def __init__(self):
        self.ring: deque = deque(maxlen=max(1, env.integer("TESSERA_FLIGHT_RING")))
        self.rank = 0
        #: axis -> the world ranks of this rank's group along it, in axis order
        self.groups: dict[str, list[int]] = {}
        self.directory = Path(env.get("TESSERA_FLIGHT_DIR")) if env.get("TESSERA_FLIGHT_DIR") \
            else None
        self._hooked = False
        self._watchdog: threading.Thread | None = None

    def _watch(self) -> None:
        seconds = timeout_seconds()
        asked = False
        while True:
            time.sleep(min(0.5, seconds / 10))
            if self.directory is not None and not asked and \
                    (self.directory / REQUEST_FILE).exists():
                asked = True                     # another rank timed out
                self.dump("asked by the launcher")
            now = time.monotonic()
            for entry in list(self.ring):
                since = entry.waiting_since
                if since is not None and entry.state != "completed" and now - since > seconds:
                    error = timed_out(entry, seconds)
                    sys.stderr.write(f"tessera_runtime.flight.CollectiveTimeout: {error}\n")
                    sys.stderr.flush()
                    os._exit(1)

    def join(self, axis: str, rank: int, members: list[int]) -> None:
        """A communicator of `rank` over `members` (world ranks) along `axis`."""
        self.rank = rank
        self.groups[axis] = list(members)
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="tessera-flight-watchdog",
                                              daemon=True)
            self._watchdog.start()
        if self.directory is not None and not self._hooked:
            # Under the launcher: answer its dump request, and leave a record
            # at exit (a rank that finished early is often the one the others
            # wait for).
            self._hooked = True
            self.directory.mkdir(parents=True, exist_ok=True)
            atexit.register(self.dump, "exited")

    def record(self, seq, op, axis, nbytes, source, peer=None) -> Entry:
        entry = Entry(seq, op, axis, nbytes, source, peer)
        self.ring.append(entry)
        return entry

    def as_json(self, reason: str) -> dict:
        return {"rank": self.rank, "reason": reason, "groups": self.groups,
                "timeout": timeout_seconds(), "entries": [e.as_json() for e in self.ring]}

    def dump(self, reason: str) -> None:
        """Write the ring: to TESSERA_FLIGHT_DIR/rank-<r>.json, else to stderr.
        A timeout's dump is never overwritten by a later one."""
        record = self.as_json(reason)
        if self.directory is None:
            sys.stderr.write(f"[tessera] rank {self.rank} flight recorder ({reason}):\n")
            for e in record["entries"]:
                sys.stderr.write(f"  {describe(e)}: {e['state']}\n")
            sys.stderr.flush()
            return
        path = self.directory / f"rank-{self.rank}.json"
        try:
            if path.exists() and json.loads(path.read_text()).get("reason", "").startswith(
                    "timeout"):
                return
        except ValueError:
            pass
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)


RECORDER = FlightRecorder()


def describe(e: dict) -> str:
    """`tp all_reduce #17 (train.py:42)`."""
    where = f" ({Path(e['source']).name})" if e.get("source") else ""
    peer = f" rank {e['peer']}" if e.get("peer") is not None else ""
    return f"{e['axis']} {e['op']}{peer} #{e['seq']}{where}"


def timed_out(entry: Entry, seconds: float) -> CollectiveTimeout:
    """Marks `entry`, dumps the ring and returns the error to report."""
    entry.state = "timed out"
    what = describe(entry.as_json())
    RECORDER.dump(f"timeout: {what}")
    if RECORDER.directory is not None:
        # Give the launcher time to collect every rank's ring before this
        # rank's exit makes mpiexec stop the others.
        done = RECORDER.directory / "collected"
        deadline = time.monotonic() + 10.0
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return CollectiveTimeout(f"rank {RECORDER.rank}: {what} did not complete within "
                             f"{seconds:g} s (TESSERA_COLLECTIVE_TIMEOUT); the ranks of its "
                             f"group are not all in it")


# ---------------------------------------------------------------------------
# Merging every rank's ring (the launcher)
# ---------------------------------------------------------------------------

def read_dumps(directory: Path) -> dict[int, dict]:
    out = {}
    for path in sorted(Path(directory).glob("rank-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[int(record["rank"])] = record
    return out


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def diagnose(dumps: dict[int, dict], world: int) -> list[str]:
    """One line per stuck collective: who waits in it, who never started it
    (and what each of those last completed on that axis), who is in a
    different collective under the same number."""
    lines, seen = [], set()
    stuck = sorted(((e["axis"], e["seq"], r, e) for r, d in dumps.items()
                    for e in d["entries"] if e["state"] != "completed"),
                   key=lambda t: (t[1], t[0], t[2]))
    for axis, seq, rank, entry in stuck:
        if entry.get("peer") is not None:
            key = ("p2p", axis, rank)
            if key not in seen:
                seen.add(key)
                lines.append(f"{_ranks([rank])} waiting in {describe(entry)}")
            continue
        members = tuple(dumps[rank]["groups"].get(axis, [rank]))
        if (axis, members) in seen:
            continue
        seen.add((axis, members))
        waiting, other, never, silent = [], [], [], []
        for m in members:
            if m not in dumps:
                silent.append(m)
                continue
            mine = [e for e in dumps[m]["entries"] if e["axis"] == axis and e.get("peer") is None]
            same = [e for e in mine if e["seq"] == seq]
            if not same:
                never.append(m)
            elif (same[0]["op"], same[0]["nbytes"]) != (entry["op"], entry["nbytes"]):
                other.append((m, same[0]))
            elif same[0]["state"] != "completed":
                waiting.append(m)
        parts = [f"{_ranks(waiting)} waiting"] if waiting else []
        if never:
            parts.append(f"{_ranks(never)} never started it")
        text = f"{describe(entry)}: " + ", ".join(parts)
        for m, e in other:
            text += f", rank {m} is in {e['op']} of {e['nbytes']} B under that number instead"
        if silent:
            text += f", {_ranks(silent)} left no flight record"
        for m in never:
            done = [e for e in dumps[m]["entries"] if e["axis"] == axis
                    and e.get("peer") is None and e["state"] == "completed"]
            text += (f"; rank {m} last completed {describe(done[-1])}" if done
                     else f"; rank {m} completed no {axis} collective")
            if dumps[m]["reason"] == "exited":
                text += " and exited"
        lines.append(text)
    missing = sorted(set(range(world)) - set(dumps))
    if missing and not lines:
        lines.append(f"{_ranks(missing)} left no flight record")
    return lines
