"""Builds Tile IR (`ttile`) at the current insertion point and location:
index constants, attributes, tile types, kernels and their grid offsets.

Shared by tessera-lower-to-tile and the kernel families it builds
(`tessera_passes.tile`: GEMMs, flash attention, the NVSHMEM GEMMs).
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import arith, ttile

from .support import i64
from .types import tile_type  # noqa: F401  (re-exported: the builders' tile types)

#: Threads per block of a kernel whose tiles are not split over warps.
THREADS_PER_BLOCK = 128


def largest_divisor(n: int, cap: int) -> int:
    """The largest divisor of `n` that is at most `cap`."""
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def index(v: int) -> ir.Value:
    """An `index` constant."""
    return arith.ConstantOp(ir.IndexType.get(), v).result


def i64_array(values) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get(list(values))


def new_kernel(name: str, arg_types, grid: int, threads: int, tile_sizes, module_block, loc,
               stages: int | None = None) -> tuple[ir.Operation, ir.Block]:
    """An empty `ttile.kernel` on buffers `arg_types` (a linear grid) and its
    entry block."""
    with ir.InsertionPoint(module_block), loc:
        k = ttile.KernelOp(name, ir.TypeAttr.get(ir.FunctionType.get(list(arg_types), [])),
                           i64_array([grid]), i64_array([threads]))
        k.attributes["ttile.tile_sizes"] = i64_array(tile_sizes)
        if stages:
            k.attributes["stages"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), stages)
        entry = k.body.blocks.append(*arg_types, arg_locs=[loc] * len(arg_types))
    return k.operation, entry


def mark_symmetric(kernel: ir.Operation, n_args: int, n_symmetric: int) -> None:
    """Marks the kernel's last `n_symmetric` arguments symmetric, the last
    also as signal words (the runtime zeroes them before each launch)."""
    unit, empty = ir.UnitAttr.get(), ir.DictAttr.get({})
    kernel.attributes["arg_attrs"] = ir.ArrayAttr.get(
        [empty] * (n_args - n_symmetric)
        + [ir.DictAttr.get({"ttile.symmetric": unit})] * (n_symmetric - 1)
        + [ir.DictAttr.get({"ttile.symmetric": unit, "ttile.signals": unit})])


def grid_offsets(counts: list[int], tile: list[int]) -> list[ir.Value]:
    """Element offsets of this instance's tile along each dimension: the linear
    program id enumerates the grid `counts` row-major."""
    pid = ttile.ProgramIdOp(i64(0)).result
    offsets = []
    for d, count in enumerate(counts):
        if count == 1:
            offsets.append(index(0))
            continue
        inner = 1
        for c in counts[d + 1:]:
            inner *= c
        idx = arith.DivUIOp(pid, index(inner)).result if inner > 1 else pid
        if any(c > 1 for c in counts[:d]):
            idx = arith.RemUIOp(idx, index(count)).result
        offsets.append(arith.MulIOp(idx, index(tile[d])).result if tile[d] != 1 else idx)
    return offsets
