"""Device meshes, ShardSpecs and distributed tensors: the data `tessera.dist`
(the namespace, which adds what needs the tracer and the compiler) exports,
below the tracer so that it, the compiler and the collectives can take them.

    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    W1 = dist.from_numpy(w1, layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)

A program runs as one process per device (rank r is device r), started with
`tessera launch -n N script.py` or `mpiexec -n N`. Every process runs the same
script; a DTensor holds this rank's shard of the global tensor.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from tessera_runtime import env, flight, world
from tessera_runtime.errors import in_tessera
from tessera_runtime.mesh import MeshError, MeshInfo

from ._checks import is_int, is_number
from ._context import simulation, trace_state
from ._mpi import bcast_text, exchange, listed, raw_view, world_comm
from ._pytree import flatten, paths, unflatten
from ._source import SourceLine, assigned_name, user_frame
from .dtypes import SUPPORTED_DTYPES, as_dtype
from .errors import ArgumentError, LaunchError, ShardingError


def _balanced_shape(n: int, k: int) -> tuple[int, ...]:
    """Splits n devices into k axes as evenly as possible, larger axes first:
    16 over 2 axes is 4 x 4, 48 over 3 is 4 x 4 x 3."""
    shape = []
    for i in range(k):
        left = k - i
        if left == 1:
            shape.append(n)
            break
        target = n ** (1.0 / left)
        size = next(d for d in range(max(1, math.ceil(target - 1e-9)), n + 1) if n % d == 0)
        shape.append(size)
        n //= size
    return tuple(shape)


class Mesh:
    """A Cartesian mesh of devices with named axes.

    `devices` is a range or flat list (the shape is then `shape=`, or an even
    split over the axes) or a nested list whose nesting gives the shape
    (`[[0, 1], [2, 3]]` is 2 x 2).
    """

    def __init__(self, axes, devices=None, shape=None, name: str = "mesh"):
        axes = [axes] if isinstance(axes, str) else list(axes) \
            if hasattr(axes, "__iter__") else axes
        if not isinstance(axes, list) or not all(isinstance(a, str) and a for a in axes):
            raise ArgumentError(f"dist.Mesh: axes={axes!r} must be a list of axis names "
                                f"(non-empty strs), e.g. axes=[\"dp\", \"tp\"]  [{user_frame()}]")
        if not axes:
            raise ArgumentError(f"dist.Mesh: axes=[]: a mesh needs at least one axis  "
                                f"[{user_frame()}]")
        if shape is not None and (not hasattr(shape, "__iter__")
                                  or not all(is_int(n) for n in shape)):
            raise ArgumentError(f"dist.Mesh: shape={shape!r} must be a tuple of axis sizes "
                                f"(ints), one per axis  [{user_frame()}]")
        if devices is not None and not isinstance(devices, (range, list, tuple)):
            raise ArgumentError(f"dist.Mesh: devices={devices!r:.60} must be a range or a (nested) "
                                f"list of ranks  [{user_frame()}]")
        try:
            if devices is None:
                devices = range(math.prod(shape)) if shape else range(world()[1])
            devices = list(devices) if isinstance(devices, range) else devices
            nested = bool(devices) and isinstance(devices[0], (list, tuple, range))
            if not nested and shape is None:
                shape = _balanced_shape(len(devices), len(axes))
            self._info = MeshInfo(axes, shape=shape, devices=devices, name=name)
        except MeshError as e:
            raise ArgumentError(f"dist.Mesh: {e}  [{user_frame()}]") from None
        #: where the user made it (named by errors about the default mesh)
        self.source = user_frame()
        if not in_tessera(sys._getframe(1)):
            make_default(self)          # the default mesh of eager collectives now
        rank, size = world()
        if size > 1:
            install_abort_on_error()
            # The flight recorder (and its watchdog) from now on, so that a
            # rank stuck before its first collective still answers the
            # launcher's request for records ("never started it", not silence).
            if "world" not in flight.RECORDER.groups:
                flight.RECORDER.join("world", rank, list(range(size)))

    # -- the default mesh ------------------------------------------------------
    def __enter__(self) -> "Mesh":
        """`with mesh:` makes it the mesh of eager collectives (and
        `ts.mesh.current()`) inside the block."""
        _entered().append(self)
        return self

    def __exit__(self, *exc) -> bool:
        _entered().pop()
        return False

    # -- descriptions -------------------------------------------------------
    @property
    def axes(self) -> tuple[str, ...]:
        return self._info.axes

    @property
    def shape(self) -> dict[str, int]:
        return dict(zip(self._info.axes, self._info.shape))

    @property
    def size(self) -> int:
        return self._info.num_devices

    @property
    def device_ids(self) -> list[int]:
        return list(self._info.devices)

    @property
    def name(self) -> str:
        return self._info.name

    @property
    def info(self) -> MeshInfo:
        return self._info

    @property
    def topology(self) -> str:
        """`tp mesh, 2` or `tp × dp mesh, 4 × 4`."""
        return (" × ".join(self.axes) + " mesh, "
                + " × ".join(str(s) for s in self._info.shape))

    def axis_size(self, axis: str) -> int:
        try:
            return self._info.axis_size(axis)
        except MeshError as e:
            raise ShardingError(f"{e}  [{user_frame()}]") from None

    @property
    def rank(self) -> int | None:
        """This process' world rank when the running job is this mesh; None otherwise
        (e.g. a single process looking at a 2-device mesh, as `graph.trace` does).
        Not readable inside a compiled function: see `_refuse_while_tracing`."""
        _refuse_while_tracing("rank")
        return self._process_rank()

    def _process_rank(self) -> int | None:
        state = trace_state()
        if state is not None and state.local and state.mesh == self:
            # Per-rank code: the rank its body is traced for (local_view
            # traces it for every rank when it reads the rank).
            state.read_rank = True
            if state.rank is not None:
                return state.rank
        return self._job_rank()

    def _job_rank(self) -> int | None:
        """This process' world rank when the running job is this mesh."""
        rank, size = world()
        if size == self.size and rank in self._info.devices:
            return rank
        return None

    def require_rank(self, what: str) -> int:
        if simulation() is not None:
            return 0            # `tessera simulate`: this process stands for every rank
        rank, size = world()
        if self._process_rank() is None:
            raise LaunchError(
                f"{what} needs the {self.topology} to run as {self.size} processes, but this "
                f"process is rank {rank} of {size}; start the script with "
                f"`tessera launch -n {self.size} SCRIPT` (or `mpiexec -n {self.size} python "
                f"SCRIPT`)  [{user_frame()}]")
        return self._process_rank()

    @property
    def coords(self) -> dict[str, int] | None:
        """This process' coordinate on each axis, e.g. {"dp": 1, "tp": 0}
        (None when this process is not a device of the running mesh)."""
        _refuse_while_tracing("coords")
        rank = self._process_rank()
        return None if rank is None else dict(zip(self.axes, self._info.coords(rank)))

    def submesh(self, *axes: str, rank: int | None = None) -> "Mesh":
        """The mesh along `axes` through `rank` (default: this process): the
        devices that share its coordinates on every other axis, e.g. the tp
        group of a dp x tp mesh is `mesh.submesh("tp")`."""
        for a in axes:
            if a not in self.axes:
                raise ShardingError(f"Mesh.submesh: axis {a!r} is not in the {self.topology} "
                                    f"(axes: {', '.join(self.axes)})  [{user_frame()}]")
        rank = self.require_rank("Mesh.submesh") if rank is None else rank
        base = self._info.coords(rank)
        keep = [self.axes.index(a) for a in axes]
        devices = []
        for r in self.device_ids:
            c = self._info.coords(r)
            if all(c[i] == base[i] for i in range(len(self.axes)) if i not in keep):
                devices.append(r)
        return Mesh(list(axes), devices=devices, shape=[self.axis_size(a) for a in axes],
                    name=f"{self.name}_{'_'.join(axes)}")

    def __repr__(self) -> str:
        return f"Mesh(axes={list(self.axes)}, shape={list(self._info.shape)})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and self._info == other._info

    def __hash__(self) -> int:
        # (Cached: a compiled call hashes the mesh of every DTensor argument.)
        h = self.__dict__.get("_hash")
        if h is None:
            h = self._hash = hash((self.axes, self._info.shape, self._info.devices))
        return h


