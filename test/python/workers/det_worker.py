"""Deterministic, batch-invariant data parallelism: trains the example GPT for a
few steps with gradients accumulated over a fixed set of microbatches
(`ts.optim.accumulate_grad`) under `dist.deterministic()`, on a dp mesh of any
size, and writes the final parameters and last gradients (rank 0) to
OUT/det-dp{dp}-{tag}.npz.

    mpiexec -n DP python det_worker.py SEED DP STEPS OUT TAG
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

import tessera as ts                # noqa: E402
from tessera import dist            # noqa: E402
from tessera._pytree import flatten, paths  # noqa: E402

import train_gpt as ex              # noqa: E402

seed, dp, steps, out, tag = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                             Path(sys.argv[4]), sys.argv[5])
WIDTH, DEPTH, HEADS, BATCH, LENGTH, MICRO = 32, 1, 2, 4, 4, 4

mesh = dist.Mesh(axes=["dp"], shape=(dp,))
opt = ts.optim.AdamW(lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)


@ts.distribute(strategy="data_parallel", mesh=mesh)
def step(params, opt_state, microbatches):
    loss, grads = ts.optim.accumulate_grad(
        lambda p, mb: ex.loss_fn(p, mb, HEADS), params, microbatches)
    grads, _ = ts.optim.clip_by_global_norm(grads, 1.0)
    params, opt_state = opt.update(params, grads, opt_state)
    return loss, params, opt_state, grads


rng = np.random.default_rng(seed)
params = ex.init_params(WIDTH, DEPTH, HEADS, 2 * LENGTH, seed)
state = opt.init(params)
with dist.deterministic(reduce_tree="binary"):
    for _ in range(steps):
        batches = [ex.make_batch(rng, BATCH, LENGTH) for _ in range(MICRO)]
        stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}   # [M, b, S]
        loss, params, state, grads = step(params, state, stacked)
leaves = {f"param.{n}": np.asarray(v) for n, v in zip(paths(params), flatten(params)[0])}
leaves.update({f"grad.{n}": np.asarray(v) for n, v in zip(paths(grads), flatten(grads)[0])})
if mesh.rank == 0:
    np.savez(out / f"det-dp{dp}-{tag}.npz", loss=np.asarray(loss), **leaves)
