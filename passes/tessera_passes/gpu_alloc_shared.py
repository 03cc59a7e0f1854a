"""tessera-gpu-alloc-shared: shared-memory offsets for a GPU kernel.

The last of the three GPU scheduling passes. A block's shared memory is one
dynamic buffer; this pass gives every allocation in it a byte offset, in
the order the CUDA printer emits the kernel (regions are flushed when the
next op leaves them):

* `ttile.smem` on the op defining a `shared` tile (one entry per result;
  a fragment's entry is its spill copy's): 16-byte aligned;
* `ttile.ring` on a pipelined scf.for: its ring of slots (1024-aligned for
  wgmma's swizzled tiles), and `ttile.barriers`: its mbarrier arrays (full,
  then empty, 8-byte aligned; TMA rings only);
* `ttile.smem_bytes` on the kernel: the block's dynamic shared memory
  (an error above sm_90's 227 KB).

Tiles share bytes by lifetime: a tile is last read by the last op reading
it (a value read inside a loop lives until the loop ends; a loop-carried
tile until the loop's result is last read); before a region, a non-pointwise
op or a register loop, the tiles nothing at or after it reads are freed
(`ttile.release` there: the printer puts a block barrier before the bytes
are reused). Allocation takes the first free range that holds the bytes,
else the end. Rings and barriers live to the kernel's end.
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.ir import gpu_schedule as gs
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.support import PassError, child_ops, kernels_of, nested_ops, run_reporting
from tessera_compiler.ir.types import is_tile, tile_of


class KernelAllocator:
    def __init__(self, kernel: ir.Operation):
        self.kernel = kernel
        self.size = 0
        self.holes: list[tuple[int, int]] = []
        self.live: dict = {}            # value -> (offset, bytes, last use)
        self.pending: list[ir.Operation] = []      # the region being built
        self.pending_number = None
        self.spilled: set = set()
        self._plan_lifetimes(kernel.regions[0].blocks[0])

    # -- lifetimes ---------------------------------------------------------------
    def _plan_lifetimes(self, entry: ir.Block) -> None:
        order, self.position, self.last_use = [], {}, {}
        end = {}

        def walk(block):
            for op in block.operations:
                op = op.operation
                self.position[op] = len(order)
                order.append(op)
                for region in op.regions:
                    for b in region.blocks:
                        walk(b)
                end[op] = len(order) - 1

        walk(entry)

        def def_parent(v):
            owner = v.owner
            return owner.owner if isinstance(owner, ir.Block) else owner.parent

        for op in order:
            for v in op.operands:
                home, at = def_parent(v), op
                while at.parent is not None and at.parent != home \
                        and at.parent.name != "ttile.kernel":
                    at = at.parent.operation
                self.last_use[v] = max(self.last_use.get(v, -1), end[at])
        for op in order:
            if op.name == "scf.for":
                args = list(op.regions[0].blocks[0].arguments)[1:]
                for arg, res in zip(args, op.results):
                    self.last_use[arg] = max(end[op], self.last_use.get(res, end[op]))

    # -- the allocator -------------------------------------------------------------
    def alloc(self, nbytes: int, align: int = gs.ALIGN) -> int:
        """The offset, a multiple of `align`, of `nbytes` (rounded up to 16):
        the first free range that holds them, else the end. Alignment
        padding at the end stays free."""
        nbytes = gs.aligned(nbytes)
        for i, (offset, size) in enumerate(self.holes):
            start = -(-offset // align) * align
            if size - (start - offset) >= nbytes:
                self.holes[i:i + 1] = [h for h in ((offset, start - offset),
                                                   (start + nbytes, offset + size - start - nbytes))
                                       if h[1]]
                return start
        start = -(-self.size // align) * align
        if start > self.size:
            self.holes.append((self.size, start - self.size))
        self.size = start + nbytes
        return start

    def release(self, position: int, at: ir.Operation) -> None:
        """Frees the tiles nothing at or after `position` reads; `at` gets
        `ttile.release` (a barrier before their bytes are reused)."""
        dead = [v for v, (_, _, last) in self.live.items() if last < position]
        if not dead:
            return
        at.attributes[gs.RELEASE] = ir.UnitAttr.get()
        for v in dead:
            offset, nbytes, _ = self.live.pop(v)
            self.holes.append((offset, nbytes))
        self.holes.sort()
        merged = []
        for offset, size in self.holes:
            if merged and merged[-1][0] + merged[-1][1] == offset:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((offset, size))
        self.holes = merged

    def tile(self, value: ir.Value) -> int:
        """A shared tile for `value` (its bytes live until its last use)."""
        shape, elt = tile_of(value.type)
        nbytes = gs.tile_bytes(shape, elt)
        offset = self.alloc(nbytes)
        owner = value.owner
        defined = self.position.get(owner.owner if isinstance(owner, ir.Block) else owner, 0)
        self.live[value] = (offset, gs.aligned(nbytes), self.last_use.get(value, defined))
        return offset

    # -- the printer's order ----------------------------------------------------------
    def run(self) -> None:
        for op in self.kernel.regions[0].blocks[0].operations:
            self.visit(op.operation)
        self.flush()
        name = ir.StringAttr(self.kernel.attributes["sym_name"]).value
        if self.size > gs.MAX_SHARED_BYTES:
            raise PassError(f"kernel @{name} needs {self.size} bytes of shared memory; an sm_90 "
                            f"block has at most {gs.MAX_SHARED_BYTES}: use smaller tiles or "
                            "fewer stages", self.kernel.location)
        self.kernel.attributes[gs.SMEM_BYTES] = gs.i64(self.size)

    def flush(self) -> None:
        ops, self.pending, self.pending_number = self.pending, [], None
        if not ops:
            return
        # Tiles dead before the region's first op make room for its outputs:
        # its shared values, and what a register loop reads itself but
        # others read too (the region stores them before the loop starts).
        self.release(min(self.position[op] for op in ops), ops[0])
        members = set(ops)
        for op in ops:
            for v in op.results:
                where = gs.place(v)
                if where == "shared" or (where in ("global", "literal") and any(
                        u.owner.operation not in members for u in v.uses)):
                    gs.set_smem(v, self.tile(v))

    def spill(self, values) -> None:
        for v in values:
            if gs.place(v) == "fragment" and v not in self.spilled:
                self.spilled.add(v)
                gs.set_smem(v, self.tile(v))

    def visit(self, op: ir.Operation) -> None:
        name = op.name
        if name in gs.POINTWISE:
            number = gs.region(op)
            if number is None:          # folded into the loop that reads it
                return
            if number != self.pending_number:
                self.flush()
                if gs.flag(op, gs.SPILL):
                    self.spill(op.operands)
                self.pending_number = number
            self.pending.append(op)
            return
        pipeline = gs.pipeline(op) if name == "scf.for" else None
        if pipeline is not None and pipeline.kind == "gemm":
            self.flush()
            loop, why_not = gs.match_gemm_loop(op)
            if loop is None:
                raise PassError(f"this loop's #ttile.pipeline says kind = gemm, but {why_not}: "
                                f"run tessera-gpu-software-pipeline to schedule it", op.location)
            nbytes, align = loop.ring(pipeline.stages, pipeline.wgmma)
            op.attributes[gs.RING] = gs.i64(self.alloc(nbytes, align))
            kinds = ["full", "empty"] if pipeline.producer else ["full"] if pipeline.tma else []
            self._barriers(op, kinds, pipeline.stages)
            return
        if pipeline is not None:        # tiles in registers
            self.flush()
            if gs.flag(op, gs.SPILL):
                self.spill(gs.loop_reads(op))
            self.release(self.position[op], op)
            loads, invariant = gs.register_loop_parts(op)
            block = op.regions[0].blocks[0]
            bm = tile_of(list(block.arguments)[1].type)[0][0]
            nbytes = max(gs.register_ring(loads, [a for a in invariant
                                                  if branch in gs.shared_in(a)],
                                          bm, pipeline.stages, branch == "wgmma")[1]
                         for branch in (["mma_sync", "wgmma"] if pipeline.wgmma else ["mma_sync"]))
            op.attributes[gs.RING] = gs.i64(self.alloc(nbytes, 1024 if pipeline.wgmma else 16))
            self._barriers(op, ["full"] if pipeline.wgmma and pipeline.tma else [],
                           pipeline.stages)
            for r in op.results:
                if gs.place(r) == "shared":
                    gs.set_smem(r, self.tile(r))
            return
        if name.startswith("ttile.") or name.startswith("scf."):
            self.flush()
            if gs.flag(op, gs.SPILL):
                self.spill(op.operands)
            self.release(self.position[op], op)
            self.handle(op)

    def _barriers(self, loop: ir.Operation, kinds: list[str], stages: int) -> None:
        if kinds:
            loop.attributes[gs.BARRIERS] = ir.DenseI64ArrayAttr.get(
                [self.alloc(gs.mbarrier_bytes(stages), align=8) for _ in kinds])

    def handle(self, op: ir.Operation) -> None:
        name = op.name
        if name in ("ttile.reduce", "ttile.transpose") or \
                (name == "ttile.dot" and gs.place(op.results[0]) == "shared"):
            gs.set_smem(op.results[0], self.tile(op.results[0]))
            return
        if name == "scf.for":           # its carried tiles in shared memory
            args = list(op.regions[0].blocks[0].arguments)[1:]
            for arg, result in zip(args, op.results):
                gs.set_smem(result, self.tile(arg))
        for inner in child_ops(op):
            self.visit(inner)


def allocate(module_op: ir.Operation) -> None:
    for kernel in kernels_of(module_op):
        unplaced = next((o for o in nested_ops(kernel) if gs.PLACE not in o.attributes
                         and any(is_tile(r.type) for r in o.results)), None)
        if unplaced is not None:
            raise PassError(f"'{unplaced.name}' has no ttile.place: run tessera-gpu-place "
                            "before tessera-gpu-alloc-shared", unplaced.location)
        KernelAllocator(kernel).run()


def run(op, pass_, options: TargetOptions):
    run_reporting(op, pass_, lambda: allocate(op))

