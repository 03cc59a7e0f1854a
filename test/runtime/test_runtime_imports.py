"""The runtime must stand alone: no compiler/MLIR imports, no pickle, and no
mpi4py (which initializes MPI) for a single-process program."""

import ast
import subprocess
import sys
import textwrap

from runtime_bundle_util import (RUNTIME_DIR, compile_kernels, kernels_cpp, subprocess_env,
                                 tensor, write_bundle)

FORBIDDEN = ("tessera", "tessera_compiler", "tessera_passes", "tessera_mlir", "mlir")
PACKAGE = RUNTIME_DIR / "tessera_runtime"


def test_runtime_imports_with_compiler_blocked(tmp_path):
    lib = compile_kernels(kernels_cpp(relus=[12]), tmp_path / "k")
    bundle = write_bundle(tmp_path / "relu.tsb", {
        "mesh": {"name": "mesh", "axes": ["tp"], "shape": [1], "devices": [0]},
        "inputs": [tensor("x", "%arg0", [12])],
        "outputs": [tensor("y", "%arg0", [12])],
        "streams": ["compute"],
        "instructions": [
            {"op": "launch", "kernel": "relu_12", "stream": "compute", "args": ["%arg0"]},
            {"op": "return", "values": ["%arg0"]}]}, lib)
    code = textwrap.dedent(f"""
        import sys, importlib.abc
        BLOCKED = {FORBIDDEN!r}   # (pickle: numpy itself uses it; checked statically below)

        class Blocker(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked import of {{name}}")
                return None

        for mod in list(sys.modules):   # make sure nothing is already cached
            if mod.split(".")[0] in BLOCKED:
                del sys.modules[mod]
        sys.meta_path.insert(0, Blocker())
        try:
            import tessera_compiler
            raise SystemExit("blocker is not working")
        except ImportError:
            pass

        import numpy as np
        import tessera_runtime as rt
        import tessera_runtime.bundle, tessera_runtime.comm, tessera_runtime.executor
        import tessera_runtime.mesh, tessera_runtime.engines.cpu
        prog = rt.load_bundle({str(bundle)!r})
        x = np.linspace(-1, 1, 12, dtype=np.float32)
        (y,) = prog.run([x])
        assert np.array_equal(y, np.maximum(x, 0)), y
        assert "mpi4py" not in sys.modules, "mpi4py imported for a 1-rank program"
        print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=subprocess_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stdout + r.stderr


def test_no_forbidden_imports_in_source():
    """Static check, so that a lazily imported forbidden module is caught too."""
    files = sorted(PACKAGE.rglob("*.py"))
    assert files
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for n in names:
                top = n.split(".")[0]
                assert top not in FORBIDDEN + ("pickle", "_pickle", "dill", "cloudpickle"), \
                    f"{f}: imports {n}"
                if top == "mpi4py":
                    assert f.name == "mpi_comm.py", f"{f}: only mpi_comm.py may import mpi4py"
