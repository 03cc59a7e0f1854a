"""4 ranks on a `pp` axis: the issue's training program under every
schedule, fewer microbatches than stages, and the same step without stage
markers split by `stages=4`, against a float64 numpy
reference on fresh random inputs (seed from argv). Rank 0 writes what it
saw to <out>/pipeline.json."""

import json
import sys
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import dist, graph, op, pipeline

seed, out = int(sys.argv[1]), Path(sys.argv[2])
mesh = dist.Mesh(axes=["pp"], devices=range(4))


@graph.stage("block")
def block(w, x):
    return op.tanh(op.matmul(x, w))


def make_step(schedule, microbatches, body=block, **kw):
    @pipeline.run(mesh=mesh, axis="pp", schedule=schedule, microbatches=microbatches, **kw)
    def step(ws, x, y):
        def loss_fn(ws):
            h = x
            for w in ws:
                h = body(w, h)
            return op.mean((h - y) * (h - y))
        return ts.value_and_grad(loss_fn)(ws)
    return step


def reference(ws, x, y):
    ws = [w.astype(np.float64) for w in ws]
    hs = [x.astype(np.float64)]
    for w in ws:
        hs.append(np.tanh(hs[-1] @ w))
    g = 2 * (hs[-1] - y) / hs[-1].size
    grads = [None] * len(ws)
    for i in reversed(range(len(ws))):
        g = g * (1 - hs[i + 1] ** 2)
        grads[i] = hs[i].T @ g
        g = g @ ws[i].T
    return float(np.mean((hs[-1] - y) ** 2)), grads


rng = np.random.default_rng(seed)
seen = {}
cases = [("gpipe", 8, 4), ("1F1B", 8, 4), ("zero_bubble", 8, 4), ("interleaved", 8, 8),
         ("1F1B", 2, 4)]                   # fewer microbatches than stages
for schedule, m, calls in cases:
    ws = [(rng.standard_normal((6, 6)) * 0.5).astype(np.float32) for _ in range(calls)]
    x = rng.standard_normal((16, 6)).astype(np.float32)
    y = rng.standard_normal((16, 6)).astype(np.float32)
    step = make_step(schedule, m)
    loss, grads = step(ws, x, y)
    ref_loss, ref_grads = reference(ws, x, y)
    report = step.pipeline_report()
    seen[f"{schedule}/{m}"] = {
        "loss": float(np.asarray(loss)), "ref_loss": ref_loss,
        "grad_err": max(float(np.abs(np.asarray(g) - r).max()) for g, r in zip(grads, ref_grads)),
        "grad_scale": max(float(np.abs(r).max()) for r in ref_grads),
        "bubble": report.bubble, "peak": report.peak_activations, "grid": str(report)}
    # The results' broadcasts in the program every rank runs: their roots,
    # and whether each starts before rank 0's last launch.
    instructions = step._programs[step._last_key][0].bundle.program.instructions
    last_on_0 = max(i.index for i in instructions
                    if i.op == "launch" and i.get("on") == ("pp", 0))
    seen[f"{schedule}/{m}"]["broadcasts"] = [
        [i["root"], i.index < last_on_0] for i in instructions
        if i.op == "collective_start" and i["collective"] == "broadcast"]
# No stage markers: stages=4 cuts the traced step into 4 runs of equal cost.
unmarked = make_step("1F1B", 4, body=block.fn, stages=4)    # (block.fn: no marker)
ws = [(rng.standard_normal((6, 6)) * 0.5).astype(np.float32) for _ in range(4)]
x = rng.standard_normal((16, 6)).astype(np.float32)
y = rng.standard_normal((16, 6)).astype(np.float32)
loss, grads = unmarked(ws, x, y)
ref_loss, ref_grads = reference(ws, x, y)
report = unmarked.pipeline_report()
seen["auto/4"] = {
    "loss": float(np.asarray(loss)), "ref_loss": ref_loss,
    "grad_err": max(float(np.abs(np.asarray(g) - r).max()) for g, r in zip(grads, ref_grads)),
    "grad_scale": max(float(np.abs(r).max()) for r in ref_grads),
    "split_costs": report.split_costs, "grid": str(report)}
# Deterministic mode: the schedules give the same bits.
ws = [(rng.standard_normal((6, 6)) * 0.5).astype(np.float32) for _ in range(4)]
x = rng.standard_normal((16, 6)).astype(np.float32)
y = rng.standard_normal((16, 6)).astype(np.float32)
bits = {}
for schedule in ("gpipe", "1F1B", "zero_bubble"):
    loss, grads = make_step(schedule, 4, deterministic=True)(ws, x, y)
    bits[schedule] = [np.asarray(loss).tobytes().hex()] + [np.asarray(g).tobytes().hex()
                                                           for g in grads]
seen["same_bits"] = len({json.dumps(v) for v in bits.values()}) == 1
if mesh.rank == 0:
    (out / "pipeline.json").write_text(json.dumps(seen))
