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
from .build import KERNEL_HEADER, PREAMBLE_END, dump_kernels
from .printer import EmitError, Tile, TilePrinter, ctype

#: The CPU kernels' extra symbols: NAME__range(args, pid0_begin, pid0_end),
#: NAME__grid (pid0's extent) and NAME__slice(void** args, begin, end), the
#: range with its arguments in an array, which the library's one
#: tessera_parallel(slice, args, grid, threads) splits over an OpenMP team
#: (the CPU engine's threaded launches). One parallel region per library,
#: not per kernel: g++ took ~0.4 s longer on the w128 step's 89 kernels with
#: a region in each.
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
        checks and did not vectorize (a fused GELU backward 1.5 -> 6.3 ms)."""
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
        # each: a 64x128 tile 7.5 -> 4.8 us (src read row by row, r written
        # with stride m; the other order and 8x8 blocks measured 5.7-6.3 us).
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


# bfloat16 <-> float by bit manipulation (round to nearest even), so the
# generated code needs no compiler support for a bf16 type.
BF16_HELPERS = """\
{q} inline float bf16_to_float(uint16_t h) {{
  uint32_t bits = (uint32_t)h << 16; float f; memcpy(&f, &bits, 4); return f;
}}
{q} inline uint16_t float_to_bf16(float f) {{
  uint32_t bits; memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);  // nan
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}}
{q} inline float bf16_round(float f) {{ return bf16_to_float(float_to_bf16(f)); }}
"""

# FP8 e4m3 (OCP "fn": bias 7, no infinities, S.1111.111 the only NaN, 448 the
# largest finite) <-> float by bit manipulation, rounding to nearest even as
# ml_dtypes does: a magnitude that rounds past 448 (inf included) is NaN.
FP8_HELPERS = """\
{q} inline float f8e4m3_to_float(uint8_t h) {{
  const uint32_t e = (h >> 3) & 15u, m = h & 7u;
  float v;
  if (e == 15u && m == 7u) {{
    const uint32_t nan_bits = 0x7fc00000u;
    memcpy(&v, &nan_bits, 4);
  }} else if (e == 0u) {{
    v = (float)m * 0.001953125f;                       // m * 2^-9
  }} else {{
    const uint32_t bits = ((e + 120u) << 23) | (m << 20);
    memcpy(&v, &bits, 4);
  }}
  return (h & 0x80u) ? -v : v;
}}
{q} inline uint8_t float_to_f8e4m3(float f) {{
  uint32_t bits; memcpy(&bits, &f, 4);
  const uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag >= 0x7f800000u) return sign | 0x7fu;          // nan, inf
  if (mag < 0x3c800000u) {{                              // below 2^-6: subnormal
    // a * 2^9 (exact) to the nearest integer, ties to even: adding 2^23
    // leaves no fraction bits (no libm call: NVRTC has no host builtins).
    float a; memcpy(&a, &mag, 4);
    const float q = (a * 512.0f + 8388608.0f) - 8388608.0f;
    return sign | (uint8_t)q;                            // 8 is 2^-6, a normal
  }}
  const uint32_t r = mag + 0x7ffffu + ((mag >> 20) & 1u);  // to 3 mantissa bits, even
  const uint32_t e = (r >> 23) - 120u, m = (r >> 20) & 7u;
  if (e > 15u || (e == 15u && m == 7u)) return sign | 0x7fu;  // past 448
  return sign | (uint8_t)((e << 3) | m);
}}
{q} inline float f8e4m3_round(float f) {{ return f8e4m3_to_float(float_to_f8e4m3(f)); }}
"""

# A kernel with `row_segments`: whether the `tile_rows` rows from `first` lie
# past the segments of their block (`per_block` sizes at block `first /
# height`); a band reaching into the next block runs.
SEGMENT_HELPERS = """\
{q} inline bool tessera_past_segments(const int32_t* sizes, int64_t per_block, int64_t height,
                                      int64_t first, int64_t tile_rows) {{
  const int64_t block = first / height;
  if ((first + tile_rows - 1) / height != block) return false;
  int64_t used = 0;
  for (int64_t s = 0; s < per_block; ++s) used += sizes[block * per_block + s];
  return first - block * height >= used;
}}
"""

# float exp and tanh the compiler can vectorize (glibc's expf/tanhf are calls
# it cannot), accurate to about 1.5 ulp (Cephes polynomials): a GELU or
# softmax kernel is otherwise dominated by scalar libm calls. IEEE edge cases
# (inf, -inf, nan, overflow, underflow) are kept by the final selects. The
# polynomials use explicit fused multiply-adds: -ffp-contract=off forbids the
# compiler's own, and an explicit fmaf rounds once on every machine (a call
# where the CPU lacks FMA, same bits), so results stay machine-independent;
# measured on Zen 3: exp 283 -> 219 us, tanh 506 -> 390 us per 256 Ki floats.
# tanh(|x|) = (1 - e) / (1 + e), e = exp(-2|x|) in (0, 1]: no overflow, and
# no cancellation where it is used (|x| >= 0.625).
_FAST_MATH = """\
static inline float tessera_exp(float x) {
  float c = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  float n = __builtin_rintf(c * 1.44269504088896341f);
  float r = __builtin_fmaf(n, 2.12194440e-4f, __builtin_fmaf(n, -0.693359375f, c));
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f); p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f); p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  p = __builtin_fmaf(p, r * r, r + 1.0f);
  int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;
  int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float y = p * __builtin_bit_cast(float, b1) * __builtin_bit_cast(float, b2);
  y = x > 88.7228394f ? INFINITY : y;
  y = x < -103.972f ? 0.0f : y;
  return x != x ? x : y;
}
static inline float tessera_tanh(float x) {
  float a = x < 0 ? -x : x;
  float z = x * x;
  float q = __builtin_fmaf(__builtin_fmaf(-5.70498872745e-3f, z, 2.06390887954e-2f), z,
                           -5.37397155531e-2f);
  q = __builtin_fmaf(__builtin_fmaf(q, z, 1.33314422036e-1f), z, -3.33332819422e-1f);
  float small = __builtin_fmaf(q * z, x, x);
  float e = tessera_exp(-2.0f * a);
  float big = (1.0f - e) / (1.0f + e);
  big = x < 0 ? -big : big;
  return a < 0.625f ? small : (x != x ? x : big);
}
"""

# r[M x N] += a[M x K] b[K x N] for float tiles (f32 and bf16), row-major.
# The plain i-k-j loop over a small constant shape is fully unrolled by
# GCC 12 and then SLP-vectorized into shuffles: about 3 GFLOP/s for the
# 16x32x16 dots of short-sequence attention, against about 60 for this one
# (Zen 3, AVX2). Here an MR x 8*NR block of r stays in vector registers for
# the whole k loop; every element still sums k = 0..K-1 in order.
_CPU_DOT = """\
typedef float tessera_v8 __attribute__((vector_size(32), aligned(4), may_alias));
template <int MR, int NR>
static inline void tessera_dot_block(const float* a, const float* b, float* r,
                                     int64_t K, int64_t N) {
  tessera_v8 c[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int q = 0; q < NR; ++q) c[i][q] = *(const tessera_v8*)&r[i * N + 8 * q];
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; ++k) {
    tessera_v8 bv[NR];
#pragma GCC unroll 8
    for (int q = 0; q < NR; ++q) bv[q] = *(const tessera_v8*)&b[k * N + 8 * q];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const float av = a[i * K + k];
#pragma GCC unroll 8
      for (int q = 0; q < NR; ++q) c[i][q] += av * bv[q];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int q = 0; q < NR; ++q) *(tessera_v8*)&r[i * N + 8 * q] = c[i][q];
}
template <int MR>
static inline void tessera_dot_rows(const float* a, const float* b, float* r,
                                    int64_t K, int64_t N) {
  int64_t j = 0;
  for (; j + 16 <= N; j += 16) tessera_dot_block<MR, 2>(a, b + j, r + j, K, N);
  for (; j + 8 <= N; j += 8) tessera_dot_block<MR, 1>(a, b + j, r + j, K, N);
  for (; j < N; ++j)
    for (int i = 0; i < MR; ++i)
      for (int64_t k = 0; k < K; ++k) r[i * N + j] += a[i * K + k] * b[k * N + j];
}
static inline void tessera_dot(const float* a, const float* b, float* r,
                               int64_t M, int64_t K, int64_t N) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) tessera_dot_rows<4>(a + i * K, b, r + i * N, K, N);
  switch (M - i) {
    case 3: tessera_dot_rows<3>(a + i * K, b, r + i * N, K, N); break;
    case 2: tessera_dot_rows<2>(a + i * K, b, r + i * N, K, N); break;
    case 1: tessera_dot_rows<1>(a + i * K, b, r + i * N, K, N); break;
  }
}
"""

_CPP_PRELUDE = """\
// Generated by Tessera from Tile IR (ttile). Do not edit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
""" + BF16_HELPERS.format(q="static") + FP8_HELPERS.format(q="static") + \
    SEGMENT_HELPERS.format(q="static") + _FAST_MATH + _CPU_DOT

# Defined once per library (after PREAMBLE_END: the first translation unit).
_TEAM = """\
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
// Set in a child forked from a process whose team ran: libgomp's threads
// are not in the child, and its first parallel region there would hang,
// so a forked child runs every launch on its one thread.
static int tessera_forked = 0;
static void tessera_mark_forked() { tessera_forked = 1; }
__attribute__((constructor)) static void tessera_watch_forks() {
  pthread_atfork(nullptr, nullptr, tessera_mark_forked);
}
static inline int tessera_team_size(int threads) { return tessera_forked ? 1 : threads; }
// [begin, end) of `grid` items for this member of an OpenMP team: contiguous
// slices in thread order, the same split for every call.
static inline void tessera_thread_slice(int64_t grid, int64_t* begin, int64_t* end) {
#ifdef _OPENMP
  const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
#else
  const int64_t t = 0, n = 1;
#endif
  *begin = grid * t / n;
  *end = grid * (t + 1) / n;
}
// pids [0, grid) of a kernel (its NAME__slice) in slices over the team.
typedef void (*tessera_slice_fn)(void**, int64_t, int64_t);
extern "C" void tessera_parallel(tessera_slice_fn slice, void** args, int64_t grid,
                                 int threads) {
#pragma omp parallel num_threads(tessera_team_size(threads))
  {
    int64_t begin, end;
    tessera_thread_slice(grid, &begin, &end);
    slice(args, begin, end);
  }
}
// The CPU engine's f32 GEMMs (the library routine matmul): numpy's OpenBLAS
// sgemm, called one-threaded by each member of the same OpenMP team the
// kernels use (the calling thread is one of them). One pool: OpenBLAS's own
// workers would spin on the core the team needs after every GEMM (a team
// member then waits a scheduler slice).
typedef void (*tessera_sgemm_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float*,
                                 int64_t, const float*, int64_t, float, float*, int64_t);
