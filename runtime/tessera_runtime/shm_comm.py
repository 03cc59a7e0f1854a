"""Collectives through shared memory, for the ranks of a group on one machine.

Why: MPI's shared-memory transport waits by spinning. When a machine runs
more ranks than it has cores (4 CPU ranks on 2 cores), a rank waiting for a
collective spins on a core another rank needs for its compute, and the peer
it waits for runs only at its next time slice. Here a waiting rank sleeps in
the kernel (futex_waitv on its peers' counters) and is woken the moment a
peer posts, so the cores go to the ranks that have work. And a collective here
really runs between its start and its wait: the start copies this rank's
contribution in and posts it, the wait reads the peers' and combines them
(MPI's nonblocking collectives progress only inside MPI calls).

Layout of a group's mapping (one file in /dev/shm, unlinked once every rank
has mapped it): counters, a cache line each, then PHASES x size collective
slots and CHANNEL_SLOTS slots per channel, of `slot_bytes` bytes each.
Collective number s uses slot set s % PHASES: rank r copies its
contribution to slot r, then sets its `posted` counter to s; it reads the
peers' slots once their `posted` >= s, then sets its `read` counter to s.
Slot set s % PHASES is written again by collective s + PHASES only after
every rank has read s. Transfers go the same way over a channel from a rank
to each neighbour (r + 1, r - 1: a pipeline's), `sent` and `received`
counters, CHANNEL_SLOTS in flight. Reads complete in order, so a counter
says every earlier one was read too. Each counter has one writer; x86-64
keeps stores (and loads) in program order, which is what the protocol
relies on (other machines use MPI).

Like MPI's progress engine, every call and every wait moves every pending
operation of the process on: posts waiting for a free slot are published
and data that has arrived for a started collective or receive is read, so
a sender is never held up by a receiver busy waiting for something else. A
wait sleeps on all the counters the process's groups share at once
(futex_waitv), woken by whichever peer writes one.

Every rank combines the slots itself, in the fixed tree of `tree_reduce`
over rank order, so all ranks get the same bits, equal to the MPI
communicator's deterministic all_reduce, and deterministic mode costs
nothing extra. A ragged all_to_all moves only its counted rows. Broadcasts
and transfers over `slot_bytes` (TESSERA_SHM_MESSAGE_BYTES) go in pieces of
that size, one operation each; other collectives over it and transfers
between ranks that are not neighbours go through MPI (`MPICommunicator`):
every rank makes the same choice from the same shapes.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import time
from collections import defaultdict, deque

import numpy as np

from . import env
from .shared_memory import shared_mapping
from .bf16 import is_bf16
from .comm import REDUCE_UFUNCS, Work, tree_reduce
from . import mpi_comm
from .mpi_comm import MPICommunicator, check_host

PHASES = 8                    # collectives that may be in flight on one group
CHANNEL_SLOTS = 4             # transfers to one neighbour that may be unread
_LINE = 64                    # one counter per cache line
_SYS_FUTEX, _SYS_FUTEX_WAITV = 202, 449           # x86-64
_FUTEX_WAKE, _FUTEX_32, _CLOCK_MONOTONIC = 1, 2, 1
_NAP_S = 0.2                  # a sleeping wait looks again at least this often
_POKE_S = 50e-6               # ... and this often while MPI work is in flight

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Waiter(ctypes.Structure):             # struct futex_waitv
    _fields_ = [("val", ctypes.c_uint64), ("uaddr", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


# The constant arguments of a wake, made once (a collective wakes twice).
_WAKE_ARGS = (ctypes.c_long(_SYS_FUTEX), ctypes.c_int(_FUTEX_WAKE), ctypes.c_int(0x7FFFFFFF))


def _wake(address: ctypes.c_void_p) -> None:
    call, wake, everyone = _WAKE_ARGS
    _libc.syscall(call, address, wake, everyone, None, None, None)


class _Process:
    """The process's shared-memory groups, progressed and waited on together."""

    def __init__(self):
        self.groups: list = []
        self.watch: list = []          # (words, index) of every counter peers write
        self.waiters = None
        self.waitv = True              # futex_waitv exists (Linux >= 5.16)

    def add(self, comm) -> None:
        self.groups.append(comm)
        self.watch += [(comm._words, i) for i in comm._foreign_counters()]
        if len(self.watch) > 128:      # futex_waitv's limit: poll instead
            self.waitv = False
        self.waiters = (_Waiter * len(self.watch))()
        for w, (words, i) in zip(self.waiters, self.watch):
            w.uaddr, w.flags = words.ctypes.data + 4 * i, _FUTEX_32

    def progress(self) -> None:
        for comm in self.groups:
            comm._progress()
        if mpi_comm.IN_FLIGHT:         # MPI work started here moves only in MPI calls
            mpi_comm.poke()

    def busy(self) -> bool:
        """Whether a peer may be waiting for this process to move something:
        a post waiting for room, or a started read (its sender's slot)."""
        return any(any(g._queues.values()) or any(g._reads.values()) for g in self.groups)

    def wait_until(self, done, spin_s: float) -> None:
        """Progress everything until done() holds; between looks, sleep
        until a peer writes any counter (or _NAP_S passes)."""
        self.progress()
        if done():
            return
        if spin_s:
            until = time.perf_counter() + spin_s
            while time.perf_counter() < until:
                self.progress()
                if done():
                    return
        waiters, watch, deadline = self.waiters, self.watch, _Timespec()
        while True:
            for w, (words, i) in zip(waiters, watch):
                w.val = int(words[i])      # before looking: a later write wakes us
            self.progress()
            if done():
                return
            if not self.waitv:
                time.sleep(50e-6)
                continue
            t = time.monotonic() + (_POKE_S if mpi_comm.IN_FLIGHT else _NAP_S)
            deadline.tv_sec, deadline.tv_nsec = int(t), int((t % 1) * 1e9)
            # ctypes drops the GIL for the call: the flight recorder's watchdog runs.
            r = _libc.syscall(ctypes.c_long(_SYS_FUTEX_WAITV), waiters, ctypes.c_uint(len(watch)),
                              ctypes.c_uint(0), ctypes.byref(deadline),
                              ctypes.c_int(_CLOCK_MONOTONIC))
            if r < 0 and ctypes.get_errno() == errno.ENOSYS:
                self.waitv = False


