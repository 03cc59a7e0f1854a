"""Builds Graph IR (`tgraph`) ops on `ir.Value`s at the current insertion point
and location.

Shared by the tracer (`tessera.op`, which checks the user's shapes first) and
by `tessera-autodiff` (whose vector-Jacobian products are Graph IR too), so
both emit exactly the same IR for the same operation.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph

from .support import i64


def tensor_type(v: ir.Value) -> ir.RankedTensorType:
    return ir.RankedTensorType(v.type)


def shape_of(v: ir.Value) -> list[int]:
    return list(tensor_type(v).shape)


def element_of(v: ir.Value) -> ir.Type:
    return tensor_type(v).element_type


def is_float(v: ir.Value) -> bool:
    return isinstance(element_of(v), (ir.F32Type, ir.F64Type, ir.F16Type, ir.BF16Type,
                                      ir.Float8E4M3FNType))


def ranked(shape, element: ir.Type) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), element)


def _dense(values) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get([int(v) for v in values])


# -- elementwise (the ops of `ops.py`'s table) ------------------------------------

def op_class(name: str):
    """The generated builder of `tgraph.<name>` (`tgraph.AddOp` for "add")."""
    return getattr(tgraph, "".join(p.capitalize() for p in name.split("_")) + "Op")


def binary(kind: str, a: ir.Value, b: ir.Value) -> ir.Value:
    """`tgraph.<kind> a, b` (add, sub, mul, div, max)."""
    return op_class(kind)(a, b).result


def unary(kind: str, x: ir.Value) -> ir.Value:
    """`tgraph.<kind> x` (neg, exp, log, tanh, sqrt, rsqrt, relu)."""
    return op_class(kind)(x).result


def compare(kind: str, a: ir.Value, b: ir.Value) -> ir.Value:
    t = ranked(shape_of(a), ir.IntegerType.get_signless(1))
    return tgraph.CompareOp(t, a, b, tgraph.CompareKindAttr.get(kind)).result


def select(cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    return tgraph.SelectOp(cond, a, b).result


def cast(x: ir.Value, element: ir.Type) -> ir.Value:
    if element_of(x) == element:
        return x
    return tgraph.CastOp(ranked(shape_of(x), element), x).result


def fill(shape, element: ir.Type, value: float) -> ir.Value:
    return tgraph.FillOp(ranked(shape, element), ir.FloatAttr.get_f64(float(value))).result


def full_like(x: ir.Value, value: float) -> ir.Value:
    return fill(shape_of(x), element_of(x), value)


def zeros_like(x: ir.Value) -> ir.Value:
    return full_like(x, 0.0)


def iota(shape, dim: int, element: ir.Type) -> ir.Value:
    return tgraph.IotaOp(ranked(shape, element), i64(dim)).result


# -- shapes -----------------------------------------------------------------------

def reshape(x: ir.Value, shape) -> ir.Value:
    if shape_of(x) == list(shape):
        return x
    return tgraph.ReshapeOp(ranked(shape, element_of(x)), x).result


def _fill_value(x: ir.Value) -> float | None:
    owner = x.owner
    if isinstance(owner, ir.Block) or owner.name != "tgraph.fill":
        return None
    return ir.FloatAttr(owner.attributes["value"]).value


def broadcast(x: ir.Value, shape) -> ir.Value:
    """`x` broadcast to `shape` numpy-style (leading dimensions are added).
    A broadcast constant is a constant of the new shape (no buffer holds the
    repeated value)."""
    xs = shape_of(x)
    if xs == list(shape):
        return x
    value = _fill_value(x)
    if value is not None:
        return fill(shape, element_of(x), value)
    x = reshape(x, [1] * (len(shape) - len(xs)) + xs)
    if shape_of(x) == list(shape):
        return x
    return tgraph.BroadcastOp(ranked(shape, element_of(x)), x).result


def reduce(x: ir.Value, kind: str, dims) -> ir.Value:
    """Reduces over `dims`, keeping them with size 1. Emitted one dimension at a
    time (innermost first): each kernel then reduces along a single dimension."""
    attr = tgraph.ReductionKindAttr.get(kind)
    for d in sorted(set(dims), reverse=True):
        shape = shape_of(x)
        if shape[d] == 1:
            continue
        shape[d] = 1
        x = tgraph.ReduceOp(ranked(shape, element_of(x)), x, attr, _dense([d])).result
    return x


def sum_to(x: ir.Value, shape) -> ir.Value:
    """Sums `x` down to `shape`: the adjoint of `broadcast(., shape(x))`."""
    xs = shape_of(x)
    lead = len(xs) - len(shape)
    padded = [1] * lead + list(shape)
    dims = [d for d in range(len(xs)) if padded[d] == 1 and xs[d] != 1]
    return reshape(reduce(x, "sum", dims), shape)


def transpose(x: ir.Value, perm) -> ir.Value:
    if list(perm) == list(range(len(perm))):
        return x
    xs = shape_of(x)
    return tgraph.TransposeOp(ranked([xs[p] for p in perm], element_of(x)), x,
                              _dense(perm)).result


def slice_(x: ir.Value, offsets, shape) -> ir.Value:
    if shape_of(x) == list(shape):
        return x
    return tgraph.SliceOp(ranked(shape, element_of(x)), x, _dense(offsets)).result


def pad(x: ir.Value, offsets, shape) -> ir.Value:
    if shape_of(x) == list(shape):
        return x
    return tgraph.PadOp(ranked(shape, element_of(x)), x, _dense(offsets)).result


def concat(xs: list[ir.Value], dim: int) -> ir.Value:
    if len(xs) == 1:
        return xs[0]
    shape = shape_of(xs[0])
    shape[dim] = sum(shape_of(x)[dim] for x in xs)
    return tgraph.ConcatOp(ranked(shape, element_of(xs[0])), xs, i64(dim)).result


def matmul(a: ir.Value, b: ir.Value, transport: str | None = None) -> ir.Value:
    shape = shape_of(a)[:-1] + [shape_of(b)[-1]]
    attr = tgraph.TransportAttr.get(transport) if transport else None
    return tgraph.MatmulOp(ranked(shape, element_of(a)), a, b, transport=attr).result


def contract_rows(a: ir.Value, b: ir.Value) -> ir.Value:
    """a[R..., K]^T b[R..., N] summed over every row: [K, N]."""
    shape = [shape_of(a)[-1], shape_of(b)[-1]]
    return tgraph.ContractRowsOp(ranked(shape, element_of(a)), a, b).result


def swap_last(x: ir.Value) -> ir.Value:
    r = len(shape_of(x))
    return transpose(x, list(range(r - 2)) + [r - 1, r - 2])


def gather(table: ir.Value, ids: ir.Value) -> ir.Value:
    shape = shape_of(ids) + shape_of(table)[1:]
    return tgraph.GatherOp(ranked(shape, element_of(table)), table, ids).result


def scatter_add(updates: ir.Value, ids: ir.Value, rows: int) -> ir.Value:
    shape = [rows] + shape_of(updates)[len(shape_of(ids)):]
    return tgraph.ScatterAddOp(ranked(shape, element_of(updates)), updates, ids).result


def dynamic_slice(x: ir.Value, start: ir.Value, dim: int, size: int) -> ir.Value:
    """x's block of `size` along `dim` from run-time `start` (an i32 scalar)."""
    shape = shape_of(x)
    shape[dim] = size
    return tgraph.DynamicSliceOp(ranked(shape, element_of(x)), x, start, i64(dim)).result


