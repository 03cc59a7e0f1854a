"""A process's communicator for each axis of its mesh: through shared
memory where a group's ranks share one machine (`shm_comm`), else MPI
(`mpi_comm`). Above both transports, which import neither this module nor
each other's factory."""

from __future__ import annotations

from .comm import CommError, SelfCommunicator
from .mesh import MeshInfo
from .mpi_comm import MPI, MPICommunicator   # (only mpi_comm imports mpi4py)
from .shm_comm import SharedMemoryCommunicator


def make_axis_communicators(mesh_info: MeshInfo, comm=None, sub_axes=(),
                            shared_memory: bool = True) -> dict:
    """One communicator per mesh axis for this process, and one per sub-axis
    in `sub_axes` (`"dp:(1)2"`: the groups of a hierarchical collective).
    With `shared_memory`, a group whose ranks share one machine runs its
    collectives through shared memory (`shm_comm`), else through MPI.

    Ranks that share every other coordinate form the group of an axis:
    Comm.Split with color = the group index and key = the coordinate along
    the axis, so the sub-communicator rank equals the axis coordinate. Every
    rank of `comm` must call this (Split is collective) with the same mesh
    and sub-axes.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    rank = comm.Get_rank()
    if shared_memory:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        node_ranks = node.Get_size()
        node.Free()
    out: dict = {}
    for axis in list(mesh_info.axes) + sorted(set(sub_axes) - set(mesh_info.axes)):
        size = mesh_info.axis_size(axis)
        if size == 1:
            out[axis] = SelfCommunicator()   # same decision on every rank
            continue
        coord = mesh_info.axis_group(axis, rank).index(rank)
        sub = comm.Split(mesh_info.axis_color(axis, rank), coord)
        if sub.Get_size() != size or sub.Get_rank() != coord:
            raise CommError(f"axis '{axis}': split communicator has rank "
                            f"{sub.Get_rank()}/{sub.Get_size()}, expected {coord}/{size}")
        group = (SharedMemoryCommunicator.for_group(sub, mesh_info.axis_group(axis, rank),
                                                    node_ranks) if shared_memory else None)
        out[axis] = group or MPICommunicator(sub)
    for axis, comm_ in out.items():
        comm_.name_group(axis, rank, mesh_info.axis_group(axis, rank))
    return out