_PROCESS = _Process()
mpi_comm.ELSEWHERE.append(_PROCESS)


class _Read:
    """A posted collective or a started receive, to be read in order."""

    __slots__ = ("seq", "finish")

    def __init__(self, seq, finish):
        self.seq, self.finish = seq, finish


class _Post:
    """Data to publish once its slot is free."""

    __slots__ = ("ready", "publish", "done")

    def __init__(self, ready, publish):
        self.ready, self.publish, self.done = ready, publish, False


class ShmWork(Work):
    """A started collective or transfer: its post is out (a send's slot may
    still be taken) and, for a read, the data is in `dst`."""

    def __init__(self, comm, post: _Post | None, key=None, seq: int = 0):
        self._comm, self._post, self._key, self._seq = comm, post, key, seq

    def wait(self) -> None:
        post, key, seq, comm = self._post, self._key, self._seq, self._comm
        _PROCESS.wait_until(lambda: (post is None or post.done)
                            and (key is None or comm._read[key] >= seq), comm._spin_s)


#: the groups this process has made, by their members' world ranks: each
#: program loaded (one per compiled function and signature) splits its own
#: MPI communicators, but maps a group's memory only once
_BY_MEMBERS: dict = {}


class SharedMemoryCommunicator(MPICommunicator):
    """MPICommunicator whose collectives and transfers to neighbours (rank
    r +- 1, a pipeline's) up to `slot_bytes` run through a mapping shared by
    the group's ranks (see the module docstring)."""

    def __init__(self, comm, mapping: mmap.mmap, slot_bytes: int, spin_s: float):
        super().__init__(comm)
        n = self._n = comm.Get_size()
        self._me = comm.Get_rank()
        self.slot_bytes, self._spin_s = slot_bytes, spin_s
        self._map = mapping
        self._bytes = np.frombuffer(mapping, np.uint8)
        self._words = self._bytes[: _counter_lines(n) * _LINE].view(np.uint32)
        self._base = self._bytes.ctypes.data
        self._addresses = [ctypes.c_void_p(self._base + 4 * i) for i in range(len(self._words))]
        self._collective_data = _data_offset(n)
        self._channel_data = self._collective_data + PHASES * n * slot_bytes
        self._issued: dict = {}                        # key -> operations started
        self._queues: dict = {}                        # key -> deque of _Post
        self._reads: dict = defaultdict(deque)         # key -> deque of _Read
        self._read: dict = defaultdict(int)            # key -> last seq read
        self._slots: dict = {}                         # (phase, rank, shape, dtype) -> view
        self._posted_lines = [self._line("group", 0, p) for p in range(n)]
        self._read_lines = [self._line("group", 1, p) for p in range(n)]
        _PROCESS.add(self)

    @classmethod
    def for_group(cls, comm, members, node_ranks: int) -> "SharedMemoryCommunicator | None":
        """`create(comm, node_ranks)` the first time this process makes a
        group of the world ranks `members`, after that the same one again
        (every member decides alike: they load the same programs)."""
        key = tuple(members)
        if key not in _BY_MEMBERS:
            _BY_MEMBERS[key] = cls.create(comm, node_ranks)
        elif _BY_MEMBERS[key] is not None:
            comm.Free()                # the group keeps its first communicator
        return _BY_MEMBERS[key]

    @classmethod
    def create(cls, comm, node_ranks: int) -> "SharedMemoryCommunicator | None":
        """The group's shared-memory communicator (collective over `comm`),
        or None where it cannot be used: not x86-64 Linux, ranks on several
        machines, TESSERA_SHM_COLLECTIVES=0, or no room in /dev/shm.
        `node_ranks`: how many ranks of the job run on this machine."""
        if env.value("TESSERA_SHM_COLLECTIVES") == "0":
            return None
        if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
            return None
        MPI = mpi_comm.MPI
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        one_machine = comm.allreduce(int(local.Get_size() == comm.Get_size()), MPI.MIN)
        local.Free()
        if not one_machine:
            return None
        slot = -(-env.integer("TESSERA_SHM_MESSAGE_BYTES") // _LINE) * _LINE
        n = comm.Get_size()
        size = _data_offset(n) + (PHASES * n + 2 * n * CHANNEL_SLOTS) * slot
        try:
            mapping = shared_mapping(comm, size, "tessera-collectives-", reserve=True)
        except OSError:
            return None
        # Spinning a moment before sleeping saves a wake-up when the peer has
        # a core of its own; with more ranks than cores it only steals one.
        spin_s = 20e-6 if (os.cpu_count() or 1) >= node_ranks else 0.0
        return cls(comm, mapping, slot, spin_s)

    # -- counters ----------------------------------------------------------------
    # Line 2r: rank r's posted collectives, 2r + 1: its collectives read.
    # Line 2n + 2c: transfers sent on channel c, 2n + 2c + 1: received.
    def _channel(self, source: int, dest: int) -> int | None:
        """The channel from `source` to `dest`, None unless they are
        neighbours (each rank has one to r + 1 and one to r - 1)."""
        n = self._n
        if dest == (source + 1) % n:
            return 2 * source
        if dest == (source - 1) % n:
            return 2 * source + 1
        return None

    def _line(self, key, role: int, rank: int | None = None) -> int:
        """Counter index: role 0 = posted / sent, 1 = read / received; key
        "group" (of `rank`) or ("to" | "from", peer) (a channel)."""
        if key == "group":
            line = 2 * rank + role
        else:
            way, peer = key
            c = self._channel(self._me, peer) if way == "to" else self._channel(peer, self._me)
            line = 2 * self._n + 2 * c + role
        return line * (_LINE // 4)

    def _foreign_counters(self) -> list[int]:
        """The counters this rank waits on: the peers' collective ones, the
        sends to it and the receipts of its sends."""
        out = [self._line("group", role, p) for p in range(self._n) if p != self._me
               for role in (0, 1)]
        for peer in {(self._me + 1) % self._n, (self._me - 1) % self._n} - {self._me}:
            out += [self._line(("from", peer), 0), self._line(("to", peer), 1)]
        return out

    def _set(self, index: int, value: int) -> None:
        self._words[index] = value
        _wake(self._addresses[index])

    def _arrived(self, key, seq: int) -> bool:
        """Whether every rank (this one too) has posted `seq` of `key`."""
        words = self._words
        if key == "group":
            return all(words[i] >= seq for i in self._posted_lines)
        return words[self._line(key, 0)] >= seq

    # -- posting and reading -------------------------------------------------------
    def _progress(self) -> None:
        """Read what has arrived (which may free slots), publish the posts
        whose slots are free."""
        for key, reads in self._reads.items():
            while reads and self._arrived(key, reads[0].seq):
                read = reads.popleft()
                read.finish()
                self._read[key] = read.seq
                self._set(self._line(key, 1, self._me), read.seq)
        for queue in self._queues.values():
            while queue and queue[0].ready():
                post = queue.popleft()
                post.publish()
                post.done = True

    def _enqueue(self, key, ready, publish) -> _Post:
        """Publish when the slot is free and every earlier post of `key` is
        out; a start never blocks."""
        post = _Post(ready, publish)
        self._queues.setdefault(key, deque()).append(post)
        self._progress()
        return post

    def _view(self, start: int, shape, dtype) -> np.ndarray:
        return np.ndarray(shape, dtype, buffer=self._map, offset=start)

    def _collective_slot(self, phase: int, rank: int, shape, dtype) -> np.ndarray:
        # Made once per shape (a collective takes n + 1 views, each a Python call).
        key = (phase, rank, shape, dtype)
        view = self._slots.get(key)
        if view is None:
            view = self._slots[key] = self._view(
                self._collective_data + (phase * self._n + rank) * self.slot_bytes, shape, dtype)
        return view

    def _channel_slot(self, source: int, dest: int, seq: int, shape, dtype) -> np.ndarray:
        c = self._channel(source, dest)
        start = self._channel_data + (c * CHANNEL_SLOTS + seq % CHANNEL_SLOTS) * self.slot_bytes
        return self._view(start, shape, dtype)

    def _post(self, src, finish, give=True) -> Work:
        """Start a collective: copy `src` into this rank's slot (`give`
        False: nothing, a broadcast's receivers; a function: give(slot)
        fills it) and post it. `finish(slots)` runs at completion with every
        rank's slot, shaped and typed like `src`."""
        seq = self._issued["group"] = self._issued.get("group", 0) + 1
        phase = seq % PHASES
        shape, dtype = src.shape, src.dtype
        reused = seq - PHASES          # the collective that used this slot set last
        words, read_lines = self._words, self._read_lines

        def publish():
            if callable(give):
                give(self._collective_slot(phase, self._me, shape, dtype))
            elif give:
                np.copyto(self._collective_slot(phase, self._me, shape, dtype), src)
            self._set(self._line("group", 0, self._me), seq)

        def run():
            finish([self._collective_slot(phase, p, shape, dtype) for p in range(self._n)])
        self._reads["group"].append(_Read(seq, run))
        post = self._enqueue("group", lambda: all(words[i] >= reused for i in read_lines),
                             publish)
        return ShmWork(self, post, "group", seq)

    def _fits(self, buf) -> bool:
        return buf.nbytes <= self.slot_bytes

    def _pieces(self, *bufs) -> list | None:
        """[(piece of each of `bufs`), ...]: the buffers themselves when they
        fit a slot, else flat views of at most `slot_bytes` each, at the same
        offsets (None unless every buffer is C-contiguous), so that a
        broadcast or transfer of any size goes through the slots piece after
        piece instead of through MPI (whose waits spin on a core the
        computing ranks need). Pieces of one message are consecutive
        operations of its key: its last piece's work completes after every
        earlier one."""
        if self._fits(bufs[0]):
            return [bufs]
        if not all(b.flags.c_contiguous for b in bufs):
            return None
        flat = [b.reshape(-1) for b in bufs]
        per = max(1, self.slot_bytes // bufs[0].itemsize)
        return [tuple(f[i:i + per] for f in flat) for i in range(0, max(flat[0].size, 1), per)]

    # -- collectives -------------------------------------------------------------
    def _all_reduce(self, src, dst, reduction, deterministic, stream) -> Work:
        if not self._fits(src):
            return super()._all_reduce(src, dst, reduction, deterministic, stream)
        check_host(src, dst)
        ufunc = REDUCE_UFUNCS[reduction]
        widen = is_bf16(src.dtype) and not deterministic   # as MPI: one rounding at the end

        return self._post(src, lambda slots: _combine(slots, ufunc, dst, widen))

    def _all_gather(self, src, dst, dim, stream) -> Work:
        if not self._fits(src):
            return super()._all_gather(src, dst, dim, stream)
        check_host(src, dst)
        return self._post(src, lambda slots: np.concatenate(slots, axis=dim, out=dst))

    def _reduce_scatter(self, src, dst, dim, reduction, deterministic, stream) -> Work:
        if not self._fits(src):
            return super()._reduce_scatter(src, dst, dim, reduction, deterministic, stream)
        check_host(src, dst)
        ufunc, me, n = REDUCE_UFUNCS[reduction], self._me, self._n
        widen = is_bf16(src.dtype) and not deterministic

        return self._post(src, lambda slots: _combine(
            [np.split(s, n, axis=dim)[me] for s in slots], ufunc, dst, widen))

    def _all_to_all(self, src, dst, split_dim, concat_dim, stream, counts) -> Work:
        if not self._fits(src):
            return super()._all_to_all(src, dst, split_dim, concat_dim, stream, counts)
        check_host(src, dst)
        me, n = self._me, self._n
        if counts is None:
            return self._post(src, lambda slots: np.concatenate(
                [np.split(s, n, axis=split_dim)[me] for s in slots], axis=concat_dim, out=dst))
        # Ragged: blocks are contiguous runs of rows; only the counted rows move.
        row = src.shape[-1]
        sent, received = (np.asarray(c, np.int64) * row for c in counts)
        blocks, out = src.reshape(n, -1), dst.reshape(n, -1)

        def give(slot):
            mine = slot.reshape(n, -1)
            for j in range(n):
                mine[j, :sent[j]] = blocks[j, :sent[j]]

        def finish(slots):
            for p, s in enumerate(slots):
                out[p, :received[p]] = s.reshape(n, -1)[me, :received[p]]
        return self._post(src, finish, give)

    def _broadcast(self, src, dst, root, stream) -> Work:
        pieces = self._pieces(src, dst)
        if pieces is None:
            return super()._broadcast(src, dst, root, stream)
        check_host(src, dst)
        if self._me == root:
            if src is not dst:
                dst[...] = src
            for s, _ in pieces:
                work = self._post(s, lambda slots: None)
            return work
        for s, d in pieces:
            work = self._post(s, lambda slots, d=d: d.__setitem__(..., slots[root]), give=False)
        return work

    def _shift(self, src, dst, offset, stream) -> Work:
        if not self._fits(src) or offset == 0:
            return super()._shift(src, dst, offset, stream)
        check_host(src, dst)
        peer = (self._me - offset) % self._n
        return self._post(src, lambda slots: dst.__setitem__(..., slots[peer]))

    # -- transfers ---------------------------------------------------------------
    def _send(self, buf, peer, stream) -> Work:
        pieces = self._pieces(buf)
        if pieces is None or self._channel(self._me, peer) is None:
            return super()._send(buf, peer, stream)
        check_host(buf)
        key = ("to", peer)
        received = self._line(key, 1)
        for (piece,) in pieces:
            seq = self._issued[key] = self._issued.get(key, 0) + 1

            def publish(piece=piece, seq=seq):
                np.copyto(self._channel_slot(self._me, peer, seq, piece.shape, piece.dtype), piece)
                self._set(self._line(key, 0), seq)
            post = self._enqueue(key, lambda seq=seq: self._words[received] >= seq - CHANNEL_SLOTS,
                                 publish)
        return ShmWork(self, post)

    def _recv(self, buf, peer, stream) -> Work:
        pieces = self._pieces(buf)
        if pieces is None or self._channel(peer, self._me) is None:
            return super()._recv(buf, peer, stream)
        check_host(buf)
        key = ("from", peer)
        for (piece,) in pieces:
            seq = self._issued[key] = self._issued.get(key, 0) + 1
            self._reads[key].append(_Read(seq, lambda piece=piece, seq=seq: np.copyto(
                piece, self._channel_slot(peer, self._me, seq, piece.shape, piece.dtype))))
        self._progress()
        return ShmWork(self, None, key, seq)


def _combine(parts, ufunc, dst, widen: bool) -> None:
    """dst = the parts reduced in tree_reduce's fixed tree; `widen` (bf16
    outside deterministic mode, as MPI does it): in float32, rounded once."""
    if not widen:
        tree_reduce(parts, ufunc, dst)
        return
    total = np.empty(dst.shape, np.float32)
    tree_reduce([p.astype(np.float32) for p in parts], ufunc, total)
    dst[...] = total.astype(dst.dtype)


def _counter_lines(n: int) -> int:
    return 2 * n + 4 * n          # the group's two per rank, two per channel


def _data_offset(n: int) -> int:
    return -(-_counter_lines(n) * _LINE // 4096) * 4096
