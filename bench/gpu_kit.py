"""GPU correctness checks and benchmarks for a GPU machine without the compiler.

    python bench/gpu_kit.py build gpu_kit                       # here: compiler + nvcc, no GPU
    PYTHONPATH=runtime python bench/gpu_kit.py run gpu_kit OUT  # there: runtime + cupy (+ torch)
    bash bench/gpu_session.sh gpu_kit                           # there: all of it, in one call

The GPU machines lent here have Python 3.12, no MLIR toolchain and no package
index, so everything is compiled on this side. `build` compiles each check's
GPU bundle (`Compiled.build`), saves its inputs and the outputs expected of
it (float64 numpy, or the CPU engine for the GPT training step) as .npz files
(no pickle), with each output's tolerance in checks.json, then compiles the benchmarks' bundles
(bench/gemm_cuda.py and bench/attention_cuda.py with `--kit`). `run` runs
every check on the `cuda` engine and prints PASS or FAIL with the largest
error, runs the NCCL worker on 2 ranks of the one GPU, then the two
benchmarks (which measure Tessera and cuBLAS / torch SDPA in the same run),
and writes OUT/gpu_checks.json plus the benchmarks' bench/results files,
copied to OUT. Exit status 1 if any check failed.

A first run on a new GPU may meet a kernel that never finishes or faults
(a fault poisons the process' CUDA context): every check, the NCCL worker
and every benchmark variant runs in a process of its own, killed with its
process group after its time limit, and OUT/gpu_checks.json is rewritten
after each, so one bad kernel costs only its own row and a call cut off
by its time limit still brings back what finished. `--deadline` (560 s
of a lent machine's 600 s call) bounds the whole run, the last
`--bench-reserve` seconds kept for the benchmarks.

Checks: the tensor-core GEMM with a fused epilogue on mma.sync, on wgmma fed
by TMA (2-D and batched 3-D tensor maps, 4 and 3 stages; copies issued by a
producer warpgroup, or by thread 0 between iterations) and on wgmma fed by
cp.async; causal flash attention forward and backward at D = 64 and 128
(and the forward's ping-pong and issue-ahead variants);
the all-gather + GEMM and GEMM + reduce-scatter kernels and an MoE layer's
exchange kernels over NVSHMEM on 2 ranks of the one GPU (run under mpiexec,
one `gpu_kit.py rank` process per rank, with nvshmem4py from the kit's
wheels); the example GPT's training step in fp32 and bf16 against
the CPU engine. build.json records the commit, nvcc and the NVSHMEM device
library the kit was built with.

Profile (after the checks): the example GPT's bf16 step at PROFILE_CASE,
compiled for the autotuner's first candidates (`tessera.autotune`), timed
there in turns as the autotuner times them; then the default profiled by the
runtime's recorder on CUDA events and summarised by `dist.profile`'s own
functions (OUT/profile-gpt-step-bf16.json is its Perfetto trace), beside the
cost model's prediction on h100-node made here. It passes when every run's
kernels appear in the trace with positive lengths.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("gemm_cuda.py", "attention_cuda.py")
# AdamW's first step moves a parameter by lr * sign(gradient): where a
# gradient is within rounding of zero the two engines may step opposite ways.
ADAMW_LR = 3e-3
# The checks' kernels trap when an mbarrier wait outlasts this (the launch
# fails with an illegal-instruction error): a ring protocol that is wrong
# on real hardware fails its check in seconds where it would hang until
# the process is killed. The benchmarks' kernels are built without it.
CHECK_WATCHDOG_S = 5.0


# -- build (the compiler's side) ---------------------------------------------------

def _gemm_check(kit, name, config, shape, epilogue):
    """A bf16 GEMM (+ bias, `epilogue`) forced onto `config` (a GemmConfig's
    arguments, or None for the default choice)."""
    import ml_dtypes

    import tessera as ts
    from tessera import op
    bf16 = ml_dtypes.bfloat16
    batch, m, k, n = shape
    rng = np.random.default_rng()
    lead = (batch,) if batch else ()
    x = rng.standard_normal(lead + (m, k)).astype(bf16)
    w = (rng.standard_normal(lead + (k, n)) / np.sqrt(k)).astype(bf16)
    b = rng.standard_normal(n).astype(bf16)
    act = {"relu": op.relu, "gelu": op.gelu}[epilogue]
    options = _check_options()
    if config is not None:
        options = options.with_(gemm_configs=(ts.GemmConfig(*config[:6], **config[6]),),
                                target_blocks=1)
    bundle, inputs = _compile(lambda x, w, b: act(op.matmul(x, w) + b), x, w, b, options=options)
    h = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    ref = (np.maximum(h, 0) if epilogue == "relu"
           else 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3))))
    return _save(kit, name, bundle, inputs, [(ref, {"rule": "allclose", "rtol": 0.03,
                                                    "atol": 0.03})])


def _attention_check(kit, name, shape, variant="wgmma"):
    """Causal attention forward and backward, compiled as the attention
    bench's `variant` (e.g. `wgmma-pingpong:128x64`) says."""
    import ml_dtypes
    from attention_cuda import attention_options, attention_step, variant_spec
    from test_flash_attention import reference
    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng()
    q, k, v, do = (rng.standard_normal(shape).astype(bf16) for _ in range(4))
    options = attention_options(variant_spec(variant), wait_watchdog_s=CHECK_WATCHDOG_S)
    bundle, inputs = _compile(attention_step, q, k, v, do, options=options)
    expected = reference(q, k, v, do.astype(np.float32), True, 1 / np.sqrt(shape[-1]))
    return _save(kit, name, bundle, inputs,
                 [(e, {"rule": "allclose", "rtol": 0.03, "atol": 0.02 * np.abs(e).max()})
                  for e in expected])


