"""A reduce-scatter fused into the GEMM whose partial sums it reduces, over
NVSHMEM.

`y = reduce_scatter(x @ w, rows)` on a mesh axis of P ranks, where each rank
holds `x` columns `[M, Kl]` and `w` rows `[Kl, N]` (a row-parallel weight),
so that `x @ w` is this rank's partial sum of the full `[M, N]` product, and
rank `c` keeps the sum of rows `[c*Ml, (c+1)*Ml)` (`Ml = M/P`: the output is
sequence-parallel), becomes one kernel per rank instead of a GEMM followed by
a collective:

* Arguments: `x`, `w`, the epilogue's other inputs, its outputs (`y [Ml,
  N]`, or what the elementwise ops after the reduce-scatter make of it: they
  run on the summed tile, as in any GEMM kernel; `lower_to_tile` builds the
  kernel around `emit`), then three symmetric buffers (`plan`): `outbox [M,
  N]` (this rank's partial tiles, staged for the puts), `inbox [P*Ml, N]`
  (slot `c` holds rank `c`'s partial of this rank's rows) and `ready [Ml/BM
  * N/BN] i64`, one signal word per output tile, counting the ranks whose
  partial has arrived; the runtime zeroes it and runs a barrier over all
  PEs before each launch (no rank may still be reading the previous call's
  `inbox`).
* Instance (mi, ni) owns output tile (mi, ni) of `y`. For each rank c of
  the axis, peers first (coord+1, coord+2, ...) and itself last, it
  computes the partial tile of c's rows (`c*Ml + mi*BM`), stages it in
  `outbox` and puts it into c's `inbox` slot for this rank, without waiting
  for it to arrive: the puts travel while the next tiles compute. (Its own
  tile takes the same path, a put to itself, so that the kernel has one
  GEMM main loop and one shared-memory ring.) Then it completes its puts
  (`ttile.quiet`), adds 1 to the tile's signal word on every rank, waits
  until its own word reaches P, and sums the P slots in rank order: the
  same order on every run, so the result is deterministic. The partials are
  rounded to the matmul's element type, as the collective library's
  reduce-scatter of the product would move them; the sum is in f32.

Deadlock freedom: an instance puts and signals everything it owes before it
waits, so its wait depends only on peer instances reaching their own waits,
never on anything they wait for. Peers are addressed by PE number, and
instances find their tile and rank with `collective_gemm.instance`.
"""

from __future__ import annotations

from dataclasses import replace

from tessera_mlir import ir
from tessera_mlir.dialects import arith, scf, ttile

from tessera_compiler.ir.options import GemmConfig, TargetOptions
from tessera_compiler.ir.sharding import Mesh
from tessera_compiler.ir.tile_builder import i64_array, index, tile_type
from tessera_compiler.ir.types import memref_of, shape_of

from .collective_gemm import CollectiveGemm, instance
from .gemm import gemm_config, gemm_tile


