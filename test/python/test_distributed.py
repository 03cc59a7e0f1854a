"""Distributed training for real: a GPT on a dp x tp mesh against one device,
deterministic and batch-invariant data parallelism, ZeRO, the launcher's
failure handling and the communication trace. Multi-rank cases run as MPI
jobs (test/python/workers/); fresh random seeds every run."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import dist

WORKERS = Path(__file__).resolve().parent / "workers"


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**31)


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_gpt_on_dp2_tp2_matches_single_device_for_50_steps(run_mpi, tmp_path):
    """Acceptance: the example GPT, Megatron tensor parallel over tp and data
    parallel over dp (4 ranks), follows single-device training step by step."""
    seed = _seed()
    _ok(run_mpi(1, WORKERS / "gpt_mesh_worker.py", seed, 1, 1, 50, tmp_path, timeout=300))
    _ok(run_mpi(4, WORKERS / "gpt_mesh_worker.py", seed, 2, 2, 50, tmp_path, timeout=600))
    one, mesh = np.load(tmp_path / "gpt-dp1-tp1.npz"), np.load(tmp_path / "gpt-dp2-tp2.npz")
    assert len(one["losses"]) == 50 and one["losses"][-1] < one["losses"][0] - 0.5
    # fp32 sums in another order drift apart over 50 Adam steps: seed
    # 1649813110 reaches 7.2e-5 at step 44 (the same before and after the
    # NVSHMEM work), so 2e-5 was flaky; a wrong shard or gradient is off by
    # far more than 1e-4 within a few steps.
    np.testing.assert_allclose(mesh["losses"], one["losses"], rtol=1e-4, atol=1e-4,
                               err_msg=f"seed {seed}")
    # Parameters: seed 1903057906 puts one wqkv element 1.51e-4 apart (-0.03275
    # vs -0.03260) after 50 steps, on the base commit a0010cc as well: the
    # same fp32 drift, so 2e-4; a wrong shard is off by the weight itself.
    for name in one.files:
        np.testing.assert_allclose(mesh[name], one[name], rtol=1e-3, atol=2e-4,
                                   err_msg=f"{name}, seed {seed}")


def test_pipelined_gpt_on_dp_tp_pp_meshes_matches_single_device(run_mpi, tmp_path):
    """Issue 26, hybrid meshes: the example GPT with its two blocks as two
    pipeline stages (examples/train_gpt.py make_pipeline_step) on pp=2 x
    dp=2 (1F1B) and dp=2 x tp=2 x pp=2 (8 ranks, GPipe) follows
    single-device training step by step for 10 steps, the batch in 2
    microbatches (each dp rank's rows cut in two). Measured: losses and
    parameters within 1e-6 of one device (seed 5). (pp x tp is not a job of
    its own: the 8-rank mesh holds it, and test_pipeline.py runs every
    schedule on 4 ranks.)"""
    seed = _seed()
    depth = "depth=2"
    _ok(run_mpi(1, WORKERS / "gpt_mesh_worker.py", seed, 1, 1, 10, tmp_path, "fp32", depth,
                timeout=300))
    one = np.load(tmp_path / "gpt-dp1-tp1-d2.npz")
    assert one["losses"][-1] < one["losses"][0]
    for n, dp, tp, schedule in ((4, 2, 1, "1F1B"), (8, 2, 2, "gpipe")):
        _ok(run_mpi(n, WORKERS / "gpt_mesh_worker.py", seed, dp, tp, 10, tmp_path, "fp32",
                    "pp=2", "mb=2", f"schedule={schedule}", depth, timeout=600))
        piped = np.load(tmp_path / f"gpt-dp{dp}-tp{tp}-pp2-d2.npz")
        what = f"dp={dp} tp={tp} pp=2 {schedule}, seed {seed}"
        np.testing.assert_allclose(piped["losses"], one["losses"], rtol=1e-5, atol=1e-5,
                                   err_msg=what)
        for name in one.files:
            # AdamW divides by sqrt(v): a near-zero gradient's rounding can move
            # its parameter by a share of lr (3e-3) per step. Zero bubble (its
            # weight gradients summed in another order) moved one of 3072
            # blocks.1.wqkv entries by 3.7e-5 (seed 1931018285; the same bits on
            # the commit before op.moe) and 1.2e-4 (seed 2056871502) in 20
            # steps; a third of one step's lr bounds that, not 2e-5.
            np.testing.assert_allclose(piped[name], one[name], rtol=1e-4, atol=1e-3,
                                       err_msg=f"{name}, {what}")


def test_gpt_in_bf16_on_tp2_follows_single_device(run_mpi, tmp_path):
    """bf16 autocast under tensor parallelism: its collectives carry bf16
    activations (MPI moves their bits, reduces them in float32 and rounds
    once), and 2 tp ranks follow one device to bf16 rounding for 20 steps.
    Measured: losses within 1.4e-3 and parameters within 1.1e-2 for seeds
    1-9, but seed 827540306 has one step (17) 1.15e-2 apart (its neighbours
    within 2.4e-3; the same on f44bd5d, before the NVRTC and get work):
    a bf16 rounding flip moves one batch's loss. So the first 5 steps, before
    rounding differences compound, are held to 2e-3, and all 20 to 2e-2; a
    wrong shard or gradient is off by far more from the first step."""
    seed = _seed()
    _ok(run_mpi(1, WORKERS / "gpt_mesh_worker.py", seed, 1, 1, 20, tmp_path, "bf16",
                timeout=300))
    _ok(run_mpi(2, WORKERS / "gpt_mesh_worker.py", seed, 1, 2, 20, tmp_path, "bf16",
                timeout=300))
    one, mesh = (np.load(tmp_path / f"gpt-dp1-tp{tp}-bf16.npz") for tp in (1, 2))
    assert one["losses"][-1] < one["losses"][0] - 0.2
    np.testing.assert_allclose(mesh["losses"][:5], one["losses"][:5], rtol=0, atol=2e-3,
                               err_msg=f"seed {seed}")
    np.testing.assert_allclose(mesh["losses"], one["losses"], rtol=0, atol=2e-2,
                               err_msg=f"seed {seed}")
    for name in one.files:
        np.testing.assert_allclose(mesh[name], one[name], rtol=0, atol=4e-2,
                                   err_msg=f"{name}, seed {seed}")


def test_hierarchical_all_reduce_on_two_nodes_of_two_equals_the_flat_one(tessera_launch,
                                                                         tmp_path):
    """Issue 29 item 4b: 4 CPU ranks as 2 nodes of 2 (`tessera launch
    --ranks-per-node 2`): a data-parallel gradient step's all-reduce over dp
    compiles to reduce-scatter inside each node ("dp:(2)2"), all-reduce
    across nodes ("dp:(1)2"), all-gather inside each node; its results equal
    the flat all-reduce's (the same bits in deterministic mode) and float64
    numpy's."""
    seed = _seed()
    proc = tessera_launch("-n", 4, "--ranks-per-node", 2, WORKERS / "hierarchical_worker.py",
                          seed, tmp_path)
    _ok(proc)
    report = json.loads((tmp_path / "hierarchical.json").read_text())
    assert report["from_launcher"], report
    for mode in ("plain", "deterministic"):
        got = report[mode]
        assert got["sub_axes"] and not got["flat_has_sub_axes"], (mode, got)
        assert got["max_err"] < 1e-5, (mode, got, seed)
        assert got["max_diff"] < 1e-5, (mode, got, seed)
    assert report["deterministic"]["same_bits"], (report, seed)


def test_deterministic_runs_are_reproducible_and_batch_invariant_over_dp_1_2_4(run_mpi,
                                                                               tmp_path):
    """Deterministic mode with gradients accumulated over 4 microbatches:
    two dp=2 runs give the same bits, and so do dp=1 and dp=4 (the tree is
    over microbatches) for the gradients and parameters after 10 steps."""
    seed = _seed()
    for dp, tag in ((2, "a"), (2, "b"), (1, "a"), (4, "a")):
        _ok(run_mpi(dp, WORKERS / "det_worker.py", seed, dp, 10, tmp_path, tag, timeout=300))
    a, b = (np.load(tmp_path / f"det-dp2-{t}.npz") for t in "ab")
    for name in a.files:
        assert np.array_equal(a[name], b[name]), name
    runs = {dp: np.load(tmp_path / f"det-dp{dp}-a.npz") for dp in (1, 2, 4)}
    names = [n for n in runs[1].files if n != "loss"]
    assert any(n.startswith("grad.") for n in names) and any(n.startswith("param.") for n in names)
    for dp in (2, 4):
        differ = [n for n in names if not np.array_equal(runs[dp][n], runs[1][n])]
        assert not differ, f"dp={dp} differs from dp=1 in {differ} (seed {seed})"
        # The loss is a reported metric summed in rank order inside each
        # microbatch slot: equal to rounding, not necessarily bitwise.
        np.testing.assert_allclose(runs[dp]["loss"], runs[1]["loss"], rtol=1e-6)


def test_zero_shards_optimizer_state_and_matches_data_parallel(run_mpi, tmp_path):
    seed = _seed()
    for strategy in ("data_parallel", "zero_redundancy_optimizer"):
        _ok(run_mpi(2, WORKERS / "strategy_worker.py", seed, strategy, 5, tmp_path, timeout=300))
    dp, zero = (np.load(tmp_path / f"{s}.npz") for s in ("data_parallel", "zero_redundancy_optimizer"))
    for name in dp.files:
        np.testing.assert_allclose(zero[name], dp[name], rtol=1e-4, atol=1e-6, err_msg=name)
    info = {s: json.loads((tmp_path / f"{s}.json").read_text())
            for s in ("data_parallel", "zero_redundancy_optimizer")}
    full = info["data_parallel"]["state_bytes_per_rank"]
    sharded = info["zero_redundancy_optimizer"]["state_bytes_per_rank"]
    assert sharded <= full / 2 + 64, (sharded, full)     # the step counter stays whole
    dp_ops = Counter(c[0] for c in info["data_parallel"]["collectives"])
    zero_ops = Counter(c[0] for c in info["zero_redundancy_optimizer"]["collectives"])
    # Data parallel: every gradient all-reduced, in one bucket
    # (tessera-bucket-collectives). ZeRO: reduce-scattered, and the (sharded)
    # parameters all-gathered where the next step uses them.
    param_bytes = sum(dp[n].nbytes for n in dp.files if n != "losses")
    reduced = sum(c[2] for c in info["data_parallel"]["collectives"] if c[0] == "all_reduce")
    assert dp_ops["reduce_scatter"] == 0 and reduced >= param_bytes, (dp_ops, reduced, param_bytes)
    assert dp_ops["all_reduce"] <= 3, dp_ops
    assert zero_ops["reduce_scatter"] >= 15 and zero_ops["all_gather"] >= 15, zero_ops
    assert zero_ops["all_reduce"] <= 2, zero_ops                   # the loss only
    # A target out of range in rank 1's rows fails that rank's step, naming
    # the row of the global (flattened) targets; rank 0's rows pass.
    checks = [json.loads((tmp_path / f"check.rank{r}.json").read_text()) for r in (0, 1)]
    assert checks[0] is None, checks
    assert (checks[1]["row"], checks[1]["value"], checks[1]["high"]) == (46, 12, 12), checks
    assert re.search(r"^ts.nn.cross_entropy at \S*train_gpt.py:\d+: target 12 in row 46 is out "
                     r"of range for 12 classes", checks[1]["message"]), checks


def test_comm_trace_logs_every_collective(run_mpi, tmp_path):
    proc = run_mpi(2, WORKERS / "mlp_worker.py", _seed(), 8, 16, 32, tmp_path,
                   env={"TESSERA_COMM_TRACE": "1"})
    _ok(proc)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("[tessera comm]")]
    assert lines, proc.stderr
    # op, axis, bytes and time: the MLP's one all_reduce of [8, 16] floats per rank.
    assert any(l.startswith("[tessera comm] rank 0 tp all_reduce sum 512 B ") and l.endswith(" ms")
               for l in lines), lines
    assert any(" rank 1 tp " in l for l in lines)


