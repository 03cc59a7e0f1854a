"""Sharded checkpoints across ranks. `save` mode (4 ranks, dp x tp = 2 x 2):
an async save of tp-sharded DTensors, numpy optimizer state and extras while
the caller overwrites its parameters at once; loaded back onto the same mesh,
onto tp = 4 and dp = 4 meshes, each rank checks its shard against the global
values; then with a layouts tree, and with a typo'd one that every rank must
refuse. `crash` mode (2 ranks): a checkpoint, then a large async save that
rank 1 does not survive (SIGKILL while its writer thread runs).

    mpiexec -n 4 python checkpoint_worker.py save DIR OUT
    mpiexec -n 2 python checkpoint_worker.py crash DIR
"""

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

from tessera import checkpoint, dist

mode, directory = sys.argv[1], Path(sys.argv[2])


def model(seed):
    rng = np.random.default_rng(seed)       # every rank draws the same values
    return {"wqkv": rng.standard_normal((8, 12)).astype(np.float32),
            "wo": rng.standard_normal((12, 8)).astype(np.float32),
            "ln": rng.standard_normal(8).astype(np.float32)}


def layout(path, array):
    return {"wqkv": dist.ShardSpec((1,), ("tp",)), "wo": dist.ShardSpec((0,), ("tp",))}.get(
        path.split(".")[-1])


if mode == "save":
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
    values = model(0)
    params = dist.from_tree(values, layout, mesh)
    opt = {"step": np.float32(7), "m": {k: v * 0.5 for k, v in values.items()}}
    rng = np.random.default_rng(11)
    handle = checkpoint.save("step_7", tensors=params, optimizer=opt,
                             extra={"step": 7, "rng": rng, "data": {"epoch": 1, "offset": 96}},
                             directory=directory, async_io=True)
    for t in params.values():                # the training loop moves on at once
        t.local()[...] = -1.0
    opt["m"]["ln"][...] = -1.0
    handle.wait()
    verdict = {"blocked_s": handle.blocked_s}
    expected_next = rng.standard_normal()
    errors = {}
    for name, target in (("same mesh", mesh), ("tp=4", dist.Mesh(axes=["tp"], shape=(4,))),
                         ("dp=4", dist.Mesh(axes=["dp"], shape=(4,)))):
        tensors, optimizer, extra = checkpoint.load("latest", directory=directory, mesh=target)
        worst = 0.0
        for k, t in tensors.items():
            want = values[k][target.info.local_slices(t.shape, t.dims, target.rank)]
            worst = max(worst, float(np.max(np.abs(t.local() - want))))
            errors[f"{name} {k} layout"] = str(t.layout)
        worst = max(worst, float(np.max(np.abs(optimizer["m"]["ln"] - values["ln"] * 0.5))))
        errors[name] = worst
        errors[f"{name} extra"] = [extra["step"], extra["data"],
                                   extra["rng"].standard_normal() == expected_next]
    # A layouts tree on tp=4; then one naming no saved tensor, which every
    # rank must refuse (from the manifest, before reading), or the ranks that
    # went on would wait for the others at their next collective.
    tp4 = dist.Mesh(axes=["tp"], shape=(4,))
    wo = checkpoint.load("latest", directory=directory, mesh=tp4,
                         layouts={"tensors": {"wo": dist.ShardSpec((0,), ("tp",))}}).tensors["wo"]
    errors["tree wo"] = float(np.max(np.abs(wo.local() - values["wo"][3 * tp4.rank:][:3])))
    errors["tree wo layout"] = str(wo.layout)
    try:
        checkpoint.load("latest", directory=directory, mesh=tp4,
                        layouts={"tensors": {"wqvk": dist.ShardSpec((1,), ("tp",))}})
        refused = ""
    except checkpoint.CheckpointError as e:
        refused = str(e)
    # Into a pending-sum (partial over dp) target: the sum over dp is the value.
    pending = dist.from_numpy(np.zeros(8, np.float32), dist.ShardSpec(partial=("dp",)), mesh)
    ln = checkpoint.load("latest", directory=directory,
                         like={"tensors": {"ln": pending}}).tensors["ln"]
    errors["pending-sum ln"] = float(np.max(np.abs(ln.numpy() - values["ln"])))
    from tessera._mpi import allgather_text, world_comm
    verdict["typo"] = allgather_text(world_comm(), refused, what="the test's verdicts")
    verdict["errors"] = errors
    verdict["files"] = sorted(p.name for p in (directory / "step_7").iterdir())
    if mesh.rank == 0:
        Path(sys.argv[3]).write_text(json.dumps(verdict, indent=1))
elif mode == "crash":
    rank = int(os.environ.get("PMI_RANK", 0))
    checkpoint.save("good", tensors=model(1), directory=directory)
    # 2 x 64 MiB per rank: rank 1 dies while its writer thread is writing.
    big = {"a": np.ones((4096, 4096), np.float32), "b": np.full((4096, 4096), 2, np.float32)}
    mesh = dist.Mesh(axes=["dp"], shape=(2,))
    checkpoint.save("big", tensors=dist.from_tree(big, dist.ShardSpec((0,), ("dp",)), mesh),
                    directory=directory, async_io=True)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.save("after", tensors=model(2), directory=directory)   # never commits
