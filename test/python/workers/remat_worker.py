"""Recomputation on a dp x tp mesh keeps every bit: the example GPT's loss and
gradients with each block recomputed (`remat="full"`) equal those without,
on dp x tp and on a tp x pp pipeline (1F1B). (Under bf16 autocast on one
device: test_remat.py.) Rank 0 writes a JSON verdict to OUT:
{case: {"differs": [names of results whose bits changed], "peak_none",
"peak_remat"}}.

    mpiexec -n 4 python remat_worker.py OUT
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

import tessera as ts                # noqa: E402
from tessera import dist            # noqa: E402
from tessera._pytree import flatten, paths  # noqa: E402

import train_gpt as ex              # noqa: E402

out = Path(sys.argv[1])
WIDTH, DEPTH, HEADS, LENGTH, BATCH = 32, 2, 2, 4, 8
mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
params = ex.init_params(WIDTH, DEPTH, HEADS, 2 * LENGTH, 0)
opt_state = ts.optim.AdamW(lr=1e-3).init(params)
params, _ = ex.distribute(mesh, params, opt_state)
batch = ex.shard_batch(mesh, ex.make_batch(np.random.default_rng(1), BATCH, LENGTH))


def peaks(plain, remat) -> dict:
    """The planned peaks, on rank 0 (which writes the verdict): a memory
    report plans the step again, on every rank that asks."""
    if mesh.rank != 0:
        return {}
    return {"peak_none": plain.memory_report().peak, "peak_remat": remat.memory_report().peak}


def differing(names, plain: list, remat: list) -> list:
    """The names of the results whose bits differ."""
    return [n for n, x, y in zip(names, plain, remat)
            if not np.array_equal(np.ascontiguousarray(x).view(np.uint8),
                                  np.ascontiguousarray(y).view(np.uint8))]


verdict = {}
names = ["loss"] + ["grad." + p for p in paths(params)]
plain, remat = (ex.make_gradients(HEADS, "fp32", r) for r in (None, "full"))
a = [np.asarray(x) for x in flatten(plain(params, batch))[0]]
b = [np.asarray(x) for x in flatten(remat(params, batch))[0]]
verdict["fp32"] = {"differs": differing(names, a, b), **peaks(plain, remat)}
# A pipeline (dp=1 x tp=2 x pp=2, 1F1B over 4 microbatches): the recomputed
# copies run in each stage's backward; the same bits, less memory per rank.
# (Microbatches of 4 sequences: at 2 the peak is set where no activation
# is held, so recomputation has nothing to save.)
pp_mesh = dist.Mesh(axes=["dp", "tp", "pp"], shape=(1, 2, 2))
pp_params, _ = ex.distribute(pp_mesh, ex.init_params(WIDTH, DEPTH, HEADS, 2 * LENGTH, 0),
                             opt_state)
pp_batch = ex.shard_batch(pp_mesh, ex.make_batch(np.random.default_rng(1), 2 * BATCH,
                                                 LENGTH))
plain, remat = (ex.make_pipeline_step(ts.optim.AdamW(lr=1e-3), HEADS, pp_mesh, "1F1B", 4, 1.0,
                                      remat=r).gradients for r in (None, "full"))
a = [np.asarray(x) for x in flatten(plain(pp_params, pp_batch))[0]]
b = [np.asarray(x) for x in flatten(remat(pp_params, pp_batch))[0]]
verdict["pipeline"] = {"differs": differing(names, a, b), **peaks(plain, remat)}
if mesh.rank == 0:
    out.write_text(json.dumps(verdict))
