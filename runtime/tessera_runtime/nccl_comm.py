"""NCCL communicators over cupy (device buffers: cupy arrays), one per mesh axis.

Imported only on a machine with a GPU and cupy. Each axis group is found with
the same MPI Comm.Split as the MPI engine (`axis_comms.make_axis_communicators`);
the group's rank 0 makes an NCCL unique id and broadcasts it over that MPI
sub-communicator (as raw bytes), and every member joins with
`NcclCommunicator(size, id, rank)`.

Collectives are enqueued on the stream handed to them (the executor's comm
stream) and completed by `Work.wait()`, which blocks the host until they are
done. Deterministic all_reduce / reduce_scatter gather every rank's
contribution and sum it on the device in the same binary tree over rank order
as the MPI engine ((r0+r1)+(r2+r3)): elementwise IEEE additions in the same
order, so both engines give the same bits for the same inputs. bf16 (uint16
bits here) adds in float32 rounded to bf16 at every step of the tree, as the
MPI engine's ml_dtypes arrays do (`bf16.bits_ufunc`).

Each NCCL communicator is created at its axis' first collective, not when
the program loads (the MPI split is done then, by every rank together): a
program whose collectives are all NVSHMEM kernels, or that has none, creates
no NCCL communicator. That lets two NVSHMEM ranks share one GPU: NCCL
refuses two ranks of one communicator on one GPU ("Duplicate GPU detected",
NCCL 2.28 on the first H100 run) unless it is 2.32 or later with
`NCCL_MULTI_RANK_GPU_ENABLE=1`.
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from cupy.cuda import nccl

from . import bf16
from .comm import (Communicator, CommError, SelfCommunicator, Work, leading_is_trivial,
                   rank_blocks, tree_reduce)
from .mesh import MeshInfo

_OPS = {"sum": nccl.NCCL_SUM, "prod": nccl.NCCL_PROD, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}
_UFUNCS = {"sum": cp.add, "prod": cp.multiply, "max": cp.maximum, "min": cp.minimum}
_TYPES = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
          np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.int32): nccl.NCCL_INT32,
          np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.int8): nccl.NCCL_INT8,
          np.dtype(np.uint8): nccl.NCCL_UINT8}


def _nccl_type(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype in _TYPES:
        return _TYPES[dtype]
    # The cuda engine stores bf16 as uint16 (cupy has no bfloat16; Tessera has
    # no uint16 type, so uint16 device buffers are always bf16).
    if dtype == np.uint16 and hasattr(nccl, "NCCL_BFLOAT16"):
        return nccl.NCCL_BFLOAT16
    raise CommError(f"NCCL has no type for {dtype.name}")


def _tree_ufunc(reduction: str, src):
    """What a deterministic tree combines `src`'s blocks with: the reduction's
    ufunc, on bf16 bits (uint16 buffers) in float32 rounded to bf16."""
    if src.dtype == np.uint16:
        return bf16.bits_ufunc(cp, _UFUNCS[reduction])
    return _UFUNCS[reduction]


def _ptr(a) -> int:
    if not isinstance(a, cp.ndarray) or not a.flags.c_contiguous:
        raise CommError(f"NCCL collectives need C-contiguous cupy arrays, got {type(a).__name__}")
    return a.data.ptr


def _stream_ptr(stream) -> int:
    stream = stream if stream is not None else cp.cuda.get_current_stream()
    return getattr(stream, "ptr", stream)


class NCCLWork(Work):
    """An enqueued NCCL call plus what to run after it (on the same stream)."""

    def __init__(self, stream, finish=None, keepalive=()):
        self._stream, self._finish, self._keepalive = stream, finish, keepalive
        self._event = None
        if finish is None:
            self._event = cp.cuda.Event(disable_timing=True)
            self._event.record(self._stream)

    def wait(self) -> None:
        if self._keepalive is None:
            return
        if self._finish is not None:
            with self._stream:
                self._finish()
            self._event = cp.cuda.Event(disable_timing=True)
            self._event.record(self._stream)
        self._event.synchronize()
        self._finish = self._keepalive = None


class NCCLCommunicator(Communicator):
    """Collectives over one NCCL communicator (ranks in communicator order)."""

    def __init__(self, group, size: int, rank: int):
        """`group`: the axis group's MPI sub-communicator (the NCCL
        communicator is made from it at the first collective), or an
        `nccl.NcclCommunicator` already made."""
        self._group, self._nccl, self._size, self._rank = group, None, size, rank
        if isinstance(group, nccl.NcclCommunicator):
            self._group, self._nccl = None, group

    @property
    def comm(self) -> "nccl.NcclCommunicator":
        """The NCCL communicator, made on first use: every rank of the group
        reaches its first collective on this axis in the same program
        order, so they join together."""
        if self._nccl is None:
            group = self._group
            raw = np.frombuffer(_unique_id_bytes(), np.uint8).copy() if group.Get_rank() == 0 \
                else np.empty(_ID_BYTES, np.uint8)
            group.Bcast(raw, root=0)
            self._nccl = nccl.NcclCommunicator(self._size, _unique_id_from(raw.tobytes()),
                                               self._rank)
        return self._nccl

    @property
    def size(self) -> int:
        return self._size

    @property
    def rank(self) -> int:
        return self._rank

    def _gather_blocks(self, src, stream):
        """(size, *src.shape) holding every rank's src, in rank order."""
        blocks = cp.empty((self.size,) + tuple(src.shape), src.dtype)
        self.comm.allGather(_ptr(src), _ptr(blocks), src.size, _nccl_type(src.dtype),
                            _stream_ptr(stream))
        return blocks

    def _all_reduce(self, src, dst, reduction, deterministic, stream) -> Work:
        s = stream if stream is not None else cp.cuda.get_current_stream()
        if deterministic:
            with s:
                blocks = self._gather_blocks(src, s)
            return NCCLWork(s, lambda: tree_reduce(blocks, _tree_ufunc(reduction, src), dst),
                            (src, dst, blocks))
        self.comm.allReduce(_ptr(src), _ptr(dst), src.size, _nccl_type(src.dtype),
                            _OPS[reduction], _stream_ptr(s))
        return NCCLWork(s, keepalive=(src, dst))

    def _all_gather(self, src, dst, dim, stream) -> Work:
        s = stream if stream is not None else cp.cuda.get_current_stream()
        if leading_is_trivial(src.shape, dim):
            self.comm.allGather(_ptr(src), _ptr(dst), src.size, _nccl_type(src.dtype),
                                _stream_ptr(s))
            return NCCLWork(s, keepalive=(src, dst))
        with s:
            blocks = self._gather_blocks(src, s)
        return NCCLWork(s, lambda: cp.concatenate(list(blocks), axis=dim, out=dst),
                        (src, dst, blocks))

    def _reduce_scatter(self, src, dst, dim, reduction, deterministic, stream) -> Work:
        s = stream if stream is not None else cp.cuda.get_current_stream()
        n = self.size
        with s:
            packed = rank_blocks(cp, src, n, dim)
        if deterministic:
            with s:
                blocks = self._gather_blocks(packed, s)       # [n ranks, n blocks, ...]
            mine = lambda: tree_reduce(blocks[:, self.rank],  # noqa: E731
                                       _tree_ufunc(reduction, src), dst)
            return NCCLWork(s, mine, (src, dst, packed, blocks))
        self.comm.reduceScatter(_ptr(packed), _ptr(dst), dst.size, _nccl_type(src.dtype),
                                _OPS[reduction], _stream_ptr(s))
        return NCCLWork(s, keepalive=(src, dst, packed))

    def _all_to_all(self, src, dst, split_dim, concat_dim, stream, counts) -> Work:
        # Whole blocks, also with `counts` (allowed): reading the counts
        # would copy them to the host mid-step.
        s = stream if stream is not None else cp.cuda.get_current_stream()
        n = self.size
        with s:
            blocks = rank_blocks(cp, src, n, split_dim)
        received = cp.empty_like(blocks)
        count, kind = blocks[0].size, _nccl_type(src.dtype)
        nccl.groupStart()
        for peer in range(n):
            self.comm.send(_ptr(blocks[peer]), count, kind, peer, _stream_ptr(s))
            self.comm.recv(_ptr(received[peer]), count, kind, peer, _stream_ptr(s))
        nccl.groupEnd()
        return NCCLWork(s, lambda: cp.concatenate(list(received), axis=concat_dim, out=dst),
                        (src, dst, blocks, received))


    def _broadcast(self, src, dst, root, stream) -> Work:
        s = stream if stream is not None else cp.cuda.get_current_stream()
        self.comm.broadcast(_ptr(src), _ptr(dst), src.size, _nccl_type(src.dtype), root,
                            _stream_ptr(s))
        return NCCLWork(s, keepalive=(src, dst))

    def _shift(self, src, dst, offset, stream) -> Work:
        s = stream if stream is not None else cp.cuda.get_current_stream()
        n, r, kind = self.size, self.rank, _nccl_type(src.dtype)
        nccl.groupStart()
        self.comm.send(_ptr(src), src.size, kind, (r + offset) % n, _stream_ptr(s))
        self.comm.recv(_ptr(dst), dst.size, kind, (r - offset) % n, _stream_ptr(s))
        nccl.groupEnd()
        return NCCLWork(s, keepalive=(src, dst))

    def _send(self, buf, peer, stream) -> Work:
        s = stream if stream is not None else cp.cuda.get_current_stream()
        self.comm.send(_ptr(buf), buf.size, _nccl_type(buf.dtype), peer, _stream_ptr(s))
        return NCCLWork(s, keepalive=(buf,))

    def _recv(self, buf, peer, stream) -> Work:
        s = stream if stream is not None else cp.cuda.get_current_stream()
        self.comm.recv(_ptr(buf), buf.size, _nccl_type(buf.dtype), peer, _stream_ptr(s))
        return NCCLWork(s, keepalive=(buf,))


