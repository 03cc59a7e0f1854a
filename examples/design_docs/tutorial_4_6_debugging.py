"""Tutorial 4.6 (debugging distributed execution), as written on 2 x 2
(dp x tp) ranks: `dist.inspect` shows a weight's layout, `graph.trace` the
IR of a training step, and `dist.profile()` reports each rank's
communication / computation balance over 3 steps and writes one Perfetto
timeline of all ranks. The tutorial writes it as a bare call, as here:
it profiles from there on, until `dist.profile().stop()` (or the exit);
`prof = dist.profile(trace).start()` ... `prof.stop()` and a `with
dist.profile(trace) as prof:` block are the same around the steps they
enclose. The step is a two-layer MLP, W1 split by columns and
W2 by rows over tp, the batch over dp; its loss is checked against numpy and
the timeline's schema (every rank, every stream, each collective's axis,
bytes and Python line) is checked here.

    tessera launch -n 4 examples/design_docs/tutorial_4_6_debugging.py
"""
import json
import re
import tempfile
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import dist, graph, op

mesh = dist.Mesh(axes=["dp", "tp"], devices=range(4))
rng = np.random.default_rng(6)
w1, w2 = rng.standard_normal((16, 32)) / 4, rng.standard_normal((32, 8)) / 6
x, y = rng.standard_normal((8, 16)), rng.standard_normal((8, 8))
W1 = dist.from_numpy(w1.astype(np.float32), dist.ShardSpec(("col",), ("tp",)), mesh)
W2 = dist.from_numpy(w2.astype(np.float32), dist.ShardSpec(("row",), ("tp",)), mesh)
X = dist.from_numpy(x.astype(np.float32), dist.ShardSpec((0,), ("dp",)), mesh)
Y = dist.from_numpy(y.astype(np.float32), dist.ShardSpec((0,), ("dp",)), mesh)


@ts.compile(mesh=mesh)
def step(w1, w2, x, y):
    def loss_fn(ws):
        err = op.matmul(op.relu(op.matmul(x, ws[0])), ws[1]) - y
        return op.mean(err * err)
    return ts.value_and_grad(loss_fn)((w1, w2))


# - Use `dist.inspect(tensor)` to see sharding layouts.
layout = dist.inspect(W1)
# - `graph.trace(model, batch)` shows IR lowering across devices.
ir = graph.trace(step, W1, W2, X, Y)
# - `dist.profile()` reports communication/computation balance.
trace = Path(tempfile.gettempdir()) / "tessera-tutorial-4-6.json"
step(W1, W2, X, Y)                       # compile outside the profile
dist.profile(trace)                      # (or `with dist.profile(trace) as prof:` around them)
for _ in range(3):
    loss, (g1, g2) = step(W1, W2, X, Y)
prof = dist.profile().stop()             # every rank: gathers, rank 0 prints the table

reference = np.mean((np.maximum(x @ w1, 0) @ w2 - y) ** 2)
np.testing.assert_allclose(float(loss), reference, rtol=1e-5)
assert "tp" in layout and "tgraph" in str(ir)
assert [r["rank"] for r in prof.ranks] == [0, 1, 2, 3] and prof.ranks[0]["steps"] == 3
for r in prof.ranks:                     # the columns add up to the profiled time
    parts = r["compute"] + r["transfer"] + r["waiting"] + r["overhead"] + r["copies"] + r["idle"]
    assert abs(parts - r["window"]) < 1e-6 * max(1.0, r["window"]), r
if mesh.rank == 0:
    events = json.loads(trace.read_text())["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {p for p, _ in names} == {0, 1, 2, 3}
    assert all((p, s) in names for p in range(4) for s in ("host", "compute", "comm")), names
    comm = [e for e in events if e.get("cat") == "comm"]
    assert {e["args"]["axis"] for e in comm} == {"dp", "tp"}
    assert all(e["ph"] == "X" and e["dur"] >= 0 and e["args"]["bytes"] > 0 and
               re.search(r"tutorial_4_6_debugging\.py:\d+$", e["args"]["source"]) and
               e["args"]["schedule_op"].startswith("tsched.collective_start") for e in comm)
    trace.unlink()
    print("OK tutorial_4_6_debugging")
