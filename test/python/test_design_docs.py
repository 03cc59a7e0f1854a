"""Every design-doc snippet has a script in examples/design_docs that runs
(on the ranks its docstring launches it with) and prints OK, or is listed
as pending in examples/design_docs/README.md with the reason. A script that
fails today for a known reason is in KNOWN_FAILURES (and its README row
says "fails today"): expected to fail, strictly, so that the fix shows up
as an unexpected pass until both are updated."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "examples" / "design_docs"
SCRIPTS = sorted(p.name for p in DOCS.glob("*.py"))
#: script -> why it fails today
KNOWN_FAILURES: dict = {}


def _table() -> list[list[str]]:
    rows = [l.split("|")[1:-1] for l in (DOCS / "README.md").read_text().splitlines()
            if l.startswith("| ") and not l.startswith("| doc") and "---" not in l]
    return [[c.strip() for c in r] for r in rows]


def _ranks(script: str) -> int:
    found = re.search(r"tessera launch -n (\d+)", (DOCS / script).read_text())
    return int(found.group(1)) if found else 1


def test_the_table_names_every_script_and_each_pending_snippets_reason():
    rows = _table()
    named = {r[2].strip("`") for r in rows if r[2].endswith(".py`")}
    assert named == set(SCRIPTS)
    pending = [f"{r[0]} {r[1]}" for r in rows if r[2] in ("pending", "not yet scripted")]
    for r in rows:
        if r[2] in ("pending", "not yet scripted"):
            assert r[3], f"{r[0]} {r[1]}: a pending snippet says why"
    print("pending design-doc snippets: " + "; ".join(pending))
    failing = {r[2].strip("`") for r in rows if r[3].startswith("fails today")}
    assert failing == set(KNOWN_FAILURES)
    assert len(rows) == 24


@pytest.mark.parametrize("script", [
    pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[s]))
    if s in KNOWN_FAILURES else s for s in SCRIPTS])
def test_design_doc_snippet_runs(script, run_mpi):
    n = _ranks(script)
    if n == 1:
        proc = subprocess.run([sys.executable, str(DOCS / script)], capture_output=True,
                              text=True, timeout=120, cwd=str(REPO))
    else:
        proc = run_mpi(n, DOCS / script, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"OK {script[:-3]}" in proc.stdout
