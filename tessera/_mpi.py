"""MPI over raw bytes for the frontend's own agreements between ranks
(compile errors, program fingerprints, shapes): mpi4py's buffer calls only,
never its pickling lower-case ones, so nothing a rank receives is executed."""

from __future__ import annotations

import time

import numpy as np


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


def bcast_text(comm, text: str, root: int = 0) -> str:
    """`root`'s `text` on every rank."""
    data = np.frombuffer(text.encode(), np.uint8) if comm.Get_rank() == root else None
    size = np.array([0 if data is None else data.size], np.int64)
    comm.Bcast(size, root=root)
    buf = data.copy() if data is not None else np.empty(int(size[0]), np.uint8)
    if size[0]:
        comm.Bcast(buf, root=root)
    return buf.tobytes().decode()


def allgather_text(comm, text: str) -> list[str]:
    """Every rank's `text`, in rank order."""
    from mpi4py import MPI
    data = np.frombuffer(text.encode(), np.uint8)
    sizes = np.empty(comm.Get_size(), np.int64)
    comm.Allgather(np.array([data.size], np.int64), sizes)
    out = np.empty(int(sizes.sum()), np.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    comm.Allgatherv(data, [out, sizes.tolist(), offsets.tolist(), MPI.BYTE])
    return [out[o:o + s].tobytes().decode() for o, s in zip(offsets, sizes)]


def raw_view(array: np.ndarray) -> np.ndarray:
    """`array` as MPI can move it: dtypes MPI does not know (ml_dtypes'
    bfloat16) as unsigned integers of the same width."""
    return array.view(np.dtype(f"u{array.dtype.itemsize}")) if array.dtype.kind == "V" else array
