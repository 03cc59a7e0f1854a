"""The measurements of `tessera calibrate` (`machine.calibrate`), run by
every rank of the calibration job as a script: they compile and time Tessera
programs, so they sit above the whole API (the machine descriptions they
produce sit at the bottom, in `machine`)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import tessera_runtime
from tessera_compiler.bundle import program_json
from tessera_compiler.cost import Link, collective_seconds, kernel_work
from tessera_runtime import profiler

import tessera as ts

from . import op
from ._mpi import world_comm

_N = 1 << 17                        # elements of the kernel benchmarks' arrays (512 KiB: a step's sizes)
_COMM_BYTES = (1 << 10, 1 << 14, 1 << 18, 1 << 21)


def _timed(fn, args, reps: int):
    """(module, median seconds per call of: its launches, the executor's work
    inside the run between them, the call outside the run; instructions)."""
    compiled = ts.compile(fn)
    compiled(*args)                                       # compile and warm up
    module = ts.graph.trace(compiled, *args).levels.module
    compute, inside, outside = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        rec = profiler.start()
        compiled(*args)
        profiler.stop()
        wall = time.perf_counter() - t0
        launches = sum(s[4] - s[3] for s in rec.slices if s[2] == "compute")
        run = sum(s[4] - s[3] for s in rec.slices if s[2] == "run")
        compute.append(launches)
        inside.append(run - launches)
        outside.append(wall - run)
    instructions = len(program_json(module)["instructions"])
    return (module, statistics.median(compute), statistics.median(inside),
            statistics.median(outside), instructions)


def _kernel_rates(say) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(_N).astype(np.float32)
    y = rng.standard_normal(_N).astype(np.float32)

    def cheap(x):
        for _ in range(8):
            x = x * 1.0001 + 0.5
        return x

    def transcendental(x):
        for _ in range(4):
            x = op.tanh(op.exp(x * 0.001))
        return x

    say("kernels: launch, memory, elementwise and transcendental rates")
    _, launch, _, tiny_out, _ = _timed(lambda x: x + 1.0, [x[:16].copy()], 200)
    mod, t_cheap, _, _, _ = _timed(cheap, [x], 20)
    w = kernel_work(mod)
    vector = sum(k.vector for k in w.values())
    vector_rate = vector / max(t_cheap - launch * len(w), 1e-9)
    mod, t_trans, _, _, _ = _timed(transcendental, [x], 10)
    w = kernel_work(mod)
    trans = sum(k.transcendental for k in w.values())
    rest = sum(k.vector for k in w.values()) / vector_rate + launch * len(w)
    trans_rate = trans / max(t_trans - rest, 1e-9)
    _, t_add, _, _, _ = _timed(lambda a, b: a + b, [x, y], 20)
    memory_rate = 3 * 4 * _N / max(t_add - launch, 1e-9)
    say("library calls: matmul and copies; the Python of a call and of each instruction")
    a = rng.standard_normal((512, 512)).astype(np.float32)
    small = rng.standard_normal((8, 8)).astype(np.float32)

    _, t_small_mm, _, _, _ = _timed(lambda a, b: op.matmul(a, b), [small, small], 100)
    # The Python around the launches: instruction_s per instruction inside a
    # run (at a step's sizes: allocating a buffer costs more as it grows);
    # call_s + argument_s per argument and result outside it. Fitted to three
    # programs: one op, 32 ops on 32 arguments, a small training step.
    many = [small * 0.1 for _ in range(32)]
    _, _, _, many_out, _ = _timed(lambda *xs: [x + 1.0 for x in xs], many, 50)
    _, _, train_in, train_out, train_n = _timed(_train, _train_args(), 20)
    instruction = max(train_in / train_n, 0.0)
    (call, argument), *_ = np.linalg.lstsq(np.array([[1.0, 2], [1.0, 64], [1.0, 7]]),
                                           [tiny_out, many_out, train_out], rcond=None)
    call, argument = max(call, 0.0), max(argument, 0.0)
    curve = []
    for n in (32, 64, 128, 256, 512):
        _, t_mm, _, _, _ = _timed(lambda a, b: op.matmul(a, b), [a[:n, :n].copy()] * 2,
                                  max(10, 2 ** 24 // n ** 3))
        curve.append([2.0 * n ** 3, 2.0 * n ** 3 / max(t_mm - t_small_mm, 1e-9)])
    gemm = curve[-1][1]
    m = rng.standard_normal((256, 512)).astype(np.float32)    # 512 KiB: a step's sizes
    _, t_transpose, _, _, _ = _timed(lambda m: op.transpose(m), [m], 20)
    transpose_rate = 2 * 4 * m.size / max(t_transpose - launch, 1e-9)
    _, t_copy, _, _, _ = _timed(lambda m: m[:, 128:384], [m], 20)
    copy_rate = 2 * 4 * m.size / 2 / max(t_copy - launch, 1e-9)
    return {"gemm_flops": {"default": gemm}, "gemm_curve": curve,
            "gemm_call_s": t_small_mm,
            "memory_bytes_per_s": memory_rate, "vector_ops_per_s": vector_rate,
            "transcendental_ops_per_s": trans_rate, "launch_s": launch,
            "copy_bytes_per_s": copy_rate, "transpose_bytes_per_s": transpose_rate,
            "instruction_s": float(instruction), "call_s": float(call),
            "argument_s": float(argument)}


def _train(x, w1, w2, y):
    """A small training step: a step's mix of instructions (forward,
    backward, update; generated kernels, BLAS, allocations, Python)."""
    def loss(ws):
        out = op.matmul(op.gelu(op.matmul(x, ws[0])), ws[1])
        return op.mean((out - y) * (out - y))
    value, (g1, g2) = ts.value_and_grad(loss)([w1, w2])
    return value, w1 - 0.1 * g1, w2 - 0.1 * g2


def _train_args() -> list:
    rng = np.random.default_rng(0)
    xs, ws = (rng.standard_normal(s).astype(np.float32) for s in ((512, 128), (128, 128)))
    return [xs, ws, ws * 0.5, xs]


def _comm_link(say, reps: int = 12) -> Link:
    """alpha and beta fitted to collectives over the world and over pairs,
    each started by every rank at once (after a barrier): the transfer
    itself, through the communicator a program's axis gets (shared memory
    between the ranks of one machine, else MPI). What ranks sharing cores
    add is the model's `cores_per_node`."""
    from tessera_runtime.mpi_comm import MPICommunicator
    from tessera_runtime.shm_comm import SharedMemoryCommunicator
    world = world_comm()
    rank, size = world.Get_rank(), world.Get_size()

    def runtime_comm(comm, members):
        return SharedMemoryCommunicator.for_group(comm, members, size) or MPICommunicator(comm)
    groups = [(runtime_comm(world, list(range(size))), size)]
    if size >= 4 and size % 2 == 0:
        pair = rank - rank % 2
        groups.append((runtime_comm(world.Split(rank // 2, rank), [pair, pair + 1]), 2))
    say(f"collectives: {', '.join(str(n) for _, n in groups)} ranks, "
        f"{_COMM_BYTES[0]} to {_COMM_BYTES[-1]} bytes")

    def timed(collective) -> float:
        samples = []
        for _ in range(reps):
            world.Barrier()
            t0 = time.perf_counter()
            collective().wait()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    rows, times = [], []
    for comm, n in groups:
        for nbytes in _COMM_BYTES:
            a = np.ones(nbytes // 4, np.float32)
            for kind in ("all_reduce", "all_gather", "reduce_scatter"):
                if kind == "all_reduce":
                    out = np.empty_like(a)
                    run, size_b = (lambda: comm.all_reduce(a, out, "sum")), nbytes
                elif kind == "all_gather":
                    out = np.empty(a.size * n, np.float32)
                    run, size_b = (lambda: comm.all_gather(a, out, 0)), nbytes * n
                else:
                    out = np.empty(a.size // n, np.float32)
                    run, size_b = (lambda: comm.reduce_scatter(a, out, 0)), nbytes
                t = timed(run)
                total = np.zeros(1)
                world.Allreduce(np.array([t]), total)            # the ranks' mean
                t = float(total[0]) / size
                # The model's coefficients of alpha and beta for this call.
                steps = collective_seconds(kind, size_b, n, Link(1.0, 0.0))
                volume = collective_seconds(kind, size_b, n, Link(0.0, 1.0))
                rows.append((steps / t, volume / t))      # relative error, not absolute
                times.append(1.0)
    (alpha, beta), *_ = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)
    return Link(max(float(alpha), 1e-7), max(float(beta), 1e-12))


def measure(what: str, out: str) -> None:
    """`machine.calibrate`'s measurement `what` ("rates": one process; "links":
    every rank of its job); rank 0 writes `out`."""
    rank, size = tessera_runtime.world()

    def say(msg):
        if rank == 0:
            print(f"[tessera calibrate] {msg}", file=sys.stderr, flush=True)

    if what == "rates":
        result = _kernel_rates(say)
    else:
        link = _comm_link(say)
        result = {"alpha_s": link.alpha_s, "beta_s": link.beta_s}
    if rank == 0:
        Path(out).write_text(json.dumps(result, indent=1))
