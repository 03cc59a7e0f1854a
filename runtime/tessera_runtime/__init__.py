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

import os

from .bundle import Bundle, BundleError, TensorSpec, read_bundle
from .comm import Communicator, SelfCommunicator, Work
from .engines import Engine, EngineError, get_engine
from .executor import InputError, ScheduleError, ScheduleExecutor
from .mesh import MeshError, MeshInfo

__all__ = [
    "load_bundle", "Program", "world",
    "Bundle", "TensorSpec", "MeshInfo", "Communicator", "SelfCommunicator", "Work",
    "Engine", "BundleError", "EngineError", "InputError", "MeshError", "ScheduleError",
]

# (rank, size) environment variables set by common MPI launchers.
_LAUNCHER_ENV = (
    ("PMI_RANK", "PMI_SIZE"),                          # MPICH / Hydra, Intel MPI
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),    # MVAPICH2
    ("SLURM_PROCID", "SLURM_NTASKS"),                  # srun
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),            # Hydra, node-local: 1-node fallback
)


def world() -> tuple[int, int]:
    """(rank, size) of this process in the launched job.

    Read from launcher environment variables so that a single process never
    imports (and initializes) MPI. No variables set means a single process.
    """
    for rank_var, size_var in _LAUNCHER_ENV:
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


class Program:
    """A loaded bundle, bound to this process' mesh position, ready to run."""

    def __init__(self, bundle: Bundle, executor: ScheduleExecutor, rank: int):
        self.bundle = bundle
        self.entry: str = bundle.manifest.entry
        self.mesh: MeshInfo = bundle.program.mesh
        self.rank: int = rank
        #: this process' mesh coordinate, one entry per mesh axis
        self.rank_coords: tuple[int, ...] = self.mesh.coords(rank)
        self.inputs: list[TensorSpec] = list(bundle.program.inputs)
        self.outputs: list[TensorSpec] = list(bundle.program.outputs)
        self._executor = executor

    def __repr__(self) -> str:
        return (f"Program(entry={self.entry!r}, rank={self.rank}, coords={self.rank_coords}, "
                f"inputs={[t.name for t in self.inputs]}, outputs={[t.name for t in self.outputs]})")

    def run(self, local_inputs) -> list:
        """Run the schedule on this rank's input shards; returns its output
        shards (one array per `outputs` entry, of its `local_shape`)."""
        return self._executor.run(list(local_inputs))

    def shard_inputs(self, global_inputs) -> list:
        """This rank's local shards of full (global) input arrays, following
        each input's `sharding`. Inputs that are partial sums cannot be
        derived from a global value and are rejected."""
        if len(global_inputs) != len(self.inputs):
            raise InputError(f"expected {len(self.inputs)} inputs "
                             f"({', '.join(s.name for s in self.inputs)}), got {len(global_inputs)}")
        out = []
        for spec, arr in zip(self.inputs, global_inputs):
            if tuple(arr.shape) != spec.global_shape:
                raise InputError(f"input '{spec.name}': expected global shape "
                                 f"{list(spec.global_shape)}, got {list(arr.shape)}")
            if spec.sharding.partial:
                raise InputError(f"input '{spec.name}' is partial over "
                                 f"{list(spec.sharding.partial)}; pass its local value to run()")
            out.append(arr[self.mesh.local_slices(spec.global_shape, spec.sharding.dims, self.rank)])
        return out


def _default_communicators(mesh: MeshInfo, use_mpi: bool | None, nccl: bool = False):
    """(rank, per-axis communicators) for this process: MPI, or NCCL
    (bootstrapped over MPI) for device buffers."""
    if use_mpi is None:
        use_mpi = mesh.num_devices > 1
    if not use_mpi:
        rank, size = world()
        if size != 1 or mesh.num_devices != 1:
            raise MeshError(f"mesh '{mesh.name}' has {mesh.num_devices} devices but this is "
                            f"rank {rank} of a {size}-process job without MPI; run the "
                            f"program with `mpiexec -n {mesh.num_devices}`")
        rank = mesh.devices[0]   # the one process plays the one device
        return rank, {axis: SelfCommunicator() for axis in mesh.axes}
    from . import mpi_comm                     # lazy: initializes MPI
    comm = mpi_comm.MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if sorted(mesh.devices) != list(range(size)):
        raise MeshError(f"mesh '{mesh.name}' has devices {list(mesh.devices)} but the MPI job "
                        f"has {size} ranks; run with `mpiexec -n {mesh.num_devices}`")
    if nccl:
        from . import nccl_comm
        return rank, nccl_comm.make_axis_communicators(mesh, comm)
    return rank, mpi_comm.make_axis_communicators(mesh, comm)


def load_bundle(path, *, engine: Engine | str | None = None,
                communicators: dict | None = None, rank: int | None = None,
                use_mpi: bool | None = None) -> Program:
    """Load the bundle directory at `path` for this process.

    engine:        an Engine instance or name; default: manifest `engine`
                   (a GPU bundle runs on `cuda-emulated` with TESSERA_CUDA_EMULATE=1).
    communicators: {axis: Communicator} to use instead of MPI (then `rank` is
                   this process' world rank, default from `world()`).
    use_mpi:       force (True) or forbid (False) MPI; default: MPI iff the
                   mesh has more than one device.
    """
    bundle = read_bundle(path)
    mesh = bundle.program.mesh
    if engine is None and bundle.manifest.engine == "cuda" and \
            os.environ.get("TESSERA_CUDA_EMULATE", "") not in ("", "0"):
        engine = "cuda-emulated"
    if engine is None or isinstance(engine, str):
        engine = get_engine(engine or bundle.manifest.engine)
    if communicators is None:
        rank, communicators = _default_communicators(mesh, use_mpi, nccl=engine.name == "cuda")
    elif rank is None:
        rank = world()[0]
    mesh.coords(rank)   # fail early if this rank is not part of the mesh

    if any(ins.op == "launch" for ins in bundle.program.instructions):
        lib = bundle.kernel_library(engine.name)
        if lib is None:
            raise BundleError(f"{bundle.manifest.path}: field 'kernels.{engine.name}': "
                              f"missing, but the program launches kernels")
        if not lib.is_file():
            raise BundleError(f"{bundle.manifest.path}: field 'kernels.{engine.name}': "
                              f"kernel library not found: {lib}")
        engine.load_kernels(lib, bundle.manifest.raw.get("launch"))
    return Program(bundle, ScheduleExecutor(bundle.program, engine, communicators), rank)
