"""README.md's table of passes is the registry's (`tessera-opt --pass-table`):
a pass added, renamed or re-described in `tessera_passes.PASSES` fails here
until the table is regenerated."""

from __future__ import annotations

import sys
import runpy
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "runtime", REPO / "passes", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from tessera_compiler.opt import pass_table, tessera_passes  # noqa: E402


def _tool():
    return SimpleNamespace(**runpy.run_path(str(REPO / "tools" / "readme_pass_table.py")))


def test_readme_pass_table_is_the_registry():
    tool = _tool()
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert tool.with_table(text, pass_table()) == text, (
        "README.md's pass table differs from the pass registry: run "
        ".venv/bin/python tools/readme_pass_table.py")


def test_pass_table_has_a_row_per_registered_pass_and_the_check_sees_a_change():
    table = pass_table()
    rows = [line for line in table.splitlines()[2:]]
    flags = [row.split("`")[1] for row in rows]
    assert flags == list(tessera_passes()) and len(flags) >= 17
    tool = _tool()
    text = (REPO / "README.md").read_text(encoding="utf-8")
    stale = tool.with_table(text, table.replace(rows[-1] + "\n", ""))  # a pass missing
    assert tool.with_table(stale, table) != stale
