"""Tensor-core loops whose loop-carried tiles live in registers (the
flash-attention loops: forward, dK/dV and dQ).

The CUDA emitter's general path keeps every tile in shared memory and
spills each `ttile.dot` result there, with a barrier between steps. That is
correct for any Tile IR but slow for a loop like flash attention's, which
per key block computes a score block, a row max and sum, a rescale and a
second dot. This module emits such an `scf.for` the way FlashAttention-2
does:

* Each of the block's W warps owns BM/W whole rows, so every tile of the
  loop is either a **fragment** (`[BM, n]`, f32 accumulator layout of
  `mma.sync.m16n8k16`, `v[mt][n/8][4]` per thread) or a **column**
  (`[BM, 1]`, `v[mt][2]`: the thread's rows g and g+8 of each 16-row tile).
  Row reductions are a per-thread reduction plus two quad shuffles; nothing
  round-trips through shared memory and no barrier separates the steps.
* The tiles the loop **loads** (key and value blocks) stream through a ring
  of `stages` bf16 shared-memory buffers filled by `cp.async` one iteration
  ahead (the kernel's `stages` attribute), and feed the tensor cores as the
  B operand through `ldmatrix` (`.trans` when the tile is k x n, plain when
  the dot reads its transpose).
* A dot's A operand is either loop-invariant (the query block: read into
  registers once, before the loop; or, when the carried tiles leave too few
  registers, copied once to shared memory and read by `ldmatrix` per k
  step) or a bf16 fragment computed in the loop (the probabilities): the
  accumulator layout of two adjacent n8 tiles is exactly the A layout of
  one k16 step, so P never leaves registers.

tessera-gpu-software-pipeline decides which loops run this way and where each value
lives (`RegisterLoopPlan`); `RegisterLoop(emitter, op, pipeline).emit()`
prints one. Results leave as register Fragments (`[BM, n]`, which
the emitter's pointwise epilogue reads directly) or shared-memory tiles
(`[BM, 1]` columns).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_mlir import ir

from ...ir import gpu_schedule as gs
from ...ir.types import enum_of, tile_of
from ..printer import Tile, c_literal, ctype
from .common import REDUCE, WGMMA_BRANCH, Fragment, swizzled_desc

@dataclass
class _Val:
    """How a value of the loop body is held: `frag` ([BM, n] registers,
    `name[mt][n/8][4]`), `col` ([BM, 1], `name[mt][2]`), `row` ([1, n], the
    thread's columns, `name[n/8][2]`), `const` (a literal), `bcast` (the
    value `src` read at the coordinates of a wider tile), `stage` (a load
    staged in shared-memory ring `stage`) or `stage_t` (its transpose, `src`
    the stage's _Val). Tiles defined before the loop have no _Val: they are
    shared-memory tiles (or literals, for fills)."""
    kind: str
    name: str = ""          # C array, pointer or literal
    shape: tuple = ()
    ctype: str = "float"
    src: object = None      # bcast: the ir.Value; stage_t: the stage's _Val
    stage: int = -1


class RegisterLoop:
    """Prints an scf.for that tessera-gpu-software-pipeline scheduled with its tiles
    in registers (`#ttile.pipeline<kind = registers, ...>`): its values'
    placements, its staged loads, how each invariant A operand is read and
    the ring's offset are in the IR."""

    def __init__(self, em, op: ir.Operation, pipeline: gs.Pipeline):
        self.em, self.op = em, op
        self.block = op.regions[0].blocks[0]
        self.iv = self.block.arguments[0]
        self.carried = list(self.block.arguments)[1:]
        self.body = [o.operation for o in self.block.operations]
        self.warps = em.threads // 32
        self.bm = tile_of(self.carried[0].type)[0][0]
        self.mt = self.bm // (16 * self.warps)
        self.loads, self.invariant_a = gs.register_loop_parts(op)
        self.direct = {a for a in self.invariant_a if gs.place(a) == "global"}
        self.wgmma, self.tma = pipeline.wgmma, pipeline.tma
        self.pingpong = pipeline.pingpong
        self.ahead_dot = next(o for o in self.body if o.name == "ttile.dot") \
            if pipeline.issue_ahead else None
        self.wgmma_why = gs.fallback(op)        # why its dots are not on wgmma

    # -- emission helpers ------------------------------------------------------------
    def line(self, text: str) -> None:
        self.em.line(text)

    def _loops(self, kind: str, width: int) -> None:
        """Opens the unrolled loops over a thread's elements of a `kind` value
        `width` columns wide and defines its row (`r_`) and column (`c_`)."""
        g, t = self.g, self.t
        dims = (("mi", self.mt), ("ni", width // 8), ("q", 4)) if kind == "frag" else \
            (("mi", self.mt), ("h", 2))
        for var, n in dims:
            self.line("#pragma unroll")
            self.line(f"for (int {var} = 0; {var} < {n}; ++{var}) {{")
            self.em.indent += 1
        if kind == "frag":
            self.line(f"const int r_ = {self.wm0} + 16 * mi + {g} + 8 * (q >> 1); (void)r_;")
            self.line(f"const int c_ = 8 * ni + 2 * {t} + (q & 1); (void)c_;")
        else:
            self.line(f"const int r_ = {self.wm0} + 16 * mi + {g} + 8 * h; (void)r_;")
            self.line("const int c_ = 0; (void)c_;")

    def _close(self, kind: str) -> None:
        for _ in range(3 if kind == "frag" else 2):
            self.em.indent -= 1
            self.line("}")

    def _element(self, v: ir.Value, domain: str) -> str:
        """The C expression of `v`'s element at the current loop coordinates."""
        val = self.vals.get(v)
        if val is None:             # defined before the loop: a literal or a shared-memory tile
            literal = self._fill_literal(v)
            if literal:
                return literal
            tile = self.em.names[v]
            rows, cols = tile.shape
            terms = ([f"r_ * {cols}" if cols != 1 else "r_"] if rows != 1 else []) + \
                (["c_"] if cols != 1 else [])
            return f"{tile.name}[{' + '.join(terms) or '0'}]"
        if val.kind == "const":
            return val.name
        if val.kind == "bcast":
            return self._element(val.src, domain)
        if val.kind == "frag":
            return f"{val.name}[mi][ni][q]"
        if val.kind == "row":
            return f"{val.name}[ni][q & 1]"
        return f"{val.name}[mi][{'q >> 1' if domain == 'frag' else 'h'}]"

    def _dims(self, kind: str, width: int) -> str:
        return f"[{self.mt}][{width // 8}][4]" if kind == "frag" else f"[{self.mt}][2]"

    def _write(self, dst: str, kind: str, width: int, expr_of) -> None:
        """dst[element] = expr_of(kind) at every element of the thread's
        part of a `kind` tile `width` columns wide."""
        self._loops(kind, width)
        index = "[mi][ni][q]" if kind == "frag" else "[mi][h]"
        self.line(f"{dst}{index} = {expr_of(kind)};")
        self._close(kind)

    def _declare(self, v: ir.Value, kind: str) -> _Val:
        shape, elt = tile_of(v.type)
        ct = ctype(elt, v.location)
        name = self.em.fresh("rv")
        self.line(f"{ct} {name}{self._dims(kind, shape[1])};")
        val = _Val(kind, name, tuple(shape), ct)
        self.vals[v] = val
        return val

    def _assign(self, v: ir.Value, kind: str, expr_of, elt: str) -> None:
        """`v` := expr_of(domain) at every element (bf16 rounded)."""
        val = self.vals[v]
        wrap = (lambda e: f"bf16_round({e})") if elt == "bf16" else (lambda e: e)
        self._write(val.name, kind, val.shape[1], lambda d: wrap(expr_of(d)))

    # -- emission ------------------------------------------------------------------
    def emit(self) -> None:
        em, op = self.em, self.op
        stages = em.stages
        self.vals: dict = {}
        self.lane, self.wm0 = em.fresh("lane"), em.fresh("wm")
        self.g, self.t = f"({self.lane} >> 2)", f"({self.lane} & 3)"
        wgmma_why = self.wgmma_why
        instruction = ("wgmma.mma_async from 128-byte-swizzled shared memory; ldmatrix and "
                       "mma.sync.m16n8k16 on plain sm_90" if self.wgmma
                       else "ldmatrix, mma.sync.m16n8k16")
        copies = "TMA for wgmma, cp.async for mma.sync" if self.tma else "cp.async"
        if self.pingpong:
            instruction += "; the two warpgroups take turns issuing their wgmmas"
        if self.ahead_dot is not None:
            instruction += "; the first dot of the next iteration issued before this one's rest"
        em.line(f"// scf.for with its tiles in registers: {self.warps} warps x {self.bm // self.warps} "
                f"rows, {len(self.loads)} tile(s) staged through {stages} shared-memory buffer"
                f"{'s' if stages > 1 else ''} ({copies}, {instruction})")
        if wgmma_why:
            em.line(f"// (mma.sync, not wgmma: {wgmma_why})")
        self.line(f"const int {self.lane} = threadIdx.x & 31;")
        self.line(f"const int {self.wm0} = (threadIdx.x >> 5) * {self.bm // self.warps};")

        # The loop-carried registers, from their initial values.
        carried = []
        for arg, init in zip(self.carried, list(op.operands)[3:]):
            kind = "col" if tile_of(arg.type)[0][1] == 1 else "frag"
            carried.append(self._declare(arg, kind))
            self._assign(arg, kind, lambda d, init=init: self._element(init, d), "f32")
        self.carried_vals = carried

        # One shared-memory region holds either branch's staging ring and
        # shared A operands.
        ring = gs.integer(op, gs.RING)
        outer = dict(self.vals)
        if self.wgmma:
            self.line(WGMMA_BRANCH)
            self._emit_loop(ring, wgmma=True)
            self.line("#else")
            self.vals = dict(outer)
        self._emit_loop(ring, wgmma=False)
        if self.wgmma:
            self.line("#endif")
        self.vals = outer
        self._results(carried)

    #: The named barriers of the ping-pong turns: warpgroup w waits on
    #: barrier PINGPONG_BARRIER + w, which the other warpgroup arrives on.
    PINGPONG_BARRIER = 1

    def _ring_layout(self, wgmma: bool) -> tuple[list, int]:
        """[(row pitch or None, elements per slot)] per staged load, and the
        bytes of the ring plus the shared A operands, in the `wgmma` or the
        mma.sync branch (gpu_schedule.register_ring)."""
        return gs.register_ring(self.loads, list(self._shared_a_operands(wgmma)), self.bm,
                                self.em.stages, wgmma)

    def _emit_loop(self, ring: int, wgmma: bool) -> None:
        """The staging ring from byte `ring` and the loop, its dots on wgmma
        or on mma.sync."""
        em, op = self.em, self.op
        stages = em.stages
        self.in_wgmma = wgmma
        lb, _, step = (em.scalar(v) for v in list(op.operands)[:3])
        layout, _ = self._ring_layout(wgmma)
        self.line("{")
        em.indent += 1
        self.smem_a = self._shared_a_operands(wgmma)
        regs_of = {}
        for a in self.invariant_a:
            if a in self.smem_a:
                continue
            k = tile_of(a.type)[0][1]
            name = em.fresh("qa")
            regs_of[a] = name
            # Register r of k step kk holds row g (+8 for odd r), columns 2t, 2t+1 (+8 for r >= 2).
            at = (f"({self.wm0} + 16 * mi + {self.g} + 8 * (r & 1))",
                  f"16 * kk + 2 * {self.t} + 8 * (r >> 1)")
            self.line(f"uint32_t {name}[{self.mt}][{k // 16}][4];")
            self.line("#pragma unroll")
            self.line(f"for (int mi = 0; mi < {self.mt}; ++mi)")
            self.line("#pragma unroll")
            self.line(f"  for (int kk = 0; kk < {k // 16}; ++kk)")
            self.line("#pragma unroll")
            self.line("    for (int r = 0; r < 4; ++r) {")
            if a in self.direct:         # two adjacent bf16s of the global buffer
                buf, start, shape = em.load_start(a.owner.operation)
                self.line(f"      const uint16_t* p = {buf} + {start} + (int64_t){at[0]} * {shape[-1]} "
                          f"+ {at[1]};")
                self.line(f"      {name}[mi][kk][r] = (uint32_t)p[0] | ((uint32_t)p[1] << 16);")
            else:
                self.line(f"      const float* p = {em.names[a].name} + {at[0]} * {k} + {at[1]};")
                self.line(f"      {name}[mi][kk][r] = tessera_pack_bf16(p[0], p[1]);")
            self.line("    }")
        self.regs_of = regs_of
        self.stage_ptr = []
        base = ring
        for i, (ld, elems) in enumerate(layout):
            self.stage_ptr.append((f"st{i}_{em.counter}", base, ld, elems))
            base += stages * elems * 2
        for i, (load, (name, _, _, _)) in enumerate(zip(self.loads, self.stage_ptr)):
            self.vals[load.results[0]] = _Val("stage", name, stage=i)
        for name, at, _, _ in self.stage_ptr:
            self.line(f"uint16_t* const {name}_ring = reinterpret_cast<uint16_t*>(tessera_smem + {at});")
        for a in self.smem_a:
            name, k = em.fresh("sa"), tile_of(a.type)[0][1]
            self.smem_a[a] = (name, None if wgmma else k + 8)
            self.line(f"uint16_t* const {name} = reinterpret_cast<uint16_t*>(tessera_smem + {base});")
            em.cp_async_tile(name, a.owner.operation, self.bm, k, self.smem_a[a][1])
            base += self.bm * (k if wgmma else k + 8) * 2
        if self.smem_a:
            # Their own commit group, older than the ring's first: the loop's
            # first wait and barrier cover it (with a TMA ring, `ready` waits
            # for it).
            self.line("tessera_cp_async_commit();")

        # TMA writes the wgmma ring through the async proxy that wgmma reads
        # through; cp.async writes through the generic proxy, so each thread
        # fences its landed copies (the ring's, or only the shared A
        # operands' with TMA) before the barrier.
        full = em.mbarrier_ring(("full", 1))[0] if wgmma and self.tma else None
        self.full = full
        ready = None
        if wgmma and not full:
            ready = "tessera_fence_proxy_async();"
        elif full and self.smem_a:
            # Their commit group is the only one: waited at the first
            # iteration; later waits and fences find nothing to do.
            ready = "tessera_cp_async_wait<0>(); tessera_fence_proxy_async();"

        def load(slot: str) -> None:
            copies = []
            for tile_load, (name, _, ld, elems) in zip(self.loads, self.stage_ptr):
                rows, cols = tile_of(tile_load.results[0].type)[0]
                dst = f"{name}_ring + ({slot}) * {elems}"
                if full:
                    copies.append((dst, tile_load, rows, cols))
                else:
                    em.cp_async_tile(dst, tile_load, rows, cols, ld)
            if full:
                em.tma_copies(f"&{full}[{slot}]", copies)

        turns = wgmma and self.pingpong
        first = self.PINGPONG_BARRIER

        def body(slot: str) -> None:
            if turns:
                # Warpgroup 0 takes the first turn: warpgroup 1 hands it over.
                self.line(f"if (it == 0 && (threadIdx.x >> 7) == 1) "
                          f"tessera_named_barrier_arrive({first}, 256);")
            iv = em.fresh("k")
            self.line(f"const int64_t {iv} = {lb} + it * {step};")
            em.names[self.iv] = iv
            for name, _, _, elems in self.stage_ptr:
                self.line(f"const uint16_t* const {name} = {name}_ring + ({slot}) * {elems};")
            for o in self.body:
                if o.name == "scf.yield":
                    self._yield(o, self.carried_vals)
                else:
                    self._emit(o)
            if ahead:
                self._ahead_rotate()

        ahead = wgmma and self.ahead_dot is not None
        if ahead:   # across iterations: each one's ahead dot is issued in the one before
            self.ahead_cur = self._declare(self.ahead_dot.results[0], "frag")

        em.staged_loop(self.iv, list(op.operands)[:3], load, body, ready=ready, full=full)
        if turns:
            # Warpgroup 1's hand-over after its last wgmma: warpgroup 0
            # takes it, so no barrier keeps arrivals past the loop.
            self.line(f"if (n_it > 0 && (threadIdx.x >> 7) == 0) "
                      f"tessera_named_barrier_sync({first}, 256);")
        em.indent -= 1
        self.line("}")

    def _shared_a_operands(self, wgmma: bool) -> dict:
        """The invariant A operands the `wgmma` (or mma.sync) branch keeps in
        shared memory (tessera-gpu-software-pipeline's `ttile.shared_in`), as keys,
        largest first (their copies' order in the ring's region)."""
        branch = "wgmma" if wgmma else "mma_sync"
        regs = {a: self.mt * tile_of(a.type)[0][1] // 16 * 4 for a in self.invariant_a}
        return {a: None for a in sorted(self.invariant_a, key=lambda a: -regs[a])
                if branch in gs.shared_in(a)}

    def _fill_literal(self, v: ir.Value) -> str | None:
        owner = v.owner
        if isinstance(owner, ir.Block) or owner.operation.name != "ttile.fill":
            return None
        ct = ctype(tile_of(v.type)[1], v.location)
        return c_literal(ir.FloatAttr(owner.operation.attributes["value"]).value, ct)

    def _emit(self, o) -> None:
        em, name = self.em, o.name
        if name == "ttile.load":
            return
        if name == "ttile.transpose":
            src = o.operands[0]
            if src in self.vals:
                self.vals[o.results[0]] = _Val("stage_t", src=self.vals[src])
            else:
                self._row(src.owner.operation, o.results[0])
            return
        result = o.results[0]
        shape, elt = tile_of(result.type)
        kind = "col" if shape[1] == 1 else "frag"
        if name == "ttile.fill":
            self.vals[result] = _Val("const", self._fill_literal(result), tuple(shape))
            return
        if name == "ttile.broadcast":
            src = o.operands[0]
            self.vals[result] = _Val("bcast", shape=tuple(shape), src=src)
            return
        if name == "ttile.dot":
            self._dot(o)
            return
        if name == "ttile.reduce":
            self._reduce(o)
            return
        self._declare(result, kind)
        if name == "ttile.iota":
            dim = ir.IntegerAttr(o.attributes["dim"]).value
            start = em.scalar(o.operands[0])
            ct = ctype(elt)
            self._assign(result, kind, lambda d: f"({ct})({start} + {'r_' if dim == 0 else 'c_'})", elt)
            return
        self._assign(result, kind, lambda d: em.expression(
            o, [self._element(v, d) for v in o.operands]), elt)

    def _row(self, load, result: ir.Value) -> None:
        """`result` = a loaded [n, 1] column as a [1, n] row: the thread's
        columns 8 ni + 2t + j, read from global memory."""
        em = self.em
        n = tile_of(result.type)[0][1]
        buf, start, shape = em.load_start(load)
        name = em.fresh("row")
        read = f"{buf}[{start} + (int64_t)(8 * ni + 2 * {self.t} + j) * {shape[-1]}]"
        if em.buffer_elements[buf] == "bf16":
            read = f"bf16_to_float({read})"
        self.line(f"float {name}[{n // 8}][2];")
        self.line("#pragma unroll")
        self.line(f"for (int ni = 0; ni < {n // 8}; ++ni)")
        self.line("#pragma unroll")
        self.line(f"  for (int j = 0; j < 2; ++j) {name}[ni][j] = {read};")
        self.vals[result] = _Val("row", name, (1, n))

    def _reduce(self, o) -> None:
        src = self.vals[o.operands[0]]
        identity, combine = REDUCE[enum_of(o)]
        r = self._declare(o.results[0], "col")
        self.line("#pragma unroll")
        self.line(f"for (int mi = 0; mi < {self.mt}; ++mi)")
        self.line("#pragma unroll")
        self.line("  for (int h = 0; h < 2; ++h) {")
        self.line(f"    float a = {identity};")
        self.line("#pragma unroll")
        self.line(f"    for (int ni = 0; ni < {src.shape[1] // 8}; ++ni)")
        self.line("#pragma unroll")
        self.line(f"      for (int j = 0; j < 2; ++j) {{ const float b = {src.name}[mi][ni][2 * h + j]; "
                  f"a = {combine}; }}")
        # The four lanes of a quad hold the row's other columns.
        self.line("#pragma unroll")
        self.line("    for (int off = 1; off < 4; off <<= 1) { "
                  f"const float b = __shfl_xor_sync(0xffffffffu, a, off); a = {combine}; }}")
        self.line(f"    {r.name}[mi][h] = a;")
        self.line("  }")

    def _dot(self, o) -> None:
        if self.in_wgmma:
            if self.ahead_dot is not None and o == self.ahead_dot:
                self._ahead(o)
            else:
                self._wgmma_dot(o)
            return
        a, b, acc = list(o.operands)[:3]
        (_, k), (_, n) = tile_of(a.type)[0], tile_of(b.type)[0]
        bval = self.vals[b]
        trans = bval.kind == "stage_t"
        stage = bval.src if trans else bval
        name, _, ld, _ = self.stage_ptr[stage.stage]
        r = self._declare(o.results[0], "frag")
        self._assign(o.results[0], "frag", lambda d: self._element(acc, d), "f32")
        source = ("shared memory (ldmatrix)" if a in self.smem_a else
                  "loop-invariant registers" if a in self.regs_of else "registers")
        self.line(f"// ttile.dot {self.bm}x{n}x{k}: A from {source}, B {'transposed ' if trans else ''}"
                  f"from the staged tile (ldmatrix{'' if trans else '.trans'})")
        self.line("#pragma unroll")
        self.line(f"for (int kk = 0; kk < {k // 16}; ++kk) {{")
        self.em.indent += 1
        self.line(f"uint32_t af[{self.mt}][4], bf[{n // 8}][2];")
        if a in self.smem_a:
            sa, a_ld = self.smem_a[a]
            self.em.load_a_fragments(sa, a_ld, "16 * kk", self.wm0, self.lane, self.mt)
        else:
            self.line("#pragma unroll")
            self.line(f"for (int mi = 0; mi < {self.mt}; ++mi)")
            self.line("#pragma unroll")
            self.line("  for (int r = 0; r < 4; ++r) {")
            if a in self.regs_of:
                self.line(f"    af[mi][r] = {self.regs_of[a]}[mi][kk][r];")
            else:
                # Accumulator tiles 2kk and 2kk+1 are the A operand of k step kk.
                x = self.vals[a].name
                self.line(f"    const float* p = {x}[mi][2 * kk + (r >> 1)] + 2 * (r & 1);")
                self.line("    af[mi][r] = tessera_pack_bf16(p[0], p[1]);")
            self.line("  }")
        self.em.load_b_fragments(name, ld, "16 * kk", "0", self.lane, n // 8, transposed=trans)
        self.em.mma_tiles("tessera_mma_bf16", r.name, self.mt, n // 8)
        self.em.indent -= 1
        self.line("}")

    def _wgmma_dot(self, o, into: str | None = None, b_tile: str | None = None) -> None:
        """The dot on wgmma.mma_async.m64nNk16, one instruction per k step for
        the warpgroup's 64 rows: A from registers (the invariant operand's,
        or a computed tile packed to bf16 pairs, which are exactly the
        accumulator's two adjacent n8 tiles) or from its swizzled
        shared-memory copy, B from the staged tile through a descriptor:
        N-major when the tile is k x n, K-major when the dot reads its
        transpose. The group is waited for at once: the next op reads the
        result. With `into` (an accumulator array the caller declared and
        filled) the group is only issued and committed, reading B from
        `b_tile` (a slot's pointer; default this iteration's)."""
        em = self.em
        a, b, acc = list(o.operands)[:3]
        (_, k), (_, n) = tile_of(a.type)[0], tile_of(b.type)[0]
        bval = self.vals[b]
        k_major = bval.kind == "stage_t"
        stage = bval.src if k_major else bval
        name = b_tile or self.stage_ptr[stage.stage][0]
        rows = tile_of(self.loads[stage.stage].results[0].type)[0][0]
        if into is None:
            r = self._declare(o.results[0], "frag")
            self._assign(o.results[0], "frag", lambda d: self._element(acc, d), "f32")
        else:
            r = _Val("frag", into)
        in_registers = a not in self.smem_a
        em.wgmma_shapes.add((n, "bf16", in_registers, not k_major))
        source = ("its swizzled shared-memory copy" if not in_registers else
                  "loop-invariant registers" if a in self.regs_of else "registers")
        self.line(f"// ttile.dot {self.bm}x{n}x{k} on wgmma: A from {source}, B "
                  f"{'K-major (the staged tile read transposed)' if k_major else 'N-major'}")
        self.line("{")
        em.indent += 1
        if in_registers and a not in self.regs_of:
            x = self.vals[a].name
            self.line(f"uint32_t ra[{k // 16}][4];")
            self.line("#pragma unroll")
            self.line(f"for (int kk = 0; kk < {k // 16}; ++kk)")
            self.line("#pragma unroll")
            self.line("  for (int r = 0; r < 4; ++r) {")
            self.line(f"    const float* p = {x}[0][2 * kk + (r >> 1)] + 2 * (r & 1);")
            self.line("    ra[kk][r] = tessera_pack_bf16(p[0], p[1]);")
            self.line("  }")
        # kk counts elements of K; a staged n x k tile is B K-major, k x n N-major.
        b_desc = swizzled_desc(name, rows, "kk", k_major)
        if not in_registers:        # the warpgroup's 64 rows of the copy
            tile = f"{self.smem_a[a][0]} + (threadIdx.x >> 7) * {64 * 64}"
            a_arg = swizzled_desc(tile, self.bm, "kk", True)
            call = f"tessera_wgmma_bf16<{n}, {int(not k_major)}>"
        else:
            a_arg = f"{self.regs_of[a]}[0][kk / 16]" if a in self.regs_of else "ra[kk / 16]"
            call = f"tessera_wgmma_rs_bf16<{n}, {int(not k_major)}>"
        turn = self.PINGPONG_BARRIER
        if self.pingpong:       # wait for this warpgroup's turn
            self.line(f"tessera_named_barrier_sync({turn} + (threadIdx.x >> 7), 256);")
        self.line(f"tessera_wgmma_fence_operands<{n // 2}>(&{r.name}[0][0][0]);")
        self.line("tessera_wgmma_fence();")
        self.line("#pragma unroll")
        self.line(f"for (int kk = 0; kk < {k}; kk += 16)")
        self.line(f"  {call}(&{r.name}[0][0][0], {a_arg}, {b_desc});")
        self.line("tessera_wgmma_commit();")
        if self.pingpong:       # issued: the other warpgroup's turn while this one waits
            self.line(f"tessera_named_barrier_arrive({turn + 1} - (threadIdx.x >> 7), 256);")
        if into is None:
            self.line("tessera_wgmma_wait<0>();")
            self.line(f"tessera_wgmma_fence_operands<{n // 2}>(&{r.name}[0][0][0]);")
        em.indent -= 1
        self.line("}")

    def _ahead(self, o) -> None:
        """The ahead dot (`_ahead_dot`) at its place in iteration `it`: its
        result for this iteration (issued an iteration ago, or now in the
        first) is waited for, then the next iteration's is issued into
        `ahead_next` from the next slot, once its TMA copies have landed,
        and runs under the rest of this iteration; `_ahead_rotate` moves
        it to `ahead_cur` at the iteration's end."""
        n = tile_of(o.results[0].type)[0][1]
        cur, nxt = self.ahead_cur.name, self.em.fresh("sn")
        zero = lambda d: "0.0f"     # noqa: E731
        self.line("if (it == 0) {")
        self.em.indent += 1
        self._write(cur, "frag", n, zero)
        self._wgmma_dot(o, into=cur)
        self.em.indent -= 1
        self.line("}")
        self.line("tessera_wgmma_wait<0>();")
        self.line(f"tessera_wgmma_fence_operands<{n // 2}>(&{cur}[0][0][0]);")
        self.line(f"float {nxt}{self._dims('frag', n)};")
        self.line("if (it + 1 < n_it) {")
        self.em.indent += 1
        stages = self.em.stages
        self.line(f"tessera_mbarrier_wait(&{self.full}[(it + 1) % {stages}], "
                  f"(unsigned)((it + 1) / {stages}) & 1);")
        self._write(nxt, "frag", n, zero)
        b = o.operands[1]
        stage = self.vals[b].src if self.vals[b].kind == "stage_t" else self.vals[b]
        ring, _, _, elems = self.stage_ptr[stage.stage]
        self._wgmma_dot(o, into=nxt, b_tile=f"({ring}_ring + ((it + 1) % {stages}) * {elems})")
        self.em.indent -= 1
        self.line("}")
        self.ahead_next = (nxt, n)

    def _ahead_rotate(self) -> None:
        """End of an iteration: the next iteration's ahead dot becomes its
        current one. (A later dot's wait has usually completed it already;
        the wait here makes that so for any body.)"""
        nxt, n = self.ahead_next
        cur = self.ahead_cur.name
        self.line("if (it + 1 < n_it) {")
        self.em.indent += 1
        self.line("tessera_wgmma_wait<0>();")
        self.line(f"tessera_wgmma_fence_operands<{n // 2}>(&{nxt}[0][0][0]);")
        self._write(cur, "frag", n, lambda d: f"{nxt}[mi][ni][q]")
        self.em.indent -= 1
        self.line("}")

    def _yield(self, o, carried: list[_Val]) -> None:
        values = list(o.operands)
        reads_carried = any(v in self.carried or (v in self.vals and self.vals[v].kind == "bcast"
                                                  and self.vals[v].src in self.carried)
                            for v in values)
        staged = []
        for arg, v, val in zip(self.carried, values, carried):
            if v == arg:
                continue
            new = lambda d, v=v: self._element(v, d)
            if reads_carried:       # every new value first, then overwrite
                tmp = self.em.fresh("ny")
                self.line(f"{val.ctype} {tmp}{self._dims(val.kind, val.shape[1])};")
                self._write(tmp, val.kind, val.shape[1], new)
                index = "[mi][ni][q]" if val.kind == "frag" else "[mi][h]"
                staged.append((val, lambda d, tmp=tmp, index=index: tmp + index))
            else:
                self._write(val.name, val.kind, val.shape[1], new)
        for val, read in staged:
            self._write(val.name, val.kind, val.shape[1], read)

    def _results(self, carried: list[_Val]) -> None:
        """Fragments stay in registers (the emitter's Fragment); columns go to
        shared memory for whatever reads them after the loop."""
        em = self.em
        spilled = False
        for res, val in zip(self.op.results, carried):
            if not list(res.uses):
                continue
            if val.kind == "frag":
                em.frags[res] = Fragment(val.name, [self.bm, val.shape[1]], self.mt, val.shape[1] // 8,
                                         self.wm0, "0", self.lane)
                continue
            tile: Tile = em.new_tile(res)
            self.line("#pragma unroll")
            self.line(f"for (int mi = 0; mi < {self.mt}; ++mi)")
            self.line("#pragma unroll")
            self.line(f"  for (int h = 0; h < 2; ++h) if (({self.lane} & 3) == 0) "
                      f"{tile.name}[{self.wm0} + 16 * mi + {self.g} + 8 * h] = {val.name}[mi][h];")
            spilled = True
        if spilled:
            em.sync()
