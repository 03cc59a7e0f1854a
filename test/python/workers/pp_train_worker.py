"""A Hugging Face checkpoint fine-tuned over pp = 2 with each stage's
parameters and optimizer state on its own rank: models.from_pretrained
with a pp mesh reads each rank's layers, a step pipelined over pp computes
the gradients and (`then=`) clips them by their global norm and applies
AdamW where each parameter lives, and `results="stage"` keeps the updated
parameters and moments there. The loss curve is the single process's."""

import json
import sys
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import checkpoint, dist, models, op, pipeline

out_dir = Path(sys.argv[1])
fixture = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "mistral"   # (untied head)
ref = np.load(fixture / "reference.npz")
ids, mask = ref["input_ids"], ref["attention_mask"]
opt = ts.optim.AdamW(lr=1e-2)
STEPS = 3


def loss_of(model, params, ids, mask):
    logits = model.forward(params, ids, mask)
    return ts.nn.cross_entropy(op.reshape(logits[:, :-1], -1, logits.shape[-1]),
                               op.reshape(ids[:, 1:], -1))


def update(params, grads, state):
    grads, _ = ts.optim.clip_by_global_norm(grads, 1.0)
    return opt.update(params, grads, state)


# The single process's curve (each rank computes it: no rank waits).
whole = models.from_pretrained(fixture)


@ts.jit
def one_process(params, state, ids, mask):
    loss, grads = ts.value_and_grad(lambda p: loss_of(whole, p, ids, mask))(params)
    return (loss,) + update(params, grads, state)


params, state = whole.params, opt.init(whole.params)
expected = []
for _ in range(STEPS):
    loss, params, state = one_process(params, state, ids, mask)
    expected.append(float(loss))

mesh = dist.Mesh(axes=["pp"], devices=range(2))
staged = models.from_pretrained(fixture, mesh=mesh)


def apply(out, params, state, ids, mask):
    loss, grads = out
    return (loss,) + update(params, grads, state)


@pipeline.run(mesh=mesh, axis="pp", microbatches=2, batch=("ids", "mask"), then=apply,
              results="stage")
def step(params, state, ids, mask):
    return ts.value_and_grad(lambda p: loss_of(staged, p, ids, mask))(params)


params, state = staged.params, opt.init(staged.params)
moments_held = sum(x.nbytes for x in state["m"].values())
losses = []
for _ in range(STEPS):
    loss, params, state = step(params, state, ids, mask)
    losses.append(float(loss))
held = sum(x.nbytes for x in params.values()) + sum(x.nbytes for x in state["m"].values())
everything = 2 * sum(x.nbytes for x in whole.params.values())
names = [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(2)]
kinds = [type(params[n].local()).__name__ for n in names] + \
    [type(state["v"][n].local()).__name__ for n in names]
# A checkpoint of the stage-held parameters: each written by its holder.
checkpoint.save("staged", {"params": params}, directory=out_dir / "ckpt").wait()
back, _, _ = checkpoint.load("staged", directory=out_dir / "ckpt")
back = back["params"]
mine = [n for n in names if params[n].holds()]
round_trip = all(np.array_equal(np.asarray(back[n]), params[n].local()) for n in mine)
(out_dir / f"result.rank{mesh.rank}.json").write_text(json.dumps({
    "rank": mesh.rank, "losses": losses, "expected": expected, "held": [held, everything],
    "moments_held": moments_held, "kinds": kinds, "round_trip": round_trip,
    "results": [r.held for r in (params[names[0]], state["m"][names[1]])]}))
