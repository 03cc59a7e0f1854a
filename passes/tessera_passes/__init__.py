"""Tessera's compiler passes, one module per pass, registered lazily by flag.

Each pass is a Python function ``run(op, pass_)`` over the MLIR Python bindings
(``tessera_mlir``), where ``op`` is the operation the pass runs on (a
``builtin.module``) and ``pass_`` is the ``ExternalPass`` used to signal failure.
A pass that rejects its input emits an error diagnostic at the offending
operation's location and calls ``pass_.signal_pass_failure()``.

The registry maps a flag (``tessera-partition``) to its module and a one-line
summary; the module is imported only when the pass is used (as in xDSL), so
``tessera-opt --help`` stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class PassInfo:
    flag: str
    module: str
    summary: str

    def load(self) -> Callable:
        """The pass' ``run(op, pass_)`` function."""
        return importlib.import_module(f"{__name__}.{self.module}").run


_PASSES = [
    PassInfo("tessera-propagate-sharding", "propagate_sharding",
             "Give every tgraph value a sharding, starting from argument and result shardings"),
    PassInfo("tessera-partition", "partition",
             "SPMD-partition tgraph: per-rank local shapes, and the collectives the shardings imply"),
    PassInfo("tessera-lower-to-schedule", "lower_to_schedule",
             "Lower partitioned tgraph to tsched: buffers, kernel launches on a compute stream, async collectives on a comm stream"),
    PassInfo("tessera-lower-to-tile", "lower_to_tile",
             "Lower tsched kernels to ttile kernels: tiled matmul with fused elementwise epilogues, tiled elementwise"),
]

PASSES: dict[str, PassInfo] = {p.flag: p for p in _PASSES}


def get(flag: str) -> PassInfo:
    try:
        return PASSES[flag]
    except KeyError:
        known = ", ".join(sorted(PASSES))
        raise KeyError(f"unknown Tessera pass '{flag}' (known: {known})") from None
