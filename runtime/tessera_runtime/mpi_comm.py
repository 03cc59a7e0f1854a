"""MPI communicator over mpi4py (host buffers: numpy arrays).

Imported lazily by the runtime, only when a mesh has more than one rank or
MPI is requested, because importing mpi4py initializes MPI.

All collectives use the nonblocking MPI calls so that a collective started
on the comm stream progresses while compute launches run; completion (and
any unpacking into a non-contiguous block layout) happens in `Work.wait()`.

Deterministic reductions: MPI gives no guarantee on the order in which it
combines contributions, so floating-point results may differ between ranks
or runs. With `deterministic=True` an all_reduce is built on point-to-point
transfers in a fixed binary tree over rank order: at level k rank r (a
multiple of 2k) receives rank r+k's partial sum and adds it on the right, so
rank 0 ends with ((r0+r1)+(r2+r3)), which it broadcasts. A deterministic
reduce_scatter receives every rank's contribution to its own block and sums
them in the same tree. Either way the bits do not depend on the MPI library,
the run, or (for sums over microbatches laid out in rank order) the number
of ranks.

bf16 buffers (ml_dtypes.bfloat16): MPI has no such type, so they travel as
their bits (uint16 views). Reductions: the deterministic tree adds bf16
arrays (float32 arithmetic rounded to bf16 per step, like NCCL's tree over
bits); the others reduce float32 copies and round once at the end.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .bf16 import bits_dtype, is_bf16
from .comm import (REDUCE_UFUNCS, Communicator, CommError, Work, leading_is_trivial,
                   rank_blocks, tree_reduce)

_MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}


def _wire(a):
    """`a` as MPI moves it: bf16 and FP8 as their bits (MPI has neither type)."""
    return a.view(bits_dtype(a.dtype))


#: MPIWork started and not yet waited for: a wait in another transport
#: (shm_comm) pokes it, since MPI moves a request only inside MPI calls
IN_FLIGHT: set = set()
#: other transports of this process (shm_comm's), with .busy() and
#: .progress(): an MPI wait keeps them moving while a peer may need that
ELSEWHERE: list = []


def poke() -> None:
    """Let MPI move the requests in flight; forget the works that completed
    (their wait then only finishes them)."""
    for work in list(IN_FLIGHT):
        if MPI.Request.Testall(work._requests):
            IN_FLIGHT.discard(work)


def complete(requests) -> None:
    """Waitall, that keeps the other transports moving while they may owe a
    peer something (else two ranks could each wait for the other)."""
    if not any(t.busy() for t in ELSEWHERE):
        MPI.Request.Waitall(requests)
        return
    while not MPI.Request.Testall(requests):
        for t in ELSEWHERE:
            t.progress()
        time.sleep(20e-6)


class MPIWork(Work):
    """Pending MPI requests (one, or a list completed together) plus what to
    do once they complete.

    Holds references to every buffer MPI is using so none of them can be
    garbage-collected while the request is in flight.
    """

    def __init__(self, requests, finish=None, keepalive=()):
        self._requests = requests if isinstance(requests, list) else [requests]
        self._finish = finish
        self._keepalive = keepalive
        self._done = False
        if self._requests:
            IN_FLIGHT.add(self)

    def wait(self) -> None:
        if self._done:
            return
        complete(self._requests)
        IN_FLIGHT.discard(self)
        if self._finish is not None:
            self._finish()
        self._done = True
        self._finish = self._keepalive = None


class TreeAllReduceWork(Work):
    """A deterministic all_reduce over point-to-point messages (see the module
    docstring). The transfers run in `wait()`, in program order on every rank,
    so two in flight on one communicator cannot cross."""

    TAG = 7001

    def __init__(self, comm, src, dst, ufunc):
        self._args = (comm, src, dst, ufunc)

    def wait(self) -> None:
        if self._args is None:
            return
        comm, src, dst, ufunc = self._args
        self._args = None
        rank, size = comm.Get_rank(), comm.Get_size()
        acc = np.array(src, copy=True)
        incoming = np.empty_like(acc)
        step = 1
        while step < size:
            if rank % (2 * step) == 0:
                if rank + step < size:
                    complete([comm.Irecv(_wire(incoming), source=rank + step, tag=self.TAG)])
                    ufunc(acc, incoming, out=acc)
            elif rank % (2 * step) == step:
                complete([comm.Isend(_wire(acc), dest=rank - step, tag=self.TAG)])
                break
            step *= 2
        complete([comm.Ibcast(_wire(acc), root=0)])
        dst[...] = acc


def check_host(*arrays) -> None:
    for a in arrays:
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
            raise CommError(f"MPI collectives need C-contiguous numpy buffers, got "
                            f"{type(a).__name__} (contiguous="
                            f"{getattr(getattr(a, 'flags', None), 'c_contiguous', None)})")


class MPICommunicator(Communicator):
    """Collectives over an mpi4py communicator (ranks in communicator order)."""

    def __init__(self, comm):
        self.comm = comm

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    def _all_reduce(self, src, dst, reduction, deterministic, stream) -> Work:
        check_host(src, dst)
        op, ufunc = _MPI_OPS[reduction], REDUCE_UFUNCS[reduction]
        if deterministic:
            return TreeAllReduceWork(self.comm, src, dst, ufunc)
        if is_bf16(src.dtype):
            wide, total = src.astype(np.float32), np.empty(src.shape, np.float32)
            return MPIWork(self.comm.Iallreduce(wide, total, op),
                           lambda: dst.__setitem__(..., total.astype(dst.dtype)),
                           (src, dst, wide, total))
        if src is dst:
            req = self.comm.Iallreduce(MPI.IN_PLACE, dst, op)
        else:
            if np.may_share_memory(src, dst):
                raise CommError("all_reduce: src and dst overlap without being the same buffer")
            req = self.comm.Iallreduce(src, dst, op)
        return MPIWork(req, keepalive=(src, dst))

    def _all_gather(self, src, dst, dim, stream) -> Work:
        check_host(src, dst)
        if leading_is_trivial(src.shape, dim):
            # Rank blocks are contiguous slabs of dst: gather straight into it.
            return MPIWork(self.comm.Iallgather(_wire(src), _wire(dst)), keepalive=(src, dst))
        # Gather rank blocks contiguously, then interleave them into dst along
        # `dim` once they have arrived.
        blocks = np.empty((self.size,) + src.shape, src.dtype)
        req = self.comm.Iallgather(_wire(src), _wire(blocks))
        return MPIWork(req, lambda: np.concatenate(blocks, axis=dim, out=dst),
                       (src, dst, blocks))

    def _reduce_scatter(self, src, dst, dim, reduction, deterministic, stream) -> Work:
        check_host(src, dst)
        op, ufunc = _MPI_OPS[reduction], REDUCE_UFUNCS[reduction]
        n = self.size
        # MPI scatters contiguous blocks in rank order.
        blocks = rank_blocks(np, src, n, dim)
        if deterministic:
            # Receive every rank's contribution to *our* block only (an
            # all-to-all of blocks), then reduce them in fixed rank order.
            contrib = np.empty((n,) + dst.shape, dst.dtype)
            req = self.comm.Ialltoall(_wire(blocks), _wire(contrib))
            return MPIWork(req, lambda: tree_reduce(contrib, ufunc, dst),
                           (src, dst, blocks, contrib))
        if is_bf16(src.dtype):
            wide, mine = blocks.astype(np.float32), np.empty(dst.shape, np.float32)
            return MPIWork(self.comm.Ireduce_scatter_block(wide, mine, op),
                           lambda: dst.__setitem__(..., mine.astype(dst.dtype)),
                           (src, dst, wide, mine))
        req = self.comm.Ireduce_scatter_block(blocks, dst, op)
        return MPIWork(req, keepalive=(src, dst, blocks))


    def _all_to_all(self, src, dst, split_dim, concat_dim, stream, counts) -> Work:
        check_host(src, dst)
        n = self.size
        blocks = rank_blocks(np, src, n, split_dim)     # block j goes to rank j
        if counts is not None:
            # Only the counted rows of each block (both are contiguous runs).
            row, height = src.shape[-1], blocks[0].size
            at = np.arange(n) * height
            send, recv = (np.asarray(c, np.int64) * row for c in counts)
            req = self.comm.Ialltoallv([_wire(blocks).reshape(-1), (send, at)],
                                       [_wire(dst).reshape(-1), (recv, at)])
            return MPIWork(req, keepalive=(src, dst, blocks))
        if leading_is_trivial(dst.shape, concat_dim):   # blocks side by side: dst itself
            req = self.comm.Ialltoall(_wire(blocks), _wire(dst))
            return MPIWork(req, keepalive=(src, dst, blocks))
        received = np.empty_like(blocks)
        req = self.comm.Ialltoall(_wire(blocks), _wire(received))
        return MPIWork(req, lambda: np.concatenate(received, axis=concat_dim, out=dst),
                       (src, dst, blocks, received))

    def _broadcast(self, src, dst, root, stream) -> Work:
        check_host(src, dst)
        if self.rank == root and src is not dst:
            dst[...] = src
        return MPIWork(self.comm.Ibcast(_wire(dst), root=root), keepalive=(src, dst))

    def _shift(self, src, dst, offset, stream) -> Work:
        check_host(src, dst)
        n, r = self.size, self.rank
        if offset == 0:
            dst[...] = src
            return MPIWork([], keepalive=(src, dst))
        send = self.comm.Isend(_wire(src), dest=(r + offset) % n, tag=TreeAllReduceWork.TAG + 1)
        recv = self.comm.Irecv(_wire(dst), source=(r - offset) % n, tag=TreeAllReduceWork.TAG + 1)
        return MPIWork([send, recv], keepalive=(src, dst))

    #: Tag of pipeline transfers (their order pairs them, see Communicator.send).
    P2P_TAG = TreeAllReduceWork.TAG + 2

    def _send(self, buf, peer, stream) -> Work:
        check_host(buf)
        return MPIWork(self.comm.Isend(_wire(buf), dest=peer, tag=self.P2P_TAG), keepalive=(buf,))

    def _recv(self, buf, peer, stream) -> Work:
        check_host(buf)
        return MPIWork(self.comm.Irecv(_wire(buf), source=peer, tag=self.P2P_TAG),
                       keepalive=(buf,))
