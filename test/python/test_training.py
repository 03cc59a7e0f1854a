"""Training utilities against numpy references: AdamW, SGD, global-norm
clipping, gradient accumulation, dynamic loss scaling; the training-step
APIs of the design docs; and the GPT example learning in fp32 and bf16."""

import sys
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import graph, op

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _quadratic_problem(seed):
    r = np.random.default_rng(seed)
    params = {"w": r.standard_normal((4, 3)), "b": r.standard_normal(3)}
    x, y = r.standard_normal((8, 4)), r.standard_normal((8, 3))

    def loss(p, x, y):
        d = op.matmul(x, p["w"]) + p["b"] - y
        return op.mean(d * d)

    def grad_np(p):
        d = x @ p["w"] + p["b"] - y
        g = 2 * d / d.size
        return {"w": x.T @ g, "b": g.sum(0)}
    return params, x, y, loss, grad_np


def test_adamw_matches_numpy_reference():
    params, x, y, loss, grad_np = _quadratic_problem(1)
    opt = ts.optim.AdamW(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    state = opt.init(params)

    @ts.jit
    def step(p, s, x, y):
        return opt.update(p, ts.grad(loss(p, x, y), p), s)

    ref = {k: v.copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in ref.items()}
    v_ = {k: np.zeros_like(v) for k, v in ref.items()}
    for t in range(1, 4):
        params, state = step(params, state, x, y)
        g = grad_np(ref)
        for k in ref:
            m[k] = 0.9 * m[k] + 0.1 * g[k]
            v_[k] = 0.99 * v_[k] + 0.01 * g[k] ** 2
            mhat, vhat = m[k] / (1 - 0.9 ** t), v_[k] / (1 - 0.99 ** t)
            ref[k] = ref[k] - 0.05 * (mhat / (np.sqrt(vhat) + 1e-8) + 0.1 * ref[k])
    for k in ref:
        np.testing.assert_allclose(params[k], ref[k], rtol=1e-6, atol=1e-6)
    assert float(state["step"]) == 3.0


def test_sgd_momentum_weight_decay_matches_numpy():
    params, x, y, loss, grad_np = _quadratic_problem(2)
    opt = ts.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.01)
    state = opt.init(params)
    step = ts.jit(lambda p, s, x, y: opt.update(p, ts.grad(loss(p, x, y), p), s))
    ref = {k: v.copy() for k, v in params.items()}
    buf = {k: np.zeros_like(v) for k, v in ref.items()}
    for _ in range(3):
        params, state = step(params, state, x, y)
        g = grad_np(ref)
        for k in ref:
            buf[k] = 0.9 * buf[k] + g[k] + 0.01 * ref[k]
            ref[k] = ref[k] - 0.1 * buf[k]
    for k in ref:
        np.testing.assert_allclose(params[k], ref[k], rtol=1e-10)


def test_clip_by_global_norm():
    r = np.random.default_rng()
    g = {"a": r.standard_normal((3, 4)) * 5, "b": r.standard_normal(7) * 5}
    clipped, norm = ts.jit(lambda g: ts.optim.clip_by_global_norm(g, 1.0))(g)
    total = np.sqrt(sum((v ** 2).sum() for v in g.values()))
    np.testing.assert_allclose(norm, total, rtol=1e-12)
    for k in g:
        np.testing.assert_allclose(clipped[k], g[k] / (total + 1e-6), rtol=1e-12)
    small = {k: v * 1e-3 for k, v in g.items()}
    unclipped, _ = ts.jit(lambda g: ts.optim.clip_by_global_norm(g, 1.0))(small)
    for k in g:
        np.testing.assert_allclose(unclipped[k], small[k], rtol=1e-12)


def test_gradient_accumulation_equals_full_batch_gradient():
    params, x, y, loss, grad_np = _quadratic_problem(3)

    @ts.jit
    def accumulated(p, x, y):
        total = None
        for i in range(2):                      # two microbatches of 4 rows
            part = loss(p, x[i], y[i]) / 2.0
            total = ts.optim.accumulate(total, ts.grad(part, p))
        return total

    g = accumulated(params, x.reshape(2, 4, 4), y.reshape(2, 4, 3))
    ref = grad_np(params)
    for k in ref:
        np.testing.assert_allclose(g[k], ref[k], rtol=1e-12)


