"""`ts.mesh`: meshes over the running job.

    mesh = ts.mesh.auto()                      # every rank on one "dp" axis
    mesh = ts.mesh.auto(axes=("dp", "tp"))     # the ranks split as evenly as possible
    print(mesh.size, mesh.device_ids, mesh.rank)

A job runs one process per device (`tessera launch -n N`, `mpiexec -n N`,
`srun`): the mesh's devices are the job's ranks. Inside a function being
compiled, `ts.mesh.current()` is the mesh it is compiled for; outside, the
default mesh: the innermost `with mesh:`, else the mesh made last.
"""

from __future__ import annotations

from tessera_runtime import world

from . import dist
from .dist import Mesh

__all__ = ["auto", "current"]


def auto(axes=("dp",), shape=None, name: str = "mesh") -> Mesh:
    """A mesh over every rank of the running job. With several axes and no
    `shape`, the ranks are split as evenly as possible (larger axes first).
    Like a Mesh the user makes, it becomes the default mesh (see current)."""
    axes = [axes] if isinstance(axes, str) else list(axes)
    mesh = Mesh(axes=axes, devices=range(world()[1]), shape=shape, name=name)
    dist.make_default(mesh)
    return mesh


def current() -> Mesh:
    """The mesh of the function being traced; outside tracing, the default
    mesh (the innermost `with mesh:`, else the mesh made last, by
    `dist.Mesh(...)` or `auto`); with none made, `auto()`."""
    from ._trace import current as trace_state
    state = trace_state()
    if state is not None:
        return state.mesh
    return dist.default_mesh() or auto()