def _gpt_step_check(kit, name, precision):
    """The example GPT's training step (forward, backward, AdamW) on the GPU
    target against the CPU engine here, on the same inputs."""
    import tessera as ts
    import train_gpt as g
    step, args = g.step_case(64, 2, 4, 8, 32, precision,
                             seed=int(np.random.default_rng().integers(1 << 30)))
    loss, params, opt_state, scaler, norm = step(*args)
    bundle, inputs = _compile(step.fn, *args)
    bf16 = precision == "bf16"
    leaves = ts._pytree.flatten
    rules = [(loss, {"rule": "allclose", "rtol": 1e-3 if bf16 else 1e-5, "atol": 0})]
    rules += [(p, {"rule": "adamw_param", "atol": 5e-4 if bf16 else 1e-4, "fraction": 0.01})
              for p in leaves(params)[0]]
    for m in leaves(opt_state)[0]:            # the moments (and the step count)
        m = np.asarray(m, np.float64)
        rules.append((m, {"rule": "allclose", "rtol": 0,
                          "atol": (0.02 if bf16 else 1e-4) * max(np.abs(m).max(), 1e-30)}))
    rules += [(x, {"rule": "allclose", "rtol": 1e-6, "atol": 0}) for x in leaves(scaler)[0]]
    rules.append((norm, {"rule": "allclose", "rtol": 1e-2 if bf16 else 1e-4, "atol": 0}))
    return _save(kit, name, bundle, inputs, rules)


def _nvshmem_gemm_check(kit, name, kind, shape):
    """A matmul fused with its collective over NVSHMEM on a 2-rank tp mesh
    (the issue's "2 ranks on one GPU" NVSHMEM case). `gather`:
    `op.matmul(x, w, transport="nvshmem")` with x split by rows and w by
    columns: one kernel per rank puts its rows of x into the peer's symmetric
    buffer and multiplies tiles as their rows arrive; each rank checks its
    columns. `scatter`: `r + op.matmul(x, w, transport="nvshmem")` with x
    split by columns, w and r by rows: one kernel per rank pushes each
    partial tile to the rank owning its rows and sums what arrives; each
    rank checks its rows."""
    import ml_dtypes

    import tessera as ts
    from tessera import dist, op
    bf16 = ml_dtypes.bfloat16
    m, k, n = shape
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    rng = np.random.default_rng()
    x = rng.standard_normal((m, k)).astype(bf16)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(bf16)
    r = rng.standard_normal((m, n)).astype(bf16)
    rows = dist.ShardSpec(partition=("row",), mesh_axes=("tp",))
    cols = dist.ShardSpec(partition=("col",), mesh_axes=("tp",))
    want = x.astype(np.float64) @ w.astype(np.float64)
    rule = {"rule": "allclose", "rtol": 0.03, "atol": 0.03}
    if kind == "gather":
        def column_parallel(x, w):
            return op.matmul(x, w, transport="nvshmem")
        fn, args = column_parallel, (dist.from_numpy(x, rows, mesh), dist.from_numpy(w, cols, mesh))
        parts = np.split(want, 2, axis=1)
    else:
        def row_parallel(x, w, r):
            return r + op.matmul(x, w, transport="nvshmem")
        fn, args = row_parallel, (dist.from_numpy(x, cols, mesh), dist.from_numpy(w, rows, mesh),
                                  dist.from_numpy(r, rows, mesh))
        parts = np.split(want + r.astype(np.float64), 2, axis=0)
    bundle, inputs = ts.compile(fn, mesh=mesh, target=_check_options()).build_for_ranks(*args)
    return _save(kit, name, bundle, inputs, [[(part, rule)] for part in parts], ranks=2)


def _nvshmem_moe_check(kit, name, tokens, width, hidden, experts, pack=None, multi_qp=False):
    """An MoE layer on a 2-rank ep mesh with `transport="nvshmem"`: its
    dispatch and combine are exchange kernels that put each rank's rows
    into the peer's symmetric buffer (tile/exchange.py). Tokens and experts
    split over the ranks, top-2 routing, GELU experts; each rank checks its
    tokens' outputs against the fuzzers' float64 MoE. `pack`: op.moe's
    pack_dtype (FP8 e4m3 rounds the dispatched rows to 3 mantissa bits: a
    looser tolerance); `multi_qp`: several copies per peer (the design
    docs' transport has both)."""
    from programs import moe_reference

    import tessera as ts
    from tessera import dist, op
    mesh = dist.Mesh(axes=["ep"], devices=range(2))
    rng = np.random.default_rng()
    x = rng.standard_normal((tokens, width)).astype(np.float32)
    weights = {"router": rng.standard_normal((width, experts)).astype(np.float32),
               "w1": (rng.standard_normal((experts, width, hidden))
                      / np.sqrt(width)).astype(np.float32),
               "w2": (rng.standard_normal((experts, hidden, width))
                      / np.sqrt(hidden)).astype(np.float32)}

    def moe_layer(x, ex):
        return op.moe(x, experts=ex, k=2, transport={"type": "nvshmem", "pack_dtype": pack,
                                                     "multi_qp": multi_qp}, mesh=mesh)
    want, _ = moe_reference(x, weights, 2)
    bound = {None: 1e-3, "bf16": 2e-2, "fp8_e4m3": 0.1}[pack] * float(np.abs(want).max())
    rule = {"rule": "allclose", "rtol": 0.0, "atol": bound}
    bundle, inputs = ts.compile(moe_layer, mesh=mesh, target=_check_options()).build_for_ranks(
        x, weights)
    return _save(kit, name, bundle, inputs, [[(part, rule)] for part in np.split(want, 2)],
                 ranks=2)


