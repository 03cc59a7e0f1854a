"""An all-gather fused into the GEMM that reads it, over NVSHMEM.

`y = all_gather(x, rows) @ w` on a mesh axis of P ranks, where each rank
holds `x` rows `[Ml, K]` (sequence-parallel) and `w` columns `[K, Nl]`
(column-parallel), becomes one kernel per rank instead of a collective
followed by a GEMM:

* Arguments: `x`, `w`, the epilogue's other inputs, its outputs (`y
  [P*Ml, Nl]`, or what the elementwise ops after the matmul make of it:
  they run on the output tile, as in any GEMM kernel; `lower_to_tile`
  builds the kernel around `emit`), then two symmetric buffers (marked
  `ttile.symmetric`): `gathered [P*Ml, K]` (every rank's rows, in rank
  order) and `ready [P*Ml/BM] i64`, one signal word per BM-row chunk of
  `gathered`, also marked `ttile.signals`: the runtime zeroes it and runs
  a barrier over all PEs before each launch (no rank may still be reading
  the previous call's `gathered`).
* Producers: the instance computing output tile (row chunk c, column 0), for
  each of this rank's `Ml/BM` chunks c, puts that chunk of `x` into every
  PE's `gathered` (itself included), waits for the puts to complete
  (`ttile.quiet`), then sets the chunk's signal word on every PE.
* Consumers: instance (mi, ni) computes output rows `mb = (mi + own) mod
  M/BM`, where `own` is this rank's first chunk, so each rank starts with
  its own rows (no wait) and then reads its peers' chunks in the order
  they arrive. Before its K loop it waits for `ready[mb]`.

Deadlock freedom: an instance only waits for a chunk put by (a) a producer
of its own rank with a lower linear index (its own rows), or (b) a peer's
producer, which waits only for case (a). Instances start in linear order on
a GPU (and run in it in the CPU emulator), so producers never wait behind
consumers.

Peers are addressed by PE number: PE = the rank in the job, and mesh
coordinates are row-major over the ranks (the runtime's convention), so the
peer at coordinate j on the axis is `pe + (j - coord) * stride`.
"""

from __future__ import annotations

from dataclasses import replace

from tessera_mlir import ir
from tessera_mlir.dialects import arith, scf, ttile

from tessera_compiler.ir.options import GemmConfig, TargetOptions
from tessera_compiler.ir.sharding import Mesh
from tessera_compiler.ir.support import PassError
from tessera_compiler.ir.tile_builder import i64_array, index
from tessera_compiler.ir.types import memref_of, shape_of

from .collective_gemm import CollectiveGemm, instance
from .gemm import gemm_config, gemm_tile


class GatheredGemm(CollectiveGemm):
    """`matmul(all_gather(x, rows), w)` as one kernel (see the module's
    description)."""
    body = ("tgraph.all_gather", "tgraph.matmul")

    def plan(self, gather: ir.Operation, matmul: ir.Operation, mesh: Mesh,
             options: TargetOptions) -> tuple[GemmConfig, list[ir.MemRefType]]:
        """(GEMM configuration, types of the two symmetric buffers) of the fused
        kernel for `matmul(all_gather(x), w)` (2-D, rows gathered)."""
        parts = mesh.axis_size(ir.StringAttr(gather.attributes["axis"]).value)
        x, w = gather.operands[0], matmul.operands[1]
        ml, k = shape_of(x)
        nl = shape_of(w)[1]
        cfg = gemm_config(parts, ml, nl, k, str(ir.ShapedType(x.type).element_type), options)
        if ml % cfg.bm:
            raise PassError(f"transport = nvshmem: {ml} local rows do not split into {cfg.bm}-row "
                            "tiles", gather.location)
        m_tiles = ml * parts // cfg.bm
        symmetric = [memref_of(gather.results[0].type),
                     ir.MemRefType.get([m_tiles], ir.IntegerType.get_signless(64))]
        return cfg, symmetric


    def emit(self, gather: ir.Operation, matmul: ir.Operation, mesh: Mesh, cfg: GemmConfig,
             xs: ir.Value, ws: ir.Value, gathered: ir.Value, ready: ir.Value):
        """The fused kernel's body up to its output tile, at the current
        insertion point: producers put and signal, the consumer waits for its
        rows and runs the GEMM. Returns (tile, row, col): the instance's
        `[BM, BN]` output tile (the matmul's element type) and its offsets, for
        the epilogue and store that follow."""
        ml, k = shape_of(gather.operands[0])
        nl = shape_of(matmul.operands[1])[1]
        out_elt = ir.ShapedType(matmul.results[0].type).element_type
        at = instance(gather, mesh, nl // cfg.bn)
        mi, ni, parts = at.mi, at.ni, at.parts
        chunks, m_tiles = ml // cfg.bm, ml * parts // cfg.bm
        own = arith.MulIOp(at.coord, index(chunks)).result

        # Producers: tile (c, 0) for each local chunk c puts it to every PE.
        is_producer = arith.AndIOp(
            arith.CmpIOp(arith.CmpIPredicate.eq, ni, index(0)).result,
            arith.CmpIOp(arith.CmpIPredicate.ult, mi, index(chunks)).result).result
        branch = scf.IfOp(is_producer)
        with ir.InsertionPoint(branch.then_block):
            chunk = arith.AddIOp(own, mi).result
            src_row = arith.MulIOp(mi, index(cfg.bm)).result
            dst_row = arith.MulIOp(chunk, index(cfg.bm)).result
            for phase in ("put", "signal"):
                peers = scf.ForOp(index(0), index(parts), index(1))
                with ir.InsertionPoint(peers.body):
                    peer = at.pe_at(peers.induction_variable)
                    if phase == "put":
                        ttile.PutOp(xs, [src_row, index(0)], gathered, [dst_row, index(0)], peer,
                                    i64_array([cfg.bm, k]))
                    else:
                        ttile.SignalOp(ready, chunk, index(1), peer, ir.StringAttr.get("set"))
                    scf.YieldOp([])
                if phase == "put":
                    ttile.QuietOp()
            scf.YieldOp([])

        # Consumers: own rows first, then peers' chunks as they arrive.
        mb = arith.RemUIOp(arith.AddIOp(mi, own).result, index(m_tiles)).result
        ttile.WaitOp(ready, mb, index(1), ir.StringAttr.get("ge"))
        row = arith.MulIOp(mb, index(cfg.bm)).result
        col = arith.MulIOp(ni, index(cfg.bn)).result
        # cp.async, not TMA: the tensor copy engine reads through the async
        # proxy, which the signal wait's acquire does not order.
        return gemm_tile(replace(cfg, tma=False), gathered, ws, [], row, col, out_elt), row, col
