"""The per-op sharding rules, and how a function's values are read,
shared by tessera-propagate-sharding and tessera-partition (not a pass).

The rules say, for an op and the shardings of its operands, which sharding
each operand must have (the partitioner inserts collectives to get there) and
which sharding the result then has. Propagation and partitioning both call the
same rules, so they cannot disagree. Rules reason about global shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera_mlir import ir

from tessera_compiler.ir import graph_builder as gb, ops
from tessera_compiler.ir.sharding import PER_RANK_OPS, Mesh, Sharding, meshes_of
from tessera_compiler.ir.support import (PassError, arg_attr_dicts, functions, non_tensor_signature,
                                         ops_of, symbol_of)
from tessera_compiler.ir.types import enum_of

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
    #: each result's sharding, for ops whose results differ in rank
    #: (moe_dispatch's rows and sizes); else every result has `result`'s
    results: list[Sharding] | None = None
    #: the sharding each result is moved to right after the op, where its
    #: readers find it (attention that exchanged a sequence split for a head
    #: split returns to the sequence split); None: as computed
    restore: list[Sharding] | None = None

    def of_results(self, op) -> list[Sharding]:
        return self.results or [self.result] * len(op.results)

    def as_read(self, op) -> list[Sharding]:
        """The results' shardings as the op's readers see them."""
        return self.restore or self.of_results(op)


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
    #: attention over a split sequence: "auto", "ring" or "ulysses"
    #: (`TargetOptions.context_parallel`), and whether collectives progress
    #: under compute (the GPU target: a ring's shifts hide behind its blocks)
    context_parallel: str = "auto"
    overlapped: bool = False

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
    """The pending sum that survives elementwise op `name`, or () (what the
    op table says of its linearity)."""
    partials = [o.partial for o in operands]
    if not any(partials):
        return ()
    linear = ops.GRAPH_ELEMENTWISE[name].linear
    if linear == "same":
        return partials[0] if all(p == partials[0] for p in partials) else ()
    if linear == "unary":
        return partials[0]
    if ctx.deterministic:
        return ()
    # Linear in one argument: x*c, x/c, and select between two partial values.
    if linear == "one" and sum(bool(p) for p in partials) == 1:
        return next(p for p in partials if p)
    if linear == "first" and partials[0] and not partials[1]:
        return partials[0]
    if linear == "select" and not partials[0] and partials[1] == partials[2]:
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
    """`lhs[..., M, K] x rhs[..., K, N]`, or `rhs[K, N]` shared by every batch.

    M follows lhs and N follows rhs. If K is split (on either side; the other
    side is sliced to match) the result is a pending partial sum over those
    axes, with no communication now. A partial operand stays partial through
    the matmul, which is linear in each argument separately (not in both,
    and not at all in deterministic mode).
    """
    lhs, rhs = _contracted_operands(ins, ctx)
    r, rr = lhs.rank, rhs.rank
    lk, rk = _contraction(lhs.dims[r - 1], rhs.dims[rr - 2], lhs, rhs)
    lhs = lhs.with_dims(lhs.dims[: r - 1] + (lk,))
    rhs = rhs.with_dims(rhs.dims[: rr - 2] + (rk,) + rhs.dims[rr - 1:])
    batch = lhs.dims[: r - 2]
    m_axes = lhs.dims[r - 2]
    taken = {a for d in batch for a in d} | set(lk) | set(lhs.partial)
    n_wanted = rhs.dims[rr - 1]
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
    rhs = rhs.with_dims((batch if rr == r else ()) + rhs.dims[rr - 2:])
    n_axes = rhs.dims[rr - 1]
    if set(n_axes) & taken:
        rhs = rhs.with_dims(rhs.dims[: rr - 1] + ((),))
        n_axes = ()
    partial = tuple(dict.fromkeys(lhs.partial + rhs.partial + tuple(lk)))
    return Rule([lhs, rhs], Sharding(lhs.mesh, batch + (m_axes, n_axes), partial))


def _contracted_operands(ins: list[Sharding], ctx: Context) -> tuple[Sharding, Sharding]:
    """The two operands of a product with the pending sums it can keep: not
    both (the product is linear in each separately), none in deterministic
    mode, and not one over an axis the other operand is split on (keeping it
    would mean gathering the other operand, usually a weight)."""
    lhs, rhs = ins
    if ctx.deterministic:
        lhs, rhs = lhs.with_partial(()), rhs.with_partial(())
    if lhs.partial and rhs.partial:
        rhs = rhs.with_partial(())
    if set(lhs.partial) & _axes_of(rhs):
        lhs = lhs.with_partial(())
    if set(rhs.partial) & _axes_of(lhs):
        rhs = rhs.with_partial(())
    return lhs, rhs


def _contraction(lk: tuple, rk: tuple, lhs: Sharding, rhs: Sharding) -> tuple[tuple, tuple]:
    """The splits of a contracted dimension on each side: equal, the
    unsplit side sliced to match where it can be, else both gathered."""
    if lk == rk:
        return lk, rk
    if not rk and not set(lk) & (_axes_of(rhs) | set(rhs.partial)):
        return lk, lk                     # slice rhs's locally
    if not lk and not set(rk) & (_axes_of(lhs) | set(lhs.partial)):
        return rk, rk                     # slice lhs's locally
    return (), ()


def contract_rows_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """`lhs[R..., K]^T rhs[R..., N]` summed over the rows: each row
    dimension takes one split for both operands (the less split one is
    sliced locally) and its axes become a pending partial sum of the
    `[K, N]` result (a data- or context-parallel weight gradient, reduced
    where it is needed); K follows lhs and N rhs where no row takes their
    axis."""
    lhs, rhs = _contracted_operands(ins, ctx)
    n = lhs.rank - 1
    rows = []
    for d in range(n):
        mine = _contraction(lhs.dims[d], rhs.dims[d], lhs, rhs)[0]
        used = {a for split in rows for a in split}
        rows.append(mine if not set(mine) & used else ())
    taken = {a for split in rows for a in split} | set(lhs.partial) | set(rhs.partial)
    k_axes = lhs.dims[n] if not set(lhs.dims[n]) & taken else ()
    n_axes = rhs.dims[n] if not set(rhs.dims[n]) & (taken | set(k_axes)) else ()
    lhs = lhs.with_dims(tuple(rows) + (k_axes,))
    rhs = rhs.with_dims(tuple(rows) + (n_axes,))
    summed = tuple(a for split in rows for a in split)
    partial = tuple(dict.fromkeys(lhs.partial + rhs.partial + summed))
    return Rule([lhs, rhs], Sharding(lhs.mesh, (k_axes, n_axes), partial))


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


def dynamic_slice_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """dynamic_slice and dynamic_update_slice: the block's dimension is
    whole (every rank reads the run-time start, a replicated scalar); the
    others keep x's (and the update's) split. A pending sum is reduced."""
    dim = ir.IntegerAttr(op.attributes["dim"]).value
    blocks = [ins[0]] + ins[2:]
    dims = list(merge_dims([o.with_partial(()) for o in blocks]))
    dims[dim] = ()
    s = Sharding(ins[0].mesh, tuple(dims))
    return Rule([s, Sharding.replicated(ins[0].mesh, 0)] + [s] * (len(ins) - 2), s)


def dropout_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """Dropout keeps x's layout, a pending sum included (a fixed mask times
    x is linear in x); the key is replicated. Each rank draws the words of
    its own block's global indices: `dim_axes` names the axes splitting
    each dimension, which the executor turns into the block's position."""
    x = ins[0]
    return Rule([x, Sharding.replicated(x.mesh, 1)], x,
                attrs={"dim_axes": [",".join(d) for d in x.dims]}
                if any(x.dims) else {})


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


