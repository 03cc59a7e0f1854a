"""Device meshes, ShardSpecs and distributed tensors (`tessera.dist`).

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
from dataclasses import dataclass

import numpy as np

from tessera_runtime import env, world
from tessera_runtime.mesh import MeshError, MeshInfo

from ._source import SourceLine, assigned_name, user_frame
from .errors import LaunchError, ShardingError

__all__ = ["Mesh", "ShardSpec", "DTensor", "from_numpy", "from_tree", "tensor", "inspect",
           "deterministic"]

_DTYPES = {"f32": np.float32, "float32": np.float32, "fp32": np.float32,
           "f64": np.float64, "float64": np.float64,
           "f16": np.float16, "float16": np.float16, "fp16": np.float16,
           "int32": np.int32, "i32": np.int32, "int64": np.int64}


def _np_dtype(dtype) -> np.dtype:
    if dtype is None:
        return np.dtype(np.float32)
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise TypeError(f"unsupported dtype '{dtype}' (supported: {', '.join(sorted(_DTYPES))})")
        return np.dtype(_DTYPES[dtype])
    return np.dtype(dtype)


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
        axes = [axes] if isinstance(axes, str) else list(axes)
        if not axes:
            raise MeshError("a mesh needs at least one axis")
        if devices is None:
            devices = range(math.prod(shape)) if shape else range(world()[1])
        devices = list(devices) if isinstance(devices, range) else devices
        nested = bool(devices) and isinstance(devices[0], (list, tuple, range))
        if not nested and shape is None:
            shape = _balanced_shape(len(devices), len(axes))
        self._info = MeshInfo(axes, shape=shape, devices=devices, name=name)

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
        return self._info.axis_size(axis)

    @property
    def rank(self) -> int | None:
        """This process' world rank when the running job is this mesh; None otherwise
        (e.g. a single process looking at a 2-device mesh, as `graph.trace` does)."""
        rank, size = world()
        if size == self.size and rank in self._info.devices:
            return rank
        return None

    def require_rank(self, what: str) -> int:
        rank, size = world()
        if self.rank is None:
            raise LaunchError(
                f"{what} needs the {self.topology} to run as {self.size} processes, but this "
                f"process is rank {rank} of {size}; start the script with "
                f"`tessera launch -n {self.size} SCRIPT` (or `mpiexec -n {self.size} python SCRIPT`)")
        return self.rank

    @property
    def coords(self) -> dict[str, int] | None:
        """This process' coordinate on each axis, e.g. {"dp": 1, "tp": 0}
        (None when this process is not a device of the running mesh)."""
        rank = self.rank
        return None if rank is None else dict(zip(self.axes, self._info.coords(rank)))

    def submesh(self, *axes: str, rank: int | None = None) -> "Mesh":
        """The mesh along `axes` through `rank` (default: this process): the
        devices that share its coordinates on every other axis, e.g. the tp
        group of a dp x tp mesh is `mesh.submesh("tp")`."""
        for a in axes:
            self._info.axis_index(a)
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
        return hash((self.axes, self._info.shape, self._info.devices))


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
            object.__setattr__(self, name, tuple(value))
        if len(self.partition) != len(self.mesh_axes):
            raise ShardingError(f"ShardSpec: partition {self.partition} and mesh_axes "
                                f"{self.mesh_axes} must have the same length")

    @staticmethod
    def replicated() -> "ShardSpec":
        return ShardSpec()

    def dims_for(self, rank: int, mesh: Mesh, what: str = "tensor") -> list[tuple[str, ...]]:
        """Mesh axes splitting each of a rank-`rank` tensor's dimensions."""
        dims: list[list[str]] = [[] for _ in range(rank)]
        used = set()
        for part, axis in zip(self.partition, self.mesh_axes):
            if axis not in mesh.axes:
                raise ShardingError(f"{what}: mesh axis '{axis}' is not in the {mesh.topology} "
                                    f"(axes: {', '.join(mesh.axes)})")
            if axis in used:
                raise ShardingError(f"{what}: mesh axis '{axis}' is used twice in {self}")
            used.add(axis)
            dims[self._dim_index(part, rank, what)].append(axis)
        for axis in self.partial:
            if axis not in mesh.axes or axis in used:
                raise ShardingError(f"{what}: partial axis '{axis}' must be a mesh axis not "
                                    f"used to split a dimension")
        return [tuple(d) for d in dims]

    @staticmethod
    def _dim_index(part, rank: int, what: str) -> int:
        if part == "row":
            index = rank - 2 if rank >= 2 else 0
        elif part == "col":
            index = rank - 1
        elif isinstance(part, int):
            index = part if part >= 0 else rank + part
        else:
            raise ShardingError(f"{what}: partition entry {part!r} must be 'row', 'col' or a dimension index")
        if not 0 <= index < rank:
            raise ShardingError(f"{what}: partition entry {part!r} names dimension {index}, "
                                f"but the tensor has rank {rank}")
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
        if self._global is None:
            own = self.mesh.rank
            if rank != own:
                held = f"only rank {own}'s shard" if own is not None else "a shard"
                raise ShardingError(f"DTensor '{self.name or 'tensor'}': this process holds "
                                    f"{held}, not the global value that rank {rank}'s block "
                                    "is cut from (make it with dist.from_numpy)")
            return self.local()
        if self.layout.partial:
            raise ShardingError(f"DTensor '{self.name or 'tensor'}': a partial tensor has no "
                                "single global value to take rank blocks of")
        index = self.mesh.info.local_slices(self.shape, self.dims, rank)
        return np.array(self._global[index], order="C")

    def numpy(self) -> np.ndarray:
        """The global value, on every rank (a collective when the tensor is split
        or partial: every rank of the mesh must call it)."""
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

    @property
    def nbytes(self) -> int:
        """Bytes of this rank's shard (what the tensor costs each rank)."""
        return math.prod(self.local_shape) * self.dtype.itemsize

    def __repr__(self) -> str:
        return (f"DTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, "
                f"layout={_describe(self.dims, self.layout.partial)}, mesh={self.mesh.topology!r})")


