"""Autotuning (issue 29 item 5): a function compiled with autotune=True
measures candidate compile options on its first call, runs the fastest,
stores the choice per architecture, shapes, dtypes and compiler version;
a second run uses it without searching; a failing candidate never breaks
the compile; `tessera autotune --show/--clear` list and forget choices."""

import re
import subprocess
import sys

import numpy as np
import pytest

import tessera as ts
from tessera import autotune, op


def _step(w, x):
    def loss(w):
        h = op.gelu(op.matmul(x, w))
        return op.mean(h * h)
    return ts.value_and_grad(loss)(w)


def _reference(w, x):
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    z = x64 @ w64
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (z + 0.044715 * z ** 3))
    h = 0.5 * z * (1 + t)
    dh = 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z)
    return np.mean(h * h), x64.T @ (2 * h * dh / h.size)


@pytest.fixture
def args():
    rng = np.random.default_rng()
    return (rng.standard_normal((32, 48)).astype(np.float32),
            rng.standard_normal((64, 32)).astype(np.float32))


def test_first_call_searches_second_run_uses_the_stored_choice(args, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_AUTOTUNE_CANDIDATES", "3")
    monkeypatch.setenv("TESSERA_AUTOTUNE_REPS", "1")
    w, x = args
    value, grad = ts.jit(_step, autotune=True)(w, x)
    ref_value, ref_grad = _reference(w, x)
    np.testing.assert_allclose(value, ref_value, rtol=1e-4)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-3, atol=1e-5)
    first = capsys.readouterr().err
    # One device: the kernel tile size's three values (no all-reduce to bucket).
    assert "[tessera autotune] _step: measuring 3 of 3 candidates (all measured)" in first, first
    assert "_step: chose " in first and "stored in" in first, first
    (entry,) = autotune.entries().values()
    assert entry["measured"] == 3 and entry["candidates"] == 3
    assert entry["key"]["arguments"][0][1:3] == [[32, 48], "float32"]
    assert 0 < entry["best_s"] <= entry["default_s"]
    # A new compiled function (as a second process would have): no search.
    value2, grad2 = ts.jit(_step, autotune=True)(w, x)
    second = capsys.readouterr().err
    assert "_step: stored choice" in second and "no search" in second, second
    assert "measuring" not in second
    np.testing.assert_allclose(grad2, grad, rtol=1e-5, atol=1e-7)
    # Other shapes are another key: searched again.
    monkeypatch.setenv("TESSERA_AUTOTUNE_CANDIDATES", "1")
    ts.jit(_step, autotune=True)(w[:16], x[:, :16])
    assert "measuring 1 of 3" in capsys.readouterr().err
    assert len(autotune.entries()) == 2


