"""Device meshes, ShardSpecs and distributed tensors (`tessera.dist`).

    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    W1 = dist.from_numpy(w1, layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)

A program runs as one process per device (rank r is device r), started with
`tessera launch -n N script.py` or `mpiexec -n N`. Every process runs the same
script; a DTensor holds this rank's shard of the global tensor.

The namespace: the data (meshes, layouts, DTensors) is `_dtensor`'s, below
the tracer; what works on traced values too (redistribute, broadcast), the
collectives, per-rank code, elastic jobs and profiles are added here, above
them all.
"""

from __future__ import annotations

from ._dtensor import (DTensor, Mesh, ShardSpec, check_divisible, check_mesh, counter_normal,
                       default_mesh, default_origin, deterministic, deterministic_enabled,
                       from_local, from_numpy, from_tree, inspect, install_abort_on_error,
                       local_blocks, make_default, scatter, summand, tensor, world_size)
from ._source import assigned_name, user_frame
from ._trace import Traced, pin_layout
from .collectives import all_gather, all_reduce, all_to_all, allreduce, reduce_scatter
from .compiler import reshard
from .elastic import Elastic
from .errors import ShardingError
from .local_view import axis_index, collective, recv, send, spmd
from .profiling import profile

__all__ = ["Mesh", "ShardSpec", "DTensor", "from_numpy", "from_local", "from_tree", "tensor",
           "inspect", "deterministic", "broadcast", "scatter", "redistribute", "all_reduce", "allreduce",
           "all_gather", "reduce_scatter", "all_to_all", "spmd", "axis_index", "send", "recv",
           "recv_from", "world_size", "elastic", "profile"]

recv_from = recv          # `ts.distributed.recv_from(owner_rank, name)`, as the training guide writes it
elastic = Elastic         # `with dist.elastic(...) as job:`


def redistribute(x, layout: ShardSpec):
    """`x` in `layout`. Inside a compiled function (global view) this pins
    the value's layout and the partitioner inserts the collectives, as JAX's
    with_sharding_constraint; on a DTensor outside one it runs those
    collectives now (one small compiled program per layout, cached)."""
    if isinstance(x, Traced):
        return pin_layout(x, layout)
    return reshard(x, layout)


def broadcast(x, axis: str | None = None, src: int = 0, mesh: Mesh | None = None,
              name: str | None = None):
    """Rank `src`'s value on every rank. Outside compiled functions: a numpy
    array rank `src` holds (the others pass None) becomes a replicated
    DTensor on `mesh`. In per-rank code (`dist.spmd`): the value of the rank
    at coordinate `src` along `axis`."""
    if isinstance(x, Traced):
        if axis is None:
            raise ShardingError(f"dist.broadcast in per-rank code needs axis=  [{user_frame()}]")
        return collective("broadcast", x, axis, src=src)
    if mesh is None:
        raise ShardingError(f"dist.broadcast of an array needs mesh=  [{user_frame()}]")
    name = name or assigned_name(user_frame()) or "tensor"
    return from_numpy(x, ShardSpec(), mesh, name=name, src=src)
