"""Activation recomputation: `ts.remat`.

    @ts.remat                                  # or ts.remat(fn, policy=...)
    def block(p, x):
        return op.transformer_block(x, depth=1, params=[p], heads=4)

Ops traced inside a remat region are marked `tgraph.remat = {region, policy}`
in Graph IR; the tessera-autodiff pass does not keep the region's
intermediates for the backward but recomputes the region's forward right
before the region's backward (see passes/tessera_passes/autodiff.py). The
copies are the same kernels on the same inputs, so the loss and every
gradient keep the same bits. Policies (what is kept instead of recomputed):

  nothing_saveable  only the region's inputs (`True` and "full" mean this)
  dots_saveable     matmul products too: elementwise ops, norms and softmax
                    are recomputed
  selective         everything but attention's core (Megatron's selective
                    recomputation)
  auto              a candidate region: kept, unless the function is compiled
                    with `memory_budget=`, which picks a policy per candidate

Outside a compiled function `ts.remat(fn)` just calls `fn`.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

from tessera_compiler.ir.remat import REMAT, mark

from ._checks import check_callable
from ._source import user_frame
from ._trace import current
from .errors import ShapeError

POLICIES = ("nothing_saveable", "dots_saveable", "selective")
#: spellings accepted for a policy (None: no region)
_ALIASES = {True: "nothing_saveable", "full": "nothing_saveable", "auto": "none",
            False: None, None: None, "none": None,
            **{p: p for p in POLICIES}}


def policy_name(policy, what: str) -> str | None:
    """The Graph IR policy `policy` stands for ("none" for a candidate
    region, None for no region); a clear error for anything else."""
    try:
        return _ALIASES[policy]
    except (KeyError, TypeError):
        raise ShapeError(f"{what}: unknown remat policy {policy!r}; use one of "
                         f"{', '.join(POLICIES)}, 'full' (= nothing_saveable), 'auto' or None  "
                         f"[{user_frame()}]") from None


def remat(fn=None, *, policy="nothing_saveable"):
    """`fn` as a recomputation region: its forward is recomputed in the
    backward instead of kept (see the module's docstring for `policy`).
    A decorator (`@ts.remat`, `@ts.remat(policy="dots_saveable")`) or a call
    (`ts.remat(block, policy="selective")(params, x)`)."""
    name = policy_name(policy, "ts.remat")
    if fn is None:
        return lambda f: remat(f, policy=policy)
    check_callable("ts.remat", fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with region(name):
            return fn(*args, **kwargs)
    return wrapper


@contextmanager
def region(policy: str | None):
    """Marks the ops traced inside as one recomputation region with `policy`
    (a Graph IR name: see `policy_name`); nothing outside a trace, or for
    policy None. A nested region keeps its own marks."""
    state = current()
    if state is None or policy is None or (policy == "none" and not state.remat_candidates):
        yield
        return
    block = state.entry
    before = len(block.operations)
    number = state.remat_regions
    state.remat_regions += 1
    yield
    for op in list(block.operations)[before:]:
        op = op.operation
        if op.name.startswith("tgraph.") and len(op.results) and REMAT not in op.attributes:
            mark(op, number, policy)
