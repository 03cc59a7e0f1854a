"""tessera-fuse-gemm-epilogues: a CPU GEMM runs the kernel after it on each
block of rows it writes.

Runs last on CPU Tile IR, where matmuls are library calls (BLAS on the
engine's OpenMP team, cut into blocks of rows) and the elementwise work
after them (bias + GELU, residual + layernorm) is a generated kernel over
the GEMM's output. When that kernel is the output's first reader and its
grid walks whole rows in order, the two become one launch of a matmul
declaration with `epilogue = @kernel`: each team member runs the kernel's
programs over the rows its sgemm call just wrote, while they are in cache,
instead of a second team launch reading them back (`tessera_gemm_f32_then`
in the kernel library). The sgemm calls are the same, and so are the bits.

The fused launch takes the kernel's place, after everything it reads is
written: its operands are the matmul's, the kernel's other inputs, then the
kernel's outputs and last the GEMM's output (a kernel reading it through a
reshape, a view at run time, reads it directly). Library attributes:
`epilogue` (the kernel), `epilogue_args` (the fused operand each kernel
argument is) and `epilogue_rows` (the rows one of its programs covers).

Left alone: GEMMs the engine cuts by columns (N > M, or N = M with B
transposed: cutting rows there would change the bits), batched or
non-float32 GEMMs, kernels whose tiles are not whole rows in program order
or that loop (attention), an output read by anything else before the
kernel, and GEMM inputs written between the GEMM and the kernel.

Measured (`bench/gemm_epilogue_cpu.py`, 2 cores): neutral. The fused pair
takes 0.98-1.03 of the two launches' time at the example GPT's shapes, its
training step 0.98-1.00: the team's static split already gave each thread,
in the kernel's own launch, the rows it had written, so fusing saves a
launch, not a trip to memory. Sub-blocks of 128-256 rows (to keep the
epilogue in L2) lose 2-11% to sgemm re-packing B for each.
"""

from __future__ import annotations

import math

from tessera_mlir import ir
from tessera_mlir.dialects import tsched

from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.pipeline import action_rank, copy_action
from tessera_compiler.ir.support import (callee, functions, launchables, launched,
                                         library_attrs, library_routine, operation_key, ops_of,
                                         run_reporting)
from tessera_compiler.ir.types import shape_of, tile_of


def _is_f32_2d(v: ir.Value) -> bool:
    t = ir.MemRefType(v.type)
    return t.rank == 2 and str(t.element_type) == "f32"


def _cut_by_rows(decl: ir.Operation, m: int, n: int) -> bool:
    """Whether the engine's GEMM cuts this one into blocks of rows (as
    tessera_gemm_f32 decides: M > N, or M = N with B not transposed)."""
    return m > n or (m == n and "transpose_rhs" not in library_attrs(decl))


def _rows_per_program(kernel: ir.Operation, arg: int, m: int) -> int | None:
    """The rows of the [M, N] GEMM output one program of `kernel` covers when
    its argument `arg` (that output, or a reshape of it splitting M) is read
    only as the program's own tile and the programs walk whole rows in
    order: program p then covers rows [p R, (p + 1) R). None otherwise."""
    if "row_segments" in kernel.attributes or "ttile.tile_sizes" not in kernel.attributes:
        return None
    grid = list(ir.DenseI64ArrayAttr(kernel.attributes["grid"]))
    tile = list(ir.DenseI64ArrayAttr(kernel.attributes["ttile.tile_sizes"]))
    entry = kernel.regions[0].blocks[0]
    shape = shape_of(entry.arguments[arg])
    if len(grid) != 1 or len(tile) != len(shape) or tile[-1] != shape[-1]:
        return None
    # Whole rows in order: 1s, then at most one partial dimension, then full ones.
    inner = next((d for d, t in enumerate(tile) if t != 1), len(tile) - 1)
    if any(tile[d] != shape[d] for d in range(inner + 1, len(tile))):
        return None
    rows = math.prod(tile[:-1])
    if grid[0] * rows != m or math.prod(shape[:-1]) != m:
        return None
    buffer = entry.arguments[arg]
    for op in (o.operation for o in entry.operations):
        if len(op.regions) or op.name == "ttile.dot":     # loops: attention, GEMMs
            return None
        if buffer in list(op.operands):
            if op.name != "ttile.load" or "dims" in op.attributes or \
                    tile_of(op.results[0].type)[0] != tile:
                return None
    return rows