#: the mesh the user made last (ts.mesh.auto included): the default mesh
_CREATED: list = []
_with = threading.local()


def _entered() -> list:
    if not hasattr(_with, "meshes"):
        _with.meshes = []
    return _with.meshes


def make_default(mesh: "Mesh") -> None:
    """`mesh` is the mesh made last (see default_mesh)."""
    _CREATED[:] = [mesh]


def default_mesh() -> "Mesh | None":
    """The mesh an eager collective (and `ts.mesh.current()` outside a
    compiled function) uses when none is given: the innermost `with mesh:`,
    else the mesh the user made last, else None. Running a compiled function
    on another mesh does not change it."""
    entered = _entered()
    if entered:
        return entered[-1]
    return _CREATED[0] if _CREATED else None


def default_origin(mesh: "Mesh") -> str:
    """How the default mesh `mesh` came to be the default, for errors: `(the
    mesh made last, at train.py:12)`."""
    how = "the mesh of the enclosing `with mesh:`" if _entered() and _entered()[-1] is mesh \
        else "the mesh made last"
    return f"({how}, at {mesh.source})"


def auto_mesh(axes=("dp",), shape=None, name: str = "mesh") -> Mesh:
    """A mesh over every rank of the running job. With several axes and no
    `shape`, the ranks are split as evenly as possible (larger axes first).
    Like a Mesh the user makes, it becomes the default mesh (see current_mesh)."""
    axes = [axes] if isinstance(axes, str) else list(axes)
    mesh = Mesh(axes=axes, devices=range(world()[1]), shape=shape, name=name)
    make_default(mesh)
    return mesh


def current_mesh() -> Mesh:
    """The mesh of the function being traced; outside tracing, the default
    mesh (the innermost `with mesh:`, else the mesh made last, by
    `dist.Mesh(...)` or `auto`); with none made, `auto()`."""
    state = trace_state()
    if state is not None:
        return state.mesh
    return default_mesh() or auto_mesh()


def world_size() -> int:
    """How many processes this job runs (1 for a plain `python script.py`):
    what a script sizes its mesh from, e.g. `shape=(dist.world_size() // tp, tp)`."""
    return world()[1]


def _refuse_while_tracing(what: str) -> None:
    """A compiled (global-view) function is one program for every rank, so
    its Python code must not see which rank runs it: a branch on the rank
    would trace a different program on each rank (see _rank_agreement)."""
    state = trace_state()
    if state is None or state.local:      # per-rank code may ask (see local_view)
        return
    from tessera_mlir import ir
    name = ir.StringAttr(state.func.attributes["sym_name"]).value
    raise ShardingError(
        f"mesh.{what} read at {user_frame()} while compiling {name}: a compiled function is "
        "one program for the whole mesh (the global view), so it cannot depend on which rank "
        "runs it. Give each rank its part through layouts (dist.ShardSpec on the arguments, "
        "ts.distribute strategies) and let the compiler insert the collectives; read the rank "
        "outside the compiled function for rank-specific Python work (logging, files).")


