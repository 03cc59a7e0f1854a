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
from dataclasses import dataclass, field, replace

from tessera_mlir import ir

from .passes_common import enum_of

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


#: Per-rank ops tessera-partition inserts (collectives and the local slice):
#: they exist only in partitioned functions.
PER_RANK_OPS = ("tgraph.all_reduce", "tgraph.all_gather", "tgraph.reduce_scatter",
                "tgraph.all_to_all", "tgraph.axis_slice")


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
# Rules. Each returns the sharding every operand must have (the partitioner
# inserts the collectives that get it there), the result's sharding, and
# what the partitioned op needs besides (a collective right after it,
# attributes).
# --------------------------------------------------------------------------

@dataclass
class Rule:
    operands: list[Sharding]
    #: the result's sharding (every result's, for ops with several)
    result: Sharding
    #: (reduction, axis) all_reduces applied to the op's local result at once
    #: (a max over a split dimension cannot stay a lazy partial like a sum).
    post: list[tuple[str, str]] = field(default_factory=list)
    #: attributes the partitioned op gets (e.g. `row_axes` of a gather)
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """What a rule may look at besides the operand shardings."""
    mesh: Mesh
    #: Deterministic mode: a pending sum is reduced before any op other than
    #: add/sub/neg and data movement, so that where the reduction happens
    #: (and with it the rounding) does not depend on how many ranks there are.
    deterministic: bool = False
    #: Global shapes of values the partitioner has already made local.
    global_shapes: dict = field(default_factory=dict, compare=False, hash=False)

    def shape(self, value: ir.Value) -> list[int]:
        """`value`'s global shape (rules reason about global shapes)."""
        if value in self.global_shapes:
            return self.global_shapes[value]
        return list(ir.RankedTensorType(value.type).shape)


def _axes_of(s: Sharding) -> set[str]:
    return {a for d in s.dims for a in d}


def merge_dims(operands: list[Sharding], blocked: set[str] = frozenset()):
    """Per dimension, the first operand's split of it; an axis already used
    by an earlier dimension (or in `blocked`) is dropped. Operands that split
    a dimension less are then sliced locally, which costs no communication."""
    used = set(blocked)
    dims = []
    for d in range(operands[0].rank):
        choice = ()
        for o in operands:
            if o.dims[d] and not set(o.dims[d]) & used:
                choice = o.dims[d]
                break
        used |= set(choice)
        dims.append(choice)
    return tuple(dims)


def _linear_partial(name: str, operands: list[Sharding], ctx: Context) -> tuple[str, ...]:
    """The pending sum that survives elementwise op `name`, or ()."""
    partials = [o.partial for o in operands]
    if not any(partials):
        return ()
    if name in ("tgraph.add", "tgraph.sub"):
        return partials[0] if all(p == partials[0] for p in partials) else ()
    if name == "tgraph.neg":
        return partials[0]
    if ctx.deterministic:
        return ()
    # Linear in one argument: x*c, x/c, and select between two partial values.
    if name == "tgraph.mul" and sum(bool(p) for p in partials) == 1:
        return next(p for p in partials if p)
    if name == "tgraph.div" and partials[0] and not partials[1]:
        return partials[0]
    if name == "tgraph.select" and not partials[0] and partials[1] == partials[2]:
        return partials[1]
    return ()


def elementwise_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """Same-shape elementwise ops: operands are brought to one layout (the
    most split one, by local slicing); a partial sum survives only where the
    op is linear in it, and not over an axis another operand is split on
    (reducing the sum, often as a reduce_scatter, beats gathering the split)."""
    partial = _linear_partial(op.name, ins, ctx)
    if set(partial) & {a for o in ins for a in _axes_of(o)}:
        partial = ()
    dims = merge_dims(ins, set(partial))
    # An operand keeps the surviving pending sum if it has it (c in x*c has none).
    required = [Sharding(o.mesh, dims, partial if o.partial == partial else ()) for o in ins]
    return Rule(required, Sharding(ins[0].mesh, dims, partial))