def _writes(op: ir.Operation, buffer: ir.Value) -> bool:
    if op.name == "tsched.launch":
        return buffer in list(op.opview.outs)
    if op.name == "tsched.collective_start":
        return op.opview.dst == buffer
    return False


class _Fusion:
    """One GEMM launch and the kernel launch that becomes its epilogue."""

    def __init__(self, gemm: ir.Operation, decl: ir.Operation):
        self.gemm, self.decl = gemm, decl
        ins, outs = list(gemm.opview.ins), list(gemm.opview.outs)
        self.a, self.b = ins
        (self.c,) = outs
        self.m, self.n = shape_of(self.c)

    def find(self, symbols: dict, position) -> bool:
        """Finds the epilogue: the first reader of the output (or of one
        reshape of it; `position`: an op's place in the function), with
        everything between them movable."""
        views, readers, frees = {}, [], []
        for use in self.c.uses:
            user = use.owner.operation
            if operation_key(user) == operation_key(self.gemm):
                continue
            if user.name == "tsched.free":
                frees.append(user)
                continue
            called = callee(user, symbols) if user.name == "tsched.launch" else None
            if library_routine(called) == "reshape" and \
                    list(user.opview.ins) == [self.c]:
                (view,) = list(user.opview.outs)
                views[operation_key(user)] = (user, view)
                continue
            readers.append((user, self.c))
        for _, view in views.values():
            for use in view.uses:
                user = use.owner.operation
                if user.name == "tsched.free":
                    frees.append(user)
                elif user.name == "tsched.launch" and view in list(user.opview.outs):
                    continue                                  # the reshape itself
                else:
                    readers.append((user, view))
        if not readers or any(position(r) < 0 for r, _ in readers):
            return False
        self.epilogue, self.read = min(readers, key=lambda r: position(r[0]))
        e = self.epilogue
        start, end = position(self.gemm), position(e)
        if e.name != "tsched.launch" or e.opview.stream != self.gemm.opview.stream or \
                action_rank(e) != action_rank(self.gemm):
            return False
        kernel = callee(e, symbols)
        ins, outs = list(e.opview.ins), list(e.opview.outs)
        # It writes neither the output (nor a view of it) nor the GEMM's
        # inputs (every block reads all of B while others run the epilogue).
        untouchable = [self.a, self.b, self.c] + [v for _, v in views.values()]
        if kernel is None or kernel.name != "ttile.kernel" or \
                any(v in untouchable for v in outs) or sum(v == self.read for v in ins) != 1:
            return False
        self.rows = _rows_per_program(kernel, ins.index(self.read), self.m)
        if self.rows is None:
            return False
        # Between the GEMM and its epilogue the GEMM's inputs stay as they are.
        # Their frees there, and those of the output and its views, move
        # after the fused launch.
        between = [u.owner.operation for v in (self.a, self.b) for u in v.uses
                   if start < position(u.owner.operation) < end]
        if any(_writes(op, v) for op in between for v in (self.a, self.b)):
            return False
        self.kernel, self.views = kernel, views
        moved = {operation_key(op): op for op in between + frees
                 if op.name == "tsched.free" and start < position(op) < end}
        self.moved_frees = sorted(moved.values(), key=position)
        return True

    def rewrite(self, declarations: dict, positions: dict) -> None:
        """Replaces the two launches by the fused one, at the epilogue's
        place (`positions` gets its and the moved ops' places)."""
        e = self.epilogue
        place = positions[operation_key(e)]
        ins, outs = list(e.opview.ins), list(e.opview.outs)
        extra = [v for v in ins if v != self.read]
        fused_ins = [self.a, self.b] + extra
        fused_outs = outs + [self.c]
        operands = fused_ins + fused_outs
        # Kernel argument i is fused operand epilogue_args[i].
        mapping = [len(operands) - 1 if v == self.read else operands.index(v)
                   for v in ins] + [len(fused_ins) + i for i in range(len(outs))]
        kernel = ir.StringAttr(self.kernel.attributes["sym_name"]).value
        name = ir.StringAttr(self.decl.attributes["sym_name"]).value + "_then_" + kernel
        suffix, unique = 1, name
        while unique in declarations and not self._same(declarations[unique], operands,
                                                          kernel, mapping):
            suffix += 1
            unique = f"{name}_{suffix}"
        if unique not in declarations:
            declarations[unique] = self._declaration(unique, operands, kernel, mapping)
        with ir.InsertionPoint(e), e.location:
            fused = tsched.LaunchOp(ir.FlatSymbolRefAttr.get(unique), e.opview.stream,
                                    fused_ins, fused_outs)
        copy_action(e, fused)
        after = fused.operation
        positions[operation_key(after)] = place
        # Reshapes of the output someone still reads follow the fused launch
        # (those before it; their views' allocs are earlier still); the rest
        # go with their buffer.
        for launch, view in self.views.values():
            others = [u.owner.operation for u in view.uses
                      if u.owner.operation.name != "tsched.free"
                      and operation_key(u.owner.operation) not in
                      (operation_key(launch), operation_key(e))]
            if others and positions.get(operation_key(launch), -1) < place:
                launch.move_after(after)
                after = launch
                place += 1e-3
                positions[operation_key(launch)] = place
        for free in self.moved_frees:
            free.move_after(after)
            after = free
            place += 1e-3
            positions[operation_key(free)] = place
        e.erase()
        self.gemm.erase()
        for launch, view in self.views.values():
            if all(u.owner.operation.name == "tsched.free" or
                   operation_key(u.owner.operation) == operation_key(launch) for u in view.uses):
                for u in list(view.uses):
                    if u.owner.operation.name == "tsched.free":
                        u.owner.operation.erase()
                launch.erase()
                if not isinstance(view.owner, ir.Block) and view.owner.name == "tsched.alloc":
                    view.owner.erase()

    def _attributes(self, kernel: str, mapping: list) -> ir.DictAttr:
        entries = library_attrs(self.decl)
        entries["epilogue"] = ir.FlatSymbolRefAttr.get(kernel)
        entries["epilogue_args"] = ir.DenseI64ArrayAttr.get(mapping)
        entries["epilogue_rows"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), self.rows)
        return ir.DictAttr.get(entries)

    def _same(self, decl: ir.Operation, operands: list, kernel: str, mapping: list) -> bool:
        ftype = ir.FunctionType(ir.TypeAttr(decl.attributes["function_type"]).value)
        return list(ftype.inputs) == [v.type for v in operands] and \
            decl.attributes["tsched.library_attrs"] == self._attributes(kernel, mapping)

    def _declaration(self, name: str, operands: list, kernel: str, mapping: list):
        clone = self.decl.clone(ip=ir.InsertionPoint(self.decl))
        clone.attributes["sym_name"] = ir.StringAttr.get(name)
        clone.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([v.type for v in operands], []))
        clone.attributes["tsched.library_attrs"] = self._attributes(kernel, mapping)
        return clone