def _check_options():
    """The GPU target's options, with the checks' mbarrier watchdog."""
    import tessera as ts
    return ts.TargetOptions(target="gpu", wait_watchdog_s=CHECK_WATCHDOG_S)


def _compile(fn, *args, options=None):
    import tessera as ts
    return ts.jit(fn, target=options or _check_options()).build(*args)


def _save(kit: Path, name: str, bundle: Path, inputs, expected, ranks: int = 1) -> dict:
    """The check's bundle, inputs and expected outputs; with `ranks` > 1,
    `inputs` and `expected` are lists with one entry per rank."""
    folder = kit / "checks" / name
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(bundle, folder / "bundle", ignore=shutil.ignore_patterns("ir"))
    per_rank = (inputs, expected) if ranks > 1 else ([inputs], [expected])
    for rank, (ins, exp) in enumerate(zip(*per_rank)):
        ins = _save_inputs(folder / _rank_file("inputs", rank, ranks), ins)
        # float32 expectations are ample for these tolerances.
        np.savez_compressed(folder / _rank_file("expected", rank, ranks),
                            *[np.asarray(value, np.float32) for value, _ in exp])
    outputs = [{k: float(v) if isinstance(v, np.floating) else v for k, v in rule.items()}
               for _, rule in exp]
    print(f"[gpu_kit] {name}: {len(ins)} inputs, {len(outputs)} outputs"
          + (f", on each of {ranks} ranks" if ranks > 1 else ""), flush=True)
    return {"name": name, "input_dtypes": [a.dtype.name for a in ins], "outputs": outputs,
            "ranks": ranks}


def _save_inputs(path: Path, inputs) -> list:
    """`inputs` as a compressed .npz (optimizer moments start at zero; no
    pickle). .npy has no bfloat16: such inputs travel as their bits
    (uint16), with the dtypes kept beside them (`_load_inputs`)."""
    inputs = [np.asarray(a) for a in inputs]
    np.savez_compressed(path, *[a.view(np.uint16) if a.dtype.name == "bfloat16" else a
                                for a in inputs])
    return inputs


def _load_inputs(path: Path, dtypes) -> list:
    import ml_dtypes
    with np.load(path, allow_pickle=False) as npz:
        inputs = [npz[f"arr_{i}"] for i in range(len(npz.files))]
    return [a.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else a
            for a, dtype in zip(inputs, dtypes)]


def _rank_file(kind: str, rank: int, ranks: int) -> str:
    return f"{kind}.npz" if ranks == 1 else f"{kind}.rank{rank}.npz"


CHECKS = {
    "gemm-mma.sync-relu": lambda kit, n: _gemm_check(kit, n, None, (0, 1024, 512, 768), "relu"),
    "gemm-wgmma-tma-producer-128x256x64-s4-gelu": lambda kit, n: _gemm_check(
        kit, n, (128, 256, 64, (8, 1), 4, True, {}), (0, 512, 640, 512), "gelu"),
    "gemm-wgmma-tma-thread0-128x256x64-s4-gelu": lambda kit, n: _gemm_check(
        kit, n, (128, 256, 64, (8, 1), 4, True, {"producer": False}), (0, 512, 640, 512), "gelu"),
    "gemm-wgmma-tma-128x128x64-s3-gelu": lambda kit, n: _gemm_check(
        kit, n, (128, 128, 64, (8, 1), 3, True, {}), (0, 512, 640, 512), "gelu"),
    "gemm-wgmma-tma-batched-relu": lambda kit, n: _gemm_check(
        kit, n, (128, 128, 64, (8, 1), 3, True, {}), (2, 256, 320, 256), "relu"),
    "gemm-wgmma-cp.async-128x256x64-s4-gelu": lambda kit, n: _gemm_check(
        kit, n, (128, 256, 64, (8, 1), 4, True, {"tma": False}), (0, 512, 640, 512), "gelu"),
    "attention-causal-d64": lambda kit, n: _attention_check(kit, n, (1, 2, 256, 64)),
    "attention-causal-d128": lambda kit, n: _attention_check(kit, n, (1, 2, 256, 128)),
    "attention-causal-d128-pingpong-128x64": lambda kit, n: _attention_check(
        kit, n, (1, 2, 256, 128), "wgmma-pingpong:128x64"),
    "attention-causal-d64-ahead": lambda kit, n: _attention_check(
        kit, n, (1, 2, 256, 64), "wgmma-ahead"),
    "attention-causal-d128-ahead-128x64": lambda kit, n: _attention_check(
        kit, n, (1, 2, 256, 128), "wgmma-ahead:128x64"),
    "nvshmem-gathered-gemm-2-ranks": lambda kit, n: _nvshmem_gemm_check(
        kit, n, "gather", (512, 256, 512)),
    "nvshmem-scattered-gemm-2-ranks": lambda kit, n: _nvshmem_gemm_check(
        kit, n, "scatter", (512, 512, 512)),
    # (Small: each rank's inputs hold every expert's weights, and the kit
    # travels to the GPU in one 64 MiB carry.)
    "nvshmem-moe-exchange-2-ranks": lambda kit, n: _nvshmem_moe_check(kit, n, 256, 128, 128, 4),
    "nvshmem-moe-exchange-fp8-2-ranks": lambda kit, n: _nvshmem_moe_check(
        kit, n, 256, 128, 128, 4, "fp8_e4m3", multi_qp=True),
    "gpt-step-fp32": lambda kit, n: _gpt_step_check(kit, n, "fp32"),
    "gpt-step-bf16": lambda kit, n: _gpt_step_check(kit, n, "bf16"),
}


# -- the profiler, the cost model and the autotuner's candidates on the GPU ---------

