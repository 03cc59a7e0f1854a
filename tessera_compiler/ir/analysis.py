"""Facts about index arithmetic in Tile IR that lowering and code
generation rely on."""

from __future__ import annotations

from tessera_mlir import ir


def multiple_of(value: ir.Value, n: int) -> bool:
    """Whether index `value` is provably a multiple of `n` (constants, products
    with a multiple, sums of multiples, loop variables stepping by one)."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        parent = owner.owner.operation
        if parent.name == "scf.for" and value == owner.arguments[0]:
            lb, _, step = list(parent.operands)[:3]
            return multiple_of(lb, n) and multiple_of(step, n)
        return False
    op = owner.operation
    if op.name == "arith.constant":
        return ir.IntegerAttr(op.attributes["value"]).value % n == 0
    if op.name == "arith.muli":
        return any(multiple_of(v, n) for v in op.operands)
    if op.name in ("arith.addi", "arith.subi"):
        return all(multiple_of(v, n) for v in op.operands)
    return False
