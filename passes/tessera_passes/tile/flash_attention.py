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

`delta = rowsum(dO * out)` comes from Graph IR (tessera-autodiff emits it).

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


def attention_config(seq: int, head_dim: int, cpu: bool, forward: bool,
                     options: TargetOptions) -> AttentionConfig:
    """Block sizes for sequence length `seq` and head width `head_dim`
    (the larger of q's and v's), of the forward kernel or the backward's
    (`options.attention_forward_blocks`, `attention_backward_blocks`)."""
    if cpu:
        b = largest_divisor(seq, CPU_BLOCK)
        return AttentionConfig(b, b)
    blocks = options.attention_forward_blocks if forward else options.attention_backward_blocks
    bm, bn = next((v for width, v in blocks if head_dim <= width), (8, 8))
    bm, bn = largest_divisor(seq, bm), largest_divisor(seq, bn)
    # Warps of 16 query rows each (FlashAttention-2's split).
    warps = min(MAX_WARPS, bm // 16) if bm % 16 == 0 and bn % 16 == 0 else None
    return AttentionConfig(bm, bn, warps, 2)


# -- builders ------------------------------------------------------------------

class _Builder:
    """Tile IR for one attention kernel; `self.elt` is the operands' element
    type, the softmax and accumulators are f32 (f64 for f64 operands).
    Every operand's rows run along buffer dimension `seq_dim` of `rank`."""

    def __init__(self, cfg: AttentionConfig, elt: ir.Type, scale: float, causal: bool,
                 seq_dim: int, rank: int):
        self.cfg, self.elt, self.scale, self.causal = cfg, elt, scale, causal
        self.seq_dim, self.rank = seq_dim, rank
        self.acc = elt if isinstance(elt, ir.F64Type) else ir.F32Type.get()
        self.half = elt != self.acc

    def at(self, lead, row: ir.Value) -> tuple[list[ir.Value], ir.Attribute | None]:
        """(offsets, dims) of the tile at batch offsets `lead` and sequence
        row `row`: the row goes in at `seq_dim`; a sequence dimension other
        than the second to last is read where it lies (`dims`)."""
        offsets = lead[:self.seq_dim] + [row] + lead[self.seq_dim:] + [index(0)]
        trailing = self.seq_dim == self.rank - 2
        return offsets, None if trailing else ir.DenseI64ArrayAttr.get([self.seq_dim,
                                                                        self.rank - 1])

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

    def scores(self, q, k, row, col, transposed: bool = False) -> ir.Value:
        """q k^T ([queries, keys], not yet scaled) for query rows from `row`
        and keys from `col`, or its transpose k q^T ([keys, queries]), with
        keys after the query masked to -inf when causal."""
        s = self.dot(k, self.transpose(q)) if transposed else self.dot(q, self.transpose(k))
        shape = self.shape(s)
        if self.causal:
            i32 = ir.IntegerType.get_signless(32)
            query_dim, key_dim = (1, 0) if transposed else (0, 1)
            queries = ttile.IotaOp(tile_type(shape, i32), row, i64(query_dim)).result
            keys = ttile.IotaOp(tile_type(shape, i32), col, i64(key_dim)).result
            keep = ttile.CompareOp(tile_type(shape, ir.IntegerType.get_signless(1)), queries, keys,
                                   tgraph.CompareKindAttr.get("ge")).result
            s = ttile.SelectOp(keep, s, self.fill(shape, float("-inf"))).result
        return s

    def exp_scaled(self, s: ir.Value, offset: ir.Value) -> ir.Value:
        """exp(scale * s - offset) for scores `s` and a tile `offset` in base-2
        units (offset / ln 2): exp2(s * scale log2(e) - offset), where the
        scale and the conversion to base 2 are one multiply (one FMA with
        the subtraction) and 2^x is the special-function unit's own."""
        scaled = ttile.MulOp(s, self.fill(self.shape(s), self.scale * LOG2E)).result
        return ttile.Exp2Op(ttile.SubOp(scaled, offset).result).result

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


def _causal_end(start: ir.Value, rows: int, step: int) -> ir.Value:
    """The first multiple of `step` at or after `start + rows`."""
    end = arith.AddIOp(start, index(rows + step - 1)).result
    return arith.MulIOp(arith.DivUIOp(end, index(step)).result, index(step)).result


def _kernel(name: str, bufs: list[ir.Value], grid: int, cfg: AttentionConfig, module_block,
            loc) -> tuple[ir.Operation, list[ir.Value]]:
    kernel, entry = new_kernel(name, [ir.MemRefType(b.type) for b in bufs], grid, cfg.threads,
                               [cfg.bm, cfg.bn], module_block, loc, cfg.stages)
    return kernel, list(entry.arguments)


def _setup(op, cpu: bool, forward: bool, options: TargetOptions):
    q, _, v = list(op.operands)[:3]
    shape, seq_dim = shape_of(q), gb.seq_dim_of(op)
    seq, d, dv = shape[seq_dim], shape[-1], shape_of(v)[-1]
    lead = shape[:seq_dim] + shape[seq_dim + 1:-1]           # batch dimensions
    if seq_dim != len(shape) - 2 and not cpu:
        raise PassError("tessera-lower-to-tile: GPU attention kernels read [..., S, D] operands; "
                        "tessera-lower-to-schedule moves seq_dim there first", op.location)
    cfg = attention_config(seq, max(d, dv), cpu, forward, options)
    elt = ir.ShapedType(q.type).element_type
    if str(elt) not in ("f64", "f32", "bf16", "f16"):
        raise PassError(f"tessera-lower-to-tile: attention on {elt} operands is not supported "
                        "(f64, f32, bf16, f16)", op.location)
    # Hopper's wgmma where bf16 tiles are whole 128-byte swizzle atoms (head
    # widths multiples of 64) for whole warpgroups of 16-row warps.
    if options.wgmma and not cpu and str(elt) == "bf16" and cfg.warps and cfg.warps % 4 == 0 \
            and cfg.bm == 16 * cfg.warps \
            and d % 64 == 0 and dv % 64 == 0:
        # (TMA's tensor maps take buffers of rank 5 at most.)
        cfg = replace(cfg, wgmma=True, tma=options.tma and len(lead) <= 3,
                      pingpong=options.pingpong and cfg.warps == 8)
        if forward and options.issue_ahead and cfg.tma and not cfg.pingpong:
            cfg = replace(cfg, issue_ahead=True, stages=3)
    b = _Builder(cfg, elt, ir.FloatAttr(op.attributes["scale"]).value, "causal" in op.attributes,
                 seq_dim, len(shape))
    return lead, seq, d, dv, cfg, b


def forward_kernel(op, name: str, ins, outs, module_block, cpu: bool,
                   options: TargetOptions) -> ir.Operation:
    """The flash-attention forward kernel of `tgraph.attention` `op` over
    buffers `ins` (q, k, v) and `outs` (out, lse)."""
    lead, seq, d, dv, cfg, b = _setup(op, cpu, True, options)
    bm, bn = cfg.bm, cfg.bn
    grid = math.prod(lead + [seq // bm])
    kernel, (q_buf, k_buf, v_buf, o_buf, lse_buf) = _kernel(
        name, list(ins) + list(outs), grid, cfg, module_block, op.location)
    with ir.InsertionPoint(kernel.regions[0].blocks[0]), op.location:
        *at, qi = grid_offsets(lead + [seq // bm], [1] * (len(lead) + 1))
        row = arith.MulIOp(qi, index(bm)).result
        q = b.load(q_buf, at, row, [bm, d])
        end = _causal_end(row, bm, bn) if b.causal else index(seq)
        m0, l0 = b.fill([bm, 1], float("-inf")), b.fill([bm, 1], 0.0)
        loop = scf.ForOp(index(0), end, index(bn), [m0, l0, b.fill([bm, dv], 0.0)])
        for marked in ("pingpong", "issue_ahead"):
            if getattr(cfg, marked):
                loop.operation.attributes[f"ttile.{marked}"] = ir.UnitAttr.get()
        with ir.InsertionPoint(loop.body):
            col = loop.induction_variable
            m, l, acc = loop.inner_iter_args
            k = b.stream(k_buf, at, col, [bn, d])
            v = b.stream(v_buf, at, col, [bn, dv])
            s = b.scores(q, k, row, col)
            # The running maximum m is of scale * s in base-2 units: the row
            # maximum of the raw scores times scale log2(e) (> 0: it commutes
            # with max), so each score costs one FMA before its 2^x.
            to_base2 = b.scale * LOG2E
            if b.scale > 0:
                m_block = ttile.MulOp(b.row_reduce(s, "max"), b.fill([bm, 1], to_base2)).result
            else:
                m_block = b.row_reduce(ttile.MulOp(s, b.fill([bm, bn], to_base2)).result, "max")
            m_new = ttile.MaxOp(m, m_block).result
            p = b.exp_scaled(s, b.broadcast(m_new, [bm, bn]))
            alpha = ttile.Exp2Op(ttile.SubOp(m, m_new).result).result
            l_new = ttile.AddOp(ttile.MulOp(l, alpha).result, b.row_reduce(p, "sum")).result
            scaled = ttile.MulOp(acc, b.broadcast(alpha, [bm, dv])).result
            scf.YieldOp([m_new, l_new, b.dot(b.operand(p), v, scaled)])
        m, l, acc = loop.results
        b.store(ttile.DivOp(acc, b.broadcast(l, [bm, dv])).result, o_buf, at, row)
        m_natural = ttile.MulOp(m, b.fill([bm, 1], LN2)).result
        b.store(ttile.AddOp(m_natural, ttile.LogOp(l).result).result, lse_buf, at, row)
        ttile.ReturnOp()
    return kernel


def _probabilities(b: _Builder, s, lse, do, v, delta, transposed: bool = False):
    """(P, dS) of one score block: P = exp(S - lse), dS = P (dO V^T - delta);
    `transposed`: (P^T, dS^T) of a transposed block S^T ([keys, queries]),
    with `lse` and `delta` as rows: dS^T = P^T (V dO^T - delta^T)."""
    shape = b.shape(s)
    if b.shape(lse)[1] == 1:            # a column: converted once per row
        lse2 = b.broadcast(ttile.MulOp(lse, b.fill(b.shape(lse), LOG2E)).result, shape)
    else:                               # a row (the transposed block's): in the FMA
        lse2 = ttile.MulOp(b.broadcast(lse, shape), b.fill(shape, LOG2E)).result
    p = b.exp_scaled(s, lse2)
    dp = b.dot(v, b.transpose(do)) if transposed else b.dot(do, b.transpose(v))
    ds = ttile.MulOp(p, ttile.SubOp(dp, b.broadcast(delta, shape)).result).result
    return p, ds


def backward_kernels(op, name: str, ins, outs, module_block, cpu: bool,
                     options: TargetOptions) -> list[tuple[ir.Operation, list, list]]:
    """The `_dkdv` and `_dq` kernels of `tgraph.attention_grad` `op`, each
    with the input and output buffers it is launched on."""
    lead, seq, d, dv, cfg, b = _setup(op, cpu, False, options)
    # `_dkdv` instances own key rows and step over query blocks: it takes the
    # forward's blocks transposed, so its loop carries as many rows as the
    # forward's (the rows its warps split) and loads the narrower blocks.
    # Its two [BM, D] f32 accumulators fill the register file at D = 128,
    # where ptxas 13.0 fits its cp.async loop in 255 registers but spills
    # 80 bytes from the TMA one: there it keeps cp.async.
    kv_cfg = replace(cfg, bm=cfg.bn, bn=cfg.bm, tma=cfg.tma and max(d, dv) <= 64)
    kb = _Builder(kv_cfg, b.elt, b.scale, b.causal, b.seq_dim, b.rank)
    bm, bn = kv_cfg.bm, kv_cfg.bn
    q_in, k_in, v_in, do_in, lse_in, delta_in = ins
    dq_out, dk_out, dv_out = outs
    batch = math.prod(lead)
    stat = b.acc

    kv_ins, kv_outs = [q_in, k_in, v_in, do_in, lse_in, delta_in], [dk_out, dv_out]
    dkdv, (q_buf, k_buf, v_buf, do_buf, lse_buf, delta_buf, dk_buf, dv_buf) = _kernel(
        f"{name}_dkdv", kv_ins + kv_outs, batch * (seq // bn), kv_cfg, module_block, op.location)
    with ir.InsertionPoint(dkdv.regions[0].blocks[0]), op.location:
        *at, kj = grid_offsets(lead + [seq // bn], [1] * (len(lead) + 1))
        col = arith.MulIOp(kj, index(bn)).result
        k = kb.load(k_buf, at, col, [bn, d])
        v = kb.load(v_buf, at, col, [bn, dv])
        # Query blocks before the one holding row `col` see none of these keys.
        start = arith.MulIOp(arith.DivUIOp(col, index(bm)).result, index(bm)).result \
            if kb.causal else index(0)
        loop = scf.ForOp(start, index(seq), index(bm), [kb.fill([bn, d], 0.0),
                                                           kb.fill([bn, dv], 0.0)])
        with ir.InsertionPoint(loop.body):
            row = loop.induction_variable
            dk_acc, dv_acc = loop.inner_iter_args
            q = kb.stream(q_buf, at, row, [bm, d])
            do = kb.stream(do_buf, at, row, [bm, dv])
            # The transposed blocks P^T and dS^T ([keys, queries]) come out
            # with this kernel's key rows, ready to be the A operand of dV's
            # and dK's dots; lse and delta run along their columns.
            lse = kb.transpose(kb.load(lse_buf, at, row, [bm, 1], stat))
            delta = kb.transpose(kb.load(delta_buf, at, row, [bm, 1], stat))
            pt, dst = _probabilities(kb, kb.scores(q, k, row, col, transposed=True), lse, do, v,
                                     delta, transposed=True)
            dv_new = kb.dot(kb.operand(pt), do, dv_acc)
            dk_new = kb.dot(kb.operand(dst), q, dk_acc)
            scf.YieldOp([dk_new, dv_new])
        dk_acc, dv_acc = loop.results
        kb.store(ttile.MulOp(dk_acc, kb.fill([bn, d], kb.scale)).result, dk_buf, at, col)
        kb.store(dv_acc, dv_buf, at, col)
        ttile.ReturnOp()

    bm, bn = cfg.bm, cfg.bn
    q_ins = [q_in, k_in, v_in, do_in, lse_in, delta_in]
    dq, (q_buf, k_buf, v_buf, do_buf, lse_buf, delta_buf, dq_buf) = _kernel(
        f"{name}_dq", q_ins + [dq_out], batch * (seq // bm), cfg, module_block, op.location)
    with ir.InsertionPoint(dq.regions[0].blocks[0]), op.location:
        *at, qi = grid_offsets(lead + [seq // bm], [1] * (len(lead) + 1))
        row = arith.MulIOp(qi, index(bm)).result
        q = b.load(q_buf, at, row, [bm, d])
        do = b.load(do_buf, at, row, [bm, dv])
        lse = b.load(lse_buf, at, row, [bm, 1], stat)
        delta = b.load(delta_buf, at, row, [bm, 1], stat)
        end = _causal_end(row, bm, bn) if b.causal else index(seq)
        loop = scf.ForOp(index(0), end, index(bn), [b.fill([bm, d], 0.0)])
        with ir.InsertionPoint(loop.body):
            col = loop.induction_variable
            k = b.stream(k_buf, at, col, [bn, d])
            v = b.stream(v_buf, at, col, [bn, dv])
            _, ds = _probabilities(b, b.scores(q, k, row, col), lse, do, v, delta)
            scf.YieldOp([b.dot(b.operand(ds), k, loop.inner_iter_args[0])])
        b.store(ttile.MulOp(loop.results[0], b.fill([bm, d], b.scale)).result, dq_buf, at, row)
        ttile.ReturnOp()
    return [(dkdv, kv_ins, kv_outs), (dq, q_ins, [dq_out])]
