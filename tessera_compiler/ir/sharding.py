"""The sharding model: `Sharding` mirrors `#tgraph.sharding<@mesh, [[axes of
dim 0], ...], partial = [...]>` and `Mesh` a `tgraph.mesh` op. The per-op
rules that reason with them are the passes' (`tessera_passes.sharding_rules`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph


@dataclass(frozen=True)
class Sharding:
    mesh: str
    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()

    @staticmethod
    def replicated(mesh: str, rank: int) -> "Sharding":
        return Sharding(mesh, tuple(() for _ in range(rank)))

    @staticmethod
    def from_attr(attr: ir.Attribute) -> "Sharding":
        if not tgraph.ShardingAttr.isinstance(attr):
            raise ValueError(f"not a #tgraph.sharding attribute: {attr}")
        s = tgraph.ShardingAttr(attr)
        return Sharding(s.mesh, tuple(tuple(d) for d in s.dims), tuple(s.partial))

    def __str__(self) -> str:
        dims = json.dumps([list(d) for d in self.dims])
        text = f"#tgraph.sharding<@{self.mesh}, {dims}"
        if self.partial:
            text += f", partial = {json.dumps(list(self.partial))}"
        return text + ">"

    def to_attr(self) -> ir.Attribute:
        return tgraph.ShardingAttr.get(self.mesh, [list(d) for d in self.dims],
                                       list(self.partial))

    @property
    def rank(self) -> int:
        return len(self.dims)

    def with_dims(self, dims) -> "Sharding":
        return replace(self, dims=tuple(tuple(d) for d in dims))

    def with_partial(self, partial) -> "Sharding":
        return replace(self, partial=tuple(partial))

    def describe(self) -> str:
        """Human-readable form for error messages: `[-, tp] partial(tp)`."""
        parts = ["*".join(d) if d else "-" for d in self.dims]
        text = "[" + ", ".join(parts) + "]"
        return text + (f" partial({', '.join(self.partial)})" if self.partial else "")


def results_attr(shardings: list[Sharding]) -> ir.Attribute:
    """An op's `tgraph.sharding`: one for all its results, or an array with
    one per result where they differ (results of different ranks)."""
    if all(s == shardings[0] for s in shardings):
        return shardings[0].to_attr()
    return ir.ArrayAttr.get([s.to_attr() for s in shardings])


_SUB_AXIS = re.compile(r"([^:]+):\((\d+)\)(\d+)")


def sub_axis(name: str) -> tuple[str, int, int] | None:
    """(axis, pre-size, size) of a sub-axis name `"axis:(pre)size"` (Shardy's
    notation: the part of `axis` after a major part of size `pre`; the
    runtime's `tessera_runtime.mesh` reads the same names); None otherwise."""
    m = _SUB_AXIS.fullmatch(name)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def sub_axis_name(axis: str, pre: int, size: int) -> str:
    return f"{axis}:({pre}){size}"


@dataclass(frozen=True)
class Mesh:
    name: str
    axes: tuple[str, ...]
    shape: tuple[int, ...]

    def axis_size(self, axis: str) -> int:
        """The size of a mesh axis, or of a sub-axis `"dp:(1)2"` of one."""
        if axis not in self.axes and sub_axis(axis):
            return sub_axis(axis)[2]
        return self.shape[self.axes.index(axis)]

    def stride(self, axis: str) -> int:
        """World ranks between neighbours along mesh axis `axis` (devices in
        row-major order)."""
        return math.prod(self.shape[self.axes.index(axis) + 1:])

    def parts(self, axes) -> int:
        """How many blocks a dimension split over `axes` has."""
        return math.prod(self.axis_size(a) for a in axes)

    def local_shape(self, shape, sharding: Sharding) -> list[int]:
        return [s // self.parts(axes) for s, axes in zip(shape, sharding.dims)]


#: Per-rank ops tessera-partition inserts (collectives and the local slice):
#: they exist only in partitioned functions.
PER_RANK_OPS = ("tgraph.all_reduce", "tgraph.all_gather", "tgraph.reduce_scatter",
                "tgraph.all_to_all", "tgraph.axis_slice", "tgraph.ring_shift")


def meshes_of(module: ir.Module | ir.Operation) -> dict[str, Mesh]:
    op = module.operation if isinstance(module, ir.Module) else module
    meshes = {}
    for inner in op.regions[0].blocks[0].operations:
        if inner.operation.name == "tgraph.mesh":
            attrs = inner.operation.attributes
            name = ir.StringAttr(attrs["sym_name"]).value
            axes = tuple(ir.StringAttr(a).value for a in ir.ArrayAttr(attrs["axes"]))
            shape = tuple(ir.DenseI64ArrayAttr(attrs["shape"]))
            meshes[name] = Mesh(name, axes, shape)
    return meshes
