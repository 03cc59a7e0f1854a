"""Emits C++ for the CPU engine from Tile IR (the CUDA emitter,
the `cuda` package, builds on this one).

Every `ttile.kernel` becomes an `extern "C"` function taking one `void*` per
buffer argument (inputs, then outputs; shapes are static and compiled in).
The grid becomes nested loops over program ids; tiles are local arrays.

Tile values are SSA; each gets its own array, declared once at the top of the
kernel. `scf.for` loop-carried tiles get arrays that `scf.yield` copies into.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

from tessera_mlir import ir

from ..ir.support import kernels_of, marked_args, nested_ops, operation_key
from ..ir.ops import TILE_ELEMENTWISE
from ..ir.types import enum_of, tile_of
from .build import CPU_HEADER, CPU_RUNTIME, KERNEL_HEADER, PREAMBLE_END, dump_kernels

#: The CPU kernels' extra symbols: NAME__range(args, pid0_begin, pid0_end),
#: NAME__grid (pid0's extent) and NAME__slice(void** args, begin, end), the
#: range with its arguments in an array, which the library's one
#: tessera_parallel(slice, args, grid, threads) splits over an OpenMP team
#: (the CPU engine's threaded launches). One parallel region per library,
#: not per kernel: g++ took ~0.4 s longer on the w128 step's 89 kernels with
#: a region in each.
RANGE_SUFFIX, GRID_SUFFIX, SLICE_SUFFIX = "__range", "__grid", "__slice"

NVSHMEM_OPS = {"ttile.my_pe", "ttile.n_pes", "ttile.put", "ttile.get", "ttile.signal",
               "ttile.wait", "ttile.fence", "ttile.quiet"}
# Element type -> C type of a tile element. bf16 and FP8 tiles compute in
# float (every value rounded to the type's precision); their buffers hold the
# raw bits.
_CTYPES = {"f32": "float", "f64": "double", "f16": "_Float16", "bf16": "float",
           "f8E4M3FN": "float", "i32": "int32_t", "i64": "int64_t", "i8": "int8_t",
           "i1": "bool"}
_BUFFER_CTYPES = {**_CTYPES, "bf16": "uint16_t", "f8E4M3FN": "uint8_t"}
#: Storage-only float types: (bits -> float, float -> bits, round a float to
#: the type) helpers, defined in cpu/tessera_numerics.h.
STORED_AS_BITS = {"bf16": ("bf16_to_float", "float_to_bf16", "bf16_round"),
                  "f8E4M3FN": ("f8e4m3_to_float", "float_to_f8e4m3", "f8e4m3_round")}
# Tiles larger than this live on the heap (CPU), not the stack.
_STACK_TILE_LIMIT = 16384


class EmitError(Exception):
    def __init__(self, message, location=None):
        super().__init__(message)
        self.location = location


def ctype(t: ir.Type | str, location: ir.Location | None = None, buffer: bool = False) -> str:
    key = str(t)
    if key not in _CTYPES:
        raise EmitError(f"element type {key} is not supported by the kernel emitter yet",
                        location)
    return (_BUFFER_CTYPES if buffer else _CTYPES)[key]


def c_literal(value: float, ct: str) -> str:
    """`value` as a C expression of type `ct` (infinities included)."""
    if math.isinf(value):
        return f"({'-' if value < 0 else ''}INFINITY)"
    if math.isnan(value):
        return "NAN"
    return f"({ct}){value!r}"


@dataclass
class Tile:
    name: str
    shape: list[int]
    ctype: str
    element: str = ""
    #: a per-element scalar of a fused elementwise loop (KernelEmitter.emit_ops),
    #: not an array: only ops of that loop read it
    scalar: bool = False
    #: a pointer into a kernel argument, not an array of its own: a load read
    #: in place (`_read_in_place`) or a tile computed in place in the buffer
    #: its one store writes (`_stored_in_place`)
    view: bool = False
    #: (computed in place) the key of the store that therefore copies nothing
    stored_by: int | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)


# Elementwise tile ops: one C expression of their operands' elements each,
# from the op table (`KernelEmitter.expression`; the result element type is
# `ct`).
ELEMENTWISE_EXPRESSIONS = {name: e.c for name, e in TILE_ELEMENTWISE.items()}


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


def _contiguous(tile_shape: list[int], shape: list[int]) -> bool:
    """Whether a tile of `tile_shape` (padded to the buffer's rank) is one
    contiguous block of a row-major buffer of `shape`: whole in every
    dimension after its first of extent > 1."""
    first = next((d for d, n in enumerate(tile_shape) if n > 1), len(shape))
    return all(tile_shape[d] == shape[d] for d in range(first + 1, len(shape)))


def placed_shape(access: ir.Operation, tile_shape: list[int], rank: int) -> list[int]:
    """A `ttile.load` / `ttile.store`'s tile shape padded to its buffer's
    `rank`: at its `dims`, else in the trailing dimensions (1 elsewhere)."""
    if "dims" not in access.attributes:
        return [1] * (rank - len(tile_shape)) + list(tile_shape)
    placed = [1] * rank
    for d, n in zip(ir.DenseI64ArrayAttr(access.attributes["dims"]), tile_shape):
        placed[d] = n
    return placed


@dataclass
class KernelEmitter:
    cuda = False        # class constant: the CUDA subclass sets it
    lines: list[str] = field(default_factory=list)
    names: dict = field(default_factory=dict)
    tiles: dict = field(default_factory=dict)
    counter: int = 0
    indent: int = 1

    # -- helpers -----------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def line(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    def sync(self) -> None:
        """A barrier between tile operations (none on the CPU)."""

    def for_each(self, n: int, body, independent: bool = True) -> None:
        """`body(e)` for every element index e < n (split over threads on GPU);
        `independent`: hint the CPU compiler (see `independent_iterations`)."""
        e = self.fresh("e")
        if independent:
            self.independent_iterations()
        self.line(self.element_loop(e, n))
        self.indent += 1
        body(e)
        self.indent -= 1
        self.line("}")
        self.sync()

    def element_loop(self, e: str, n) -> str:
        return f"for (int64_t {e} = 0; {e} < {n}; ++{e}) {{"

    @contextmanager
    def loop(self, iv: str, n, begin=0, step: int = 1):
        """`for (iv = begin; iv < n; iv += step) { ... }` around the lines
        emitted inside the `with` (every thread runs all of it: not split
        over a GPU's threads as `for_each` is)."""
        inc = f"++{iv}" if step == 1 else f"{iv} += {step}"
        self.line(f"for (int64_t {iv} = {begin}; {iv} < {n}; {inc}) {{")
        self.indent += 1
        yield
        self.indent -= 1
        self.line("}")

    def independent_iterations(self) -> None:
        """Tells the C++ compiler the next element loop's iterations are
        independent: element e reads element e of its operands, and a kernel
        never writes a buffer it reads in place (`_read_in_place`,
        `_stored_in_place`). GCC does not trust `__restrict__` on the
        in-place pointers; without the hint -O2 would need runtime alias
        checks and did not vectorize (a fused GELU backward 1.5 -> 6.3 ms)."""
        if not self.cuda:
            self.line("#pragma GCC ivdep")

    def new_tile(self, value: ir.Value) -> Tile:
        shape, elt = tile_of(value.type)
        tile = Tile(self.fresh("t"), shape, ctype(elt, value.location), elt)
        self.tiles[tile.name] = tile
        self.names[value] = tile
        place = self._stored_in_place(value, tile)
        if place is not None:
            # Its one store's block of the buffer, computed in place (no
            # array and no copy; see `_stored_in_place`).
            tile.view = True
            self.line(f"{tile.ctype}* __restrict__ {tile.name} = {place};")
        return tile

    def _stored_in_place(self, value: ir.Value, tile: Tile) -> str | None:
        """Where `value`'s tile can be computed in place, or None: on the
        CPU, when it has one store (in the same block, its offsets already
        computed) of one contiguous block of a buffer that the kernel
        stores to only there and never loads. The value then reaches memory
        when it is computed rather than at the store: nothing reads that
        buffer in between, and no other store writes it. Its other uses
        read it there (a bias add kept for the backward and fed to a GELU:
        one pass writing both outputs, 6.5 -> 4.1 ms at w512, where the
        kept copy was written by a second pass over the tile)."""
        if self.cuda or isinstance(value.owner, ir.Block):
            return None                     # (a block argument: a loop's carried tile)
        stores = [u for u in value.uses if u.owner.operation.name == "ttile.store"]
        if len(stores) != 1 or stores[0].operand_number != 0:
            return None
        store = stores[0].owner.operation
        if store.block != value.owner.operation.block:
            return None
        buf = self.names.get(store.operands[1])
        offsets = list(store.operands)[2:]
        if buf is None or self.stores.get(buf) != 1 or buf in self.loaded or \
                self.buffer_elements[buf] in STORED_AS_BITS or \
                any(v not in self.names for v in offsets):
            return None
        shape = self.buffers[buf]
        if not shape or not _contiguous(placed_shape(store, tile.shape, len(shape)), shape):
            return None
        tile.stored_by = operation_key(store)
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        return f"{buf} + (" + " + ".join(f"{self.scalar(v)} * {strides[d]}"
                                         for d, v in enumerate(offsets)) + ")"

    def scalar(self, value: ir.Value) -> str:
        return self.names[value]

    # -- kernel ------------------------------------------------------------
    def signature(self, kernel: ir.Operation):
        """(name, grid, entry block, C parameters, prologue lines) of a kernel;
        records each buffer argument's C name, shape and element type."""
        attrs = kernel.attributes
        name = ir.StringAttr(attrs["sym_name"]).value
        grid = list(ir.DenseI64ArrayAttr(attrs["grid"]))
        entry = kernel.regions[0].blocks[0]
        params, prologue = [], []
        self.buffers, self.buffer_elements = {}, {}
        symmetric = marked_args(kernel, "ttile.symmetric")
        for i, arg in enumerate(entry.arguments):
            mt = ir.MemRefType(arg.type)
            ct = ctype(mt.element_type, kernel.location, buffer=True)
            params.append(f"void* arg{i}_")
            # Other PEs write symmetric buffers while the kernel runs: no
            # __restrict__ (which promises nothing else changes them).
            restrict = "" if i in symmetric else " __restrict__"
            prologue.append(f"{ct}*{restrict} arg{i} = static_cast<{ct}*>(arg{i}_);  // {mt}")
            self.names[arg] = f"arg{i}"
            self.buffers[f"arg{i}"] = list(mt.shape)
            self.buffer_elements[f"arg{i}"] = str(mt.element_type)
        return name, grid, entry, params, prologue

    def past_segments(self, kernel: ir.Operation, pid: str) -> str | None:
        """A C++ condition, true when instance `pid` of a kernel with
        `row_segments` covers only rows past every segment (rows nothing
        reads: it skips them), or None without the attribute. A band that
        spans two blocks of rows always runs."""
        if "row_segments" not in kernel.attributes:
            return None
        arg, rows, tile_rows = ir.DenseI64ArrayAttr(kernel.attributes["row_segments"])
        sizes = self.buffers[f"arg{arg}"]
        blocks, per_block = (sizes if len(sizes) == 2 else [1] + sizes)
        grid = list(ir.DenseI64ArrayAttr(kernel.attributes["grid"]))[0]
        height, band_pids = rows // blocks, grid // (rows // tile_rows)
        first = f"(({pid}) / {band_pids}) * {tile_rows}"
        return (f"tessera_past_segments(arg{arg}, {per_block}, {height}, {first}, {tile_rows})")

    def emit_kernel(self, kernel: ir.Operation) -> str:
        name, grid, entry, params, prologue = self.signature(kernel)
        # How many stores write each buffer and which buffers are loaded:
        # a load views only a buffer nothing stores to (a view would see a
        # later store), a tile is computed in place only in a buffer stored
        # once and never loaded (see `_stored_in_place`).
        self.stores, self.loaded = {}, set()
        for o in nested_ops(kernel):
            if o.name == "ttile.store":
                buf = self.names.get(o.operands[1])
                self.stores[buf] = self.stores.get(buf, 0) + 1
            elif o.name == "ttile.load":
                self.loaded.add(self.names.get(o.operands[0]))
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

    # -- ops ---------------------------------------------------------------
    def emit_ops(self, ops) -> None:
        """`ops` in order. On the CPU each run of elementwise ops and fills
        over tiles of one size shares one loop, and a tile that only its
        run reads is a scalar there: one pass with the values in registers
        instead of a pass and a stack array per op (GCC does not fuse loops;
        a GELU backward was 25 loops over 16 KB tiles). Loads read in place
        and broadcasts join a run (see `_elementwise_run`). Per element the
        same operations in the same order: the same bits."""
        ops = [o.operation for o in ops]
        i = 0
        while i < len(ops):
            run = [] if self.cuda else self._elementwise_run(ops, i)
            if sum(op.name != "ttile.load" for op in run) < 2:
                self.emit_op(ops[i])
                i += 1
                continue
            self._emit_run(run)
            i += len(run)

    def _elementwise_run(self, ops: list, start: int) -> list:
        """The elementwise ops, fills and broadcasts (see `_broadcast_index`)
        from `start` on whose results are tiles of one size, with the loads
        among them that read in place (pointers, declared before the loop)."""
        run, size, width = [], None, None
        for op in ops[start:]:
            if op.name == "ttile.load" and self._read_in_place(op):
                run.append(op)
                continue
            if op.name == "ttile.broadcast":
                # (Not of a value the run computes: the run's own values
                # are its elements, not tiles to index.)
                shape = tile_of(op.results[0].type)[0]
                made = op.operands[0].owner
                made = None if isinstance(made, ir.Block) else operation_key(made)
                if self._broadcast_index(op, "r", "j", "e") is None or \
                        width not in (None, shape[-1]) or \
                        any(m.name != "ttile.load" and operation_key(m) == made for m in run):
                    break
                width = shape[-1]
            elif op.name not in ELEMENTWISE_EXPRESSIONS and op.name != "ttile.fill":
                break
            n = math.prod(tile_of(op.results[0].type)[0])
            if size is not None and n != size:
                break
            size = n
            run.append(op)
        return run

    def _broadcast_index(self, op: ir.Operation, row: str, column: str, e: str) -> str | None:
        """Where a `ttile.broadcast` in a run's loop reads its source, the
        loop running over rows of the result's last dimension (`row`,
        `column`; `e` the flat element): the source's element `row` when it
        is one column, `column` when one row, the row's place in the source
        when the source is the result's trailing dimensions (a [1, 16, 128]
        position table over a [2, 16, 128] tile), `e` when it is the
        result's shape, 0 for one value; None for other broadcasts (a loop
        of their own)."""
        shape, src_shape = tile_of(op.results[0].type)[0], tile_of(op.operands[0].type)[0]
        source = [1] * (len(shape) - len(src_shape)) + list(src_shape)
        if source == list(shape):
            return e
        if source[-1] == 1 and source[:-1] == list(shape[:-1]):
            return row
        lead = next((d for d, n in enumerate(source) if n != 1), len(source))
        if lead == len(source):
            return "0"                              # one value
        if source[lead:] == list(shape[lead:]):
            rows = math.prod(source) // shape[-1]
            return column if rows == 1 else f"({row} % {rows}) * {shape[-1]} + {column}"
        return None

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
                x = f"{self.names[op.operands[0]].name}[{self._broadcast_index(op, row, column, e)}]"
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

    def emit_op(self, op: ir.Operation) -> None:
        name = op.name
        if name in ELEMENTWISE_EXPRESSIONS:
            self._elementwise(op)
            return
        handler = getattr(self, "op_" + name.replace(".", "_"), None)
        if handler is None and name in NVSHMEM_OPS:
            raise EmitError(f"'{name}' is NVSHMEM device communication; it needs the GPU "
                            "target (tessera-translate --ttile-to-cuda)", op.location)
        if handler is None:
            raise EmitError(f"the kernel emitter does not support '{name}'", op.location)
        handler(op)

    def op_ttile_load_scalar(self, op):
        view = op.opview
        buf = self.names[view.buffer]
        shape = self.buffers[buf]
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        at = " + ".join(self.scalar(i) if n == 1 else f"{self.scalar(i)} * {n}"
                        for i, n in zip(view.indices, strides)) or "0"
        v = self.fresh("s")
        self.line(f"const int64_t {v} = (int64_t){buf}[{at}];")
        self.names[op.results[0]] = v

    def op_ttile_program_id(self, op):
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        self.names[op.results[0]] = f"pid{dim}"

    def op_arith_constant(self, op):
        v = self.fresh("c")
        value = op.attributes["value"]
        if not isinstance(op.results[0].type, (ir.IndexType, ir.IntegerType)):
            raise EmitError("only integer/index constants are supported in kernels", op.location)
        self.line(f"const int64_t {v} = {ir.IntegerAttr(value).value};")
        self.names[op.results[0]] = v

    def _index_binary(self, op, sym):
        v = self.fresh("i")
        a, b = (self.scalar(x) for x in op.operands)
        self.line(f"const int64_t {v} = {a} {sym} {b};")
        self.names[op.results[0]] = v

    def op_arith_muli(self, op):
        self._index_binary(op, "*")

    def op_arith_addi(self, op):
        self._index_binary(op, "+")

    def op_arith_subi(self, op):
        self._index_binary(op, "-")

    def op_ttile_fill(self, op):
        t = self.new_tile(op.results[0])
        lit = self.element_value(op, t, None)
        self.for_each(t.size, lambda e: self.line(f"{t.name}[{e}] = {lit};"))

    def _tile_access(self, op, tile: Tile, buf: str, offsets, load: bool):
        shape = self.buffers[buf]
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        bits = STORED_AS_BITS.get(self.buffer_elements[buf])
        tile_shape = placed_shape(op, tile.shape, len(shape))

        def move(t_index: str, b_index: str) -> None:
            if load:
                value = f"{bits[0]}({buf}[{b_index}])" if bits else f"{buf}[{b_index}]"
                self.line(f"{tile.name}[{t_index}] = {value};")
            else:
                value = f"{bits[1]}({tile.name}[{t_index}])" if bits else f"{tile.name}[{t_index}]"
                self.line(f"{buf}[{b_index}] = {value};")

        if not shape:                       # a 0-d buffer: one element
            self.line("{")
            move("0", "0")
            self.line("}")
            self.sync()
            return
        base = " + ".join(f"{offsets[d]} * {strides[d]}" for d in range(len(shape)))
        if not load and tile.stored_by == operation_key(op):
            return                          # computed in place
        if load and not tile.view and self._read_in_place(op):
            # The block is the tile as it lies in memory: read it in place
            # rather than copy it (a GELU's loads were a third of its loops).
            tile.view = True
            self.line(f"const {tile.ctype}* __restrict__ {tile.name} = {buf} + ({base});")
            return
        # CPU: nested loops, the innermost along contiguous memory, so the
        # compiler vectorizes it; the tile index advances by one per element.
        loop_dims = [d for d in range(len(shape)) if tile_shape[d] > 1]
        t = self.fresh("p")
        self.line("{")
        self.indent += 1
        self.line(f"const int64_t {t}_base = {base};")
        self.line(f"int64_t {t} = 0;")
        ivs = []
        for d in loop_dims:
            iv = self.fresh("i")
            ivs.append((iv, d))
            if d == loop_dims[-1]:
                self.independent_iterations()
            self.line(f"for (int64_t {iv} = 0; {iv} < {tile_shape[d]}; ++{iv}) {{")
            self.indent += 1
        addr = " + ".join([f"{t}_base"] + [f"{iv} * {strides[d]}" for iv, d in ivs])
        move(f"{t}++", addr)
        for _ in loop_dims:
            self.indent -= 1
            self.line("}")
        self.indent -= 1
        self.line("}")

    def _read_in_place(self, load: ir.Operation) -> bool:
        """Whether a `ttile.load` is a pointer into its buffer (CPU): a
        contiguous block of a buffer the kernel never stores to (a view
        would see a later store), not bf16 (converted), and not itself
        stored (a copy, done in place in the destination)."""
        buf = self.names[load.operands[0]]
        shape = self.buffers.get(buf)
        if self.cuda or not shape or buf in self.stores or \
                self.buffer_elements[buf] in STORED_AS_BITS or \
                any(u.owner.operation.name == "ttile.store" for u in load.results[0].uses):
            return False
        return _contiguous(placed_shape(load, tile_of(load.results[0].type)[0], len(shape)), shape)

    def op_ttile_load(self, op):
        t = self.new_tile(op.results[0])
        buf = self.names[op.operands[0]]
        offsets = [self.scalar(v) for v in list(op.operands)[1:]]
        self._tile_access(op, t, buf, offsets, load=True)

    def op_ttile_store(self, op):
        t = self.names[op.operands[0]]
        buf = self.names[op.operands[1]]
        offsets = [self.scalar(v) for v in list(op.operands)[2:]]
        self._tile_access(op, t, buf, offsets, load=False)

    def op_ttile_dot(self, op):
        a, b, acc = (self.names[v] for v in op.operands)
        M, K = a.shape
        N = b.shape[1]
        if self._accumulates_in_place(op, acc):
            # The accumulator's last use: the dot adds into its array (a
            # flash-attention step's output block, 32 KiB, was copied first).
            r = self.names[op.results[0]] = acc
        else:
            r = self.new_tile(op.results[0])
            if not self.cuda and _zero_fill(op.operands[2]):
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

    def _accumulates_in_place(self, dot, acc: Tile) -> bool:
        """Whether a CPU dot may add into its accumulator's own array: the
        dot is the accumulator's only use, in the block that defines it (a
        dot in a loop under the definition runs more than once), and the
        array is the tile's own (not a view into a buffer, not a fused
        loop's scalar) and of the result's type."""
        value = dot.operands[2]
        owner = value.owner
        block = owner if isinstance(owner, ir.Block) else owner.operation.block
        return not self.cuda and block == dot.block and len(list(value.uses)) == 1 and \
            not acc.view and not acc.scalar and \
            tile_of(value.type) == tile_of(dot.results[0].type)

    def expression(self, op, xs: list[str]) -> str:
        """The C expression of elementwise `op` on operand elements `xs`."""
        ct = ctype(tile_of(op.results[0].type)[1], op.location)
        return ELEMENTWISE_EXPRESSIONS[op.name](self, op, ct, *xs)

    def element_value(self, op, result: Tile, e) -> str:
        """The C expression of elementwise `op` (or a fill) at element `e`
        of its operands (a scalar operand is its own element)."""
        if op.name == "ttile.fill":
            x = c_literal(ir.FloatAttr(op.attributes["value"]).value, result.ctype)
        else:
            x = self.expression(op, [s.name if s.scalar else f"{s.name}[{e}]"
                                     for s in (self.names[v] for v in op.operands)])
        # A bf16 or FP8 result is computed in float and rounded to its precision.
        bits = STORED_AS_BITS.get(result.element)
        return f"{bits[2]}({x})" if bits else x

    def _elementwise(self, op):
        r = self.new_tile(op.results[0])
        self.for_each(r.size, lambda e: self.line(
            f"{r.name}[{e}] = {self.element_value(op, r, e)};"))

    def math(self, fn: str, arg: str) -> str:
        """The C library's `fn`."""
        return f"{fn}({arg})" if self.cuda else f"std::{fn}({arg})"

    def fast(self, ct: str, fn: str, arg: str) -> str:
        """The vectorizable float version on the CPU, libm otherwise."""
        if not self.cuda and ct == "float":
            if fn == "exp2":            # tessera_exp reduces by powers of 2 itself
                return f"tessera_exp(({arg}) * 0.69314718055994531f)"
            return f"tessera_{fn}({arg})"
        return self.math(fn, arg)

    def op_ttile_broadcast(self, op):
        src = self.names[op.operands[0]]
        r = self.new_tile(op.results[0])
        rstrides = [math.prod(r.shape[d + 1:]) for d in range(len(r.shape))]
        sstrides = [math.prod(src.shape[d + 1:]) for d in range(len(src.shape))]

        # Nested loops over the result; the source index skips repeated dims.
        ivs = []
        for d, n in enumerate(r.shape):
            iv = self.fresh("i")
            ivs.append(iv)
            if d == len(r.shape) - 1:
                self.independent_iterations()
            self.line(f"for (int64_t {iv} = 0; {iv} < {n}; ++{iv}) {{")
            self.indent += 1
        dst = " + ".join(f"{iv} * {rstrides[d]}" for d, iv in enumerate(ivs))
        src_idx = " + ".join(f"{iv} * {sstrides[d]}" for d, iv in enumerate(ivs)
                             if src.shape[d] != 1) or "0"
        self.line(f"{r.name}[{dst}] = {src.name}[{src_idx}];")
        for _ in ivs:
            self.indent -= 1
            self.line("}")

    def op_ttile_transpose(self, op):
        src = self.names[op.operands[0]]
        r = self.new_tile(op.results[0])
        m, n = src.shape           # r[j, i] = src[i, j], e = j * m + i
        if self.cuda:              # the elements split over the block's threads
            self.for_each(r.size, lambda e: self.line(
                f"{r.name}[{e}] = {src.name}[({e} % {m}) * {n} + {e} / {m}];"))
            return
        # On the CPU two loops, not one over r's elements with a div and mod
        # each: a 64x128 tile 7.5 -> 4.8 us (src read row by row, r written
        # with stride m; the other order and 8x8 blocks measured 5.7-6.3 us).
        i, j = self.fresh("i"), self.fresh("j")
        with self.loop(i, m):
            self.independent_iterations()
            self.line(f"for (int64_t {j} = 0; {j} < {n}; ++{j}) "
                      f"{r.name}[{j} * {m} + {i}] = {src.name}[{i} * {n} + {j}];")

    def op_ttile_iota(self, op):
        r = self.new_tile(op.results[0])
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        offset = self.scalar(op.operands[0])
        stride = math.prod(r.shape[dim + 1:])
        self.for_each(r.size, lambda e: self.line(
            f"{r.name}[{e}] = ({r.ctype})({offset} + ({e} / {stride}) % {r.shape[dim]});"))

    # arith.cmpi predicates, by enum value (eq, ne, slt, sle, sgt, sge, ult, ule, ugt, uge).
    _CMPI = ["==", "!=", "<", "<=", ">", ">=", "<", "<=", ">", ">="]

    def op_arith_cmpi(self, op):
        v = self.fresh("b")
        a, b = (self.scalar(x) for x in op.operands)
        sym = self._CMPI[ir.IntegerAttr(op.attributes["predicate"]).value]
        self.line(f"const bool {v} = {a} {sym} {b};")
        self.names[op.results[0]] = v

    def op_arith_andi(self, op):
        if ir.IntegerType(op.results[0].type).width != 1:
            self._index_binary(op, "&")
            return
        v = self.fresh("b")
        a, b = (self.scalar(x) for x in op.operands)
        self.line(f"const bool {v} = {a} && {b};")
        self.names[op.results[0]] = v

    def op_scf_if(self, op):
        """An `scf.if` without results over a scalar condition (the same for
        every thread of a kernel instance, so barriers inside it are safe)."""
        if len(op.results):
            raise EmitError("the kernel emitter supports scf.if only without results",
                            op.location)
        then, otherwise = ([o.operation for o in r.blocks[0].operations
                            if o.operation.name != "scf.yield"] if r.blocks else []
                           for r in op.regions)
        self.line(f"if ({self.scalar(op.operands[0])}) {{")
        for body in [then] + ([otherwise] if otherwise else []):
            if body is otherwise:
                self.line("} else {")
            self.indent += 1
            self.emit_ops(body)
            self.indent -= 1
        self.line("}")

    def op_arith_divui(self, op):
        self._index_binary(op, "/")

    def op_arith_remui(self, op):
        self._index_binary(op, "%")

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

    def op_ttile_return(self, op):
        pass

    def op_scf_for(self, op):
        lb, ub, step, *inits = op.operands
        carried = []
        for init, arg, res in zip(inits, op.regions[0].blocks[0].arguments[1:], op.results):
            t = self.new_tile(arg)
            src = self.names[init]
            self.for_each(t.size, lambda e, t=t, src=src: self.line(f"{t.name}[{e}] = {src.name}[{e}];"))
            self.names[res] = t
            carried.append(t)
        iv = self.fresh("k")
        self.names[op.regions[0].blocks[0].arguments[0]] = iv
        self.line(f"for (int64_t {iv} = {self.scalar(lb)}; {iv} < {self.scalar(ub)}; {iv} += {self.scalar(step)}) {{")
        self.indent += 1
        self.carried_stack = getattr(self, "carried_stack", []) + [carried]
        self.emit_ops(op.regions[0].blocks[0].operations)
        self.carried_stack.pop()
        self.indent -= 1
        self.line("}")

    def op_scf_yield(self, op):
        for t, v in zip(self.carried_stack[-1], op.operands):
            src = self.names[v]
            if src is t:                    # updated in place (a dot's accumulator)
                continue
            self.for_each(t.size, lambda e, t=t, src=src: self.line(f"{t.name}[{e}] = {src.name}[{e}];"))


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
