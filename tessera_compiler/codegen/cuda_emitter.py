"""Emits CUDA C++ for sm_90a (Hopper) from Tile IR.

Each grid point of a `ttile.kernel` is one thread block (`blockIdx`); its
`block` threads cooperate on every tile. Three ideas keep tiles out of memory:

* **Pointwise regions.** Consecutive pointwise ops (elementwise math,
  compare, select, cast, fill, iota, broadcast, load, store) over one
  iteration shape are emitted as ONE loop in which each thread computes whole
  elements in registers: a fused GELU, bias add or cast reads its inputs and
  writes its result once. A value leaves registers (into shared memory) only
  when something outside its region reads it: a reduction, a `ttile.dot`, a
  loop, or a later region.
* **Tensor-core GEMM main loops.** An `scf.for` that accumulates
  `ttile.dot(load A, load B)` with half-precision operands, an f32
  accumulator and `warps` on the dot runs as an `mma.sync.m16n8k16` loop:
  A and B tiles stream through a ring of `stages` shared-memory buffers
  filled by `cp.async` ahead of use, `ldmatrix` feeds the tensor cores, and
  the accumulator stays in registers, laid out as the mma instruction
  defines. The pointwise epilogue after the loop (bias, activation,
  residual, cast, store) runs on those registers directly. A dot marked
  `wgmma` runs as Hopper's warpgroup MMA instead: the ring holds its tiles
  128-byte swizzled, `wgmma.mma_async` reads both operands from shared
  memory through matrix descriptors, and one wgmma group stays in flight
  while the next is issued. The accumulator layout is the same, so the
  epilogue is too, and a build for plain sm_90 (no arch-specific
  features) compiles the mma.sync loop in its place.
* **Loops with their tiles in registers** (`register_loop.py`): a
  flash-attention loop (dots with whole rows per warp, loads feeding only
  dots) keeps every tile it carries or computes in registers, streams its
  loads through a `cp.async` ring of `stages` buffers and feeds one dot's
  result to the next as its A operand without shared memory.
* **Cooperative reductions.** Reductions split each output over a group of
  lanes combined with warp shuffles.

Shared memory is one dynamic buffer (`tessera_smem`); each kernel's size is
reported in its launch configuration (`emit_cuda_kernels`), which the runtime
passes at launch (and uses to raise the kernel's dynamic shared memory limit
above 48 KB when needed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_mlir import ir

from ..ir import gpu_schedule as gs
from ..ir.options import DEFAULT, TargetOptions
from ..ir.support import kernels_of, marked_args
from ..ir.types import enum_of, tile_of
from .cuda_common import REDUCE, WGMMA_BRANCH, Fragment, swizzled_desc
from .register_loop import RegisterLoop
from .tile_emitter import (BF16_HELPERS, ELEMENTWISE_EXPRESSIONS, EmitError, KernelEmitter, Tile,
                           c_literal, ctype)

POINTWISE = gs.POINTWISE
_MMA_TYPES = gs.MMA_TYPES


@dataclass
class Region:
    """Pending pointwise ops over one iteration shape (`domain`): region
    `number` of tessera-gpu-place."""
    ops: list
    domain: list[int]
    fragment: Fragment | None = None
    number: int = -1


class CudaKernelEmitter(KernelEmitter):
    cuda = True

    def __init__(self, options: TargetOptions = DEFAULT):
        super().__init__()
        self.options = options
        self.region: Region | None = None
        self.frags: dict = {}               # value -> Fragment
        self.scalars: dict = {}             # value -> C name, inside a region loop
        self.smem_decls: list[str] = []
        self.threads = 1            # threads running the code being emitted
        self.barrier_offsets: list[int] = []    # the next mbarrier arrays' (mbarrier_ring)
        # The wgmma instructions used: (N, element type, A in registers, B N-major).
        self.wgmma_shapes: set = set()
        self.tensor_maps: list = []         # {"arg", "box"} of each TMA tensor map, in order
        self.uses_nvshmem = False

    # -- shared memory: offsets from tessera-gpu-alloc-shared -----------------------
    def _release(self) -> None:
        """Tiles died here (`ttile.release`): a barrier before their bytes are
        reused, so no thread still reads one when another overwrites it."""
        if not self.lines or self.lines[-1].strip() != "__syncthreads();":
            self.sync()

    def _offset(self, value: ir.Value) -> int:
        """The byte offset of `value`'s shared tile: its defining op's
        `ttile.smem`, or a shared loop's (for a carried block argument)."""
        owner = value.owner
        if isinstance(owner, ir.Block):         # the carried tile of a shared loop
            loop = owner.owner.operation
            return gs.smem(loop.results[ir.BlockArgument(value).arg_number - 1])
        return gs.smem(value)

    def new_tile(self, value: ir.Value) -> Tile:
        tile = super().new_tile(value)
        offset = self._offset(value)
        self.smem_decls.append(f"{tile.ctype}* const {tile.name} = reinterpret_cast<{tile.ctype}*>"
                               f"(tessera_smem + {offset});  // tile {'x'.join(map(str, tile.shape))}")
        return tile

    def sync(self) -> None:
        self.line("__syncthreads();")

    def fast(self, ct: str, fn: str, arg: str) -> str:
        # A float exp as 2^(x * log2 e) on the special-function unit
        # (tessera_ex2), where expf without fast math is a longer accurate
        # range reduction (and exp2f made ptxas spill in attention). The
        # multiply's rounding costs |x| * 2^-24 relative: far below what fp32
        # kernels need (softmax exponents are <= 0 and small).
        if fn == "exp" and ct == "float":
            return f"tessera_ex2(({arg}) * 1.4426950408889634f)"
        if fn == "exp2" and ct == "float":
            return f"tessera_ex2({arg})"
        return super().fast(ct, fn, arg)

    def element_loop(self, e: str, n) -> str:
        # Strided by the threads still running (not blockDim.x): a producer
        # warpgroup leaves the kernel after the GEMM main loop.
        return f"for (int64_t {e} = threadIdx.x; {e} < {n}; {e} += {self.threads}) {{"

    # -- kernel ----------------------------------------------------------------
    def emit_kernel(self, kernel: ir.Operation) -> str:
        name, grid, entry, params, prologue = self.signature(kernel)
        block = list(ir.DenseI64ArrayAttr(kernel.attributes["block"]))
        self.threads = block_threads = math.prod(block)
        self.stages = (ir.IntegerAttr(kernel.attributes["stages"]).value
                       if "stages" in kernel.attributes else 2)
        self.kernel_location = kernel.location
        if not gs.planned(kernel):
            raise EmitError(f"kernel @{name} has no GPU schedule: run tessera-gpu-pipeline, "
                            "tessera-gpu-place and tessera-gpu-alloc-shared first "
                            "(tessera-translate --ttile-to-cuda does)", kernel.location)
        self.shared_bytes = gs.integer(kernel, gs.SMEM_BYTES)
        start = len(self.lines)
        for d in range(len(grid)):
            self.line(f"const int64_t pid{d} = blockIdx.{'xyz'[d]};")
        for op in entry.operations:
            self.emit_op(op.operation)
        self.flush()
        body = self.lines[start:]
        self.launch = {"grid": grid, "block": block, "shared_bytes": self.shared_bytes}
        if self.tensor_maps:
            # One device buffer of 128-byte CUtensorMaps, built by the runtime
            # for this launch's arguments; see _tma_tile.
            params = params + ["const unsigned char* __restrict__ tessera_tmaps"]
            self.launch["tensor_maps"] = self.tensor_maps
        head = [f"// ttile.kernel @{name}",
                f"// launch: grid ({', '.join(map(str, grid))}), block ({', '.join(map(str, block))}), "
                f"dynamic shared memory {self.shared_bytes} bytes",
                f'extern "C" __global__ void __launch_bounds__({block_threads}) '
                f"{name}({', '.join(params)}) {{"]
        # 1024-byte alignment: wgmma's 128-byte swizzle is a function of the
        # shared-memory address, in 1024-byte atoms.
        smem = (["  extern __shared__ __align__(1024) unsigned char tessera_smem[];"]
                + ["  " + d for d in self.smem_decls]) if self.shared_bytes else []
        return "\n".join(head + ["  " + p for p in prologue] + smem + body + ["}"]) + "\n"

    # -- dispatch ----------------------------------------------------------------
    def emit_op(self, op: ir.Operation) -> None:
        if op.name in POINTWISE:
            self._add_to_region(op)
            return
        if op.name == "scf.for":
            pipeline = gs.pipeline(op)
            if pipeline is not None:
                if pipeline.kind == "gemm":
                    self._emit_mma_loop(op, pipeline)
                else:
                    self._emit_register_loop(op, pipeline)
                return
            why = gs.fallback(op)
            if why is not None:
                self.flush()
                self.line(f"// scf.for with its tiles in shared memory: {why}")
        if op.name.startswith("ttile.") or op.name.startswith("scf."):
            self.flush()
            self._spill_read(op.operands, op)
            if gs.flag(op, gs.RELEASE):
                self._release()
        super().emit_op(op)

    def _spill_read(self, values, op) -> None:
        """Before `op` (marked `ttile.spill`), the fragments among `values`
        go to their shared tiles."""
        if gs.flag(op, gs.SPILL):
            for v in values:
                if v in self.frags:
                    self._spill(v)

    def op_ttile_barrier(self, op):
        self.sync()

    # -- NVSHMEM -------------------------------------------------------------------
    # Puts are block-collective calls (every thread takes part); signals and
    # waits are issued by one thread between barriers, so the block's earlier
    # work is issued before a signal and nothing runs ahead of a wait.
    def _nvshmem(self) -> None:
        self.uses_nvshmem = True

    def op_ttile_my_pe(self, op):
        self._nvshmem()
        v = self.fresh("pe")
        self.line(f"const int64_t {v} = nvshmem_my_pe();")
        self.names[op.results[0]] = v

    def op_ttile_n_pes(self, op):
        self._nvshmem()
        v = self.fresh("npes")
        self.line(f"const int64_t {v} = nvshmem_n_pes();")
        self.names[op.results[0]] = v

    def _box_copy(self, op, call: str) -> None:
        """`call`(dest, source, bytes, pe) once per contiguous row of the box
        `op` (a ttile.put or ttile.get) copies."""
        self._nvshmem()
        view = op.opview
        src, dst = self.names[view.source], self.names[view.dest]
        shape = list(ir.DenseI64ArrayAttr(op.attributes["shape"]))
        src_shape, dst_shape = self.buffers[src], self.buffers[dst]
        elt = ir.MemRefType(view.source.type).element_type
        nbytes = {"f64": 8, "i64": 8, "f32": 4, "i32": 4, "bf16": 2, "f16": 2}.get(str(elt), 1)

        def base(buf_shape, offsets, ivs):
            lead = len(buf_shape) - len(shape)
            terms = []
            for d, o in enumerate(offsets):
                at = o if d < lead or d - lead >= len(ivs) else f"({o} + {ivs[d - lead]})"
                stride = math.prod(buf_shape[d + 1:])
                terms.append(at if stride == 1 else f"{at} * {stride}")
            return " + ".join(terms)
        ivs = []
        for n in shape[:-1]:
            iv = self.fresh("r")
            ivs.append(iv)
            self.line(f"for (int64_t {iv} = 0; {iv} < {n}; ++{iv})")
        so = [self.scalar(v) for v in view.source_offsets]
        do = [self.scalar(v) for v in view.dest_offsets]
        self.line(f"  {call}({dst} + {base(dst_shape, do, ivs)}, "
                  f"{src} + {base(src_shape, so, ivs)}, {shape[-1] * nbytes}, "
                  f"(int){self.scalar(view.pe)});")

    def op_ttile_put(self, op):
        self._box_copy(op, "nvshmemx_putmem_nbi_block")

    def op_ttile_get(self, op):
        # Non-blocking gets of every row, then one quiet: the rows travel
        # together rather than one round trip each; the barrier makes what
        # each thread's share of the copy brought visible to the whole block.
        self._box_copy(op, "nvshmemx_getmem_nbi_block")
        self.line("nvshmem_quiet();")
        self.sync()

    def _signal_word(self, op) -> str:
        """The address of the signal word `op` names (`signals[index]`)."""
        self._nvshmem()
        view = op.opview
        return (f"reinterpret_cast<uint64_t*>({self.names[view.signals]}) + "
                f"{self.scalar(view.index)}")

    def op_ttile_signal(self, op):
        kind = {"set": "NVSHMEM_SIGNAL_SET", "add": "NVSHMEM_SIGNAL_ADD"}[
            ir.StringAttr(op.attributes["kind"]).value]
        view = op.opview
        self.sync()
        self.line(f"if (threadIdx.x == 0) nvshmemx_signal_op({self._signal_word(op)}, "
                  f"(uint64_t){self.scalar(view.value)}, {kind}, (int){self.scalar(view.pe)});")

    def op_ttile_wait(self, op):
        cmp = "NVSHMEM_CMP_" + ir.StringAttr(op.attributes["cmp"]).value.upper()
        self.line(f"if (threadIdx.x == 0) nvshmem_signal_wait_until({self._signal_word(op)}, "
                  f"{cmp}, (uint64_t){self.scalar(op.opview.value)});")
        self.sync()

    def op_ttile_fence(self, op):
        self._nvshmem()
        self.line("nvshmem_fence();")

    def op_ttile_quiet(self, op):
        self._nvshmem()
        self.line("nvshmem_quiet();")
        self.sync()

    # -- pointwise regions ---------------------------------------------------------
    def _add_to_region(self, op) -> None:
        """Pointwise `op` joins its region (`ttile.region`); a new region
        starts after the pending one is emitted, its fragments spilled
        first where `ttile.spill` says. Ops without a region are folded
        into the loop that reads them."""
        number = gs.region(op)
        if number is None:
            return
        if self.region is None or self.region.number != number:
            self.flush()
            self._spill_read(op.operands, op)
            domain = list(ir.DenseI64ArrayAttr(op.attributes[gs.DOMAIN]))
            self.region = Region([op], domain, None, number)
        else:
            self.region.ops.append(op)
        if self.region.fragment is None:
            self.region.fragment = next((self.frags[v] for v in op.operands if v in self.frags),
                                        None)

    def flush(self) -> None:
        """Emits the pending region as one loop over its domain."""
        region, self.region = self.region, None
        if region is None:
            return
        # Tiles dead before the region's first op make room for its outputs.
        if gs.flag(region.ops[0], gs.RELEASE):
            self._release()
        outside = [v for op in region.ops for v in op.results if gs.smem(v) is not None]
        domain = region.domain
        frag = region.fragment
        if frag is not None:
            coords = self._fragment_loop(frag)
        else:
            size = math.prod(domain)
            e = self.fresh("e")
            self.line(self.element_loop(e, size))
            self.indent += 1
            coords = []
            for d, n in enumerate(domain):
                stride = math.prod(domain[d + 1:])
                c = self.fresh("x")
                expr = "0" if n == 1 else (f"{e} / {stride}" if d == 0 else f"({e} / {stride}) % {n}")
                self.line(f"const int64_t {c} = {expr};")
                coords.append(c)
        self.coords, self.domain = coords, domain
        for op in region.ops:
            self._pointwise(op)
        for v in outside:
            t = self.new_tile(v)
            self._guarded(t.shape, f"{t.name}[{self._index(t.shape)}] = {self.scalars[v]};")
        self.scalars.clear()
        loops = 3 if frag is not None else 1
        for _ in range(loops):
            self.indent -= 1
            self.line("}")
        if outside:
            self.sync()

    def _fragment_loop(self, frag: Fragment) -> list[str]:
        mi, ni, q = self.fresh("mi"), self.fresh("ni"), self.fresh("q")
        for var, n in ((mi, frag.mt), (ni, frag.nt), (q, 4)):
            self.line("#pragma unroll")
            self.line(f"for (int {var} = 0; {var} < {n}; ++{var}) {{")
            self.indent += 1
        r, c = self.fresh("x"), self.fresh("x")
        self.line(f"const int64_t {r} = {frag.wm0} + 16 * {mi} + ({frag.lane} >> 2) + 8 * ({q} >> 1);")
        self.line(f"const int64_t {c} = {frag.wn0} + 8 * {ni} + 2 * ({frag.lane} & 3) + ({q} & 1);")
        self.frag_element = f"{frag.name}[{mi}][{ni}][{q}]"
        return [r, c]

    def _index(self, shape: list[int]) -> str:
        """Linear index into a tile of `shape` at the region's coordinates
        (size-1 dimensions of a broadcast tile use 0)."""
        terms = [f"{c} * {math.prod(shape[d + 1:])}" if math.prod(shape[d + 1:]) != 1 else c
                 for d, c in enumerate(self.coords) if shape[d] != 1]
        return " + ".join(terms) or "0"

    def _guarded(self, shape: list[int], statement: str) -> None:
        """`statement` by the threads at coordinate 0 of every dimension `shape`
        broadcasts over (one writer per element)."""
        conds = [f"{c} == 0" for c, s, n in zip(self.coords, shape, self.domain) if s == 1 and n > 1]
        self.line(f"if ({' && '.join(conds)}) {statement}" if conds else statement)

    def _value(self, v: ir.Value) -> str:
        if v in self.scalars:
            return self.scalars[v]
        if v in self.frags:
            return self.frag_element
        t = self.names[v]
        if isinstance(t, Tile):
            return f"{t.name}[{self._index(t.shape)}]"
        return t        # an index scalar

    def _define(self, v: ir.Value, expr: str) -> None:
        shape, elt = tile_of(v.type)
        ct = ctype(elt, v.location)
        name = self.fresh("v")
        if elt == "bf16":
            expr = f"bf16_round({expr})"
        self.line(f"const {ct} {name} = {expr};")
        self.scalars[v] = name

    def _address(self, buf: str, tile_shape: list[int], offsets: list[str]) -> str:
        shape = self.buffers[buf]
        lead = len(shape) - len(tile_shape)
        coords = self.coords[len(self.coords) - len(tile_shape):]
        terms = []
        for d in range(len(shape)):
            stride = math.prod(shape[d + 1:])
            at = offsets[d]
            if d >= lead and tile_shape[d - lead] != 1:
                at = f"({at} + {coords[d - lead]})"
            terms.append(at if stride == 1 else f"{at} * {stride}")
        return " + ".join(terms) or "0"

    def _pointwise(self, op) -> None:
        name = op.name
        if name == "ttile.store":
            value, buf = self._value(op.operands[0]), self.names[op.operands[1]]
            shape = tile_of(op.operands[0].type)[0]
            addr = self._address(buf, shape, [self.scalar(v) for v in list(op.operands)[2:]])
            if self.buffer_elements[buf] == "bf16":
                value = f"float_to_bf16({value})"
            self._guarded(shape, f"{buf}[{addr}] = {value};")
            return
        result = op.results[0]
        shape, elt = tile_of(result.type)
        if name == "ttile.load":
            buf = self.names[op.operands[0]]
            read = f"{buf}[{self._address(buf, shape, [self.scalar(v) for v in list(op.operands)[1:]])}]"
            self.scalars[result] = self.fresh("v")
            ct = ctype(elt, op.location)
            value = f"bf16_to_float({read})" if self.buffer_elements[buf] == "bf16" else read
            self.line(f"const {ct} {self.scalars[result]} = {value};")
            return
        if name == "ttile.fill":
            ct = ctype(elt, op.location)
            self._define(result, c_literal(ir.FloatAttr(op.attributes["value"]).value, ct))
            return
        if name == "ttile.iota":
            dim = ir.IntegerAttr(op.attributes["dim"]).value
            coord = self.coords[dim] if shape[dim] != 1 else "0"
            self._define(result, f"({ctype(elt)})({self.scalar(op.operands[0])} + {coord})")
            return
        if name == "ttile.broadcast":
            # Every value is evaluated at the region's coordinates, and a tile's
            # size-1 dimensions ignore them: broadcasting is free.
            self.scalars[result] = self._value(op.operands[0])
            return
        if name not in ELEMENTWISE_EXPRESSIONS:
            raise EmitError(f"the CUDA emitter does not support '{name}'", op.location)
        self._define(result, self.expression(op, [self._value(v) for v in op.operands]))

    def _spill(self, v: ir.Value) -> None:
        """Writes a register fragment to a shared-memory tile (for a consumer
        that needs the whole tile: a reduction, a dot, a loop)."""
        frag = self.frags.pop(v)
        self.flush()
        coords = self._fragment_loop(frag)
        self.coords, self.domain = coords, frag.shape
        t = self.new_tile(v)
        self.line(f"{t.name}[{self._index(t.shape)}] = {self.frag_element};")
        for _ in range(3):
            self.indent -= 1
            self.line("}")
        self.sync()

    # -- reductions ------------------------------------------------------------------
    def op_ttile_reduce(self, op):
        src = self.names[op.operands[0]]
        r = self.new_tile(op.results[0])
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        kind = enum_of(op)
        identity, combine = REDUCE[kind]
        inner = math.prod(src.shape[dim + 1:])
        n, outs = src.shape[dim], r.size
        # Lanes per output: a power of two up to a warp, so the partial results
        # combine with shuffles; every thread runs the same number of passes
        # (the shuffles need the whole warp).
        group = 1
        if r.ctype in ("float", "double") and self.threads % 32 == 0:
            while group < 32 and group * 2 <= n and outs * group * 2 <= self.threads:
                group *= 2
        per_pass = self.threads // group
        ct = r.ctype
        self.line(f"for (int64_t base = 0; base < {outs}; base += {per_pass}) {{")
        self.indent += 1
        self.line(f"const int64_t o = base + threadIdx.x / {group};")
        self.line(f"const int64_t lane_g = threadIdx.x % {group};")
        self.line(f"{ct} a = {identity if ct in ('float', 'double') else '0'};")
        self.line(f"if (o < {outs}) {{")
        self.indent += 1
        self.line(f"const int64_t outer = o / {inner}, in = o % {inner};")
        if ct not in ("float", "double"):       # integers: start from the first element
            self.line(f"a = {src.name}[outer * {n * inner} + in];")
            self.line(f"for (int64_t q = 1; q < {n}; ++q) {{ const {ct} b = "
                      f"{src.name}[outer * {n * inner} + q * {inner} + in]; a = {combine}; }}")
        else:
            self.line(f"for (int64_t q = lane_g; q < {n}; q += {group}) {{ const {ct} b = "
                      f"{src.name}[outer * {n * inner} + q * {inner} + in]; a = {combine}; }}")
        self.indent -= 1
        self.line("}")
        if group > 1:
            self.line(f"for (int off = {group // 2}; off > 0; off >>= 1) {{ "
                      f"const {ct} b = __shfl_xor_sync(0xffffffffu, a, off); a = {combine}; }}")
        self.line(f"if (o < {outs} && lane_g == 0) {r.name}[o] = a;")
        self.indent -= 1
        self.line("}")
        self.sync()

    # -- tensor-core building blocks ------------------------------------------------
    def _warp_accumulator(self, m: int, n: int, wm: int, wn: int) -> tuple[str, str, str, str]:
        """Declares an `m x n` f32 accumulator split over `wm x wn` warps in
        mma fragment layout (`acc[mt][nt][4]`, see Fragment), with this
        thread's lane and its warp's first row and column; returns their names."""
        acc, lane, wm0, wn0 = (self.fresh(x) for x in ("acc", "lane", "wm", "wn"))
        self.line(f"const int {lane} = threadIdx.x & 31;")
        self.line(f"const int {wm0} = ((threadIdx.x >> 5) / {wn}) * {m // wm}, "
                  f"{wn0} = ((threadIdx.x >> 5) % {wn}) * {n // wn};")
        self.line(f"float {acc}[{m // wm // 16}][{n // wn // 8}][4];")
        return acc, lane, wm0, wn0

    def mma_tiles(self, mma: str, acc: str, mt: int, nt: int) -> None:
        """acc[mi][ni] += af[mi] x bf[ni] for every mma tile of the warp."""
        self.line("#pragma unroll")
        self.line(f"for (int mi = 0; mi < {mt}; ++mi)")
        self.line("#pragma unroll")
        self.line(f"  for (int ni = 0; ni < {nt}; ++ni) {mma}({acc}[mi][ni], af[mi], bf[ni]);")

    def load_a_fragments(self, smem: str, ld: int, k0: str, m0: str, lane: str, mt: int) -> None:
        """`af[mt][4]`: the mma A fragments of the k step starting at `k0`,
        for rows `m0` on, from a bf16 shared-memory tile (m x k, row pitch
        `ld`), one ldmatrix.x4 per 16 rows."""
        self.line("#pragma unroll")
        self.line(f"for (int mi = 0; mi < {mt}; ++mi) tessera_ldmatrix_x4(af[mi], {smem} + "
                  f"({m0} + 16 * mi + ({lane} & 15)) * {ld} + {k0} + ({lane} >> 4) * 8);")

    def load_b_fragments(self, smem: str, ld: int, k0: str, n0: str, lane: str, nt: int,
                          transposed: bool) -> None:
        """`bf[nt][2]`: the mma B fragments of the k step starting at `k0`, for
        columns `n0` on, from a bf16 shared-memory tile with row pitch `ld`,
        16 columns per ldmatrix.x4. The tile is k x n (read with .trans) or,
        `transposed`, n x k: its rows are B's columns, as ldmatrix reads them."""
        self.line("#pragma unroll")
        self.line(f"for (int nj = 0; nj < {nt // 2}; ++nj) {{")
        if transposed:
            self.line(f"  uint32_t r[4]; tessera_ldmatrix_x4(r, {smem} + ({n0} + nj * 16 + (({lane} >> 4) << 3) "
                      f"+ ({lane} & 7)) * {ld} + {k0} + (({lane} >> 3) & 1) * 8);")
        else:
            self.line(f"  uint32_t r[4]; tessera_ldmatrix_x4_trans(r, {smem} + ({k0} + ({lane} & 15)) * {ld} "
                      f"+ {n0} + nj * 16 + ({lane} >> 4) * 8);")
        self.line("  bf[2 * nj][0] = r[0]; bf[2 * nj][1] = r[1]; "
                  "bf[2 * nj + 1][0] = r[2]; bf[2 * nj + 1][1] = r[3];")
        self.line("}")

    # -- dot on tensor cores from shared-memory tiles ------------------------------
    def _tile_mma(self, op) -> None:
        """acc + a x b on tensor cores, operands read from their shared-memory
        tiles into mma fragments (bf16 pairs packed per thread as the PTX ISA
        lays out m16n8k16), the result left in registers as a Fragment."""
        a, b, c = (self.names[v] for v in list(op.operands)[:3])
        (m, k), (_, n) = a.shape, b.shape
        wm, wn = list(ir.DenseI64ArrayAttr(op.attributes["warps"]))
        mt, nt = m // wm // 16, n // wn // 8
        self.line(f"// ttile.dot {m}x{n}x{k} on tensor cores (mma.sync.m16n8k16) from shared memory, "
                  f"warps {wm}x{wn}")
        acc, lane, wm0, wn0 = self._warp_accumulator(m, n, wm, wn)
        g, t = f"({lane} >> 2)", f"({lane} & 3)"
        self.line("#pragma unroll")
        self.line(f"for (int mi = 0; mi < {mt}; ++mi)")
        self.line("#pragma unroll")
        self.line(f"  for (int ni = 0; ni < {nt}; ++ni)")
        self.line("#pragma unroll")
        self.line(f"    for (int q = 0; q < 4; ++q) {acc}[mi][ni][q] = {c.name}[({wm0} + 16 * mi + "
                  f"{g} + 8 * (q >> 1)) * {n} + {wn0} + 8 * ni + 2 * {t} + (q & 1)];")
        self.line("#pragma unroll")
        self.line(f"for (int kk = 0; kk < {k}; kk += 16) {{")
        self.indent += 1
        self.line(f"uint32_t af[{mt}][4], bf[{nt}][2];")
        self.line("#pragma unroll")
        self.line(f"for (int mi = 0; mi < {mt}; ++mi)")
        self.line("#pragma unroll")
        self.line("  for (int r = 0; r < 4; ++r) {")
        self.line(f"    const float* p = {a.name} + ({wm0} + 16 * mi + {g} + 8 * (r & 1)) * {k} + "
                  f"kk + 2 * {t} + 8 * (r >> 1);")
        self.line("    af[mi][r] = tessera_pack_bf16(p[0], p[1]);")
        self.line("  }")
        self.line("#pragma unroll")
        self.line(f"for (int ni = 0; ni < {nt}; ++ni)")
        self.line("#pragma unroll")
        self.line("  for (int r = 0; r < 2; ++r) {")
        self.line(f"    const float* p = {b.name} + (kk + 2 * {t} + 8 * r) * {n} + {wn0} + 8 * ni + {g};")
        self.line(f"    bf[ni][r] = tessera_pack_bf16(p[0], p[{n}]);")
        self.line("  }")
        self.mma_tiles("tessera_mma_bf16", acc, mt, nt)
        self.indent -= 1
        self.line("}")
        self.frags[op.results[0]] = Fragment(acc, [m, n], mt, nt, wm0, wn0, lane)

    # -- dot (SIMT): each thread computes whole output elements ---------------------
    def op_ttile_dot(self, op):
        if gs.place(op.results[0]) == "fragment":       # tessera-gpu-pipeline: tensor cores
            self._tile_mma(op)
            return
        why = gs.fallback(op)
        a, b, acc = (self.names[v] for v in list(op.operands)[:3])
        r = self.new_tile(op.results[0])
        M, K = a.shape
        N = b.shape[1]
        acc_t = r.ctype
        self.line(f"// ttile.dot {M}x{N}x{K} on CUDA cores" + (f": {why}" if why else ""))

        def body(e):
            self.line(f"const int64_t i = {e} / {N}, j = {e} % {N};")
            self.line(f"{acc_t} s = {acc.name}[{e}];")
            self.line(f"for (int64_t k = 0; k < {K}; ++k) s += ({acc_t}){a.name}[i * {K} + k] * "
                      f"({acc_t}){b.name}[k * {N} + j];")
            self.line(f"{r.name}[{e}] = s;")
        self.for_each(M * N, body)

    # -- cp.async staging ------------------------------------------------------------
    def load_start(self, load) -> tuple[str, str, list[int]]:
        """(C name, flat element offset, shape) of the buffer a `ttile.load`
        reads, at its offsets."""
        buf = self.names[load.operands[0]]
        shape = self.buffers[buf]
        start = " + ".join(f"{self.scalar(v)} * {math.prod(shape[d + 1:])}"
                           for d, v in enumerate(list(load.operands)[1:]))
        return buf, start, shape

    def cp_async_tile(self, dst: str, load, rows: int, cols: int, ld: int | None) -> None:
        """Copies `load`'s rows x cols 16-bit tile to shared memory at `dst`
        in 16-byte cp.async chunks over the block: rows `ld` elements apart,
        or, with `ld` None, in wgmma's 128-byte swizzle (64-column panels of
        128-byte rows, chunk c of row r at chunk c ^ (r % 8); see
        `_wgmma_main_loop`)."""
        buf, start, shape = self.load_start(load)
        place = (f"((c >> 6) * {rows} + r) * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3)"
                 if ld is None else f"r * {ld} + c")
        self.line("#pragma unroll")
        self.line(f"for (int ch = threadIdx.x; ch < {rows * cols // 8}; ch += {self.threads}) {{")
        self.line(f"  const int r = ch / {cols // 8}, c = (ch % {cols // 8}) * 8;")
        self.line(f"  tessera_cp_async16({dst} + {place}, "
                  f"{buf} + {start} + (int64_t)r * {shape[-1]} + c);")
        self.line("}")

    def _trip_count(self, lb: str, ub: str, step: str) -> None:
        """Declares `n_it`, the iterations of a loop from `lb` to `ub` by `step`."""
        self.line(f"const int64_t n_it = {ub} > {lb} ? ({ub} - {lb} + {step} - 1) / {step} : 0;")

    def _at_iteration(self, iv: ir.Value, lb: str, step: str, it: str, emit) -> None:
        """Runs `emit()` with the loop variable `iv` bound to iteration
        `it`'s value (the C constant `kv`): the loads of a later iteration."""
        self.line(f"const int64_t kv = {lb} + ({it}) * {step};")
        saved = self.names.get(iv)
        self.names[iv] = "kv"
        emit()
        self.names[iv] = saved

    def staged_loop(self, iv: ir.Value, bounds, load, body, lag: int = 0,
                     ready: str | None = None, full: str | None = None) -> None:
        """An scf.for (induction variable `iv`, `bounds` lb/ub/step) whose
        loads stream through a ring of `stages` shared-memory slots:
        `load(slot)` emits the cp.async copies of one iteration (with `iv`
        bound to that iteration's value), `body(slot)` its computation (the
        C loop counter is `it`). `ahead` = stages - 1 - lag iterations'
        loads are in flight before the loop; each iteration waits for its
        own (then runs the `ready` statement, before the barrier), refills
        the slot every warp finished with, then computes; one commit group
        per iteration, even if empty. `lag` is how many iterations'
        computations may still be reading their slots when the next
        iteration starts (asynchronous wgmma groups left in flight): the slot
        refilled is the one read lag + 1 iterations ago. With nothing ahead,
        each iteration loads its own slot and ends with a barrier.

        With `full` (one mbarrier per slot, from mbarrier_ring) `load(slot)`
        issues TMA copies counted on `&full[slot]` (tma_copies): thread 0
        runs it, and each iteration waits on its slot's barrier phase
        instead of a cp.async group."""
        lb, ub, step = (self.scalar(v) for v in bounds)
        ahead = self.stages - 1 - lag
        assert ahead >= 0, "a pipeline needs more stages than computations in flight"

        def issue(slot: str, it: str) -> None:
            self.line("if (threadIdx.x == 0) {" if full else "{")
            self.indent += 1
            self._at_iteration(iv, lb, step, it, lambda: load(slot))
            self.indent -= 1
            self.line("}")
            if not full:
                self.line("tessera_cp_async_commit();")

        self._trip_count(lb, ub, step)
        for s in range(ahead):
            self.line(f"if ({s} < n_it)")
            issue(str(s), str(s))
        self.line("for (int64_t it = 0; it < n_it; ++it) {")
        self.indent += 1
        slot = "0" if self.stages == 1 else f"it % {self.stages}"
        if ahead == 0:
            issue(slot, "it")
        if full:
            self.line(f"tessera_mbarrier_wait(&{full}[{slot}], (unsigned)(it / {self.stages}) & 1);")
        else:
            self.line(f"tessera_cp_async_wait<{max(ahead - 1, 0)}>();")
        if ready:
            self.line(ready)
        self.line("__syncthreads();")
        if ahead:
            self.line(f"if (it + {ahead} < n_it)")
            issue(f"(it + {ahead}) % {self.stages}", f"it + {ahead}")
        body(slot)
        if ahead == 0:
            self.line("__syncthreads();")      # before the next iteration overwrites the slot
        self.indent -= 1
        self.line("}")
        if not full:
            self.line("tessera_cp_async_wait<0>();")
        self.line("__syncthreads();")

    # -- loops with their tiles in registers (register_loop.py) ------------------------
    def _emit_register_loop(self, op, pipeline) -> None:
        self.flush()
        self._spill_read(gs.loop_reads(op), op)     # register tiles from before: to shared memory
        if gs.flag(op, gs.RELEASE):
            self._release()
        self.barrier_offsets = gs.barriers(op)
        RegisterLoop(self, op, pipeline).emit()

    # -- tensor-core GEMM main loop --------------------------------------------------
    def _emit_mma_loop(self, op, pipeline) -> None:
        """A GEMM main loop as tessera-gpu-pipeline scheduled it (its
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
        mma = "tessera_mma_" + _MMA_TYPES[p["elt"]]
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
        elt = _MMA_TYPES[p["elt"]]
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


    def _tma_tile(self, dst: str, load, rows: int, cols: int, barrier: str) -> None:
        """Issues the TMA copies of `load`'s rows x cols tile to shared memory
        at `dst` (one thread): one box of `rows` x 64 columns per 64-column
        panel, each landing as `rows` 128-byte rows swizzled by the tensor
        map (CU_TENSOR_MAP_SWIZZLE_128B), the layout `cp_async_tile` writes
        for wgmma; completion is counted in bytes on `barrier`. The tensor map
        (the load's kernel argument, that box) is the runtime's job."""
        source = list(load.operands)[0]
        rank = len(ir.MemRefType(source.type).shape)
        spec = {"arg": ir.BlockArgument(source).arg_number, "box": [1] * (rank - 2) + [rows, 64]}
        if spec not in self.tensor_maps:
            self.tensor_maps.append(spec)
        tmap = f"tessera_tmaps + {128 * self.tensor_maps.index(spec)}"
        coords = [f"(int)({self.scalar(v)})" for v in reversed(list(load.operands)[1:])]
        for panel in range(cols // 64):
            inner = coords[0] if panel == 0 else f"(int)({self.scalar(list(load.operands)[-1])} + {64 * panel})"
            self.line(f"tessera_tma_load_{rank}d({dst} + {panel * rows * 64}, {tmap}, "
                      f"{', '.join([inner] + coords[1:])}, {barrier});")

    def mbarrier_ring(self, *barriers) -> list[str]:
        """One mbarrier per ring slot for each of `barriers` ((name, arrivals
        a phase)) at the loop's `ttile.barriers` offsets, initialized before
        a block barrier; returns their names."""
        names, inits = [], []
        for name, count in barriers:
            offset = self.barrier_offsets.pop(0)    # tessera-gpu-alloc-shared's
            self.line(f"uint64_t* const {name} = reinterpret_cast<uint64_t*>(tessera_smem + {offset});")
            names.append(name)
            inits.append(f"tessera_mbarrier_init(&{name}[s], {count});")
        self.line("if (threadIdx.x == 0) {")
        self.line(f"  for (int s = 0; s < {self.stages}; ++s) {{ {' '.join(inits)} }}")
        self.line("  tessera_fence_barrier_init();")
        self.line("}")
        self.line("__syncthreads();")
        return names

    def tma_copies(self, full: str, copies) -> None:
        """One thread's code: arms mbarrier `full` with the bytes of `copies`
        ((shared-memory destination, load, rows, cols) of 16-bit tiles) and
        issues them."""
        nbytes = sum(rows * cols * 2 for _, _, rows, cols in copies)
        self.line(f"tessera_mbarrier_expect_tx({full}, {nbytes});")
        for dst, load, rows, cols in copies:
            self._tma_tile(dst, load, rows, cols, full)

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


# PTX wrappers for the tensor-core main loop (sm_80+ instructions; sm_90 runs
# them). `cuda_emulator.py` supplies C++ versions of the same functions to run
# generated kernels on a CPU, hence the guard.
_MMA_HELPERS = """\
#ifndef TESSERA_EMULATED_PTX
__device__ __forceinline__ void tessera_cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(s), "l"(gmem));
}
__device__ __forceinline__ void tessera_cp_async_commit() {
  asm volatile("cp.async.commit_group;\\n" ::);
}
template <int N> __device__ __forceinline__ void tessera_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\\n" :: "n"(N));
}
__device__ __forceinline__ void tessera_ldmatrix_x4(uint32_t* r, const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void tessera_ldmatrix_x4_trans(uint32_t* r, const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
#define TESSERA_MMA(NAME, TYPE)                                                          \\
  __device__ __forceinline__ void NAME(float* d, const uint32_t* a, const uint32_t* b) { \\
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 "            \\
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n"        \\
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                          \\
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));      \\
  }