def check_range_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """A value check passes its operand through in its layout, a pending sum
    reduced first (its summands are not the values). The runtime numbers
    a failing element in the flattened global tensor from this rank's
    block: `row_axes` when only the first dimension is split (the block's
    first element is then its index times the block's size), else
    `dim_axes`, the axes splitting each dimension (token ids split along
    the sequence)."""
    x = ins[0].with_partial(())
    if not any(x.dims[1:]):
        return Rule([x], x, attrs={"row_axes": list(x.dims[0])} if x.rank and x.dims[0] else {})
    return Rule([x], x, attrs={"dim_axes": [",".join(d) for d in x.dims]})


def replicated_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """Every operand whole and every result replicated: ops that create
    values (fill, iota; consumers that want them split slice them locally),
    and the MoE layout ops in the global view (dispatch, collect, the grouped
    GEMMs: every rank computes the whole layer, correct on any mesh; expert
    parallelism comes from op.moe's own per-rank body, not from a rule)."""
    results = [Sharding.replicated(ctx.mesh.name, len(ctx.shape(r))) for r in op.results]
    return Rule([Sharding.replicated(ctx.mesh.name, o.rank) for o in ins], results[0],
                results=results)


def topk_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """Per row: the leading dimensions keep their split, the last is whole."""
    x = ins[0].with_partial(())
    x = x.with_dims(x.dims[:-1] + ((),))
    return Rule([x], x)


