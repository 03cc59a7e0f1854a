"""MPI over raw bytes for the frontend's own agreements between ranks
(compile errors, program fingerprints, shapes): mpi4py's buffer calls only,
never its pickling lower-case ones, so nothing a rank receives is executed.
Every exchange a rank may wait in runs under TESSERA_COLLECTIVE_TIMEOUT
(`exchange`)."""

from __future__ import annotations

import time

import numpy as np
from tessera_runtime import flight

from .errors import CollectiveMismatch, CollectiveTimeout


def world_comm():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def barrier(comm) -> None:
    """Every rank of `comm` here, for waits of seconds (rank 0 compiling):
    a waiting rank tests and sleeps (0.1 ms doubling to 10 ms). MPICH's
    blocking wait spins and yields in its progress loop, so with 4 ranks on
    2 cores the 3 waiting ranks took most of the CPU from rank 0's compile:
    the remat test's worker ran 120 s (127 s user, 110 s system) spinning,
    58 s sleeping. (Collectives of a running program keep MPI's own wait:
    sleeping there doubled the dp x tp step's time.)"""
    request, delay = comm.Ibarrier(), 1e-4
    while not request.Test():
        time.sleep(delay)
        delay = min(2 * delay, 1e-2)


def bcast_text(comm, text: str, root: int = 0, *, what: str, axis: str = "world") -> str:
    """`root`'s `text` on every rank (the others pass anything), under
    TESSERA_COLLECTIVE_TIMEOUT: `what` names the exchange in its errors (see
    `exchange` for `axis`)."""
    mine = text.encode() if comm.Get_rank() == root else b""
    return exchange(comm, mine, what, what, axis=axis)[root].decode()


