"""Machine descriptions for the cost model (`trace.cost()`, `tessera calibrate`).

`machine("h100-node")` and `machine("h200-node")` are datasheet descriptions
(`tessera_compiler.cost.BUILTIN`). `machine("cpu", ranks=R)` is this machine
running R ranks, measured once by `calibrate` and cached under the cache
directory (`machines/`): the kernel, BLAS, copy and Python rates are those of
one rank alone (one process); then R ranks time all_reduce /
all_gather / reduce_scatter of 1 KiB to 2 MiB over the world and over pairs,
through the communicators the runtime gives a program's axes (alpha and
beta: a least-squares fit of the ring model to those times).

    tessera calibrate -n 4          # measure (about a minute), print, cache
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tessera_runtime
from tessera_runtime import env as tessera_env
from tessera_runtime import profiler
from tessera_compiler.cost import BUILTIN, Link, Machine, collective_seconds, kernel_work

__all__ = ["machine", "calibrate", "cache_path"]

_N = 1 << 17                        # elements of the kernel benchmarks' arrays (512 KiB: a step's sizes)
_COMM_BYTES = (1 << 10, 1 << 14, 1 << 18, 1 << 21)


def host_cpu() -> tuple[str, int]:
    """(the CPU's model name, the cores this process may run on)."""
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return cpu or platform.processor(), _cores()


#: what a calibration measures and how; a cached one of another method is
#: measured again (2: the rates on a launched rank's threads, not every core's;
#: 3: the links through the runtime's own communicators, shared memory on one host)
METHOD = 3


def _host_key() -> str:
    cpu, cores = host_cpu()
    text = f"{platform.node()}|{cpu}|{cores}|{platform.machine()}|{METHOD}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_path(ranks: int) -> Path:
    """Where the calibration of this host with `ranks` ranks is cached."""
    return tessera_env.cache_root() / "machines" / f"cpu-{ranks}r-{_host_key()}.json"


def machine(name: str = "cpu", ranks: int = 1, progress=None) -> Machine:
    """The description of machine `name`: "cpu" (this host with `ranks`
    ranks; calibrated on first use, about a minute) or a built-in one."""
    if isinstance(name, Machine):
        return name
    if name in BUILTIN:
        return BUILTIN[name]
    if name != "cpu":
        raise ValueError(f"unknown machine {name!r}: 'cpu' or one of {sorted(BUILTIN)}")
    path = cache_path(ranks)
    if path.exists():
        try:
            return Machine.from_json(json.loads(path.read_text()))
        except (TypeError, ValueError, KeyError):
            pass            # written by another version of Tessera: measure again
    if tessera_runtime.world()[1] > 1:
        raise RuntimeError(f"this host has no calibration for {ranks} ranks yet, and a launched "
                           f"job cannot measure one: run `tessera calibrate -n {ranks}` first")
    return calibrate(ranks, progress=progress)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def calibrate(ranks: int = 1, progress=None) -> Machine:
    """Measures this host running `ranks` ranks, caches and returns the
    description: the rates of one rank alone (one process), then, for
    `ranks` > 1, the collectives in a job of `ranks` ranks."""
    from .cli import thread_limits
    say = progress or (lambda msg: print(f"[tessera] {msg}", file=sys.stderr, flush=True))
    path = cache_path(ranks)
    say(f"calibrating the cost model for {ranks} rank(s) on this host (once; cached in {path})")
    with tempfile.TemporaryDirectory(prefix="tessera-calibrate-") as tmp:
        script = Path(tmp) / "calibrate.py"
        script.write_text("import sys\nfrom tessera.machine import _measure\n"
                          "_measure(sys.argv[1], sys.argv[2])\n")
        measured = {}
        for what, n in (("rates", 1), ("links", ranks)):
            if what == "links" and ranks == 1:
                measured["links"] = {"alpha_s": 0.0, "beta_s": 0.0}
                continue
            out = Path(tmp) / f"{what}.json"
            cmd = [sys.executable, str(script), what, str(out)] if n == 1 else \
                [sys.executable, "-m", "tessera", "launch", "-n", str(n), str(script), what,
                 str(out)]
            # One rank alone measures with the BLAS threads a rank of an
            # R-rank job gets (`tessera launch` sets them; the user's win).
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**thread_limits(ranks), **os.environ})
            if proc.returncode != 0 or not out.exists():
                raise RuntimeError(f"calibration failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
            measured[what] = json.loads(out.read_text())
    links, rates = measured["links"], measured["rates"]
    link = Link(links["alpha_s"], links["beta_s"])
    description = Machine(
        name=f"cpu ({ranks} rank{'s' if ranks > 1 else ''})", intra=link, inter=link,
        ranks_per_node=ranks, cores_per_node=_cores(), overlap=False, async_launch=False,
        source=f"measured by tessera calibrate on {platform.node()}, {time.strftime('%Y-%m-%d')}",
        **rates)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(description.to_json(), indent=1))
    return description


# ---------------------------------------------------------------------------
# The measurements (every rank of the calibration job runs these)
# ---------------------------------------------------------------------------
def _timed(fn, args, reps: int):
    """(module, median seconds per call of: its launches, the executor's work
    inside the run between them, the call outside the run; instructions)."""
    import tessera as ts
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
    from tessera_compiler.bundle import program_json
    instructions = len(program_json(module)["instructions"])
    return (module, statistics.median(compute), statistics.median(inside),
            statistics.median(outside), instructions)


def _kernel_rates(say) -> dict:
    from tessera import op
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
    _, launch, tiny_in, tiny_out, tiny_n = _timed(lambda x: x + 1.0, [x[:16].copy()], 200)
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
    _, _, many_in, many_out, many_n = _timed(lambda *xs: [x + 1.0 for x in xs], many, 50)
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
    import tessera as ts
    from tessera import op

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
    from ._mpi import world_comm
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


def _measure(what: str, out: str) -> None:
    """`calibrate`'s measurement `what` ("rates": one process; "links":
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