def fuse_gemm_epilogues(module: ir.Operation) -> int:
    """Fuses every GEMM and epilogue it can (see the module docs); returns
    how many."""
    symbols = launchables(module)
    declarations = {n: op for n, op in symbols.items() if op.name == "func.func"}
    launched_before = launched(module)
    fused = 0
    for f in functions(module):
        candidates = []
        for launch in ops_of(f):
            if launch.name != "tsched.launch":
                continue
            decl = callee(launch, symbols)
            if library_routine(decl) != "matmul":
                continue
            ins, outs = list(launch.opview.ins), list(launch.opview.outs)
            if len(ins) != 2 or len(outs) != 1 or not all(map(_is_f32_2d, ins + outs)) or \
                    isinstance(outs[0].owner, ir.Block):
                continue
            candidates.append((launch, decl))
        # Op places, by address (operation_key): kept up to date by each
        # rewrite (the fused launch takes its epilogue's; moved frees follow).
        # Not the block's own order queries: a step has thousands of ops.
        positions = {operation_key(op): i for i, op in enumerate(ops_of(f))}
        for launch, decl in candidates:
            fusion = _Fusion(launch, decl)
            if not _cut_by_rows(decl, fusion.m, fusion.n):
                continue
            if fusion.find(symbols, lambda op: positions.get(operation_key(op), -1)):
                fusion.rewrite(declarations, positions)
                fused += 1
    # Matmul declarations nothing launches any more.
    for name in launched_before - launched(module):
        if name in declarations and "epilogue" not in library_attrs(declarations[name]):
            declarations[name].erase()
    return fused


def run(op, pass_, options: TargetOptions):
    if options.resolved_target(op) != "cpu":
        return
    run_reporting(op, pass_, lambda: fuse_gemm_epilogues(op))