def attention_rule(op, ins: list[Sharding], ctx: Context) -> Rule:
    """attention and attention_grad: batch and head dimensions keep their
    split (head-parallel attention needs no communication); each rank
    attends over whole sequences, so the feature dimensions are gathered.

    A sequence (`seq_dim`) split over an axis (context parallelism) is
    exchanged for a split of a leading dimension the axis divides on q, k
    and v alike, heads first (all-to-all or "Ulysses" attention: each rank
    attends over the whole sequence for its share of the heads, so its
    memory and work are 1/n of the whole and no rank gathers K or V), else
    for q alone where k and v have one head (multi-query: their one head
    is gathered, q's heads split); the results return to the sequence split
    right after the op (`restore`), and the op records the axes as
    `ulysses_axes`. A sequence split no leading dimension can take (grouped
    heads fewer than the axis) is gathered.

    Grouped key/value heads (a k/v leading dimension smaller than q's)
    split with q's where the split divides them: each rank's query heads
    then read its own key/value heads. Where it does not (8 query heads
    in groups of 4 over tp = 4), the dimension is gathered, on q too: a
    rank's query heads would need a rank-dependent slice of the key/value
    heads. A dimension of size 1 (multi-query heads, a mask shared by the
    heads) is whole. Results: out and lse (dq) are q's, dk and dv k's (a
    pending sum over the axes splitting q where k has extent 1)."""
    spec = gb.AttentionSpec.of(op)
    seq = gb.seq_dim_of(op)
    rank = ins[0].rank
    lead_dims = [d for d in range(rank - 1) if d != seq]
    rows = len(op.operands) - len(spec.sides)          # q, k, v (dout, lse, delta)
    q_like = [0] + list(range(3, rows))
    q_shape, kv_shape = ctx.shape(op.operands[0]), ctx.shape(op.operands[1])

    def whole_rows(o: Sharding) -> Sharding:
        return o.with_dims(tuple(() if d in (seq, rank - 1) else split
                                 for d, split in enumerate(o.dims)))
    merged = merge_dims([whole_rows(ins[i]) for i in range(rows)])
    lead = []
    for d in lead_dims:
        split, kv = merged[d], kv_shape[d]
        if split and kv not in (1, q_shape[d]) and kv % ctx.mesh.parts(split):
            split = ()
        lead.append(split)

    # Context parallelism: each axis splitting q's sequence moves to the
    # innermost leading dimension it divides on q and on k/v (heads), else
    # to one it divides on q where k/v have extent 1 (multi-query heads:
    # q's heads split, the one key/value head gathered whole) -- unless the
    # sequence stays split and attention runs as a ring (`_ring_axis`).
    exchanged = []                                     # (axis, lead index)
    ring = _ring_axis(op, ins, spec, seq, lead_dims, lead, q_shape, kv_shape, ctx)
    # (innermost axis first: the Resharder moves one axis at a time from the
    # inside of a split, an all-to-all each)
    for axis in reversed(ins[0].dims[seq] if ring is None else ()):
        taken = {a for split in lead for a in split}
        if axis in taken or axis not in ins[1].dims[seq]:
            continue
        i = _ulysses_lead(axis, lead_dims, lead, q_shape, kv_shape, ctx)
        if i is not None:
            lead[i] += (axis,)
            exchanged.append((axis, i))

    # (a ring keeps the sequence split: rows, and segment ids' [.., S, 1])
    along = (ring,) if ring is not None else ()

    def placed(extent: list[int]) -> Sharding:
        """A side operand [lead..., two trailing dims] (a mask, segment ids,
        dropout seeds): q's lead split where the dimension is q's, whole
        where it is 1; a ring's segment ids [.., S, 1] split along S."""
        dims = [split if n > 1 else () for split, n in zip(lead, extent)]
        return Sharding(ins[0].mesh, tuple(dims) + (along, ()))

    def rows_of(shape: list[int]) -> Sharding:
        dims = [()] * rank
        for d, split in zip(lead_dims, lead):
            dims[d] = split if shape[d] > 1 else ()
        dims[seq] = along
        return Sharding(ins[0].mesh, tuple(dims))
    q_s, kv_s = rows_of(q_shape), rows_of(kv_shape)
    required = [q_s if i in q_like else kv_s for i in range(rows)]
    required += [placed(ctx.shape(v)[:len(lead)]) for v in spec.sides]
    # dk and dv of a key/value dimension of 1 that q's split (multi-query
    # heads; one shared by the batch) are each rank's share of a sum over
    # the ranks' queries: pending partial sums over those axes.
    summed = tuple(a for d, split in zip(lead_dims, lead) if kv_shape[d] == 1 < q_shape[d]
                   for a in split)
    dkv = kv_s.with_partial(summed)
    results = [q_s, q_s] if op.name == "tgraph.attention" else [q_s, dkv, dkv]
    if ring is not None:
        return Rule(required, q_s, results=results, attrs={"ring_axes": [ring]})
    if not exchanged:
        return Rule(required, q_s, results=results)

    def restored(s: Sharding) -> Sharding:
        """`s` with the exchanged axes back on the sequence dimension, in
        their order there (a pending sum over one reduce-scattered there)."""
        dims = [list(split) for split in s.dims]
        for axis, i in reversed(exchanged):
            if axis in dims[lead_dims[i]] or axis in s.partial:
                if axis in dims[lead_dims[i]]:
                    dims[lead_dims[i]].remove(axis)
                dims[seq].append(axis)
        return Sharding(s.mesh, tuple(tuple(d) for d in dims),
                        tuple(a for a in s.partial if a not in dims[seq]))
    return Rule(required, q_s, results=results, restore=[restored(s) for s in results],
                attrs={"ulysses_axes": [axis for axis, _ in exchanged]})


