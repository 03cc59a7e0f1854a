"""Pipeline parallelism (tessera.pipeline, graph.stage): every schedule
gives the unpipelined loss and gradient (float64 numpy reference, fresh
seeds), the cost model's bubbles and activation peaks, and the errors a
pipeline can make, each raised before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import dist, graph, op, pipeline
from tessera.pipeline import PipelineError
from tessera_compiler.ir.pipeline import formula_bubble, simulate

WORKERS = Path(__file__).resolve().parent / "workers"


def test_every_schedule_matches_one_device_on_four_ranks(run_mpi, tmp_path):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    proc = run_mpi(4, WORKERS / "pipeline_worker.py", seed, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads((tmp_path / "pipeline.json").read_text())
    for case in ("gpipe/8", "1F1B/8", "zero_bubble/8", "interleaved/8", "1F1B/2", "auto/4"):
        got = seen[case]
        assert abs(got["loss"] - got["ref_loss"]) <= 1e-5 * max(1.0, abs(got["ref_loss"])), case
        assert got["grad_err"] <= 1e-5 * max(1.0, got["grad_scale"]), case
        schedule = {"auto": "1F1B"}.get(case.split("/")[0], case.split("/")[0])
        assert "rank 3:" in got["grid"] and got["grid"].startswith(schedule)
    # Activations held: 1F1B at most p on rank 0, GPipe all m.
    assert seen["1F1B/8"]["peak"][0] == 4 and seen["gpipe/8"]["peak"][0] == 8
    # Under the compiler's cost model: interleaved and zero bubble idle less than 1F1B.
    assert seen["interleaved/8"]["bubble"] < seen["1F1B/8"]["bubble"]
    assert seen["zero_bubble/8"]["bubble"] < seen["1F1B/8"]["bubble"]
    # Fewer microbatches than stages runs, with a larger bubble.
    assert seen["1F1B/2"]["bubble"] > seen["1F1B/8"]["bubble"]
    assert seen["same_bits"], "deterministic schedules differ in their bits"
    # The results reach every rank in one broadcast per rank (rank 3's loss
    # and gradient packed in one), the last stage's while rank 0 still
    # computes (1F1B: rank 3 finishes first).
    assert sorted(root for root, _ in seen["1F1B/8"]["broadcasts"]) == [0, 1, 2, 3]
    starts_early = dict(seen["1F1B/8"]["broadcasts"])
    assert starts_early[3] and not starts_early[0], starts_early
    # stages=4 without markers: each stage one block (2*4*6*6 + 4*6 flops of
    # microbatch 0), the last also the loss; the report says so.
    costs = seen["auto/4"]["split_costs"]
    assert costs[:3] == [312.0, 312.0, 312.0] and 312.0 < costs[3] < 400.0, costs
    assert "forward cost per stage (flops of microbatch 0): 312 312 312 " in seen["auto/4"]["grid"]
    assert "stages=4 without markers" in seen["auto/4"]["grid"]


def test_stage_parameters_train_where_their_stage_runs(run_mpi, tmp_path):
    """A Hugging Face checkpoint over pp = 2 (models.from_pretrained with a
    pp mesh): each rank reads its stage's layers; a step pipelined over pp
    with `then=` (global-norm clipping and AdamW, traced once) and
    `results="stage"` updates each parameter on its stage's rank and keeps
    parameters and moments there from step to step (the other stage's are
    placeholders), writes them to a checkpoint from their holders, and
    follows the single process's loss curve."""
    proc = run_mpi(2, WORKERS / "pp_train_worker.py", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("result.rank*.json"))]
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        np.testing.assert_allclose(r["losses"], r["expected"], rtol=1e-6)
        assert r["losses"][-1] < r["losses"][0]
        held, everything = r["held"]            # parameters and the first moments
        assert 0.45 * everything < held < 0.55 * everything, r["held"]
        assert 0.45 * everything / 2 < r["moments_held"] < 0.55 * everything / 2
        own, other = ("ndarray", "Absent") if r["rank"] == 0 else ("Absent", "ndarray")
        assert r["kinds"] == [own, other, own, other], r["kinds"]
        assert r["results"] == [["pp", [0]], ["pp", [1]]]
        assert r["round_trip"]


@pytest.mark.parametrize("p,m,scale", [(4, 8, 1.0), (4, 16, 1.0), (2, 4, 1.0), (4, 2, 1.0),
                                       (4, 8, 2e8), (2, 4, 3e-6)])