#: The example GPT's bf16 training step (width, depth, heads, length, batch)
#: at a size whose kernels, not their launches, fill most of an H100's step.
PROFILE_CASE = tuple(int(v) for v in os.environ.get("GPU_KIT_PROFILE_CASE",
                                                   "512,2,8,128,16").split(","))
PROFILE_STEPS = int(os.environ.get("GPU_KIT_PROFILE_STEPS", "20"))
#: The autotuner's first candidates for one GPU (`tessera.autotune`: the
#: default options, then each other GEMM configuration order, ...), timed in
#: turns as `autotune.tune` times them, `TUNE_ROUNDS` runs each.
TUNE_CANDIDATES = 4
TUNE_ROUNDS = int(os.environ.get("GPU_KIT_TUNE_ROUNDS", "10"))


def _build_profile(kit: Path) -> None:
    """kit/profile: the step's bundle for each autotuning candidate (the
    first is the default options), its inputs, and the cost model's
    prediction of the default on h100-node."""
    import tessera as ts
    import train_gpt as g
    from tessera import autotune
    folder = kit / "profile"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    step, args = g.step_case(*PROFILE_CASE, "bf16",
                             seed=int(np.random.default_rng().integers(1 << 30)))
    base = ts.TargetOptions(target="gpu")
    cost = ts.graph.trace(ts.jit(step.fn, target=base), *args).cost("h100-node")
    names = []
    for i, options in enumerate(autotune._candidates(base, 1)[:TUNE_CANDIDATES]):
        bundle, inputs = ts.jit(step.fn, target=options).build(*args)
        shutil.copytree(bundle, folder / f"candidate{i}", ignore=shutil.ignore_patterns("ir"))
        changes = autotune._changes(options, base)
        if "gemm-configs" in changes:            # an order of configurations: its first
            changes["gemm-configs"] = changes["gemm-configs"].split(",")[0] + ",..."
        names.append(autotune._describe(changes))
    # The weights would take 25 MiB of the call's 64 (random bits do not
    # compress), and a step's time does not depend on their values: large
    # floating-point inputs travel as their scale and are drawn again there;
    # the rest (tokens, step counts, small tensors) as they are.
    inputs = [np.asarray(a) for a in inputs]
    redrawn = [a.dtype.kind == "f" or a.dtype.name == "bfloat16" for a in inputs]
    redrawn = [r and a.size > 4096 for r, a in zip(redrawn, inputs)]
    _save_inputs(folder / "inputs.npz", [np.asarray(a.shape) if r else a
                                         for a, r in zip(inputs, redrawn)])
    predicted = cost.ranks[0]
    (folder / "profile.json").write_text(json.dumps({
        "case": dict(zip(("width", "depth", "heads", "length", "batch"), PROFILE_CASE)),
        "precision": "bf16", "candidates": names,
        "input_dtypes": [a.dtype.name for a in inputs],
        "redrawn_std": [float(np.asarray(a, np.float64).std()) if r else None
                        for a, r in zip(inputs, redrawn)],
        "predicted": {"machine": cost.machine.name, "step_s": predicted.step_s,
                      "parts": predicted.parts}}, indent=1))
    print(f"[gpu_kit] profile: the GPT step at {PROFILE_CASE}, {len(names)} autotuning "
          f"candidates, {predicted.step_s * 1e3:.2f} ms predicted on {cost.machine.name}",
          flush=True)


