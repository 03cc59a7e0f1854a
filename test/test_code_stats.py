"""bench/code_stats.py's figures: cycle groups are the strongly connected
components of more than one module, and long functions are counted from
their first decorator to their last line."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]


def _stats():
    return SimpleNamespace(**runpy.run_path(str(REPO / "bench" / "code_stats.py")))


def test_cycle_groups_are_the_strongly_connected_components():
    stats = _stats()
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"},
             "f": {"g"}, "g": {"f"}}
    assert stats.cycle_groups(graph) == [["a", "b", "c"], ["f", "g"]]


def test_long_functions_count_decorators_and_nested_functions(tmp_path):
    stats = _stats()
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    source = tmp_path / "m.py"
    source.write_text(f"@decorator\ndef long():\n{body}\n\ndef short():\n    pass\n")
    total, long = stats.long_functions({"m": source}, tmp_path)
    assert total == 2 and long == [("m.py:2 long", 82)]