typedef int (*tessera_blas_threads_fn)(int);
static tessera_sgemm_fn tessera_sgemm;
static tessera_blas_threads_fn tessera_blas_threads;
// cblas_sgemm with 64-bit integers and openblas_set_num_threads_local.
extern "C" void tessera_use_sgemm(void* sgemm, void* set_threads) {
  tessera_sgemm = (tessera_sgemm_fn)sgemm;
  tessera_blas_threads = (tessera_blas_threads_fn)set_threads;
}
// C[M,N] = op(A) op(B), row-major, op = transpose where asked (A stored
// K x M, B stored N x K). C is cut into `pieces` blocks of rows (of columns
// unless `by_rows`), each one sgemm call; the pieces depend on the shape
// only, so the bits do not depend on the team's size (sgemm's own depend on
// M and N). Every block packs the operand it does not cut again.
//
// With an `epilogue` (a kernel's NAME__slice and its arguments; by rows
// only), the team member that wrote a block of rows runs the kernel's
// programs covering them (`rows` rows each) while they are in cache; where
// a block is not whole programs, the team runs them all after a barrier.
static void tessera_gemm_blocks(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                const float* a, const float* b, float* c, int64_t pieces,
                                int threads, bool by_rows, tessera_slice_fn epilogue,
                                void** args, int64_t rows) {
  const int64_t extent = by_rows ? M : N;
  const int64_t piece = ((extent + pieces - 1) / pieces + 15) / 16 * 16;
  const int64_t count = (extent + piece - 1) / piece;
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  const int ta = trans_a ? 112 : 111, tb = trans_b ? 112 : 111;   // CblasTrans, CblasNoTrans
  const bool per_block = epilogue && piece % rows == 0;
  // openblas_set_num_threads_local sets OpenBLAS's one (process-wide)
  // thread count and returns the previous: set here, before the team
  // starts, and restored after it, never by two threads at once.
  const int saved = tessera_blas_threads(1);
#pragma omp parallel num_threads(tessera_team_size(threads))
  {
    int64_t first, last;
    tessera_thread_slice(count, &first, &last);
    for (int64_t p = first; p < last; ++p) {
      const int64_t lo = p * piece, n = extent - lo < piece ? extent - lo : piece;
      if (by_rows)
        tessera_sgemm(101, ta, tb, n, N, K, 1.0f, a + (trans_a ? lo : lo * K), lda, b, ldb,
                      0.0f, c + lo * N, N);
      else
        tessera_sgemm(101, ta, tb, M, n, K, 1.0f, a, lda, b + (trans_b ? lo * K : lo), ldb,
                      0.0f, c + lo, N);
      if (per_block) epilogue(args, lo / rows, (lo + n) / rows);
    }
    if (epilogue && !per_block) {
#pragma omp barrier
      tessera_thread_slice(M / rows, &first, &last);
      epilogue(args, first, last);
    }
  }
  tessera_blas_threads(saved);
}
// Rows when N < M, or N = M with B not transposed; else columns (packing
// B^T costs more: ~15% less time for 256 x 256 x 128 with B^T cut by columns).
extern "C" void tessera_gemm_f32(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                 const float* a, const float* b, float* c, int64_t pieces,
                                 int threads) {
  tessera_gemm_blocks(trans_a, trans_b, M, N, K, a, b, c, pieces, threads,
                      M > N || (M == N && !trans_b), nullptr, nullptr, 1);
}
// The GEMM by rows, then `epilogue` over the programs of [0, M / rows) as
// each block of rows is written (tessera-fuse-gemm-epilogues).
extern "C" void tessera_gemm_f32_then(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                      const float* a, const float* b, float* c, int64_t pieces,
                                      int threads, tessera_slice_fn epilogue, void** args,
                                      int64_t rows) {
  tessera_gemm_blocks(trans_a, trans_b, M, N, K, a, b, c, pieces, threads, true, epilogue,
                      args, rows);
}
// Embedding rows on a table's block (a vocab-parallel rank's: global rows
// [first, first + rows) of `total`), float32 rows of `width`, int32 ids,
// both called as (rows in, ids, n, width, first, total, rows out, rows).
// Both return the position of the first id outside [0, total) having
// written nothing, else -1. Why in C: the host's numpy versions take ~10
// calls each (masks, sort, reduceat), ~0.3 ms of a w128 dp x tp rank's step.
//
// out[i] = table[ids[i] - first]; -0.0 where another rank holds the row
// (x + -0.0 == x for every x, so the sum over the ranks is exactly the row).
extern "C" int64_t tessera_gather_rows_f32(const float* table, const int32_t* ids, int64_t n,
                                           int64_t width, int64_t first, int64_t total,
                                           float* out, int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= total) return i;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = (int64_t)ids[i] - first;
    float* o = out + i * width;
    if (r >= 0 && r < rows) {
      std::memcpy(o, table + r * width, width * sizeof(float));
    } else {
      for (int64_t j = 0; j < width; ++j) o[j] = -0.0f;
    }
  }
  return -1;
}
// out[r] = the sum of the updates[i] with ids[i] - first == r, 0 for rows no
// id names, summed as the host's stable sort and np.add.reduceat sum a run:
// the first update plus the in-order sum of the others (the same bits for
// every split of the table).
extern "C" int64_t tessera_scatter_add_rows_f32(const float* updates, const int32_t* ids,
                                                int64_t n, int64_t width, int64_t first,
                                                int64_t total, float* out, int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= total) return i;
  std::memset(out, 0, rows * width * sizeof(float));
  // Per row: -2 no update yet, -1 one (in out), k >= 0 the others' sum is
  // rest[k * width, (k + 1) * width).
  std::vector<int64_t> slot(rows, -2);
  std::vector<float> rest;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = (int64_t)ids[i] - first;
    if (r < 0 || r >= rows) continue;
    const float* u = updates + i * width;
    if (slot[r] == -2) {
      std::memcpy(out + r * width, u, width * sizeof(float));
      slot[r] = -1;
    } else if (slot[r] == -1) {
      slot[r] = (int64_t)rest.size() / width;
      rest.insert(rest.end(), u, u + width);
    } else {
      float* t = rest.data() + slot[r] * width;
      for (int64_t j = 0; j < width; ++j) t[j] += u[j];
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (slot[r] < 0) continue;
    float* o = out + r * width;
    const float* t = rest.data() + slot[r] * width;
    for (int64_t j = 0; j < width; ++j) o[j] += t[j];
  }
  return -1;
}
// The library's transpose, slice and pad as one call: dst = src over a box
// of `extent` (rank <= 8) with byte strides per side, a pad first zeroing
// the `zero` bytes of its whole destination from `zero_from`. The innermost
// dimension is one memcpy where both sides are contiguous along it; the
// box's rows (every index but the innermost) are split over the team. Why in
// C: numpy copies a transposed view on one thread, and a w512 step's 32 head
// transposes (4 MiB each) took 17 ms.
static void tessera_copy_rows(const char* src, char* dst, int64_t rank, const int64_t* extent,
                              const int64_t* src_strides, const int64_t* dst_strides,
                              int64_t item, int64_t first, int64_t last) {
  const int64_t inner = extent[rank - 1], s_in = src_strides[rank - 1],
                d_in = dst_strides[rank - 1];
  int64_t index[8] = {0};
  for (int64_t d = rank - 2, r = first; d >= 0; --d) {      // the first row's index
    index[d] = r % extent[d];
    r /= extent[d];
    src += index[d] * src_strides[d];
    dst += index[d] * dst_strides[d];
  }
  for (int64_t r = first; r < last; ++r) {
    if (s_in == item && d_in == item)
      std::memcpy(dst, src, inner * item);
    else if (item == 4)                                       // a constant size: one move
      for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + j * d_in, src + j * s_in, 4);
    else
      for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + j * d_in, src + j * s_in, item);
    for (int64_t d = rank - 2; d >= 0; --d) {               // the next row
      src += src_strides[d];
      dst += dst_strides[d];
      if (++index[d] < extent[d]) break;
      src -= extent[d] * src_strides[d];
      dst -= extent[d] * dst_strides[d];
      index[d] = 0;
    }
  }
}
extern "C" void tessera_copy_box(const char* src, char* dst, int64_t rank, const int64_t* extent,
                                 const int64_t* src_strides, const int64_t* dst_strides,
                                 int64_t item, char* zero_from, int64_t zero, int threads) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < rank; ++d) rows *= extent[d];
  if (tessera_team_size(threads) <= 1) {      // no team to start for a small copy
    if (zero) std::memset(zero_from, 0, zero);
    tessera_copy_rows(src, dst, rank, extent, src_strides, dst_strides, item, 0, rows);
    return;
  }
