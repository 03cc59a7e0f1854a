"""Hierarchical all-reduce on 4 ranks as 2 nodes of 2: a data-parallel
gradient step (dp = 4) compiled flat and with `ranks_per_node=2`, plain and
deterministic. Rank 0 writes OUT/hierarchical.json: whether the hierarchical
program's schedule runs its gradient all-reduce as reduce-scatter / all-reduce
/ all-gather over the sub-axes, the largest difference between the flat and
hierarchical results (plain), whether they are the same bits
(deterministic), and the error against a float64 numpy reference.

    tessera launch -n 4 --ranks-per-node 2 hierarchical_worker.py SEED OUT

(`from_launcher`: a function compiled without options is hierarchical too.)
"""

import json
import sys
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import dist, op

seed, out = int(sys.argv[1]), Path(sys.argv[2])
mesh = dist.Mesh(axes=["dp"], shape=(4,))
rng = np.random.default_rng(seed)
x = rng.standard_normal((16, 6)).astype(np.float32)
y = rng.standard_normal((16, 5)).astype(np.float32)
w = rng.standard_normal((6, 5)).astype(np.float32)
b = rng.standard_normal(5).astype(np.float32)        # 30 + 5 = 35 elements: padded to 36
rows = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
X, Y = (dist.from_numpy(a, layout=rows, mesh=mesh) for a in (x, y))


def step(w, b, x, y):
    def loss(params):
        out = op.tanh(op.matmul(x, params[0]) + params[1])
        return op.sum((out - y) * (out - y))
    return ts.value_and_grad(loss)([w, b])


def run(options: ts.TargetOptions | None, deterministic: bool):
    compiled = ts.compile(step, mesh=mesh, deterministic=deterministic, target=options)
    value, (gw, gb) = compiled(w, b, X, Y)
    schedule = ts.graph.trace(compiled, w, b, X, Y).schedule
    return [np.asarray(value), np.asarray(gw), np.asarray(gb)], schedule


x64, y64, w64, b64 = (a.astype(np.float64) for a in (x, y, w, b))
h = np.tanh(x64 @ w64 + b64)
dh = 2 * (h - y64) * (1 - h * h)
reference = [np.sum((h - y64) ** 2), x64.T @ dh, dh.sum(0)]

report = {}
for deterministic in (False, True):
    flat, flat_ir = run(ts.TargetOptions(target="cpu", hierarchical_collectives=False),
                        deterministic)
    tiered, tiered_ir = run(ts.TargetOptions(target="cpu", ranks_per_node=2), deterministic)
    tag = "deterministic" if deterministic else "plain"
    report[tag] = {
        "flat_has_sub_axes": '"dp:(' in flat_ir,
        "sub_axes": all(s in tiered_ir for s in (
            '<reduce_scatter>', 'over @mesh["dp:(2)2"]', 'over @mesh["dp:(1)2"]')),
        "max_diff": max(float(np.abs(a - c).max()) for a, c in zip(flat, tiered)),
        "same_bits": all(np.array_equal(a, c) for a, c in zip(flat, tiered)),
        "max_err": max(float(np.abs(c - r).max() / max(1.0, np.abs(r).max()))
                       for c, r in zip(tiered, reference)),
    }
# No options: TESSERA_RANKS_PER_NODE, which `tessera launch --ranks-per-node` sets.
report["from_launcher"] = 'over @mesh["dp:(1)2"]' in run(None, False)[1]
if mesh.rank == 0:
    (out / "hierarchical.json").write_text(json.dumps(report))
