"""`ts.mesh`: meshes over the running job.

    mesh = ts.mesh.auto()                      # every rank on one "dp" axis
    mesh = ts.mesh.auto(axes=("dp", "tp"))     # the ranks split as evenly as possible
    print(mesh.size, mesh.device_ids, mesh.rank)

A job runs one process per device (`tessera launch -n N`, `mpiexec -n N`,
`srun`): the mesh's devices are the job's ranks. Inside a function being
compiled, `ts.mesh.current()` is the mesh it is compiled for.
"""

from __future__ import annotations

from tessera_runtime import world

from .dist import Mesh

__all__ = ["auto", "current"]

_last: list = []


def auto(axes=("dp",), shape=None, name: str = "mesh") -> Mesh:
    """A mesh over every rank of the running job. With several axes and no
    `shape`, the ranks are split as evenly as possible (larger axes first)."""
    axes = [axes] if isinstance(axes, str) else list(axes)
    mesh = Mesh(axes=axes, devices=range(world()[1]), shape=shape, name=name)
    _last[:] = [mesh]
    return mesh


def current() -> Mesh:
    """The mesh of the function being traced; outside tracing, the mesh last
    made by `auto` or run on by a compiled function; else `auto()`."""
    from ._trace import current as trace_state
    state = trace_state()
    if state is not None:
        return state.mesh
    return _last[0] if _last else auto()


def _used(mesh: Mesh) -> None:
    _last[:] = [mesh]
