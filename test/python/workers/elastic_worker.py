"""A small elastic job for `tessera launch --elastic`: 8 experts' weights
split over an `ep` axis (expert e on ep rank e // (8 / ep)) and a replicated
state, advanced by a fixed sequence of updates (drawn from a checkpointed
Generator), saved at every safe point. A restart on another ep size rehashes
the experts by that rule, so each rank updates the rows it now owns. Rank 0 appends
"step world_size restart" to OUT/log.txt at every step and writes the final
state to OUT/final.npz. With GROW_AT > 0 the first run writes 4 into
OUT/slots at that step (ranks "come back") and then takes its time, so the
launcher can ask it to grow.

    tessera launch -n 4 --elastic 2:4 elastic_worker.py OUT STEPS GROW_AT SEED
"""

import sys
import time
from pathlib import Path

import numpy as np

from tessera import dist

out, steps, grow_at, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

with dist.elastic(rejoin=True, safe_point="step", directory=out / "ckpt", keep=2,
                  world_sizes=(1, 2, 4)) as job:
    mesh = dist.Mesh(axes=["ep"], shape=(job.world_size,))
    experts = dist.from_numpy(np.zeros((8, 2), np.float32), dist.ShardSpec((0,), ("ep",)), mesh)
    saved = job.resume(tensors={"experts": experts, "replicated": np.zeros(3, np.float64)},
                       extra={"rng": np.random.default_rng(seed)})
    tensors, rng = saved.tensors, saved.extra["rng"]
    per_rank = 8 // job.world_size
    assert tensors["experts"].local().shape == (per_rank, 2)
    for step in range(job.step + 1, steps + 1):
        draw = rng.standard_normal(19)
        mine = [e for e in range(8) if e // per_rank == mesh.rank]     # the rehash rule
        local = tensors["experts"]
        update = draw[:16].reshape(8, 2)[mine].astype(np.float32)
        tensors = {"experts": dist.DTensor(local.local() + update, local.shape, local.dtype,
                                           local.layout, mesh),
                   "replicated": tensors["replicated"] * 0.5 + draw[16:]}
        if mesh.rank == 0:
            with open(out / "log.txt", "a") as log:
                log.write(f"{step} {job.world_size} {job.restart}\n")
        if grow_at and job.restart == 0 and step >= grow_at:
            if step == grow_at and mesh.rank == 0:
                (out / "slots").write_text("4\n")
            time.sleep(0.1)               # the launcher looks twice a second
        job.safe_point(step, tensors=tensors, extra={"rng": rng})

final = {"experts": tensors["experts"].numpy(), "replicated": tensors["replicated"]}
if mesh.rank == 0:
    np.savez(out / "final.npz", **final)
