"""Collectives a user calls: `dist.all_reduce(x, axis="dp")`, `all_gather`,
`reduce_scatter` (also as `ts.distributed.*`, `dist.allreduce`).

Called outside a compiled function they run now:

- on a **DTensor** they change its layout, as the global value says: an
  all_reduce reduces a pending sum over the axis, an all_gather collects a
  split over the axis, a reduce_scatter turns a pending sum into a split (the
  partitioner's reshard, so also its cheapest collective). A tensor that holds
  no pending sum (or split) over the axis already is the reduced (gathered)
  value and comes back as is, as data-parallel gradients from `ts.grad` do.
- on a **numpy array** they treat it as this rank's own value (the design
  docs' `Y_local`) and combine it with the same-named arrays of the other
  ranks along the axis of the current mesh (MPI on raw buffers).

In per-rank code (`dist.spmd`, `@op.kernel`) they are collectives of the
traced program over one mesh axis (see local_view). Inside a global-view
compiled function a value is the global value, so all_reduce and all_gather
return it as is (the partitioner reduces and gathers where the layouts need
it); the others, which would change the value, are errors pointing to
redistribute and the local view.
"""

from __future__ import annotations

import numpy as np

from ._mpi import world_comm
from ._pytree import flatten, unflatten
from ._source import user_frame
from .errors import ShardingError

__all__ = ["all_reduce", "allreduce", "all_gather", "reduce_scatter", "all_to_all"]

_OPS = ("sum", "max", "min")
_GROUPS: dict = {}


def all_reduce(x, axis: str, op: str = "sum"):
    """The reduction over mesh axis `axis` of `x` (a DTensor, a numpy array
    holding this rank's value, or a pytree of them)."""
    if op not in _OPS:
        raise ValueError(f"dist.all_reduce: op must be one of {_OPS}, got {op!r}")
    return _each(x, "all_reduce", axis, lambda t: _dtensor_all_reduce(t, axis, op),
                 lambda a: _local(a, axis, "all_reduce", op=op), op=op)


allreduce = all_reduce


def all_gather(x, axis: str, dim: int = -1):
    """`x` gathered over mesh axis `axis`: a DTensor split over it comes back
    whole along that dimension; blocks (numpy arrays of each rank, or traced
    blocks in per-rank code) are concatenated along `dim` in axis order (by
    default the last, where a column-parallel matmul splits its output)."""
    return _each(x, "all_gather", axis, lambda t: _dtensor_gather(t, axis),
                 lambda a: _local(a, axis, "all_gather", dim=dim), dim=dim)


def reduce_scatter(x, axis: str, dim: int = 0, op: str = "sum"):
    """The reduction over `axis`, split along `dim` over it: each rank keeps
    its block."""
    if op != "sum":
        raise ValueError("dist.reduce_scatter: only op='sum'")
    return _each(x, "reduce_scatter", axis, lambda t: _dtensor_reduce_scatter(t, axis, dim),
                 lambda a: _local(a, axis, "reduce_scatter", dim=dim), dim=dim)


def all_to_all(x, axis: str, split_dim: int, concat_dim: int):
    """Per-rank code only (`dist.spmd`): cut `x` into axis-size pieces along
    `split_dim`, send piece j to rank j of `axis`, and concatenate what
    arrives along `concat_dim` in rank order."""
    def outside(_):
        raise ShardingError(f"dist.all_to_all at {user_frame()} is for per-rank code: call it "
                            "inside a function decorated with @dist.spmd (a DTensor moves "
                            "between splits with t.redistribute(layout))")
    return _each(x, "all_to_all", axis, outside, outside, split_dim=split_dim,
                 concat_dim=concat_dim)


def _each(x, name, axis, on_dtensor, on_array, **args):
    """`name` applied to every tensor of `x`: as a collective of per-rank code
    (a traced tensor in dist.spmd), a layout change (a DTensor) or an MPI
    collective of this rank's array (numpy)."""
    from . import dist
    from ._trace import Traced, current
    leaves, structure = flatten(x)
    out = []
    for leaf in leaves:
        if isinstance(leaf, Traced) and current().local:
            from .local_view import collective
            out.append(collective(name, leaf, axis, **args))
            continue
        if isinstance(leaf, Traced):
            if name in ("all_reduce", "all_gather"):
                # The global view's value already is the reduced (gathered)
                # one: the partitioner reduces a pending sum and gathers a split
                # where they are read, as the training guide's data-parallel
                # step expects of `dist.all_reduce(grads, axis="dp")`.
                out.append(leaf)
                continue
            raise ShardingError(
                f"dist.{name}(..., axis={axis!r}) at {user_frame()} inside a compiled "
                "function: in the global view values are global and the compiler inserts "
                "the collectives their layouts need; change a layout with "
                "dist.redistribute(x, layout), or write per-rank code with explicit "
                "collectives in a function decorated with @dist.spmd.")
        if isinstance(leaf, dist.DTensor):
            if axis not in leaf.mesh.axes:
                raise ShardingError(f"dist.{name}: axis {axis!r} is not in the "
                                    f"{leaf.mesh.topology} of {leaf.name or 'the tensor'}")
            out.append(on_dtensor(leaf))
        elif isinstance(leaf, (np.ndarray, np.generic)):
            out.append(on_array(np.asarray(leaf)))
        else:
            out.append(leaf)
    return unflatten(structure, out)