TESSERA_MMA(tessera_mma_bf16, "bf16")
TESSERA_MMA(tessera_mma_f16, "f16")
// Named barrier ID (1..15; 0 is __syncthreads') of COUNT threads: sync
// arrives and waits for all COUNT, arrive only arrives (warpgroups taking
// turns: one waits on its barrier, the other arrives on it).
__device__ __forceinline__ void tessera_named_barrier_sync(unsigned id, unsigned count) {
  asm volatile("bar.sync %0, %1;\\n" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void tessera_named_barrier_arrive(unsigned id, unsigned count) {
  asm volatile("bar.arrive %0, %1;\\n" :: "r"(id), "r"(count) : "memory");
}
#endif
"""

# Hopper's warpgroup MMA and its fences: sm_90a only (arch-specific
# features), hence their own guard; `wgmma_wrapper` adds the instruction of
# each accumulator width a kernel uses. The emulator defines them too.
_WGMMA_HELPERS = """#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(TESSERA_EMULATED_PTX)
__device__ __forceinline__ uint32_t tessera_shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void tessera_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
}
__device__ __forceinline__ void tessera_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void tessera_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\\n" :: "n"(N) : "memory");
}
// Shared memory written by the generic proxy (cp.async, stores), made
// visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void tessera_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous wgmma operations that own the registers in between.
template <int N> __device__ __forceinline__ void tessera_wgmma_fence_operands(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// D (64 x N) += A x B with A K-major from a descriptor or (`rs`) from four
// registers, B from a descriptor: MnMajorB 1 for a K x N tile (N
// contiguous), 0 for an N x K tile (K contiguous). `wgmma_wrapper` writes
// the instances a kernel uses.
template <int N, int MnMajorB> __device__ void tessera_wgmma_bf16(float* d, uint64_t a, uint64_t b);
template <int N, int MnMajorB> __device__ void tessera_wgmma_f16(float* d, uint64_t a, uint64_t b);
template <int N, int MnMajorB>
__device__ void tessera_wgmma_rs_bf16(float* d, const uint32_t* a, uint64_t b);
template <int N, int MnMajorB>
__device__ void tessera_wgmma_rs_f16(float* d, const uint32_t* a, uint64_t b);
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(TESSERA_EMULATED_PTX)
// A wgmma shared-memory matrix descriptor with the 128-byte swizzle: start
// address, leading and stride byte offsets (each >> 4), swizzle mode 1.
__device__ __forceinline__ uint64_t tessera_wgmma_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  return uint64_t((tessera_shared_address(p) & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16)
       | (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
#endif
"""


# The tensor memory accelerator and the mbarriers that count its bytes
# (sm_90 instructions, used only on the wgmma path, hence the same guard).
# A tensor map lives in global memory, written by the host before the launch.
_TMA_HELPERS = """#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(TESSERA_EMULATED_PTX)
__device__ __forceinline__ void tessera_mbarrier_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\\n"
               :: "r"(tessera_shared_address(bar)), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (the TMA unit).
__device__ __forceinline__ void tessera_fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
}
// One arrival that also expects `bytes` of copies to complete on the barrier.
__device__ __forceinline__ void tessera_mbarrier_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n"
               :: "r"(tessera_shared_address(bar)), "r"(bytes) : "memory");
}
// One arrival (no bytes).
__device__ __forceinline__ void tessera_mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n"
               :: "r"(tessera_shared_address(bar)) : "memory");
}
// A warpgroup's per-thread register budget, changed at run time (all its
// threads execute it together).
template <int N> __device__ __forceinline__ void tessera_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\\n" :: "n"(N));
}
template <int N> __device__ __forceinline__ void tessera_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\\n" :: "n"(N));
}
__device__ __forceinline__ uint64_t tessera_globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Returns once the barrier's phase of this parity has completed. With
// TESSERA_WAIT_WATCHDOG_NS defined (TargetOptions.wait_watchdog_s), a wait
// that outlasts it traps (the launch fails; no printf: see emit_cuda_kernels).
__device__ __forceinline__ void tessera_mbarrier_wait(uint64_t* bar, unsigned parity) {
  uint32_t done;
#ifdef TESSERA_WAIT_WATCHDOG_NS
  const uint64_t start = tessera_globaltimer_ns();
#endif
  do {
    asm volatile("{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n"
                 "selp.u32 %0, 1, 0, p;\\n}\\n"
                 : "=r"(done) : "r"(tessera_shared_address(bar)), "r"(parity) : "memory");
#ifdef TESSERA_WAIT_WATCHDOG_NS
    if (!done && tessera_globaltimer_ns() - start > TESSERA_WAIT_WATCHDOG_NS) __trap();
#endif
  } while (!done);
}
"""


def _tma_load(rank: int) -> str:
    """`tessera_tma_load_<rank>d(dst, map, c0, .., bar)`: one box of the
    tensor map at coordinates c0 (innermost) .., into shared memory at `dst`,
    its bytes completing on mbarrier `bar`."""
    coords = ", ".join(f"int c{i}" for i in range(rank))
    operands = ", ".join(f"%{i + 3}" for i in range(rank))
    inputs = ", ".join(f'"r"(c{i})' for i in range(rank))
    return (f"__device__ __forceinline__ void tessera_tma_load_{rank}d(void* dst, const void* map, "
            f"{coords}, uint64_t* bar) {{\n"
            f'  asm volatile("cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.'
            f'mbarrier::complete_tx::bytes "\n'
            f'               "[%0], [%1, {{{operands}}}], [%2];\\n"\n'
            f'               :: "r"(tessera_shared_address(dst)), "l"(map), '
            f'"r"(tessera_shared_address(bar)),\n'
            f'                  {inputs} : "memory");\n}}\n')


_TMA_HELPERS += "".join(_tma_load(rank) for rank in range(2, 6)) + "#endif\n"


def wgmma_wrapper(n: int, elt: str, registers_a: bool = False, mn_major_b: bool = True) -> str:
    """`tessera_wgmma_[rs_]<elt><n, mn_major_b>`: one wgmma.mma_async.m64n<n>k16
    with an f32 accumulator of n/2 registers per thread, accumulating
    (scale-d = 1); A K-major from a shared-memory descriptor or
    (`registers_a`) from four registers per thread, B from a descriptor,
    N-major (imm-trans-b = 1) or K-major."""
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    if registers_a:
        name, a_param = f"tessera_wgmma_rs_{elt}", "const uint32_t* a"
        a_operand = "{" + ", ".join(f"%{regs + i}" for i in range(4)) + "}"
        a_inputs = ", ".join(f'"r"(a[{i}])' for i in range(4))
        b, pred, trans = regs + 4, regs + 5, ""
    else:
        name, a_param, a_operand, a_inputs = f"tessera_wgmma_{elt}", "uint64_t a", f"%{regs}", '"l"(a)'
        b, pred, trans = regs + 1, regs + 2, "0, "       # imm-trans-a: A K-major
    return (f"#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(TESSERA_EMULATED_PTX)\n"
            f"template <> __device__ __forceinline__ void {name}<{n}, {int(mn_major_b)}>"
            f"(float* d, {a_param}, uint64_t b) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{pred}, 0;\\n"\n'
            f'               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{elt}.{elt} "\n'
            f'               "{{{d}}}, {a_operand}, %{b}, p, 1, 1, {trans}{int(mn_major_b)};\\n}}\\n"\n'
            f"               : {outs}\n"
            f'               : {a_inputs}, "l"(b), "r"(1));\n'
            f"}}\n#endif\n")


CUDA_PRELUDE = """\
// Generated by Tessera from Tile IR (ttile). Do not edit.
#ifdef __CUDACC_RTC__
// NVRTC has no host C++ headers; its math functions and memcpy are built in.
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#else
#include <cmath>
#include <cstdint>
#include <cstring>
#endif
""" + BF16_HELPERS.format(q="__device__") + """\
// 2^x on the special-function unit (subnormal results flush to zero).
__device__ __forceinline__ float tessera_ex2(float x) {
#ifdef TESSERA_EMULATED_PTX
  return std::exp2(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}
// Two floats as the bf16 pair of one mma operand register (first in the low half).
__device__ inline uint32_t tessera_pack_bf16(float lo, float hi) {
  return (uint32_t)float_to_bf16(lo) | ((uint32_t)float_to_bf16(hi) << 16);
}
""" + _MMA_HELPERS + _WGMMA_HELPERS + _TMA_HELPERS


def emit_cuda_kernels(module, options: TargetOptions = DEFAULT) -> tuple[str, dict]:
    """CUDA C++ for every ttile.kernel of `module`, and each kernel's launch
    configuration: {name: {"grid", "block", "shared_bytes"}}, plus, for
    kernels calling NVSHMEM, `"nvshmem": True` and `"signals"`: the indices
    of arguments marked `ttile.signals` (the runtime zeroes them, then runs a
    barrier over all PEs, before each launch).

    `options.wait_watchdog_s` (None: no check) makes a thread still waiting
    on an mbarrier after that many seconds trap, so a ring whose phases are
    wrong fails its launch in seconds instead of hanging the GPU
    (bench/gpu_kit.py builds its checks with it). The check only reads the
    global timer and traps: a printf would be a function call, across which
    ptxas serializes every wgmma (measured: "wgmma pipeline crossing
    function boundary"), so the checks would not test the asynchronous
    kernels."""
    parts, launches, nvshmem = [CUDA_PRELUDE], {}, False
    wgmma_shapes = set()
    for kernel in kernels_of(module):
        emitter = CudaKernelEmitter(options)
        parts.append(emitter.emit_kernel(kernel))
        wgmma_shapes |= emitter.wgmma_shapes
        launch = dict(emitter.launch)
        if emitter.uses_nvshmem:
            launch["nvshmem"] = True
            launch["signals"] = marked_args(kernel, "ttile.signals")
        launches[ir.StringAttr(kernel.attributes["sym_name"]).value] = launch
        nvshmem |= emitter.uses_nvshmem
    parts[1:1] = [wgmma_wrapper(*shape) for shape in sorted(wgmma_shapes)]
    if options.wait_watchdog_s is not None:
        watchdog_ns = int(options.wait_watchdog_s * 1e9)
        parts.insert(0, f"#define TESSERA_WAIT_WATCHDOG_NS {watchdog_ns}ull\n")
    if nvshmem:
        # Device-initiated communication: NVSHMEM's device API (compile with
        # -rdc=true and link libnvshmem_device; see build.build_cuda_cubin).
        parts.insert(1, "#include <nvshmem.h>\n#include <nvshmemx.h>\n")
    return "\n".join(parts), launches


def emit_cuda(module, options: TargetOptions = DEFAULT) -> str:
    """CUDA C++: one `extern "C" __global__` kernel per ttile.kernel."""
    return emit_cuda_kernels(module, options)[0]