def matmul_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """`lhs[..., M, K] x rhs[..., K, N]`.

    M follows lhs and N follows rhs. If K is split (on either side; the other
    side is sliced to match) the result is a pending partial sum over those
    axes, with no communication now. A partial operand stays partial through
    the matmul, which is linear in each argument separately (not in both,
    and not at all in deterministic mode).
    """
    lhs, rhs = ins
    r = lhs.rank
    if ctx.deterministic:
        lhs, rhs = lhs.with_partial(()), rhs.with_partial(())
    if lhs.partial and rhs.partial:
        rhs = rhs.with_partial(())
    # A pending sum over an axis the other operand is split on is reduced:
    # keeping it would mean gathering the other operand (usually a weight).
    if set(lhs.partial) & _axes_of(rhs):
        lhs = lhs.with_partial(())
    if set(rhs.partial) & _axes_of(lhs):
        rhs = rhs.with_partial(())
    lk, rk = lhs.dims[r - 1], rhs.dims[r - 2]
    if lk != rk:
        if not rk and not set(lk) & (_axes_of(rhs) | set(rhs.partial)):
            rk = lk                       # slice rhs's K locally
        elif not lk and not set(rk) & (_axes_of(lhs) | set(lhs.partial)):
            lk = rk                       # slice lhs's K locally
        else:
            lk = rk = ()                  # gather both
    lhs = lhs.with_dims(lhs.dims[: r - 1] + (lk,))
    rhs = rhs.with_dims(rhs.dims[: r - 2] + (rk,) + rhs.dims[r - 1:])
    batch = lhs.dims[: r - 2]
    m_axes = lhs.dims[r - 2]
    taken = {a for d in batch for a in d} | set(lk) | set(lhs.partial)
    n_wanted = rhs.dims[r - 1]
    # M and N split over the same axis (a sequence-parallel input to a
    # column-parallel weight): with a transport requested the input is
    # gathered (the gather can be fused into the GEMM) and the weight stays
    # split; otherwise the weight is gathered (below).
    gather_lhs = "transport" in op.attributes and set(m_axes) & set(n_wanted) \
        and not set(n_wanted) & taken
    if gather_lhs or set(m_axes) & taken:
        m_axes = ()
        lhs = lhs.with_dims(batch + ((), lk))
    taken |= set(m_axes)
    rhs = rhs.with_dims(batch + rhs.dims[r - 2:])
    n_axes = rhs.dims[r - 1]
    if set(n_axes) & taken:
        rhs = rhs.with_dims(rhs.dims[: r - 1] + ((),))
        n_axes = ()
    partial = tuple(dict.fromkeys(lhs.partial + rhs.partial + tuple(lk)))
    return Rule([lhs, rhs], Sharding(lhs.mesh, batch + (m_axes, n_axes), partial))


def reduce_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """A sum over a split dimension reduces locally and leaves a pending
    partial sum; max/min/prod over one are all-reduced at once."""
    (x,) = ins
    kind = enum_of(op)
    reduced = set(ir.DenseI64ArrayAttr(op.attributes["dims"]))
    keep_partial = kind == "sum" and not ctx.deterministic
    x = x if keep_partial else x.with_partial(())
    dims, split_axes = [], []
    for d, axes in enumerate(x.dims):
        if d in reduced:
            split_axes.extend(axes)
            dims.append(())
        else:
            dims.append(axes)
    if kind == "sum":
        result = Sharding(x.mesh, tuple(dims), tuple(dict.fromkeys(x.partial + tuple(split_axes))))
        return Rule([x], result)
    return Rule([x], Sharding(x.mesh, tuple(dims)), post=[(kind, a) for a in split_axes])


def broadcast_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """Repeated (size-1) dimensions are replicated; others keep their split.
    A pending sum is reduced first: before the broadcast it is smaller."""
    (x,) = ins
    src, dst = ctx.shape(op.operands[0]), ctx.shape(op.results[0])
    dims = tuple(axes if src[d] == dst[d] else () for d, axes in enumerate(x.dims))
    x = Sharding(x.mesh, dims)
    return Rule([x], x)