def _dtensor_all_reduce(t, axis: str, op: str):
    from . import dist
    if any(axis in d for d in t.dims):
        raise ShardingError(
            f"dist.all_reduce: {t.name or 'the tensor'} is split over {axis!r} "
            f"({dist._describe(t.dims, t.layout.partial)}), not a pending sum over it: "
            "dist.all_gather collects its blocks")
    if axis not in t.layout.partial:
        return t                          # already the reduced value
    if op != "sum":
        raise ShardingError(f"dist.all_reduce: a pending sum is reduced with op='sum', "
                            f"not {op!r}")
    partial = tuple(a for a in t.layout.partial if a != axis)
    return t.redistribute(dist.ShardSpec(t.layout.partition, t.layout.mesh_axes, partial))


def _dtensor_gather(t, axis: str):
    from . import dist
    keep = [(p, a) for p, a in zip(t.layout.partition, t.layout.mesh_axes) if a != axis]
    if len(keep) == len(t.layout.partition):
        return t                          # not split over the axis: whole already
    return t.redistribute(dist.ShardSpec(tuple(p for p, _ in keep), tuple(a for _, a in keep),
                                         t.layout.partial))


def _dtensor_reduce_scatter(t, axis: str, dim: int):
    from . import dist
    if axis not in t.layout.partial:
        raise ShardingError(f"dist.reduce_scatter: {t.name or 'the tensor'} is not a pending "
                            f"sum over {axis!r}; split it with t.shard({dim}, {axis!r})")
    partial = tuple(a for a in t.layout.partial if a != axis)
    return t.redistribute(dist.ShardSpec(t.layout.partition + (dim,),
                                         t.layout.mesh_axes + (axis,), partial))


def _group(axis: str):
    """The communicator of this rank's group along `axis` of the current
    mesh (the ranks that differ from it only on that axis), cached."""
    from . import mesh as mesh_module
    mesh = mesh_module.current()
    if axis not in mesh.axes:
        raise ShardingError(f"axis {axis!r} is not in the current {mesh.topology}")
    key = (mesh, axis)
    if key not in _GROUPS:
        rank = mesh.require_rank(f"a collective over {axis!r}")
        coords = mesh.info.coords(rank)
        keep = mesh.axes.index(axis)
        color = 0
        for i, c in enumerate(coords):
            if i != keep:
                color = color * mesh.info.shape[i] + c
        # The runtime's communicator: numbered, flight-recorded and bounded
        # by TESSERA_COLLECTIVE_TIMEOUT like a compiled program's collectives.
        from tessera_runtime.mpi_comm import MPICommunicator
        group = MPICommunicator(world_comm().Split(color, coords[keep]))
        group.name_group(axis, rank, mesh.info.axis_group(axis, rank))
        _GROUPS[key] = group
    return _GROUPS[key]


def _local(a: np.ndarray, axis: str, kind: str, op: str = "sum", dim: int = 0) -> np.ndarray:
    comm = _group(axis)
    n = comm.size
    a = np.ascontiguousarray(a)
    source = str(user_frame())
    if kind == "all_reduce":
        out = np.empty_like(a)
        comm.all_reduce(a, out, op, source=source).wait()
        return out
    dim = dim % max(a.ndim, 1)
    if kind == "all_gather":
        shape = list(a.shape)
        shape[dim] *= n
        out = np.empty(shape, a.dtype)
        comm.all_gather(a, out, dim, source=source).wait()
        return out
    if a.shape[dim] % n:
        raise ShardingError(f"dist.reduce_scatter: dimension {dim} (size {a.shape[dim]}) is "
                            f"not divisible by axis {axis!r} (size {n})")
    shape = list(a.shape)
    shape[dim] //= n
    out = np.empty(shape, a.dtype)
    comm.reduce_scatter(a, out, dim, source=source).wait()
    return out
