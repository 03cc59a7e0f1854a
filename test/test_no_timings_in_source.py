"""No measured timings in the compiler's, passes', runtime's and bench
scripts' docstrings and comments (nor in the dialects' C++ comments): a
docstring says why the code is as it is; how fast it was once goes to
bench/results/, where a command reproduces it (docs/architecture.md, the
decisions document, keeps its measured numbers). Caught: a before -> after
figure ("6.5 -> 4.1 ms"), a comparison ("4.8 vs 6.7 s", "0.7 us instead of
1.1") and a "measured ... N ms" sentence; a plain cost ("~1 us") or a
format string is none."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ["tessera_compiler", "passes", "runtime", "dialects"]

_NUM = r"~?\d+(?:\.\d+)?"
_UNIT = r"(?:ms|us|µs|ns|s)\b"
TIMING = re.compile(
    rf"{_NUM} ?(?:{_UNIT})? ?(?:->|→) ?{_NUM} ?{_UNIT}"                # 6.5 -> 4.1 ms
    rf"|{_NUM} ?{_UNIT} (?:vs\.?|instead of|against) {_NUM}"           # 0.7 us instead of 1.1
    rf"|{_NUM} (?:vs\.?|instead of|against) {_NUM} ?{_UNIT}"            # 4.8 vs 6.7 s
    rf"|\b[Mm]easured\b[^.;]{{0,80}}?{_NUM} ?(?:{_UNIT}|µs)")          # measured: 3.2 ms

_MARKERS = re.compile(r"(?:\s|#:?|//)+")

def _python_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring and every run of comment lines."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    run, start, last = [], 0, -2
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            if tok.start[0] != last + 1 and run:
                out.append((start, " ".join(run)))
                run = []
            if not run:
                start = tok.start[0]
            run.append(tok.string.lstrip("#:").strip())
            last = tok.start[0]
    if run:
        out.append((start, " ".join(run)))
    return out


def _cpp_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every run of `//` comment lines."""
    out, run, start = [], [], 0
    for i, line in enumerate(text.splitlines() + [""], 1):
        comment = line.strip().startswith("//")
        if comment:
            if not run:
                start = i
            run.append(line.strip().lstrip("/").strip())
        elif run:
            out.append((start, " ".join(run)))
            run = []
    return out


def timings(root: Path = REPO) -> list[tuple[str, int, str]]:
    """(file, line, timing) of every timing in the scanned source's prose."""
    files = [f for d in SCANNED for f in sorted((root / d).rglob("*"))] + \
        sorted((root / "bench").glob("*.py"))
    found = []
    for f in files:
        if "_mlir" in f.relative_to(root).parts or "build" in f.relative_to(root).parts[:1]:
            continue
        if f.suffix not in (".py", ".td", ".cpp", ".h", ".cuh"):
            continue
        source = f.read_text(encoding="utf-8")
        # Only a file whose text holds a timing at all (comment markers
        # dropped, lines joined) can hold one in its prose: parse only those.
        if not TIMING.search(_MARKERS.sub(" ", source)):
            continue
        prose = (_python_prose if f.suffix == ".py" else _cpp_prose)(source)
        for line, text in prose:
            text = " ".join(text.split())
            found += [(f.relative_to(root).as_posix(), line, m.group(0)) for m in TIMING.finditer(text)]
    return found


def test_no_measured_timings_in_docstrings_or_comments():
    found = timings()
    new = [f"{f}:{line}: {t!r}" for f, line, t in found]
    assert not new, ("measured timings in docstrings or comments: move each to a file in "
                     "bench/results/ (e.g. the one the bench wrote) and say why, not how "
                     "fast:\n" + "\n".join(new))


def test_the_pattern_catches_timings_and_spares_plain_costs(tmp_path):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "m.py").write_text(
        '"""Fused: 6.5 -> 4.1 ms at w512."""\n'
        "def f():\n"
        '    """A copy costs ~1 us; f"{t:.1f} ms" is a format."""\n'
        "    x = 1  # -O2: g++ took 4.8 vs 6.7 s\n"
        "    y = 2\n"
        "    # measured on the w128 step:\n"
        "    # 3.20 ms uncut\n"
        '    return "1 ms -> 2 ms"\n')
    (tmp_path / "dialects").mkdir()
    (tmp_path / "dialects" / "a.td").write_text("// exp 283 -> 219 us\ndef X;\n")
    assert sorted((f, line) for f, line, _ in timings(tmp_path)) == [
        ("dialects/a.td", 1), ("runtime/m.py", 1), ("runtime/m.py", 4), ("runtime/m.py", 6)]
