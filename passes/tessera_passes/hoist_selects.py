"""tessera-hoist-selects: a select moves up to where its operands are
last needed by anything else, so that it lands in the fused kernel that
computed them.

CPU target only (option `target`, else the module's `tessera.target`).
Runs on partitioned Graph IR, before tessera-lower-to-schedule, whose
launches tessera-lower-to-tile fuses only where they are consecutive. The
case it is for: a training step that skips non-finite steps
(`optim.where_finite`) selects between each new and old parameter (and
optimizer moment) after the whole optimizer update, so every `select` (and
the broadcast of the finite flag it reads) was a kernel of its own
re-reading a parameter-sized buffer the update had just written: 20 select
kernels and their broadcasts in the example GPT's step.

A select X moves to just after A, the last op before X that
produces one of X's operands or otherwise reads one (the reshapes,
broadcasts and fills making an operand do not count: they are copied along),
when:
  - A is tileable (not one of those cheap ops), so X fuses with it;
  - X was the last reader of one of its operands of X's result type: that
    operand now dies at X's new place, which pays for X's result being
    made earlier (the step's peak memory does not grow);
  - every operand made after A comes from a chain of `reshape` /
    `broadcast` / `fill` ops whose own operands exist at A; the chain is
    copied next to X (after CSE one reshape of the finite flag serves every
    select), and originals left without readers go;
  - A, X and the chain run on the same pipeline rank (one action).
Nothing with an effect is reordered: Graph IR ops are pure, X moves up past
ops that do not read its result, and collectives and transfers never move.
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.ir.ops import TILEABLE      # the ops a fused kernel computes
from tessera_compiler.ir.pipeline import ACTION
from tessera_compiler.ir.support import functions, operation_key, ops_of, run_reporting

#: the ops that move. Only selects: letting every elementwise op move (103
#: muls, 26 adds, ... in the example step) raised the step's planned peak
#: by 1.4% and fused nothing more than the selects did.
HOISTED = {"tgraph.select"}
#: cheap ops copied along with the op reading them
CARRIED = {"tgraph.reshape", "tgraph.broadcast", "tgraph.fill"}


def _producer(value: ir.Value):
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def _action(op: ir.Operation):
    return str(op.attributes[ACTION]) if ACTION in op.attributes else None


def _readers(value: ir.Value) -> list[ir.Operation]:
    return [u.owner.operation for u in value.uses]


def _carried(value: ir.Value, x: ir.Operation, anchor_at: tuple, at: dict, chain: dict) -> bool:
    """Whether `value` can be had just after the op at `anchor_at`:
    made at or before it, or by CARRIED ops (of `x`'s pipeline rank) whose
    operands are; those ops go into `chain` (key -> op), producers first."""
    owner = _producer(value)
    if owner is None or at[operation_key(owner)] <= anchor_at:
        return True
    if owner.name not in CARRIED or _action(owner) != _action(x):
        return False
    if not all(_carried(v, x, anchor_at, at, chain) for v in owner.operands):
        return False
    chain.setdefault(operation_key(owner), owner)
    return True


def _anchor(x: ir.Operation, at: dict):
    """The last op before `x` making or reading one of its operands
    (operands made by CARRIED ops aside), or None."""
    here, candidates = at[operation_key(x)], []
    for v in x.operands:
        owner = _producer(v)
        if owner is not None and owner.name in CARRIED:
            continue
        if owner is not None:
            candidates.append(owner)
        candidates += [r for r in _readers(v) if at[operation_key(r)] < here]
    return max(candidates, key=lambda op: at[operation_key(op)], default=None)


def _frees_an_operand(x: ir.Operation, at: dict) -> bool:
    """Whether `x` is the last reader of an operand of its result's type
    that a fused kernel made (a buffer of its own, freed after its last
    reader; arguments live on, and a reshape's result is a view)."""
    here, result = at[operation_key(x)], x.results[0].type
    for v in x.operands:
        owner = _producer(v)
        if v.type == result and owner is not None and owner.name in TILEABLE and \
                all(at[operation_key(r)] <= here for r in _readers(v)):
            return True
    return False


def _move(x: ir.Operation, at: dict, moves: int) -> bool:
    """Moves `x` after its anchor, with copies of the cheap ops making its
    other operands; False if it stays. `at` orders the block's ops (see
    `hoist_selects`) and is kept up to date; `moves` numbers this move."""
    anchor = _anchor(x, at)
    if anchor is None or _adjacent(at[operation_key(anchor)], at[operation_key(x)]):
        return False
    if anchor.name not in TILEABLE or anchor.name in CARRIED or \
            _action(anchor) != _action(x) or not _frees_an_operand(x, at):
        return False
    anchor_at = at[operation_key(anchor)]
    chain: dict = {}
    if not all(_carried(v, x, anchor_at, at, chain) for v in x.operands):
        return False
    copies: dict = {}                      # key of a chain op -> its copy
    previous = anchor
    for key, op in chain.items():
        copy = op.clone(ip=ir.InsertionPoint.after(previous))
        _rewire(copy, copies)
        copies[key] = previous = copy.operation
    _rewire(x, copies)
    x.move_after(previous)
    for op in reversed(chain.values()):
        if not any(True for r in op.results for _ in r.uses):
            del at[operation_key(op)]
            op.erase()
    # Just after the anchor, before whatever an earlier move put there.
    for j, op in enumerate([*copies.values(), x]):
        at[operation_key(op)] = anchor_at + (-moves, j)
    return True


def _adjacent(first: tuple, second: tuple) -> bool:
    """Whether nothing lies between two ops of the original order."""
    return len(first) == len(second) == 1 and first[0] + 1 == second[0]


def _rewire(op: ir.Operation, copies: dict) -> None:
    """Points `op`'s operands made by copied ops at the copies."""
    for i, v in enumerate(op.operands):
        owner = _producer(v)
        if owner is not None and operation_key(owner) in copies:
            op.operands[i] = copies[operation_key(owner)].results[ir.OpResult(v).result_number]


def hoist_selects(func_op: ir.Operation) -> int:
    """Hoists the function's selects; returns how many moved.

    The block's order is kept as tuples (recomputing indices after each move
    made the pass quadratic, a large share of the depth-8 example's compile): an
    original op is (i,); ops placed just after an op at p get p + (-m, j)
    for the m-th move, j in placement order, which sorts after p, before
    p's successor, and before what earlier moves placed after p."""
    moved = 0
    ops = ops_of(func_op)
    at = {operation_key(o): (i,) for i, o in enumerate(ops)}
    # Selects are never erased (only carried chain ops are), so the list of
    # them taken now stays valid while the block changes.
    for x in [o for o in ops if o.name in HOISTED]:
        if _move(x, at, moved + 1):
            moved += 1
    return moved


def run(op, pass_, options):
    # CPU target only: on the GPU the selects joined the optimizer update's
    # chains of every parameter into one 137-op kernel that spills registers.
    if options.resolved_target(op) == "cpu":
        run_reporting(op, pass_, lambda: [hoist_selects(f) for f in functions(op)])