def test_a_failing_candidate_counts_as_infinitely_slow(args, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_AUTOTUNE_CANDIDATES", "2")
    monkeypatch.setenv("TESSERA_AUTOTUNE_REPS", "1")
    from tessera.compiler import CompiledFunction
    compile_for = CompiledFunction._bundle

    def failing(self, key, traced, mesh, options=None):
        if options is not None and options.elementwise_tile_elements == 1024:
            raise ts.CompileError("this candidate does not compile")
        return compile_for(self, key, traced, mesh, options)
    monkeypatch.setattr(CompiledFunction, "_bundle", failing)
    w, x = args
    value, _ = ts.jit(_step, autotune=True)(w, x)
    np.testing.assert_allclose(value, _reference(w, x)[0], rtol=1e-4)
    err = capsys.readouterr().err
    assert "elementwise-tile-elements=1024 failed: CompileError: this candidate does not " \
        "compile" in err, err
    assert "inf ms  elementwise-tile-elements=1024" in err, err
    (entry,) = autotune.entries().values()
    assert entry["choice"] == {}            # the default (the other one measured) won


def test_tessera_autotune_show_and_clear(args, monkeypatch):
    monkeypatch.setenv("TESSERA_AUTOTUNE_CANDIDATES", "1")
    monkeypatch.setenv("TESSERA_AUTOTUNE_REPS", "1")
    ts.jit(_step, autotune=True)(*args)
    cli = [sys.executable, "-m", "tessera", "autotune"]
    shown = subprocess.run(cli + ["--show"], capture_output=True, text=True, check=True).stdout
    assert "1 autotuned choice(s)" in shown and "- _step on " in shown, shown
    assert "arguments: w 32x48 float32, x 64x32 float32" in shown, shown
    assert "choice: the default options" in shown and "1 of 3 candidates" in shown, shown
    cleared = subprocess.run(cli + ["--clear"], capture_output=True, text=True, check=True)
    assert "forgot 1 autotuned choice(s)" in cleared.stdout
    assert autotune.entries() == {}
    bad = subprocess.run(cli, capture_output=True, text=True)
    assert bad.returncode == 2 and "one of the arguments --show --clear is required" in bad.stderr


SUM = r"sum (-?\d+\.\d+(?:e[+-]?\d+)?)"


def test_ranks_of_a_job_search_together_and_agree(tessera_launch, tmp_path):
    """2 ranks: the same candidates in the same order (each timed on the
    slowest rank), one choice, one stored entry; the second launch of the
    job searches nothing; both ranks get the same gradient. The same for a
    2-stage pipeline's microbatch count (microbatches="auto")."""
    seed = int(np.random.SeedSequence().entropy % 2**31)
    env = {"TESSERA_AUTOTUNE_CANDIDATES": "2", "TESSERA_AUTOTUNE_REPS": "1",
           "TESSERA_CACHE_DIR": str(tmp_path / "cache")}
    worker = "test/python/workers/autotune_worker.py"
    first = tessera_launch("-n", 2, worker, seed, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stderr.count("step: measuring 2 of 9 candidates") == 1, first.stderr
    # (mpiexec may interleave the ranks' lines.)
    sums = set(re.findall(SUM, first.stdout))
    assert len(sums) == 1 and len(re.findall(SUM, first.stdout)) == 2, first.stdout
    # The pipeline's microbatch count: counts 2 (p) to 16 dividing 16 rows,
    # 2 measured; one choice on both ranks (a disagreement would hang).
    assert first.stderr.count("pipelined: measuring 2 microbatch counts (2, 16)") == 1, \
        first.stderr
    counts = re.findall(r"microbatches (\d+) loss", first.stdout)
    assert len(counts) == 2 and len(set(counts)) == 1 and counts[0] in ("2", "16"), first.stdout
    second = tessera_launch("-n", 2, worker, seed, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "stored choice" in second.stderr and "measuring" not in second.stderr, second.stderr
    assert f"pipelined: stored choice microbatches={counts[0]}" in second.stderr, second.stderr
    assert set(re.findall(SUM, second.stdout)) == sums, second.stdout


# -- a pipeline's microbatch count --------------------------------------------------------

def _pipelined(microbatches, **kw):
    from tessera import dist, graph, pipeline

    @graph.stage("layer")
    def layer(w, x):
        return op.tanh(op.matmul(x, w))

    @pipeline.run(mesh=dist.Mesh(axes=["pp"], devices=range(1)), axis="pp",
                  microbatches=microbatches, **kw)
    def step(ws, x, y):
        def loss(ws):
            h = x
            for w in ws:
                h = layer(w, h)
            return op.mean((h - y) * (h - y))
        return ts.value_and_grad(loss)(ws)
    return step


def _pipelined_reference(ws, x, y):
    hs = [x.astype(np.float64)]
    for w in ws:
        hs.append(np.tanh(hs[-1] @ w.astype(np.float64)))
    d = 2 * (hs[-1] - y) / y.size
    grads = []
    for w, h_in, h_out in zip(ws[::-1], hs[-2::-1], hs[:0:-1]):
        d = d * (1 - h_out * h_out)
        grads.append(h_in.T @ d)
        d = d @ w.astype(np.float64).T
    return np.mean((hs[-1] - y) ** 2), grads[::-1]


def test_a_pipeline_measures_its_microbatch_count_once(capsys, monkeypatch):
    """microbatches="auto": the counts dividing the batch from one per stage
    rank to 8 per rank (at most TESSERA_AUTOTUNE_CANDIDATES, spread evenly)
    measured on the first call, the fastest run and stored; a new step
    (a second process) runs the stored count without searching; with
    TESSERA_AUTOTUNE=1 a step given no count is tuned the same way."""
    monkeypatch.setenv("TESSERA_AUTOTUNE_CANDIDATES", "3")
    monkeypatch.setenv("TESSERA_AUTOTUNE_REPS", "1")
    rng = np.random.default_rng()
    ws = [rng.standard_normal((8, 8)).astype(np.float32) / 3 for _ in range(2)]
    x, y = (rng.standard_normal((12, 8)).astype(np.float32) for _ in range(2))
    step = _pipelined("auto")
    with pytest.raises(ts.pipeline.PipelineError, match=r"microbatches='auto' is chosen by "
                                                          r"measuring on the step's first call"):
        step.lower(ws, x, y)
    loss, grads = step(ws, x, y)
    ref_loss, ref_grads = _pipelined_reference(ws, x, y)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g), r, rtol=1e-4, atol=1e-6)
    err = capsys.readouterr().err
    # Divisors of 12 from 1 (one stage rank) to 8: 1, 2, 3, 4, 6; three spread evenly.
    assert "step: measuring 3 microbatch counts (1, 3, 6), 1 runs each" in err, err
    assert re.search(r"ms  microbatches=6\n", err) and "step: chose microbatches=" in err, err
    (entry,) = autotune.entries().values()
    chosen = int(entry["choice"]["microbatches"])
    assert chosen in (1, 3, 6) and step.microbatches == chosen
    assert entry["key"]["tuned"] == "microbatches" and entry["reference"] == "microbatches=1"
    assert step.pipeline_report().plan.microbatches == chosen
    again = _pipelined("auto")
    loss2, _ = again(ws, x, y)
    second = capsys.readouterr().err
    assert f"stored choice microbatches={chosen}" in second and "no search" in second, second
    assert "measuring" not in second and again.microbatches == chosen
    np.testing.assert_allclose(loss2, loss, rtol=1e-6)
    assert f"choice: microbatches={chosen}: " in autotune.show()
    monkeypatch.setenv("TESSERA_AUTOTUNE", "1")
    tuned = _pipelined(None)
    tuned(ws, x[:4], y[:4])
    assert "step: measuring 3 microbatch counts (1, 2, 4)" in capsys.readouterr().err
    with pytest.raises(ts.pipeline.PipelineError, match=r"microbatches='many': give a count "
                                                          r"or 'auto'.*test_autotune.py"):
        _pipelined("many")
