"""Recomputation (`ts.remat`, `op.transformer_block(remat=)`), the memory
plan (`memory_report`, the runtime's byte count, numpy's real allocations)
and the memory budget.

Recomputation repeats the same kernels on the same inputs, so the loss and
every gradient must keep the same bits; the plan must predict what the
runtime holds."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera._pytree import flatten, paths
from tessera.compiler import local_inputs

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
sys.path.insert(0, str(REPO / "examples"))
import train_gpt as ex  # noqa: E402

WIDTH, DEPTH, HEADS, LENGTH, BATCH = 32, 2, 2, 4, 4


def _bits(tree) -> list:
    return [np.ascontiguousarray(np.asarray(leaf)).view(np.uint8) for leaf in flatten(tree)[0]]


def _gpt_grads(remat, precision: str, seed: int = 0):
    """The example GPT's loss and gradients with `remat` for every block."""
    params = ex.init_params(WIDTH, DEPTH, HEADS, 2 * LENGTH, seed)
    batch = ex.make_batch(np.random.default_rng(seed + 1), BATCH, LENGTH)
    return ex.make_gradients(HEADS, precision, remat), (params, batch)


@pytest.mark.parametrize("precision, policies", [
    ("fp32", ("full", "selective", "dots_saveable")), ("bf16", ("full", "dots_saveable"))])
def test_remat_keeps_every_gradient_bit_on_the_example_gpt(precision, policies):
    reference_fn, args = _gpt_grads(None, precision)
    reference = _bits(reference_fn(*args))
    peaks = {"none": reference_fn.memory_report().peak}
    names = ["loss"] + ["grad." + p for p in paths(args[0])]
    for policy in policies:
        fn, _ = _gpt_grads(policy, precision)
        for name, a, b in zip(names, reference, _bits(fn(*args))):
            assert np.array_equal(a, b), f"{policy}: {name} differs from the run without remat"
        peaks[policy] = fn.memory_report().peak
        if policy == "selective":
            # It copies attention, and only attention. (It saves nothing here:
            # attention's [B, S, H, Dh] output is wo's operand, kept anyway,
            # and the copy's output is a second one while the backward runs.)
            copies = [line.split("=")[1].split()[0] for line in
                      fn.lower(*args).autodiff.splitlines() if "tgraph.recompute" in line]
            assert copies and set(copies) == {"tgraph.attention"}, copies
    # Keeping less costs less memory: full < dots_saveable < none.
    assert peaks["full"] < peaks["dots_saveable"] < peaks["none"], peaks