def _profile_main(kit: Path, out: Path, engine: str = "cuda") -> int:
    """(The GPU's side, a process of its own.) The autotuning candidates
    timed in turns, then the default's step profiled by the runtime's
    recorder (CUDA events) and summarised by `dist.profile`'s own functions:
    OUT/profile-gpt-step-bf16.json (the Perfetto trace) and one line
    `PROFILE {json}` on stdout."""
    import importlib.util
    import statistics

    import tessera_runtime
    from tessera_runtime import profiler
    # tessera.profiling needs only numpy and the runtime; the package around
    # it needs the compiler, which the GPU machine has not.
    spec = importlib.util.spec_from_file_location("tessera_profiling",
                                                  ROOT / "tessera" / "profiling.py")
    profiling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profiling)
    folder = kit / "profile"
    meta = json.loads((folder / "profile.json").read_text())
    import ml_dtypes
    rng = np.random.default_rng()
    stored = _load_inputs(folder / "inputs.npz", ["stored"] * len(meta["input_dtypes"]))
    inputs = [(rng.standard_normal(tuple(a)) * std).astype(
                  ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype) if std is not None
              else a.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else a
              for a, dtype, std in zip(stored, meta["input_dtypes"], meta["redrawn_std"])]
    programs = [tessera_runtime.load_bundle(folder / f"candidate{i}", engine=engine)
                for i in range(len(meta["candidates"]))]

    def timed(program, args=inputs, **options) -> float:
        t0 = time.perf_counter()
        program.run(args, **options)
        return time.perf_counter() - t0

    def profiled(run) -> tuple:
        """(step times, the recorder, dist.profile's record of it) of
        PROFILE_STEPS calls of `run`, recorded."""
        rec = profiler.start()
        seconds = [run() for _ in range(PROFILE_STEPS)]
        profiler.stop(rec)
        return seconds, rec, {"rank": 0, "t_start": rec.t_start, "t_stop": rec.t_stop,
                              "groups": {}, "slices": [list(s) for s in rec.slices]}

    default = programs[0]
    # The state a training loop keeps on the device (uploaded once), as
    # autotune.tune times its candidates: outputs left there, no host copies.
    resident = [default.engine.from_host(a) for a in inputs]

    def timed_resident(program=default) -> float:
        return timed(program, resident, device_outputs=True)

    for program in programs:             # warm-up: module loads, first allocations
        timed_resident(program)
    rounds = [[timed_resident(p) for p in programs] for _ in range(TUNE_ROUNDS)]
    tuned = [statistics.median(r[i] for r in rounds) for i in range(len(programs))]
    off = [timed(default) for _ in range(PROFILE_STEPS)]
    on, rec, record = profiled(lambda: timed(default))
    balance = profiling.balance([record], PROFILE_STEPS)[0]
    (out / "profile-gpt-step-bf16.json").write_text(
        json.dumps(profiling.perfetto_trace([record], [0.0])))
    # The same step with its inputs already on the device and its outputs
    # left there (Program.run(device_outputs=True)), as a training loop that
    # keeps its state on the GPU runs it: no host copies.
    on_device = [timed_resident() for _ in range(PROFILE_STEPS)]
    device_balance = profiling.balance([profiled(timed_resident)[2]], PROFILE_STEPS)[0]

    # And donated (Program.run(donate=True)): the run takes the state's
    # buffers instead of copying them. Each run donates its own device copy,
    # all made before the timed (or profiled) runs: this loop reuses one
    # input set where a training loop would donate last step's outputs.
    def donated_runs():
        copies = iter([[default.engine.from_host(a) for a in resident]
                       for _ in range(PROFILE_STEPS)])
        return lambda: timed(default, next(copies), device_outputs=True, donate=True)

    timed_donated = donated_runs()
    donated = [timed_donated() for _ in range(PROFILE_STEPS)]
    donated_balance = profiling.balance([profiled(donated_runs())[2]], PROFILE_STEPS)[0]
    compute = [s for s in rec.slices if s[2] == "compute"]
    launches = sum(ins.op == "launch" for ins in default.bundle.program.instructions)
    problems = []
    # Launches of empty tensors are skipped, so a run may launch fewer
    # kernels than the program has launch instructions, but every run the same.
    per_run = len(compute) / PROFILE_STEPS
    if not (per_run == int(per_run) and 0 < per_run <= launches):
        problems.append(f"{len(compute)} kernel slices for {PROFILE_STEPS} runs of at most "
                        f"{launches} launches")
    if any(not s[3] < s[4] for s in compute):
        problems.append("kernel slices of zero or negative length")
    if sum(s[2] == "run" for s in rec.slices) != PROFILE_STEPS:
        problems.append("not one run slice per run")
    if balance["compute"] > balance["window"]:
        problems.append("more kernel time than the profiled window")
    per_step = {k: balance[k] / PROFILE_STEPS for k in ("compute", "overhead", "idle")}
    print("PROFILE " + json.dumps({
        "problems": problems, "launches": int(per_run),
        "streams": sorted({s[0] for s in rec.slices}),
        "step_s": statistics.median(off), "profiled_step_s": statistics.median(on),
        "measured": per_step, "predicted": meta["predicted"],
        "tuned": [{"options": name, "step_s": t} for name, t in zip(meta["candidates"], tuned)],
        "device_resident_step_s": statistics.median(on_device),
        "donated_step_s": statistics.median(donated),
        "table": profiling._table([balance]),
        "device_resident_table": profiling._table([device_balance]),
        "donated_table": profiling._table([donated_balance])}), flush=True)
    return 0


def _run_profile(kit: Path, out: Path, report: "_Report", timeout: float) -> None:
    """`_profile_main` in a process of its own: the check passes when the
    trace holds every kernel launch of every profiled run with a positive
    length; the figures go to report.profile."""
    if not (kit / "profile" / "profile.json").exists():
        return
    start = time.monotonic()
    status, output = _isolated([sys.executable, __file__, "profile", str(kit), str(out)],
                               timeout, os.environ.copy())
    line = next((l for l in output.splitlines() if l.startswith("PROFILE ")), None)
    if status != 0 or line is None:
        killed = _killed(timeout, False) + ": " if status is None else ""
        report.check("profile-gpt-step-bf16", False, killed + output[-3000:],
                     time.monotonic() - start)
        return
    result = json.loads(line[len("PROFILE "):])
    report.profile = result
    predicted, measured = result["predicted"], result["measured"]
    tuned = min(result["tuned"], key=lambda t: t["step_s"])
    detail = (f"{result['launches']} launches per step on {', '.join(result['streams'])}; step "
              f"{result['step_s'] * 1e3:.2f} ms ({result['profiled_step_s'] * 1e3:.2f} ms "
              f"profiled), kernels {measured['compute'] * 1e3:.2f} ms; predicted on "
              f"{predicted['machine']}: step {predicted['step_s'] * 1e3:.2f} ms, kernels "
              f"{predicted['parts']['compute'] * 1e3:.2f} ms; autotuning's fastest: "
              f"{tuned['options']} {tuned['step_s'] * 1e3:.2f} ms vs "
              f"{result['tuned'][0]['step_s'] * 1e3:.2f} ms; with its state kept on the device: "
              f"step {result['device_resident_step_s'] * 1e3:.2f} ms, donated "
              f"{result['donated_step_s'] * 1e3:.2f} ms")
    report.check("profile-gpt-step-bf16", not result["problems"],
                 "; ".join(result["problems"]) or detail, time.monotonic() - start)
    print(result["table"], flush=True)
    print("state kept on the device (Program.run(device_outputs=True)):\n"
          + result["device_resident_table"], flush=True)
    print("and donated to the run (Program.run(donate=True)):\n"
          + result["donated_table"], flush=True)