#pragma omp parallel num_threads(tessera_team_size(threads))
  {
    int64_t first, last;
    if (zero) {
      tessera_thread_slice(zero, &first, &last);
      std::memset(zero_from + first, 0, last - first);
#pragma omp barrier
    }
    tessera_thread_slice(rows, &first, &last);
    tessera_copy_rows(src, dst, rank, extent, src_strides, dst_strides, item, first, last);
  }
}
// A value check (tgraph.check_range; the CPU engine's `check_range`): the
// position of the first of x[0, n) outside [low, high) that is not
// `allowed`, else -1. In U's arithmetic (mod 2^bits) an element is in range
// iff x - low < high - low, one comparison; the caller passes 0 < high -
// low < 2^bits (and `allowed` = low for none). Whole blocks of 4096 are
// OR-reduced first (a loop with no exit and a constant trip count, which
// GCC's -O2 vectorizes) and only a block holding a failing element is
// searched; the tail is searched directly.
template <typename T, typename U>
static int64_t tessera_first_outside(const T* x, int64_t n, int64_t low, int64_t high,
                                     int64_t allowed) {
  const U lo = (U)low, span = (U)((U)high - (U)low);
  const T other = (T)allowed;
  int64_t start = 0;
  for (; start + 4096 <= n; start += 4096) {
    const T* b = x + start;
    U bad = 0;
    for (int64_t i = 0; i < 4096; ++i)
      bad |= (U)((U)((U)b[i] - lo) >= span) & (U)(b[i] != other);
    if (bad) break;
  }
  for (int64_t i = start; i < n; ++i)
    if ((U)((U)x[i] - lo) >= span && x[i] != other) return i;
  return -1;
}
extern "C" int64_t tessera_check_range_i32(const int32_t* x, int64_t n, int64_t low,
                                           int64_t high, int64_t allowed) {
  return tessera_first_outside<int32_t, uint32_t>(x, n, low, high, allowed);
}
extern "C" int64_t tessera_check_range_i64(const int64_t* x, int64_t n, int64_t low,
                                           int64_t high, int64_t allowed) {
  return tessera_first_outside<int64_t, uint64_t>(x, n, low, high, allowed);
}
"""

def cpu_runtime_source() -> str:
    """What every emitted CPU source holds before its kernels: the shared
    preamble and, after PREAMBLE_END, the runtime part."""
    return _CPP_PRELUDE + PREAMBLE_END + _TEAM


def emit_cpp(module: ir.Module) -> str:
    """C++ for the CPU engine: one `extern "C"` function per ttile.kernel,
    the OpenMP team that runs their grids (tessera_parallel) and the
    engine's GEMM on it (tessera_gemm_f32, and tessera_gemm_f32_then with a
    kernel as its epilogue)."""
    kernels = [KernelEmitter().emit_kernel(kernel) for kernel in kernels_of(module)]
    dump_kernels(kernels, ".cpp")
    return "\n".join([cpu_runtime_source(), *kernels])