def _ulysses_lead(axis: str, lead_dims, lead, q_shape, kv_shape, ctx: Context) -> int | None:
    """The index (in `lead_dims`) of the leading dimension all-to-all
    attention moves `axis` to: the innermost one it divides on q and on
    k/v, else on q where k/v have extent 1 (multi-query heads); None."""
    fits = [i for i in reversed(range(len(lead_dims)))
            if q_shape[lead_dims[i]] % ctx.mesh.parts(lead[i] + (axis,)) == 0]
    kv_too = [i for i in fits if kv_shape[lead_dims[i]] > 1 and
              kv_shape[lead_dims[i]] % ctx.mesh.parts(lead[i] + (axis,)) == 0]
    one_kv_head = [i for i in fits if kv_shape[lead_dims[i]] == 1]
    return (kv_too or one_kv_head or [None])[0]


def _ring_axis(op, ins, spec, seq, lead_dims, lead, q_shape, kv_shape, ctx: Context):
    """The axis attention runs over as a ring (tessera-ring-attention), or
    None. The ring takes a sequence split over one axis, of q and k alike,
    with equal q and k/v lengths and no mask, window or dropout (causal
    attention also needs a local length the axis divides: it is striped).
    `context_parallel = "ring"` asks for it; "ulysses" never; "auto" takes
    it where it exposes fewer bytes per rank than the all-to-all: where no
    head dimension can take the split (Ulysses would gather the sequence),
    or on a target whose collectives progress under compute (the GPU),
    where the shifts hide behind the blocks and only a causal ring's
    striping exchanges show (as many bytes as Ulysses' exchanges: a tie
    goes to Ulysses, one exchange per operand and no per-step launches)."""
    split = ins[0].dims[seq]
    if ctx.context_parallel == "ulysses" or len(split) != 1 or ins[1].dims[seq] != split:
        return None
    axis = split[0]
    n = ctx.mesh.axis_size(axis)
    if spec.mask is not None or spec.window is not None or spec.dropout_p is not None or \
            q_shape[seq] != kv_shape[seq] or q_shape[seq] % n or \
            (spec.causal and (q_shape[seq] // n) % n):
        return None
    if axis in {a for s in lead for a in s}:      # (another operand splits a head or
        return None                               # batch dimension over it: gathered)
    if ctx.context_parallel == "ring":
        return axis
    if _ulysses_lead(axis, lead_dims, lead, q_shape, kv_shape, ctx) is None:
        return axis
    return axis if ctx.overlapped and not spec.causal else None


RULES = {
    "tgraph.matmul": matmul_rule,
    "tgraph.contract_rows": contract_rows_rule,
    "tgraph.reduce": reduce_rule,
    "tgraph.broadcast": broadcast_rule,
    "tgraph.reshape": reshape_rule,
    "tgraph.transpose": transpose_rule,
    "tgraph.slice": box_rule,
    "tgraph.pad": box_rule,
    "tgraph.concat": concat_rule,
    "tgraph.gather": gather_rule,
    "tgraph.dynamic_slice": dynamic_slice_rule,
    "tgraph.dynamic_update_slice": dynamic_slice_rule,
    "tgraph.dropout": dropout_rule,
    "tgraph.scatter_add": scatter_add_rule,
    "tgraph.fill": replicated_rule,
    "tgraph.iota": replicated_rule,
    "tgraph.attention": attention_rule,
    "tgraph.attention_grad": attention_rule,
    "tgraph.topk": topk_rule,
    "tgraph.check_range": check_range_rule,
    "tgraph.moe_dispatch": replicated_rule,
    "tgraph.moe_collect": replicated_rule,
    "tgraph.grouped_matmul": replicated_rule,
    "tgraph.grouped_outer": replicated_rule,
}
for _name in ops.GRAPH_ELEMENTWISE:
    RULES[_name] = elementwise_rule


def rule_for(op, operand_shardings: list[Sharding], ctx: Context) -> Rule:
    """The rule for `op` (an `ir.Operation`) given its operands' shardings."""
    rule = RULES.get(op.name)
    if rule is None:
        raise KeyError(op.name)
    return rule(op, operand_shardings, ctx)


# --------------------------------------------------------------------------
# How a function's values are read: its mesh, argument and result shardings,
# and pending sums reduced for the ops that need them summed.
# --------------------------------------------------------------------------

SHARDING = "tgraph.sharding"
#: Function attribute: reduce pending sums in a fixed order (see Context).
DETERMINISTIC = "tgraph.deterministic"
#: Function attribute: mesh axes whose pending sums are reduce-scattered (each
#: rank keeps a block) rather than all-reduced when a consumer needs them
#: summed; the ZeRO strategy sets it to the data-parallel axis.
SCATTER_AXES = "tgraph.scatter_partials"


def function_mesh(func_op: ir.Operation, meshes: dict[str, Mesh]) -> Mesh | None:
    """The mesh a function is distributed over: the one its argument shardings
    name, or the module's only mesh."""
    names = set()
    for d in arg_attr_dicts(func_op, "arg_attrs") + arg_attr_dicts(func_op, "res_attrs"):
        if SHARDING in d:
            names.add(Sharding.from_attr(d[SHARDING]).mesh)
    if len(names) > 1:
        raise PassError(f"function uses several meshes ({', '.join(sorted(names))}); "
                        "one function must run on one mesh", func_op.location)
    if names:
        return meshes[names.pop()]
    return next(iter(meshes.values())) if len(meshes) == 1 else None


def argument_shardings(func_op: ir.Operation, mesh: Mesh) -> list[Sharding]:
    block = func_op.regions[0].blocks[0]
    result = []
    for arg, d in zip(block.arguments, arg_attr_dicts(func_op, "arg_attrs")):
        rank = ir.RankedTensorType(arg.type).rank
        result.append(Sharding.from_attr(d[SHARDING]) if SHARDING in d
                      else Sharding.replicated(mesh.name, rank))
    return result


def result_shardings(func_op: ir.Operation, types) -> list[Sharding | None]:
    """The annotated shardings of the results; None where a result keeps the
    layout it is computed in (with any pending sum reduced)."""
    return [Sharding.from_attr(d[SHARDING]) if SHARDING in d else None
            for _, d in zip(types, arg_attr_dicts(func_op, "res_attrs"))]


def context_of(func_op: ir.Operation, mesh: Mesh, options=None, target=None) -> Context:
    return Context(mesh, deterministic=DETERMINISTIC in func_op.attributes,
                   context_parallel=options.context_parallel if options else "auto",
                   overlapped=target == "gpu")


def scatter_axes_of(func_op: ir.Operation) -> tuple[str, ...]:
    if SCATTER_AXES not in func_op.attributes:
        return ()
    return tuple(ir.StringAttr(a).value for a in ir.ArrayAttr(func_op.attributes[SCATTER_AXES]))


def _check_shardable(op: ir.Operation) -> None:
    name = op.name
    if name in PER_RANK_OPS:
        raise PassError(f"'{name}' is a per-rank collective and appears only after "
                        "tessera-partition; before it, change a layout with tgraph.shard",
                        op.location)
    if name == "tgraph.grad":
        raise PassError("run tessera-autodiff before tessera-propagate-sharding "
                        "(tgraph.grad is still here)", op.location)
    if not name.startswith("tgraph."):
        raise PassError(f"'{name}' has no sharding rule: only tgraph ops can be distributed",
                        op.location)


def summed(s: Sharding, shape, ctx: Context, scatter_axes=(), only=None) -> Sharding:
    """`s` with its pending sums reduced (those in `only`, default all): a sum
    over one of `scatter_axes` is reduce-scattered, splitting the first
    dimension that divides evenly; any other is all-reduced."""
    dims = [list(d) for d in s.dims]
    partial = list(s.partial)
    for axis in (s.partial if only is None else only):
        partial.remove(axis)
        if axis not in scatter_axes:
            continue
        for d, size in enumerate(shape):
            if size % (ctx.mesh.parts(dims[d]) * ctx.mesh.axis_size(axis)) == 0:
                dims[d].append(axis)
                break
    return Sharding(s.mesh, tuple(tuple(d) for d in dims), tuple(partial))


def use_counts(func_op: ir.Operation) -> dict:
    """How many operands read each value (a value read twice by one op counts twice)."""
    uses: dict = {}
    for op in ops_of(func_op):
        for v in op.operands:
            uses[v] = uses.get(v, 0) + 1
    return uses


def read_sharding(value, s: Sharding, uses: dict, ctx: Context, scatter_axes=()) -> Sharding:
    """The sharding an op reads `value` in. A pending sum several ops read is
    reduced once, before its first reader, rather than carried lazily into
    each (each would then reduce its own copy); a single reader keeps it lazy."""
    if s.partial and uses.get(value, 0) > 1:
        return summed(s, ctx.shape(value), ctx, scatter_axes)
    return s


def op_rule(op: ir.Operation, operands: list[Sharding], ctx: Context,
            scatter_axes=()) -> tuple[Rule, list[Sharding]]:
    """The rule for `op`, and the sharding each operand passes through first.

    The second list differs from `operands` only for a pending sum over one of
    `scatter_axes` that the op needs summed: it is reduce-scattered along its
    first evenly divisible dimension, and the rule is asked again for the
    now split operand (so the op, too, runs on one block per rank)."""
    _check_shardable(op)
    try:
        rule = rule_for(op, operands, ctx)
    except KeyError:
        raise PassError(f"no sharding rule for '{op.name}'", op.location) from None
    if not scatter_axes:
        return rule, operands
    staged = list(operands)
    for i, (have, want) in enumerate(zip(operands, rule.operands)):
        drop = [a for a in have.partial if a in scatter_axes and a not in want.partial
                and a not in {x for d in want.dims for x in d}]
        if drop:
            staged[i] = summed(have, ctx.shape(op.operands[i]), ctx, scatter_axes, only=drop)
    if staged != operands:
        rule = rule_for(op, staged, ctx)
    return rule, staged


def distributed_functions(module_op: ir.Operation) -> list:
    """(function, mesh) for each not-yet-partitioned function that runs on a
    mesh, all found before the caller changes any: partitioning a function
    erases the local-view bodies it inlines, which a lazy walk would then
    touch (a use after free, seen as a rare segfault)."""
    meshes = meshes_of(module_op)
    found = []
    for f in list(functions(module_op)):
        # A local-view body (tgraph.local) is per-rank already: tessera-partition
        # inlines it where its tgraph.spmd calls it.
        if "tgraph.partitioned" in f.attributes or "tgraph.local" in f.attributes:
            continue
        not_graph = non_tensor_signature(f)
        if not_graph:           # Schedule or Tile IR: not this pass's; tgraph ops in it are wrong
            if any(o.name.startswith("tgraph.") for o in ops_of(f)):
                raise PassError(f"function @{symbol_of(f)} holds Graph IR ops but is not a Graph "
                                f"IR function: its {not_graph}, not a tensor", f.location)
            continue
        mesh = function_mesh(f, meshes)
        if mesh is not None:
            found.append((f, mesh))
    return found
