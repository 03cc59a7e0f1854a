"""What one compiler pass buys the example GPT's training step on the CPU:
the step compiled with and without it in one process, called alternately
(the VM's drift between processes is larger than most passes' effect).

    .venv/bin/python bench/pass_ab_cpu.py tessera-fold-slices [--pairs 40]

Prints, per configuration (width 128 depth 2, 32 x 16 tokens, ten times the
pairs; width 512 depth 4, 32 x 64 tokens), the median step with and without
the pass and the median of the per-pair ratios. Results go to
bench/results/pass_ab_cpu-<pass>-<date>.json/.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in ("examples", "runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import numpy as np  # noqa: E402

from cpu_ranks import commit_and_date, write_results  # noqa: E402

#: (width, depth, heads, length, batch): the example GPT rows of issue 30's table
STEPS = [(128, 2, 4, 8, 32), (512, 4, 4, 32, 32)]
HEADER = ["| GPT step | tokens | pairs | with the pass (ms) | without (ms) | "
          "with / without (median of pairs) |", "|---|---|---:|---:|---:|---:|"]


def step_pairs(flag: str, width, depth, heads, length, batch, pairs: int, cache: Path) -> dict:
    """The example GPT's fp32 training step compiled with and without pass
    `flag` (separate kernel caches), called alternately `pairs` times each."""
    import train_gpt as ex
    import tessera as ts
    from tessera_compiler import lowering
    params = ex.init_params(width, depth, heads, 2 * length, 0)
    tokens = ex.make_batch(np.random.default_rng(0), batch, length)
    opt = ts.optim.AdamW(lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)
    scaler = ts.optim.loss_scale_init(1.0)
    stages = lowering.STAGES
    if not any(flag in flags for _, flags in stages):
        raise SystemExit(f"{flag} is not in the compiler's pipeline (tessera_compiler.lowering)")

    def compiled(with_pass: bool):
        os.environ["TESSERA_CACHE_DIR"] = str(cache / ("with" if with_pass else "without"))
        lowering.STAGES = stages if with_pass else [(s, [f for f in flags if f != flag])
                                                     for s, flags in stages]
        try:
            step, state = ex.make_step(opt, heads, "fp32", clip=1.0), opt.init(params)
            step(params, state, scaler, [tokens])               # compiles
        finally:
            lowering.STAGES = stages
        return lambda: step(params, state, scaler, [tokens])

    runs = {"with": compiled(True), "without": compiled(False)}
    times: dict = {"with": [], "without": []}
    for i in range(pairs):
        for name in ("with", "without") if i % 2 == 0 else ("without", "with"):
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    return {"width": width, "depth": depth, "tokens": f"{batch} x {2 * length}", "pairs": pairs,
            "with_ms": 1e3 * statistics.median(times["with"]),
            "without_ms": 1e3 * statistics.median(times["without"]),
            "ratio": statistics.median(a / b for a, b in zip(times["with"], times["without"]))}


def table(flag: str, pairs: int) -> tuple[list[str], list[dict]]:
    """Both configurations' rows (printed as they finish) and records."""
    print("\n".join(HEADER), flush=True)
    lines, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for width, depth, heads, length, batch in STEPS:
            n = pairs * (10 if width < 512 else 1)
            r = step_pairs(flag, width, depth, heads, length, batch, n, Path(tmp) / f"w{width}")
            lines.append(f"| w{width} d{depth} | {r['tokens']} | {n} | {r['with_ms']:.2f} | "
                         f"{r['without_ms']:.2f} | {r['ratio']:.3f} |")
            print(lines[-1], flush=True)
            rows.append(r)
    return lines, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("flag", help="the pass, as tessera-opt names it (tessera-fold-slices)")
    ap.add_argument("--pairs", type=int, default=40,
                    help="step pairs at w512 (10x as many at w128)")
    args = ap.parse_args(argv)
    lines, rows = table(args.flag, args.pairs)
    commit, today = commit_and_date()
    text = (f"# {args.flag} on the example GPT's CPU step, {today}, commit {commit}\n\n"
            f"Command: `.venv/bin/python bench/pass_ab_cpu.py {args.flag} --pairs {args.pairs}`. "
            "One process, the step compiled with and without the pass, called alternately.\n\n"
            + "\n".join(HEADER + lines))
    write_results(f"pass_ab_cpu-{args.flag}", commit, today, text, {"flag": args.flag,
                                                                     "rows": rows})
    print(f"written: bench/results/pass_ab_cpu-{args.flag}-{today}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
