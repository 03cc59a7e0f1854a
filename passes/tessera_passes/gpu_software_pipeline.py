"""tessera-gpu-software-pipeline: choose how each scf.for of a GPU kernel runs
on tensor cores (its software pipeline: stages, ring, lag), and where a
register loop's values live.

The first of the three passes that schedule Tile IR for the GPU (then
tessera-gpu-place, tessera-gpu-alloc-shared; the CUDA printer only reads
what they decide). Each `scf.for` of a `ttile.kernel`, in program order,
is one of:

* a GEMM main loop, `acc = dot(load A, load B, acc)` from a fill, with
  bf16/f16 operands, an f32 accumulator and `warps`:
  `#ttile.pipeline<kind = gemm, ...>`: mma.sync, or wgmma where the dot
  asks for it (with an mma.sync branch for plain sm_90); its two loads
  stream through a ring of the kernel's `stages` slots, filled by cp.async
  or, where both loads ask for it, by TMA, issued by a producer warpgroup
  where the kernel has one (warp specialization); with 3+ stages a wgmma
  loop keeps one group in flight (`lag = 1`). Its loads are `staged`, its
  result a `fragment`.
* a loop with its tiles in registers (flash attention's):
  `#ttile.pipeline<kind = registers, ...>`: each warp owns whole rows; the
  loop's tiles are fragments, columns and rows in registers, its loads
  `staged` through a ring (TMA where they ask for it, on wgmma), its
  loop-invariant A operands read from global memory into registers
  (`global`) or, where the carried tiles leave too few registers (and
  always on wgmma where they qualify), copied to shared memory
  (`ttile.shared_in` names the branches that do); `ttile.pingpong` and
  `ttile.issue_ahead` on the loop become its pipeline's `pingpong` and
  `issue_ahead`.
* neither: its tiles stay in shared memory (`ttile.fallback` says why, and
  its body is scheduled op by op).

A dot outside such loops runs on tensor cores from its shared-memory
operands (its result a `fragment`) or on CUDA cores (`ttile.fallback`:
why, with why the loop before it could not).

Errors (a diagnostic at the op): `tma` loads or `wgmma` dots no schedule
can honour, `ttile.pingpong` / `ttile.issue_ahead` on loops that cannot,
a `producer_warpgroup` with no GEMM main loop to feed.
"""

from __future__ import annotations

import math

from tessera_mlir import ir
from tessera_mlir.dialects import ttile

from tessera_compiler.ir import gpu_schedule as gs
from tessera_compiler.ir.analysis import multiple_of
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.ops import TILE_ELEMENTWISE
from tessera_compiler.ir.support import PassError, child_ops, kernels_of, run_reporting
from tessera_compiler.ir.types import is_tile, tile_of

#: Placement of a register loop's values by the kind the plan gives them.
KIND_PLACES = {"frag": "fragment", "col": "column", "row": "row", "stage": "staged",
               "stage_t": "staged_transposed", "const": "literal", "bcast": "broadcast",
               "rowload": "global"}


