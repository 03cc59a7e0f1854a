#!/usr/bin/env bash
# Everything a lent GPU machine should run, in one call: the kit's checks
# (GEMMs on mma.sync / wgmma + TMA / wgmma + cp.async, flash attention
# forward and backward, the NVSHMEM all-gather + GEMM and GEMM +
# reduce-scatter on 2 ranks, the GPT training step against the CPU engine),
# NCCL on 2 ranks of the one GPU, and the benchmarks against cuBLAS and torch
# SDPA. The GPU machine needs only the runtime: compile the kit here first.
#
#   python bench/gpu_kit.py build gpu_kit          # here (compiler, nvcc; no GPU)
#   device run: command="bash bench/gpu_session.sh gpu_kit", carry=["gpu_kit"]
#
# Results land in $OUT (gpu_checks.json, the bench/results files, the
# device report); copy the bench/results files into the repository and
# commit them.
set -uo pipefail
kit=${1:-gpu_kit}
shift || true        # the rest goes to `gpu_kit.py run` (e.g. --no-benchmarks)
# The lent machines run commands as root, and Open MPI's mpiexec (the one
# there) refuses root unless told; measured on the first H100 run: all three
# 2-rank checks (NCCL, both NVSHMEM GEMMs) stopped on that refusal.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=${OUT:-/tmp/gpu_session}
mkdir -p "$out"
export PYTHONPATH=$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi; python --version; } 2>&1 | tee "$out/device.txt"
# ml_dtypes (bfloat16 on the host) comes with jax there; else the kit's wheel.
python -c "import ml_dtypes" 2>/dev/null ||
    python -m pip install --no-index --find-links "$kit/wheels" ml_dtypes 2>&1 | tail -1
python -c "import cupy, ml_dtypes; print('cupy', cupy.__version__, 'ml_dtypes', ml_dtypes.__version__)" |
    tee -a "$out/device.txt"
# nvshmem4py for the NVSHMEM check (--no-deps: cuda-core and the NVSHMEM
# wheel are the image's). `python -m pip`: the image's bare `pip` belongs to
# another Python (measured 2026-11-27: nvshmem4py installed with it stayed
# unimportable from `python`). The kit's cubins hold the NVSHMEM device library
# they were built with (the kit's build.json); the host library is this one.
python -c "import nvshmem.core" 2>/dev/null ||
    python -m pip install --no-index --no-deps --find-links "$kit/wheels" nvshmem4py-cu13 2>&1 | tail -1
python -m pip list 2>/dev/null | grep -i -E "nvshmem|nccl|cuda.core|cuda.bindings|mpi4py" |
    tee -a "$out/device.txt"
cat "$kit/build.json" 2>/dev/null | tee -a "$out/device.txt"
# Within the call's 600 s, less what the installs took (bash's SECONDS).
python bench/gpu_kit.py run "$kit" "$out" --deadline $((570 - SECONDS)) "$@"
