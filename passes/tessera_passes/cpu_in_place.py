"""tessera-cpu-in-place: which tiles of a CPU kernel are blocks of its
buffers, and which dots add into their accumulator's array.

The first of the two CPU scheduling passes (then tessera-cpu-fuse). For each
`ttile.kernel`, afresh (it removes the CPU schedule first):

* **Loads read in place** (`ttile.in_place` on the load): the tile is a
  pointer into its buffer, not a copy, when it is one contiguous block of a
  buffer the kernel never stores to (a view would see a later store), not
  bf16 / FP8 (converted per element) and not itself stored (that copy is
  done in the destination, below). A GELU's loads were a third of its loops.
* **Accumulating dots** (`ttile.accumulate` on the dot): the dot adds into
  its accumulator's array when it is the accumulator's only use, in the
  block defining it (a dot in a loop under the definition runs more than
  once), the accumulator is a tile of its own (not a load read in place) and
  of the result's type. A flash-attention step's 32 KiB output block was
  copied first.
* **Tiles computed in place** (`ttile.in_place` on the store): a tile is
  computed in the block its one store writes when that store is in the same
  block as its definition, its offsets are computed before the tile, and
  the block is one contiguous block of a buffer the kernel stores to only
  there and never loads (not bf16 / FP8). The value then reaches memory when
  it is computed rather than at the store: nothing reads that buffer in
  between, no other store writes it, and its other uses read it there (a
  bias add kept for the backward and fed to a GELU: one pass writing both
  outputs, where the kept copy was written by a second pass over the tile).
  Loop results (carried arrays) and accumulating dots' results (their
  accumulator's array) are never computed in place.
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.ir import cpu_schedule as cs
from tessera_compiler.ir import gpu_schedule as gs
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.support import (PassError, kernels_of, nested_ops, operation_key,
                                         run_reporting)
from tessera_compiler.ir.types import STORED_AS_BITS


def _defining_op(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def _block_of(value: ir.Value) -> ir.Block:
    owner = value.owner
    return owner if isinstance(owner, ir.Block) else owner.operation.block


def _precedes(value: ir.Value, op: ir.Operation) -> bool:
    """Whether `value` is computed before `op` runs: an argument or a value
    of an enclosing block, or a value defined earlier in `op`'s block."""
    defining = _defining_op(value)
    if defining is None or defining.block != op.block:
        return True
    for o in op.block.operations:
        if o.operation == defining:
            return True
        if o.operation == op:
            return False
    return False


class KernelInPlace:
    def __init__(self, kernel: ir.Operation):
        ops = nested_ops(kernel)
        # The loads, dots and stores in program order; buffers (kernel
        # arguments) by how many stores write them, and those some load
        # reads. The schedule decided before is removed (the verifier
        # allows its attributes on these ops only).
        self.loads, self.dots, self.stored_by = [], [], []
        self.stores: dict = {}
        self.loaded = set()
        self.blocks: dict = {}
        for o in ops:
            name = o.name
            if name == "ttile.store":
                self.stored_by.append(o)
                self.stores[o.operands[1]] = self.stores.get(o.operands[1], 0) + 1
            elif name == "ttile.load":
                self.loads.append(o)
                self.loaded.add(o.operands[0])
            elif name == "ttile.dot":
                self.dots.append(o)
            else:
                continue
            for attr in (cs.IN_PLACE, cs.ACCUMULATE):
                if attr in o.attributes:
                    del o.attributes[attr]

    def run(self) -> None:
        for o in self.loads:
            if self.reads_in_place(o):
                o.attributes[cs.IN_PLACE] = ir.UnitAttr.get()
        accumulating = set()
        for o in self.dots:
            if self.accumulates(o):
                o.attributes[cs.ACCUMULATE] = ir.UnitAttr.get()
                accumulating.add(operation_key(o))
        for o in self.stored_by:
            if self.computes_in_place(o, accumulating):
                o.attributes[cs.IN_PLACE] = ir.UnitAttr.get()

    def block_of(self, access: ir.Operation, tile: ir.Value, buf: ir.Value) -> bool:
        """cpu_schedule.block_of, the buffer's facts read once per kernel."""
        if buf not in self.blocks:
            mt = ir.MemRefType(buf.type)
            self.blocks[buf] = (list(mt.shape), str(mt.element_type))
        shape, element = self.blocks[buf]
        if not shape or element in STORED_AS_BITS:
            return False
        return cs.contiguous(cs.placed_shape(access, cs.tile_shape(tile.type), len(shape)), shape)

    def reads_in_place(self, load: ir.Operation) -> bool:
        buf = load.operands[0]
        if buf in self.stores or \
                any(u.owner.operation.name == "ttile.store" for u in load.results[0].uses):
            return False
        return self.block_of(load, load.results[0], buf)

    def accumulates(self, dot: ir.Operation) -> bool:
        acc = dot.operands[2]
        defining = _defining_op(acc)
        if _block_of(acc) != dot.block or len(list(acc.uses)) != 1:
            return False
        if defining is not None and defining.name == "ttile.load" and cs.in_place(defining):
            return False                    # a pointer into a buffer the kernel reads
        return acc.type == dot.results[0].type

    def computes_in_place(self, store: ir.Operation, accumulating: set) -> bool:
        """Whether the tile `store` stores can be computed in its block."""
        buf = store.operands[1]
        if self.stores.get(buf) != 1 or buf in self.loaded:
            return False
        value = store.operands[0]
        producer = _defining_op(value)
        if producer is None or producer.block != store.block or \
                producer.name in ("scf.for", "scf.if") or operation_key(producer) in accumulating:
            return False            # a loop's results and accumulating dots' are other arrays
        if sum(u.owner.operation.name == "ttile.store" for u in value.uses) != 1 or \
                not all(_precedes(v, producer) for v in list(store.operands)[2:]):
            return False
        return self.block_of(store, value, buf)


def schedule(module_op: ir.Operation) -> None:
    for kernel in kernels_of(module_op):
        if gs.planned(kernel):
            raise PassError("kernel is scheduled for the GPU (ttile.smem_bytes); the CPU "
                            "schedule is for kernels printed as C++", kernel.location)
        KernelInPlace(kernel).run()


def run(op, pass_, options: TargetOptions):
    run_reporting(op, pass_, lambda: schedule(op))
