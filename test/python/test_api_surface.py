"""The public surface in one place: docs/api.md is what tools/gen_api.py
makes of the modules' `__all__`s, and it marks each alias."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path
from types import SimpleNamespace

import tessera as ts

REPO = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def _gen_api():
    return SimpleNamespace(**runpy.run_path(str(REPO / "tools" / "gen_api.py")))


@functools.lru_cache(maxsize=None)
def _rendered() -> str:
    return _gen_api().render()


def test_docs_api_md_is_what_the_modules_all_lists():
    current = (REPO / "docs" / "api.md").read_text()
    assert _rendered() == current, (
        "docs/api.md is out of date with the modules' __all__: regenerate it with "
        "`PYTHONPATH=.:passes:runtime .venv/bin/python tools/gen_api.py` and commit it")


def test_the_api_page_marks_aliases_and_the_gradient_spellings():
    text = _rendered()
    assert "| `distributed` | alias of `ts.dist` |" in text
    assert "| `flash_attention` | alias of `ts.op.attention` |" in text
    assert "| `jit` | alias of `ts.compile` |" in text
    assert "| `op.autodiff(loss, wrt)` | the tutorials' spelling | alias of `ts.grad` |" in text
    assert "| `matmul` | = `ts.op.matmul` |" in text            # ts.matmul: a re-export
    assert ts.op.autodiff is ts.grad and ts.graph.backward is ts.grad
    # every name of every namespace is on the page
    for ns, module in _gen_api().namespaces():
        for name in module.__all__:
            assert f"| `{name}` |" in text, f"{ns}.{name}"
