"""Make `tessera_runtime` and the test helpers importable however pytest is
invoked (rootdir/prepend or importlib import mode, with or without PYTHONPATH)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for p in (REPO / "runtime", HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