def test_equal_costs_give_the_textbook_bubble(p, m, scale):
    # Backward = twice the forward. Only zero bubble splits it into B and W
    # (the other schedules run the whole backward as one action, and its W
    # costs nothing). `scale`: the compiler's costs are FLOPs (~2e8 a stage
    # in bench/pipeline_cpu.py), a machine's seconds are small: the bubble
    # must not depend on the unit (a W of no cost once left its rank idle
    # until the next event when costs were large: 49% instead of 27%).
    def cost(schedule):
        split = schedule == "zero_bubble"
        per = {"F": 1.0, "B": 1.0 if split else 2.0, "W": 1.0 if split else 0.0}
        chunks = 2 if schedule == "interleaved" else 1      # stages of half the work
        return lambda a: scale * per[a.kind] / chunks

    plans = {s: simulate(s, p, p * (2 if s == "interleaved" else 1), m, cost=cost(s))
             for s in ("gpipe", "1F1B", "interleaved", "zero_bubble")}
    assert plans["gpipe"].bubble == pytest.approx(formula_bubble(p, m), abs=1e-9)
    assert plans["1F1B"].bubble == pytest.approx(formula_bubble(p, m), abs=1e-9)
    assert plans["zero_bubble"].bubble < plans["1F1B"].bubble
    if m >= p:
        assert plans["interleaved"].bubble < plans["1F1B"].bubble
    assert plans["1F1B"].peak_activations()[0] == min(p, m)
    assert plans["gpipe"].peak_activations()[0] == m
    assert plans["zero_bubble"].peak_activations()[0] <= min(p, m)
    # Every rank runs every action of its stages exactly once.
    for plan in plans.values():
        for r, row in enumerate(plan.rows):
            assert len(row) == 3 * m * plan.stages // p
            assert all(t.action.stage % p == r for t in row)


mesh4 = dist.Mesh(axes=["pp"], devices=range(4))


@graph.stage("block")
def block(w, x):
    return op.tanh(op.matmul(x, w))


def _data(calls=4, batch=16):
    rng = np.random.default_rng()
    ws = [rng.standard_normal((6, 6)).astype(np.float32) for _ in range(calls)]
    return ws, rng.standard_normal((batch, 6)).astype(np.float32), \
        rng.standard_normal((batch, 6)).astype(np.float32)


def _train(schedule="1F1B", microbatches=4, body=None, **kw):
    @pipeline.run(mesh=mesh4, axis="pp", schedule=schedule, microbatches=microbatches, **kw)
    def step(ws, x, y):
        def loss_fn(ws):
            h = x
            for w in ws:
                h = (body or block)(w, h)
            return op.mean((h - y) * (h - y))
        return ts.value_and_grad(loss_fn)(ws)
    return step


def test_unknown_schedule_is_refused_where_it_is_written():
    with pytest.raises(PipelineError, match=r"unknown pipeline schedule 'pipedream'.*"
                                            r"gpipe.*1F1B.*test_pipeline.py"):
        _train(schedule="pipedream")


def test_stage_count_must_split_over_the_axis():
    with pytest.raises(PipelineError, match=r"calls 3 pipeline stages \(block at .*test_pipeline"
                                            r".py:\d+.*the 'pp' axis has 4 ranks"):
        _train().lower(*_data(calls=3))


def test_microbatches_must_divide_the_batch():
    with pytest.raises(PipelineError, match=r"batch of 18 .* does not split into 4 microbatches"):
        _train().lower(*_data(batch=18))


def test_stages_without_markers_need_enough_ops_and_no_markers():
    with pytest.raises(PipelineError, match=r"stages=4 splits a step without stage markers, "
                                            r"but it calls @graph.stage functions"):
        _train(stages=4).lower(*_data())
    with pytest.raises(PipelineError, match=r"stages=64: \d+ op calls do not split into 64 "
                                            r"stages of balanced cost"):
        _train(stages=64, body=block.fn).lower(*_data())


def test_a_stage_returning_nothing_is_named():
    @graph.stage("silent")
    def silent(w, x):
        op.tanh(op.matmul(x, w))

    with pytest.raises(PipelineError, match=r"stage 'silent' \(stage 0, called at .*"
                                            r"test_pipeline.py:\d+\) returns nothing"):
        _train(body=silent).lower(*_data())


def test_a_parameter_shared_by_two_stages_is_refused():
    @pipeline.run(mesh=mesh4, axis="pp", microbatches=4)
    def tied(ws, x, y):
        def loss_fn(ws):
            h = x
            for i in range(4):
                h = block(ws[0] if i in (0, 3) else ws[i], h)
            return op.mean((h - y) * (h - y))
        return ts.value_and_grad(loss_fn)(ws)

    with pytest.raises(ts.CompileError, match=r"a parameter is used by stage 'block' \(called "
                                              r"at .*\) and by stage 'block'.*different ranks"):
        tied.lower(*_data())


def test_stage_functions_run_plainly_outside_pipelines():
    ws, x, _ = _data()
    got = ts.jit(lambda w, x: block(w, x))(ws[0], x)
    np.testing.assert_allclose(got, np.tanh(x.astype(np.float64) @ ws[0]), rtol=1e-5, atol=1e-6)