def test_dynamic_loss_scale_skips_overflowing_steps_and_halves_the_scale():
    params, x, y, loss, _ = _quadratic_problem(4)
    params = {k: v.astype(np.float32) for k, v in params.items()}
    x, y = x.astype(np.float32), y.astype(np.float32)
    opt = ts.optim.AdamW(lr=0.01)

    @ts.jit
    def step(p, s, scaler, x, y):
        grads = ts.grad(loss(p, x, y) * scaler["scale"], p)
        grads, finite = ts.optim.unscale(grads, scaler)
        new_p, new_s = opt.update(p, grads, s)
        return (ts.optim.where_finite(finite, new_p, p), ts.optim.where_finite(finite, new_s, s),
                ts.optim.update_loss_scale(scaler, finite, growth_interval=2), finite)

    state = opt.init(params)
    huge = ts.optim.loss_scale_init(3e38)             # the scaled loss overflows fp32
    p1, s1, sc1, finite = step(params, state, huge, x, y)
    assert not finite
    for k in params:
        np.testing.assert_array_equal(p1[k], params[k])
    assert float(sc1["scale"]) == np.float32(1.5e38) and float(s1["step"]) == 0.0

    sc = ts.optim.loss_scale_init(8.0)
    p2, s2, sc2, finite = step(params, state, sc, x, y)
    assert finite and float(s2["step"]) == 1.0 and not np.array_equal(p2["w"], params["w"])
    _, _, sc3, _ = step(p2, s2, sc2, x, y)            # second good step: scale doubles
    assert float(sc2["scale"]) == 8.0 and float(sc3["scale"]) == 16.0


def test_graph_training_step_returns_grads_of_captured_parameters():
    r = np.random.default_rng()
    W = r.standard_normal((5, 3))

    @graph.training_step(module="Linear")
    def step(batch):
        out = op.matmul(batch["input"], W)
        loss = op.cross_entropy(out, batch["labels"])
        grads = graph.backward(loss)
        return grads, {"loss": loss}

    batch = {"input": r.standard_normal((4, 5)), "labels": np.array([0, 2, 1, 2], np.int32)}
    grads, metrics = step(batch)
    logits = batch["input"] @ W
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = p.copy()
    d[np.arange(4), batch["labels"]] -= 1
    assert list(grads) == ["W"]
    np.testing.assert_allclose(grads["W"], batch["input"].T @ d / 4, rtol=1e-10)
    np.testing.assert_allclose(metrics["loss"], -np.log(p[np.arange(4), batch["labels"]]).mean(),
                               rtol=1e-12)


def test_op_autodiff_without_wrt_needs_parameters():
    with pytest.raises(ts.ShapeError, match="uses none"):
        ts.jit(lambda x: op.autodiff(op.sum(x)))(np.ones(3))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gpt_example_learns(precision, tmp_path, capsys):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_gpt
    finally:
        sys.path.remove(str(EXAMPLES))
    plot = tmp_path / "loss.png"
    assert train_gpt.main(["--steps", "40", "--precision", precision, "--plot", str(plot),
                           "--seed", "3"]) == 0
    out = capsys.readouterr().out
    first, last = (float(v) for v in
                   out.split("; loss ")[1].split(" (mean")[0].split(" -> "))
    assert first > 2.0 and last < 0.5 * first, out
    assert plot.stat().st_size > 1000
    assert "samples reversed exactly" in out


