"""`ttile.reduce`: cooperative reductions of a shared-memory tile, each
output split over a group of lanes combined with warp shuffles."""

from __future__ import annotations

import math

from tessera_mlir import ir

from ...ir.types import enum_of
from .common import REDUCE


class Reductions:
    """The `ttile.reduce` printer (a CudaKernelEmitter part)."""

    def op_ttile_reduce(self, op):
        src = self.names[op.operands[0]]
        r = self.new_tile(op.results[0])
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        kind = enum_of(op)
        identity, combine = REDUCE[kind]
        inner = math.prod(src.shape[dim + 1:])
        n, outs = src.shape[dim], r.size
        # Lanes per output: a power of two up to a warp, so the partial results
        # combine with shuffles; every thread runs the same number of passes
        # (the shuffles need the whole warp).
        group = 1
        if r.ctype in ("float", "double") and self.threads % 32 == 0:
            while group < 32 and group * 2 <= n and outs * group * 2 <= self.threads:
                group *= 2
        per_pass = self.threads // group
        ct = r.ctype
        self.line(f"for (int64_t base = 0; base < {outs}; base += {per_pass}) {{")
        self.indent += 1
        self.line(f"const int64_t o = base + threadIdx.x / {group};")
        self.line(f"const int64_t lane_g = threadIdx.x % {group};")
        self.line(f"{ct} a = {identity if ct in ('float', 'double') else '0'};")
        self.line(f"if (o < {outs}) {{")
        self.indent += 1
        self.line(f"const int64_t outer = o / {inner}, in = o % {inner};")
        if ct not in ("float", "double"):       # integers: start from the first element
            self.line(f"a = {src.name}[outer * {n * inner} + in];")
            self.line(f"for (int64_t q = 1; q < {n}; ++q) {{ const {ct} b = "
                      f"{src.name}[outer * {n * inner} + q * {inner} + in]; a = {combine}; }}")
        else:
            self.line(f"for (int64_t q = lane_g; q < {n}; q += {group}) {{ const {ct} b = "
                      f"{src.name}[outer * {n * inner} + q * {inner} + in]; a = {combine}; }}")
        self.indent -= 1
        self.line("}")
        if group > 1:
            self.line(f"for (int off = {group // 2}; off > 0; off >>= 1) {{ "
                      f"const {ct} b = __shfl_xor_sync(0xffffffffu, a, off); a = {combine}; }}")
        self.line(f"if (o < {outs} && lane_g == 0) {r.name}[o] = a;")
        self.indent -= 1
        self.line("}")
        self.sync()
