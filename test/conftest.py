"""TESSERA_STRICT_SKIPS=1 (set by CI) fails every test, and every test module,
that skips for a reason other than a missing GPU: on CI's machine nvcc,
NVRTC, NVSHMEM's headers, mpiexec, lit and ml_dtypes are all installed, so
a skip for want of one means the install broke and the checks it stands for
silently stopped running. GPU skips say "needs cupy ... and a GPU".

The session also refuses to start when the packages it imports are an
installed copy that differs from this checkout (`pip install .` copies
them into .venv; after an edit, a run without PYTHONPATH=.:passes:runtime
would test the old code, and so would its MPI workers)."""

import importlib.util
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Each package the tests import, and where the checkout keeps it.
PACKAGES = {"tessera": "tessera", "tessera_compiler": "tessera_compiler",
            "tessera_passes": "passes/tessera_passes",
            "tessera_runtime": "runtime/tessera_runtime"}


def stale_copies() -> list[str]:
    """For each package imported from somewhere other than the checkout,
    the first of the checkout's Python files that its copy lacks or holds
    with other contents."""
    found = []
    for name, folder in PACKAGES.items():
        spec = importlib.util.find_spec(name)         # (where, without importing it)
        if spec is None or spec.origin is None:
            continue
        imported = Path(spec.origin).resolve().parent
        tree = REPO / folder
        if imported == tree:
            continue
        for source in sorted(tree.rglob("*.py")):
            copy = imported / source.relative_to(tree)
            if not copy.exists() or copy.read_bytes() != source.read_bytes():
                found.append(f"{name} is imported from {imported}, whose "
                             f"{source.relative_to(tree)} differs from the checkout's")
                break
    return found


def pytest_sessionstart(session):
    stale = stale_copies()
    if stale:
        pytest.exit("the tests would run an installed copy older than this checkout:\n  "
                    + "\n  ".join(stale) + "\nrun with PYTHONPATH=.:passes:runtime, or "
                    "reinstall (bash tools/bootstrap.sh)", returncode=4)

_GPU_SKIP = re.compile(r"needs cupy\b.* and a GPU$")


def _strict_failure(report) -> None:
    """Turns a skip `report` (test or collection) into a failure, unless it
    is an expected failure or a GPU skip."""
    if not report.skipped or os.environ.get("TESSERA_STRICT_SKIPS") != "1" \
            or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple)
                 else report.longrepr).removeprefix("Skipped: ")
    if not _GPU_SKIP.search(reason):
        report.outcome = "failed"
        report.longrepr = f"skipped where TESSERA_STRICT_SKIPS=1 forbids it: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _strict_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _strict_failure(outcome.get_result())
