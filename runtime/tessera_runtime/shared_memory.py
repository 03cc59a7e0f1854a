"""Memory shared by the ranks of a job on one machine (the CPU collectives'
slots, the emulated NVSHMEM heap). Standard library only: importing it does
not initialize MPI."""

from __future__ import annotations

import mmap
import os
import tempfile


def shared_mapping(comm, nbytes: int, prefix: str, reserve: bool = False) -> mmap.mmap:
    """One mapping of `nbytes` shared by every rank of the MPI communicator
    `comm` (collective: every rank calls it). Rank 0 makes a file in
    /dev/shm, the others open it, and it is unlinked once all have mapped
    it, so nothing is left behind however the job ends. `reserve` allocates
    the memory now (OSError where /dev/shm cannot hold it) instead of at
    first touch, where a full /dev/shm would kill the process."""
    path, error = None, None
    if comm is None or comm.Get_rank() == 0:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix=prefix, dir=shm)
        try:
            os.ftruncate(fd, nbytes)
            if reserve:
                os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            error = str(e)
            os.unlink(path)
        finally:
            os.close(fd)
    if comm is not None:
        path, error = comm.bcast((path, error), root=0)
    if error is not None:
        raise OSError(f"cannot make {nbytes} B of shared memory: {error}")
    with open(path, "r+b") as f:
        mapping = mmap.mmap(f.fileno(), nbytes)
    if comm is not None:
        comm.Barrier()
    if comm is None or comm.Get_rank() == 0:
        os.unlink(path)           # the mappings keep the memory alive
    return mapping