@dataclass(frozen=True)
class ShardSpec:
    """How a tensor is laid out over a mesh.

    `partition[i]` names a tensor dimension ("row" = second-to-last, "col" = last,
    or an integer index) that is split over mesh axis `mesh_axes[i]`. A
    dimension may be split over several axes (outermost first). Empty: replicated.
    `partial` lists axes over which the value is a pending sum.
    """

    partition: tuple = ()
    mesh_axes: tuple = ()
    partial: tuple = ()

    def __post_init__(self):
        for name in ("partition", "mesh_axes", "partial"):
            value = getattr(self, name)
            if isinstance(value, (str, int)):
                value = (value,)
            if not hasattr(value, "__iter__"):
                raise ArgumentError(f"ShardSpec: {name}={value!r:.60} must be a tuple  "
                                    f"[{user_frame()}]")
            object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "_dims_by", {})     # dims_for's answers, by (rank, mesh axes)
        if len(self.partition) != len(self.mesh_axes):
            raise ShardingError(f"ShardSpec: partition {self.partition} and mesh_axes "
                                f"{self.mesh_axes} must have the same length (one mesh axis "
                                f"per split dimension)  [{user_frame()}]")
        # (Each entry is checked against the tensor and the mesh it lays
        # out, in dims_for: the error then names the tensor.)

    @staticmethod
    def replicated() -> "ShardSpec":
        return ShardSpec()

    def dims_for(self, rank: int, mesh: Mesh, what: str = "tensor") -> list[tuple[str, ...]]:
        """Mesh axes splitting each of a rank-`rank` tensor's dimensions
        (errors name the tensor as `what`)."""
        # Every result of a compiled call is a DTensor that asks this, many
        # times a step: cached per (rank, axes).
        key = (rank, mesh.axes)
        dims = self._dims_by.get(key)
        if dims is None:
            dims = self._dims_by[key] = self._dims(rank, mesh, what)
        return list(dims)

    def _dims(self, rank: int, mesh: Mesh, what: str) -> tuple[tuple[str, ...], ...]:
        dims: list[list[str]] = [[] for _ in range(rank)]
        used = set()
        for part, axis in zip(self.partition, self.mesh_axes):
            if axis not in mesh.axes:
                raise ShardingError(f"{what}: mesh axis {axis!r} is not in the {mesh.topology} "
                                    f"(axes: {', '.join(mesh.axes)})  [{user_frame()}]")
            if axis in used:
                raise ShardingError(f"{what}: mesh axis {axis!r} is used twice in {self}  "
                                    f"[{user_frame()}]")
            used.add(axis)
            dims[self._dim_index(part, rank, what)].append(axis)
        for axis in self.partial:
            if axis not in mesh.axes or axis in used:
                raise ShardingError(f"{what}: partial axis {axis!r} must be a mesh axis not "
                                    f"used to split a dimension (the {mesh.topology}'s axes: "
                                    f"{', '.join(mesh.axes)})  [{user_frame()}]")
        return tuple(tuple(d) for d in dims)

    @staticmethod
    def _dim_index(part, rank: int, what: str) -> int:
        if part == "row":
            if rank < 2:
                raise ShardingError(f"{what}: partition entry 'row' names the second-to-last "
                                    f"dimension, but the tensor has rank {rank} (a vector has "
                                    f"only 'col', or dimension 0)  [{user_frame()}]")
            index = rank - 2
        elif part == "col":
            index = rank - 1
        elif is_int(part):
            index = part if part >= 0 else rank + part
        else:
            raise ShardingError(f"{what}: partition entry {part!r} must be 'row', 'col' or a "
                                f"dimension index  [{user_frame()}]")
        if not 0 <= index < rank:
            raise ShardingError(f"{what}: partition entry {part!r} names dimension {index}, "
                                f"but the tensor has rank {rank}  [{user_frame()}]")
        return index

    @staticmethod
    def from_dims(dims, partial=()) -> "ShardSpec":
        partition, axes = [], []
        for d, names in enumerate(dims):
            for a in names:
                partition.append(d)
                axes.append(a)
        return ShardSpec(tuple(partition), tuple(axes), tuple(partial))


def check_divisible(shape, dims, mesh: Mesh, what: str, where: SourceLine | None) -> None:
    for d, (size, axes) in enumerate(zip(shape, dims)):
        parts = math.prod(mesh.axis_size(a) for a in axes)
        if size % parts:
            axis_text = " × ".join(f"'{a}' (size {mesh.axis_size(a)})" for a in axes)
            raise ShardingError(f"{what}: dimension {d} (size {size}) is not divisible by mesh "
                                f"axis {axis_text}" + (f"  [{where}]" if where else ""))