class RegisterLoopPlan:
    """Whether an scf.for runs with its tiles in registers (plan() is None)
    or why not, and if so: each body value's kind, the staged loads, the
    loop-invariant A operands and how each is read."""

    def __init__(self, op: ir.Operation, threads: int, stages: int, register_budget: int):
        self.op, self.threads, self.stages, self.budget = op, threads, stages, register_budget
        self.block = op.regions[0].blocks[0]
        self.iv = self.block.arguments[0]
        self.carried = list(self.block.arguments)[1:]
        self.body = [o.operation for o in self.block.operations]

    def plan(self) -> str | None:
        """None when the loop runs with its tiles in registers, else why not."""
        if self.threads % 32:
            return f"{self.threads} threads is not whole warps"
        self.warps = self.threads // 32
        if not self.carried:
            return "nothing is carried"
        shapes = [tile_of(a.type) if is_tile(a.type) else ([], "") for a in self.carried]
        self.bm = shapes[0][0][0] if shapes[0][0] else 0
        for arg, (shape, elt) in zip(self.carried, shapes):
            if len(shape) != 2 or shape[0] != self.bm or elt != "f32" \
                    or (shape[1] != 1 and shape[1] % 8):
                return f"carried {arg.type} is not an f32 [{self.bm}, 1] or [{self.bm}, 8k] tile"
        if self.bm % (16 * self.warps):
            return (f"carried tiles of {self.bm} rows do not split over {self.warps} warps "
                    "of 16-row slices")
        self.mt = self.bm // (16 * self.warps)
        self.loads, self.invariant_a = [], []
        kinds = {a: ("col" if tile_of(a.type)[0][1] == 1 else "frag") for a in self.carried}
        for o in self.body:
            why = self._classify(o, kinds)
            if why:
                return why
        self.kinds = kinds
        return None

    def _shape(self, v):
        return tuple(tile_of(v.type)[0])

    def _outside_tile(self, v) -> bool:
        return not gs.defined_inside(v, self.op) and is_tile(v.type)

    def _classify(self, o, kinds) -> str | None:
        name, bm = o.name, self.bm
        if name == "scf.yield":
            return None
        if name == "ttile.load" and tile_of(o.results[0].type)[0][1:] == [1] and all(
                u.owner.operation.name == "ttile.transpose" for u in o.results[0].uses):
            # A column read as a row (lse, delta along a transposed block's
            # columns): each thread loads its columns from global memory.
            rows = tile_of(o.results[0].type)[0][0]
            if rows % 8 or any(v != self.iv and gs.defined_inside(v, self.op)
                               for v in o.operands[1:]):
                return (f"a {rows}x1 column read as a row is not a multiple of 8 long, or its "
                        "offsets are computed in the loop")
            kinds[o.results[0]] = "rowload"
            return None
        if name == "ttile.load":
            shape, elt = tile_of(o.results[0].type)
            buf = o.operands[0]
            mt = ir.MemRefType(buf.type)
            offsets = list(o.operands)[1:]
            if len(shape) != 2 or elt != "bf16" or str(mt.element_type) != "bf16":
                return f"a loaded tile {o.results[0].type} is not a 2-D bf16 tile of a bf16 buffer"
            if shape[0] % 16 or shape[1] % 16 or list(mt.shape)[-1] % 8 \
                    or not multiple_of(offsets[-1], 8):
                return (f"a loaded tile {shape[0]}x{shape[1]} is not 16-aligned for "
                        "cp.async/ldmatrix")
            if any(v != self.iv and gs.defined_inside(v, self.op) for v in offsets):
                return "a load's offsets are computed inside the loop"
            for u in o.results[0].uses:
                user = u.owner.operation
                ok = (user.name == "ttile.dot" and u.operand_number == 1) or (
                    user.name == "ttile.transpose" and all(
                        w.owner.operation.name == "ttile.dot" and w.operand_number == 1
                        for w in user.results[0].uses))
                if not ok:
                    return "a loaded tile is used other than as a dot's B operand"
            kinds[o.results[0]] = "stage"
            self.loads.append(o)
            return None
        if name == "ttile.transpose":
            kind = {"stage": "stage_t", "rowload": "row"}.get(kinds.get(o.operands[0]))
            if kind is None:
                return "a transpose of something other than a loaded tile"
            kinds[o.results[0]] = kind
            return None
        if name == "ttile.dot":
            a, b, acc = list(o.operands)[:3]
            (m, k), a_elt = tile_of(a.type)
            (_, n), b_elt = tile_of(b.type)
            if "warps" not in o.attributes or \
                    list(ir.DenseI64ArrayAttr(o.attributes["warps"])) != [self.warps, 1]:
                return f"a dot's warps are not {self.warps}x1 (whole rows per warp)"
            if a_elt != "bf16" or b_elt != "bf16" or tile_of(o.results[0].type)[1] != "f32":
                return "a dot is not bf16 x bf16 into f32"
            if m != bm or k % 16 or n % 16:
                return f"a dot {m}x{n}x{k} does not tile into m16n8k16 over {bm} rows"
            if kinds.get(b) not in ("stage", "stage_t"):
                return "a dot's B operand is not a loaded tile"
            if self._outside_tile(a):
                if a not in self.invariant_a:
                    self.invariant_a.append(a)
            elif kinds.get(a) != "frag":
                return "a dot's A operand is neither loop-invariant nor a register tile"
            if not (kinds.get(acc) in ("frag", "const") or self._outside_tile(acc)):
                return "a dot's accumulator is not a register tile"
            kinds[o.results[0]] = "frag"
            return None
        if name == "ttile.reduce":
            src = o.operands[0]
            if ir.IntegerAttr(o.attributes["dim"]).value != 1 or kinds.get(src) not in ("frag",) \
                    or tile_of(src.type)[1] != "f32":
                return "a reduction is not along the rows of an f32 register tile"
            kinds[o.results[0]] = "col"
            return None
        if name in ("ttile.fill", "ttile.broadcast", "ttile.iota") or name in TILE_ELEMENTWISE:
            shape = self._shape(o.results[0])
            if len(shape) != 2 or shape[0] != bm or (shape[1] != 1 and shape[1] % 8):
                return (f"'{name}' on a {'x'.join(map(str, shape))} tile (not [{bm}, 1] or "
                        f"[{bm}, 8k])")
            for v in o.operands:
                if not is_tile(v.type):
                    continue
                if kinds.get(v) in ("stage", "stage_t"):
                    return f"'{name}' reads a loaded tile (only dots read those)"
                if shape[1] == 1 and self._shape(v)[1] != 1:
                    return f"'{name}' narrows a [{bm}, n] tile to a column"
            if name == "ttile.fill":
                kinds[o.results[0]] = "const"
            elif name == "ttile.broadcast":
                kinds[o.results[0]] = "bcast"
            else:
                kinds[o.results[0]] = "col" if shape[1] == 1 else "frag"
            return None
        return f"'{name}' in the loop body"

    def read_directly(self) -> set:
        """Ops before the loop that only the loop reads and that it reads
        without a shared-memory tile: `ttile.fill`s (literals inside) and
        loads of bf16 dot A operands (read from global memory straight into
        mma registers)."""
        ops = set()
        for v in gs.loop_reads(self.op):
            owner = v.owner
            if isinstance(owner, ir.Block) or gs.defined_inside(v, self.op) \
                    or not all(gs.within(u.owner.operation, self.op) for u in v.uses):
                continue
            o = owner.operation
            if o.name == "ttile.fill":
                ops.add(o)
            elif o.name == "ttile.load" and v in self.invariant_a \
                    and str(ir.MemRefType(o.operands[0].type).element_type) == "bf16" \
                    and all(u.owner.operation.name == "ttile.dot" and u.operand_number == 0
                            for u in v.uses):
                ops.add(o)
        self.direct = {o.results[0] for o in ops if o.name == "ttile.load"}
        return ops

    def wgmma_reason(self) -> str | None:
        """Why the loop's dots, some of which ask for wgmma, run on mma.sync
        (None: wgmma)."""
        dots = [o for o in self.body if o.name == "ttile.dot"]
        if not all("wgmma" in o.attributes for o in dots):
            return "only some of the loop's dots ask for wgmma (its tiles have one layout)"
        if self.warps % 4 or self.mt != 1:
            return (f"{self.warps} warps of {self.bm // self.warps} rows are not warpgroups of "
                    "16-row warps")
        for load in self.loads:
            rows, cols = tile_of(load.results[0].type)[0]
            if cols % 64 or rows % 8:
                return (f"a staged {rows}x{cols} tile is not whole 128-byte swizzle atoms "
                        "(8 rows by 64 columns)")
        for o in dots:
            n = tile_of(o.operands[1].type)[0][1]
            if n > 256:
                return f"a dot's N = {n} is over wgmma's 256"
        return None

    def tma(self, wgmma: bool, wgmma_why: str | None) -> bool:
        """Whether the wgmma loop's staged tiles come through the tensor
        memory accelerator: all of them are `ttile.load {tma}`, or none."""
        tma = ["tma" in load.attributes for load in self.loads]
        if not any(tma):
            return False
        if not all(tma):
            raise PassError("a register loop's staged tiles are loaded with tma all or none "
                            "(they share one ring)", self.op.location)
        if not wgmma:
            raise PassError("ttile.load {tma} in a loop whose dots are not wgmma: "
                            f"{wgmma_why or 'none asks for it'}", self.op.location)
        return True

    def pingpong(self, wgmma: bool, wgmma_why: str | None) -> bool:
        """Whether the wgmma loop's two warpgroups take turns at the tensor
        cores (`ttile.pingpong` on the loop: FlashAttention-3's ping-pong,
        one warpgroup's softmax under the other's GEMMs)."""
        if "ttile.pingpong" not in self.op.attributes:
            return False
        if not wgmma or self.warps != 8:
            raise PassError("ttile.pingpong on a loop that is not wgmma over two warpgroups: "
                            + (wgmma_why or f"{self.warps} warps"), self.op.location)
        return True

    def issue_ahead(self, wgmma: bool, tma: bool, pingpong: bool) -> bool:
        """Whether the wgmma loop issues its first dot one iteration ahead
        (`ttile.issue_ahead`: FlashAttention-3's overlap of the softmax with
        the next Q K^T inside a warpgroup). That dot must be the body's
        first, on a loop-invariant A, a staged B and a zero accumulator, in
        a TMA ring of 3+ stages (the next iteration's tile has been in
        flight for an iteration when this one starts)."""
        if "ttile.issue_ahead" not in self.op.attributes:
            return False
        dots = [o for o in self.body if o.name == "ttile.dot"]
        why = None
        if not (wgmma and tma):
            why = "its dots are not wgmma on a TMA ring"
        elif self.stages < 3:
            why = f"{self.stages} stages (the next iteration's tile must be in flight: 3+)"
        elif pingpong:
            why = "it also has ttile.pingpong (not combined yet)"
        else:
            a, _, acc = list(dots[0].operands)[:3]
            zero = not isinstance(acc.owner, ir.Block) and acc.owner.operation.name == "ttile.fill" \
                and ir.FloatAttr(acc.owner.operation.attributes["value"]).value == 0.0
            if a not in self.invariant_a or not zero:
                why = "its first dot's A is not loop-invariant or its accumulator is not zero"
        if why:
            raise PassError(f"ttile.issue_ahead on a loop where {why}", self.op.location)
        return True

    def shared_a_operands(self, wgmma: bool) -> list[ir.Value]:
        """The invariant A operands the `wgmma` (or mma.sync) branch keeps in
        shared memory. Only 16-byte-aligned bf16 loads read directly from
        global memory qualify (copied by cp.async; for wgmma, whole
        64-column swizzle panels). wgmma reads A from shared memory as
        cheaply as from registers, so there every one that qualifies goes;
        mma.sync reads it with ldmatrix per k step, so there the largest go
        first, only while the carried tiles and the A operands held in
        registers exceed the register budget (TargetOptions.register_budget:
        sm_90 allows 255 per thread; the loop's temporaries need the rest)."""
        carried = sum(self.mt * (tile_of(a.type)[0][1] // 8) * 4 if tile_of(a.type)[0][1] > 1
                      else self.mt * 2 for a in self.carried)
        regs = {a: self.mt * tile_of(a.type)[0][1] // 16 * 4 for a in self.invariant_a}
        total = carried + sum(regs.values())
        shared = []
        for a in sorted(self.invariant_a, key=lambda a: -regs[a]):
            if total <= self.budget and not wgmma:
                break
            load = a.owner.operation if not isinstance(a.owner, ir.Block) else None
            if a not in self.direct or list(ir.MemRefType(load.operands[0].type).shape)[-1] % 8 \
                    or not multiple_of(list(load.operands)[-1], 8) \
                    or (wgmma and tile_of(a.type)[0][1] % 64):     # whole swizzle panels
                continue
            shared.append(a)
            total -= regs[a]
        return shared


def _tile_mma_reason(op) -> str | None:
    """Why dot `op` (outside a pipelined loop) cannot run on tensor cores
    from its shared-memory operands, or None."""
    (m, k), elt = tile_of(op.operands[0].type)
    (_, n), b_elt = tile_of(op.operands[1].type)
    acc_elt = tile_of(op.results[0].type)[1]
    if elt != "bf16" or b_elt != "bf16" or acc_elt != "f32":
        return f"{elt} x {b_elt} operands into {acc_elt} (this path: bf16 into f32)"
    if "warps" not in op.attributes:
        return "the dot has no 'warps'"
    wm, wn = list(ir.DenseI64ArrayAttr(op.attributes["warps"]))
    if (m // wm) % 16 or (n // wn) % 8 or k % 16:
        return f"warp tile {m // wm}x{n // wn} or K {k} does not divide into m16n8k16"
    return None


class KernelPipeliner:
    """Walks one kernel's ops in program order (the order the CUDA printer
    emits them), scheduling its loops and dots."""

    def __init__(self, kernel: ir.Operation, options: TargetOptions):
        self.kernel, self.options = kernel, options
        self.threads = math.prod(ir.DenseI64ArrayAttr(kernel.attributes["block"]))
        self.producer = "producer_warpgroup" in kernel.attributes
        self.stages = (ir.IntegerAttr(kernel.attributes["stages"]).value
                       if "stages" in kernel.attributes else 2)
        self.pending = None           # why the last loop could not be a GEMM main loop
        self.fragments = False        # register tiles exist (fragments of earlier loops, dots)

    def run(self) -> None:
        for op in self.kernel.regions[0].blocks[0].operations:
            self.visit(op.operation)
        if self.producer:
            name = ir.StringAttr(self.kernel.attributes["sym_name"]).value
            raise PassError(f"kernel @{name} has a producer_warpgroup but no wgmma GEMM main "
                            "loop with tma loads for it to feed", self.kernel.location)

    def visit(self, op: ir.Operation) -> None:
        if op.name == "ttile.load" and "tma" in op.attributes:
            raise PassError("a ttile.load {tma} is emitted only as an operand of a wgmma GEMM "
                            "loop (acc = dot(load, load, acc) with both loads tma)", op.location)
        if op.name == "scf.for":
            if self.gemm_loop(op) or self.register_loop(op):
                return
        elif op.name == "ttile.dot":
            self.dot(op)
        for inner in child_ops(op):
            self.visit(inner)

    def gemm_loop(self, op: ir.Operation) -> bool:
        try:
            loop, why = gs.match_gemm_loop(op)
        except gs.ScheduleError as err:
            raise PassError(str(err), err.location) from None
        if self.producer:
            why = why or self._producer_reason(op, loop)
            if why:
                raise PassError("the kernel's producer warpgroup has no GEMM main loop to "
                                f"feed: {why}", op.location)
        if loop is None:
            self.pending = why
            return False
        self.pending = None
        wgmma = loop.wgmma
        lag = 1 if wgmma and self.stages >= 3 else 0
        pipeline = gs.Pipeline("gemm", "wgmma" if wgmma else "mma_sync",
                               "tma" if loop.tma else "cp_async", self.stages, lag,
                               producer=self.producer)
        op.attributes[gs.PIPELINE] = pipeline.attr()
        gs.set_places(loop.load_a, ["staged"])
        gs.set_places(loop.load_b, ["staged"])
        gs.set_places(loop.dot, ["fragment"])
        gs.set_places(loop.init, ["literal"])      # folded into the accumulator's setup
        gs.set_places(op, ["fragment"])
        if self.producer:           # from here on only the computing warps run
            self.producer, self.threads = False, self.threads - 128
        self.fragments = True
        return True

    def _producer_reason(self, op, loop) -> str | None:
        """Why loop `op` cannot be fed by the kernel's producer warpgroup."""
        if loop is None:
            return None
        if not (loop.wgmma and loop.tma):
            return "the loop's dot is not wgmma on tma loads"
        if op.parent.name != "ttile.kernel":
            return "the loop is nested in another op (the producer leaves the kernel after it)"
        if self.fragments:
            return "register tiles from before the loop would need the producer's threads"
        return None

    def register_loop(self, op: ir.Operation) -> bool:
        plan = RegisterLoopPlan(op, self.threads, self.stages, self.options.register_budget)
        if not plan.carried:        # a loop over peers or chunks, not over tiles
            return False
        why = plan.plan()
        if why is not None:
            op.attributes[gs.FALLBACK] = ir.StringAttr.get(why)
            return False
        direct = plan.read_directly()
        asks = any("wgmma" in o.attributes for o in plan.body if o.name == "ttile.dot")
        wgmma_why = plan.wgmma_reason() if asks else None
        wgmma = asks and wgmma_why is None
        tma = plan.tma(wgmma, wgmma_why)
        pingpong = plan.pingpong(wgmma, wgmma_why)
        ahead = plan.issue_ahead(wgmma, tma, pingpong)
        if wgmma_why:       # (on a pipelined loop: why its dots are not on wgmma)
            op.attributes[gs.FALLBACK] = ir.StringAttr.get(wgmma_why)
        op.attributes[gs.PIPELINE] = gs.Pipeline(
            "registers", "wgmma" if wgmma else "mma_sync", "tma" if tma else "cp_async",
            self.stages, 0, pingpong=pingpong, issue_ahead=ahead).attr()
        for o in plan.body:
            if o.name != "scf.yield":
                gs.set_places(o, [KIND_PLACES[plan.kinds[r]] for r in o.results])
        for o in direct:
            gs.set_places(o, ["literal" if o.name == "ttile.fill" else "global"])
        branches = [("mma_sync", False)] + ([("wgmma", True)] if wgmma else [])
        shared = {name: plan.shared_a_operands(w) for name, w in branches}
        for a in plan.invariant_a:
            into = [name for name, _ in branches if a in shared[name]]
            if into:
                a.owner.operation.attributes[gs.SHARED_IN] = ir.ArrayAttr.get(
                    [ttile.MmaAttr.get(b) for b in sorted(into)])
        # After the loop: fragments stay in registers, columns that something
        # reads go to shared memory.
        gs.set_places(op, ["fragment" if plan.kinds[a] == "frag" else
                           "shared" if list(r.uses) else "column"
                           for a, r in zip(plan.carried, op.results)])
        self.pending = None
        self.fragments = True
        return True

    def dot(self, op: ir.Operation) -> None:
        why = _tile_mma_reason(op)
        if why is None:
            self.pending = None
            gs.set_places(op, ["fragment"])
            self.fragments = True
            return
        if self.pending:
            why = f"{self.pending}; {why}"
        self.pending = None
        op.attributes[gs.FALLBACK] = ir.StringAttr.get(why)
        gs.set_places(op, ["shared"])


def schedule(module_op: ir.Operation, options: TargetOptions) -> None:
    for kernel in kernels_of(module_op):
        gs.clear(kernel)
        KernelPipeliner(kernel, options).run()


def run(op, pass_, options: TargetOptions):
    run_reporting(op, pass_, lambda: schedule(op, options))
