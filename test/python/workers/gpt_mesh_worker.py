"""Trains the example GPT (examples/train_gpt.py) for a few steps on a dp x tp
mesh and writes every step's loss and the final parameters (gathered, rank 0)
to OUT/gpt-dp{dp}-tp{tp}.npz. Run with dp = tp = 1 for the single-device reference.

    mpiexec -n 4 python gpt_mesh_worker.py SEED DP TP STEPS OUT [PRECISION] [key=value ...]

PRECISION is fp32 (the default) or bf16 (autocast, dynamic loss scaling as
the example runs it); the file name then ends in -bf16. `pp=P mb=M
schedule=S` trains with P pipeline stages (make_pipeline_step) and writes
gpt-dp{dp}-tp{tp}-pp{P}.npz; `depth=D` sets the model's depth (a multiple of
P; the file name then ends in -d{D}).
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

import tessera as ts                # noqa: E402
from tessera import dist            # noqa: E402
from tessera._pytree import flatten, paths  # noqa: E402

import train_gpt as ex              # noqa: E402

seed, dp, tp, steps, out = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                            int(sys.argv[4]), Path(sys.argv[5]))
precision = sys.argv[6] if len(sys.argv) > 6 else "fp32"
options = dict(a.split("=") for a in sys.argv[7:])
pp, depth = int(options.get("pp", 1)), int(options.get("depth", 1))
WIDTH, DEPTH, HEADS, BATCH, LENGTH = 32, depth, 2, 8, 4

if pp > 1:
    mesh = dist.Mesh(axes=["dp", "tp", "pp"], shape=(dp, tp, pp))
else:
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(dp, tp)) if dp * tp > 1 else None
rng = np.random.default_rng(seed)
params = ex.init_params(WIDTH, DEPTH, HEADS, 2 * LENGTH, seed)
opt = ts.optim.AdamW(lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)
state = opt.init(params)
if mesh is not None:
    params, state = ex.distribute(mesh, params, state)
scaler = ts.optim.loss_scale_init(2.0 ** 12 if precision == "bf16" else 1.0)
if pp > 1:
    pipelined = ex.make_pipeline_step(opt, HEADS, mesh, options.get("schedule", "1F1B"),
                                      int(options.get("mb", 4)), clip=1.0)
else:
    step = ex.make_step(opt, HEADS, precision, clip=1.0)
losses = []
for _ in range(steps):
    batch = ex.shard_batch(mesh, ex.make_batch(rng, BATCH, LENGTH))
    if pp > 1:
        loss, params, state, _ = pipelined(params, state, batch)
    else:
        loss, params, state, scaler, _ = step(params, state, scaler, [batch])
    losses.append(float(loss))
final = {name: np.asarray(leaf) for name, leaf in zip(paths(params), flatten(params)[0])}
if mesh is None or mesh.rank == 0:
    suffix = ("" if precision == "fp32" else f"-{precision}") + (f"-pp{pp}" if pp > 1 else "") \
        + (f"-d{depth}" if depth != 1 else "")
    np.savez(out / f"gpt-dp{dp}-tp{tp}{suffix}.npz", losses=np.array(losses), **final)