class DTensor:
    """A tensor distributed over a mesh: its global shape and layout, and this
    rank's local shard."""

    #: (axis, ranks): held only by the ranks at those coordinates of mesh
    #: axis `axis` (a pipeline stage's parameter, `held_by`); elsewhere its
    #: local shard is a `tessera_runtime.Absent`. None: by every rank.
    held = None

    def __init__(self, local: np.ndarray | None, shape, dtype, layout: ShardSpec, mesh: Mesh,
                 name: str | None = None, global_value: np.ndarray | None = None):
        self._local = local
        self._global = global_value
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.layout = layout
        self.mesh = mesh
        self.name = name
        self.dims = layout.dims_for(len(self.shape), mesh, name or "tensor")

    @classmethod
    def with_dims(cls, local: np.ndarray, shape: tuple, layout: ShardSpec, mesh: Mesh,
                name: str, dims) -> "DTensor":
        """A DTensor of `local` whose layout's `dims` over `mesh` are known
        (`layout.dims_for`): a compiled call's result. Why not __init__: a
        call makes one per result, and __init__'s conversions and lookups
        would be repeated for each."""
        t = cls.__new__(cls)
        t._local, t._global, t.shape, t.dtype = local, None, shape, local.dtype
        t.layout, t.mesh, t.name, t.dims = layout, mesh, name, list(dims)
        return t

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def local_shape(self) -> tuple[int, ...]:
        return self.mesh.info.local_shape(self.shape, self.dims)

    def local(self) -> np.ndarray:
        """This rank's shard."""
        if self._local is None:
            self.mesh.require_rank(f"DTensor '{self.name or 'tensor'}'.local()")
        return self._local

    def block(self, rank: int) -> np.ndarray:
        """Mesh rank `rank`'s shard, from any process that holds the global
        value (a tensor from `from_numpy`, e.g. in one process compiling for
        a multi-rank job); this rank's shard otherwise."""
        if rank not in self.mesh.info.devices:
            raise ArgumentError(f"DTensor '{self.name or 'tensor'}'.block: rank {rank!r} is not a "
                                f"rank of the {self.mesh.topology} (ranks: "
                                f"{', '.join(map(str, self.mesh.device_ids))})  [{user_frame()}]")
        if self._global is None:
            own = self.mesh._process_rank()
            if rank != own:
                held = f"only rank {own}'s shard" if own is not None else "a shard"
                raise ShardingError(f"DTensor '{self.name or 'tensor'}': this process holds "
                                    f"{held}, not the global value that rank {rank}'s block "
                                    "is cut from (make it with dist.from_numpy)")
            return self.local()
        index = self.mesh.info.local_slices(self.shape, self.dims, rank)
        return summand(np.array(self._global[index], order="C"), self.layout, self.mesh, rank)

    def numpy(self) -> np.ndarray:
        """The global value, on every rank (a collective when the tensor is split
        or partial: every rank of the mesh must call it)."""
        if self.held is not None:
            axis, ranks = self.held
            raise ShardingError(f"DTensor '{self.name or 'tensor'}' is held by the ranks at "
                                f"{axis} = {', '.join(map(str, ranks))} only (a pipeline "
                                f"stage's); read its shard with .local() there  "
                                f"[{user_frame()}]")
        if self._local is None:
            if self._global is not None:
                return self._global.copy()
            self.mesh.require_rank(f"DTensor '{self.name or 'tensor'}'.numpy()")
        if all(not d for d in self.dims) and not self.layout.partial:
            return self._local.copy()
        return _assemble(self)

    def __array__(self, dtype=None, copy=None):
        value = self.numpy()
        return value if dtype is None else value.astype(dtype)

    def item(self):
        """The value of a one-element tensor as a Python number."""
        return self.numpy().item()

    def __float__(self) -> float:
        return float(self.item())

    def redistribute(self, layout: ShardSpec) -> "DTensor":
        """This tensor in another layout, moved by the cheapest collectives the
        partitioner knows (a local slice, all_to_all, reduce_scatter,
        all_reduce, all_gather). Every rank of the mesh must call it."""
        # A back edge (see test/test_layers.py): moving a DTensor runs a
        # compiled program, and the compiler takes DTensors.
        from .compiler import reshard
        return reshard(self, layout)

    def replicate(self) -> "DTensor":
        """The whole value on every rank (pending sums reduced)."""
        return self.redistribute(ShardSpec())

    def shard(self, dim, axis: str) -> "DTensor":
        """Split along `dim` ("row", "col" or an index) over mesh axis `axis`,
        every other dimension replicated."""
        return self.redistribute(ShardSpec((dim,), (axis,)))

    @property
    def nbytes(self) -> int:
        """Bytes of this rank's shard (what the tensor costs each rank)."""
        if self.held is not None and not self.holds():
            return 0
        return math.prod(self.local_shape) * self.dtype.itemsize

    def holds(self) -> bool:
        """Whether this rank holds its shard (False only for a tensor
        `held_by` other ranks)."""
        return self.held is None or self.mesh.coords[self.held[0]] in self.held[1]

    def __repr__(self) -> str:
        held = "" if self.held is None else \
            f", held by {self.held[0]} = {', '.join(map(str, self.held[1]))}"
        return (f"DTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, "
                f"layout={describe_layout(self.dims, self.layout.partial)}{held}, "
                f"mesh={self.mesh.topology!r})")


def held_by(local, shape, dtype, layout: ShardSpec, mesh: Mesh, name: str, axis: str,
            ranks, dims=None) -> DTensor:
    """A DTensor that only the ranks at coordinates `ranks` of mesh axis
    `axis` hold (those pass their shard as `local`, of `layout`; the others
    None): a pipeline stage's parameter, which only its stage's ranks read.
    Elsewhere its local shard is a `tessera_runtime.Absent` that a compiled
    call skips when this rank's program does not read it and refuses when
    it does. No collective: each rank makes its own. `dims`: the layout's
    (`layout.dims_for`), when the caller has them (a compiled call's
    results), and a `local` that already is an Absent is kept."""
    from tessera_runtime import Absent
    ranks = tuple(sorted(ranks))
    dims = layout.dims_for(len(shape), mesh, name) if dims is None else dims
    if mesh.coords[axis] not in ranks and not isinstance(local, Absent):
        local = Absent(mesh.info.local_shape(tuple(shape), dims), dtype,
                       f"'{name}' is held by the ranks at {axis} = "
                       f"{', '.join(map(str, ranks))} only (a pipeline stage's: a step "
                       f"pipelined over '{axis}' reads it there; one that is not reads it "
                       "on every rank)")
    t = DTensor.with_dims(local, tuple(shape), layout, mesh, name, dims)
    t.dtype, t.held = np.dtype(dtype), (axis, ranks)
    return t