class ScatteredGemm(CollectiveGemm):
    """`reduce_scatter(matmul(x, w), rows)` as one kernel (see the module's
    description)."""
    body = ("tgraph.matmul", "tgraph.reduce_scatter")

    def plan(self, matmul: ir.Operation, scatter: ir.Operation, mesh: Mesh,
             options: TargetOptions) -> tuple[GemmConfig, list[ir.MemRefType]]:
        """(GEMM configuration, types of the three symmetric buffers) of the
        fused kernel for `reduce_scatter(matmul(x, w))` (2-D, rows scattered)."""
        parts = mesh.axis_size(ir.StringAttr(scatter.attributes["axis"]).value)
        x, w = matmul.operands
        m, k = shape_of(x)
        n = shape_of(w)[1]
        ml = m // parts
        cfg = gemm_config(1, ml, n, k, str(ir.ShapedType(x.type).element_type), options)   # (tiles divide)
        product = memref_of(matmul.results[0].type)
        tiles = ml // cfg.bm * (n // cfg.bn)
        return cfg, [product, product, ir.MemRefType.get([tiles], ir.IntegerType.get_signless(64))]


    def emit(self, matmul: ir.Operation, scatter: ir.Operation, mesh: Mesh, cfg: GemmConfig,
             xs: ir.Value, ws: ir.Value, outbox: ir.Value, inbox: ir.Value, ready: ir.Value):
        """The fused kernel's body up to its output tile, at the current
        insertion point: partial tiles go to the peers owning their rows, the
        instance's own tile is summed from every rank's partial. Returns (tile,
        row, col): the summed `[BM, BN]` tile (the matmul's element type) and
        its offsets in `y`, for the epilogue and store that follow."""
        m, _ = shape_of(matmul.operands[0])
        n = shape_of(matmul.operands[1])[1]
        out_elt = ir.ShapedType(matmul.results[0].type).element_type
        at = instance(scatter, mesh, n // cfg.bn)
        pid, coord, parts = at.pid, at.coord, at.parts
        ml = m // parts
        row = arith.MulIOp(at.mi, index(cfg.bm)).result
        col = arith.MulIOp(at.ni, index(cfg.bn)).result
        # The operands are local inputs no peer writes, but the GEMM runs inside
        # the loop over ranks, where the emitter has no producer warpgroup to
        # issue TMA copies: cp.async it is.
        cfg = replace(cfg, tma=False)

        def slot_row(c: ir.Value) -> ir.Value:
            """Row of `inbox` where rank `c`'s partial of this tile goes."""
            return arith.AddIOp(arith.MulIOp(c, index(ml)).result, row).result

        def peer_of(j: ir.Value) -> tuple[ir.Value, ir.Value]:
            """(coordinate, PE) of the j-th rank after this one on the axis (the
            P-th is this rank)."""
            c = arith.RemUIOp(arith.AddIOp(coord, j).result, index(parts)).result
            return c, at.pe_at(c)

        # Partial tiles for each rank's rows, peers first (coord+1, coord+2,
        # ...), this rank's own last: compute, stage, put (to itself too). One
        # GEMM main loop in the kernel, so one shared-memory ring.
        ranks = scf.ForOp(index(1), index(parts + 1), index(1))
        with ir.InsertionPoint(ranks.body):
            c, peer = peer_of(ranks.induction_variable)
            rows = slot_row(c)               # rank c's rows = its slot rows in our product
            tile = gemm_tile(cfg, xs, ws, [], rows, col, out_elt)
            ttile.StoreOp(tile, outbox, [rows, col])
            ttile.BarrierOp()                # the whole tile is staged before the put reads it
            ttile.PutOp(outbox, [rows, col], inbox, [slot_row(coord), col], peer,
                        i64_array([cfg.bm, cfg.bn]))
            scf.YieldOp([])
        ttile.QuietOp()
        signals = scf.ForOp(index(1), index(parts + 1), index(1))
        with ir.InsertionPoint(signals.body):
            ttile.SignalOp(ready, pid, index(1), peer_of(signals.induction_variable)[1],
                           ir.StringAttr.get("add"))
            scf.YieldOp([])
        ttile.WaitOp(ready, pid, index(parts), ir.StringAttr.get("ge"))

        # Every rank's partial, summed in rank order.
        narrow = str(out_elt) in ("bf16", "f16")
        half = tile_type([cfg.bm, cfg.bn], out_elt)
        wide = tile_type([cfg.bm, cfg.bn], ir.F32Type.get())
        total = None
        for c in range(parts):
            part = ttile.LoadOp(half, inbox, [slot_row(index(c)), col]).result
            if narrow:
                part = ttile.CastOp(wide, part).result
            total = part if total is None else ttile.AddOp(total, part).result
        if narrow:
            total = ttile.CastOp(half, total).result
        return total, row, col
