"""Makes the compiler, MLIR and the frontend unimportable, then runs the
runtime's bundle runner: proves a bundle runs where only the runtime exists."""

import runpy
import sys

BLOCKED = ("tessera", "tessera_compiler", "tessera_passes", "tessera_mlir", "mlir")


class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: the runtime must not need it")
        return None


sys.meta_path.insert(0, Blocker())
sys.argv = ["tessera_runtime", *sys.argv[1:]]
try:
    runpy.run_module("tessera_runtime", run_name="__main__")
except SystemExit as done:       # the runner ends with SystemExit(status)
    if done.code:
        raise
loaded = [m for m in sys.modules if m.split(".")[0] in BLOCKED]
assert not loaded, f"blocked modules were imported: {loaded}"
print("RUNTIME-ONLY-OK")