def allgather_text(comm, text: str, *, what: str, axis: str = "world") -> list[str]:
    """Every rank's `text`, in rank order. The sizes travel first, under
    TESSERA_COLLECTIVE_TIMEOUT (`what` names the exchange in its errors);
    then, every rank being there, the texts in one Allgatherv."""
    from mpi4py import MPI
    data = np.frombuffer(text.encode(), np.uint8)
    sizes = np.array([int.from_bytes(b, "little") for b in exchange(
        comm, data.size.to_bytes(8, "little"), what, what, axis=axis)], np.int64)
    out = np.empty(int(sizes.sum()), np.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    comm.Allgatherv(data, [out, sizes.tolist(), offsets.tolist(), MPI.BYTE])
    return [out[o:o + s].tobytes().decode() for o, s in zip(offsets, sizes)]


def raw_view(array: np.ndarray) -> np.ndarray:
    """`array` as MPI can move it: dtypes MPI does not know (ml_dtypes'
    bfloat16) as unsigned integers of the same width."""
    return array.view(np.dtype(f"u{array.dtype.itemsize}")) if array.dtype.kind == "V" else array


# -- exchanges under TESSERA_COLLECTIVE_TIMEOUT ------------------------------------
#
# The frontend's agreements between ranks (the traced program, the replicated
# arguments, an eager collective's shape, a checkpoint's commit) are where a
# rank that never comes (stuck loading data, or on another line of the
# script) would leave the others blocked forever in an MPI call no thread can
# interrupt. So they are a gather at rank 0 and its answer to every rank,
# over point-to-point messages that the waiting ranks poll until
# TESSERA_COLLECTIVE_TIMEOUT: then rank 0 knows which ranks never sent, says so
# to those that did, and every waiting rank raises the same CollectiveTimeout.
# Each message also carries what its rank is doing (`key`), so two ranks at
# different exchanges (an all_reduce of 8 floats against one of 1) are an
# error naming both, never a pairing of unrelated data.

#: point-to-point tags of the exchanges (beside dist's failure report, 0x7E55-6)
_ARRIVE_TAG, _ANSWER_TAG = 0x7E60, 0x7E61
_OK, _LATE, _DIFFERENT = 0, 1, 2
#: how much longer a rank waits for rank 0's answer than rank 0 waits for the
#: others, so that rank 0's "rank 3 never came" reaches it before its own timeout
_ANSWER_GRACE_S = 5.0
_exchanges: dict = {}


def _pack(*parts: bytes) -> bytes:
    return b"".join(len(p).to_bytes(8, "little") + p for p in parts)


def _unpack(data: bytes) -> list[bytes]:
    parts, at = [], 0
    while at < len(data):
        n = int.from_bytes(data[at:at + 8], "little")
        parts.append(data[at + 8:at + 8 + n])
        at += 8 + n
    return parts


def _poll(ready, deadline: float) -> bool:
    """Calls `ready()` until it is true (True) or the deadline passes (False):
    a few quick polls, then sleeps doubling to 5 ms, so a waiting rank leaves
    the cores to the ranks still computing."""
    delay = 0.0
    while not ready():
        now = time.monotonic()
        if now >= deadline:
            return False
        if delay:
            time.sleep(min(delay, deadline - now))
        delay = min(max(2 * delay, 5e-5), 5e-3)
    return True


def _receive(comm, source: int, tag: int) -> bytes:
    from mpi4py import MPI
    status = MPI.Status()
    comm.Probe(source=source, tag=tag, status=status)
    buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
    comm.Recv(buf, source=source, tag=tag)
    return buf.tobytes()


def exchange(comm, data: bytes, key: str, what: str, ranks=None, axis: str = "world",
             source: str | None = None) -> list[bytes]:
    """Every rank of `comm`'s `data`, in rank order, or an error on every
    rank that reached it: CollectiveTimeout naming the ranks that did not
    come within TESSERA_COLLECTIVE_TIMEOUT, or CollectiveMismatch when the
    ranks' `key`s differ (they are at different exchanges). `what` is this
    rank's description of the exchange for those errors (a call and its
    line; it may differ between ranks where `key` does not); `ranks` the
    world rank of each rank of `comm` (default: `comm` is the world);
    `axis` what the flight recorder files it under (its exchanges are
    numbered per axis, alike on every rank)."""
    me, size = comm.Get_rank(), comm.Get_size()
    ranks = list(ranks) if ranks is not None else list(range(size))
    seconds = flight.timeout_seconds()
    seq = _exchanges[axis] = _exchanges.get(axis, 0) + 1
    if axis not in flight.RECORDER.groups:
        flight.RECORDER.join(axis, ranks[me], ranks)
    entry = flight.RECORDER.record(seq, key.split("(")[0], axis, len(data), source)
    mine = _pack(key.encode(), what.encode(), data)
    deadline = time.monotonic() + seconds
    if me != 0:
        # Not waited for until rank 0 answers: a message past MPI's eager
        # limit would block its sender until rank 0 receives it.
        sent = np.frombuffer(mine, np.uint8)
        sending = comm.Isend(sent, dest=0, tag=_ARRIVE_TAG)
        answered = _poll(lambda: comm.Iprobe(source=0, tag=_ANSWER_TAG),
                         deadline + _ANSWER_GRACE_S)
        if not answered:
            flight.timed_out(entry, seconds)
            raise CollectiveTimeout(
                f"rank {ranks[me]}: {what}: rank {ranks[0]}, which gathers it, did not answer "
                f"within {seconds:g} s (TESSERA_COLLECTIVE_TIMEOUT); it never reached it or "
                "is stuck before it")
        answer = _unpack(_receive(comm, 0, _ANSWER_TAG))
        sending.Wait()                  # (rank 0 answers once it has every message)
    else:
        arrived = {0: mine}
        pending = set(range(1, size))

        def gather() -> bool:
            for r in sorted(pending):
                if comm.Iprobe(source=r, tag=_ARRIVE_TAG):
                    arrived[r] = _receive(comm, r, _ARRIVE_TAG)
                    pending.discard(r)
            return not pending
        if _poll(gather, deadline):
            parts = [_unpack(arrived[r]) for r in range(size)]
            if all(p[0] == parts[0][0] for p in parts):
                answer = [bytes([_OK])] + [p[2] for p in parts]
            else:
                answer = [bytes([_DIFFERENT])] + [_pack(p[0], p[1]) for p in parts]
        else:
            answer = [bytes([_LATE])] + [str(ranks[r]).encode() for r in sorted(pending)]
        reply = np.frombuffer(_pack(*answer), np.uint8)
        requests = [comm.Isend(reply, dest=r, tag=_ANSWER_TAG) for r in arrived if r]
        from mpi4py import MPI
        MPI.Request.Waitall(requests)
    kind = answer[0][0]
    if kind == _OK:
        entry.state, entry.t_end = "completed", time.time()
        return answer[1:]
    if kind == _LATE:
        late = [int(r) for r in answer[1:]]
        came = [r for r in ranks if r not in late]
        flight.timed_out(entry, seconds)
        raise CollectiveTimeout(
            f"{what}: {listed(late)} never arrived within {seconds:g} s "
            f"(TESSERA_COLLECTIVE_TIMEOUT); {listed(came)} waited there. Every rank must "
            "reach it: a rank stuck before it (loading data, an exception caught and "
            "ignored, another branch of the script) leaves the others waiting")
    entry.state = "completed"
    calls = [_unpack(p) for p in answer[1:]]
    groups: dict = {}
    for r, (k, text) in enumerate(calls):
        groups.setdefault(k, []).append((ranks[r], text.decode()))
    lines = ["the ranks are at different collectives, so their data would be paired wrongly; "
             "nothing moved:"]
    for members in groups.values():
        who, text = [r for r, _ in members], members[0][1]
        lines.append(f"  {listed(who)}: {text}")
    lines.append("Every rank of the group must make the same collective calls, in the same "
                 "order, with the same shapes and dtypes.")
    raise CollectiveMismatch("\n".join(lines))


def listed(ranks) -> str:
    """`rank 3` or `ranks 0, 2`, for errors."""
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
