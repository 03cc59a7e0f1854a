#!/usr/bin/env python3
"""Rewrites README.md's table of passes from the registry tessera-opt uses
(`tessera-opt --pass-table`), so that adding or renaming a pass cannot leave the
README behind: test/test_readme_pass_table.py fails until this is run.

    .venv/bin/python tools/readme_pass_table.py          # rewrite README.md
    .venv/bin/python tools/readme_pass_table.py --check  # exit 1 if it differs
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "passes"), os.path.join(ROOT, "runtime"),
                os.path.join(ROOT, "build", "dev", "python_packages")]

from tessera_compiler.opt import pass_table  # noqa: E402

README = os.path.join(ROOT, "README.md")
BEGIN = "<!-- pass table: generated from the pass registry by tools/readme_pass_table.py; do not edit -->"
END = "<!-- end of pass table -->"


def with_table(text: str, table: str) -> str:
    """`text` (README.md) with the part between BEGIN and END replaced by `table`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md has no '{BEGIN}' ... '{END}' block")
    return text[:start + len(BEGIN)] + "\n" + table + text[end:]


def main(argv: list[str]) -> int:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    new = with_table(text, pass_table())
    if "--check" in argv:
        if new != text:
            sys.stderr.write("README.md's pass table differs from the pass registry: "
                             "run tools/readme_pass_table.py\n")
            return 1
        return 0
    if new != text:
        with open(README, "w", encoding="utf-8") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