def test_llama_example_learns_the_standard_library_and_round_trips_hf(tmp_path, capsys):
    """examples/train_llama.py from scratch (30 steps on 0.5 MiB of the
    standard library's sources): the held-out validation loss falls from
    ln 256 by more than 1.5 nats per byte, the plot is written, and the
    saved HF checkpoint reads back with the trained weights and fine-tunes
    (--from-pretrained)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_llama
    finally:
        sys.path.remove(str(EXAMPLES))
    plot, out_dir = tmp_path / "loss.png", tmp_path / "llama"
    common = ["--data-mb", "0.5", "--eval-every", "15", "--val-batches", "2"]
    assert train_llama.main(["--steps", "30", "--plot", str(plot), "--save", str(out_dir)]
                            + common) == 0
    out = capsys.readouterr().out
    valid = [float(line.split("validation ")[1].split(",")[0].split(" ")[0])
             for line in out.splitlines() if line.startswith("step ") and "validation" in line]
    assert valid[0] > 5.0 and valid[-1] < valid[0] - 1.5, out
    assert plot.stat().st_size > 1000 and "greedy continuation" in out
    from tessera import models
    saved = models.from_pretrained(out_dir)
    assert saved.config.vocab_size == 256 and len(saved.params) == 2 + 9 * 2 + 1
    assert train_llama.main(["--steps", "2", "--from-pretrained", str(out_dir), "--plot",
                             str(plot)] + common) == 0
    resumed = capsys.readouterr().out
    first = float(resumed.split("step    0: validation ")[1].split(" ")[0])
    assert abs(first - valid[-1]) < 1e-3, (first, valid[-1])      # the saved weights
    for argv, says in ((["--ep", "2"], "--ep splits experts: pass --experts E"),
                       (["--experts", "4", "--top-k", "5"], "--top-k 5 must be in [1, --experts 4]"),
                       (["--experts", "4", "--ep", "2", "--pp", "2"],
                        "--ep does not run pipelined")):
        with pytest.raises(SystemExit):
            train_llama.main(argv)
        assert says in capsys.readouterr().err


@pytest.mark.parametrize("model, plan, steps, mesh", [
    pytest.param([], ["--pp", "2"], 3, "dp × tp × pp mesh, 1 × 1 × 2", id="pp2"),
    pytest.param([], ["--cp", "2", "--cp-attention", "ring"], 20, "dp × cp × tp mesh, 1 × 2 × 1",
                 id="cp2-ring"),
    pytest.param(["--experts", "4"], ["--ep", "2"], 3, "dp × ep × tp mesh, 1 × 2 × 1", id="ep2")])
def test_llama_example_on_two_ranks_follows_one_rank(tessera_launch, tmp_path, capsys, model,
                                                     plan, steps, mesh):
    """examples/train_llama.py on 2 ranks gives the one-rank run's mean loss
    over its steps and its validation loss after them: --pp 2 (the step
    cut into 2 stages by cost, its transfers paired in the order they are
    made), --cp 2 over 20 steps (each window's bytes split over cp:
    attention as a ring of key/value blocks, striped for causal balance,
    every linear layer on the rank's own bytes, the gradients summed over
    cp; the all-to-all form's numerics are test_end_to_end's), and a Mixtral with --ep 2
    (each rank holds and updates 2 of the 4 experts; tokens travel to them
    by all-to-all)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_llama
    finally:
        sys.path.remove(str(EXAMPLES))
    args = ["--steps", str(steps), "--eval-every", str(steps), "--width", "64", "--seq", "32",
            "--batch", "8", "--data-mb", "0.5", "--val-batches", "1", "--plot",
            str(tmp_path / "loss.png"), *model]

    def last(out):
        return [line for line in out.splitlines() if line.startswith(f"step {steps:4d}")][0] \
            .split(", ")[:2]
    assert train_llama.main(args) == 0
    one = last(capsys.readouterr().out)
    proc = tessera_launch("-n", 2, EXAMPLES / "train_llama.py", *plan, *args, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert mesh in proc.stdout
    assert last(proc.stdout) == one, (proc.stdout, one)
    if plan[0] == "--cp":
        with pytest.raises(SystemExit):
            train_llama.main(["--cp", "3", "--seq", "32"])
        assert "--cp 3 must divide --seq 32" in capsys.readouterr().err
