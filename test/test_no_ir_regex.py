"""No regular expression reads printed IR anywhere in the compiler
(`tessera_compiler/`, `passes/`): types, attributes and ops are read
through the typed bindings (`tessera_compiler/ir/types.py`: `tile_of`,
`shape_of`, `enum_of`, ...), which cannot drift from the printer.

Forbidden, for a call of a regex function (`re.match(...)`, or a method of
a compiled pattern: `.match`, `.search`, `.fullmatch`, `.findall`,
`.finditer`, `.sub`, `.split`):
* a pattern literal naming IR syntax (IR_MARKERS: `!ttile`, `tensor<`,
  `memref<`, `#tgraph`, ...), and
* a subject that is printed IR: `str(...)` or `.get_asm(...)` of something.
Regexes over other text (pass pipeline options, a memory budget, lit
directives, sub-axis names, symbol names) are fine; ALLOWED lists the
exceptions to the rules above, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO / "tessera_compiler", REPO / "passes")
IR_MARKERS = ("!ttile", "!tsched", "!tgraph", "#ttile", "#tsched", "#tgraph", "tensor<",
              "memref<", "tile<", "vector<", "array<", "func.func", "ttile.", "tgraph.",
              "tsched.")
REGEX_FUNCTIONS = {"compile", "match", "search", "fullmatch", "findall", "finditer", "sub",
                   "subn", "split"}
#: (file relative to the repo, the pattern) -> why it is not printed IR
ALLOWED = {
    ("tessera_compiler/driver.py", r"\barray<\s*index\b"):
        "scans the user's source text before MLIR parses it, to refuse a dense array of "
        "index, which aborts MLIR 22's parser (llvm/llvm-project#179045)",
    ("tessera_compiler/memory_budget.py", r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*"):
        "str() of the memory budget the user gave (a number or text like '4 GiB'), not IR",
}


def _is_regex_call(node: ast.Call) -> bool:
    f = node.func
    return isinstance(f, ast.Attribute) and f.attr in REGEX_FUNCTIONS and (
        (isinstance(f.value, ast.Name) and f.value.id == "re") or
        (isinstance(f.value, ast.Name) and f.value.id.isupper()) or    # a compiled _PATTERN
        isinstance(f.value, ast.Attribute))


def _printed(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id == "str") or
        (isinstance(node.func, ast.Attribute) and node.func.attr == "get_asm"))


def ir_regexes(path: Path, rel: str) -> list[str]:
    """The forbidden regex calls of one source file."""
    bad = []
    text = path.read_text()
    if "import re" not in text and "from re import" not in text:
        return bad                      # (a compiled pattern is private to its module)
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, ast.Call) or not _is_regex_call(node):
            continue
        args = list(node.args) + [k.value for k in node.keywords]
        patterns = [a.value for a in args if isinstance(a, ast.Constant)
                    and isinstance(a.value, str)]
        if any((rel, p) in ALLOWED for p in patterns):
            continue
        for p in patterns:
            if any(m in p for m in IR_MARKERS):
                bad.append((node.lineno, f"{rel}:{node.lineno}: a pattern over IR syntax: {p!r}"))
        if any(_printed(a) for a in args):
            bad.append((node.lineno, f"{rel}:{node.lineno}: a regex over printed IR "
                                     f"({ast.unparse(node)})"))
    return [text for _, text in sorted(bad)]


def test_no_regex_reads_printed_ir_in_the_compiler():
    bad = []
    for root in ROOTS:
        for f in sorted(root.rglob("*.py")):
            bad += ir_regexes(f, f.relative_to(REPO).as_posix())
    assert not bad, "regexes over printed IR (read it through the typed bindings):\n" + \
        "\n".join(bad)


def test_the_check_catches_a_regex_over_a_printed_type(tmp_path):
    """What the cost model did before it read tiles through `tile_of` (and
    the allow-list's pattern outside its file)."""
    f = tmp_path / "cost.py"
    f.write_text('import re\n_TILE = re.compile(r"!ttile\\.tile<((?:\\d+x)+)")\n'
                 "def shape(t):\n    return _TILE.match(str(t))\n"
                 '_A = re.compile(r"\\barray<\\s*index\\b")\n')
    assert [b.split(": ", 1)[1].split(":")[0].split(" (")[0] for b in ir_regexes(f, "cost.py")] == [
        "a pattern over IR syntax", "a regex over printed IR", "a pattern over IR syntax"]
    for rel, pattern in ALLOWED:
        assert pattern in (REPO / rel).read_text(), f"{rel} no longer needs its exception"