def build(kit: Path, only=None, benchmarks: bool = True) -> int:
    kit.mkdir(parents=True, exist_ok=True)
    # The example model, the attention reference the tests use, the fuzzers'
    # MoE reference.
    sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "test" / "python"),
                    str(ROOT / "test" / "python" / "fuzz")]
    unknown = set(only or ()) - set(CHECKS)
    if unknown:
        raise SystemExit(f"gpu_kit: no check named {', '.join(sorted(unknown))}; "
                         f"the checks are {', '.join(CHECKS)}")
    checks = [make(kit, name) for name, make in CHECKS.items() if not only or name in only]
    (kit / "checks.json").write_text(json.dumps(checks, indent=1))
    if not only:
        _build_profile(kit)
    for script in BENCHMARKS if benchmarks else ():
        subprocess.run([sys.executable, str(ROOT / "bench" / script), "--kit", str(kit),
                        "--build-only"], check=True)
    # The GPU machine cannot reach a package index; gpu_session.sh installs
    # these from the kit where they are missing: ml_dtypes (bfloat16 on the
    # host) and nvshmem4py (the NVSHMEM check's symmetric heap; it loads the
    # NVSHMEM host library of the machine's nvidia-nvshmem wheel).
    wheels = ["ml_dtypes"] * benchmarks + ["nvshmem4py-cu13"] * any(
        c.get("ranks", 1) > 1 for c in checks)
    for wheel in wheels:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", wheel,
                              "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                              "--platform", "manylinux2014_x86_64", "-d", str(kit / "wheels")],
                             capture_output=True, text=True)
        if got.returncode != 0:
            print(f"[gpu_kit] could not download a {wheel} wheel (the GPU machine must have "
                  f"it): {got.stderr.strip()[-300:]}")
    (kit / "build.json").write_text(json.dumps(_build_versions(), indent=1))
    size = sum(f.stat().st_size for f in kit.rglob("*") if f.is_file())
    print(f"[gpu_kit] {kit}: {len(checks)} checks, {size / 2**20:.1f} MiB")
    return 0


def _build_versions() -> dict:
    """What the kit was built with (the GPU side prints it beside its own)."""
    from importlib import metadata
    from tessera_compiler.codegen.build import nvcc
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    nvcc_version = subprocess.run([nvcc(), "--version"], capture_output=True,
                                  text=True).stdout.strip().splitlines()[-1] if nvcc() else None
    try:
        nvshmem = metadata.version("nvidia-nvshmem-cu13")
    except metadata.PackageNotFoundError:
        nvshmem = None
    return {"commit": commit, "nvcc": nvcc_version, "nvshmem_device_library": nvshmem}


# -- run (the GPU's side: runtime only) -------------------------------------------

def _compare(got: np.ndarray, want: np.ndarray, rule: dict) -> tuple[bool, str]:
    got = np.asarray(got).astype(np.float64)
    if got.shape != want.shape:
        return False, f"shape {got.shape}, expected {want.shape}"
    if not np.isfinite(got).all():
        return False, f"{int((~np.isfinite(got)).sum())} non-finite values"
    diff = np.abs(got - want)
    if rule["rule"] == "adamw_param":
        off = diff > rule["atol"]
        ok = off.mean() <= rule["fraction"] and diff.max() <= 2 * ADAMW_LR + rule["atol"]
        return ok, f"max |diff| {diff.max():.2e}, {off.mean():.2%} beyond {rule['atol']:g}"
    bound = rule["atol"] + rule["rtol"] * np.abs(want)
    return bool((diff <= bound).all()), (f"max |diff| {diff.max():.2e} (bound at that element "
                                         f"{bound.flat[diff.argmax()]:.2e})")


def _run_one(kit: Path, check: dict, engine: str, rank: int = 0) -> tuple[bool, str]:
    """Runs `check`'s bundle in this process (as `rank` of a multi-rank
    check) and compares its outputs."""
    import tessera_runtime
    folder = kit / "checks" / check["name"]
    ranks = check.get("ranks", 1)
    program = tessera_runtime.load_bundle(folder / "bundle", engine=engine)
    inputs = _load_inputs(folder / _rank_file("inputs", rank, ranks), check["input_dtypes"])
    with np.load(folder / _rank_file("expected", rank, ranks), allow_pickle=False) as npz:
        expected = [npz[f"arr_{i}"].astype(np.float64) for i in range(len(npz.files))]
    got = program.run(inputs)
    verdicts = [_compare(g, e, o) for g, e, o in zip(got, expected, check["outputs"])]
    if len(got) != len(check["outputs"]):
        verdicts.append((False, f"{len(got)} outputs, expected {len(check['outputs'])}"))
    ok = all(v[0] for v in verdicts)
    return ok, ("; ".join(f"out{i}: {v[1]}" for i, v in enumerate(verdicts) if not v[0])
                or "; ".join(v[1] for v in verdicts[:3]))


def _isolated(argv: list[str], timeout: float, env: dict) -> tuple[int | None, str]:
    """Runs `argv` in its own session, killing the whole process group (an
    mpiexec and its ranks too) after `timeout` seconds: (exit status, or
    None if it was killed; stdout + stderr). A kernel that hangs, or an
    illegal address that poisons a CUDA context, stays in its process."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out + err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:      # it ended on its own meanwhile
            pass
        try:        # a process that left the group may still hold the pipes
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = "", "(its output pipes stayed open after the kill)"
        return None, (out or "") + (err or "")


def _killed(seconds: float, cut_short: bool) -> str:
    """What a killed step's report says: after how long, and why."""
    return (f"killed after {seconds:.0f} s ("
            + ("all the run's deadline left it" if cut_short else
               "its time limit: a kernel that never finishes?") + ")")


