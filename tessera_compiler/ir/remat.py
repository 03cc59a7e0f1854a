"""Recomputation regions in Graph IR: the `tgraph.remat = {region, policy}`
attribute the tracer puts on a region's ops (tessera.remat), the
`tgraph.recompute = region` mark on the copies tessera-autodiff makes, and
what each policy recomputes. One place for the tracer, the autodiff pass,
the memory plan and the memory budget."""

from __future__ import annotations

from tessera_mlir import ir

REMAT = "tgraph.remat"
RECOMPUTE = "tgraph.recompute"

#: Which forward ops the backward recomputes under each policy (the others
#: are kept); "none" marks a candidate region that keeps everything.
RECOMPUTED = {"none": lambda op: False,
              "selective": lambda op: op.name == "tgraph.attention",
              "dots_saveable": lambda op: op.name not in ("tgraph.matmul",
                                                          "tgraph.contract_rows"),
              "nothing_saveable": lambda op: True}


def _region(region: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), region)


def mark(op: ir.Operation, region: int, policy: str) -> None:
    """Puts `op` in recomputation region `region` with `policy`."""
    op.attributes[REMAT] = ir.DictAttr.get({"region": _region(region),
                                            "policy": ir.StringAttr.get(policy)})


def mark_copy(op: ir.Operation, region: int) -> None:
    """Marks `op` as autodiff's copy of a region-`region` op (no longer in it)."""
    del op.attributes[REMAT]
    op.attributes[RECOMPUTE] = _region(region)


def remat_of(op: ir.Operation) -> tuple[int, str] | None:
    """(region, policy) of an op in a recomputation region, else None."""
    if REMAT not in op.attributes:
        return None
    d = ir.DictAttr(op.attributes[REMAT])
    return ir.IntegerAttr(d["region"]).value, ir.StringAttr(d["policy"]).value
