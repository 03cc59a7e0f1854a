"""Collectives guide 7 (troubleshooting and diagnostics): the table's rows
as the commands that diagnose them in Tessera, each run and checked here on
2 ranks, and the guide's "enable logs" command as written:

    TESSERA_COMM_TRACE=1 TESSERA_DETERMINISTIC=1 python train.py

(`train.py` is this script's `train` role, launched on 2 ranks: a
data-parallel step and a 2-stage pipeline, profiled.)

| symptom            | how Tessera shows it, checked below                              |
|--------------------|------------------------------------------------------------------|
| collective hang    | the flight recorder: who waits, who never started which one      |
| low overlap        | `dist.profile()`: the `overlapped` column and comm exposed       |
| non-determinism    | TESSERA_DETERMINISTIC=1: two runs give the same bits             |
| pipeline bubbles   | `step.pipeline_report()`: more microbatches, a smaller bubble    |

The first row (NVSHMEM/DeepEP init or QP errors) needs GPUs: not scripted.

    python examples/design_docs/collectives_7_troubleshooting.py
"""
import os
import re
import subprocess
import sys

import numpy as np


def train() -> None:
    """One rank of `train.py`: 3 profiled data-parallel steps, then a
    2-stage pipeline with 2 and with 8 microbatches; rank 0 prints the
    loss's bits and each pipeline's bubble."""
    import tessera as ts
    from tessera import dist, graph, op, pipeline
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
    x = dist.from_numpy(rng.standard_normal((8, 16)).astype(np.float32),
                        dist.ShardSpec((0,), ("dp",)), mesh)

    @ts.compile(mesh=mesh)
    def step(w, x):
        return ts.value_and_grad(lambda w: op.mean(op.tanh(op.matmul(x, w)) ** 2))(w)

    step(w, x)
    with dist.profile(None) as prof:
        for _ in range(3):
            loss, grad = step(w, x)
    pp = dist.Mesh(axes=["pp"], devices=range(2))

    @graph.stage("layer")              # each call is one stage: 2 calls on 2 pp ranks
    def layer(wi, h):
        return op.tanh(op.matmul(h, wi))

    bubbles = []
    for m in (2, 8):
        @pipeline.run(mesh=pp, axis="pp", schedule="1F1B", microbatches=m)
        def pipe(ws, x):
            for wi in ws:
                x = layer(wi, x)
            return x
        pipe([w, w], rng.standard_normal((16, 16)).astype(np.float32))
        bubbles.append(pipe.pipeline_report().bubble)
    if mesh.rank == 0:
        print(f"loss bits {np.float32(loss).view(np.uint32):08x}", flush=True)
        print(f"overlapped column: {'overlapped' in prof.table}", flush=True)
        print(f"bubbles {bubbles[0]:.4f} {bubbles[1]:.4f}", flush=True)


def hang() -> None:
    """Rank 1 skips the second all-reduce: the others wait in it."""
    import tessera as ts
    from tessera import dist, op
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    x = dist.from_numpy(np.ones((4, 4), np.float32), dist.ShardSpec((0,), ("dp",)), mesh)
    total = ts.compile(lambda x: op.sum(x), mesh=mesh)
    for i in range(2):
        if not (mesh.rank == 1 and i == 1):
            total(x)


def launch(role: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tessera", "launch", "-n", "2", __file__, role],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def main() -> None:
    # Enable logs (the guide's command) and non-determinism: two runs, same bits.
    logs = {"TESSERA_COMM_TRACE": "1", "TESSERA_DETERMINISTIC": "1"}
    runs = [launch("train", logs) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    first, second = (re.search(r"loss bits (\w+)", r.stdout).group(1) for r in runs)
    assert first == second, (first, second)
    assert re.search(r"\[tessera comm\] rank 0 dp all_reduce sum deterministic \d+ B",
                     runs[0].stderr), runs[0].stderr[-2000:]
    # Low overlap: dist.profile's table has the overlapped share of communication.
    assert "overlapped column: True" in runs[0].stdout
    # Pipeline bubbles: 8 microbatches idle the 2 stages less than 2 do.
    few, many = (float(b) for b in re.search(r"bubbles (\S+) (\S+)", runs[0].stdout).groups())
    assert 0 < many < few, (few, many)
    # Collective hang: the flight recorder names the rank that never arrived.
    stuck = launch("hang", {"TESSERA_COLLECTIVE_TIMEOUT": "2"})
    assert stuck.returncode != 0
    assert re.search(r"dp all_reduce #2 \(collectives_7_troubleshooting\.py:\d+\): rank 0 "
                     r"waiting, rank 1 never started it", stuck.stderr), stuck.stderr[-3000:]
    print("OK collectives_7_troubleshooting")


if __name__ == "__main__":
    {"train": train, "hang": hang}.get(sys.argv[1] if len(sys.argv) > 1 else "", main)()