def _run_check(kit: Path, check: dict, engine: str, timeout: float,
               cut_short: bool = False) -> tuple[bool, str]:
    """Runs a check in a process of its own (`gpu_kit.py rank`; a multi-rank
    check under mpiexec, one process per rank, all on the one GPU) and
    gathers the ranks' verdicts."""
    ranks = check.get("ranks", 1)
    # Each rank writes its verdict to a file of its own: lines that ranks print
    # reach mpiexec's stdout interleaved, even mid-line.
    with tempfile.TemporaryDirectory(prefix="gpu_kit_verdicts_") as verdict_dir:
        argv = [sys.executable, __file__, "rank", str(kit), check["name"], "--engine", engine,
                "--verdict-dir", verdict_dir]
        if ranks > 1:
            argv = [_mpiexec(), "-n", str(ranks)] + argv
        status, output = _isolated(argv, timeout, _mpi_env())
        verdicts = [json.loads(f.read_text()) for f in Path(verdict_dir).glob("rank*.json")]
    if status is None:
        return False, (f"{_killed(timeout, cut_short)} with {len(verdicts)} of {ranks} "
                       f"verdicts: {output[-2000:]}")
    if status != 0 or len(verdicts) != ranks:
        return False, (f"{'mpiexec -n %d' % ranks if ranks > 1 else 'the check'} exited "
                       f"{status} with {len(verdicts)} of {ranks} verdicts: {output[-2000:]}")
    verdicts.sort(key=lambda v: v["rank"])
    if ranks == 1:
        return verdicts[0]["ok"], verdicts[0]["detail"]
    return (all(v["ok"] for v in verdicts),
            "; ".join(f"rank {v['rank']}: {v['detail']}" for v in verdicts))


def _rank_main(kit: Path, name: str, engine: str, verdict_dir: Path) -> int:
    """One check in this process (one rank of it, under mpiexec): writes its
    verdict to VERDICT_DIR/rank<r>.json."""
    import tessera_runtime
    rank = tessera_runtime.world()[0]
    check = next(c for c in json.loads((kit / "checks.json").read_text()) if c["name"] == name)
    try:
        ok, detail = _run_one(kit, check, engine, rank)
    except Exception as e:             # reported, not raised: the other rank may be waiting
        ok, detail = False, f"{type(e).__name__}: {e}"
    verdict = json.dumps({"rank": rank, "ok": ok, "detail": detail})
    partial = verdict_dir / f"rank{rank}.json.partial"    # read whole or not at all
    partial.write_text(verdict)
    partial.rename(verdict_dir / f"rank{rank}.json")
    return 0


class _Report:
    """OUT/gpu_checks.json, rewritten after every step, so that a session
    cut off by its time limit still brings back what it finished."""

    def __init__(self, out: Path, engine: str):
        self.path, self.engine = out / "gpu_checks.json", engine
        self.checks, self.benchmarks, self.profile = [], {}, None

    def check(self, name: str, ok: bool, detail: str, seconds: float) -> None:
        self.checks.append({"check": name, "ok": ok, "detail": detail, "seconds": seconds})
        print(f"{'PASS' if ok else 'FAIL'} {name} ({seconds:.0f} s): {detail}", flush=True)
        self.write()

    def write(self) -> None:
        self.path.write_text(json.dumps({"engine": self.engine, "checks": self.checks,
                                         "profile": self.profile,
                                         "benchmarks": self.benchmarks}, indent=1))


def _run_checks(kit: Path, engine: str, report: _Report, timeout: float, until: float,
                only=None) -> None:
    """Every check, each given `timeout` seconds but none past `until`
    (time.monotonic()); those left when time runs out are reported not run."""
    for check in json.loads((kit / "checks.json").read_text()):
        if only and check["name"] not in only:
            continue
        start = time.monotonic()
        if until - start < min(timeout, 10):
            report.check(check["name"], False, "not run: out of time", 0.0)
            continue
        try:
            ok, detail = _run_check(kit, check, engine, min(timeout, until - start),
                                    cut_short=until - start < timeout)
        except Exception as e:             # a failing check must not stop the others
            ok, detail = False, f"{type(e).__name__}: {e}"
        report.check(check["name"], ok, detail, time.monotonic() - start)


def _mpiexec() -> str:
    return shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")


