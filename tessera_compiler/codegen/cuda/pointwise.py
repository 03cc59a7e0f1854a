"""Pointwise regions: consecutive pointwise ops over one iteration shape
(`ttile.region`, `ttile.domain`: tessera-gpu-place) printed as ONE loop in
which each thread computes whole elements in registers, so a fused GELU,
bias add or cast reads its inputs and writes its result once. A region
value something outside the region reads goes to its shared tile
(`ttile.smem`); a region over a tensor-core fragment loops over the
fragment's registers instead of the tile's elements; `ttile.spill` copies a
fragment to shared memory first."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_mlir import ir

from ...ir import gpu_schedule as gs
from ...ir.types import tile_of
from ..printer import ELEMENTWISE_EXPRESSIONS, STORED_AS_BITS, EmitError, Tile, c_literal, ctype
from .common import Fragment


@dataclass
class Region:
    """Pending pointwise ops over one iteration shape (`domain`): region
    `number` of tessera-gpu-place."""
    ops: list
    domain: list[int]
    fragment: Fragment | None = None
    number: int = -1


class PointwiseRegions:
    """Collects and prints pointwise regions (a CudaKernelEmitter part):
    `flush()` prints the pending one; `_value(v)` is `v` at the region's
    coordinates (a register, a fragment element or a shared tile's)."""

    def _add_to_region(self, op) -> None:
        """Pointwise `op` joins its region (`ttile.region`); a new region
        starts after the pending one is emitted, its fragments spilled
        first where `ttile.spill` says. Ops without a region are folded
        into the loop that reads them."""
        number = gs.region(op)
        if number is None:
            return
        if self.region is None or self.region.number != number:
            self.flush()
            self._spill_read(op.operands, op)
            domain = list(ir.DenseI64ArrayAttr(op.attributes[gs.DOMAIN]))
            self.region = Region([op], domain, None, number)
        else:
            self.region.ops.append(op)
        if self.region.fragment is None:
            self.region.fragment = next((self.frags[v] for v in op.operands if v in self.frags),
                                        None)

    def flush(self) -> None:
        """Emits the pending region as one loop over its domain."""
        region, self.region = self.region, None
        if region is None:
            return
        # Tiles dead before the region's first op make room for its outputs.
        if gs.flag(region.ops[0], gs.RELEASE):
            self._release()
        outside = [v for op in region.ops for v in op.results if gs.smem(v) is not None]
        domain = region.domain
        frag = region.fragment
        if frag is not None:
            coords = self._fragment_loop(frag)
        else:
            size = math.prod(domain)
            e = self.fresh("e")
            self.line(self.element_loop(e, size))
            self.indent += 1
            coords = []
            for d, n in enumerate(domain):
                stride = math.prod(domain[d + 1:])
                c = self.fresh("x")
                expr = "0" if n == 1 else (f"{e} / {stride}" if d == 0 else f"({e} / {stride}) % {n}")
                self.line(f"const int64_t {c} = {expr};")
                coords.append(c)
        self.coords, self.domain = coords, domain
        for op in region.ops:
            self._pointwise(op)
        for v in outside:
            t = self.new_tile(v)
            self._guarded(t.shape, f"{t.name}[{self._index(t.shape)}] = {self.scalars[v]};")
        self.scalars.clear()
        loops = 3 if frag is not None else 1
        for _ in range(loops):
            self.indent -= 1
            self.line("}")
        if outside:
            self.sync()

    def _fragment_loop(self, frag: Fragment) -> list[str]:
        mi, ni, q = self.fresh("mi"), self.fresh("ni"), self.fresh("q")
        for var, n in ((mi, frag.mt), (ni, frag.nt), (q, 4)):
            self.line("#pragma unroll")
            self.line(f"for (int {var} = 0; {var} < {n}; ++{var}) {{")
            self.indent += 1
        r, c = self.fresh("x"), self.fresh("x")
        self.line(f"const int64_t {r} = {frag.wm0} + 16 * {mi} + ({frag.lane} >> 2) + 8 * ({q} >> 1);")
        self.line(f"const int64_t {c} = {frag.wn0} + 8 * {ni} + 2 * ({frag.lane} & 3) + ({q} & 1);")
        self.frag_element = f"{frag.name}[{mi}][{ni}][{q}]"
        return [r, c]

    def _index(self, shape: list[int]) -> str:
        """Linear index into a tile of `shape` at the region's coordinates
        (size-1 dimensions of a broadcast tile use 0)."""
        terms = [f"{c} * {math.prod(shape[d + 1:])}" if math.prod(shape[d + 1:]) != 1 else c
                 for d, c in enumerate(self.coords) if shape[d] != 1]
        return " + ".join(terms) or "0"

    def _guarded(self, shape: list[int], statement: str) -> None:
        """`statement` by the threads at coordinate 0 of every dimension `shape`
        broadcasts over (one writer per element)."""
        conds = [f"{c} == 0" for c, s, n in zip(self.coords, shape, self.domain) if s == 1 and n > 1]
        self.line(f"if ({' && '.join(conds)}) {statement}" if conds else statement)

    def _value(self, v: ir.Value) -> str:
        if v in self.scalars:
            return self.scalars[v]
        if v in self.frags:
            return self.frag_element
        t = self.names[v]
        if isinstance(t, Tile):
            return f"{t.name}[{self._index(t.shape)}]"
        return t        # an index scalar

    def _define(self, v: ir.Value, expr: str) -> None:
        shape, elt = tile_of(v.type)
        ct = ctype(elt, v.location)
        name = self.fresh("v")
        if elt in STORED_AS_BITS:
            expr = f"{STORED_AS_BITS[elt][2]}({expr})"
        self.line(f"const {ct} {name} = {expr};")
        self.scalars[v] = name

    def _address(self, buf: str, tile_shape: list[int], offsets: list[str]) -> str:
        shape = self.buffers[buf]
        lead = len(shape) - len(tile_shape)
        coords = self.coords[len(self.coords) - len(tile_shape):]
        terms = []
        for d in range(len(shape)):
            stride = math.prod(shape[d + 1:])
            at = offsets[d]
            if d >= lead and tile_shape[d - lead] != 1:
                at = f"({at} + {coords[d - lead]})"
            terms.append(at if stride == 1 else f"{at} * {stride}")
        return " + ".join(terms) or "0"

    def _pointwise(self, op) -> None:
        name = op.name
        if name == "ttile.store":
            value, buf = self._value(op.operands[0]), self.names[op.operands[1]]
            shape = tile_of(op.operands[0].type)[0]
            addr = self._address(buf, shape, [self.scalar(v) for v in list(op.operands)[2:]])
            if self.buffer_elements[buf] in STORED_AS_BITS:
                value = f"{STORED_AS_BITS[self.buffer_elements[buf]][1]}({value})"
            self._guarded(shape, f"{buf}[{addr}] = {value};")
            return
        result = op.results[0]
        shape, elt = tile_of(result.type)
        if name == "ttile.load":
            buf = self.names[op.operands[0]]
            read = f"{buf}[{self._address(buf, shape, [self.scalar(v) for v in list(op.operands)[1:]])}]"
            self.scalars[result] = self.fresh("v")
            ct = ctype(elt, op.location)
            bits = STORED_AS_BITS.get(self.buffer_elements[buf])
            value = f"{bits[0]}({read})" if bits else read
            self.line(f"const {ct} {self.scalars[result]} = {value};")
            return
        if name == "ttile.fill":
            ct = ctype(elt, op.location)
            self._define(result, c_literal(ir.FloatAttr(op.attributes["value"]).value, ct))
            return
        if name == "ttile.iota":
            dim = ir.IntegerAttr(op.attributes["dim"]).value
            coord = self.coords[dim] if shape[dim] != 1 else "0"
            self._define(result, f"({ctype(elt)})({self.scalar(op.operands[0])} + {coord})")
            return
        if name == "ttile.dropout_factor":
            s0, s1 = ir.DenseI64ArrayAttr(op.attributes["strides"])
            row, col = self.coords[-2:]
            index = f"{self.scalar(op.operands[2])} + {row} * {s0} + {col} * {s1}"
            self._define(result, self.dropout_factor(op, index))
            return
        if name == "ttile.broadcast":
            # Every value is evaluated at the region's coordinates, and a tile's
            # size-1 dimensions ignore them: broadcasting is free.
            self.scalars[result] = self._value(op.operands[0])
            return
        if name not in ELEMENTWISE_EXPRESSIONS:
            raise EmitError(f"the CUDA emitter does not support '{name}'", op.location)
        self._define(result, self.expression(op, [self._value(v) for v in op.operands]))

    def _spill(self, v: ir.Value) -> None:
        """Writes a register fragment to a shared-memory tile (for a consumer
        that needs the whole tile: a reduction, a dot, a loop)."""
        frag = self.frags.pop(v)
        self.flush()
        coords = self._fragment_loop(frag)
        self.coords, self.domain = coords, frag.shape
        t = self.new_tile(v)
        self.line(f"{t.name}[{self._index(t.shape)}] = {self.frag_element};")
        for _ in range(3):
            self.indent -= 1
            self.line("}")
        self.sync()
