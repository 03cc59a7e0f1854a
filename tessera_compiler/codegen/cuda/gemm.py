"""GEMM main loops (`#ttile.pipeline<kind = gemm, ...>`): an `scf.for`
accumulating `ttile.dot(load A, load B)` in registers, its operands
streaming through a shared-memory ring.

* mma.sync.m16n8k16: A and B tiles in padded rows (conflict-free ldmatrix),
  filled by cp.async `stages - 1` iterations ahead.
* wgmma.mma_async (sm_90a): tiles stored 128-byte swizzled, read by the
  tensor cores through matrix descriptors, one wgmma group left in flight
  (`lag`); filled by cp.async, by TMA from thread 0, or by a producer
  warpgroup (warp specialization). A build for plain sm_90 compiles the
  mma.sync loop in its place; both leave the accumulator in the same
  registers, so the pointwise epilogue after the loop reads either."""

from __future__ import annotations

from tessera_mlir import ir

from ...ir import gpu_schedule as gs
from ..printer import c_literal
from .common import WGMMA_BRANCH, Fragment, swizzled_desc


class GemmMainLoops:
    """The GEMM main loop printers (a CudaKernelEmitter part)."""

    def _emit_mma_loop(self, op, pipeline) -> None:
        """A GEMM main loop as tessera-gpu-software-pipeline scheduled it (its
        accumulator's initial fill is folded into the registers' setup)."""
        g, _ = gs.match_gemm_loop(op)
        p = dict(bm=g.bm, bn=g.bn, bk=g.bk, wm=g.wm, wn=g.wn, elt=g.elt, wgmma=pipeline.wgmma,
                 tma=pipeline.tma, iv=g.iv, load_a=g.load_a, load_b=g.load_b, init=g.init,
                 result=g.result, bounds=g.bounds)
        init = p["init"]
        self.flush()
        bm, bn, bk, wm, wn, stages = p["bm"], p["bn"], p["bk"], p["wm"], p["wn"], self.stages
        mt, nt = bm // wm // 16, bn // wn // 8
        ring = gs.integer(op, gs.RING)
        self.barrier_offsets = gs.barriers(op)
        fill = c_literal(ir.FloatAttr(init.attributes["value"]).value, "float")
        instruction = ("wgmma.mma_async.m64n{bn}k16 from 128-byte-swizzled shared memory, "
                       "mma.sync.m16n8k16 on plain sm_90" if p["wgmma"]
                       else "mma.sync.m16n8k16, ldmatrix").format(bn=bn)
        copies = ("TMA (cp.async.bulk.tensor) into the wgmma ring, cp.async for mma.sync"
                  if p["tma"] else "cp.async")
        self.line(f"// tensor-core GEMM: block tile {bm}x{bn}x{bk}, warps {wm}x{wn}, "
                  f"{stages} stage{'s' if stages > 1 else ''} ({instruction}; {copies})")
        acc, lane, wm0, wn0 = self._warp_accumulator(bm, bn, wm, wn)
        self.line("#pragma unroll")
        self.line(f"for (int i = 0; i < {mt * nt * 4}; ++i) (&{acc}[0][0][0])[i] = {fill};")
        producer = pipeline.producer
        if producer:        # from here on only the computing warps run
            self.threads = self.threads - 128
        if p["wgmma"]:
            # wgmma is an arch-specific (sm_90a) feature: NVRTC through cupy
            # compiles for plain sm_90, which gets the mma.sync loop instead.
            # Both leave the accumulator in the same registers.
            self.line(WGMMA_BRANCH)
            self._wgmma_main_loop(p, ring, acc, producer)
            self.line("#else")
        if producer:
            self.line(f"if (threadIdx.x >= {self.threads}) return;   "
                      "// no TMA on plain sm_90: the producer warpgroup has no work")
        self._mma_sync_main_loop(p, ring, acc, lane, wm0, wn0)
        if p["wgmma"]:
            self.line("#endif")
        self.frags[p["result"]] = Fragment(acc, [bm, bn], mt, nt, wm0, wn0, lane)

    def _gemm_ring(self, p, ring: int, a_elems: int, b_elems: int, lda, ldb):
        """Declares the GEMM ring's A and B slot arrays (`sa`, `sb`: `stages`
        slots of `a_elems` and `b_elems` 16-bit elements from byte `ring`)
        and returns load_stage(slot), the cp.async copies of one K step's
        tiles (rows `lda`/`ldb` apart, or swizzled for wgmma when None)."""
        self.line(f"uint16_t* const sa = reinterpret_cast<uint16_t*>(tessera_smem + {ring});")
        self.line(f"uint16_t* const sb = reinterpret_cast<uint16_t*>(tessera_smem + "
                  f"{ring + self.stages * a_elems * 2});")

        def load_stage(stage: str) -> None:
            self.cp_async_tile(f"sa + ({stage}) * {a_elems}", p["load_a"], p["bm"], p["bk"], lda)
            self.cp_async_tile(f"sb + ({stage}) * {b_elems}", p["load_b"], p["bk"], p["bn"], ldb)
        return load_stage

    def _mma_sync_main_loop(self, p, ring: int, acc: str, lane: str, wm0: str, wn0: str) -> None:
        """The GEMM main loop on mma.sync.m16n8k16: each warp loads its A and
        B fragments from the stage's padded tiles with ldmatrix."""
        bm, bn, bk, wm, wn = p["bm"], p["bn"], p["bk"], p["wm"], p["wn"]
        mt, nt = bm // wm // 16, bn // wn // 8
        lda, ldb = bk + 8, bn + 8            # +16 B per row: conflict-free ldmatrix
        a_elems, b_elems = bm * lda, bk * ldb
        mma = "tessera_mma_" + gs.MMA_TYPES[p["elt"]]
        self.line("{")
        self.indent += 1
        load_stage = self._gemm_ring(p, ring, a_elems, b_elems, lda, ldb)

        def compute(stage: str) -> None:
            self.line(f"const uint16_t* const a_st = sa + ({stage}) * {a_elems};")
            self.line(f"const uint16_t* const b_st = sb + ({stage}) * {b_elems};")
            self.line("#pragma unroll")
            self.line(f"for (int kk = 0; kk < {bk}; kk += 16) {{")
            self.indent += 1
            self.line(f"uint32_t af[{mt}][4], bf[{nt}][2];")
            self.load_a_fragments("a_st", lda, "kk", wm0, lane, mt)
            self.load_b_fragments("b_st", ldb, "kk", wn0, lane, nt, transposed=False)
            self.mma_tiles(mma, acc, mt, nt)
            self.indent -= 1
            self.line("}")

        self.staged_loop(p["iv"], p["bounds"], load_stage, compute)
        self.indent -= 1
        self.line("}")

    def _wgmma_main_loop(self, p, ring: int, acc: str, producer: bool = False) -> None:
        """The GEMM main loop on wgmma.mma_async: warpgroup g multiplies rows
        64g..64g+63 of the stage's A tile by its whole B tile, both read by
        the tensor cores from shared memory through matrix descriptors.
        Tiles are stored as 64-column panels of 128-byte rows, 16-byte chunks
        XOR-swizzled by row % 8 (the 128-byte swizzle; `cp_async_tile`): A
        is K-major (rows of K), B N-major (rows of N, panels of 64 columns
        `bk * 128` bytes apart, groups of 8 rows 1024 bytes apart). With 3+
        stages one iteration's wgmma group stays in flight while the next is
        issued, and the loads run stages - 2 iterations ahead (with TMA,
        stages - 1; all stages with a `producer` warpgroup issuing them)."""
        bm, bn, bk, stages = p["bm"], p["bn"], p["bk"], self.stages
        a_elems, b_elems = bm * bk, bk * bn
        n_acc = bm // p["wm"] // 16 * (bn // 8) * 4
        lag = 1 if stages >= 3 else 0
        elt = gs.MMA_TYPES[p["elt"]]
        self.wgmma_shapes.add((bn, elt, False, True))
        self.line("{")
        self.indent += 1
        load_stage = self._gemm_ring(p, ring, a_elems, b_elems, None, None)
        if producer:
            full, empty = self._producer_warpgroup(p, a_elems, b_elems)
        self.line("const int wg = threadIdx.x >> 7;     // warpgroup: A rows 64 wg .. 64 wg + 63")
        self.line(f"tessera_wgmma_fence_operands<{n_acc}>(&{acc}[0][0][0]);")

        def compute(stage: str) -> None:
            self.line(f"const uint16_t* const a_st = sa + ({stage}) * {a_elems} + wg * {64 * 64};")
            self.line(f"const uint16_t* const b_st = sb + ({stage}) * {b_elems};")
            self.line("tessera_wgmma_fence();")
            self.line("#pragma unroll")
            self.line(f"for (int kk = 0; kk < {bk}; kk += 16)")
            self.line(f"  tessera_wgmma_{elt}<{bn}, 1>(&{acc}[0][0][0], "
                      f"{swizzled_desc('a_st', bm, 'kk', True)}, "
                      f"{swizzled_desc('b_st', bk, 'kk', False)});")
            self.line("tessera_wgmma_commit();")
            self.line(f"tessera_wgmma_wait<{lag}>();")

        if producer:
            self._consumer_loop(full, empty, lag, compute)
        elif p["tma"]:
            self._tma_staged_loop(p, a_elems, b_elems, compute)
        else:
            # cp.async writes through the generic proxy, wgmma reads through
            # the async proxy: each thread fences its landed copies before
            # the barrier.
            self.staged_loop(p["iv"], p["bounds"], load_stage, compute, lag=lag,
                              ready="tessera_fence_proxy_async();")
        self.line("tessera_wgmma_wait<0>();")
        self.line(f"tessera_wgmma_fence_operands<{n_acc}>(&{acc}[0][0][0]);")
        self.indent -= 1
        self.line("}")

    def _tma_ring(self, p, a_elems: int, b_elems: int, *barriers) -> tuple:
        """The GEMM's TMA ring: mbarriers `full` (its copies' bytes, armed by
        one arrival) and `barriers`; declares `n_it` and returns the
        barriers' names and issue(slot, it), the copies of iteration `it`
        into `slot` (for one thread to run)."""
        lb, ub, step = (self.scalar(v) for v in p["bounds"])
        names = self.mbarrier_ring(("full", 1), *barriers)
        self._trip_count(lb, ub, step)

        def issue(slot: str, it: str) -> None:
            self._at_iteration(p["iv"], lb, step, it, lambda: self.tma_copies(
                f"&{names[0]}[{slot}]",
                [(f"sa + ({slot}) * {a_elems}", p["load_a"], p["bm"], p["bk"]),
                 (f"sb + ({slot}) * {b_elems}", p["load_b"], p["bk"], p["bn"])]))
        return names, issue

    def _tma_staged_loop(self, p, a_elems: int, b_elems: int, compute,
                         ahead: int | None = None) -> None:
        """The wgmma loop's K steps through a ring of `stages` slots that the
        tensor memory accelerator fills: thread 0 issues an iteration's copies
        and arms that slot's mbarrier with their byte count; every thread
        waits on the barrier's phase ((it / stages) & 1) before computing.
        After its computation (which leaves at most one wgmma group in
        flight), a block barrier, and thread 0 refills the slot of the
        iteration before, whose group every warpgroup has retired:
        `ahead` = stages - 1 iterations' copies are in flight (a test
        passes more to show the emulator catches the overwrite)."""
        stages = self.stages
        ahead = stages - 1 if ahead is None else ahead
        (full,), issue_copies = self._tma_ring(p, a_elems, b_elems)

        def issue(slot: str, it: str) -> None:
            self.line(f"if (threadIdx.x == 0 && {it} < n_it) {{")
            self.indent += 1
            issue_copies(slot, it)
            self.indent -= 1
            self.line("}")

        for s in range(ahead):
            issue(str(s), str(s))
        self.line("for (int64_t it = 0; it < n_it; ++it) {")
        self.indent += 1
        self.line(f"tessera_mbarrier_wait(&{full}[it % {stages}], (unsigned)(it / {stages}) & 1);")
        compute(f"it % {stages}")
        self.line("__syncthreads();     // every warpgroup is done with the slot refilled next")
        issue(f"(it + {ahead}) % {stages}", f"it + {ahead}")
        self.indent -= 1
        self.line("}")

    # -- warp specialization: a producer warpgroup feeds the ring -----------------------
    # The block's last warpgroup (threads `self.threads` ..) only copies: one
    # of its threads issues every iteration's TMA copies as soon as the
    # computing warps have released the slot (mbarrier `empty`), so the
    # ring is always full and the computing warps never meet a block
    # barrier in the loop. On sm_90a the producer gives registers back
    # (setmaxnreg) for the accumulators, then leaves the kernel; exited
    # threads no longer count at the block barriers that follow.
    _PRODUCER_REGISTERS = 40            # setmaxnreg's floor is 24; the copy loop needs few
    _BLOCK_REGISTERS = 65536            # an sm_90 block's register file

    def _producer_warpgroup(self, p, a_elems: int, b_elems: int, skip_empty_wait: bool = False):
        """The ring's barriers and the producer warpgroup's code (it returns
        at its end); `skip_empty_wait` refills without waiting for the slot
        to be released (a test shows the emulator catches it)."""
        stages, consumers = self.stages, self.threads
        (full, empty), issue = self._tma_ring(p, a_elems, b_elems, ("empty", consumers // 32))
        launch_cap = min(255, self._BLOCK_REGISTERS // (consumers + 128)) // 8 * 8
        computing = min(256, (self._BLOCK_REGISTERS - 128 * self._PRODUCER_REGISTERS)
                        // consumers) // 8 * 8
        registers = computing > launch_cap      # worth moving only past the launch's cap
        self.line(f"if (threadIdx.x >= {consumers}) {{     // the producer warpgroup")
        self.indent += 1
        if registers:
            self.line(f"tessera_setmaxnreg_dec<{self._PRODUCER_REGISTERS}>();")
        self.line(f"if (threadIdx.x == {consumers}) {{")
        self.indent += 1
        self.line("for (int64_t it = 0; it < n_it; ++it) {")
        self.indent += 1
        if not skip_empty_wait:
            self.line(f"if (it >= {stages})     // the slot's last reader released it")
            self.line(f"  tessera_mbarrier_wait(&{empty}[it % {stages}], "
                      f"(unsigned)(it / {stages} - 1) & 1);")
        issue(f"it % {stages}", "it")
        self.indent -= 1
        self.line("}")
        self.indent -= 1
        self.line("}")
        self.line("return;")
        self.indent -= 1
        self.line("}")
        if registers:
            self.line(f"tessera_setmaxnreg_inc<{computing}>();   "
                      f"// {launch_cap} at launch; the producer's go to the accumulators")
        return full, empty

    def _consumer_loop(self, full: str, empty: str, lag: int, compute) -> None:
        """The computing warps' loop over the producer's ring: wait for the
        slot's bytes, compute (leaving `lag` wgmma groups in flight), then
        each warp releases the slot its retired group read (one arrival per
        warp, after all its lanes have retired it)."""
        stages = self.stages
        self.line("for (int64_t it = 0; it < n_it; ++it) {")
        self.indent += 1
        self.line(f"tessera_mbarrier_wait(&{full}[it % {stages}], (unsigned)(it / {stages}) & 1);")
        compute(f"it % {stages}")
        self.line(f"if (it >= {lag}) {{" if lag else "{")
        self.line("  __syncwarp();")
        self.line(f"  if ((threadIdx.x & 31) == 0) tessera_mbarrier_arrive(&{empty}[(it - {lag}) % {stages}]);")
        self.line("}")
        self.indent -= 1
        self.line("}")
