"""What cross-entropy's target check (`tgraph.check_range`) costs a step on
the CPU: the same tiny loss and gradient steps traced with the check (as
built) and without it (`_primitives._checked_targets` passing the targets through),
called alternately in one process (the VM's drift between processes is
larger than the check), with and without ignore_index rows.

    .venv/bin/python bench/value_check_cpu.py [N ...] [--rounds 80]

Prints one JSON line per N (rows of N x 32 logits; default 256 4096): per
step kind, the best per-call time with and without the check and the median
(and quartiles) of the per-round differences, in microseconds. Run with
TESSERA_NUM_THREADS=1 for one thread's time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in ("runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import numpy as np  # noqa: E402

import tessera as ts  # noqa: E402
from tessera import _primitives, op  # noqa: E402

CALLS = 25          # calls per timed block


def _variants(make, x, t):
    """The step compiled with its check and without it."""
    with_check = make()
    with_check(x, t)
    real = _primitives._checked_targets
    _primitives._checked_targets = lambda t, *args: t
    try:
        without = make()
        without(x, t)
    finally:
        _primitives._checked_targets = real
    return with_check, without


def measure(n: int, rounds: int, classes: int = 32) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, classes)).astype(np.float32)
    t = rng.integers(0, classes, n).astype(np.int32)
    ignored = t.copy()
    ignored[::7] = -100
    out = {}
    for kind, make in (("loss", lambda: ts.jit(lambda x, t: op.cross_entropy(x, t))),
                       ("grad", lambda: ts.jit(lambda x, t: ts.grad(op.cross_entropy(x, t), x)))):
        on, off = _variants(make, x, t)
        for label, targets in (("", t), ("_ignore", ignored)):
            times = {"check": [], "nocheck": []}
            for f in (on, off):
                for _ in range(2 * CALLS):
                    f(x, targets)
            for r in range(rounds):
                pair = (("check", on), ("nocheck", off))
                for name, f in (pair if r % 2 else pair[::-1]):
                    start = time.perf_counter()
                    for _ in range(CALLS):
                        f(x, targets)
                    times[name].append((time.perf_counter() - start) / CALLS * 1e6)
            d = np.array(times["check"]) - np.array(times["nocheck"])     # paired by round
            out[kind + label] = {"check_min_us": round(min(times["check"]), 1),
                                 "nocheck_min_us": round(min(times["nocheck"]), 1),
                                 "diff_median_us": round(float(np.median(d)), 1),
                                 "diff_quartiles_us": [round(float(np.percentile(d, q)), 1)
                                                       for q in (25, 75)]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="*", type=int, default=[256, 4096])
    parser.add_argument("--rounds", type=int, default=80)
    args = parser.parse_args()
    for n in args.n:
        print(json.dumps({"rows": n, **measure(n, args.rounds)}), flush=True)


if __name__ == "__main__":
    main()