def dynamic_update_slice(x: ir.Value, start: ir.Value, update: ir.Value, dim: int) -> ir.Value:
    """x with its block along `dim` at run-time `start` replaced by `update`."""
    return tgraph.DynamicUpdateSliceOp(x.type, x, start, update, i64(dim)).result


def dropout(x: ir.Value, key: ir.Value, p: float) -> ir.Value:
    """x with elements dropped at rate `p` (0 < p < 1) and the rest scaled by
    1/(1-p), by the random word of each element's global index under `key`
    (an int64 [seed, step] pair)."""
    return tgraph.DropoutOp(x, key, ir.FloatAttr.get_f64(float(p))).result


def check_range(x: ir.Value, low: int, high: int, message: str, allowed=()) -> ir.Value:
    """`x` (integers), each element checked to lie in `[low, high)` or in
    `allowed`, else the step fails with `message` (`{row}`, `{value}`,
    `{where}` filled in by the runtime): `tgraph.check_range`."""
    return tgraph.CheckRangeOp(x, low, high, message,
                               allowed=_dense(allowed) if len(allowed) else None).result


# -- mixture of experts ----------------------------------------------------------------

def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def topk(x: ir.Value, k: int) -> ir.Value:
    """i32 indices of the `k` largest entries of `x`'s last dimension (`tgraph.topk`)."""
    shape = shape_of(x)[:-1] + [k]
    return tgraph.TopKOp(ranked(shape, _i32()), x, k).result


