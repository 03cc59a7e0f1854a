"""Emits C++ for the CPU engine from Tile IR: `KernelEmitter`, the C++
printer, on the common printer (printer.py) the CUDA printer uses too.

Every `ttile.kernel` becomes an `extern "C"` function taking one `void*` per
buffer argument (inputs, then outputs; shapes are static and compiled in).
The grid becomes nested loops over program ids; tiles are local arrays.

Tile values are SSA; each gets its own array, declared once at the top of the
kernel. `scf.for` loop-carried tiles get arrays that `scf.yield` copies into.
Which tiles are blocks of buffers instead, which dots add into their
accumulator and which ops share one element loop are the CPU schedule
(tessera-cpu-in-place, tessera-cpu-fuse; `ir/cpu_schedule.py`): without it
the printer prints the plain form (copies, a loop per op).
"""

from __future__ import annotations

import math

from tessera_mlir import ir

from ..ir import cpu_schedule as cs
from ..ir.support import kernels_of, operation_key
from ..ir.types import enum_of, tile_of
from .build import CPU_HEADER, CPU_RUNTIME, KERNEL_HEADER, PREAMBLE_END, dump_kernels
from .printer import EmitError, Tile, TilePrinter, ctype

#: The CPU kernels' extra symbols: NAME__range(args, pid0_begin, pid0_end),
#: NAME__grid (pid0's extent) and NAME__slice(void** args, begin, end), the
#: range with its arguments in an array, which the library's one
#: tessera_parallel(slice, args, grid, threads) splits over an OpenMP team
#: (the CPU engine's threaded launches). One parallel region per library,
#: not per kernel: a region in each kernel costs g++ compile time on every one.
RANGE_SUFFIX, GRID_SUFFIX, SLICE_SUFFIX = "__range", "__grid", "__slice"

# Tiles larger than this live on the heap (CPU), not the stack.
_STACK_TILE_LIMIT = 16384


def _zero_fill(value: ir.Value) -> bool:
    """Whether `value` is a ttile.fill of +0.0 (all bits zero: a memset)."""
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.operation.name != "ttile.fill":
        return False
    try:
        x = ir.FloatAttr(owner.operation.attributes["value"]).value
    except ValueError:                      # an integer fill
        return False
    return x == 0.0 and math.copysign(1.0, x) > 0