def describe_layout(dims, partial=()) -> str:
    text = "[" + ", ".join("*".join(d) if d else "-" for d in dims) + "]"
    return text + (f" partial({', '.join(partial)})" if partial else "")


def _assemble(t: DTensor) -> np.ndarray:
    """Gathers every rank's shard (MPI Allgather on raw buffers) into the global value."""
    comm = world_comm()
    local = np.array(t._local, order="C")
    # Every rank there, with the same tensor, before MPI pairs the blocks.
    call = f"DTensor.numpy() of a {t.dtype.name} {list(t.shape)} {describe_layout(t.dims, t.layout.partial)}"
    exchange(comm, b"", call, f"{call} ({t.name or 'unnamed'}) at {user_frame()}")
    parts = np.empty((comm.Get_size(),) + local.shape, dtype=local.dtype)
    comm.Allgather(raw_view(local), raw_view(parts))
    out = np.zeros(t.shape, dtype=t.dtype)
    info = t.mesh.info
    partial = [info.axis_index(a) for a in t.layout.partial]
    done = set()
    for rank in t.mesh.device_ids:
        index = info.local_slices(t.shape, t.dims, rank)
        key = tuple((s.start, s.stop) for s in index)
        if key in done:
            continue
        done.add(key)
        if not partial:
            out[index] = parts[rank]
            continue
        # A pending sum: add the summands of the ranks that differ from this one
        # only along the partial axes.
        base = info.coords(rank)
        members = [r for r in t.mesh.device_ids
                   if all(c == b for i, (c, b) in enumerate(zip(info.coords(r), base))
                          if i not in partial)]
        out[index] = np.sum([parts[r] for r in members], axis=0, dtype=t.dtype)
    return out


def from_numpy(array, layout: ShardSpec | None = None, mesh: Mesh | None = None,
               name: str | None = None, src: int | None = None) -> DTensor:
    """Distributes a numpy array over `mesh`: the same global value on every
    rank, or with `src=r` only rank r's (the others pass None), which sends
    each rank its own block and nothing more."""
    where = user_frame()
    name = name or assigned_name(where) or "tensor"
    if mesh is None:
        raise ShardingError(f"{name}: dist.from_numpy needs mesh=  [{where}]")
    check_mesh("dist.from_numpy", mesh, where)
    layout = layout or ShardSpec()
    if not isinstance(layout, ShardSpec):
        raise ArgumentError(f"{name}: dist.from_numpy's layout is a {type(layout).__name__} "
                            f"({layout!r:.40}), not a dist.ShardSpec  [{where}]")
    if src is not None:
        return _from_rank(array, layout, mesh, name, src, where)
    array = _numbers("dist.from_numpy", "array", array, where)
    dims = layout.dims_for(array.ndim, mesh, name)
    check_divisible(array.shape, dims, mesh, name, where)
    rank = mesh._process_rank()
    if rank is None:
        # Not running on this mesh (a single process inspecting it): keep the value.
        return DTensor(None, array.shape, array.dtype, layout, mesh, name, global_value=array)
    # np.array, not np.ascontiguousarray: the latter turns 0-d arrays into 1-d.
    local = np.array(array[mesh.info.local_slices(array.shape, dims, rank)], order="C")
    return DTensor(summand(local, layout, mesh, rank), array.shape, array.dtype, layout, mesh, name)


def check_mesh(what: str, mesh, where: SourceLine | None = None) -> None:
    """`mesh=` of `what` must be a Mesh."""
    if not isinstance(mesh, Mesh):
        raise ArgumentError(f"{what}: mesh= is a {type(mesh).__name__} ({mesh!r:.40}); mesh= "
                            f"must be a dist.Mesh  [{where or user_frame()}]")


def _numbers(what: str, param: str, array, where) -> np.ndarray:
    """`array` as a numpy array of a dtype tensors can have (not strings,
    objects or complex numbers: a misused argument)."""
    out = np.asarray(array)
    if out.dtype.kind in "OSUMmc":
        raise ArgumentError(f"{what}: {param} is a {type(array).__name__} of dtype {out.dtype} "
                            f"({array!r:.40}); a tensor holds numbers ("
                            f"{SUPPORTED_DTYPES})  [{where}]")
    return out


def summand(block: np.ndarray, layout: ShardSpec, mesh: Mesh, rank: int) -> np.ndarray:
    """Rank `rank`'s share of a value laid out `layout`: its block, except
    that a partial value (a pending sum over the partial axes) is the block
    on the ranks at coordinate 0 of every partial axis and zeros on the
    others, so that the sum is the value."""
    if not layout.partial:
        return block
    coords = mesh.info.coords(rank)
    if any(coords[mesh.info.axis_index(a)] for a in layout.partial):
        return np.zeros_like(block)
    return block


def _from_rank(array, layout: ShardSpec, mesh: Mesh, name: str, src: int,
               where: SourceLine) -> DTensor:
    """`from_numpy(array, src=src)`: rank `src` cuts the blocks and sends each
    rank its own (point-to-point, raw bytes); the shape and dtype travel first."""
    rank = mesh.require_rank(f"dist.from_numpy({name}, src={src})")
    if src not in mesh.device_ids:
        raise ShardingError(f"{name}: src={src} is not a rank of the {mesh.topology}  [{where}]")
    comm = world_comm()
    header = ""
    if rank == src:
        array = _numbers("dist.from_numpy", "array", array, where)
        header = f"{array.dtype.name}|{','.join(map(str, array.shape))}"
    dtype_name, _, dims_text = bcast_text(
        comm, header, root=src, what=f"dist.from_numpy({name}, src={src})").partition("|")
    dtype = np.dtype(dtype_name)        # bfloat16 too: .dtypes registered ml_dtypes
    shape = tuple(int(d) for d in dims_text.split(",") if d)
    dims = layout.dims_for(len(shape), mesh, name)
    check_divisible(shape, dims, mesh, name, where)
    local = np.empty(mesh.info.local_shape(shape, dims), dtype)
    if rank == src:
        for r in mesh.device_ids:
            block = summand(np.ascontiguousarray(array[mesh.info.local_slices(shape, dims, r)]),
                             layout, mesh, r)
            if r == src:
                local[...] = block
            else:
                comm.Send(raw_view(block), dest=r, tag=17)
    else:
        comm.Recv(raw_view(local), source=src, tag=17)
    return DTensor(local, shape, dtype, layout, mesh, name)


