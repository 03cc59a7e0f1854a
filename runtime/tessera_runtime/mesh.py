"""Device mesh: world rank <-> mesh coordinate, axis groups, shard slices.

Pure Python (no MPI) so every mapping can be unit-tested in one process.
The contract (docs/bundle-format.md): `devices` is the row-major flattened
device list and world rank r sits at the coordinate of `devices.index(r)`.
An axis' communicator groups the ranks that share every *other* coordinate,
ordered by their coordinate along the axis.

Collectives may also run over a *sub-axis* (Shardy's notation): `"dp:(2)4"`
is the middle part of axis `dp` split into a major part of size 2 (the
"pre-size"), this part of size 4 and a minor part of the rest. A
hierarchical all-reduce over `dp` of size 8 on nodes of 2 consecutive `dp`
ranks runs over `"dp:(4)2"` (inside a node) and `"dp:(1)4"` (across nodes).
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Sequence


class MeshError(ValueError):
    """A mesh description is inconsistent, or a rank/axis is not in it."""


_SUB_AXIS = re.compile(r"([^:]+):\((\d+)\)(\d+)")


def sub_axis(name: str) -> tuple[str, int, int] | None:
    """(axis, pre-size, size) of a sub-axis name `"axis:(pre)size"`; None for
    any other name."""
    m = _SUB_AXIS.fullmatch(name)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def sub_axis_name(axis: str, pre: int, size: int) -> str:
    """The name of the sub-axis of `axis` of size `size` after a major part of
    size `pre`: `sub_axis_name("dp", 1, 2) == "dp:(1)2"`."""
    return f"{axis}:({pre}){size}"


def _flatten(devices, shape_out: list, depth: int = 0) -> list:
    """Flatten a (possibly nested) device list, recording the nesting shape.

    Nested lists must be rectangular; `shape_out` receives their shape so the
    caller can check it against (or infer) the mesh shape.
    """
    if not isinstance(devices, (list, tuple)):
        return [devices]
    if depth == len(shape_out):
        shape_out.append(len(devices))
    elif shape_out[depth] != len(devices):
        raise MeshError(f"mesh devices are not rectangular: {devices!r}")
    flat: list = []
    nested = [isinstance(d, (list, tuple)) for d in devices]
    if any(nested) and not all(nested):
        raise MeshError(f"mesh devices mix lists and ranks: {devices!r}")
    for d in devices:
        flat.extend(_flatten(d, shape_out, depth + 1))
    return flat


class MeshInfo:
    """A logical device mesh with named axes.

    `devices` may be given flat (row-major) or nested (e.g. [[0, 1], [2, 3]]);
    when nested and `shape` is omitted the shape is taken from the nesting.
    """

    def __init__(self, axes: Sequence[str], shape: Sequence[int] | None = None,
                 devices=None, name: str = "mesh"):
        self.name = str(name)
        self.axes: tuple[str, ...] = tuple(axes)
        if len(set(self.axes)) != len(self.axes):
            raise MeshError(f"mesh '{self.name}': duplicate axis names {list(self.axes)}")
        nest_shape: list[int] = []
        if devices is None:
            if shape is None:
                raise MeshError(f"mesh '{self.name}': need a shape or a device list")
            flat = list(range(math.prod(shape)))
        else:
            flat = _flatten(list(devices), nest_shape)
        nested = len(nest_shape) > 1
        if shape is None:
            # Infer from the nesting; a flat list is a 1-D mesh (or, with no
            # axes at all, a single device).
            shape = nest_shape if nested else ([len(flat)] if self.axes else [])
        self.shape: tuple[int, ...] = tuple(int(s) for s in shape)
        if nested and tuple(nest_shape) != self.shape:
            raise MeshError(f"mesh '{self.name}': nested devices have shape "
                            f"{tuple(nest_shape)} but mesh shape is {self.shape}")
        if len(self.shape) != len(self.axes):
            raise MeshError(f"mesh '{self.name}': {len(self.axes)} axes {list(self.axes)} "
                            f"but shape {list(self.shape)} has {len(self.shape)} dims")
        if any(s < 1 for s in self.shape):
            raise MeshError(f"mesh '{self.name}': axis sizes must be >= 1, got {list(self.shape)}")
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in flat):
            raise MeshError(f"mesh '{self.name}': devices must be non-negative ints, got {flat}")
        if len(flat) != math.prod(self.shape):
            raise MeshError(f"mesh '{self.name}': shape {list(self.shape)} needs "
                            f"{math.prod(self.shape)} devices, got {len(flat)}: {flat}")
        if len(set(flat)) != len(flat):
            raise MeshError(f"mesh '{self.name}': duplicate devices in {flat}")
        self.devices: tuple[int, ...] = tuple(flat)
        self._pos = {r: i for i, r in enumerate(self.devices)}
        self._views: dict[str, MeshInfo] = {}

    # -- construction from program.json ------------------------------------
    @classmethod
    def single(cls) -> "MeshInfo":
        """The trivial mesh of a non-distributed program: one device, no axes."""
        return cls(axes=(), shape=(), devices=[0])

    def __repr__(self) -> str:
        return (f"MeshInfo(name={self.name!r}, axes={list(self.axes)}, "
                f"shape={list(self.shape)}, devices={list(self.devices)})")

    def __eq__(self, other) -> bool:
        return (isinstance(other, MeshInfo) and self.axes == other.axes
                and self.shape == other.shape and self.devices == other.devices)

    # -- basic queries -------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def axis_index(self, axis: str) -> int:
        try:
            return self.axes.index(axis)
        except ValueError:
            raise MeshError(f"axis '{axis}' is not in mesh '{self.name}' "
                            f"(axes: {list(self.axes)})") from None

    def has_axis(self, axis: str) -> bool:
        """Whether `axis` names a mesh axis or a valid sub-axis of one."""
        try:
            self._view(axis)
        except MeshError:
            return False
        return True

    def _view(self, axis: str) -> "MeshInfo":
        """This mesh, or for a sub-axis the same devices with its axis split
        into (major, the sub-axis, minor) parts, so that the sub-axis is an
        axis of the view."""
        if axis in self.axes:
            return self
        view = self._views.get(axis)
        if view is not None:
            return view
        parsed = sub_axis(axis)
        if parsed is None or parsed[0] not in self.axes:
            raise MeshError(f"axis '{axis}' is not in mesh '{self.name}' "
                            f"(axes: {list(self.axes)}, or sub-axes written 'axis:(pre)size')")
        name, pre, size = parsed
        i = self.axes.index(name)
        whole = self.shape[i]
        if pre < 1 or size < 1 or whole % (pre * size):
            raise MeshError(f"sub-axis '{axis}': pre-size {pre} x size {size} does not divide "
                            f"axis '{name}' of size {whole}")
        minor = whole // (pre * size)
        # (The major and minor parts' names are not sub-axis names, so they
        # cannot collide with the sub-axis itself.)
        view = MeshInfo(self.axes[:i] + (f"{name}:major", axis, f"{name}:minor") + self.axes[i + 1:],
                        self.shape[:i] + (pre, size, minor) + self.shape[i + 1:],
                        self.devices, name=self.name)
        self._views[axis] = view
        return view

    def axis_size(self, axis: str) -> int:
        view = self._view(axis)
        return view.shape[view.axis_index(axis)]

    def coords(self, rank: int) -> tuple[int, ...]:
        """Mesh coordinate of world rank `rank` (row-major position in devices)."""
        if rank not in self._pos:
            raise MeshError(f"world rank {rank} is not in mesh '{self.name}' "
                            f"(devices: {list(self.devices)})")
        pos = self._pos[rank]
        out = []
        for size in reversed(self.shape):
            out.append(pos % size)
            pos //= size
        return tuple(reversed(out))

    def rank_at(self, coords: Sequence[int]) -> int:
        """World rank at mesh coordinate `coords`."""
        if len(coords) != len(self.shape) or any(
                not 0 <= c < s for c, s in zip(coords, self.shape)):
            raise MeshError(f"coordinate {tuple(coords)} is outside mesh "
                            f"'{self.name}' of shape {self.shape}")
        pos = 0
        for c, s in zip(coords, self.shape):
            pos = pos * s + c
        return self.devices[pos]

    # -- axis groups (who talks to whom in a collective) ----------------------
    def axis_group(self, axis: str, rank: int) -> list[int]:
        """World ranks that share every coordinate of `rank` except `axis`,
        ordered by their coordinate along `axis` (= their rank in the group)."""
        if axis not in self.axes:
            return self._view(axis).axis_group(axis, rank)
        i = self.axis_index(axis)
        c = list(self.coords(rank))
        group = []
        for k in range(self.shape[i]):
            c[i] = k
            group.append(self.rank_at(c))
        return group

    def axis_groups(self, axis: str) -> list[list[int]]:
        """All groups along `axis`, indexed by color (see axis_color)."""
        groups: dict[int, list[int]] = {}
        for r in self.devices:
            groups.setdefault(self.axis_color(axis, r), self.axis_group(axis, r))
        return [groups[c] for c in sorted(groups)]

    def axis_color(self, axis: str, rank: int) -> int:
        """Index of `rank`'s group along `axis`: the row-major linear index of
        its coordinate with the `axis` component removed. Ranks with equal
        color form one communicator (used as the color of MPI Comm.Split)."""
        if axis not in self.axes:
            return self._view(axis).axis_color(axis, rank)
        i = self.axis_index(axis)
        c = self.coords(rank)
        color = 0
        for k, (ck, sk) in enumerate(zip(c, self.shape)):
            if k != i:
                color = color * sk + ck
        return color

    # -- sharding ---------------------------------------------------------------
    def block_index(self, axes: Iterable[str], rank: int) -> tuple[int, int]:
        """(index, count) of `rank`'s block for a dimension split over `axes`
        (outermost first): the row-major index of its coordinates on those axes."""
        c = self.coords(rank)
        index, count = 0, 1
        for axis in axes:
            i = self.axis_index(axis)
            index = index * self.shape[i] + c[i]
            count *= self.shape[i]
        return index, count

    def local_shape(self, global_shape: Sequence[int], dims: Sequence[Sequence[str]]) -> tuple[int, ...]:
        """Local shape of a tensor of `global_shape` sharded as `dims`."""
        out = []
        for d, (g, axes) in enumerate(zip(global_shape, dims)):
            n = math.prod(self.axis_size(a) for a in axes)
            if g % n:
                raise MeshError(f"dim {d} of size {g} is not divisible by the "
                                f"{n} shards of axes {list(axes)}")
            out.append(g // n)
        return tuple(out)

    def local_slices(self, global_shape: Sequence[int], dims: Sequence[Sequence[str]],
                     rank: int) -> tuple[slice, ...]:
        """Index into the global tensor that gives `rank`'s local shard."""
        local = self.local_shape(global_shape, dims)
        out = []
        for size, axes in zip(local, dims):
            index, _ = self.block_index(axes, rank)
            out.append(slice(index * size, (index + 1) * size))
        return tuple(out)
