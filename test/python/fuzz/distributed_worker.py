"""One rank of the distributed fuzz run (test_fuzz_distributed.py starts it
under mpiexec): random programs with random ShardSpecs on a 1-D mesh (2
ranks) or a 2 x 2 mesh (4 ranks), each checked against the same program
run replicated (every rank the whole program, as on one device) and against
float64 numpy; bit for bit where no reduction can be reordered by the
split (`Program.elementwise_exact`). Hypothesis runs derandomized in every
rank, and each example's verdict is agreed by all ranks before hypothesis sees it, so
every rank draws, shrinks and reports the same programs.

Every other argument split along one dimension is built from each rank's
block (`dist.from_local`), the others from the global value.

Then a seventh as many (3 at least) programs around sequence-split attention
(`programs.context_parallel_programs`: Ulysses or the ring, segment ids,
grouped heads, causal, gradients).

argv: 1d|2d EXAMPLES OUT_DIR. Rank 0 writes OUT_DIR/current.py (the
program being run, as a script: a hang names it) and OUT_DIR/result.json."""

import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from mpi4py import MPI

import oracles
import programs
import tessera as ts
from tessera import dist

kind, examples, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
comm = MPI.COMM_WORLD
if kind == "1d":
    mesh, mesh_text = dist.Mesh(axes=["dp"], devices=[0, 1]), 'dist.Mesh(axes=["dp"], devices=[0, 1])'
    axes = {"dp": 2}
else:
    mesh = dist.Mesh(axes=["dp", "tp"], devices=[[0, 1], [2, 3]])
    mesh_text = 'dist.Mesh(axes=["dp", "tp"], devices=[[0, 1], [2, 3]])'
    axes = {"dp": 2, "tp": 2}
count = [0]


def place(i: int, spec_args: tuple, a: np.ndarray):
    """Argument `i` with its ShardSpec: every other argument split along one
    dimension (and not partial) is built from this rank's block, as
    per-rank data loading gives it (`dist.from_local`); the others from the
    global value (`dist.from_numpy`)."""
    spec = dist.ShardSpec(*spec_args)
    dims = spec.dims_for(a.ndim, mesh)
    split = [d for d, axes in enumerate(dims) if axes]
    if i % 2 or len(split) != 1 or spec.partial:
        return dist.from_numpy(a, spec, mesh)
    block = a[mesh.info.local_slices(a.shape, dims, mesh.rank)]
    return dist.from_local(block, axis=dims[split[0]], dim=split[0], mesh=mesh)


def check(p) -> str | None:
    """What is wrong with `p` on the mesh, on this rank (None: nothing)."""
    arrays = p.draw_inputs(seed=2)
    filename = str(out / f"program_{count[0]}.py")
    try:
        def sharded(fn, *args):
            target = ts.TargetOptions(context_parallel=p.context_parallel)
            return ts.jit(fn, target=target)(*[place(i, p.specs[v.name], a)
                                for i, (v, a) in enumerate(zip(p.arguments(), args))])
        got = oracles.run(p, arrays, filename, call=sharded)
        one_device = oracles.run(p, arrays, filename)
    except Exception as e:           # any error on a valid program is a bug
        return f"{type(e).__name__}: {e}"
    if p.wrt:
        wrong = oracles.judge_gradient(p, arrays, got)
        one_device_wrong = oracles.judge_gradient(p, arrays, one_device)
    else:
        wrong = oracles.judge_forward(p, arrays, got)
        one_device_wrong = oracles.judge_forward(p, arrays, one_device)
    if wrong and not one_device_wrong:
        return f"sharded differs, replicated matches: {wrong}"
    if wrong:
        return f"wrong on the mesh and replicated: {wrong}"
    for i, (a, b) in enumerate(zip(got, one_device)):
        if p.elementwise_exact:
            if not np.array_equal(a, b, equal_nan=True):
                return (f"result {i}: sharded and replicated runs differ in bits, with no "
                        f"reduction to reorder: {a.ravel()[:4]} vs {b.ravel()[:4]}")
            continue
        bad = programs.compare(a, b.astype("float64"), 1.0 + programs.finite_max(b), p.uses_bf16)
        if bad:
            return f"result {i}: sharded and replicated runs differ: {bad}"
    return None


def one(p):
    count[0] += 1
    if comm.rank == 0:
        (out / "current.py").write_text(p.source(seed=2, mesh=mesh_text))
    oracles.agree(comm, check(p), f"the program, as a script (mpiexec -n {comm.size}) ---\n"
                  f"{p.source(seed=2, mesh=mesh_text)}")


def fuzz(n: int, context_parallel: bool):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))(
        given(p=programs.sharded_programs(axes, context_parallel))(one))


def test_sharded():
    """The random programs, then a seventh as many (3 at least) around
    attention with its sequence split (context parallelism: all-to-all or
    ring)."""
    fuzz(examples, False)()
    fuzz(max(3, examples // 7), True)()


oracles.run_and_report(test_sharded, comm, out, count)