def from_local(x, axis="dp", dim: int = 0, mesh: Mesh | None = None,
               name: str | None = None) -> DTensor:
    """The global tensor whose blocks along `axis` are every rank's `x`, laid
    side by side along dimension `dim` in the axis' rank order: data
    parallelism from per-rank batches (each rank loads its own), as JAX's
    `make_array_from_process_local_data`. `axis` is a mesh axis or a tuple of
    them (the dimension split over each, outermost first); along the mesh's
    other axes the ranks must pass the same `x` (a compiled call checks it).
    `mesh` defaults to the default mesh (`ts.mesh.current()`). Collective:
    every rank of the mesh calls it; the ranks check that their blocks'
    shapes and dtypes agree (under TESSERA_COLLECTIVE_TIMEOUT)."""
    where = user_frame()
    name = name or assigned_name(where) or "tensor"
    placed = local_blocks([(name, x)], axis, dim, mesh, "dist.from_local", where)
    return placed[0]


def local_blocks(named, axis, dim: int, mesh: Mesh | None, what: str,
                 where: SourceLine) -> list[DTensor]:
    """`from_local` of each (name, array) of `named`, with one agreement
    between the ranks for all of them."""
    if mesh is not None:
        check_mesh(what, mesh, where)
    if not isinstance(axis, str) and not (isinstance(axis, (tuple, list)) and axis
                                          and all(isinstance(a, str) for a in axis)):
        raise ArgumentError(f"{what}: axis {axis!r} must be a mesh axis name or a tuple of "
                            f"them  [{where}]")
    given, mesh = mesh is not None, mesh or current_mesh()
    axes = (axis,) if isinstance(axis, str) else tuple(axis)
    for a in axes:
        if a not in mesh.axes:
            which = f"the {mesh.topology}" if given else \
                f"the default mesh, {mesh.topology} {default_origin(mesh)}"
            raise ShardingError(f"{what}: axis {a!r} is not in {which} (axes: "
                                f"{', '.join(mesh.axes)}); pass mesh=  [{where}]")
    mesh.require_rank(what)
    parts = math.prod(mesh.axis_size(a) for a in axes)
    out, mine = [], []
    for name, x in named:
        x = _numbers(what, f"{name} (x)" if len(named) > 1 else "x", x, where)
        if not -x.ndim <= dim < x.ndim:
            raise ShardingError(f"{what}: {name} is {list(x.shape)}, which has no dimension "
                                f"{dim} to lay the ranks' blocks along  [{where}]")
        d = dim % x.ndim
        shape = x.shape[:d] + (x.shape[d] * parts,) + x.shape[d + 1:]
        layout = ShardSpec((d,) * len(axes), axes)
        local = np.array(x, order="C")
        out.append(DTensor(local, shape, x.dtype, layout, mesh, name))
        mine.append((f"{name}: " if len(named) > 1 else "") + f"{x.dtype.name} {list(x.shape)}")
    if mesh.size > 1:
        text = "; ".join(mine).encode()
        every = exchange(world_comm(), text, f"{what} over {axes}",
                         f"{what}(axis={axis!r}) at {where}")
        if len(set(every)) > 1:
            holders: dict = {}
            for r, t in enumerate(every):
                holders.setdefault(t.decode(), []).append(r)
            blocks = "; ".join(f"{listed(h)}: {t}" for t, h in holders.items())
            raise ShardingError(f"{what}(axis={axis!r}): the ranks' blocks differ in shape or "
                                f"dtype, so they do not form one tensor ({blocks}); every rank "
                                f"must pass a block of the same shape  [{where}]")
    return out


def scatter(array, layout: ShardSpec, mesh: Mesh, src: int = 0,
            name: str | None = None) -> DTensor:
    """Rank `src`'s array, split over `mesh` as `layout` says: each rank
    receives only its block (the others pass None)."""
    name = name or assigned_name(user_frame()) or "tensor"
    return from_numpy(array, layout, mesh, name=name, src=src)


def from_tree(tree, layouts, mesh: Mesh, name: str | None = None):
    """DTensors for every array of a pytree (dicts, lists, tuples), e.g. a model's
    parameters. `layouts` is one ShardSpec for every leaf, or a function
    `(path, array) -> ShardSpec | None` where `path` names the leaf like
    `blocks.0.wqkv` and None means replicated."""
    leaves, structure = flatten(tree)
    prefix = name or ""
    out = []
    for path, leaf in zip(paths(tree, prefix), leaves):
        if isinstance(leaf, DTensor) or not isinstance(leaf, (np.ndarray, np.generic)):
            out.append(leaf)
            continue
        spec = layouts(path, leaf) if callable(layouts) else layouts
        out.append(from_numpy(leaf, layout=spec or ShardSpec(), mesh=mesh, name=path))
    return unflatten(structure, out)


