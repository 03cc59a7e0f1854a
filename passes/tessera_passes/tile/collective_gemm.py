"""The interface of a GEMM fused with its collective over NVSHMEM (one
kernel per rank instead of a collective and a GEMM), and where an
instance of such a kernel sits: its output tile and its PE on the
collective's mesh axis.

tessera-lower-to-tile builds the kernel around the implementation's
`emit`: the elementwise ops after the matmul become its epilogue, run on
the tile `emit` returns. Implementations: `gathered_gemm.GatheredGemm`
(all_gather + matmul), `scattered_gemm.ScatteredGemm` (matmul +
reduce_scatter).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from tessera_mlir import ir
from tessera_mlir.dialects import arith, ttile

from tessera_compiler.ir.options import GemmConfig, TargetOptions
from tessera_compiler.ir.sharding import Mesh
from tessera_compiler.ir.tile_builder import i64, index


class CollectiveGemm(ABC):
    """A GEMM fused with a collective. `body` names the two tgraph ops of
    the tensor kernel it replaces (tessera-lower-to-schedule makes that
    kernel), in order; the first op given to `plan` and `emit` is the
    first of `body`."""
    body: tuple[str, str]

    @abstractmethod
    def plan(self, first: ir.Operation, second: ir.Operation, mesh: Mesh,
             options: TargetOptions) -> tuple[GemmConfig, list[ir.MemRefType]]:
        """(GEMM configuration, types of the symmetric buffers the kernel
        takes after its other arguments; the last one holds its signal
        words)."""

    @abstractmethod
    def emit(self, first: ir.Operation, second: ir.Operation, mesh: Mesh, cfg: GemmConfig,
             xs: ir.Value, ws: ir.Value, *symmetric: ir.Value
             ) -> tuple[ir.Value, ir.Value, ir.Value]:
        """The kernel's body up to its output tile, at the current insertion
        point, on the GEMM's operands `xs`, `ws` and the symmetric buffers.
        Returns (tile, row, col): the instance's `[BM, BN]` output tile (the
        matmul's element type) and its offsets, for the epilogue and the
        store that follow."""


@dataclass(frozen=True)
class Instance:
    """Where a fused GEMM's instance is: its linear id `pid` and output tile
    (`mi`, `ni`) in a row-major grid of tiles, and where its PE sits on the
    collective's mesh axis (`parts` ranks, `stride` PEs apart): coordinate
    `coord`, and `first_pe`, the PE at coordinate 0."""
    pid: ir.Value
    mi: ir.Value
    ni: ir.Value
    parts: int
    stride: int
    coord: ir.Value
    first_pe: ir.Value

    def pe_at(self, c: ir.Value) -> ir.Value:
        """The PE at coordinate `c` on the axis."""
        return arith.AddIOp(self.first_pe, arith.MulIOp(c, index(self.stride)).result).result


def instance(collective: ir.Operation, mesh: Mesh, n_tiles: int) -> Instance:
    """This instance's `Instance` (IR at the current insertion point), for a
    grid of `n_tiles` output tiles per row."""
    axis = ir.StringAttr(collective.attributes["axis"]).value
    parts = mesh.axis_size(axis)
    stride = math.prod(mesh.shape[mesh.axes.index(axis) + 1:])
    pid = ttile.ProgramIdOp(i64(0)).result
    mi = arith.DivUIOp(pid, index(n_tiles)).result if n_tiles > 1 else pid
    ni = arith.RemUIOp(pid, index(n_tiles)).result if n_tiles > 1 else index(0)
    pe = ttile.MyPeOp().result
    coord = arith.RemUIOp(arith.DivUIOp(pe, index(stride)).result, index(parts)).result
    first_pe = arith.SubIOp(pe, arith.MulIOp(coord, index(stride)).result).result
    return Instance(pid, mi, ni, parts, stride, coord, first_pe)