def test_remat_keeps_every_gradient_bit_on_dp_x_tp_and_in_a_pipeline(run_mpi, tmp_path):
    out = tmp_path / "verdict.json"
    proc = run_mpi(4, WORKERS / "remat_worker.py", out, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = json.loads(out.read_text())
    for case, result in verdict.items():
        assert result["differs"] == [], f"{case}: {result['differs']} changed bits"
        assert result["peak_remat"] < result["peak_none"], (case, result)
    assert set(verdict) == {"fp32", "pipeline"}


def test_remat_as_decorator_and_call_matches_float64_reference():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    w1 = rng.standard_normal((6, 7)).astype(np.float32)
    w2 = rng.standard_normal((7, 3)).astype(np.float32)

    @ts.remat(policy="dots_saveable")
    def layer(x, w):
        return op.tanh(op.matmul(x, w))

    def make(use_remat):
        @ts.jit
        def f(x, w1, w2):
            def loss(w1, w2):
                h = layer(x, w1) if use_remat else op.tanh(op.matmul(x, w1))
                y = ts.remat(lambda h: op.exp(op.matmul(h, w2)) * 0.5)(h) if use_remat \
                    else op.exp(op.matmul(h, w2)) * 0.5
                return op.sum(y * y)
            return ts.value_and_grad(loss, wrt=(0, 1))(w1, w2)
        return f

    remat_fn = make(True)
    got = remat_fn(x, w1, w2)
    plain = make(False)(x, w1, w2)
    for a, b in zip(_bits(got), _bits(plain)):
        assert np.array_equal(a, b)
    graph = remat_fn.lower(x, w1, w2).graph
    assert '"dots_saveable"' in graph and '"nothing_saveable"' in graph
    # float64 reference: y = exp(h w2) / 2, loss = sum(y^2), h = tanh(x w1).
    X, W1, W2 = (a.astype(np.float64) for a in (x, w1, w2))
    h = np.tanh(X @ W1)
    y = np.exp(h @ W2) * 0.5
    dz = 2 * y * y                       # d loss / d (h w2)
    dw2 = h.T @ dz
    dw1 = X.T @ ((dz @ W2.T) * (1 - h * h))
    loss, (g1, g2) = got
    np.testing.assert_allclose(loss, np.sum(y * y), rtol=1e-5)
    np.testing.assert_allclose(g1, dw1, rtol=2e-4, atol=1e-4)
    np.testing.assert_allclose(g2, dw2, rtol=2e-4, atol=1e-4)


def test_unknown_policy_is_refused_with_the_line():
    with pytest.raises(ts.ShapeError, match=r"unknown remat policy 'everything'.*test_remat.py"):
        ts.remat(lambda x: x, policy="everything")


def _measured(fn, args):
    """(the runtime's byte count, numpy's allocation peak plus the inputs
    it read in place from the caller's arrays and the arena it keeps
    between runs) of one run of the program `fn` compiled for `args`
    (after a first call compiled it)."""
    program, traced, _ = fn._programs[fn._last_key]
    inputs = local_inputs(fn._prepare(args, {})[4], traced)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        program.run(inputs)
        real = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    memory = program.memory
    return memory["peak_bytes"], real + memory["borrowed_bytes"] + memory["arena_bytes"]


@pytest.mark.parametrize("remat", [None, "full"])
def test_memory_plan_matches_what_the_runtime_allocates(remat, monkeypatch):
    """The plan's peak is what the runtime allocates, buffer by buffer (the
    interpreting loop); the straight-line run holds its small buffers in an
    arena kept between runs, beside the results, so at most the arena more."""
    step, args = ex.step_case(width=64, depth=2, heads=2, length=8, batch=8, precision="fp32",
                              seed=0, remat=remat)
    planned = step.memory_report(*args)
    step(*args)
    counted, real = _measured(step, args)
    arena = step._programs[step._last_key][0].memory["arena_bytes"]
    assert planned.peak == counted            # the executor holds exactly the planned buffers
    assert 0 < arena and 0.95 * planned.peak <= real <= 1.05 * planned.peak + arena, \
        (real, arena, planned.peak)
    from tessera_runtime.executor import ScheduleExecutor
    monkeypatch.setattr(ScheduleExecutor, "straight_line", False)
    counted, real = _measured(step, args)
    assert planned.peak == counted
    assert abs(real - planned.peak) <= 0.05 * planned.peak, (real, planned.peak)
    rank = planned.ranks[0]
    assert sum(rank.by_category.values()) == rank.peak
    assert rank.by_category["parameters"] == sum(
        p.nbytes for p in flatten(args[0])[0])            # every parameter, nothing else
    # The moments, and the loss scaler's counters (no loss depends on them).
    moments = sum(p.nbytes for p in flatten(args[1])[0])
    scaler = sum(np.asarray(p).nbytes for p in flatten(args[2])[0])
    assert moments <= rank.by_category["optimizer state"] < moments + scaler
    assert rank.live[0].bytes == max(b.bytes for b in rank.live)
    assert "train_gpt.py" in rank.live[0].source
    text = str(planned)
    assert "activations" in text and f"{planned.peak:,} B" in text
    assert step.memory_report() is planned or step.memory_report().peak == planned.peak


def test_memory_budget_picks_a_plan_that_fits_and_refuses_one_that_cannot():
    case = dict(width=32, depth=2, heads=2, length=4, batch=8, precision="fp32", seed=0)
    none_step, args = ex.step_case(**case)
    none_peak = none_step.memory_report(*args).peak
    budget = none_peak - 1                       # no remat is one byte too many
    step, _ = ex.step_case(**case, memory_budget=budget)
    plan = step.memory_report(*args)
    assert plan.peak <= budget
    assert plan.remat and set(plan.remat.values()) <= {"selective", "dots_saveable",
                                                        "nothing_saveable"}
    assert step.remat_choice.peak == plan.peak
    for a, b in zip(_bits(step(*args)[0]), _bits(none_step(*args)[0])):
        assert np.array_equal(a, b)                      # the same loss, bit for bit
    tight, _ = ex.step_case(**case, memory_budget="1KiB")
    with pytest.raises(ts.CompileError, match=r"smallest planned peak is [\d,]+ B.*What holds"):
        tight.memory_report(*args)
    with pytest.raises(ValueError, match="6 parsecs"):
        ts.jit(lambda x: x, memory_budget="6 parsecs")


def test_tessera_trace_memory_prints_the_plan(tmp_path):
    import subprocess
    script = tmp_path / "mlp.py"
    script.write_text(
        "import numpy as np, tessera as ts\nfrom tessera import op\n"
        "@ts.jit\ndef f(x, w):\n    return ts.grad(op.sum(op.tanh(op.matmul(x, w))), w)\n"
        "f(np.ones((64, 32), np.float32), np.ones((32, 16), np.float32))\n")
    proc = subprocess.run([sys.executable, "-m", "tessera.cli", "trace", "--memory", "-o",
                           str(tmp_path / "ir"), str(script)], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "memory plan of f: peak" in proc.stderr
    assert "parameters" in proc.stderr and "mlp.py:5" in proc.stderr
