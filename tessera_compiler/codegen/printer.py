"""The part of the C++ (CPU) and CUDA printers that is the same on both
targets: C types of tile elements, tiles as named arrays, lines and loops,
the kernel's signature, and the ops both print alike (index arithmetic,
fills, loads and stores, elementwise ops, broadcasts, iota, scf).

`TilePrinter` walks a kernel's ops and calls `op_<name>`; the C++ printer
(`tile_emitter.KernelEmitter`) and the CUDA printer
(`cuda.CudaKernelEmitter`) each add what is theirs (the kernel's frame, the
C library's spelling, the CPU schedule or the GPU schedule) without target
flags.
"""

from __future__ import annotations

import abc
import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from tessera_mlir import ir
from tessera_runtime import random

from ..ir.cpu_schedule import placed_shape
from ..ir.ops import TILE_ELEMENTWISE
from ..ir.support import marked_args
from ..ir import types
from ..ir.types import tile_of

NVSHMEM_OPS = {"ttile.my_pe", "ttile.n_pes", "ttile.put", "ttile.get", "ttile.signal",
               "ttile.wait", "ttile.fence", "ttile.quiet"}
# Element type -> C type of a tile element. bf16 and FP8 tiles compute in
# float (every value rounded to the type's precision); their buffers hold the
# raw bits.
_CTYPES = {"f32": "float", "f64": "double", "f16": "_Float16", "bf16": "float",
           "f8E4M3FN": "float", "i32": "int32_t", "i64": "int64_t", "i8": "int8_t",
           "i1": "bool"}
_BUFFER_CTYPES = {**_CTYPES, "bf16": "uint16_t", "f8E4M3FN": "uint8_t"}
#: Storage-only float types (`types.STORED_AS_BITS`): (bits -> float, float
#: -> bits, round a float to the type) helpers, defined in
#: cpu/tessera_numerics.h.
_BIT_HELPERS = {"bf16": ("bf16_to_float", "float_to_bf16", "bf16_round"),
                "f8E4M3FN": ("f8e4m3_to_float", "float_to_f8e4m3", "f8e4m3_round")}
STORED_AS_BITS = {element: _BIT_HELPERS[element] for element in types.STORED_AS_BITS}


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
    #: a per-element scalar of a fused element loop (`ttile.fused`), not an
    #: array: only ops of that loop read it
    scalar: bool = False
    #: a pointer into a kernel argument, not an array of its own: a load read
    #: in place or a tile computed in the block its store writes
    #: (`ttile.in_place`)
    view: bool = False
    #: (computed in place) the key of the store that therefore copies nothing
    stored_by: int | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)


# Elementwise tile ops: one C expression of their operands' elements each,
# from the op table (`TilePrinter.expression`; the result element type is
# `ct`).
ELEMENTWISE_EXPRESSIONS = {name: e.c for name, e in TILE_ELEMENTWISE.items()}


@dataclass
class TilePrinter(abc.ABC):
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
        """A barrier between tile operations (the CUDA printer's; none here)."""

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
        """Tells the compiler the next element loop's iterations are
        independent (a hint only the C++ printer gives)."""

    def new_tile(self, value: ir.Value) -> Tile:
        shape, elt = tile_of(value.type)
        tile = Tile(self.fresh("t"), shape, ctype(elt, value.location), elt)
        self.tiles[tile.name] = tile
        self.names[value] = tile
        return tile

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

    # -- ops ---------------------------------------------------------------
    def emit_ops(self, ops) -> None:
        for op in ops:
            self.emit_op(op.operation)

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

    def _index_binary(self, op, sym, choose: bool = False):
        """`a sym b` of two index operands, or with `choose` the one of them
        it prefers (`a > b ? a : b`: maxsi)."""
        v = self.fresh("i")
        a, b = (self.scalar(x) for x in op.operands)
        self.line(f"const int64_t {v} = {a} {sym} {b}{f' ? {a} : {b}' if choose else ''};")
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
        if self.in_place_access(op, tile, buf, base, load):
            return
        # Nested loops, the innermost along contiguous memory, so the
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

    def in_place_access(self, op, tile: Tile, buf: str, base: str, load: bool) -> bool:
        """Whether a load or store at `base` of `buf` needs no copy (printed
        if so); the plain form copies."""
        return False

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

    def expression(self, op, xs: list[str]) -> str:
        """The C expression of elementwise `op` on operand elements `xs`."""
        ct = ctype(tile_of(op.results[0].type)[1], op.location)
        return ELEMENTWISE_EXPRESSIONS[op.name](self, op, ct, *xs)

    def element_value(self, op, result: Tile, e) -> str:
        """The C expression of element `e` of `op`'s result: an elementwise
        op of its operands' elements (a scalar operand is its own element),
        a fill's value, an iota's position or a dropout factor's (from the
        index alone: an element loop can compute them where they are read)."""
        if op.name == "ttile.fill":
            x = c_literal(ir.FloatAttr(op.attributes["value"]).value, result.ctype)
        elif op.name == "ttile.iota":
            dim = ir.IntegerAttr(op.attributes["dim"]).value
            stride = math.prod(result.shape[dim + 1:])
            x = f"({result.ctype})({self.scalar(op.operands[0])} + ({e} / {stride}) % " \
                f"{result.shape[dim]})"
        elif op.name == "ttile.dropout_factor":
            base = self.scalar(op.operands[2])
            s0, s1 = ir.DenseI64ArrayAttr(op.attributes["strides"])
            n = result.shape[1]
            x = self.dropout_factor(op, f"{base} + ({e} / {n}) * {s0} + ({e} % {n}) * {s1}")
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

    @abc.abstractmethod
    def math(self, fn: str, arg: str) -> str:
        """The C library's `fn` (each printer spells it)."""

    def fast(self, ct: str, fn: str, arg: str) -> str:
        """The printer's fastest accurate `fn` (the C library's here)."""
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
        self.for_each(r.size, lambda e: self.line(
            f"{r.name}[{e}] = {src.name}[({e} % {m}) * {n} + {e} / {m}];"))

    def op_ttile_iota(self, op):
        self._elementwise(op)

    def dropout_factor(self, op, index: str) -> str:
        """The C expression of `ttile.dropout_factor` `op` at flat element
        index expression `index` (tessera_numerics.h's dropout_keeps)."""
        seed, step, _ = (self.scalar(v) for v in op.operands)
        p = ir.FloatAttr(op.attributes["p"]).value
        ct = ctype(tile_of(op.results[0].type)[1], op.location)
        scale = c_literal(float(np.float32(1.0 / (1.0 - p))), ct)
        return (f"(dropout_keeps((uint64_t){seed}, (uint64_t){step}, (uint64_t)({index}), "
                f"{random.dropout_threshold(p)}u) ? {scale} : ({ct})0)")

    def op_ttile_dropout_factor(self, op):
        self._elementwise(op)

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

    def op_arith_maxsi(self, op):
        self._index_binary(op, ">", choose=True)

    def op_arith_minsi(self, op):
        self._index_binary(op, "<", choose=True)

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
