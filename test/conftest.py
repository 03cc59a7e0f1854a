"""TESSERA_STRICT_SKIPS=1 (set by CI) fails every test, and every test module,
that skips for a reason other than a missing GPU: on CI's machine nvcc,
NVRTC, NVSHMEM's headers, mpiexec, lit and ml_dtypes are all installed, so
a skip for want of one means the install broke and the checks it stands for
silently stopped running. GPU skips say "needs cupy ... and a GPU"."""

import os
import re

import pytest

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
