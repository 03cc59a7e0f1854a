"""GEMM kernels in Tile IR: which configuration a GEMM gets, the order in
which its instances take output tiles, and its K loop.

A GEMM instance accumulates one `BM x BN` output tile over `K` in `BK`
steps with `ttile.dot` inside an `scf.for`. The configuration is part of
the Tile IR: tile sizes in the tile types, `warps` on the dot, `stages`
and `block` on the kernel (`GemmConfig`, from `TargetOptions.gemm_configs`).
Half-precision operands accumulate in f32, cast back after the loop.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tessera_mlir import ir
from tessera_mlir.dialects import arith, scf, ttile

from tessera_compiler.ir.options import GemmConfig, TargetOptions
from tessera_compiler.ir.tile_builder import (grid_offsets, i64_array, index, largest_divisor,
                                              tile_type)

SIMT_TILE_CAP = (32, 32, 32)         # BM, BN, BK for element types without tensor cores


def gemm_config(batch: int, m: int, n: int, k: int, element: str,
                options: TargetOptions) -> GemmConfig:
    """The tile configuration of a `batch x [m, k] x [k, n]` GEMM: the largest
    of `options.gemm_configs` (tensor cores) that divides the problem and
    still gives every SM a block (`options.target_blocks`), else the
    smallest that divides it; CUDA-core tiles (largest divisors up to 32)
    for other element types and shapes. Configurations that leave K at
    least two steps come first: canonicalization folds a one-step K loop
    into straight-line code, which the CUDA emitter runs from shared memory
    instead of its pipelined tensor-core main loop. `options.wgmma` false
    leaves out the wgmma configurations; `options.tma` false turns TMA off."""
    if element in ("bf16", "f16") and n % 8 == 0 and k % 8 == 0:
        configs = [cfg if options.tma else replace(cfg, tma=False)
                   for cfg in options.gemm_configs if options.wgmma or not cfg.wgmma]
        fitting = [cfg for cfg in configs
                   if m % cfg.bm == 0 and n % cfg.bn == 0 and k % cfg.bk == 0]
        fitting = [cfg for cfg in fitting if k >= 2 * cfg.bk] or fitting
        for cfg in fitting:
            if batch * (m // cfg.bm) * (n // cfg.bn) >= options.target_blocks:
                return cfg
        if fitting:
            return fitting[-1]
    return GemmConfig(*(largest_divisor(x, cap) for x, cap in zip((m, n, k), SIMT_TILE_CAP)))


def gemm_tile(cfg: GemmConfig, a_buf: ir.Value, b_buf: ir.Value, batch_offsets: list,
              row: ir.Value, col: ir.Value, out_elt: ir.Type) -> ir.Value:
    """The `[BM, BN]` output tile at (`row`, `col`) of `a_buf @ b_buf`: a loop
    over K accumulating `ttile.dot`s of `[BM, BK]` and `[BK, BN]` tiles (in
    f32 for half-precision operands), cast to `out_elt`. A wgmma loop loads
    both tiles with the tensor memory accelerator when `cfg.tma` allows and
    both buffers are kernel arguments (their tensor maps are built on the
    host) of rank 5 or less; with `cfg.producer` the kernel gets a producer
    warpgroup that issues those copies (one more warpgroup in its block)."""
    tma = cfg.tma and cfg.wgmma and all(
        isinstance(buf.owner, ir.Block) and len(ir.MemRefType(buf.type).shape) <= 5
        for buf in (a_buf, b_buf))
    if tma and cfg.producer:
        kernel = a_buf.owner.owner
        kernel.attributes["producer_warpgroup"] = ir.UnitAttr.get()
        kernel.attributes["block"] = i64_array([cfg.threads + 128])
    k = ir.MemRefType(a_buf.type).shape[-1]
    elt = ir.MemRefType(a_buf.type).element_type
    acc_elt = ir.F32Type.get() if str(elt) in ("bf16", "f16") else out_elt
    acc_t = tile_type([cfg.bm, cfg.bn], acc_elt)
    acc0 = ttile.FillOp(acc_t, ir.FloatAttr.get_f64(0.0)).result
    loop = scf.ForOp(index(0), index(k), index(cfg.bk), [acc0])
    with ir.InsertionPoint(loop.body):
        kk = loop.induction_variable
        a = ttile.LoadOp(tile_type([cfg.bm, cfg.bk], elt), a_buf, batch_offsets + [row, kk],
                         tma=tma or None).result
        b = ttile.LoadOp(tile_type([cfg.bk, cfg.bn], elt), b_buf, batch_offsets + [kk, col],
                         tma=tma or None).result
        warps = i64_array(cfg.warps) if cfg.warps else None
        scf.YieldOp([ttile.DotOp(a, b, loop.inner_iter_args[0], warps=warps,
                                 wgmma=cfg.wgmma or None).result])
    result = loop.results[0]
    if acc_elt != out_elt:
        result = ttile.CastOp(tile_type([cfg.bm, cfg.bn], out_elt), result).result
    return result


def gemm_group_rows(m_tiles: int, n_tiles: int, bm: int, bn: int, options: TargetOptions) -> int:
    """How many rows of output tiles a GEMM's instances sweep together
    (1: row-major order). The blocks running at once then cover a region of
    about `group` x target_blocks/group tiles, and it is square in elements
    (group * bm ~ target_blocks/group * bn) when group ~ sqrt(target_blocks *
    bn / bm): the least operand traffic per wave. Row-major order would read
    all of B every wave (128 MB at 8192^3 bf16, more than H100's 50 MB L2);
    a 16 x 8 region of 128x256 tiles reads 32 MB of A and 33 MB of B. The
    group divides the tile rows (no partial last group), and one wave's
    worth of tiles needs no order."""
    blocks = options.target_blocks
    if not options.grouped_tile_order or m_tiles * n_tiles <= blocks or n_tiles == 1:
        return 1
    return largest_divisor(m_tiles, round(math.sqrt(blocks * bn / bm)))


def gemm_offsets(batch: list[int], m_tiles: int, n_tiles: int, bm: int, bn: int,
                 options: TargetOptions) -> list[ir.Value]:
    """A GEMM instance's (batch..., row, column) offsets: batch-major, and
    within a batch entry output tiles in groups of `gemm_group_rows` tile
    rows, each group column by column (`grid_offsets`' row-major order
    when the group is one row)."""
    group = gemm_group_rows(m_tiles, n_tiles, bm, bn, options)
    if group == 1:
        return grid_offsets(batch + [m_tiles, n_tiles], [1] * len(batch) + [bm, bn])
    *at, tile = grid_offsets(batch + [m_tiles * n_tiles], [1] * (len(batch) + 1))
    per_group = index(group * n_tiles)
    first_row = arith.MulIOp(arith.DivUIOp(tile, per_group).result, index(group)).result
    in_group = arith.RemUIOp(tile, per_group).result
    row = arith.AddIOp(first_row, arith.RemUIOp(in_group, index(group)).result).result
    col = arith.DivUIOp(in_group, index(group)).result
    return at + [arith.MulIOp(row, index(bm)).result, arith.MulIOp(col, index(bn)).result]