def make_axis_communicators(mesh_info: MeshInfo, comm=None, sub_axes=()) -> dict:
    """One NCCL communicator per mesh axis and per sub-axis in `sub_axes`
    for this process (every rank of `comm`, default MPI COMM_WORLD, must call
    it with the same mesh and sub-axes), each made at its first collective."""
    from . import axis_comms
    mpi_groups = axis_comms.make_axis_communicators(mesh_info, comm, sub_axes,
                                                    shared_memory=False)
    rank = (comm or axis_comms.MPI.COMM_WORLD).Get_rank()
    out: dict = {}
    for axis, group in mpi_groups.items():
        if isinstance(group, SelfCommunicator):
            out[axis] = group
            continue
        sub = group.comm
        out[axis] = NCCLCommunicator(sub, sub.Get_size(), sub.Get_rank())
        out[axis].name_group(axis, rank, mesh_info.axis_group(axis, rank))
    return out


_ID_BYTES = 128      # NCCL_UNIQUE_ID_BYTES
_id_kind: list = []  # bytes (cupy >= 13) or tuple (older): what get_unique_id returns


def _unique_id_bytes() -> bytes:
    uid = nccl.get_unique_id()
    _id_kind[:] = [type(uid)]
    return bytes(uid) if isinstance(uid, (bytes, bytearray)) else np.asarray(uid, np.int8).tobytes()


def _unique_id_from(raw: bytes):
    if not _id_kind:
        _unique_id_bytes()
    return raw if _id_kind[0] in (bytes, bytearray) else tuple(np.frombuffer(raw, np.int8).tolist())