def dispatch_rows(tokens: int, k: int, num_experts: int, capacity: int, blocks: int = 1) -> int:
    """Rows of the dispatch layout (`tgraph.moe_dispatch`'s verifier agrees)."""
    per_block = tokens * k if capacity == 0 else min(tokens * k, num_experts // blocks * capacity)
    return blocks * per_block


@dataclass(frozen=True)
class DispatchLayout:
    """How `tgraph.moe_dispatch` / `moe_collect` lay out rows: the experts,
    the capacity (0: dropless), the optional fill-order `base` [k, E] and the
    expert-parallel `blocks`."""
    num_experts: int
    capacity: int = 0
    base: ir.Value | None = None
    blocks: int = 1

    @staticmethod
    def of(op: ir.Operation) -> "DispatchLayout":
        return DispatchLayout(ir.IntegerAttr(op.attributes["num_experts"]).value,
                              ir.IntegerAttr(op.attributes["capacity"]).value,
                              op.operands[2] if len(op.operands) > 2 else None,
                              ir.IntegerAttr(op.attributes["blocks"]).value)

    def _attrs(self) -> dict:
        return {"base": self.base, "blocks": self.blocks if self.blocks != 1 else None}


def moe_dispatch(x: ir.Value, experts: ir.Value,
                 layout: DispatchLayout) -> tuple[ir.Value, ir.Value]:
    """(rows, sizes): `x`'s rows ([T, D], or [T, k, D] one per choice) in the
    dispatch layout of `experts` [T, k] (`tgraph.moe_dispatch`)."""
    tokens, k = shape_of(experts)
    rows = dispatch_rows(tokens, k, layout.num_experts, layout.capacity, layout.blocks)
    op = tgraph.MoeDispatchOp(ranked([rows, shape_of(x)[-1]], element_of(x)),
                              ranked([layout.num_experts], _i32()), x, experts,
                              layout.num_experts, layout.capacity, **layout._attrs())
    return op.results[0], op.results[1]


def moe_collect(rows: ir.Value, experts: ir.Value, layout: DispatchLayout) -> ir.Value:
    """[T, k, D]: each (token, choice)'s row of the dispatch layout (`tgraph.moe_collect`)."""
    shape = shape_of(experts) + [shape_of(rows)[-1]]
    return tgraph.MoeCollectOp(ranked(shape, element_of(rows)), rows, experts,
                               layout.num_experts, layout.capacity, **layout._attrs()).result


def grouped_matmul(x: ir.Value, w: ir.Value, sizes: ir.Value,
                   transpose_rhs: bool = False) -> ir.Value:
    """Segment `s` of `x`'s rows times `w[s mod G]` (`tgraph.grouped_matmul`)."""
    m = shape_of(w)[1 if transpose_rhs else 2]
    return tgraph.GroupedMatmulOp(ranked([shape_of(x)[0], m], element_of(x)), x, w, sizes,
                                  transpose_rhs=transpose_rhs or None).result


def grouped_outer(x: ir.Value, g: ir.Value, sizes: ir.Value, groups: int) -> ir.Value:
    """[G, K, M]: per group, the sum of x_s^T g_s over its segments (`tgraph.grouped_outer`)."""
    shape = [groups, shape_of(x)[1], shape_of(g)[1]]
    return tgraph.GroupedOuterOp(ranked(shape, element_of(x)), x, g, sizes).result


def grad(loss: ir.Value, wrt: list[ir.Value]) -> list[ir.Value]:
    return list(tgraph.GradOp([w.type for w in wrt], loss, wrt).results)


# -- attention ----------------------------------------------------------------------

def statistic_element(q: ir.Value) -> ir.Type:
    """The element type of attention's per-row statistics (lse, delta)."""
    return element_of(q) if isinstance(element_of(q), ir.F64Type) else ir.F32Type.get()


def _row_statistic(q: ir.Value) -> ir.RankedTensorType:
    return ranked(shape_of(q)[:-1] + [1], statistic_element(q))


#: The fused attention ops (they share `AttentionSpec`).
ATTENTION_OPS = ("tgraph.attention", "tgraph.attention_grad")


def _seq_dim_attr(q: ir.Value, seq_dim: int | None):
    """The `seq_dim` attribute, absent for the default (q's second to last)."""
    if seq_dim is None or seq_dim == len(shape_of(q)) - 2:
        return None
    return i64(seq_dim)


@dataclass(frozen=True)
class AttentionSpec:
    """What an attention op computes besides its q, k, v: the scale, the
    sequence dimension (None: q's second to last), Gemma 2's `softcap` of
    the scaled scores, and what a query may attend to (`causal`, `window`,
    the additive `mask` and the `segments` pair of document ids: operands,
    shared by the forward op and its gradient)."""
    scale: float
    causal: bool = False
    seq_dim: int | None = None
    window: int | None = None
    mask: ir.Value | None = None
    segments: tuple[ir.Value, ir.Value] | None = None
    softcap: float | None = None
    #: dropout of the probabilities: the rate and the i64 [L..., 1, 3] seeds
    dropout_p: float | None = None
    dropout_seeds: ir.Value | None = None

    @staticmethod
    def of(op: ir.Operation) -> "AttentionSpec":
        view = op.opview
        seg = (view.q_segments, view.kv_segments) if view.q_segments is not None else None
        window = ir.IntegerAttr(op.attributes["window"]).value if "window" in op.attributes \
            else None
        softcap = ir.FloatAttr(op.attributes["softcap"]).value if "softcap" in op.attributes \
            else None
        rate = ir.FloatAttr(op.attributes["dropout_p"]).value if "dropout_p" in op.attributes \
            else None
        return AttentionSpec(ir.FloatAttr(op.attributes["scale"]).value,
                             "causal" in op.attributes, seq_dim_of(op), window, view.mask, seg,
                             softcap, rate, view.dropout_seeds)

    @property
    def sides(self) -> list[ir.Value]:
        """The mask, segment and dropout seed operands, in operand order."""
        return ([self.mask] if self.mask is not None else []) + list(self.segments or ()) + \
            ([self.dropout_seeds] if self.dropout_seeds is not None else [])

    def _build(self, q: ir.Value) -> dict:
        qs, ks = self.segments or (None, None)
        return dict(mask=self.mask, q_segments=qs, kv_segments=ks, causal=self.causal or None,
                    seq_dim=_seq_dim_attr(q, self.seq_dim),
                    window=None if self.window is None else i64(self.window),
                    softcap=None if self.softcap is None else ir.FloatAttr.get_f64(self.softcap),
                    dropout_seeds=self.dropout_seeds,
                    dropout_p=None if self.dropout_p is None else
                    ir.FloatAttr.get_f64(self.dropout_p))


def attention(q: ir.Value, k: ir.Value, v: ir.Value,
              spec: AttentionSpec) -> tuple[ir.Value, ir.Value]:
    """(out, lse) of fused attention (`tgraph.attention`)."""
    out = ranked(shape_of(q)[:-1] + shape_of(v)[-1:], element_of(q))
    op = tgraph.AttentionOp(out, _row_statistic(q), q, k, v, ir.FloatAttr.get_f64(spec.scale),
                            **spec._build(q))
    return op.results[0], op.results[1]


def attention_grad(q, k, v, dout, lse, delta, spec: AttentionSpec) -> list[ir.Value]:
    """[dq, dk, dv] of `tgraph.attention` (`tgraph.attention_grad`)."""
    op = tgraph.AttentionGradOp(q.type, k.type, v.type, q, k, v, dout, lse, delta,
                                ir.FloatAttr.get_f64(spec.scale), **spec._build(q))
    return list(op.results)


def seq_dim_of(op: ir.Operation) -> int:
    """The sequence dimension of a `tgraph.attention` / `attention_grad`."""
    if "seq_dim" in op.attributes:
        return ir.IntegerAttr(op.attributes["seq_dim"]).value
    return len(shape_of(op.operands[0])) - 2


# -- collectives (per-rank values: after partitioning, or in a local-view body) ---

def _resized(x: ir.Value, dim: int, times: int = 1, over: int = 1) -> ir.RankedTensorType:
    """`x`'s type with dimension `dim` multiplied by `times`, divided by `over`."""
    shape = shape_of(x)
    shape[dim] = shape[dim] * times // over
    return ranked(shape, element_of(x))


def _on(mesh: str, axis: str):
    return ir.FlatSymbolRefAttr.get(mesh), ir.StringAttr.get(axis)


def _reduction(kind) -> ir.Attribute:
    """A reduction kind given by name ("sum") or as the attribute itself."""
    return kind if isinstance(kind, ir.Attribute) else tgraph.ReductionKindAttr.get(kind)


def all_reduce(x: ir.Value, kind, mesh: str, axis: str,
               deterministic: bool = False) -> ir.Value:
    return tgraph.AllReduceOp(x, _reduction(kind), *_on(mesh, axis),
                              deterministic=deterministic or None).result


def all_gather(x: ir.Value, mesh: str, axis: str, dim: int, axis_size: int) -> ir.Value:
    return tgraph.AllGatherOp(_resized(x, dim, times=axis_size), x, *_on(mesh, axis),
                              i64(dim)).result


def reduce_scatter(x: ir.Value, mesh: str, axis: str, dim: int, axis_size: int,
                   deterministic: bool = False, kind="sum") -> ir.Value:
    return tgraph.ReduceScatterOp(_resized(x, dim, over=axis_size), x,
                                  _reduction(kind), *_on(mesh, axis),
                                  i64(dim), deterministic=deterministic or None).result


def all_to_all(x: ir.Value, mesh: str, axis: str, split_dim: int, concat_dim: int,
               axis_size: int, transport: str | None = None,
               counts: tuple[ir.Value, ir.Value] | None = None,
               channels: int | None = None) -> ir.Value:
    """`counts` = (send, receive) row counts make it ragged; `channels`
    copies per piece over NVSHMEM (see the op)."""
    shape = shape_of(x)
    shape[concat_dim] *= axis_size
    shape[split_dim] //= axis_size
    return tgraph.AllToAllOp(ranked(shape, element_of(x)), x, list(counts or ()),
                             *_on(mesh, axis),
                             i64(split_dim), i64(concat_dim),
                             transport=tgraph.TransportAttr.get(transport) if transport
                             else None,
                             channels=i64(channels) if channels and channels > 1 else None
                             ).result


def send(x: ir.Value, mesh: str, axis: str, to: int) -> ir.Operation:
    return tgraph.SendOp(x, *_on(mesh, axis), i64(to)).operation


def recv(result_type: ir.Type, mesh: str, axis: str, frm: int) -> ir.Value:
    return tgraph.RecvOp(result_type, *_on(mesh, axis), i64(frm)).result


def ring_shift(x: ir.Value, mesh: str, axis: str, offset: int) -> ir.Value:
    """Each rank's `x` passed to the rank `offset` after it around `axis`."""
    return tgraph.RingShiftOp(x, *_on(mesh, axis), i64(offset)).result


def axis_slice(x: ir.Value, mesh: str, axis: str, dim: int, axis_size: int) -> ir.Value:
    return tgraph.AxisSliceOp(_resized(x, dim, over=axis_size), x, *_on(mesh, axis),
                              i64(dim)).result

