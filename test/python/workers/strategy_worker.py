"""`@ts.distribute` strategies on 2 ranks: trains the example GPT a few steps
with data_parallel or zero_redundancy_optimizer and writes (rank 0) the losses,
final parameters, the optimizer-state bytes each rank holds and the
collectives the compiler chose, to OUT/{strategy}.npz and OUT/{strategy}.json;
with data_parallel, each rank's error (or null) for a step with a target out
of range in rank 1's rows, to OUT/check.rank{R}.json.

    mpiexec -n 2 python strategy_worker.py SEED STRATEGY STEPS OUT
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

import tessera as ts                # noqa: E402
from tessera._pytree import flatten, paths  # noqa: E402

import train_gpt as ex              # noqa: E402

seed, strategy, steps, out = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
WIDTH, DEPTH, HEADS, BATCH, LENGTH = 32, 1, 2, 8, 4
opt = ts.optim.AdamW(lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)


@ts.jit
@ts.distribute(strategy=strategy)
def step(params, opt_state, batch):
    loss, grads = ts.value_and_grad(lambda p: ex.loss_fn(p, batch, HEADS))(params)
    params, opt_state = opt.update(params, grads, opt_state)
    return loss, params, opt_state


rng = np.random.default_rng(seed)
params = ex.init_params(WIDTH, DEPTH, HEADS, 2 * LENGTH, seed)
state = opt.init(params)
losses = []
for i in range(steps):
    batch = ex.make_batch(rng, BATCH, LENGTH)
    if i == 1:      # the steady state: parameters and state as the last step left them
        trace = ts.graph.trace(step, params, state, batch)
    loss, params, state = step(params, state, batch)
    losses.append(float(loss))
mesh = ts.mesh.current()
if strategy == "data_parallel":
    # A target out of range in rank 1's rows (batch row 5 of 8 is rank 1's
    # second; the flattened targets' row 5 * 8 + 6 = 46): that rank's step
    # raises once it has run, naming the global row; rank 0's returns (its
    # rows are fine, and the step's collectives completed on both).
    bad = ex.make_batch(rng, BATCH, LENGTH)
    bad["targets"][5, 6] = ex.VOCAB
    try:
        step(params, state, bad)
        check = None
    except ts.ValueCheckError as e:
        check = {"message": str(e), "row": e.row, "value": e.value, "high": e.high}
    (out / f"check.rank{mesh.rank}.json").write_text(json.dumps(check))
state_bytes = sum(t.nbytes for t in flatten(state)[0])
final = {n: np.asarray(v) for n, v in zip(paths(params), flatten(params)[0])}
if mesh.rank == 0:
    np.savez(out / f"{strategy}.npz", losses=np.array(losses), **final)
    (out / f"{strategy}.json").write_text(json.dumps({
        "state_bytes_per_rank": state_bytes, "mesh": mesh.topology,
        "collectives": [[c.op, c.axis, c.bytes] for c in trace.collectives]}))
