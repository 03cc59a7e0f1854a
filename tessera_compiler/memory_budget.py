"""`memory_budget=`: choose which regions to recompute so the plan fits.

The candidates are the recomputation regions the trace marked with policy
`none` (every `op.transformer_block` layer, and `ts.remat(policy="auto")`
regions, when a function is compiled with a budget). Policies cost more
FLOPs in this order, per region: none < selective < dots_saveable <
nothing_saveable (each recomputes a superset of the previous one's ops).

The search is greedy over that order, exact on memory: each candidate
configuration is compiled to Tile IR and its memory plan read (no cost
model for bytes: the plan is the truth). With every candidate at one level
too large, it moves to the next level, and binary-searches the smallest
number k of regions (in forward order; the rest stay at the previous level)
whose peak fits: about log2(regions) + 1 compiles per level. Among the
configurations it considers, the first that fits recomputes the fewest
FLOPs (by the cost model: 2mnk per matmul, 4 B H S S' d per attention,
one per element otherwise). With every region at nothing_saveable still too
large, it fails with the smallest peak it reached and what holds it.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import OrderedDict
from dataclasses import dataclass

from tessera_mlir import ir

from .ir import graph_builder as gb
from .ir.options import TargetOptions
from .ir.pipeline import flops
from .ir.remat import RECOMPUTED, mark, remat_of
from .lowering import CompileError, Levels, lower

#: the policies in the order they cost recomputed FLOPs
LEVELS = ("none", "selective", "dots_saveable", "nothing_saveable")
#: planned peaks of recent configurations, by (program text, the regions'
#: policies, options): a
#: program searched again (another budget, another function of the same
#: step) plans each configuration once per process
_PEAKS: OrderedDict = OrderedDict()
_PEAKS_KEPT = 32
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(budget) -> int:
    """Bytes from an int or a string such as "6GiB", "512 MB", "1e9"."""
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        if budget <= 0:
            raise ValueError(f"memory_budget must be positive, got {budget}")
        return int(budget)
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(budget))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"memory_budget {budget!r}: give bytes, or a number with a unit "
                         f"(KiB, MiB, GiB, KB, MB, GB), e.g. '6GiB'")
    return parse_bytes(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass
class Choice:
    """The policy per candidate region, and what it cost to find."""
    policies: dict          # region -> policy
    peak: int               # the chosen configuration's planned peak (largest rank)
    recomputed_flops: float
    compiles: int

    def describe(self) -> str:
        by_policy: dict = {}
        for region, policy in sorted(self.policies.items()):
            by_policy.setdefault(policy, []).append(region)
        parts = [f"{p} for {len(rs)} region(s) {_ranges(rs)}" for p, rs in by_policy.items()]
        return (f"recomputation chosen for the memory budget: {'; '.join(parts)} "
                f"(planned peak {self.peak:,} B, {self.recomputed_flops:.3g} recomputed FLOPs, "
                f"{self.compiles} plans compared)")


def _ranges(xs: list) -> str:
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def candidates(module: ir.Module) -> dict:
    """{region: its ops} of the regions marked policy `none`, in forward order."""
    regions: dict = {}
    for f in module.body.operations:
        f = f.operation
        if f.name != "func.func" or not f.regions[0].blocks:
            continue
        for op in f.regions[0].blocks[0].operations:
            op = op.operation
            marked = remat_of(op)
            if marked is not None and marked[1] == "none":
                regions.setdefault(marked[0], []).append(op)
    return regions


def _cost(op: ir.Operation) -> float:
    if op.name == "tgraph.attention":      # (the pipeline model counts its output only)
        q, k = (ir.RankedTensorType(v.type).shape for v in list(op.operands)[:2])
        return 4.0 * math.prod(q) * k[gb.seq_dim_of(op)]
    return flops(op)


def recompute_flops(ops: list, policy: str) -> float:
    """FLOPs a region's backward recomputes under `policy`."""
    return sum(_cost(op) for op in ops if RECOMPUTED[policy](op))


def _with_policies(module: ir.Module, policies: dict) -> ir.Module:
    """A copy of `module` with the candidate regions' policies set."""
    copy = ir.Module.parse(module.operation.get_asm(enable_debug_info=True), module.context)
    _set(copy, candidates(copy), policies)
    return copy


def choose(module: ir.Module, options: TargetOptions, budget: int, progress=None) -> Choice:
    """Sets the candidate regions' policies in `module` (Graph IR) so that
    its planned peak fits `budget` bytes at the least recomputed FLOPs of
    the configurations searched (see the module docstring); CompileError
    when none fits. `progress(text)` hears of each plan compiled."""
    regions = candidates(module)
    order = sorted(regions)
    compiles = 0
    program = hashlib.sha256(
        module.operation.get_asm(enable_debug_info=True).encode()).hexdigest()

    def peak_of(policies: dict) -> tuple[int, Levels]:
        nonlocal compiles
        compiles += 1
        key = (program, tuple(sorted(policies.items())), options)
        if key in _PEAKS:
            _PEAKS.move_to_end(key)
            peak, levels = _PEAKS[key]
        else:
            levels = lower(_with_policies(module, policies), options, plan_only=True)
            peak = max((p.peak for p in levels.memory.values()), default=0)
            _PEAKS[key] = (peak, levels)
            while len(_PEAKS) > _PEAKS_KEPT:
                _PEAKS.popitem(last=False)
        if progress is not None:
            progress(f"memory budget: plan {compiles}: peak {peak:,} B "
                     f"({', '.join(sorted(set(policies.values()))) or 'none'})")
        return peak, levels

    def config(level: int, k: int) -> dict:
        return {r: LEVELS[level] if i < k else LEVELS[level - 1] for i, r in enumerate(order)}

    def finish(policies: dict, peak: int) -> Choice:
        _set(module, regions, policies)
        cost = sum(recompute_flops(regions[r], p) for r, p in policies.items())
        return Choice(policies, peak, cost, compiles)

    none = {r: "none" for r in order}
    peak, levels = peak_of(none)
    if peak <= budget:
        return finish(none, peak)
    for level in range(1, len(LEVELS)):
        if not order:
            break
        full_peak, full_levels = peak_of(config(level, len(order)))
        if full_peak > budget:
            peak, levels = full_peak, full_levels
            continue
        lo, hi, best = 0, len(order), (len(order), full_peak)   # smallest k that fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            p, _ = peak_of(config(level, mid))
            if p <= budget:
                hi, best = mid, (mid, p)
            else:
                lo = mid
        return finish(config(level, best[0]), best[1])
    plans = "\n".join(str(p) for p in levels.memory.values())
    what = (f"every one of the {len(order)} candidate region(s) recomputed (nothing_saveable)"
            if order else "no region to recompute: mark some with ts.remat(fn, policy='auto') "
            "or use op.transformer_block")
    raise CompileError(f"memory_budget {budget:,} B cannot be met: the smallest planned peak is "
                       f"{peak:,} B, with {what}. What holds it:\n{plans}")


def apply(module: ir.Module, choice: Choice) -> None:
    """Sets the policies of an earlier `choose` on another trace of the same program."""
    _set(module, candidates(module), choice.policies)


def _set(module: ir.Module, regions: dict, policies: dict) -> None:
    for region, ops in regions.items():
        for op in ops:
            mark(op, region, policies.get(region, "none"))