def reshape_groups(src: list[int], dst: list[int]) -> list[tuple[list[int], list[int]]]:
    """Minimal runs of source and result dimensions with equal products:
    [8, 4, 6] -> [32, 2, 3] gives ([0, 1], [0]), ([2], [1, 2])."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj, pi, pj = [], [], 1, 1
        if i < len(src):
            gi.append(i); pi = src[i]; i += 1
        if j < len(dst):
            gj.append(j); pj = dst[j]; j += 1
        while pi != pj:
            if pi < pj and i < len(src):
                gi.append(i); pi *= src[i]; i += 1
            elif pj < pi and j < len(dst):
                gj.append(j); pj *= dst[j]; j += 1
            else:
                break
        groups.append((gi, gj))
    return groups


def reshape_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """A split survives a reshape when it is on the outermost (non-1) dimension
    of a group of dimensions that merge or split, and the result's outermost
    dimension of the group divides evenly: [B, S] split on B -> [B*S] split;
    [B, S, D] split on D -> [B, S, H, Dh] split on H."""
    (x,) = ins
    src, dst = ctx.shape(op.operands[0]), ctx.shape(op.results[0])
    required = [()] * len(src)
    result = [()] * len(dst)
    for gi, gj in reshape_groups(src, dst):
        lead_i = next((d for d in gi if src[d] != 1), None)
        lead_j = next((d for d in gj if dst[d] != 1), None)
        if lead_i is None or lead_j is None:
            continue
        axes = x.dims[lead_i]
        if axes and dst[lead_j] % ctx.mesh.parts(axes) == 0:
            required[lead_i] = axes
            result[lead_j] = axes
    x = x.with_dims(required)
    return Rule([x], Sharding(x.mesh, tuple(result), x.partial))


def transpose_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    (x,) = ins
    perm = list(ir.DenseI64ArrayAttr(op.attributes["perm"]))
    return Rule([x], Sharding(x.mesh, tuple(x.dims[p] for p in perm), x.partial))


def box_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """slice and pad: dimensions they cut or grow are replicated."""
    (x,) = ins
    src, dst = ctx.shape(op.operands[0]), ctx.shape(op.results[0])
    x = x.with_dims(tuple(a if src[d] == dst[d] else () for d, a in enumerate(x.dims)))
    return Rule([x], x)


def concat_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    dim = ir.IntegerAttr(op.attributes["dim"]).value
    partial = ins[0].partial if all(o.partial == ins[0].partial for o in ins) else ()
    dims = list(merge_dims(ins, set(partial)))
    dims[dim] = ()
    required = [Sharding(o.mesh, tuple(dims), partial) for o in ins]
    return Rule(required, Sharding(ins[0].mesh, tuple(dims), partial))


def gather_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """`table[V, ...][indices]`: the indices' splits carry over. A table split
    by rows (vocab parallelism) is looked up locally, reading zeros for rows
    it does not hold, which leaves a partial sum over the row axes."""
    table, idx = ins
    table = table.with_partial(())
    idx_axes = _axes_of(idx)
    rows = table.dims[0] if not set(table.dims[0]) & idx_axes else ()
    rest = tuple(a if not set(a) & (idx_axes | set(rows)) else () for a in table.dims[1:])
    table = Sharding(table.mesh, (rows,) + rest)
    result = Sharding(table.mesh, idx.dims + rest, tuple(rows))
    return Rule([table, idx], result, attrs={"row_axes": list(rows)} if rows else {})


def scatter_add_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """`scatter_add(updates[..., D], indices[...]) -> [V, D]`: updates split
    along the indexed dimensions sum into a pending partial over those axes."""
    upd, idx = ins
    n = idx.rank
    lead = merge_dims([upd.with_dims(upd.dims[:n]), idx])
    partial = () if ctx.deterministic else upd.partial
    rest = tuple(a if not set(a) & ({x for d in lead for x in d} | set(partial)) else ()
                 for a in upd.dims[n:])
    upd = Sharding(upd.mesh, lead + rest, partial)
    idx = Sharding(idx.mesh, lead)
    split = tuple(a for d in lead for a in d)
    result = Sharding(upd.mesh, ((),) + rest, tuple(dict.fromkeys(partial + split)))
    return Rule([upd, idx], result)


def replicated_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """Ops that create values (fill, iota): replicated. Consumers that want
    them split slice them locally."""
    return Rule([Sharding.replicated(ctx.mesh.name, o.rank) for o in ins],
                Sharding.replicated(ctx.mesh.name, len(ctx.shape(op.results[0]))))


def attention_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """attention and attention_grad: batch and head dimensions keep their
    split (head-parallel attention needs no communication); each rank
    attends over whole sequences, so the sequence and feature dimensions are
    gathered. Every result (out and lse; dq, dk and dv) has this sharding."""
    lead = merge_dims([o.with_dims(o.dims[:-2] + ((), ())) for o in ins])
    s = Sharding(ins[0].mesh, lead)
    return Rule([s] * len(ins), s)


RULES = {
    "tgraph.matmul": matmul_rule,
    "tgraph.reduce": reduce_rule,
    "tgraph.broadcast": broadcast_rule,
    "tgraph.reshape": reshape_rule,
    "tgraph.transpose": transpose_rule,
    "tgraph.slice": box_rule,
    "tgraph.pad": box_rule,
    "tgraph.concat": concat_rule,
    "tgraph.gather": gather_rule,
    "tgraph.scatter_add": scatter_add_rule,
    "tgraph.fill": replicated_rule,
    "tgraph.iota": replicated_rule,
    "tgraph.attention": attention_rule,
    "tgraph.attention_grad": attention_rule,
}
for _name in ("add", "sub", "neg", "relu", "mul", "div", "max", "exp", "log", "tanh", "sqrt",
              "rsqrt", "compare", "select", "cast"):
    RULES[f"tgraph.{_name}"] = elementwise_rule


def rule_for(op, operand_shardings: list[Sharding], ctx: Context) -> Rule:
    """The rule for `op` (an `ir.Operation`) given its operands' shardings."""
    rule = RULES.get(op.name)
    if rule is None:
        raise KeyError(op.name)
    return rule(op, operand_shardings, ctx)
