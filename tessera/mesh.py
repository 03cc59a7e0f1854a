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

from ._dtensor import auto_mesh as auto
from ._dtensor import current_mesh as current

__all__ = ["auto", "current"]
