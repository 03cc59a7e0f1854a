"""Counts the lines of C++ held in Python string literals (issue 61: C++
lives in .h/.cpp files, where a compiler and clang-format see it).

How it counts: every .py file under tessera/, tessera_compiler/, passes/
and runtime/ is parsed with `ast`; a string literal counts when it is not
a docstring, spans at least 3 lines, and at least half of its non-blank
lines look like C++ (end in `;`, `{` or `}`, or start with `#` or `//`).
Its lines are added up. Plain string constants only: the few lines a
printer builds per op with f-strings are generated code, not fixed text.
Only files with a line that opens C++ (OPENS_CPP: an #include, #define,
#if, typedef, template, extern "C", static or inline at a line's start, or
a string starting with #include or #define) are parsed, which keeps the
test that runs this (test/test_cpp_sources.py) fast; the base commit of
issue 61 counts the same with and without it.

    .venv/bin/python bench/cpp_in_strings.py [--files] [--root DIR]
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tessera", "tessera_compiler", "passes", "runtime")
OPENS_CPP = re.compile(r'^\s*(#include|#define|#if|typedef |template ?<|extern "C"|static |inline )'
                       r'|["\'](#include|#define) ', re.M)


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
    text = path.read_text()
    if not OPENS_CPP.search(text):
        return 0
    tree = ast.parse(text, str(path))
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", action="store_true", help="the count of each file")
    parser.add_argument("--root", type=Path, default=ROOT, help="a checkout (default: this one)")
    args = parser.parse_args()
    counts = count(args.root)
    if args.files:
        for name, n in counts.items():
            print(f"{n:6d}  {name}")
    print(f"lines of C++ in Python strings: {sum(counts.values())}")
