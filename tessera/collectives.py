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
  docs' `Y_local`) and combine it with the arrays the other ranks of its
  group along `axis` pass. The group is one of `mesh=`, by default the
  innermost `with mesh:`, else the mesh made last (`dist.Mesh(...)`,
  `ts.mesh.auto()`); running a compiled function on another mesh does not
  change it. Before any data moves, the group's ranks compare what they
  called (kind, axis, dtype, shape) under TESSERA_COLLECTIVE_TIMEOUT: ranks at
  different calls get an error naming each call and its line, a rank that
  never comes is named by the others', never garbage or a silent hang.

In per-rank code (`dist.spmd`, `@op.kernel`) they are collectives of the
traced program over one mesh axis (see local_view). Inside a global-view
compiled function a value is the global value, so all_reduce and all_gather
return it as is (the partitioner reduces and gathers where the layouts need
it); the others, which would change the value, are errors pointing to
redistribute and the local view. Everywhere, an axis that is not in the mesh
is an error naming the axis, the mesh and the line.
"""

from __future__ import annotations

import numpy as np

from . import _dtensor, mesh as mesh_module
from ._checks import is_int
from ._mpi import exchange, world_comm
from ._pytree import flatten, unflatten
from ._source import user_frame
from ._trace import Traced, current
from .errors import ArgumentError, ShardingError
from .local_view import collective

__all__ = ["all_reduce", "allreduce", "all_gather", "reduce_scatter", "all_to_all"]

_OPS = ("sum", "max", "min")
_GROUPS: dict = {}


def all_reduce(x, axis: str, op: str = "sum", *, mesh=None):
    """The reduction over mesh axis `axis` of `x` (a DTensor, a numpy array
    holding this rank's value, or a pytree of them); `mesh` is the mesh of
    numpy arrays (default: see the module docstring)."""
    if op not in _OPS:
        raise ArgumentError(f"dist.all_reduce: op must be one of {_OPS}, got {op!r}  "
                            f"[{user_frame()}]")
    return _each(x, "all_reduce", axis, mesh, lambda t: _dtensor_all_reduce(t, axis, op),
                 lambda a, m: _local(a, m, axis, "all_reduce", op=op), op=op)


allreduce = all_reduce


def all_gather(x, axis: str, dim: int = -1, *, mesh=None):
    """`x` gathered over mesh axis `axis`: a DTensor split over it comes back
    whole along that dimension; blocks (numpy arrays of each rank, or traced
    blocks in per-rank code) are concatenated along `dim` in axis order (by
    default the last, where a column-parallel matmul splits its output)."""
    return _each(x, "all_gather", axis, mesh, lambda t: _dtensor_gather(t, axis),
                 lambda a, m: _local(a, m, axis, "all_gather", dim=dim), dim=dim)


def reduce_scatter(x, axis: str, dim: int = 0, op: str = "sum", *, mesh=None):
    """The reduction over `axis`, split along `dim` over it: each rank keeps
    its block."""
    if op != "sum":
        raise ArgumentError(f"dist.reduce_scatter: only op='sum', got {op!r}  [{user_frame()}]")
    return _each(x, "reduce_scatter", axis, mesh,
                 lambda t: _dtensor_reduce_scatter(t, axis, dim),
                 lambda a, m: _local(a, m, axis, "reduce_scatter", dim=dim), dim=dim)


def all_to_all(x, axis: str, split_dim: int, concat_dim: int, *, mesh=None):
    """Per-rank code only (`dist.spmd`): cut `x` into axis-size pieces along
    `split_dim`, send piece j to rank j of `axis`, and concatenate what
    arrives along `concat_dim` in rank order."""
    def outside(*_):
        raise ShardingError(f"dist.all_to_all at {user_frame()} is for per-rank code: call it "
                            "inside a function decorated with @dist.spmd (a DTensor moves "
                            "between splits with t.redistribute(layout))")
    return _each(x, "all_to_all", axis, mesh, outside, outside, split_dim=split_dim,
                 concat_dim=concat_dim)


def _each(x, name, axis, mesh, on_dtensor, on_array, **args):
    """`name` applied to every tensor of `x`: as a collective of per-rank code
    (a traced tensor in dist.spmd), a layout change (a DTensor) or an MPI
    collective of this rank's array (numpy) over `mesh` (None: the default)."""
    if not isinstance(axis, str):
        raise ShardingError(f"dist.{name}: axis must be a mesh axis name (a str), got "
                            f"{axis!r}  [{user_frame()}]")
    if mesh is not None:
        _dtensor.check_mesh(f"dist.{name}", mesh)
    for key, d in args.items():
        if key.endswith("dim") and not is_int(d):
            raise ArgumentError(f"dist.{name}: {key}={d!r} must be a dimension index (an int)  "
                                f"[{user_frame()}]")
    leaves, structure = flatten(x)
    state = current()
    if state is not None:
        _check_axis(name, axis, state.mesh, "the mesh it is compiled for", mesh)
    out = []
    for leaf in leaves:
        if isinstance(leaf, Traced) and state.local:
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
        if isinstance(leaf, _dtensor.DTensor):
            _check_axis(name, axis, leaf.mesh, f"the mesh of {leaf.name or 'the tensor'}", mesh)
            out.append(on_dtensor(leaf))
        elif isinstance(leaf, (np.ndarray, np.generic)):
            group_mesh = mesh or _default_mesh()
            _check_axis(name, axis, group_mesh, None, None)
            out.append(on_array(np.asarray(leaf), group_mesh))
        else:
            out.append(leaf)
    return unflatten(structure, out)


def _default_mesh():
    return mesh_module.current()


def _check_axis(name: str, axis: str, mesh, whose: str | None, given) -> None:
    """`axis` must be an axis of `mesh` (`whose` mesh, or the default one
    when None), and a `mesh=` given must be that mesh."""
    if given is not None and whose is not None and given != mesh:
        raise ShardingError(f"dist.{name}: mesh= is the {given.topology}, but it runs on "
                            f"{whose}, the {mesh.topology}  [{user_frame()}]")
    if axis in mesh.axes:
        return
    which = f"{whose}, the {mesh.topology}" if whose is not None else f"the {mesh.topology}" + (
        f" {_dtensor.default_origin(mesh)}" if mesh is _dtensor.default_mesh() else "")
    raise ShardingError(f"dist.{name}: axis {axis!r} is not in {which} (axes: "
                        f"{', '.join(mesh.axes)}); name one of its axes, or pass mesh= (or use "
                        f"`with mesh:`) for the mesh that has it  [{user_frame()}]")


def _dtensor_all_reduce(t, axis: str, op: str):
    if any(axis in d for d in t.dims):
        raise ShardingError(
            f"dist.all_reduce: {t.name or 'the tensor'} is split over {axis!r} "
            f"({_dtensor.describe_layout(t.dims, t.layout.partial)}), not a pending sum over it: "
            "dist.all_gather collects its blocks")
    if axis not in t.layout.partial:
        return t                          # already the reduced value
    if op != "sum":
        raise ShardingError(f"dist.all_reduce: a pending sum is reduced with op='sum', "
                            f"not {op!r}")
    partial = tuple(a for a in t.layout.partial if a != axis)
    return t.redistribute(_dtensor.ShardSpec(t.layout.partition, t.layout.mesh_axes, partial))


def _dtensor_gather(t, axis: str):
    keep = [(p, a) for p, a in zip(t.layout.partition, t.layout.mesh_axes) if a != axis]
    if len(keep) == len(t.layout.partition):
        return t                          # not split over the axis: whole already
    return t.redistribute(_dtensor.ShardSpec(tuple(p for p, _ in keep), tuple(a for _, a in keep),
                                         t.layout.partial))


def _dtensor_reduce_scatter(t, axis: str, dim: int):
    if axis not in t.layout.partial:
        raise ShardingError(f"dist.reduce_scatter: {t.name or 'the tensor'} is not a pending "
                            f"sum over {axis!r}; split it with t.shard({dim}, {axis!r})")
    partial = tuple(a for a in t.layout.partial if a != axis)
    return t.redistribute(_dtensor.ShardSpec(t.layout.partition + (dim,),
                                         t.layout.mesh_axes + (axis,), partial))


def _group(mesh, axis: str):
    """(the runtime communicator, its MPI communicator, its members' world
    ranks) of this rank's group along `axis` of `mesh` (the ranks that
    differ from it only on that axis), cached."""
    key = (mesh, axis)
    if key not in _GROUPS:
        rank = mesh.require_rank(f"a collective over {axis!r}")
        coords = mesh.info.coords(rank)
        keep = mesh.axes.index(axis)
        color = 0
        for i, c in enumerate(coords):
            if i != keep:
                color = color * mesh.info.shape[i] + c
        # Splitting COMM_WORLD is collective over every rank: they must all
        # come (under the timeout) before MPI waits for them.
        comm = world_comm()
        exchange(comm, b"", f"the group of axis {axis!r} of the {mesh.topology}",
                 f"making the communicator of axis {axis!r} of the {mesh.topology} for the "
                 f"first eager collective over it (at {user_frame()}): every rank of the job "
                 "takes part")
        split = comm.Split(color, coords[keep])
        # The runtime's communicator: numbered, flight-recorded and bounded
        # by TESSERA_COLLECTIVE_TIMEOUT like a compiled program's collectives.
        from tessera_runtime.mpi_comm import MPICommunicator
        group = MPICommunicator(split)
        members = mesh.info.axis_group(axis, rank)
        group.name_group(axis, rank, members)
        _GROUPS[key] = (group, split, members)
    return _GROUPS[key]


def _local(a: np.ndarray, mesh, axis: str, kind: str, op: str = "sum",
           dim: int = 0) -> np.ndarray:
    if kind != "all_reduce" and not -a.ndim <= dim < max(a.ndim, 1):
        raise ArgumentError(f"dist.{kind}: dim={dim} is not a dimension of this rank's array "
                            f"{list(a.shape)}  [{user_frame()}]")
    comm, split, members = _group(mesh, axis)
    n = comm.size
    a = np.ascontiguousarray(a)
    source = str(user_frame())
    detail = f"op={op!r}" if kind == "all_reduce" else f"dim={dim}"
    call = f"{kind} over {axis!r} ({detail}) of a {a.dtype.name} array {list(a.shape)}"
    # The group agrees on the call before any data moves (MPI would pair
    # unequal buffers into garbage, or wait forever).
    exchange(split, b"", call, f"dist.{call} at {source}", ranks=members,
             axis=f"{axis}:calls", source=source)
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
                            f"not divisible by axis {axis!r} (size {n})  [{source}]")
    shape = list(a.shape)
    shape[dim] //= n
    out = np.empty(shape, a.dtype)
    comm.reduce_scatter(a, out, dim, source=source).wait()
    return out
