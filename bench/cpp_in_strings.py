"""Counts the lines of C++ held in Python string literals (issue 61: C++
lives in .h/.cpp files, where a compiler and clang-format see it).

How it counts: every .py file under tessera/, tessera_compiler/, passes/
and runtime/ is parsed with `ast`; a string literal counts when it is not
a docstring, spans at least 3 lines, and at least half of its non-blank
lines look like C++ (end in `;`, `{` or `}`, or start with `#` or `//`).
Its lines are added up. Plain string constants only: the few lines a
printer builds per op with f-strings are generated code, not fixed text.

    .venv/bin/python bench/cpp_in_strings.py [--files]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tessera", "tessera_compiler", "passes", "runtime")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of `tree` (module, classes, functions)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def looks_like_cpp(text: str) -> bool:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(text.splitlines()) < 3 or not lines:
        return False
    cpp = sum(line.endswith((";", "{", "}")) or line.startswith(("#", "//")) for line in lines)
    return 2 * cpp >= len(lines)


def cpp_lines(path: Path) -> int:
    """Lines of C++ in `path`'s string literals."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    in_fstring = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                  for v in node.values}
    return sum(len(node.value.splitlines()) for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and id(node) not in docs and id(node) not in in_fstring
               and looks_like_cpp(node.value))


def count(root: Path = ROOT) -> dict[str, int]:
    """{file relative to root: lines of C++ in its strings} for files with any."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            n = cpp_lines(path)
            if n:
                found[str(path.relative_to(root))] = n
    return found


if __name__ == "__main__":
    counts = count(Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT)
    if "--files" in sys.argv:
        for name, n in counts.items():
            print(f"{n:6d}  {name}")
    print(f"lines of C++ in Python strings: {sum(counts.values())}")
