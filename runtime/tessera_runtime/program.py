"""A loaded bundle bound to this process' place in the mesh (`Program`),
and `load_bundle`, which makes one (re-exported by the package)."""

from __future__ import annotations

from . import env
from .bundle import Bundle, BundleError, TensorSpec, read_bundle
from .comm import SelfCommunicator
from .engines import Engine, get_engine
from .executor import InputError, ScheduleExecutor
from .mesh import MeshError, MeshInfo


def _world() -> tuple[int, int]:
    # The package's `world`, looked up at each call (tests replace it).
    from . import world
    return world()


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

    def run(self, local_inputs, device_outputs: bool = False, donate: bool = False) -> list:
        """Run the schedule on this rank's input shards; returns its output
        shards (one array per `outputs` entry, of its `local_shape`).

        device_outputs: return the engine's own buffers (cupy arrays on the
        `cuda` engine; bf16 as its uint16 bits) instead of host copies. Such
        buffers are accepted back as inputs and copied on the device, not
        across the bus: a training loop that feeds its state back never moves
        it to the host (on an H100 the example GPT's step spent 68% of its
        time in those copies).

        donate: the inputs that already are the engine's buffers (device
        arrays a run returned; on the CPU engine, C-contiguous writeable numpy
        arrays of the input's dtype) become the program's buffers without a
        copy, as JAX's donated arguments do. The program may overwrite them:
        do not read a donated array after the call. Without it every input is
        copied first (on an H200 the resident GPT step spent 19% of its time
        copying its state on the device)."""
        return self._executor.run(list(local_inputs), device_outputs, donate)

    @property
    def engine(self) -> Engine:
        """The engine this program runs on: `engine.from_host(a)` puts an
        array on its device once, for runs that keep their state there."""
        return self._executor.engine

    @property
    def memory(self) -> dict | None:
        """The last run's bytes on this rank: {"peak_bytes", "end_bytes"}
        (its inputs and every buffer the schedule allocates), and
        "borrowed_bytes": the inputs it read from the caller's arrays in place
        (counted in the peak, allocated by the caller)."""
        return self._executor.memory

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


def _default_communicators(mesh: MeshInfo, use_mpi: bool | None, nccl: bool = False,
                           sub_axes=()):
    """(rank, per-axis communicators) for this process: MPI, or NCCL
    (bootstrapped over MPI) for device buffers."""
    if use_mpi is None:
        use_mpi = mesh.num_devices > 1
    if not use_mpi:
        rank, size = _world()
        if size != 1 or mesh.num_devices != 1:
            raise MeshError(f"mesh '{mesh.name}' has {mesh.num_devices} devices but this is "
                            f"rank {rank} of a {size}-process job without MPI; run the "
                            f"program with `mpiexec -n {mesh.num_devices}`")
        rank = mesh.devices[0]   # the one process plays the one device
        comms = {axis: SelfCommunicator() for axis in list(mesh.axes) + list(sub_axes)}
        for axis, comm in comms.items():
            comm.name_group(axis, rank, [rank])
        return rank, comms
    from . import axis_comms                   # lazy: initializes MPI
    comm = axis_comms.MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if sorted(mesh.devices) != list(range(size)):
        raise MeshError(f"mesh '{mesh.name}' has devices {list(mesh.devices)} but the MPI job "
                        f"has {size} ranks; run with `mpiexec -n {mesh.num_devices}`")
    if nccl:
        from . import nccl_comm
        return rank, nccl_comm.make_axis_communicators(mesh, comm, sub_axes)
    return rank, axis_comms.make_axis_communicators(mesh, comm, sub_axes)


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
    if engine is None and bundle.manifest.engine == "cuda" and env.flag("TESSERA_CUDA_EMULATE"):
        engine = "cuda-emulated"
    if engine is None or isinstance(engine, str):
        engine = get_engine(engine or bundle.manifest.engine)
    if communicators is None:
        rank, communicators = _default_communicators(mesh, use_mpi, nccl=engine.name == "cuda",
                                                     sub_axes=bundle.program.sub_axes)
    elif rank is None:
        rank = _world()[0]
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