def _describe(dims, partial=()) -> str:
    text = "[" + ", ".join("*".join(d) if d else "-" for d in dims) + "]"
    return text + (f" partial({', '.join(partial)})" if partial else "")


def _assemble(t: DTensor) -> np.ndarray:
    """Gathers every rank's shard (MPI Allgather on raw buffers) into the global value."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    local = np.array(t._local, order="C")
    parts = np.empty((comm.Get_size(),) + local.shape, dtype=local.dtype)
    # MPI moves bytes; dtypes it does not know (ml_dtypes' bfloat16) go as
    # unsigned integers of the same width.
    raw = np.dtype(f"u{local.dtype.itemsize}") if local.dtype.kind == "V" else local.dtype
    comm.Allgather(local.view(raw), parts.view(raw))
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
               name: str | None = None) -> DTensor:
    """Distributes a numpy array (the same global value on every rank) over `mesh`."""
    where = user_frame()
    name = name or assigned_name(where) or "tensor"
    if mesh is None:
        raise ShardingError(f"{name}: dist.from_numpy needs mesh=  [{where}]")
    layout = layout or ShardSpec()
    array = np.asarray(array)
    dims = layout.dims_for(array.ndim, mesh, name)
    check_divisible(array.shape, dims, mesh, name, where)
    rank = mesh.rank
    if rank is None:
        # Not running on this mesh (a single process inspecting it): keep the value.
        return DTensor(None, array.shape, array.dtype, layout, mesh, name, global_value=array)
    # np.array, not np.ascontiguousarray: the latter turns 0-d arrays into 1-d.
    local = np.array(array[mesh.info.local_slices(array.shape, dims, rank)], order="C")
    return DTensor(local, array.shape, array.dtype, layout, mesh, name)


def from_tree(tree, layouts, mesh: Mesh, name: str | None = None):
    """DTensors for every array of a pytree (dicts, lists, tuples), e.g. a model's
    parameters. `layouts` is one ShardSpec for every leaf, or a function
    `(path, array) -> ShardSpec | None` where `path` names the leaf like
    `blocks.0.wqkv` and None means replicated."""
    from ._pytree import flatten, paths, unflatten
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
           init: str = "zeros", seed: int = 0, name: str | None = None) -> DTensor:
    """A new distributed tensor: `init="zeros"` or `"random"` (normal, seeded, the same
    global value whatever the mesh)."""
    where = user_frame()
    name = name or assigned_name(where) or "tensor"
    np_dtype = _np_dtype(dtype)
    if init == "zeros":
        value = np.zeros(shape, dtype=np_dtype)
    elif init == "random":
        value = np.random.default_rng(seed).standard_normal(shape).astype(np_dtype)
    else:
        raise ValueError(f"{name}: init must be 'zeros' or 'random', got {init!r}")
    return from_numpy(value, layout=layout, mesh=mesh, name=name)


# -- deterministic mode ------------------------------------------------------------

_mode = threading.local()


class deterministic:
    """`with dist.deterministic(reduce_tree="binary"):` functions compiled (and
    called) inside reduce every cross-rank sum in a fixed binary tree over rank
    order and keep partial sums lazy only through additions, so that results
    are bitwise reproducible from run to run. With gradients accumulated over
    microbatches in a binary tree (`ts.optim.accumulate_grad`), they are also
    the same bits whatever the data-parallel degree. Also: `ts.jit(fn,
    deterministic=True)` and the environment variable TESSERA_DETERMINISTIC=1."""

    TREES = ("binary",)

    def __init__(self, reduce_tree: str = "binary", enabled: bool = True):
        if reduce_tree not in self.TREES:
            raise ValueError(f"dist.deterministic: reduce_tree must be one of {self.TREES}, "
                             f"got {reduce_tree!r}")
        self.reduce_tree, self.enabled = reduce_tree, enabled

    def __enter__(self):
        stack = getattr(_mode, "stack", [])
        _mode.stack = stack + [self.enabled]
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

def inspect(t: DTensor, file=None) -> str:
    """Prints (to `file`, default stdout; only on rank 0 when running as
    several ranks) and returns a description of a DTensor: its global shape,
    layout, and per rank its mesh coordinate, local shape and the block of the
    global tensor it holds. Needs no communication."""
    if not isinstance(t, DTensor):
        raise TypeError(f"dist.inspect expects a DTensor, got {type(t).__name__}")
    info = t.mesh.info
    lines = [f"DTensor {t.name or ''} global {list(t.shape)} {t.dtype.name}, layout "
             f"{_describe(t.dims, t.layout.partial)} on the {t.mesh.topology}"]
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


def install_abort_on_error() -> None:
    """Makes an uncaught exception on any rank abort the whole MPI job, so other
    ranks never wait forever in a collective for a rank that died."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        try:
            from mpi4py import MPI
            aborting = (MPI.Is_initialized() and not MPI.Is_finalized()
                        and MPI.COMM_WORLD.Get_size() > 1)
        except ImportError:
            aborting = False
        if not aborting:
            previous(kind, value, tb)
            return
        # One write, then a pause before Abort: mpiexec forwards a rank's
        # stderr asynchronously and Abort kills the forwarder, so a line
        # written just before it was sometimes lost (seen in CI: the
        # traceback arrived, the rank line after it did not).
        import time
        import traceback
        rank = MPI.COMM_WORLD.Get_rank()
        if previous is sys.__excepthook__:
            report = "".join(traceback.format_exception(kind, value, tb))
        else:                                  # the user's own hook still runs
            previous(kind, value, tb)
            report = ""
        sys.stderr.write(report + f"[tessera] rank {rank} failed: {kind.__name__}: {value}; "
                           f"aborting all ranks\n")
        sys.stderr.flush()
        time.sleep(0.5)
        MPI.COMM_WORLD.Abort(1)

    if getattr(sys.excepthook, "__name__", "") != "hook":
        sys.excepthook = hook
