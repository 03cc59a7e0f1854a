"""`ttile.dot` outside a GEMM main loop, and the tensor-core building blocks
the loops share: warp accumulators in mma.sync's fragment layout, ldmatrix
operand loads, the mma tiles of one k step.

A dot tessera-gpu-software-pipeline placed as a `fragment` runs on tensor cores from
its shared-memory operands; any other on CUDA cores (`ttile.fallback`: why)."""

from __future__ import annotations

from tessera_mlir import ir

from ...ir import gpu_schedule as gs
from .common import Fragment


class TensorCoreDots:
    """Tensor-core helpers and the `ttile.dot` printer (a CudaKernelEmitter part)."""

    def _warp_accumulator(self, m: int, n: int, wm: int, wn: int) -> tuple[str, str, str, str]:
        """Declares an `m x n` f32 accumulator split over `wm x wn` warps in
        mma fragment layout (`acc[mt][nt][4]`, see Fragment), with this
        thread's lane and its warp's first row and column; returns their names."""
        acc, lane, wm0, wn0 = (self.fresh(x) for x in ("acc", "lane", "wm", "wn"))
        self.line(f"const int {lane} = threadIdx.x & 31;")
        self.line(f"const int {wm0} = ((threadIdx.x >> 5) / {wn}) * {m // wm}, "
                  f"{wn0} = ((threadIdx.x >> 5) % {wn}) * {n // wn};")
        self.line(f"float {acc}[{m // wm // 16}][{n // wn // 8}][4];")
        return acc, lane, wm0, wn0

    def mma_tiles(self, mma: str, acc: str, mt: int, nt: int) -> None:
        """acc[mi][ni] += af[mi] x bf[ni] for every mma tile of the warp."""
        self.line("#pragma unroll")
        self.line(f"for (int mi = 0; mi < {mt}; ++mi)")
        self.line("#pragma unroll")
        self.line(f"  for (int ni = 0; ni < {nt}; ++ni) {mma}({acc}[mi][ni], af[mi], bf[ni]);")

    def load_a_fragments(self, smem: str, ld: int, k0: str, m0: str, lane: str, mt: int) -> None:
        """`af[mt][4]`: the mma A fragments of the k step starting at `k0`,
        for rows `m0` on, from a bf16 shared-memory tile (m x k, row pitch
        `ld`), one ldmatrix.x4 per 16 rows."""
        self.line("#pragma unroll")
        self.line(f"for (int mi = 0; mi < {mt}; ++mi) tessera_ldmatrix_x4(af[mi], {smem} + "
                  f"({m0} + 16 * mi + ({lane} & 15)) * {ld} + {k0} + ({lane} >> 4) * 8);")

    def load_b_fragments(self, smem: str, ld: int, k0: str, n0: str, lane: str, nt: int,
                          transposed: bool) -> None:
        """`bf[nt][2]`: the mma B fragments of the k step starting at `k0`, for
        columns `n0` on, from a bf16 shared-memory tile with row pitch `ld`,
        16 columns per ldmatrix.x4. The tile is k x n (read with .trans) or,
        `transposed`, n x k: its rows are B's columns, as ldmatrix reads them."""
        self.line("#pragma unroll")
        self.line(f"for (int nj = 0; nj < {nt // 2}; ++nj) {{")
        if transposed:
            self.line(f"  uint32_t r[4]; tessera_ldmatrix_x4(r, {smem} + ({n0} + nj * 16 + (({lane} >> 4) << 3) "
                      f"+ ({lane} & 7)) * {ld} + {k0} + (({lane} >> 3) & 1) * 8);")
        else:
            self.line(f"  uint32_t r[4]; tessera_ldmatrix_x4_trans(r, {smem} + ({k0} + ({lane} & 15)) * {ld} "
                      f"+ {n0} + nj * 16 + ({lane} >> 4) * 8);")
        self.line("  bf[2 * nj][0] = r[0]; bf[2 * nj][1] = r[1]; "
                  "bf[2 * nj + 1][0] = r[2]; bf[2 * nj + 1][1] = r[3];")
        self.line("}")

    # -- dot on tensor cores from shared-memory tiles ------------------------------
    def _tile_mma(self, op) -> None:
        """acc + a x b on tensor cores, operands read from their shared-memory
        tiles into mma fragments (bf16 pairs packed per thread as the PTX ISA
        lays out m16n8k16), the result left in registers as a Fragment."""
        a, b, c = (self.names[v] for v in list(op.operands)[:3])
        (m, k), (_, n) = a.shape, b.shape
        wm, wn = list(ir.DenseI64ArrayAttr(op.attributes["warps"]))
        mt, nt = m // wm // 16, n // wn // 8
        self.line(f"// ttile.dot {m}x{n}x{k} on tensor cores (mma.sync.m16n8k16) from shared memory, "
                  f"warps {wm}x{wn}")
        acc, lane, wm0, wn0 = self._warp_accumulator(m, n, wm, wn)
        g, t = f"({lane} >> 2)", f"({lane} & 3)"
        self.line("#pragma unroll")
        self.line(f"for (int mi = 0; mi < {mt}; ++mi)")
        self.line("#pragma unroll")
        self.line(f"  for (int ni = 0; ni < {nt}; ++ni)")
        self.line("#pragma unroll")
        self.line(f"    for (int q = 0; q < 4; ++q) {acc}[mi][ni][q] = {c.name}[({wm0} + 16 * mi + "
                  f"{g} + 8 * (q >> 1)) * {n} + {wn0} + 8 * ni + 2 * {t} + (q & 1)];")
        self.line("#pragma unroll")
        self.line(f"for (int kk = 0; kk < {k}; kk += 16) {{")
        self.indent += 1
        self.line(f"uint32_t af[{mt}][4], bf[{nt}][2];")
        self.line("#pragma unroll")
        self.line(f"for (int mi = 0; mi < {mt}; ++mi)")
        self.line("#pragma unroll")
        self.line("  for (int r = 0; r < 4; ++r) {")
        self.line(f"    const float* p = {a.name} + ({wm0} + 16 * mi + {g} + 8 * (r & 1)) * {k} + "
                  f"kk + 2 * {t} + 8 * (r >> 1);")
        self.line("    af[mi][r] = tessera_pack_bf16(p[0], p[1]);")
        self.line("  }")
        self.line("#pragma unroll")
        self.line(f"for (int ni = 0; ni < {nt}; ++ni)")
        self.line("#pragma unroll")
        self.line("  for (int r = 0; r < 2; ++r) {")
        self.line(f"    const float* p = {b.name} + (kk + 2 * {t} + 8 * r) * {n} + {wn0} + 8 * ni + {g};")
        self.line(f"    bf[ni][r] = tessera_pack_bf16(p[0], p[{n}]);")
        self.line("  }")
        self.mma_tiles("tessera_mma_bf16", acc, mt, nt)
        self.indent -= 1
        self.line("}")
        self.frags[op.results[0]] = Fragment(acc, [m, n], mt, nt, wm0, wn0, lane)

    # -- dot (SIMT): each thread computes whole output elements ---------------------
    def op_ttile_dot(self, op):
        if gs.place(op.results[0]) == "fragment":       # tessera-gpu-software-pipeline: tensor cores
            self._tile_mma(op)
            return
        why = gs.fallback(op)
        a, b, acc = (self.names[v] for v in list(op.operands)[:3])
        r = self.new_tile(op.results[0])
        M, K = a.shape
        N = b.shape[1]
        acc_t = r.ctype
        self.line(f"// ttile.dot {M}x{N}x{K} on CUDA cores" + (f": {why}" if why else ""))

        def body(e):
            self.line(f"const int64_t i = {e} / {N}, j = {e} % {N};")
            self.line(f"{acc_t} s = {acc.name}[{e}];")
            self.line(f"for (int64_t k = 0; k < {K}; ++k) s += ({acc_t}){a.name}[i * {K} + k] * "
                      f"({acc_t}){b.name}[k * {N} + j];")
            self.line(f"{r.name}[{e}] = s;")
        self.for_each(M * N, body)
