"""tessera-ring-attention: attention over a sequence split, as a ring.

tessera-partition leaves an attention (or attention_grad) whose q and k/v
sequences stay split over a mesh axis marked `ring_axes = ["cp"]`: each
rank holds its block of queries and its block of keys and values. This
pass expands it into `n` steps (n the axis size): at step 0 each rank
attends its queries over its own key/value block; at step t it attends
over the block of rank `r - t`, which arrived by a `tgraph.ring_shift`
started at the previous step (so the transfer overlaps that step's
attention). The steps' partial results merge by their log-sum-exp in the
statistic type (f32, f64 for f64): `lse = logaddexp(lse_a, lse_b)`,
`out = out_a e^(lse_a - lse) + out_b e^(lse_b - lse)`. No rank ever holds
more than two key/value blocks, and nothing moves the whole sequence.

The backward computes each block's gradients from the global `lse` and
`delta` (so a block's probabilities are its share of the whole row's): `dq`
sums on the rank, `dk` and `dv` accumulate in buffers that travel with
their key/value block and take one more shift home.

Causal attention is balanced by striping: the contiguous blocks are
exchanged (one all_to_all each) so that rank `r` holds positions `r, r + n,
r + 2n, ...` in order; then every step's block is half of a square (a
contiguous split would give the last rank n times the first's work and
leave whole blocks masked). Query `m` of rank `r` sees key `m'` of rank
`s` when `m' < m`, or `m' = m` and `s <= r`: at step 0 plain causal; at
step t >= 1 causal over the block with P masked keys in front (`s <= r`,
which is `t <= r`) or P + 1 in front and its last key dropped (`s > r`),
selected by the rank (so every rank runs the same program); P is the
largest divisor of the block up to the kernels' block size, so that their
blocks stay whole (`Ring.front`). The masked keys carry the document id
`PAD_SEGMENT`. Results and gradients are
exchanged back to the contiguous blocks.

The first step's op keeps `ring_axes` (what `dist.inspect` reports); the
others carry `ring_step`. Segment ids travel with their key/value block.
tessera-partition marks an op for the ring only where this pass can take
it: one axis, equal q and k/v lengths, no mask, window or dropout, and for
causal attention a local length the axis size divides.
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph

from tessera_compiler.ir import graph_builder as gb
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.sharding import Sharding, meshes_of
from tessera_compiler.ir.support import PassError, functions, ops_of, run_reporting
from tessera_compiler.ir.tile_builder import largest_divisor

from .tile.flash_attention import CPU_BLOCK

RING_AXES = "ring_axes"
RING_STEP = "ring_step"
#: the document id of the masked keys a striped step puts in front of its block
PAD_SEGMENT = -(2 ** 31)


class Ring:
    """Builds one function's ring steps over mesh axis `axis` (size `n`)."""

    def __init__(self, mesh: str, axis: str, n: int):
        self.mesh, self.axis, self.n = mesh, axis, n
        self.striped: dict = {}      # contiguous value -> striped (and back)

    # -- moving blocks -----------------------------------------------------
    def shift(self, x: ir.Value) -> ir.Value:
        return gb.ring_shift(x, self.mesh, self.axis, 1)

    def shift_all(self, values: list) -> list:
        """Each value shifted once (k and v may be one value)."""
        moved: dict = {}
        for v in values:
            if v not in moved:
                moved[v] = self.shift(v)
        return [moved[v] for v in values]

    def stripe(self, x: ir.Value, seq: int) -> ir.Value:
        """Rank r's contiguous block of `x` along `seq` -> positions r, r + n,
        ... of the whole sequence, in order: the block's rows as [L/n, n],
        the n-column exchanged over the axis (one all_to_all)."""
        n = self.n
        return self._exchange(x, seq, [gb.shape_of(x)[seq] // n, n], seq + 1, seq)

    def unstripe(self, x: ir.Value, seq: int) -> ir.Value:
        """The inverse of `stripe`: back to rank r's contiguous block. (Rank
        j's m-th row is position m n + j: the rows of destination i, m in
        [i L/n, (i+1) L/n), arrive from every j, interleaved by j.)"""
        n = self.n
        return self._exchange(x, seq, [n, gb.shape_of(x)[seq] // n, 1], seq, seq + 2)

    def _exchange(self, x: ir.Value, seq: int, rows: list, split: int, concat: int) -> ir.Value:
        """`x` with its `seq` dimension viewed as `rows`, exchanged over the
        axis (`split` -> `concat`) and viewed back; each value and its
        exchanged twin remembered, so the backward reuses the forward's."""
        if x in self.striped:
            return self.striped[x]
        shape = gb.shape_of(x)
        viewed = gb.reshape(x, shape[:seq] + rows + shape[seq + 1:])
        out = gb.reshape(gb.all_to_all(viewed, self.mesh, self.axis, split, concat, self.n),
                         shape)
        self.striped[x], self.striped[out] = out, x
        return out

    # -- a striped step's key block --------------------------------------------
    def rank_at_least(self, t: int) -> ir.Value:
        """An i1 scalar: this rank's coordinate on the axis is at least `t`."""
        i32 = ir.IntegerType.get_signless(32)
        coords = gb.iota([self.n], 0, i32)
        mine = gb.axis_slice(coords, self.mesh, self.axis, 0, self.n)
        return gb.compare("ge", mine, gb.fill([1], i32, float(t)))

    @staticmethod
    def front(rows: int) -> int:
        """How many masked keys a striped step puts in front of a block of
        `rows`: one at least, and as many as keep the attention kernels'
        blocks whole (they divide both lengths; 1 in front of 1024 keys would
        make the backward's blocks 1 row, gcd(1024, 1025))."""
        return largest_divisor(rows, CPU_BLOCK)

    @staticmethod
    def keyed(x: ir.Value, dim: int, flag: ir.Value, pad: float) -> ir.Value:
        """`x` (a key-side block of L rows along `dim`) as the L + P rows a
        striped step attends over (P = `front(L)`; query row i sits at key
        row i + P): P masked rows in front where `flag` (its block comes from
        a rank at or before this one: keys up to the query's own index),
        else P + 1 in front and its last row dropped (keys before it)."""
        shape = gb.shape_of(x)
        p = Ring.front(shape[dim])
        pads = list(shape)
        pads[dim] = p
        before = gb.concat([gb.fill(pads, gb.element_of(x), pad), x], dim)
        pads[dim] = p + 1
        head = list(shape)
        head[dim] -= 1
        after = gb.concat([gb.fill(pads, gb.element_of(x), pad),
                           gb.slice_(x, [0] * len(shape), head)], dim)
        return _by_rank(flag, before, after)

    @staticmethod
    def unkeyed(g: ir.Value, dim: int, flag: ir.Value, block: int) -> ir.Value:
        """The gradient of `keyed`: L + P rows back to the block's L (`block`)."""
        shape = gb.shape_of(g)
        rows = list(shape)
        p = shape[dim] - block
        rows[dim] = block
        start = [0] * len(shape)
        start[dim] = p
        before = gb.slice_(g, start, rows)
        start[dim] = p + 1
        rows[dim] = block - 1
        tail = gb.slice_(g, start, rows)
        rows[dim] = 1
        after = gb.concat([tail, gb.fill(rows, gb.element_of(g), 0.0)], dim)
        return _by_rank(flag, before, after)


def _by_rank(flag: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """`a` on the ranks whose i1 `flag` ([1]) is set, else `b`."""
    shape = gb.shape_of(a)
    return gb.select(gb.broadcast(gb.reshape(flag, [1] * len(shape)), shape), a, b)


def _spec(spec: gb.AttentionSpec, causal: bool, segments) -> gb.AttentionSpec:
    return gb.AttentionSpec(spec.scale, causal, spec.seq_dim, None, None, segments, spec.softcap)


def _segments(spec: gb.AttentionSpec, q: ir.Value, seq: int):
    """(q ids, k/v ids): the op's, else zeros (one document) shaped [1..., L, 1]."""
    if spec.segments is not None:
        return spec.segments
    rank = len(gb.shape_of(q))
    shape = [1] * (rank - 2) + [gb.shape_of(q)[seq], 1]
    zeros = gb.fill(shape, ir.IntegerType.get_signless(32), 0.0)
    return zeros, zeros


def _merge(acc, step):
    """(out, lse) of two partial attentions over disjoint key sets (out in
    the statistic type). A row masked in both gives out 0, lse -inf."""
    (o1, l1), (o2, l2) = acc, step
    big = gb.binary("max", l1, l2)
    neither = gb.compare("eq", big, gb.full_like(big, float("-inf")))
    big = gb.select(neither, gb.zeros_like(big), big)
    w1 = gb.unary("exp", gb.binary("sub", l1, big))
    w2 = gb.unary("exp", gb.binary("sub", l2, big))
    total = gb.binary("add", w1, w2)
    lse = gb.binary("add", big, gb.unary("log", total))
    empty = gb.compare("eq", total, gb.zeros_like(total))
    total = gb.select(empty, gb.full_like(total, 1.0), total)
    shape = gb.shape_of(o1)
    out = gb.binary("div", gb.binary("add", gb.binary("mul", o1, gb.broadcast(w1, shape)),
                                      gb.binary("mul", o2, gb.broadcast(w2, shape))),
                    gb.broadcast(total, shape))
    return out, lse


def _mark(op_value: ir.Value, step: int, axis: str) -> None:
    op = op_value.owner
    op = getattr(op, "operation", op)
    if step == 0:
        op.attributes[RING_AXES] = ir.ArrayAttr.get([ir.StringAttr.get(axis)])
    else:
        op.attributes[RING_STEP] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), step)


def _striped_inputs(ring: Ring, spec: gb.AttentionSpec, seq: int, values: list):
    """`values` (q first) striped where the attention is causal, and the
    (q, k/v) segment ids: the op's (striped with them), else for a striped
    ring zeros (one document: its masked keys need ids), else None."""
    qs, ks = spec.segments or (None, None)
    if not spec.causal:
        return list(values), qs, ks
    values = [ring.stripe(x, seq) for x in values]
    if spec.segments is None:
        qs, ks = _segments(spec, values[0], seq)
    else:
        qs, ks = (ring.stripe(ids, len(gb.shape_of(ids)) - 2) for ids in (qs, ks))
    return values, qs, ks


def _next_blocks(ring: Ring, spec: gb.AttentionSpec, seq: int, blocks: list, t: int, ks):
    """Step t's blocks, shifted on from step t - 1's `blocks` ([k, v] and
    the op's k/v segment ids, which travel with them; made-up zeros are the
    same everywhere): (blocks, k, v, ids, flag), k, v and ids as a striped
    step attends over them (`Ring.keyed`, `flag` its select; else None)."""
    blocks = ring.shift_all(blocks)
    bk, bv = blocks[:2]
    bs = blocks[2] if spec.segments is not None else ks
    flag = None
    if spec.causal:
        flag = ring.rank_at_least(t)
        bk = Ring.keyed(bk, seq, flag, 0.0)
        bv = bk if blocks[1] == blocks[0] else Ring.keyed(bv, seq, flag, 0.0)
        bs = Ring.keyed(bs, len(gb.shape_of(bs)) - 2, flag, float(PAD_SEGMENT))
    return blocks, bk, bv, bs, flag


def expand_forward(op: ir.Operation, ring: Ring) -> None:
    spec = gb.AttentionSpec.of(op)
    seq = gb.seq_dim_of(op)
    stat = gb.element_of(op.results[1])
    (q, k, v), qs, ks = _striped_inputs(ring, spec, seq, list(op.operands)[:3])
    out, lse = gb.attention(q, k, v, _spec(spec, spec.causal, (qs, ks) if spec.segments else None))
    _mark(out, 0, ring.axis)
    acc = (gb.cast(out, stat), lse)
    blocks = [k, v] + ([ks] if spec.segments is not None else [])
    for t in range(1, ring.n):
        blocks, bk, bv, bs, _ = _next_blocks(ring, spec, seq, blocks, t, ks)
        o_t, l_t = gb.attention(q, bk, bv, _spec(spec, spec.causal,
                                                  (qs, bs) if bs is not None else None))
        _mark(o_t, t, ring.axis)
        acc = _merge(acc, (gb.cast(o_t, stat), l_t))
    out, lse = gb.cast(acc[0], gb.element_of(op.results[0])), acc[1]
    if spec.causal:
        out, lse = ring.unstripe(out, seq), ring.unstripe(lse, seq)
    op.results[0].replace_all_uses_with(out)
    op.results[1].replace_all_uses_with(lse)


def expand_backward(op: ir.Operation, ring: Ring) -> None:
    spec = gb.AttentionSpec.of(op)
    seq = gb.seq_dim_of(op)
    (q, k, v, dout, lse, delta), qs, ks = _striped_inputs(ring, spec, seq,
                                                          list(op.operands)[:6])
    dq, dk, dv = gb.attention_grad(q, k, v, dout, lse, delta,
                                   _spec(spec, spec.causal, (qs, ks) if spec.segments else None))
    _mark(dq, 0, ring.axis)
    blocks = [k, v] + ([ks] if spec.segments is not None else [])
    for t in range(1, ring.n):
        blocks, bk, bv, bs, flag = _next_blocks(ring, spec, seq, blocks, t, ks)
        dk, dv = ring.shift(dk), ring.shift(dv)
        g = gb.attention_grad(q, bk, bv, dout, lse, delta,
                              _spec(spec, spec.causal, (qs, bs) if bs is not None else None))
        _mark(g[0], t, ring.axis)
        gk, gv = g[1:]
        if spec.causal:
            rows = gb.shape_of(k)[seq]
            gk, gv = Ring.unkeyed(gk, seq, flag, rows), Ring.unkeyed(gv, seq, flag, rows)
        dq, dk, dv = gb.binary("add", dq, g[0]), gb.binary("add", dk, gk), gb.binary("add", dv, gv)
    if ring.n > 1:
        dk, dv = ring.shift(dk), ring.shift(dv)
    if spec.causal:
        dq, dk, dv = (ring.unstripe(x, seq) for x in (dq, dk, dv))
    for r, value in zip(op.results, (dq, dk, dv)):
        r.replace_all_uses_with(value)


def _axis_of(op: ir.Operation) -> str:
    attr = op.attributes[RING_AXES]
    if not isinstance(attr, ir.ArrayAttr) or not all(isinstance(a, ir.StringAttr) for a in attr):
        raise PassError(f"ring_axes must be an array of axis names, got {attr}", op.location)
    axes = [a.value for a in attr]
    if len(axes) != 1:
        raise PassError(f"ring attention runs over one mesh axis, got ring_axes {axes}",
                        op.location)
    return axes[0]


def _mesh_of(op: ir.Operation, meshes: dict):
    shardings = op.attributes["tgraph.sharding"] if "tgraph.sharding" in op.attributes else None
    if shardings is None:
        raise PassError("an op marked ring_axes has no tgraph.sharding (run tessera-partition "
                        "first)", op.location)
    if isinstance(shardings, ir.ArrayAttr) and len(shardings):
        shardings = shardings[0]
    if not tgraph.ShardingAttr.isinstance(shardings):
        raise PassError(f"tgraph.sharding must be a #tgraph.sharding, got {shardings}",
                        op.location)
    name = Sharding.from_attr(shardings).mesh
    if name not in meshes:
        raise PassError(f"no mesh @{name}", op.location)
    return meshes[name]


def expand_function(f: ir.Operation, meshes: dict) -> None:
    rings: dict = {}
    for op in ops_of(f):
        if op.name not in gb.ATTENTION_OPS or RING_AXES not in op.attributes or \
                RING_STEP in op.attributes:
            continue
        axis = _axis_of(op)
        mesh = _mesh_of(op, meshes)
        if axis not in mesh.axes:
            raise PassError(f"ring_axes names '{axis}', not an axis of mesh @{mesh.name}",
                            op.location)
        spec = gb.AttentionSpec.of(op)
        if spec.mask is not None or spec.window is not None or spec.dropout_p is not None:
            raise PassError("ring attention takes no mask, window or dropout (tessera-partition "
                            "uses all-to-all or a gather for those)", op.location)
        n = mesh.axis_size(axis)
        seq = gb.seq_dim_of(op)
        q, k = gb.shape_of(op.operands[0]), gb.shape_of(op.operands[1])
        if q[seq] != k[seq]:
            raise PassError(f"ring attention needs equal query and key blocks, got {q[seq]} "
                            f"and {k[seq]}", op.location)
        if spec.causal and q[seq] % n:
            raise PassError(f"causal ring attention stripes its block of {q[seq]} positions "
                            f"over {n} ranks, which does not divide it", op.location)
        ring = rings.setdefault((mesh.name, axis), Ring(mesh.name, axis, n))
        with ir.InsertionPoint(op), op.location:
            if op.name == "tgraph.attention":
                expand_forward(op, ring)
            else:
                expand_backward(op, ring)
        op.erase()


def run(op, pass_, options: TargetOptions):
    def body():
        meshes = meshes_of(op)
        for f in list(functions(op)):
            expand_function(f, meshes)
    run_reporting(op, pass_, body)
