"""tessera-cpu-fuse: which ops of a CPU kernel share one element loop.

The second CPU scheduling pass (after tessera-cpu-in-place, whose in-place
loads it reads). In each block of each `ttile.kernel`, from each op on, the
longest run of consecutive elementwise ops, fills, iotas, dropout factors
and broadcasts whose results are tiles of one size, with the in-place loads
among them, is one loop (`ttile.fused = N` on each, N numbering the
kernel's loops) when it has two ops or more besides its loads. GCC does not fuse loops: a GELU
backward was 25 loops over 16 KB tiles; fused, its values stay in
registers and a tile that only its loop reads needs no array. Per element
the same operations run in the same order: the same bits. Iotas and
dropout factors are functions of the element's index: in a loop they are
computed where they are read (a causal attention block's two position
tiles were 32 KiB of int32 written and read back per block).

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


#: Ops whose element is a function of its index (and the op's scalars).
INDEXED = ("ttile.fill", "ttile.iota", "ttile.dropout_factor")


class Member:
    """What a run needs to know of one op of a block: `kind` (load: an
    in-place load; broadcast; compute: an elementwise or INDEXED op; None:
    any other op, which ends a run), its tile's elements, a broadcast's
    last dimension, whether a loop can index its source, and the key of the
    op making that source."""

    def __init__(self, op: ir.Operation):
        self.op, self.kind = op, None
        name = op.name
        if name == "ttile.load" and cs.in_place(op):
            self.kind = "load"
        elif name == "ttile.broadcast" or name in INDEXED or name in TILE_ELEMENTWISE:
            self.kind = "broadcast" if name == "ttile.broadcast" else "compute"
            shape = cs.tile_shape(op.results[0].type)
            self.size = math.prod(shape)
            if self.kind == "broadcast":
                self.width = shape[-1]
                self.indexable = cs.broadcast_index(op, "r", "j", "e") is not None
                made = op.operands[0].owner
                self.made = None if isinstance(made, ir.Block) else operation_key(made)
            self.key = operation_key(op)


def run_from(members: list[Member], start: int) -> list[Member]:
    """The ops from `start` on that can share one element loop (see the
    module docstring)."""
    run, computed, size, width = [], set(), None, None
    for m in members[start:]:
        if m.kind == "load":
            run.append(m)
            continue
        if m.kind == "broadcast":
            if not m.indexable or width not in (None, m.width) or m.made in computed:
                break
            width = m.width
        elif m.kind != "compute":
            break
        if size is not None and m.size != size:
            break
        size = m.size
        run.append(m)
        computed.add(m.key)
    return run


class KernelFuser:
    def __init__(self):
        self.loops = 0

    def block(self, ops: list[ir.Operation]) -> None:
        for op in ops:                      # the loops decided before
            if cs.FUSED in op.attributes:
                del op.attributes[cs.FUSED]
        members = [Member(op) for op in ops]
        i = 0
        while i < len(members):
            run = run_from(members, i)
            if sum(m.kind != "load" for m in run) < 2:
                for region in ops[i].regions:
                    for block in region.blocks:
                        self.block([o.operation for o in block.operations])
                i += 1
                continue
            for m in run:
                m.op.attributes[cs.FUSED] = i64(self.loops)
            self.loops += 1
            i += len(run)


def fuse(module_op: ir.Operation) -> None:
    for kernel in kernels_of(module_op):
        if gs.planned(kernel):
            raise PassError("kernel is scheduled for the GPU (ttile.smem_bytes); the CPU "
                            "schedule is for kernels printed as C++", kernel.location)
        KernelFuser().block([o.operation for o in kernel.regions[0].blocks[0].operations])


def run(op, pass_, options: TargetOptions):
    run_reporting(op, pass_, lambda: fuse(op))
