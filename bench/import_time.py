"""What a fresh Python process pays to import Tessera, and the part of it
each dependency takes.

Every rank of a job, its launcher wrapper and each test worker is a fresh
process that imports `tessera`, so this cost is paid N times per launch
(and over a thousand times by the test suite). `ml_dtypes` 0.7.0 took ten
times as long to import as 0.6.0 on the CI machine, which is why
pyproject.toml keeps it below 0.7 (bench/results/import-time-*.md).

    python bench/import_time.py              # this environment
    python bench/import_time.py --runs 9     # more runs per module

Prints the median wall time of `python -c "import MODULE"` for each module,
in fresh processes, with the versions of numpy and ml_dtypes.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

MODULES = ("numpy", "ml_dtypes", "tessera_runtime", "tessera_compiler", "tessera")


def import_seconds(module: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per module")
    args = parser.parse_args()
    import ml_dtypes
    import numpy
    print(f"python {platform.python_version()}, numpy {numpy.__version__}, "
          f"ml_dtypes {ml_dtypes.__version__}, {platform.machine()}")
    bare = import_seconds("sys", args.runs)
    print(f"{'python -c pass':<20} {bare * 1e3:8.0f} ms")
    for module in MODULES:
        print(f"{'import ' + module:<20} {import_seconds(module, args.runs) * 1e3:8.0f} ms")


if __name__ == "__main__":
    main()
