"""Mutated lit inputs through tessera-opt, in this one process (fast): each
mutant of a test/**/*.mlir case (lines deleted, duplicated or swapped,
integers, dimensions, types, SSA names and op names replaced, the text cut
short) goes through one pass or pipeline. Prints one JSON line per mutant
that did not end as a result or a diagnostic. test_fuzz_opt.py runs it and
notices a signal or a hang (OUT/current.json names the mutant then).

argv: SEED FIRST COUNT OUT_DIR"""

import io
import json
import os
import random
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import tessera_passes
from tessera_compiler import opt
from tessera_compiler.lowering import STAGES

REPO = Path(__file__).resolve().parents[3]
INTERNAL = ("internal error", "raised ", "Traceback", "LLVM ERROR", "Assertion", "UNREACHABLE")
PASSES = [f"--{flag}" for flag in tessera_passes.PASSES]


def _compile_pipeline(target: str) -> list[str]:
    """The compiler's own pass list (tessera_compiler.lowering.STAGES) for
    `target`, as one --pass-pipeline; passes with a target option get it."""
    flags = [f for stage, stage_flags in STAGES if stage != "gpu" or target == "gpu"
             for f in stage_flags]
    return ["--pass-pipeline=builtin.module(%s)" % ",".join(
        f"{f}{{target={target}}}" if f in tessera_passes.PASSES
        and "target" in tessera_passes.PASSES[f].options else f for f in flags)]


PIPELINES = [_compile_pipeline("cpu"), _compile_pipeline("gpu")]


def corpus() -> list[str]:
    cases = []
    for path in sorted((REPO / "test").rglob("*.mlir")):
        cases += [c for c in path.read_text().split("// -----") if c.strip()]
    return cases


def mutate(text: str, rng: random.Random, op_names: list[str]) -> str:
    lines = text.splitlines()
    kind = rng.randrange(9)
    i = rng.randrange(len(lines))
    if kind == 0:
        del lines[i]
    elif kind == 1:
        lines.insert(i, lines[i])
    elif kind == 2 and i + 1 < len(lines):
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif kind == 3:
        lines[i] = re.sub(r"\b\d+\b", lambda m: rng.choice(["0", "1", "-1", "7", "4096",
                                                              "99999999999"]), lines[i], count=1)
    elif kind == 4:
        lines[i] = re.sub(r"\b(\d+)x", lambda m: rng.choice(["0x", "1x", "3x", "?x"]), lines[i],
                          count=1)
    elif kind == 5:
        lines[i] = re.sub(r"\b(f32|bf16|f16|i32|i64|index)\b",
                          lambda m: rng.choice(["f32", "bf16", "i32", "i1", "index"]), lines[i])
    elif kind == 6:
        lines[i] = re.sub(r"%(\w+)", lambda m: "%" + rng.choice(["0", "1", "arg0", "arg1", "x"]),
                          lines[i], count=1)
    elif kind == 7 and op_names:
        lines[i] = re.sub(r"\b(tgraph|tsched|ttile)\.\w+", lambda m: rng.choice(op_names), lines[i],
                          count=1)
    else:
        cut = "\n".join(lines)
        return cut[:rng.randrange(len(cut) + 1)]
    return "\n".join(lines)


def main() -> None:
    seed, first, count, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    cases = corpus()
    op_names = sorted(set(re.findall(r"\b(?:tgraph|tsched|ttile)\.[a-z_]+\b", "\n".join(cases))))
    runs = [[p] for p in PASSES] + PIPELINES
    for n in range(first, first + count):
        rng = random.Random(seed * 1_000_003 + n)         # mutant n is the same in every process
        text = mutate(rng.choice(cases), rng, op_names)
        flags = rng.choice(runs)
        path = out / f"mutant_{n}.mlir"
        path.write_text(text)
        (out / "current.json").write_text(json.dumps({"n": n, "flags": flags}))
        stdout, stderr = io.StringIO(), io.StringIO()
        with redirect_stdout(stdout), redirect_stderr(stderr):
            rc = opt.main([str(path), *flags, "-o", os.devnull])
        err = stderr.getvalue()
        internal = [w for w in INTERNAL if w in err]
        if rc not in (0, 1) or internal or (rc == 1 and "error" not in err):
            print(json.dumps({"n": n, "flags": flags, "rc": rc, "stderr": err[-2000:]}), flush=True)
        else:
            path.unlink()
        print(json.dumps({"done": n, "rc": rc}), flush=True)


if __name__ == "__main__":
    main()
