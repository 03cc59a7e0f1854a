"""Helpers for runtime tests: hand-written bundles and tiny C++ kernels.

Builds bundles exactly as docs/bundle-format.md describes, without the
compiler or MLIR, so the runtime can be tested on its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUNTIME_DIR = REPO / "runtime"


def kernels_cpp(matmuls=(), relus=()) -> str:
    """C++ source with `matmul_MxKxN(a, b, c)` (c = a @ b, row-major float32)
    and in-place `relu_N(x)` kernels for the given static sizes."""
    out = ["// test kernels for tessera_runtime", ""]
    for m, k, n in matmuls:
        out.append(f"""extern "C" void matmul_{m}x{k}x{n}(void* pa, void* pb, void* pc) {{
  const float* a = static_cast<const float*>(pa);
  const float* b = static_cast<const float*>(pb);
  float* c = static_cast<float*>(pc);
  for (int i = 0; i < {m}; ++i)
    for (int j = 0; j < {n}; ++j) {{
      float acc = 0.0f;
      for (int p = 0; p < {k}; ++p) acc += a[i * {k} + p] * b[p * {n} + j];
      c[i * {n} + j] = acc;
    }}
}}
""")
    for n in relus:
        out.append(f"""extern "C" void relu_{n}(void* px) {{
  float* x = static_cast<float*>(px);
  for (int i = 0; i < {n}; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}}
""")
    return "\n".join(out)


def compile_kernels(source: str, out_dir: Path) -> Path:
    """Compile `source` to out_dir/libkernels.so with the host g++."""
    import pytest
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: cannot build test kernels")
    out_dir.mkdir(parents=True, exist_ok=True)
    cpp = out_dir / "kernels.cpp"
    so = out_dir / "libkernels.so"
    cpp.write_text(source)
    subprocess.run([gxx, "-O2", "-shared", "-fPIC", "-o", str(so), str(cpp)],
                   check=True, capture_output=True, text=True)
    return so


def tensor(name, value, local_shape, global_shape=None, dims=None, partial=(),
           dtype="float32") -> dict:
    global_shape = list(global_shape or local_shape)
    return {"name": name, "value": value, "dtype": dtype,
            "global_shape": global_shape, "local_shape": list(local_shape),
            "sharding": {"dims": dims or [[] for _ in global_shape],
                         "partial": list(partial)}}


def write_bundle(root: Path, program: dict, lib: Path | None, entry="test") -> Path:
    """Write manifest.json, program.json and kernels/libkernels.so under root."""
    root.mkdir(parents=True, exist_ok=True)
    manifest = {"format": "tessera-bundle", "version": 1, "entry": entry,
                "engine": "cpu", "program": "program.json", "kernels": {},
                "sources": {}, "ir": {}}
    if lib is not None:
        (root / "kernels").mkdir(exist_ok=True)
        shutil.copy(lib, root / "kernels" / "libkernels.so")
        manifest["kernels"]["cpu"] = "kernels/libkernels.so"
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (root / "program.json").write_text(json.dumps(program, indent=1))
    return root


def subprocess_env() -> dict:
    """Environment for child processes: the runtime on PYTHONPATH and no
    inherited MPI launcher variables (the child decides its own world)."""
    env = dict(os.environ)
    for var in list(env):
        if var.startswith(("PMI_", "OMPI_", "MV2_", "MPI_LOCAL", "HYDRA_")):
            del env[var]
    env["PYTHONPATH"] = os.pathsep.join(
        [str(RUNTIME_DIR), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def find_mpiexec() -> str | None:
    cand = Path(sys.executable).parent / "mpiexec"
    if cand.is_file() and os.access(cand, os.X_OK):
        return str(cand)
    return shutil.which("mpiexec")


# -- the programs used by the MPI program tests --------------------------------

# tp=2 row-parallel matmul: x[4,8] split on dim 1, w[8,6] split on dim 0.
TP_KERNELS = dict(matmuls=[(4, 4, 6), (4, 8, 3)], relus=[24, 12])


def tp_program() -> dict:
    """Outputs: y = relu(x @ w) (deterministic all_reduce), z = this rank's
    column block of x @ w (reduce_scatter dim 1), g = x @ w (all_gather of z)."""
    return {
        "mesh": {"name": "mesh", "axes": ["tp"], "shape": [2], "devices": [0, 1]},
        "inputs": [tensor("x", "%arg0", [4, 4], [4, 8], [[], ["tp"]]),
                   tensor("w", "%arg1", [4, 6], [8, 6], [["tp"], []])],
        "outputs": [tensor("y", "%1", [4, 6]),
                    tensor("z", "%2", [4, 3], [4, 6], [[], ["tp"]]),
                    tensor("g", "%3", [4, 6])],
        "streams": ["compute", "comm"],
        "instructions": [
            {"op": "alloc", "result": "%0", "shape": [4, 6], "dtype": "float32"},
            {"op": "launch", "kernel": "matmul_4x4x6", "stream": "compute",
             "args": ["%arg0", "%arg1", "%0"]},
            {"op": "event_record", "result": "%e0", "stream": "compute"},
            {"op": "event_wait", "event": "%e0", "stream": "comm"},
            {"op": "alloc", "result": "%1", "shape": [4, 6], "dtype": "float32"},
            {"op": "collective_start", "result": "%t0", "stream": "comm",
             "collective": "all_reduce", "axis": "tp", "reduction": "sum",
             "deterministic": True, "dim": 0, "src": "%0", "dst": "%1"},
            {"op": "alloc", "result": "%2", "shape": [4, 3], "dtype": "float32"},
            {"op": "collective_start", "result": "%t1", "stream": "comm",
             "collective": "reduce_scatter", "axis": "tp", "reduction": "sum",
             "deterministic": False, "dim": 1, "src": "%0", "dst": "%2"},
            {"op": "collective_wait", "token": "%t0", "stream": "compute"},
            {"op": "launch", "kernel": "relu_24", "stream": "compute", "args": ["%1"]},
            {"op": "collective_wait", "token": "%t1", "stream": "compute"},
            {"op": "alloc", "result": "%3", "shape": [4, 6], "dtype": "float32"},
            {"op": "collective_start", "result": "%t2", "stream": "comm",
             "collective": "all_gather", "axis": "tp", "dim": 1, "src": "%2", "dst": "%3"},
            {"op": "collective_wait", "token": "%t2", "stream": "compute"},
            {"op": "free", "buffer": "%0"},
            {"op": "return", "values": ["%1", "%2", "%3"]},
        ],
    }


def dp_tp_program() -> dict:
    """2x2 mesh (dp, tp) with permuted devices: x[8,8] split (dp, tp),
    w[8,6] split on dim 0 over tp. y = rows of x @ w for this dp block
    (all_reduce over tp), full = x @ w (all_gather over dp, dim 0)."""
    return {
        "mesh": {"name": "mesh", "axes": ["dp", "tp"], "shape": [2, 2],
                 "devices": [0, 2, 1, 3]},
        "inputs": [tensor("x", "%arg0", [4, 4], [8, 8], [["dp"], ["tp"]]),
                   tensor("w", "%arg1", [4, 6], [8, 6], [["tp"], []])],
        "outputs": [tensor("y", "%1", [4, 6], [8, 6], [["dp"], []]),
                    tensor("full", "%2", [8, 6])],
        "streams": ["compute", "comm"],
        "instructions": [
            {"op": "alloc", "result": "%0", "shape": [4, 6], "dtype": "float32"},
            {"op": "launch", "kernel": "matmul_4x4x6", "stream": "compute",
             "args": ["%arg0", "%arg1", "%0"]},
            {"op": "alloc", "result": "%1", "shape": [4, 6], "dtype": "float32"},
            {"op": "collective_start", "result": "%t0", "stream": "comm",
             "collective": "all_reduce", "axis": "tp", "reduction": "sum",
             "deterministic": False, "dim": 0, "src": "%0", "dst": "%1"},
            {"op": "collective_wait", "token": "%t0", "stream": "compute"},
            {"op": "alloc", "result": "%2", "shape": [8, 6], "dtype": "float32"},
            {"op": "collective_start", "result": "%t1", "stream": "comm",
             "collective": "all_gather", "axis": "dp", "dim": 0, "src": "%1", "dst": "%2"},
            {"op": "collective_wait", "token": "%t1", "stream": "compute"},
            {"op": "return", "values": ["%1", "%2"]},
        ],
    }
