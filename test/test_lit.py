"""Runs every lit test (test/**/*.mlir) as a pytest test of its own.

Each test runs `lit -v <file>` with this interpreter; lit's output is shown
when it fails. The same tests run directly with `lit -v test/`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TEST_DIR = Path(__file__).resolve().parent
REPO_ROOT = TEST_DIR.parent
EXCLUDED_DIRS = {"runtime", "Output", "__pycache__"}


def _lit_tests() -> list[Path]:
    tests = []
    for path in sorted(TEST_DIR.rglob("*.mlir")):
        rel = path.relative_to(TEST_DIR)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            continue
        tests.append(path)
    return tests


LIT_TESTS = _lit_tests()

# `python -m lit` does not work (the lit package has no __main__), so call its
# entry point directly.
_LIT = [sys.executable, "-c", "import sys, lit.main; sys.argv[0] = 'lit'; lit.main.main()"]


def _lit_available() -> bool:
    try:
        import lit.main  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _lit_available(), reason="lit is not installed (pip install lit)")
@pytest.mark.parametrize("test_file", LIT_TESTS,
                         ids=[p.relative_to(TEST_DIR).as_posix() for p in LIT_TESTS])
def test_lit(test_file: Path) -> None:
    env = dict(os.environ)
    # lit.cfg.py puts the repo, passes/, runtime/ and build/dev on PYTHONPATH.
    proc = subprocess.run(
        _LIT + ["-v", "--no-progress-bar", str(test_file)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"lit failed for {test_file.relative_to(TEST_DIR)}:\n{output}"
    assert "Passed: 1" in output or "PASS:" in output, f"lit ran no test:\n{output}"
