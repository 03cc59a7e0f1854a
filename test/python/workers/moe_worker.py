"""Expert parallelism equals one device: op.moe over an 'ep' x 'dp' mesh
(and 'ep' alone), dropless and with a capacity factor, gives the same
output, auxiliary losses and gradients as the single-device layer within
float32 rounding, and the same output as the float64 reference; and the example's MoE GPT trained 20 steps on
ep x dp = 2 x 2 follows single-device training. Rank 0 writes {case:
{result name: largest relative error, "dropped fraction"}}, the
indivisible-experts error and the two runs' losses to OUT.

    mpiexec -n 4 python moe_worker.py OUT
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

import tessera as ts                     # noqa: E402
from tessera import dist, op             # noqa: E402
from programs import moe_reference       # noqa: E402
import train_gpt                         # noqa: E402

out = Path(sys.argv[1])
T, D, F, E, K = 32, 8, 12, 8, 2
rng = np.random.default_rng(7)           # every rank draws the same inputs
x = rng.standard_normal((T, D)).astype(np.float32)
experts = {"router": rng.standard_normal((D, E)).astype(np.float32),
           "w1": (rng.standard_normal((E, D, F)) / np.sqrt(D)).astype(np.float32),
           "w2": (rng.standard_normal((E, F, D)) / np.sqrt(F)).astype(np.float32),
           "w3": (rng.standard_normal((E, D, F)) / np.sqrt(D)).astype(np.float32)}
R = rng.standard_normal((T, D)).astype(np.float32)


def make(mesh, capacity_factor, swiglu):
    def loss(x, ex):
        ex = ex if swiglu else {n: w for n, w in ex.items() if n != "w3"}
        y, aux = op.moe(x, experts=ex, k=K, capacity_factor=capacity_factor, return_aux=True,
                        mesh=mesh)
        return op.sum(op.mul(y, R)) + 0.1 * aux["load_balance"] + 0.01 * aux["z_loss"], y, aux

    @ts.jit(mesh=mesh)
    def step(x, ex):
        value, y, aux = loss(x, ex)
        return value, y, aux["dropped"], ts.grad(value, [x, ex])
    return step


def flat(result):
    value, y, dropped, (gx, gex) = result
    named = {"loss": value, "y": y, "dropped": dropped, "grad.x": gx}
    named.update({f"grad.{n}": g for n, g in gex.items()})
    return {n: np.asarray(v, np.float64) for n, v in named.items()}


verdict, single = {}, {}
for axes, shape in ((["ep", "dp"], (2, 2)), (["ep"], (4,))):
    mesh = dist.Mesh(axes=axes, shape=shape)
    cases = [(c, s) for c in (None, 0.75) for s in (False, True)] if len(axes) == 2 else \
        [(None, False), (0.75, True)]
    for capacity_factor, swiglu in cases:
        case = f"{'x'.join(axes)}{list(shape)} capacity={capacity_factor} swiglu={swiglu}"
        if (capacity_factor, swiglu) not in single:     # (each mesh compares with the same)
            single[capacity_factor, swiglu] = flat(make(None, capacity_factor, swiglu)(x, experts))
        one = single[capacity_factor, swiglu]
        many = flat(make(mesh, capacity_factor, swiglu)(x, experts))
        ex = experts if swiglu else {n: w for n, w in experts.items() if n != "w3"}
        ref_y, ref_aux = moe_reference(x, ex, K, capacity_factor)
        errors = {n: float(np.max(np.abs(many[n] - one[n])) / (np.max(np.abs(one[n])) + 1e-30))
                  for n in one}
        errors["y vs float64"] = float(np.max(np.abs(many["y"] - ref_y)) / np.max(np.abs(ref_y)))
        errors["dropped vs float64"] = abs(float(many["dropped"]) - ref_aux["dropped"])
        errors["dropped fraction"] = float(many["dropped"])
        verdict[case] = errors
# E = 6 experts do not split over ep = 4: an error naming the tensor and the
# line, raised while tracing (on every rank, before any communication).
six = {n: w[:6] if n != "router" else w[:, :6] for n, w in experts.items()}
try:
    make(mesh, None, False)(x, six)
    verdict["indivisible"] = "no error"
except ts.ShapeError as e:
    verdict["indivisible"] = str(e)
# The example's GPT with 4 experts per block: 20 training steps on one
# device and on ep x dp = 2 x 2, the same global batches.
gpt_mesh = dist.Mesh(axes=["ep", "dp"], shape=(2, 2))
losses = {}
for name, m in (("one device", None), ("ep x dp", gpt_mesh)):
    params = train_gpt.init_params(32, 2, 2, 8, 0, experts=4)
    opt = ts.optim.AdamW(lr=3e-3)
    state = opt.init(params)
    if m is not None:
        params, state = train_gpt.distribute(m, params, state)
    step = train_gpt.make_step(opt, 2, "fp32", clip=1.0)
    data, scaler, curve = np.random.default_rng(1), ts.optim.loss_scale_init(1.0), []
    for _ in range(20):
        batch = train_gpt.shard_batch(m, train_gpt.make_batch(data, 16, 4))
        loss, params, state, scaler, _ = step(params, state, scaler, [batch])
        curve.append(float(loss))
    losses[name] = curve
verdict["gpt losses"] = losses
if mesh.rank == 0:
    out.write_text(json.dumps(verdict, indent=1))