def tensor(shape, layout: ShardSpec | None = None, mesh: Mesh | None = None, dtype="f32",
           init: str = "random", seed: int = 0, scale: float = 1.0,
           name: str | None = None) -> DTensor:
    """A new distributed tensor made where it lives: each rank builds only its
    own block, so no rank ever holds the global array (a 10M x 4096 bf16 table
    split four ways costs each rank its 19 GiB shard, not 76 GiB).

    `init="random"` (the default) draws normal values times `scale` from a
    counter-based generator keyed by (`seed`, global element index): the global
    value is the same whatever the mesh and layout. `init="zeros"` is zeros.
    `dtype` is a name ("f32", "bf16", "fp16", ...), a `ts` dtype or a numpy one."""
    where = user_frame()
    name = name or assigned_name(where) or "tensor"
    np_dtype = as_dtype(dtype if dtype is not None else "f32", "dist.tensor: dtype")
    if init not in ("zeros", "random"):
        raise ArgumentError(f"{name}: init must be 'zeros' or 'random', got {init!r}  [{where}]")
    if mesh is None:
        raise ShardingError(f"{name}: dist.tensor needs mesh=  [{where}]")
    check_mesh("dist.tensor", mesh, where)
    if isinstance(shape, str) or not hasattr(shape, "__iter__") \
            or not all(is_int(d) and d >= 0 for d in shape):
        raise ArgumentError(f"{name}: dist.tensor's shape={shape!r} must be a tuple of sizes "
                            f"(ints >= 0)  [{where}]")
    if not is_number(scale):
        raise ArgumentError(f"{name}: dist.tensor's scale={scale!r} must be a number  [{where}]")
    if not is_int(seed):
        raise ArgumentError(f"{name}: dist.tensor's seed={seed!r} must be an int  [{where}]")
    shape = tuple(int(d) for d in shape)
    layout = layout or ShardSpec()
    dims = layout.dims_for(len(shape), mesh, name)
    check_divisible(shape, dims, mesh, name, where)

    def make(index) -> np.ndarray:
        if init == "zeros":
            return np.zeros(tuple(s.stop - s.start for s in index), np_dtype)
        return counter_normal(shape, index, seed, scale, np_dtype)

    rank = mesh._process_rank()
    full = tuple(slice(0, d) for d in shape)
    if rank is None:      # a single process looking at the mesh: the global value
        return DTensor(None, shape, np_dtype, layout, mesh, name, global_value=make(full))
    return DTensor(make(mesh.info.local_slices(shape, dims, rank)), shape, np_dtype, layout,
                   mesh, name)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijection of uint64 whose outputs for
    consecutive inputs are statistically independent."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def counter_normal(shape, index, seed: int, scale: float, dtype,
                   chunk_elements: int = 1 << 18) -> np.ndarray:
    """Block `index` (slices of a tensor of `shape`) of a standard normal
    tensor keyed by `seed`: element i of the global tensor (row-major) is
    Box-Muller of two uniforms hashed from (seed, 2i) and (seed, 2i+1), so any
    block is computed alone. Works through the block `chunk_elements` at a
    time (about 80 bytes of scratch per element: 20 MiB), so the scratch stays
    bounded whatever the block."""
    if not shape:                       # a scalar: element 0 of a 1-vector
        return counter_normal((1,), (slice(0, 1),), seed, scale, dtype).reshape(())
    box = tuple(s.stop - s.start for s in index)
    out = np.empty(box, dtype)
    key = _mix64(np.array([seed], np.uint64) + _GOLDEN)[0]
    rows = max(1, chunk_elements // max(1, math.prod(box[1:])))
    with np.errstate(over="ignore"):
        for r0 in range(0, box[0], rows):
            r1 = min(r0 + rows, box[0])
            grid = np.ogrid[(slice(index[0].start + r0, index[0].start + r1),) + tuple(index[1:])]
            counter = np.ravel_multi_index(grid, shape).astype(np.uint64) * np.uint64(2) + key
            u1 = (_mix64(counter) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            u2 = (_mix64(counter + np.uint64(1)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            out[r0:r1] = scale * np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    return out


# -- deterministic mode ------------------------------------------------------------

_mode = threading.local()


class deterministic:
    """`with dist.deterministic(reduce_tree="binary"):` functions compiled (and
    called) inside, or whose body contains such a block, reduce every cross-rank sum in a fixed binary tree over rank
    order and keep partial sums lazy only through additions, so that results
    are bitwise reproducible from run to run. With gradients accumulated over
    microbatches in a binary tree (`ts.optim.accumulate_grad`), they are also
    the same bits whatever the data-parallel degree. Also: `ts.jit(fn,
    deterministic=True)` and the environment variable TESSERA_DETERMINISTIC=1."""

    TREES = ("binary",)

    def __init__(self, reduce_tree: str = "binary", enabled: bool = True):
        if reduce_tree not in self.TREES:
            raise ArgumentError(f"dist.deterministic: reduce_tree must be one of {self.TREES}, "
                                f"got {reduce_tree!r}  [{user_frame()}]")
        self.reduce_tree, self.enabled = reduce_tree, enabled

    def __enter__(self):
        stack = getattr(_mode, "stack", [])
        _mode.stack = stack + [self.enabled]
        state = trace_state()
        if state is not None and self.enabled:
            # Inside a function being compiled (as the collectives guide
            # writes it): the whole function reduces deterministically, since
            # a reduction order is a property of the program, not of a line.
            from tessera_mlir import ir
            state.func.attributes["tgraph.deterministic"] = ir.UnitAttr.get()
        return self

    def __exit__(self, *exc):
        _mode.stack = _mode.stack[:-1]
        return False


def deterministic_enabled(explicit: bool | None = None) -> bool:
    """The deterministic setting in force: an explicit argument, else the
    innermost `dist.deterministic` block, else TESSERA_DETERMINISTIC."""
    if explicit is not None:
        return bool(explicit)
    stack = getattr(_mode, "stack", [])
    if stack:
        return stack[-1]
    return env.flag("TESSERA_DETERMINISTIC")


# -- inspection --------------------------------------------------------------------

def inspect(t, file=None) -> str:
    """Prints (to `file`, default stdout; only on rank 0 when running as
    several ranks) and returns a description of a DTensor: its global shape,
    layout, and per rank its mesh coordinate, local shape and the block of the
    global tensor it holds. Needs no communication. Given a compiled
    function: how its last call laid out each tensor argument."""
    if hasattr(t, "describe_layouts"):          # a compiled function: its arguments
        text = t.describe_layouts()
        if world()[0] == 0:
            print(text, file=file or sys.stdout)
        return text
    if not isinstance(t, DTensor):
        raise ArgumentError(f"dist.inspect: t is a {type(t).__name__}, not a DTensor or a "
                            f"compiled function  [{user_frame()}]")
    info = t.mesh.info
    lines = [f"DTensor {t.name or ''} global {list(t.shape)} {t.dtype.name}, layout "
             f"{describe_layout(t.dims, t.layout.partial)} on the {t.mesh.topology}"]
    local = info.local_shape(t.shape, t.dims)
    for rank in t.mesh.device_ids:
        coords = ", ".join(f"{a}={c}" for a, c in zip(t.mesh.axes, info.coords(rank)))
        box = ", ".join(f"{s.start}:{s.stop}" for s in info.local_slices(t.shape, t.dims, rank))
        note = f"  partial sum over {', '.join(t.layout.partial)}" if t.layout.partial else ""
        lines.append(f"  rank {rank} ({coords}): local {list(local)} = [{box}]{note}")
    text = "\n".join(lines)
    if world()[0] == 0:
        print(text, file=file or sys.stdout)
    return text


#: point-to-point tags of the failure report (never used by collectives)
_FAILED_TAG, _PRINTED_TAG = 0x7E55, 0x7E56
#: how long rank 0 waits for other ranks' reports, and they for its answer
_REPORT_WINDOW_S = 1.0


def install_abort_on_error() -> None:
    """Makes an uncaught exception on any rank abort the whole MPI job, so other
    ranks never wait forever in a collective for a rank that died. When several
    ranks fail at once (an error every rank raises, such as a bad layout),
    rank 0 prints the traceback once and lists the ranks that failed with
    the same error (and any other rank's different one)."""
    if getattr(sys.excepthook, "__name__", "") == "hook":
        return
    # Every rank of the job gets here (making a mesh, calling a compiled
    # function), so initialising MPI now is what the program would do anyway,
    # and the hook can then always reach the other ranks.
    from mpi4py import MPI
    previous = sys.excepthook

    def hook(kind, value, tb):
        aborting = (MPI.Is_initialized() and not MPI.Is_finalized()
                    and MPI.COMM_WORLD.Get_size() > 1)
        if not aborting:
            previous(kind, value, tb)
            return
        import traceback
        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
        summary = f"{kind.__name__}: {value}"
        if previous is sys.__excepthook__:
            report = "".join(traceback.format_exception(kind, value, tb))
        else:                                  # the user's own hook still runs
            previous(kind, value, tb)
            report = ""
        if rank == 0:
            failed = _collect_failures(comm, summary)
            same = [r for r, text in failed.items() if text == summary]
            lines = [report + f"[tessera] rank{'s' if len(same) > 1 else ''} "
                     f"{', '.join(map(str, same))} failed with this error"]
            lines += [f"[tessera] rank {r} failed: {text}" for r, text in failed.items()
                      if text != summary]
            sys.stderr.write("\n".join(lines) + "; aborting all ranks\n")
            sys.stderr.flush()
            for r in failed:
                if r:
                    comm.Send(np.zeros(1, np.uint8), dest=r, tag=_PRINTED_TAG)
        elif not _reported_to_rank0(comm, summary):
            sys.stderr.write(report + f"[tessera] rank {rank} failed: {summary}; "
                             "aborting all ranks\n")
            sys.stderr.flush()
        # A pause before Abort: mpiexec forwards a rank's stderr
        # asynchronously and Abort kills the forwarder, so a line written
        # just before it was sometimes lost (seen in CI).
        time.sleep(0.5)
        comm.Abort(1)

    sys.excepthook = hook


def _collect_failures(comm, own: str) -> dict[int, str]:
    """Rank 0's view of who failed: itself, and every rank whose report
    arrives within the window (all of them, when an error hits every rank)."""
    from mpi4py import MPI
    failed = {0: own}
    deadline = time.monotonic() + _REPORT_WINDOW_S
    status = MPI.Status()
    while len(failed) < comm.Get_size() and time.monotonic() < deadline:
        if not comm.Iprobe(source=MPI.ANY_SOURCE, tag=_FAILED_TAG, status=status):
            time.sleep(0.01)
            continue
        buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        comm.Recv(buf, source=status.Get_source(), tag=_FAILED_TAG)
        failed[status.Get_source()] = buf.tobytes().decode(errors="replace")
    return dict(sorted(failed.items()))


def _reported_to_rank0(comm, summary: str) -> bool:
    """Sends this rank's error to rank 0; True when rank 0 printed it in
    time (it had failed too), else this rank prints its own."""
    data = np.frombuffer(summary.encode(), np.uint8)
    request = comm.Isend(data, dest=0, tag=_FAILED_TAG)
    deadline = time.monotonic() + 2 * _REPORT_WINDOW_S
    while time.monotonic() < deadline:
        if comm.Iprobe(source=0, tag=_PRINTED_TAG):
            comm.Recv(np.empty(1, np.uint8), source=0, tag=_PRINTED_TAG)
            request.Wait()
            return True
        time.sleep(0.01)
    return False
