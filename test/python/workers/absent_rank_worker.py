"""Rank 1 never reaches the compiled call (stuck loading its data), so rank
0 waits in the program agreement before the call's first run; run under
`tessera launch` with a short TESSERA_COLLECTIVE_TIMEOUT, rank 0 must fail
with CollectiveTimeout naming rank 1, and the launcher stop the job.
Rank 0 prints the time it called."""
import sys
import time

import numpy as np

import tessera as ts
from tessera import dist

mesh = dist.Mesh(axes=["dp"], devices=range(2))


@ts.compile(mesh=mesh)
def step(x):
    return x * 2.0


if mesh.rank == 1:
    while True:                   # "loading data", forever
        time.sleep(0.05)
print(f"calling at {time.time():.3f}", flush=True)
step(np.ones(4, np.float32))
sys.exit("rank 0 returned from a call rank 1 never made")
