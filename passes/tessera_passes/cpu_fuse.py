"""tessera-cpu-fuse: which ops of a CPU kernel share one element loop.

The second CPU scheduling pass (after tessera-cpu-in-place, whose in-place
loads it reads). In each block of each `ttile.kernel`, from each op on, the
longest run of consecutive elementwise ops, fills and broadcasts whose
results are tiles of one size, with the in-place loads among them, is one
loop (`ttile.fused = N` on each, N numbering the kernel's loops) when it
has two ops or more besides its loads. GCC does not fuse loops: a GELU
backward was 25 loops over 16 KB tiles; fused, its values stay in
registers and a tile that only its loop reads needs no array. Per element
the same operations run in the same order: the same bits.

A broadcast joins a run when the loop can index its source directly
(`cpu_schedule.broadcast_index`: one column, one row, trailing dimensions,
the result's shape or one value), all of a run's broadcasts have one last
dimension (the loop runs over its rows), and its source is not a value the
run computes (those are scalars in the loop, not arrays to index). An op
leaves the plain form (a loop of its own) otherwise.
"""

from __future__ import annotations

import math

from tessera_mlir import ir

from tessera_compiler.ir import cpu_schedule as cs
from tessera_compiler.ir import gpu_schedule as gs
from tessera_compiler.ir.ops import TILE_ELEMENTWISE
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.support import PassError, i64, kernels_of, operation_key, run_reporting
from tessera_compiler.ir.types import tile_of


def run_from(ops: list[ir.Operation], start: int) -> list[ir.Operation]:
    """The ops from `start` on that can share one element loop (see the
    module docstring)."""
    run, size, width = [], None, None
    for op in ops[start:]:
        if op.name == "ttile.load" and cs.in_place(op):
            run.append(op)
            continue
        if op.name == "ttile.broadcast":
            shape = tile_of(op.results[0].type)[0]
            made = op.operands[0].owner
            made = None if isinstance(made, ir.Block) else operation_key(made)
            if cs.broadcast_index(op, "r", "j", "e") is None or \
                    width not in (None, shape[-1]) or \
                    any(m.name != "ttile.load" and operation_key(m) == made for m in run):
                break
            width = shape[-1]
        elif op.name not in TILE_ELEMENTWISE and op.name != "ttile.fill":
            break
        n = math.prod(tile_of(op.results[0].type)[0])
        if size is not None and n != size:
            break
        size = n
        run.append(op)
    return run


class KernelFuser:
    def __init__(self):
        self.loops = 0

    def block(self, ops: list[ir.Operation]) -> None:
        i = 0
        while i < len(ops):
            run = run_from(ops, i)
            if sum(op.name != "ttile.load" for op in run) < 2:
                for region in ops[i].regions:
                    for block in region.blocks:
                        self.block([o.operation for o in block.operations])
                i += 1
                continue
            for op in run:
                op.attributes[cs.FUSED] = i64(self.loops)
            self.loops += 1
            i += len(run)


def fuse(module_op: ir.Operation) -> None:
    for kernel in kernels_of(module_op):
        if gs.planned(kernel):
            raise PassError("kernel is scheduled for the GPU (ttile.smem_bytes); the CPU "
                            "schedule is for kernels printed as C++", kernel.location)
        cs.clear(kernel, (cs.FUSED,))
        KernelFuser().block([o.operation for o in kernel.regions[0].blocks[0].operations])


def run(op, pass_, options: TargetOptions):
    run_reporting(op, pass_, lambda: fuse(op))
