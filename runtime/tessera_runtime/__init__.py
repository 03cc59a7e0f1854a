"""Tessera runtime: load a compiled bundle (NAME.tsb/) and run it.

    import tessera_runtime as rt
    prog = rt.load_bundle("mlp.tsb")
    outs = prog.run(prog.shard_inputs([x, w]))     # local shards in and out

Run one process per mesh device (`mpiexec -n N python script.py`); a 1-device
program runs in a plain process without MPI.

This package must never import the compiler or MLIR (tessera, tessera_compiler,
tessera_passes, tessera_mlir, mlir): a bundle is self-contained. mpi4py is
imported only when a mesh has more than one rank or MPI is requested, because
importing it initializes MPI.
"""

from __future__ import annotations

from importlib import import_module

from . import env

__all__ = [
    "load_bundle", "Program", "world",
    "Bundle", "TensorSpec", "MeshInfo", "Communicator", "SelfCommunicator", "Work",
    "Engine", "BundleError", "EngineError", "InputError", "MeshError", "ScheduleError", "Absent",
]

#: Where each public name lives; imported on first use, so that importing
#: the package (the compiler does, for `env`) costs nothing.
_EXPORTS = {
    "load_bundle": "program", "Program": "program",
    "Bundle": "bundle", "BundleError": "bundle", "TensorSpec": "bundle", "read_bundle": "bundle",
    "Communicator": "comm", "SelfCommunicator": "comm", "Work": "comm",
    "Engine": "engines", "EngineError": "engines", "get_engine": "engines",
    "InputError": "executor", "ScheduleError": "executor", "ScheduleExecutor": "executor",
    "Absent": "executor",
    "MeshError": "mesh", "MeshInfo": "mesh",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def world() -> tuple[int, int]:
    """(rank, size) of this process in the launched job.

    Read from launcher environment variables so that a single process never
    imports (and initializes) MPI. No variables set means a single process.
    """
    for rank_var, size_var in env.LAUNCHER_RANKS:
        rank, size = env.get(rank_var), env.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
    return 0, 1
