"""Flash-attention Tile IR kernels for `tgraph.attention` and
`tgraph.attention_grad` (built by tessera-lower-to-tile).

Forward, one kernel instance per (batch x head, block of BM query rows):
the query tile stays put while BN-row key/value tiles stream past it in an
`scf.for`. Three loop-carried tiles hold the online softmax: the running
row maximum `m`, the running denominator `l` and the unnormalized output
`acc`; each step rescales them by `exp(m_old - m_new)` (in base 2: see
`LOG2E`). The `[S, S]` score
matrix never exists: only one `BM x BN` block of it, in the kernel. Causal
attention stops the loop at the diagonal block (the upper triangle is never
computed) and masks inside it. The kernel writes `out = acc / l` and the
row log-sum-exp `lse = m + log(l)` for the backward pass.

Backward (FlashAttention-2 order), two kernels, neither with atomics, so
the gradients are deterministic:

* `_dkdv`, per key block: loops over query blocks, recomputes the
  transposed blocks `P^T = exp(K Q^T - lse^T)` and
  `dS^T = P^T * (V dO^T - delta^T)` (key rows, so each is the A operand
  of the next dot as it stands), accumulates `dV += P^T dO` and
  `dK += dS^T Q`;
* `_dq`, per query block: loops over key blocks, accumulates `dQ += dS K`.

On the CPU (f32, f64) the two are one kernel, `_bwd` (per key/value head):
no atomics are needed where one instance owns a head's whole sequence, so
`_dkdv`'s steps also add `dS K` into the dQ buffer, and P and dS are
computed once per block instead of twice (`_cpu_backward_kernel`).

`delta = rowsum(dO * out)` comes from Graph IR (tessera-autodiff emits it).

What a query may attend to is decided per score block, inside the kernels:
`causal` and `window` by comparing iotas of the positions (query row `i`
sits at `i + Sk - Sq`), the additive mask by loading its `[BM, BN]` block
(or `[1, BN]` row, broadcast) and adding it to the scaled scores (the
softmax then runs in natural units: float32's lowest, HF's mask value,
would overflow in base 2), segment ids by comparing a column of the
query block's ids with a row of the key block's. Blocks no query of the
block can see are never visited: the causal loops stop at the diagonal and
windowed ones start at the window. Where a row can lose every key (a mask,
segment ids, more queries than keys), the online softmax takes its offset
as 0 while the row's maximum is still -inf, an empty row divides by 1 (out
= 0, lse = -inf) and the backward reads lse = -inf as 0 (p = 0).

Dropout (`dropout_p`) multiplies each probability block by its factor Z (0
or 1/(1-p), `ttile.dropout_factor`: the word of the score's flat index in
the global [L..., Sq, Sk] probabilities, drawn again in the backward,
never stored) before it meets V; the denominator `l` and `lse` stay the
undropped softmax's. Backward: dV += (P Z)^T dO, dS = P (Z dP - delta),
with delta = rowsum(dO out) as without dropout.

Grouped key/value heads (k, v with leading dimensions that divide q's) are
read in place: a query head's tiles come from its group's key/value head.
`_dkdv` runs per key/value head and its loop visits every query block of
every head of the group, so dK and dV sum the group without atomics.

The block sizes are in the tile types, `warps` on every `ttile.dot` and
`stages` on the kernel, like a GEMM's; `attention_config` picks them.
Half-precision operands multiply in bf16/f16 with f32 accumulation, and the
softmax runs in f32; probabilities are rounded to the operand type before
they multiply `V` (as every flash-attention implementation does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tessera_mlir import ir
from tessera_mlir.dialects import arith, scf, tgraph, ttile

from tessera_compiler.ir import graph_builder as gb
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.support import PassError
from tessera_compiler.ir.tile_builder import (THREADS_PER_BLOCK, grid_offsets, i64, index,
                                              largest_divisor, new_kernel, tile_type)
from tessera_compiler.ir.types import shape_of, tile_of

CPU_BLOCK = 64
#: Each warp owns 16 query rows, so BM rows take BM / 16 warps, up to
#: MAX_WARPS: BM = 128 is two warpgroups, each a wgmma of M = 64 on the
#: same key/value tiles, which halves the shared-memory traffic per score
#: of 64-row blocks (FlashAttention-3's consumer split). Whether that beats
#: two 64-row blocks per SM is the GPU's answer (bench/attention_cuda.py's
#: `wgmma:128xBN` variants).
MAX_WARPS = 8

# The softmax runs in base 2 (exp2, which the GPU computes directly): scores
# and the running maximum are kept multiplied by log2(e), the log-sum-exp
# the backward reads is natural (m ln 2 + log l).
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453


@dataclass(frozen=True)
class AttentionConfig:
    bm: int                                  # query rows per kernel instance
    bn: int                                  # key/value rows per loop step
    warps: int | None = None                 # warps per block (each dot splits them)
    stages: int | None = None                # key/value tiles in flight
    wgmma: bool = False                      # dots of whole warpgroups ask for wgmma
    tma: bool = False                        # the loop's tiles are loaded with TMA (wgmma only)
    pingpong: bool = False                   # two warpgroups take turns at the tensor cores
    issue_ahead: bool = False                # the next step's scores issued under this softmax

    @property
    def threads(self) -> int:
        return self.warps * 32 if self.warps else THREADS_PER_BLOCK


def attention_config(seq_q: int, seq_k: int, head_dim: int, cpu: bool, forward: bool,
                     options: TargetOptions) -> AttentionConfig:
    """Block sizes for `seq_q` queries over `seq_k` keys and head width
    `head_dim` (the larger of q's and v's), of the forward kernel or the
    backward's (`options.attention_forward_blocks`,
    `attention_backward_blocks`). The backward's kernels take each block
    size along both sequences (`_dkdv` the forward's blocks transposed), so
    there both divide both lengths."""
    if not forward:
        seq_q = seq_k = math.gcd(seq_q, seq_k)
    if cpu:
        return AttentionConfig(largest_divisor(seq_q, CPU_BLOCK), largest_divisor(seq_k, CPU_BLOCK))
    blocks = options.attention_forward_blocks if forward else options.attention_backward_blocks
    bm, bn = next((v for width, v in blocks if head_dim <= width), (8, 8))
    bm, bn = largest_divisor(seq_q, bm), largest_divisor(seq_k, bn)
    # Warps of 16 query rows each (FlashAttention-2's split).
    warps = min(MAX_WARPS, bm // 16) if bm % 16 == 0 and bn % 16 == 0 else None
    return AttentionConfig(bm, bn, warps, 2)


@dataclass(frozen=True)
class Geometry:
    """The shapes of one attention op: q's leading (batch, head) dimensions
    `lead` and k's `kv_lead` (each divides q's), `sq` queries over `sk`
    keys, head widths `d` (q, k) and `dv` (v), and the mask's leading
    extent (1 or q's per dimension), if any, and the query and key segment
    ids' (each its own)."""
    lead: list
    kv_lead: list
    sq: int
    sk: int
    d: int
    dv: int
    mask_lead: list | None = None
    mask_rows: int = 1
    q_segment_lead: list | None = None
    kv_segment_lead: list | None = None

    @property
    def offset(self) -> int:
        """Query row i sits at position i + offset."""
        return self.sk - self.sq

    @property
    def groups(self) -> list[int]:
        """Query heads per key/value head, per leading dimension."""
        return [q // k for q, k in zip(self.lead, self.kv_lead)]


# -- builders ------------------------------------------------------------------

class _Builder:
    """Tile IR for one attention kernel; `self.elt` is the operands' element
    type, the softmax and accumulators are f32 (f64 for f64 operands).
    Every q/k/v operand's rows run along buffer dimension `seq_dim` of
    `rank`; `geo` and `spec` are the op's shapes and masks, `sides` the
    kernel's mask and segment buffers (set per kernel)."""

    def __init__(self, cfg: AttentionConfig, elt: ir.Type, spec: gb.AttentionSpec, seq_dim: int,
                 rank: int, geo: Geometry):
        self.cfg, self.elt, self.spec = cfg, elt, spec
        self.scale, self.causal = spec.scale, spec.causal
        self.window, self.has_mask, self.has_segments = spec.window, spec.mask is not None, \
            spec.segments is not None
        self.softcap, self.dropout = spec.softcap, spec.dropout_p
        self.seq_dim, self.rank, self.geo = seq_dim, rank, geo
        self.acc = elt if isinstance(elt, ir.F64Type) else ir.F32Type.get()
        self.half = elt != self.acc
        self.mask_buf = self.q_seg_buf = self.kv_seg_buf = self.seeds_buf = None
        # With an additive mask the scores are scaled and biased in the block
        # (scale * s + mask) and the softmax runs in natural units: a finite
        # mask as low as float32's lowest (HF's) would overflow to -inf in
        # raw-score or base-2 units and empty a row it only pushes down.
        self.natural = self.has_mask or self.softcap is not None
        # A row may see no key of a block while it has seen none before (its
        # maximum is -inf), or none at all: the softmax guards the -inf.
        self.may_empty = self.has_mask or self.has_segments or self.window is not None or \
            (self.causal and geo.offset < 0)

    def with_sides(self, bufs: list[ir.Value]) -> "_Builder":
        """Takes the kernel's mask, segment and dropout seed buffers (in
        operand order)."""
        bufs = list(bufs)
        self.mask_buf = bufs.pop(0) if self.has_mask else None
        self.seeds_buf = bufs.pop() if self.dropout is not None else None
        self.q_seg_buf, self.kv_seg_buf = bufs if self.has_segments else (None, None)
        return self

    def at(self, lead, row: ir.Value) -> tuple[list[ir.Value], ir.Attribute | None]:
        """(offsets, dims) of the tile at batch offsets `lead` and sequence
        row `row`: the row goes in at `seq_dim`; a sequence dimension other
        than the second to last is read where it lies (`dims`)."""
        offsets = lead[:self.seq_dim] + [row] + lead[self.seq_dim:] + [index(0)]
        trailing = self.seq_dim == self.rank - 2
        return offsets, None if trailing else ir.DenseI64ArrayAttr.get([self.seq_dim,
                                                                        self.rank - 1])

    def kv_at(self, at: list[ir.Value]) -> list[ir.Value]:
        """The key/value head (batch offsets) query offsets `at` read."""
        return [a if g == 1 else arith.DivUIOp(a, index(g)).result
                for a, g in zip(at, self.geo.groups)]

    @staticmethod
    def side_at(at: list[ir.Value], extent: list[int]) -> list[ir.Value]:
        """Offsets `at` in a mask or segment buffer whose leading extents are
        `extent` (1: shared along that dimension)."""
        return [a if n > 1 else index(0) for a, n in zip(at, extent)]

    def fill(self, shape, value: float, element=None) -> ir.Value:
        return ttile.FillOp(tile_type(shape, element or self.acc), ir.FloatAttr.get_f64(value)).result

    def load(self, buf: ir.Value, lead, row: ir.Value, shape, element=None) -> ir.Value:
        offsets, dims = self.at(lead, row)
        return ttile.LoadOp(tile_type(shape, element or self.elt), buf, offsets, dims=dims).result

    def stream(self, buf: ir.Value, lead, row: ir.Value, shape) -> ir.Value:
        """A tile the loop loads each step (the B operand of its dots)."""
        offsets, dims = self.at(lead, row)
        return ttile.LoadOp(tile_type(shape, self.elt), buf, offsets,
                            tma=self.cfg.tma or None, dims=dims).result

    def dot(self, a: ir.Value, b: ir.Value, acc: ir.Value | None = None) -> ir.Value:
        (m, _), (_, n) = self.shape(a), self.shape(b)
        acc = acc if acc is not None else self.fill([m, n], 0.0)
        warps = None
        if self.cfg.warps:
            # The kernel's warps over M in 16-row slices first, then over N.
            total = self.cfg.warps
            wm = next((w for w in range(min(total, m // 16), 0, -1)
                       if total % w == 0 and m % (16 * w) == 0), 1)
            if n % (total // wm) == 0:
                warps = (wm, total // wm)
        # wgmma: each warpgroup's 64 rows in 16-row warps (the emitter keeps
        # mma.sync where the tiles' layout does not allow it).
        wgmma = self.cfg.wgmma and warps is not None and warps[1] == 1 and warps[0] % 4 == 0 \
            and m == 16 * warps[0]
        return ttile.DotOp(a, b, acc, warps=ir.DenseI64ArrayAttr.get(list(warps))
                           if warps else None, wgmma=wgmma or None).result

    @staticmethod
    def shape(v: ir.Value) -> list[int]:
        return tile_of(v.type)[0]

    def transpose(self, v: ir.Value) -> ir.Value:
        (m, n), element = tile_of(v.type)
        return ttile.TransposeOp(tile_type([n, m], element), v).result

    def operand(self, v: ir.Value) -> ir.Value:
        """An f32 tile rounded to the operand type, for a tensor-core dot."""
        if not self.half:
            return v
        return ttile.CastOp(tile_type(self.shape(v), self.elt), v).result

    def _positions(self, shape, start: ir.Value, dim: int, plus: int = 0) -> ir.Value:
        """An i32 tile counting from `start + plus` along `dim`."""
        if plus:
            start = arith.AddIOp(start, index(plus)).result
        return ttile.IotaOp(tile_type(shape, _i32()), start, i64(dim)).result

    def _compare(self, kind: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return ttile.CompareOp(tile_type(self.shape(a), ir.IntegerType.get_signless(1)), a, b,
                               tgraph.CompareKindAttr.get(kind)).result

    def _mask_scores(self, s, at, row, col, transposed: bool):
        """Scores `s` ([queries, keys] from query row `row` and key `col`,
        or their transpose) with the keys no query may see at -inf; in
        `natural` units scaled (and soft-capped) first, the additive mask
        added. Also the soft cap's derivative 1 - tanh^2 (None without)."""
        shape = self.shape(s)
        slope = None
        if self.natural:
            s = ttile.MulOp(s, self.fill(shape, self.scale)).result
        if self.softcap is not None:     # c tanh(s / c), and d/ds = 1 - tanh^2
            th = ttile.TanhOp(ttile.MulOp(s, self.fill(shape, 1.0 / self.softcap)).result).result
            s = ttile.MulOp(th, self.fill(shape, self.softcap)).result
            slope = ttile.SubOp(self.fill(shape, 1.0), ttile.MulOp(th, th).result).result
        qd, kd = (1, 0) if transposed else (0, 1)
        keep = []
        if self.causal or self.window:
            queries = self._positions(shape, row, qd, self.geo.offset)
        if self.causal:
            keep.append(self._compare("ge", queries, self._positions(shape, col, kd)))
        if self.window:             # pos - key < W, i.e. key + W > pos
            keep.append(self._compare("gt", self._positions(shape, col, kd, self.window),
                                      queries))
        if self.has_segments:
            bq, bk = shape[qd], shape[kd]
            mine = ttile.LoadOp(tile_type([bq, 1], _i32()), self.q_seg_buf,
                                self.side_at(at, self.geo.q_segment_lead) +
                                [row, index(0)]).result
            theirs = ttile.LoadOp(tile_type([bk, 1], _i32()), self.kv_seg_buf,
                                  self.side_at(at, self.geo.kv_segment_lead) +
                                  [col, index(0)]).result
            if transposed:
                mine, theirs = self.transpose(mine), theirs
            else:
                theirs = self.transpose(theirs)
            keep.append(self._compare("eq", ttile.BroadcastOp(tile_type(shape, _i32()), mine).result,
                                      ttile.BroadcastOp(tile_type(shape, _i32()), theirs).result))
        for k in keep:
            s = ttile.SelectOp(k, s, self.fill(shape, float("-inf"))).result
        if self.has_mask:
            bq, bk = shape[qd], shape[kd]
            rows = bq if self.geo.mask_rows > 1 else 1
            offsets = self.side_at(at, self.geo.mask_lead) + [row if rows > 1 else index(0), col]
            bias = ttile.LoadOp(tile_type([rows, bk], self.acc), self.mask_buf, offsets).result
            if rows != bq:
                bias = self.broadcast(bias, [bq, bk])
            if transposed:
                bias = self.transpose(bias)
            s = ttile.AddOp(s, bias).result
        return s, slope

    def dropout_seeds(self, at) -> tuple | None:
        """(seed, step, the flat index of its first probability) of query
        head `at`, read from its row of the seeds buffer (None without
        dropout): once per head, outside the loops that stay on one head."""
        if self.dropout is None:
            return None
        seed, step, head = (ttile.LoadScalarOp(self.seeds_buf, list(at) + [index(0), index(i)])
                            .result for i in range(3))
        return seed, step, arith.MulIOp(head, index(self.geo.sq * self.geo.sk)).result

    def dropout_factor(self, seeds, row, col, transposed: bool = False) -> ir.Value | None:
        """Dropout's factor (0 or 1/(1-p)) of each probability of the block
        of query rows from `row` and keys from `col` of the head whose
        `dropout_seeds` are `seeds` (or of its transpose), None without."""
        if seeds is None:
            return None
        seed, step, first = seeds
        sk = self.geo.sk
        base = arith.AddIOp(first, arith.AddIOp(arith.MulIOp(row, index(sk)).result,
                                                col).result).result
        rows, cols = (self.cfg.bn, self.cfg.bm) if transposed else (self.cfg.bm, self.cfg.bn)
        strides = [1, sk] if transposed else [sk, 1]
        return ttile.DropoutFactorOp(tile_type([rows, cols], self.acc), seed, step, base,
                                     ir.FloatAttr.get_f64(self.dropout),
                                     ir.DenseI64ArrayAttr.get(strides)).result

    def scores(self, q, k, at, row, col, transposed: bool = False):
        """(scores, the soft cap's slope or None): q k^T ([queries, keys],
        not yet scaled) for query rows from `row` and keys from `col`, or
        its transpose k q^T ([keys, queries]), with the keys no query may
        attend to masked (`at`: the query head); in `natural` units (a mask
        or a soft cap) c tanh(scale s / c) + mask."""
        s = self.dot(k, self.transpose(q)) if transposed else self.dot(q, self.transpose(k))
        if self.causal or self.natural or self.has_segments:
            return self._mask_scores(s, at, row, col, transposed)
        return s, None

    def exp_scaled(self, s: ir.Value, offset: ir.Value) -> ir.Value:
        """exp(scale * s - offset) for scores `s` and a tile `offset` in base-2
        units (offset / ln 2): exp2(s * scale log2(e) - offset), where the
        scale and the conversion to base 2 are one multiply (one FMA with
        the subtraction) and 2^x is the special-function unit's own.
        `natural`: exp(s - offset) of scaled scores."""
        if self.natural:
            return ttile.ExpOp(ttile.SubOp(s, offset).result).result
        scaled = ttile.MulOp(s, self.fill(self.shape(s), self.scale * LOG2E)).result
        return self.exp(ttile.SubOp(scaled, offset).result)

    def exp(self, x: ir.Value) -> ir.Value:
        """e^x in the softmax's units (2^x in base 2)."""
        return (ttile.ExpOp if self.natural else ttile.Exp2Op)(x).result

    def finite(self, x: ir.Value, value: float, where: float = float("-inf")) -> ir.Value:
        """`x` with its entries equal to `where` replaced by `value` (only
        where a row may lose every key)."""
        if not self.may_empty:
            return x
        shape = self.shape(x)
        hit = self._compare("eq", x, self.fill(shape, where))
        return ttile.SelectOp(hit, self.fill(shape, value), x).result

    def broadcast(self, column: ir.Value, shape) -> ir.Value:
        """A [m, 1] column or [1, n] row repeated to `shape`."""
        return ttile.BroadcastOp(tile_type(shape, self.acc), column).result

    def row_reduce(self, x: ir.Value, kind: str) -> ir.Value:
        m, _ = self.shape(x)
        return ttile.ReduceOp(tile_type([m, 1], self.acc), x,
                              tgraph.ReductionKindAttr.get(kind), i64(1)).result

    def store(self, v: ir.Value, buf: ir.Value, lead, row: ir.Value) -> None:
        shape, element = tile_of(v.type)
        target = ir.MemRefType(buf.type).element_type
        if str(target) != element:
            v = ttile.CastOp(tile_type(shape, target), v).result
        offsets, dims = self.at(lead, row)
        ttile.StoreOp(v, buf, offsets, dims=dims)

    # -- loop bounds ---------------------------------------------------------------

    def key_range(self, row: ir.Value, rows: int, step: int) -> tuple[ir.Value, ir.Value]:
        """[start, end) of the key blocks (multiples of `step`) query rows
        `row .. row + rows` may see: up to the diagonal when causal, from
        the window's first key when windowed."""
        off = self.geo.offset
        end = index(self.geo.sk)
        if self.causal:
            last = arith.AddIOp(row, index(rows + off)).result
            end = _round_up(_at_least_zero(last) if off < 0 else last, step)
        start = index(0)
        if self.window:
            first = arith.AddIOp(row, index(off - self.window + 1)).result
            start = _round_down(_at_least_zero(first), step)
        return start, end

    def query_range(self, col: ir.Value, cols: int, step: int) -> tuple[ir.Value, ir.Value]:
        """[start, end) of the query blocks (multiples of `step`) that may see
        keys `col .. col + cols`."""
        off = self.geo.offset
        start, end = index(0), index(self.geo.sq)
        if self.causal:         # queries at or after the first key: i + off >= col
            first = arith.SubIOp(col, index(off)).result if off else col
            start = _round_down(_at_least_zero(first) if off > 0 else first, step)
        if self.window:         # the last key within reach: i + off - W + 1 <= col + cols - 1
            last = arith.AddIOp(col, index(cols - 1 - off + self.window)).result
            end = arith.MinSIOp(_round_up(_at_least_zero(last), step), end).result
        return start, end


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def _at_least_zero(x: ir.Value) -> ir.Value:
    return arith.MaxSIOp(x, index(0)).result


def _round_up(x: ir.Value, step: int) -> ir.Value:
    """The first multiple of `step` at or after `x` (>= 0)."""
    end = arith.AddIOp(x, index(step - 1)).result
    return arith.MulIOp(arith.DivUIOp(end, index(step)).result, index(step)).result


def _round_down(x: ir.Value, step: int) -> ir.Value:
    """The last multiple of `step` at or before `x` (>= 0)."""
    return arith.MulIOp(arith.DivUIOp(x, index(step)).result, index(step)).result


def _kernel(name: str, bufs: list[ir.Value], grid: int, cfg: AttentionConfig, module_block,
            loc) -> tuple[ir.Operation, list[ir.Value]]:
    kernel, entry = new_kernel(name, [ir.MemRefType(b.type) for b in bufs], grid, cfg.threads,
                               [cfg.bm, cfg.bn], module_block, loc, cfg.stages)
    return kernel, list(entry.arguments)


def _geometry(op, spec: gb.AttentionSpec) -> Geometry:
    q, k, v = list(op.operands)[:3]
    shape, kv_shape, seq_dim = shape_of(q), shape_of(k), gb.seq_dim_of(op)

    def lead(s):
        return s[:seq_dim] + s[seq_dim + 1:-1]
    mask = shape_of(spec.mask) if spec.mask is not None else None
    q_ids, kv_ids = (shape_of(t)[:-2] for t in spec.segments) if spec.segments else (None, None)
    return Geometry(lead(shape), lead(kv_shape), shape[seq_dim], kv_shape[seq_dim], shape[-1],
                    shape_of(v)[-1], mask[:-2] if mask else None, mask[-2] if mask else 1,
                    q_ids, kv_ids)


def _setup(op, cpu: bool, forward: bool, options: TargetOptions):
    q = op.operands[0]
    shape, seq_dim = shape_of(q), gb.seq_dim_of(op)
    spec = gb.AttentionSpec.of(op)
    geo = _geometry(op, spec)
    if seq_dim != len(shape) - 2 and not cpu:
        raise PassError("tessera-lower-to-tile: GPU attention kernels read [..., S, D] operands; "
                        "tessera-lower-to-schedule moves seq_dim there first", op.location)
    cfg = attention_config(geo.sq, geo.sk, max(geo.d, geo.dv), cpu, forward, options)
    elt = ir.ShapedType(q.type).element_type
    if str(elt) not in ("f64", "f32", "bf16", "f16"):
        raise PassError(f"tessera-lower-to-tile: attention on {elt} operands is not supported "
                        "(f64, f32, bf16, f16)", op.location)
    d, dv = geo.d, geo.dv
    # The register-resident wgmma loops (gpu_software_pipeline) take bf16
    # tiles streamed by TMA and no index arithmetic: masked, grouped and
    # offset kernels keep their loops in shared memory (cp.async).
    plain = spec.mask is None and not spec.segments and not spec.window and \
        spec.softcap is None and spec.dropout_p is None and geo.sq == geo.sk and \
        geo.lead == geo.kv_lead
    # Hopper's wgmma where bf16 tiles are whole 128-byte swizzle atoms (head
    # widths multiples of 64) for whole warpgroups of 16-row warps.
    if options.wgmma and not cpu and str(elt) == "bf16" and cfg.warps and cfg.warps % 4 == 0 \
            and cfg.bm == 16 * cfg.warps \
            and d % 64 == 0 and dv % 64 == 0:
        # (TMA's tensor maps take buffers of rank 5 at most.)
        cfg = replace(cfg, wgmma=True, tma=plain and options.tma and len(geo.lead) <= 3,
                      pingpong=plain and options.pingpong and cfg.warps == 8)
        if forward and options.issue_ahead and cfg.tma and not cfg.pingpong:
            cfg = replace(cfg, issue_ahead=True, stages=3)
    b = _Builder(cfg, elt, spec, seq_dim, len(shape), geo)
    return geo, cfg, b


def forward_kernel(op, name: str, ins, outs, module_block, cpu: bool,
                   options: TargetOptions) -> ir.Operation:
    """The flash-attention forward kernel of `tgraph.attention` `op` over
    buffers `ins` (q, k, v, then the mask and segment ids it has) and
    `outs` (out, lse)."""
    geo, cfg, b = _setup(op, cpu, True, options)
    bm, bn, d, dv = cfg.bm, cfg.bn, geo.d, geo.dv
    grid = math.prod(geo.lead + [geo.sq // bm])
    kernel, (q_buf, k_buf, v_buf, *sides, o_buf, lse_buf) = _kernel(
        name, list(ins) + list(outs), grid, cfg, module_block, op.location)
    b.with_sides(sides)
    with ir.InsertionPoint(kernel.regions[0].blocks[0]), op.location:
        *at, qi = grid_offsets(geo.lead + [geo.sq // bm], [1] * (len(geo.lead) + 1))
        kv = b.kv_at(at)
        row = arith.MulIOp(qi, index(bm)).result
        q = b.load(q_buf, at, row, [bm, d])
        start, end = b.key_range(row, bm, bn)
        seeds = b.dropout_seeds(at)
        m0, l0 = b.fill([bm, 1], float("-inf")), b.fill([bm, 1], 0.0)
        loop = scf.ForOp(start, end, index(bn), [m0, l0, b.fill([bm, dv], 0.0)])
        for marked in ("pingpong", "issue_ahead"):
            if getattr(cfg, marked):
                loop.operation.attributes[f"ttile.{marked}"] = ir.UnitAttr.get()
        with ir.InsertionPoint(loop.body):
            col = loop.induction_variable
            m, l, acc = loop.inner_iter_args
            k = b.stream(k_buf, kv, col, [bn, d])
            v = b.stream(v_buf, kv, col, [bn, dv])
            s, _ = b.scores(q, k, at, row, col)
            # The running maximum m is of scale * s in base-2 units: the row
            # maximum of the raw scores times scale log2(e) (> 0: it commutes
            # with max), so each score costs one FMA before its 2^x.
            m_block = b.row_reduce(s, "max")
            if not b.natural:
                m_block = ttile.MulOp(m_block, b.fill([bm, 1], b.scale * LOG2E)).result
            m_new = ttile.MaxOp(m, m_block).result
            # (A row that has seen no key yet keeps m = -inf: offset 0.)
            m_offset = b.finite(m_new, 0.0)
            p = b.exp_scaled(s, b.broadcast(m_offset, [bm, bn]))
            alpha = b.exp(ttile.SubOp(m, m_offset).result)
            l_new = ttile.AddOp(ttile.MulOp(l, alpha).result, b.row_reduce(p, "sum")).result
            scaled = ttile.MulOp(acc, b.broadcast(alpha, [bm, dv])).result
            z = b.dropout_factor(seeds, row, col)
            if z is not None:           # (l above: the undropped denominator)
                p = ttile.MulOp(p, z).result
            scf.YieldOp([m_new, l_new, b.dot(b.operand(p), v, scaled)])
        m, l, acc = loop.results
        b.store(ttile.DivOp(acc, b.broadcast(b.finite(l, 1.0, 0.0), [bm, dv])).result, o_buf,
                at, row)
        m_natural = m if b.natural else ttile.MulOp(m, b.fill([bm, 1], LN2)).result
        b.store(ttile.AddOp(m_natural, ttile.LogOp(l).result).result, lse_buf, at, row)
        ttile.ReturnOp()
    return kernel


def _probabilities(b: _Builder, scores, lse, do, v, delta, transposed: bool = False, z=None):
    """(P, dS) of one score block (`scores`: `_Builder.scores`'): P =
    exp(S - lse), dS = P (dO V^T - delta), times the soft cap's slope;
    `transposed`: (P^T, dS^T) of a transposed block S^T ([keys, queries]),
    with `lse` and `delta` as rows: dS^T = P^T (V dO^T - delta^T). With
    dropout's factors `z`: (P Z, P (Z dP - delta)), P Z what met V."""
    s, slope = scores
    shape = b.shape(s)
    if b.natural:
        lse2 = b.broadcast(lse, shape)
    elif b.shape(lse)[1] == 1:          # a column: converted once per row
        lse2 = b.broadcast(ttile.MulOp(lse, b.fill(b.shape(lse), LOG2E)).result, shape)
    else:                               # a row (the transposed block's): in the FMA
        lse2 = ttile.MulOp(b.broadcast(lse, shape), b.fill(shape, LOG2E)).result
    p = b.exp_scaled(s, lse2)
    dp = b.dot(v, b.transpose(do)) if transposed else b.dot(do, b.transpose(v))
    if z is not None:
        dp = ttile.MulOp(dp, z).result
    ds = ttile.MulOp(p, ttile.SubOp(dp, b.broadcast(delta, shape)).result).result
    if slope is not None:
        ds = ttile.MulOp(ds, slope).result
    return (p if z is None else ttile.MulOp(p, z).result), ds


def _group_member(b: _Builder, kv_at: list[ir.Value], g: ir.Value) -> list[ir.Value]:
    """Batch offsets of query head `g` (0 .. G-1, row-major over the
    grouped dimensions) of the group reading key/value offsets `kv_at`."""
    at, inner = [], math.prod(b.geo.groups)
    for a, n in zip(kv_at, b.geo.groups):
        if n == 1:
            at.append(a)
            continue
        inner //= n
        member = arith.RemUIOp(arith.DivUIOp(g, index(inner)).result, index(n)).result
        at.append(arith.AddIOp(arith.MulIOp(a, index(n)).result, member).result)
    return at


def _key_block(kb: _Builder, bufs, kv_at, col, group: int, each_step=None) -> None:
    """dK and dV of the key block at `col` of key/value head `kv_at`, stored
    there: `_dkdv`'s loop over the query blocks that see it, of every query
    head of the group. Each step computes the transposed blocks P^T and
    dS^T ([keys, queries]: key rows, so each is the A operand of dV's and
    dK's dots as it stands; lse and delta run along their columns);
    `each_step(head offsets, row, dS^T, k)` then adds what else the kernel
    makes of them (the CPU kernel's dQ)."""
    q_buf, k_buf, v_buf, do_buf, lse_buf, delta_buf, dk_buf, dv_buf = bufs
    bm, bn, d, dv = kb.cfg.bm, kb.cfg.bn, kb.geo.d, kb.geo.dv
    k = kb.load(k_buf, kv_at, col, [bn, d])
    v = kb.load(v_buf, kv_at, col, [bn, dv])
    start, end = kb.query_range(col, bn, bm)
    seeds = kb.dropout_seeds(kv_at) if group == 1 else None
    loop, place = _query_blocks(kb, start, end, group,
                                [kb.fill([bn, d], 0.0), kb.fill([bn, dv], 0.0)])
    with ir.InsertionPoint(loop.body):
        row, at = place(kv_at)
        head_seeds = seeds if group == 1 else kb.dropout_seeds(at)
        dk_acc, dv_acc = loop.inner_iter_args
        q = kb.stream(q_buf, at, row, [bm, d])
        do = kb.stream(do_buf, at, row, [bm, dv])
        lse = kb.transpose(kb.finite(kb.load(lse_buf, at, row, [bm, 1], kb.acc), 0.0))
        delta = kb.transpose(kb.load(delta_buf, at, row, [bm, 1], kb.acc))
        scores = kb.scores(q, k, at, row, col, transposed=True)
        pt, dst = _probabilities(kb, scores, lse, do, v, delta, transposed=True,
                                 z=kb.dropout_factor(head_seeds, row, col, transposed=True))
        dv_new = kb.dot(kb.operand(pt), do, dv_acc)
        dk_new = kb.dot(kb.operand(dst), q, dk_acc)
        if each_step is not None:
            each_step(at, row, dst, k)
        scf.YieldOp([dk_new, dv_new])
    dk_acc, dv_acc = loop.results
    kb.store(ttile.MulOp(dk_acc, kb.fill([bn, d], kb.scale)).result, dk_buf, kv_at, col)
    kb.store(dv_acc, dv_buf, kv_at, col)


def _query_blocks(kb: _Builder, start: ir.Value, end: ir.Value, group: int, accs: list):
    """The loop over the query blocks [start, end) of every query head of a
    key/value head's group (head t / span, then query row start + t % span
    at step t) carrying `accs`; (loop, a function giving the step's (row,
    head offsets) from the key/value head's offsets)."""
    bm = kb.cfg.bm
    if group == 1:
        loop = scf.ForOp(start, end, index(bm), accs)
        return loop, lambda kv_at: (loop.induction_variable, kv_at)
    span = arith.SubIOp(end, start).result
    total = arith.MulIOp(_at_least_zero(span), index(group)).result
    loop = scf.ForOp(index(0), total, index(bm), accs)

    def place(kv_at):
        t = loop.induction_variable
        return (arith.AddIOp(start, arith.RemUIOp(t, span).result).result,
                _group_member(kb, kv_at, arith.DivUIOp(t, span).result))
    return loop, place


def _cpu_backward_kernel(op, name: str, ins, outs, module_block, kb: _Builder) -> ir.Operation:
    """The CPU's one backward kernel, per key/value head: for each key block
    the `_dkdv` loop over the query blocks that see it, where each step also
    adds dS K into the query block's dQ, kept in the dQ buffer (zeroed
    first, scaled last). P and dS are computed once per block, not once for
    dK/dV and again for dQ: two of the seven dots per block and half the
    exponentials. The same bits as the two GPU-form kernels: every dQ
    element sums the same products in the same order (key blocks ascending),
    dS is dS^T transposed. An instance writes only its group's dQ rows, so
    the grid needs no atomics either; f32 and f64 only (a half dQ buffer
    would round the running sums). `kb` builds with `_dkdv`'s blocks (the
    forward's transposed)."""
    geo = kb.geo
    bm, bn, d = kb.cfg.bm, kb.cfg.bn, geo.d
    group = math.prod(geo.groups)
    kernel, (q_buf, k_buf, v_buf, do_buf, lse_buf, delta_buf, *sides, dq_buf, dk_buf,
             dv_buf) = _kernel(f"{name}_bwd", list(ins) + list(outs), math.prod(geo.kv_lead),
                               kb.cfg, module_block, op.location)
    kb.with_sides(sides)
    with ir.InsertionPoint(kernel.regions[0].blocks[0]), op.location:
        kv_at = grid_offsets(geo.kv_lead, [1] * len(geo.kv_lead))

        def each_query_block(body):
            """`body(head offsets, row)` for every query block of the group."""
            loop, place = _query_blocks(kb, index(0), index(geo.sq), group, [])
            with ir.InsertionPoint(loop.body):
                row, at = place(kv_at)
                body(at, row)
                scf.YieldOp([])

        each_query_block(lambda at, row: kb.store(kb.fill([bm, d], 0.0), dq_buf, at, row))
        outer = scf.ForOp(index(0), index(geo.sk), index(bn), [])
        with ir.InsertionPoint(outer.body):
            def add_dq(at, row, dst, k):
                dq = kb.load(dq_buf, at, row, [bm, d], kb.acc)
                kb.store(kb.dot(kb.operand(kb.transpose(dst)), k, dq), dq_buf, at, row)
            _key_block(kb, (q_buf, k_buf, v_buf, do_buf, lse_buf, delta_buf, dk_buf, dv_buf),
                       kv_at, outer.induction_variable, group, add_dq)
            scf.YieldOp([])
        each_query_block(lambda at, row: kb.store(
            ttile.MulOp(kb.load(dq_buf, at, row, [bm, d], kb.acc),
                        kb.fill([bm, d], kb.scale)).result, dq_buf, at, row))
        ttile.ReturnOp()
    return kernel


def backward_kernels(op, name: str, ins, outs, module_block, cpu: bool,
                     options: TargetOptions) -> list[tuple[ir.Operation, list, list]]:
    """The kernels of `tgraph.attention_grad` `op`, each with the input and
    output buffers it is launched on: on the CPU (f32, f64) one
    (`_cpu_backward_kernel`), else `_dkdv` and `_dq`."""
    geo, cfg, b = _setup(op, cpu, False, options)
    d, dv = geo.d, geo.dv
    # `_dkdv` instances own key rows and step over query blocks: it takes the
    # forward's blocks transposed, so its loop carries as many rows as the
    # forward's (the rows its warps split) and loads the narrower blocks.
    # Its two [BM, D] f32 accumulators fill the register file at D = 128,
    # where ptxas 13.0 fits its cp.async loop in 255 registers but spills
    # 80 bytes from the TMA one: there it keeps cp.async.
    kv_cfg = replace(cfg, bm=cfg.bn, bn=cfg.bm, tma=cfg.tma and max(d, dv) <= 64)
    kb = _Builder(kv_cfg, b.elt, b.spec, b.seq_dim, b.rank, geo)
    if cpu and not b.half:
        return [(_cpu_backward_kernel(op, name, ins, outs, module_block, kb), list(ins),
                 list(outs))]
    bm, bn = kv_cfg.bm, kv_cfg.bn
    q_in, k_in, v_in, do_in, lse_in, delta_in, *side_ins = ins
    dq_out, dk_out, dv_out = outs
    stat = b.acc
    group = math.prod(geo.groups)

    kv_ins, kv_outs = [q_in, k_in, v_in, do_in, lse_in, delta_in, *side_ins], [dk_out, dv_out]
    dkdv, (q_buf, k_buf, v_buf, do_buf, lse_buf, delta_buf, *sides, dk_buf, dv_buf) = _kernel(
        f"{name}_dkdv", kv_ins + kv_outs, math.prod(geo.kv_lead) * (geo.sk // bn), kv_cfg,
        module_block, op.location)
    kb.with_sides(sides)
    with ir.InsertionPoint(dkdv.regions[0].blocks[0]), op.location:
        *kv_at, kj = grid_offsets(geo.kv_lead + [geo.sk // bn], [1] * (len(geo.kv_lead) + 1))
        _key_block(kb, (q_buf, k_buf, v_buf, do_buf, lse_buf, delta_buf, dk_buf, dv_buf), kv_at,
                   arith.MulIOp(kj, index(bn)).result, group)
        ttile.ReturnOp()

    bm, bn = cfg.bm, cfg.bn
    q_ins = [q_in, k_in, v_in, do_in, lse_in, delta_in, *side_ins]
    dq, (q_buf, k_buf, v_buf, do_buf, lse_buf, delta_buf, *sides, dq_buf) = _kernel(
        f"{name}_dq", q_ins + [dq_out], math.prod(geo.lead) * (geo.sq // bm), cfg, module_block,
        op.location)
    b.with_sides(sides)
    with ir.InsertionPoint(dq.regions[0].blocks[0]), op.location:
        *at, qi = grid_offsets(geo.lead + [geo.sq // bm], [1] * (len(geo.lead) + 1))
        kv = b.kv_at(at)
        row = arith.MulIOp(qi, index(bm)).result
        q = b.load(q_buf, at, row, [bm, d])
        do = b.load(do_buf, at, row, [bm, dv])
        lse = b.finite(b.load(lse_buf, at, row, [bm, 1], stat), 0.0)
        delta = b.load(delta_buf, at, row, [bm, 1], stat)
        start, end = b.key_range(row, bm, bn)
        seeds = b.dropout_seeds(at)
        loop = scf.ForOp(start, end, index(bn), [b.fill([bm, d], 0.0)])
        with ir.InsertionPoint(loop.body):
            col = loop.induction_variable
            k = b.stream(k_buf, kv, col, [bn, d])
            v = b.stream(v_buf, kv, col, [bn, dv])
            _, ds = _probabilities(b, b.scores(q, k, at, row, col), lse, do, v, delta,
                                   z=b.dropout_factor(seeds, row, col))
            scf.YieldOp([b.dot(b.operand(ds), k, loop.inner_iter_args[0])])
        b.store(ttile.MulOp(loop.results[0], b.fill([bm, d], b.scale)).result, dq_buf, at, row)
        ttile.ReturnOp()
    return [(dkdv, kv_ins, kv_outs), (dq, q_ins, [dq_out])]
