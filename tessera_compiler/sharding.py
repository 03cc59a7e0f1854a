"""Shardings, meshes and the per-op sharding rules shared by the passes.

A `Sharding` mirrors `#tgraph.sharding<@mesh, [[axes of dim 0], ...], partial = [...]>`.
The rules say, for an op and the shardings of its operands, which sharding
each operand must have (the partitioner inserts collectives to get there) and
which sharding the result then has. Propagation and partitioning both call the
same rules, so they cannot disagree.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace

from tessera_mlir import ir

#: Element types Tessera handles, by MLIR name, as numpy dtype names.
ELEMENT_TYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16",
                 "i32": "int32", "i64": "int64", "i8": "int8", "i1": "bool"}

_SHARDING_RE = re.compile(
    r'^#tgraph\.sharding<@(?P<mesh>[\w$.-]+|"[^"]*"), (?P<dims>\[.*?\])(?:, partial = (?P<partial>\[.*\]))?>$')


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
        text = str(attr)
        m = _SHARDING_RE.match(text)
        if not m:
            raise ValueError(f"not a #tgraph.sharding attribute: {text}")
        dims = json.loads(m["dims"])
        partial = json.loads(m["partial"]) if m["partial"] else []
        return Sharding(m["mesh"].strip('"'), tuple(tuple(d) for d in dims), tuple(partial))

    def __str__(self) -> str:
        dims = json.dumps([list(d) for d in self.dims])
        text = f"#tgraph.sharding<@{self.mesh}, {dims}"
        if self.partial:
            text += f", partial = {json.dumps(list(self.partial))}"
        return text + ">"

    def to_attr(self) -> ir.Attribute:
        return ir.Attribute.parse(str(self))

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


@dataclass(frozen=True)
class Mesh:
    name: str
    axes: tuple[str, ...]
    shape: tuple[int, ...]

    def axis_size(self, axis: str) -> int:
        return self.shape[self.axes.index(axis)]

    def parts(self, axes) -> int:
        """How many blocks a dimension split over `axes` has."""
        return math.prod(self.axis_size(a) for a in axes)

    def local_shape(self, shape, sharding: Sharding) -> list[int]:
        return [s // self.parts(axes) for s, axes in zip(shape, sharding.dims)]


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


# --------------------------------------------------------------------------
# Rules. Each returns (required operand shardings, result sharding).
# --------------------------------------------------------------------------

@dataclass
class Rule:
    operands: list[Sharding]
    result: Sharding


def matmul_rule(lhs: Sharding, rhs: Sharding) -> Rule:
    """`lhs[..., M, K] x rhs[..., K, N]`.

    M follows lhs and N follows rhs. If both split K over the same axes the
    result is a pending partial sum over them (no communication now). A
    partial operand stays partial through the (linear) matmul unless the other
    operand is partial too. Conflicts are resolved by replicating the rhs side.
    """
    r = lhs.rank
    # At most one partial operand survives: matmul is linear in each argument
    # separately, not in both.
    if lhs.partial and rhs.partial:
        rhs = rhs.with_partial(())
    lk, rk = lhs.dims[r - 1], rhs.dims[r - 2]
    if lk != rk:
        # Different contraction splits: gather both to replicated K.
        lhs = lhs.with_dims(lhs.dims[: r - 1] + ((),))
        rhs = rhs.with_dims(rhs.dims[: r - 2] + ((),) + rhs.dims[r - 1:])
        lk = rk = ()
    batch = lhs.dims[: r - 2]
    if rhs.dims[: r - 2] != batch:
        rhs = rhs.with_dims(batch + rhs.dims[r - 2:])
    m_axes, n_axes = lhs.dims[r - 2], rhs.dims[r - 1]
    taken = {a for d in batch for a in d} | set(m_axes) | set(lk) | set(lhs.partial)
    if set(n_axes) & taken:
        rhs = rhs.with_dims(rhs.dims[: r - 1] + ((),))
        n_axes = ()
    if set(rhs.partial) & (taken | set(n_axes)):
        rhs = rhs.with_partial(())
    partial = tuple(dict.fromkeys(lhs.partial + rhs.partial + tuple(lk)))
    if set(lhs.partial) & set(n_axes):
        lhs = lhs.with_partial(())
        partial = tuple(dict.fromkeys(rhs.partial + tuple(lk)))
    result = Sharding(lhs.mesh, batch + (m_axes, n_axes), partial)
    return Rule([lhs, rhs], result)


def elementwise_rule(operands: list[Sharding], linear: bool) -> Rule:
    """Same-shape elementwise ops. Operands must agree; a partial sum survives
    only a linear op whose operands are all partial over the same axes."""
    first = operands[0]
    dims = first.dims
    if any(o.dims != dims for o in operands):
        # Disagreeing splits: replicate every dim the operands disagree on.
        dims = tuple(d if all(o.dims[i] == d for o in operands) else ()
                     for i, d in enumerate(dims))
    partial = first.partial
    if not linear or any(o.partial != partial for o in operands):
        partial = ()
    required = [Sharding(first.mesh, dims, partial) for _ in operands]
    return Rule(required, Sharding(first.mesh, dims, partial))


RULES = {
    "tgraph.matmul": lambda ins: matmul_rule(*ins),
    "tgraph.add": lambda ins: elementwise_rule(ins, linear=True),
    "tgraph.sub": lambda ins: elementwise_rule(ins, linear=True),
    "tgraph.neg": lambda ins: elementwise_rule(ins, linear=True),
}
# Same-shape elementwise ops that are not linear: splits pass through, partial
# sums are reduced first.
for _name in ("relu", "mul", "div", "max", "exp", "log", "tanh", "sqrt", "rsqrt",
              "compare", "select", "cast"):
    RULES[f"tgraph.{_name}"] = lambda ins: elementwise_rule(ins, linear=False)


def replicated_rule(operands: list[Sharding], result_rank: int, mesh: str) -> Rule:
    """The fallback for ops without a distributed rule yet: every operand is
    gathered to a full replica and every rank computes the whole result."""
    return Rule([Sharding.replicated(mesh, o.rank) for o in operands],
                Sharding.replicated(mesh, result_rank))


def rule_for(op, operand_shardings: list[Sharding], mesh: str) -> Rule:
    """The rule for `op` (an `ir.Operation`) given its operands' shardings."""
    if op.name in RULES:
        return RULES[op.name](operand_shardings)
    return replicated_rule(operand_shardings, len(op.results[0].type.shape), mesh)