def _mpi_env() -> dict:
    """Ranks share the one GPU; only the runtime is importable."""
    env = {**os.environ, "NCCL_MULTI_RANK_GPU_ENABLE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("TESSERA_EMULATOR_WAIT_S", "120")   # the emulator's limit on a signal wait
    return env


def _run_nccl(report: _Report, timeout: float) -> None:
    """The NCCL communicators on 2 ranks of one GPU (test/runtime/nccl_worker.py)."""
    start = time.monotonic()
    mpiexec = _mpiexec()
    if not os.path.exists(mpiexec):
        report.check("nccl-2-ranks", False, "no mpiexec", 0.0)
        return
    status, output = _isolated([mpiexec, "-n", "2", sys.executable,
                                str(ROOT / "test" / "runtime" / "nccl_worker.py")],
                               timeout, _mpi_env())
    ok = status == 0 and output.count("PASS") >= 12
    why = "" if status is not None else _killed(timeout, False) + ": "
    if "Duplicate GPU detected" in output:
        why = ("not run: NCCL refuses two ranks on one GPU before 2.32 (2.32 allows it with "
               "NCCL_MULTI_RANK_GPU_ENABLE=1); this needs a machine of 2 GPUs or a newer "
               "NCCL: ")
    report.check("nccl-2-ranks", ok, why + output[-3000:], time.monotonic() - start)


def _benchmark_runs(only=None) -> list[tuple[str, str]]:
    """(script, variant) per benchmark process: one variant each, so that a
    variant that hangs or faults costs only its own rows. `only`: just
    these variants (names of either script's)."""
    from attention_cuda import DEFAULT_VARIANTS
    from gemm_cuda import VARIANTS
    runs = [("gemm_cuda.py", v) for v in VARIANTS] + \
        [("attention_cuda.py", v) for v in DEFAULT_VARIANTS]
    return [r for r in runs if not only or r[1] in only]


def _run_benchmarks(kit: Path, out: Path, report: _Report, timeout: float, until: float,
                    only=None) -> None:
    """Each benchmark variant in its own process (`--append` gathers their
    rows into the day's results file), the results files copied to OUT
    after each."""
    for script, variant in _benchmark_runs(only):
        start = time.monotonic()
        budget = min(timeout, until - start)
        key = f"{script} {variant}"
        if budget < min(timeout, 20):
            report.benchmarks[key] = {"returncode": None, "output": "not run: out of time"}
            report.write()
            continue
        status, output = _isolated([sys.executable, str(ROOT / "bench" / script), "--kit",
                                    str(kit), "--variants", variant, "--append"],
                                   budget, os.environ.copy())
        if status is None:
            output = _killed(budget, budget < timeout) + "\n" + output
        report.benchmarks[key] = {"returncode": status, "seconds": time.monotonic() - start,
                                  "output": output[-6000:]}
        print(f"[gpu_kit] {key}: exit {status}\n{output[-3000:]}", flush=True)
        # Today's files only: OUT brings back 8 files at most.
        for f in (ROOT / "bench" / "results").glob(f"*_cuda-{time.strftime('%Y-%m-%d')}*"):
            shutil.copy(f, out / f.name)
        report.write()


def run(kit: Path, out: Path, engine: str = "cuda", benchmarks: bool = True,
        deadline: float = 560, check_timeout: float = 120, bench_timeout: float = 150,
        bench_reserve: float = 300, bench_only=None, only=None) -> int:
    """The kit's checks on `engine` (`cuda-emulated` runs them on the CPU,
    which is how the kit itself is tested), then, on a GPU, NCCL and the
    benchmarks, all within `deadline` seconds: the checks leave the last
    `bench_reserve` of them to the benchmarks."""
    out.mkdir(parents=True, exist_ok=True)
    until = time.monotonic() + deadline
    gpu = engine == "cuda"
    benchmarks = gpu and benchmarks
    report = _Report(out, engine)
    _run_checks(kit, engine, report, check_timeout, until - bench_reserve * benchmarks, only)
    if gpu and (not only or "profile-gpt-step-bf16" in only):
        _run_profile(kit, out, report, max(10.0, min(check_timeout, until - time.monotonic())))
    if gpu and (not only or "nccl-2-ranks" in only):
        _run_nccl(report, max(10.0, min(check_timeout, until - time.monotonic())))
    if benchmarks:
        _run_benchmarks(kit, out, report, bench_timeout, until, bench_only)
    report.write()
    failed = [r["check"] for r in report.checks if not r["ok"]]
    print(f"[gpu_kit] {len(report.checks) - len(failed)}/{len(report.checks)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the checks and benchmarks into KIT (no GPU needed)")
    b.add_argument("kit", type=Path)
    b.add_argument("--only", nargs="+", metavar="CHECK", help=f"just these: {', '.join(CHECKS)}")
    r = sub.add_parser("run", help="run KIT's checks and benchmarks on the GPU (no compiler "
                                   "needed); results into OUT")
    r.add_argument("kit", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--engine", default="cuda", choices=["cuda", "cuda-emulated"],
                   help="cuda-emulated: run the checks on the CPU emulator instead (slow)")
    r.add_argument("--deadline", type=float, default=560, metavar="S",
                   help="finish within S seconds (a lent GPU machine's call has 600): steps "
                        "that would start too late are reported not run (default 560)")
    r.add_argument("--check-timeout", type=float, default=120, metavar="S",
                   help="kill a check's processes after S seconds (default 120)")
    r.add_argument("--bench-timeout", type=float, default=150, metavar="S",
                   help="kill a benchmark variant's process after S seconds (default 150)")
    r.add_argument("--bench-reserve", type=float, default=300, metavar="S",
                   help="the checks stop S seconds before the deadline, which the "
                        "benchmarks keep (default 300)")
    r.add_argument("--only", nargs="+", metavar="CHECK",
                   help="just these checks (names as `build --only` takes them, or "
                        "profile-gpt-step-bf16, nccl-2-ranks)")
    r.add_argument("--bench-only", nargs="+", metavar="VARIANT",
                   help="just these benchmark variants (gemm_cuda.py's or attention_cuda.py's "
                        "names, e.g. producer wgmma-ahead)")
    for p in (b, r):
        p.add_argument("--no-benchmarks", action="store_true", help="checks only")
    prof = sub.add_parser("profile", help="(internal) time the autotuning candidates and "
                                          "profile the GPT step in this process")
    prof.add_argument("kit", type=Path)
    prof.add_argument("out", type=Path)
    prof.add_argument("--engine", default="cuda", choices=["cuda", "cuda-emulated"])
    one = sub.add_parser("rank", help="(internal) run one check in this process: one rank of "
                                      "it under mpiexec")
    one.add_argument("kit", type=Path)
    one.add_argument("check")
    one.add_argument("--engine", default="cuda", choices=["cuda", "cuda-emulated"])
    one.add_argument("--verdict-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    if args.command == "rank":
        return _rank_main(args.kit, args.check, args.engine, args.verdict_dir)
    if args.command == "profile":
        return _profile_main(args.kit, args.out, args.engine)
    if args.command == "build":
        return build(args.kit, args.only, not args.no_benchmarks)
    return run(args.kit, args.out, args.engine, not args.no_benchmarks, args.deadline,
               args.check_timeout, args.bench_timeout, args.bench_reserve, args.bench_only,
               args.only)


if __name__ == "__main__":
    raise SystemExit(main())