# -- launcher: failures end the job, name the rank, never hang -------------------

FAILING = {
    "raises": "raise RuntimeError('boom on purpose')",
    "exits": "os._exit(7)",
    "killed": "os.kill(os.getpid(), signal.SIGKILL)",
}


def _script(tmp_path, body: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(f"""import os, signal, time
import numpy as np
import tessera as ts
from tessera import dist, op
mesh = dist.Mesh(axes=["dp"], shape=(2,))
f = ts.compile(lambda x: op.sum(x * x), mesh=mesh)
x = dist.from_numpy(np.ones((4, 4), np.float32), dist.ShardSpec((0,), ("dp",)), mesh)
print(float(f(x)), flush=True)
if mesh.rank == 1:
    {body}
for _ in range(1000):
    f(x)
    time.sleep(0.01)
""")
    return path


@pytest.mark.parametrize("how", sorted(FAILING))
def test_failing_rank_stops_every_rank_and_is_named(tmp_path, how, tessera_launch):
    start = time.monotonic()
    proc = tessera_launch("-n", 2, _script(tmp_path, FAILING[how], how))
    assert proc.returncode != 0
    assert time.monotonic() - start < 60
    assert "rank 1" in proc.stderr, proc.stderr
    if how == "raises":
        assert "boom on purpose" in proc.stderr


def test_launch_timeout_stops_a_hung_job(tmp_path, tessera_launch):
    start = time.monotonic()
    proc = tessera_launch("--timeout", 5, "-n", 2, _script(tmp_path, "time.sleep(1000)", "hang"))
    assert proc.returncode == 124
    assert time.monotonic() - start < 40
    assert "--timeout 5" in proc.stderr


# -- single process: meshes, inspection, modes ------------------------------------

def test_mesh_auto_and_submeshes():
    mesh = ts.mesh.auto()
    assert mesh.size == 1 and mesh.device_ids == [0] and mesh.rank == 0 and mesh.axes == ("dp",)
    grid = dist.Mesh(axes=["dp", "tp", "pp"], shape=(2, 2, 3))
    assert grid.size == 12 and grid.shape == {"dp": 2, "tp": 2, "pp": 3}
    tp = grid.submesh("tp", rank=7)                   # coords (1, 0, 1)
    assert tp.device_ids == [7, 10] and tp.axes == ("tp",)
    dp_pp = grid.submesh("dp", "pp", rank=4)          # coords (0, 1, 1)
    assert dp_pp.device_ids == [3, 4, 5, 9, 10, 11] and dp_pp.shape == {"dp": 2, "pp": 3}


def test_inspect_prints_global_and_local_shapes_per_rank(capsys):
    mesh = dist.Mesh(axes=["tp", "dp"], devices=[[0, 1], [2, 3]])
    w = dist.from_numpy(np.zeros((8, 6), np.float32),
                        dist.ShardSpec(partition=("row", "col"), mesh_axes=("tp", "dp")), mesh)
    text = dist.inspect(w)
    assert capsys.readouterr().out.strip() == text
    assert "global [8, 6] float32, layout [tp, dp]" in text
    assert "rank 1 (tp=0, dp=1): local [4, 3] = [0:4, 3:6]" in text
    assert "rank 2 (tp=1, dp=0): local [4, 3] = [4:8, 0:3]" in text


def test_deterministic_mode_sources(monkeypatch):
    monkeypatch.delenv("TESSERA_DETERMINISTIC", raising=False)
    assert not dist.deterministic_enabled()
    with dist.deterministic(reduce_tree="binary"):
        assert dist.deterministic_enabled()
        with dist.deterministic(enabled=False):
            assert not dist.deterministic_enabled()
    monkeypatch.setenv("TESSERA_DETERMINISTIC", "1")
    assert dist.deterministic_enabled() and not dist.deterministic_enabled(False)
    with pytest.raises(ValueError, match="reduce_tree"):
        dist.deterministic(reduce_tree="ring")


def test_deterministic_compile_marks_every_reduction():
    mesh = dist.Mesh(axes=["dp"], shape=(2,))
    x = dist.from_numpy(np.ones((4, 3), np.float32), dist.ShardSpec((0,), ("dp",)), mesh)
    f = ts.compile(lambda x: ts.op.sum(x * 2.0), mesh=mesh, deterministic=True)
    ir = ts.graph.trace(f, x).partitioned
    assert "tgraph.deterministic" in ir and 'all_reduce <sum>' in ir
    assert all("deterministic" in l for l in ir.splitlines() if "tgraph.all_reduce" in l)


def test_collective_report_names_the_source_line():
    mesh = dist.Mesh(axes=["tp"], shape=(2,))
    w = dist.from_numpy(np.ones((4, 8), np.float32), dist.ShardSpec(("col",), ("tp",)), mesh)

    def full(w):
        return ts.op.exp(dist_replicate(w))

    def dist_replicate(w):
        return ts.reshape(w, 32)      # a split that cannot survive: gathered

    trace = ts.graph.trace(full, w, mesh=mesh)
    gathers = [c for c in trace.collectives if c.op == "all_gather"]
    assert gathers and gathers[0].axis == "tp" and gathers[0].bytes == 4 * 8 * 4
    assert gathers[0].source.endswith(f"test_distributed.py:{dist_replicate.__code__.co_firstlineno + 1}")
    assert "all_gather" in trace.report(min_bytes=100)


def test_global_norm_of_sharded_gradients_is_one_all_reduce():
    """ts.optim.global_norm over leaves split over tp and replicated ones,
    interleaved (as a tensor-parallel model's gradients are): a split
    leaf's sum of squares is a partial sum that must be all-reduced before
    a replicated one is added to it, and the compiled step reduces all
    of them in one bucketed all-reduce, not one per leaf (they were 11 a
    step of the dp x tp GPT). (Its value: test_training's clipping test,
    and the dp x tp GPT tests that match one device.)"""
    mesh = dist.Mesh(axes=["tp"], shape=(2,))
    leaves = [np.ones((4, 2 * (i + 1)), np.float32) for i in range(6)]
    tree = {f"w{i}": dist.from_numpy(a, dist.ShardSpec(("col",), ("tp",)) if i % 2 == 0
                                     else dist.ShardSpec(), mesh)
            for i, a in enumerate(leaves)}
    norm = ts.jit(ts.optim.global_norm)
    reduces = [c for c in norm.lower(tree).collectives if c.op == "all_reduce" and c.axis == "tp"]
    assert len(reduces) == 1 and reduces[0].shape == (3,), reduces


def test_strategy_places_batch_and_state():
    from tessera.strategy import Strategy
    mesh = dist.Mesh(axes=["dp"], shape=(2,))
    zero = Strategy("zero_redundancy_optimizer", mesh, "dp", ("batch",), ("opt_state",))
    b = zero.place("batch.x", np.zeros((4, 3), np.float32), mesh)
    m = zero.place("opt_state.m.w", np.zeros((3, 4), np.float32), mesh)
    p = zero.place("params.w", np.zeros((3, 4), np.float32), mesh)
    assert b.dims == [("dp",), ()] and m.dims == [(), ("dp",)] and p.dims == [(), ()]
    with pytest.raises(ValueError, match="unknown strategy"):
        ts.distribute(lambda x: x, strategy="pipeline_magic")
