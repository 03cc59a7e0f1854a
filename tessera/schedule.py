"""Schedule defaults (`tessera.schedule`, the performance guide's 7.7):

    schedule.all_reduce_overlap(True)   # gradient sync overlaps with compute
    schedule.pipeline_microbatches(8)   # microbatches of pipelined steps

Each sets the default for pipelined steps compiled afterwards (an explicit
argument of `pipeline.run` wins).
"""

from __future__ import annotations

from .pipeline import defaults


def pipeline_microbatches(n: int) -> None:
    """The number of microbatches of pipelined steps that do not say."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"schedule.pipeline_microbatches: expected a positive int, got {n!r}")
    defaults.microbatches = n


def all_reduce_overlap(enabled: bool = True) -> None:
    """Whether collectives (the gradients' all-reduce over `dp`) overlap the
    compute after them (the default), or each is waited for where it starts."""
    defaults.all_reduce_overlap = bool(enabled)