class KernelEmitter(TilePrinter):
    """The C++ printer: a kernel's grid as loops over program ids (the
    outermost split over the CPU engine's threads), prints the CPU schedule
    (tessera-cpu-in-place, tessera-cpu-fuse) and decides nothing itself."""

    def independent_iterations(self) -> None:
        """Tells GCC the next element loop's iterations are
        independent: element e reads element e of its operands, and a kernel
        never writes a buffer it reads in place (`ttile.in_place`, see
        tessera-cpu-in-place). GCC does not trust `__restrict__` on the
        in-place pointers; without the hint -O2 would need runtime alias
        checks and did not vectorize (a fused GELU backward markedly slower)."""
        self.line("#pragma GCC ivdep")

    def new_tile(self, value: ir.Value) -> Tile:
        tile = super().new_tile(value)
        store = None if isinstance(value.owner, ir.Block) else cs.stored_in_place_by(value)
        if store is not None:
            # Its store's block of the buffer, computed in place (no array
            # and no copy: tessera-cpu-in-place decided it).
            tile.view = True
            tile.stored_by = operation_key(store)
            self.line(f"{tile.ctype}* __restrict__ {tile.name} = {self._block_address(store)};")
        return tile

    def _block_address(self, store: ir.Operation) -> str:
        """The address of the block a `ttile.store {ttile.in_place}` writes."""
        buf = self.names[store.operands[1]]
        offsets = list(store.operands)[2:]
        if any(v not in self.names for v in offsets):
            raise EmitError("'ttile.store' {ttile.in_place} has offsets computed after the "
                            "tile it stores", store.location)
        shape = self.buffers[buf]
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        return f"{buf} + (" + " + ".join(f"{self.scalar(v)} * {strides[d]}"
                                         for d, v in enumerate(offsets)) + ")"

    def emit_kernel(self, kernel: ir.Operation) -> str:
        name, grid, entry, params, prologue = self.signature(kernel)
        body_lines_start = len(self.lines)
        for d, g in enumerate(grid):
            # The outermost grid loop runs a range, so the CPU engine can
            # split it over threads (Tile IR programs run their pids in any
            # order and at once, as on a GPU: each pid writes its own tiles).
            start, stop = ("pid0_begin", "pid0_end") if d == 0 else (0, g)
            self.line(f"for (int64_t pid{d} = {start}; pid{d} < {stop}; ++pid{d}) {{")
            self.indent += 1
            skip = self.past_segments(kernel, "pid0") if d == 0 else None
            if skip:
                self.line(f"if ({skip}) continue;  // rows nothing reads")
        self.emit_ops(entry.operations)
        for _ in grid:
            self.indent -= 1
            self.line("}")
        body = self.lines[body_lines_start:]
        decls = []
        for t in (t for t in self.tiles.values() if not t.view):
            note = f"// tile {'x'.join(map(str, t.shape))}"
            if t.size > _STACK_TILE_LIMIT:
                decls.append(f"  std::vector<{t.ctype}> {t.name}_v({t.size}); "
                             f"{t.ctype}* {t.name} = {t.name}_v.data();  {note}")
            else:
                # alignas: GCC 12.2 (Debian 12's) can store a leaf kernel's
                # small stack tile with an aligned vmovaps at an address 8
                # bytes off (seen: a 5 x 4 softmax tile kept in the red zone
                # below five pushed registers; SIGSEGV). A 64-byte-aligned
                # array makes it realign the frame, which it gets right.
                decls.append(f"  alignas(64) {t.ctype} {t.name}[{t.size}];  {note}")
        head = [f"{KERNEL_HEADER}{name}", f"// grid ({', '.join(map(str, grid))}) run as loops"]
        if not grid:
            head.append(f'extern "C" void {name}({", ".join(params)}) {{')
            return "\n".join(head + ["  " + p for p in prologue] + decls + body + ["}"]) + "\n"
        # NAME runs the whole grid; NAME__range(args, begin, end) pids
        # [begin, end) of its outermost dimension; NAME__grid is that extent.
        args = ", ".join(p.split()[-1] for p in params)
        ranged = params + ["int64_t pid0_begin", "int64_t pid0_end"]
        head += [f'extern "C" const int64_t {name}{GRID_SUFFIX} = {grid[0]};',
                 f'extern "C" void {name}{RANGE_SUFFIX}({", ".join(ranged)}) {{']
        sep = ", " if args else ""
        unpacked = "".join(f"a[{i}], " for i in range(len(params)))
        tail = ["}", f'extern "C" void {name}({", ".join(params)}) {{',
                f"  {name}{RANGE_SUFFIX}({args}{sep}0, {grid[0]});", "}",
                f'extern "C" void {name}{SLICE_SUFFIX}(void** a, int64_t begin, int64_t end) {{',
                f"  {name}{RANGE_SUFFIX}({unpacked}begin, end);", "}"]
        return "\n".join(head + ["  " + p for p in prologue] + decls + body + tail) + "\n"

    def emit_ops(self, ops) -> None:
        """`ops` in order; the consecutive ops of one fused element loop
        (`ttile.fused`, tessera-cpu-fuse) as that one loop."""
        ops = [o.operation for o in ops]
        i = 0
        while i < len(ops):
            loop = cs.fused(ops[i])
            if loop is None:
                self.emit_op(ops[i])
                i += 1
                continue
            end = i + 1
            while end < len(ops) and cs.fused(ops[end]) == loop:
                end += 1
            self._emit_run(ops[i:end])
            i = end

    def _emit_run(self, run: list) -> None:
        for op in run:
            if op.name == "ttile.load":
                self.emit_op(op)                # a pointer: before the loop
        run = [op for op in run if op.name != "ttile.load"]
        inside = {operation_key(op) for op in run}
        size = math.prod(tile_of(run[0].results[0].type)[0])
        widths = [tile_of(op.results[0].type)[0][-1] for op in run if op.name == "ttile.broadcast"]
        e = self.fresh("e")
        row, column = self.fresh("r"), self.fresh("j")
        body = []
        for op in run:
            value = op.results[0]
            local = all(operation_key(use.owner) in inside for use in value.uses)
            if local:
                shape, elt = tile_of(value.type)
                r = Tile(self.fresh("v"), shape, ctype(elt, value.location), elt, scalar=True)
                self.names[value] = r
            else:
                r = self.new_tile(value)
            if op.name == "ttile.broadcast":       # a copy: no rounding
                x = f"{self.names[op.operands[0]].name}[{cs.broadcast_index(op, row, column, e)}]"
            else:
                x = self.element_value(op, r, e)
            body.append(f"const {r.ctype} {r.name} = {x};" if local else f"{r.name}[{e}] = {x};")
        if widths:
            # Rows of the broadcasts' last dimension: a broadcast column is
            # one value per row, a broadcast row is indexed by the column.
            self.line(f"for (int64_t {row} = 0; {row} < {size // widths[0]}; ++{row}) {{")
            self.indent += 1
            self.independent_iterations()
            self.line(f"for (int64_t {column} = 0; {column} < {widths[0]}; ++{column}) {{")
            self.line(f"  const int64_t {e} = {row} * {widths[0]} + {column};")
        else:
            self.independent_iterations()
            self.line(self.element_loop(e, size))
        for text in body:
            self.line("  " + text)
        self.line("}")
        if widths:
            self.indent -= 1
            self.line("}")

    def in_place_access(self, op, tile: Tile, buf: str, base: str, load: bool) -> bool:
        if not load:
            return tile.stored_by == operation_key(op)      # computed in place
        if tile.view or not cs.in_place(op):
            return False
        # The block is the tile as it lies in memory: read it in place
        # rather than copy it (a GELU's loads were a third of its loops).
        tile.view = True
        self.line(f"const {tile.ctype}* __restrict__ {tile.name} = {buf} + ({base});")
        return True

    def op_ttile_fill(self, op):
        value = op.results[0]
        if _zero_fill(value) and all(
                use.owner.operation.name == "ttile.dot" and use.operand_number == 2
                and not cs.accumulates(use.owner.operation) for use in value.uses):
            # Read only as the zero accumulator of dots that clear their own
            # result (a memset each): no array to fill.
            shape, elt = tile_of(value.type)
            self.names[value] = Tile(self.fresh("t"), shape, ctype(elt, value.location), elt,
                                     scalar=True)
            return
        super().op_ttile_fill(op)

    def op_ttile_dot(self, op):
        a, b, acc = (self.names[v] for v in op.operands)
        M, K = a.shape
        N = b.shape[1]
        if cs.accumulates(op):
            # The accumulator's last use: the dot adds into its array
            # (tessera-cpu-in-place decided it).
            if acc.view or acc.scalar:
                raise EmitError("'ttile.dot' {ttile.accumulate} into a tile that is not an "
                                "array of its own", op.location)
            r = self.names[op.results[0]] = acc
        else:
            r = self.new_tile(op.results[0])
            if _zero_fill(op.operands[2]):
                self.line(f"std::memset({r.name}, 0, sizeof({r.ctype}) * {M * N});")
            else:
                self.line(f"for (int64_t e = 0; e < {M * N}; ++e) {r.name}[e] = {acc.name}[e];")
        acc_t = r.ctype
        if a.ctype == b.ctype == acc_t == "float":
            self.line(f"tessera_dot({a.name}, {b.name}, {r.name}, {M}, {K}, {N});")
            return
        # i-k-j order: the inner loop runs along contiguous rows of b and r.
        self.line(f"for (int64_t i = 0; i < {M}; ++i)")
        self.line(f"  for (int64_t k = 0; k < {K}; ++k) {{")
        self.line(f"    const {acc_t} av = ({acc_t}){a.name}[i * {K} + k];")
        self.line(f"    for (int64_t j = 0; j < {N}; ++j) {r.name}[i * {N} + j] += av * ({acc_t}){b.name}[k * {N} + j];")
        self.line("  }")

    def math(self, fn: str, arg: str) -> str:
        """The C library's `fn`."""
        return f"std::{fn}({arg})"

    def fast(self, ct: str, fn: str, arg: str) -> str:
        """The vectorizable float version (tessera_exp ...), libm otherwise."""
        if ct == "float":
            if fn == "exp2":            # tessera_exp reduces by powers of 2 itself
                return f"tessera_exp(({arg}) * 0.69314718055994531f)"
            return f"tessera_{fn}({arg})"
        return self.math(fn, arg)

    def op_ttile_transpose(self, op):
        src = self.names[op.operands[0]]
        r = self.new_tile(op.results[0])
        m, n = src.shape           # r[j, i] = src[i, j]
        # On the CPU two loops, not one over r's elements with a div and mod
        # each (src read row by row, r written with stride m; the other order
        # and 8x8 blocks were slower).
        i, j = self.fresh("i"), self.fresh("j")
        with self.loop(i, m):
            self.independent_iterations()
            self.line(f"for (int64_t {j} = 0; {j} < {n}; ++{j}) "
                      f"{r.name}[{j} * {m} + {i}] = {src.name}[{i} * {n} + {j}];")

    #: Partial results a CPU row reduction keeps (one AVX register of floats).
    REDUCE_LANES = 8

    def op_ttile_reduce(self, op):
        src = self.names[op.operands[0]]
        r = self.new_tile(op.results[0])
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        kind = enum_of(op)
        # max / min propagate NaN, as numpy's do (b != b: b is NaN).
        template = {"sum": "{a} + {b}", "prod": "{a} * {b}",
                    "max": "({b} > {a} || {b} != {b} ? {b} : {a})",
                    "min": "({b} < {a} || {b} != {b} ? {b} : {a})"}[kind]

        def combine(a, b):
            return template.format(a=a, b=b)
        inner = math.prod(src.shape[dim + 1:])
        n, ct, lanes = src.shape[dim], r.ctype, self.REDUCE_LANES
        if inner > 1:
            # Over a leading dimension (a bias gradient's sum over rows): each
            # output combines q = 0..n-1 in order, as before, but with the
            # contiguous, independent loop over outputs innermost, which
            # vectorizes (it used to run a strided sequential loop per output).
            o, q, i = self.fresh("o"), self.fresh("q"), self.fresh("i")
            out, at = f"{r.name}[{o} * {inner} + {i}]", f"{src.name}[{o} * {n * inner} + "
            with self.loop(o, r.size // inner):
                self.independent_iterations()
                self.line(f"for (int64_t {i} = 0; {i} < {inner}; ++{i}) {out} = {at}{i}];")
                with self.loop(q, n, begin=1):
                    self.independent_iterations()
                    self.line(f"for (int64_t {i} = 0; {i} < {inner}; ++{i}) "
                              f"{out} = {combine(out, f'{at}{q} * {inner} + {i}]')};")
            return
        if ct not in ("float", "double") or n < 2 * lanes:
            def sequential(e):
                self.line(f"{ct} acc = {src.name}[{e} * {n}];")
                self.line(f"for (int64_t q = 1; q < {n}; ++q) {{ const {ct} x = "
                          f"{src.name}[{e} * {n} + q]; acc = {combine('acc', 'x')}; }}")
                self.line(f"{r.name}[{e}] = acc;")
            # No hint: each element runs a sequential loop of its own.
            self.for_each(r.size, sequential, independent=False)
            return

        def laned(e):
            # Lane l combines the row's elements l, l + 8, l + 16, ... in
            # order (one vector operation per 8 elements instead of a chain of
            # dependent scalar adds, 4 cycles each); then the lanes combine in
            # a fixed tree. A fixed order: the same bits on every run and
            # thread count (not those of a left-to-right sum; closer to the
            # exact sum, like numpy's pairwise summation).
            row, full = f"{src.name} + {e} * {n}", n - n % lanes
            self.line(f"const {ct}* row = {row};")
            self.line(f"{ct} lane[{lanes}];")
            self.line(f"for (int64_t l = 0; l < {lanes}; ++l) lane[l] = row[l];")
            with self.loop("q", full, begin=lanes, step=lanes):
                self.independent_iterations()
                self.line(f"for (int64_t l = 0; l < {lanes}; ++l) "
                          f"lane[l] = {combine('lane[l]', 'row[q + l]')};")
            if n % lanes:
                self.line(f"for (int64_t q = {full}; q < {n}; ++q) "
                          f"lane[q - {full}] = {combine(f'lane[q - {full}]', 'row[q]')};")
            step = 1
            while step < lanes:                 # ((l0 l1) (l2 l3)) ((l4 l5) (l6 l7))
                for k in range(0, lanes, 2 * step):
                    self.line(f"lane[{k}] = {combine(f'lane[{k}]', f'lane[{k + step}]')};")
                step *= 2
            self.line(f"{r.name}[{e}] = lane[0];")
        self.for_each(r.size, laned, independent=False)

    def op_ttile_barrier(self, op):
        pass    # one thread runs each kernel instance on the CPU


def cpu_runtime_source() -> str:
    """What every emitted CPU source holds before its kernels: the shared
    preamble (the helpers of cpu/tessera_cpu.h) and, after PREAMBLE_END, the
    runtime part (cpu/tessera_cpu_runtime.cpp); build.py compiles with -I
    at CPU_INCLUDE_DIR."""
    return (f"// Generated by Tessera from Tile IR (ttile). Do not edit.\n"
            f'#include "{CPU_HEADER}"\n{PREAMBLE_END}#include "{CPU_RUNTIME}"\n')


def emit_cpp(module: ir.Module) -> str:
    """C++ for the CPU engine: one `extern "C"` function per ttile.kernel,
    the OpenMP team that runs their grids (tessera_parallel) and the
    engine's GEMM on it (tessera_gemm_f32, and tessera_gemm_f32_then with a
    kernel as its epilogue)."""
    kernels = [KernelEmitter().emit_kernel(kernel) for kernel in kernels_of(module)]
    dump_kernels(kernels, ".cpp")
    return "\n".join([cpu_runtime_source(), *kernels])
