"""tessera-gpu-place: where each tile value of a GPU kernel lives.

The second of the three GPU scheduling passes (after tessera-gpu-software-pipeline,
whose loop schedules and register-loop placements it keeps). Walking each
`ttile.kernel` in program order:

* **Pointwise regions.** Consecutive pointwise ops (elementwise math,
  compare, select, cast, fill, iota, broadcast, load, store) over one
  iteration shape form one region (`ttile.region = N`; its first op's
  `ttile.domain` is that shape): the printer emits
  one loop in which each thread computes whole elements in registers. A
  region ends at an op of another shape or any other ttile/scf op
  (arith ops do not end it). A region reading a tensor-core fragment runs
  over the fragment's registers (same shape, one fragment per region).
* **Placement** (`ttile.place`): a region's value stays in `registers`
  unless an op outside the region reads it: then it is `shared`. Results of
  reductions, CUDA-core dots, transposes and loops whose tiles stay in
  shared memory are `shared`; GEMM main loops and tensor-core dots leave
  `fragment`s (tessera-gpu-software-pipeline set those).
* **Spills** (`ttile.spill` on the op that needs it): a fragment read by
  anything but a region over its own registers (a reduction, a dot, a loop,
  a region of another shape) is copied to a shared tile first.

A GEMM main loop's initial fill, and the fills and A-operand loads a
register loop reads directly, leave any region (the printer folds them into
the loop).
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.ir import gpu_schedule as gs
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.support import PassError, child_ops, kernels_of, nested_ops, run_reporting
from tessera_compiler.ir.types import is_tile, tile_of


def common_shape(shapes) -> list[int] | None:
    """The shape every one of `shapes` broadcasts to (same rank, each
    dimension equal or 1), or None."""
    if not shapes or len({len(s) for s in shapes}) != 1:
        return None
    dom = [max(d) for d in zip(*shapes)]
    if any(a not in (1, b) for s in shapes for a, b in zip(s, dom)):
        return None
    return dom


class Region:
    def __init__(self, number: int, op: ir.Operation, domain: list[int], fragment):
        self.number, self.ops, self.domain, self.fragment = number, [op], domain, fragment


class KernelPlacer:
    def __init__(self, kernel: ir.Operation):
        self.kernel = kernel
        self.region: Region | None = None
        self.regions = 0
        #: unspilled fragments: value -> their tile shape
        self.frags: dict = {}

    def run(self) -> None:
        for op in self.kernel.regions[0].blocks[0].operations:
            self.visit(op.operation)
        self.flush()

    # -- regions ----------------------------------------------------------------
    def flush(self) -> None:
        region, self.region = self.region, None
        if region is None:
            return
        members = set(region.ops)
        # (A value a register loop reads itself keeps its placement: if its
        # region is emitted before the loop takes it out, the region still
        # stores it, and tessera-gpu-alloc-shared gives it a tile.)
        # (The shape the emitter's loop runs over: ops a loop took out of the
        # region since still count, as they did when they joined it.)
        region.ops[0].attributes[gs.DOMAIN] = ir.DenseI64ArrayAttr.get(region.domain)
        for op in region.ops:
            op.attributes[gs.REGION] = gs.i64(region.number)
            if not len(op.results):
                continue
            old = gs.place(op.results[0])
            if old in ("global", "literal"):        # a register loop reads it itself
                continue
            outside = any(u.owner.operation not in members for u in op.results[0].uses)
            gs.set_places(op, ["shared" if outside else "registers"])

    def spill(self, values, at: ir.Operation) -> None:
        """Fragments among `values` go to shared memory before `at`."""
        spilled = False
        for v in values:
            if v in self.frags:
                del self.frags[v]
                spilled = True
        if spilled:
            at.attributes[gs.SPILL] = ir.UnitAttr.get()

    def add_to_region(self, op: ir.Operation) -> None:
        shapes = [tile_of(v.type)[0] for v in list(op.operands) + list(op.results)
                  if is_tile(v.type)]
        frag = next((v for v in op.operands if v in self.frags), None)
        region = self.region
        if region is not None:
            domain = common_shape([region.domain] + shapes)
            if domain is None or (frag is not None and region.fragment is not None
                                  and region.fragment != frag) \
                    or (region.fragment is not None and domain != self.frags[region.fragment]) \
                    or (frag is not None and domain != self.frags[frag]):
                self.flush()
                region = None
            else:
                region.domain = domain
                region.fragment = region.fragment or frag
        if region is None:
            domain = common_shape(shapes)
            if domain is None:
                raise PassError(f"'{op.name}' mixes tile shapes {shapes}", op.location)
            if frag is not None and domain != self.frags[frag]:
                self.spill(list(op.operands), op)
                frag = None
            self.region = Region(self.regions, op, domain, frag)
            self.regions += 1
            return
        region.ops.append(op)

    def drop_from_region(self, ops) -> None:
        """Ops a loop reads itself leave the pending region."""
        if self.region is not None:
            self.region.ops = [o for o in self.region.ops if o not in ops]
            if not self.region.ops:
                self.region = None

    # -- ops --------------------------------------------------------------------
    def visit(self, op: ir.Operation) -> None:
        name = op.name
        if name in gs.POINTWISE:
            self.add_to_region(op)
            return
        if name == "scf.for":
            pipeline = gs.pipeline(op)
            if pipeline is not None and pipeline.kind == "gemm":
                init = op.operands[3].owner.operation
                self.drop_from_region({init})
                self.flush()
                self.frags[op.results[0]] = tile_of(op.results[0].type)[0]
                return
            if pipeline is not None:            # tiles in registers
                self.drop_from_region(self._read_directly(op))
                self.flush()
                self.spill(gs.loop_reads(op), op)
                for r in op.results:
                    if gs.place(r) == "fragment":
                        self.frags[r] = tile_of(r.type)[0]
                return
        if name.startswith("ttile.") or name.startswith("scf."):
            self.flush()
            self.spill(list(op.operands), op)
            self.handle(op)

    def _read_directly(self, loop: ir.Operation) -> set:
        """The ops before `loop` tessera-gpu-software-pipeline gave to it (fills and
        A operands it reads itself)."""
        ops = set()
        for v in gs.loop_reads(loop):
            if not isinstance(v.owner, ir.Block) and not gs.defined_inside(v, loop) \
                    and gs.place(v) in ("global", "literal"):
                ops.add(v.owner.operation)
        return ops

    def handle(self, op: ir.Operation) -> None:
        name = op.name
        if name == "ttile.dot":
            if gs.place(op.results[0]) == "fragment":      # on tensor cores
                self.frags[op.results[0]] = tile_of(op.results[0].type)[0]
            return
        if name in ("ttile.reduce", "ttile.transpose"):
            gs.set_places(op, ["shared"])
            return
        if name == "scf.for":               # its tiles in shared memory
            if len(op.results):
                gs.set_places(op, ["shared" if is_tile(r.type) else "registers"
                                   for r in op.results])
        for inner in child_ops(op):
            self.visit(inner)


def place(module_op: ir.Operation) -> None:
    for kernel in kernels_of(module_op):
        if gs.SMEM_BYTES in kernel.attributes:      # placed already: schedule afresh
            raise PassError("kernel is scheduled already; run tessera-gpu-software-pipeline first "
                            "(it clears the schedule)", kernel.location)
        # (tessera-gpu-software-pipeline marks every dot and every loop carrying values.)
        unscheduled = next((o for o in nested_ops(kernel)
                            if (o.name == "ttile.dot" or o.name == "scf.for" and len(o.results))
                            and not any(a in o.attributes
                                        for a in (gs.PIPELINE, gs.FALLBACK, gs.PLACE))), None)
        if unscheduled is not None:
            raise PassError(f"'{unscheduled.name}' has no schedule: "
                            f"run tessera-gpu-software-pipeline "
                            "before tessera-gpu-place", unscheduled.location)
        KernelPlacer(kernel).run()


def run(op, pass_, options: TargetOptions):
    run_reporting(op, pass_, lambda: place(op))
