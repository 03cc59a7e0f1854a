"""The cost model (tessera_compiler/cost.py) and machine descriptions
(tessera/machine.py): what each instruction costs, how streams overlap,
which link a group uses, and the calibration's cache."""

import dataclasses
import json
import math

import numpy as np
import pytest

import tessera as ts
from tessera import dist, op
from tessera_compiler.cost import BUILTIN, Link, Machine, kernel_work, predict, predict_ranks

RATES = dict(gemm_flops={"default": 1e9}, gemm_call_s=1e-6, memory_bytes_per_s=1e9,
             vector_ops_per_s=1e8, transcendental_ops_per_s=1e7, launch_s=1e-6,
             copy_bytes_per_s=1e9, transpose_bytes_per_s=1e9, instruction_s=1e-6, call_s=1e-4, argument_s=0.0)


def _machine(overlap: bool, alpha=1e-5, beta=1e-9, ranks_per_node=8) -> Machine:
    return Machine(name="test", intra=Link(alpha, beta), inter=Link(10 * alpha, 10 * beta),
                   ranks_per_node=ranks_per_node, cores_per_node=ranks_per_node, overlap=overlap, async_launch=False, **RATES)


def _program(launch_before_wait: str) -> dict:
    """all_reduce of 4 MiB over 4 ranks started, a kernel launch, then the
    wait (the launch `launch_before_wait` sized work)."""
    return {
        "inputs": [{"value": "%arg0", "local_shape": [1 << 20], "dtype": "float32"},
                   {"value": "%arg1", "local_shape": [1 << 20], "dtype": "float32"}],
        "streams": ["compute", "comm"],
        "mesh": {"axes": ["dp"], "shape": [4], "devices": [0, 1, 2, 3]},
        "instructions": [
            {"op": "alloc", "result": "%0", "shape": [1 << 20], "dtype": "float32"},
            {"op": "collective_start", "result": "%t0", "stream": "comm",
             "collective": "all_reduce", "axis": "dp", "src": "%arg0", "dst": "%0"},
            {"op": "launch", "kernel": launch_before_wait, "stream": "compute",
             "args": ["%arg1", "%arg1"]},
            {"op": "collective_wait", "token": "%t0", "stream": "compute"},
            {"op": "return", "values": ["%0"]}]}


def test_a_collective_hides_under_compute_only_where_the_machine_overlaps():
    """Ring all_reduce of B = 4 MiB over 4 ranks: 6 alpha + 1.5 B beta. With
    overlap it runs beside a longer kernel and nothing is exposed; without
    (MPI on the CPU) it runs inside the wait, after the kernel."""
    from tessera_compiler.cost import KernelWork
    nbytes = 4 << 20
    comm = 6 * 1e-5 + 1.5 * nbytes * 1e-9
    kernel = 1e-6 + max(2 * nbytes / 1e9, 1e8 / 1e8)          # 1e8 elementwise ops: 1 s
    work = {"k": KernelWork(vector=1e8)}
    hidden = predict(_program("k"), work, _machine(overlap=True))
    assert hidden.parts["comm_exposed"] == pytest.approx(0.0, abs=1e-12)
    assert hidden.parts["comm_hidden"] == pytest.approx(comm)
    assert hidden.parts["compute"] == pytest.approx(kernel)
    serial = predict(_program("k"), work, _machine(overlap=False))
    assert serial.parts["comm_exposed"] == pytest.approx(comm)
    assert serial.step_s == pytest.approx(hidden.step_s + comm)
    for p in (hidden, serial):      # the parts add up to the step
        assert sum(p.parts[k] for k in ("compute", "comm_exposed", "runtime", "call")) \
            == pytest.approx(p.step_s)
    # A short kernel leaves part of the collective exposed even with overlap.
    fast = dataclasses.replace(_machine(overlap=True), memory_bytes_per_s=1e12)
    short = predict(_program("s"), {"s": KernelWork(vector=1e2)}, fast)
    assert 0 < short.parts["comm_exposed"] < comm


def test_more_ranks_than_cores_take_turns():
    """4 ranks on 2 cores: a step lasts at least twice a rank's host work,
    the difference spent waiting in its collectives."""
    from tessera_compiler.cost import KernelWork
    work = {"k": KernelWork(vector=1e6)}                  # 10 ms of kernel
    alone = predict(_program("k"), work, _machine(overlap=False, ranks_per_node=4))
    shared = predict(_program("k"), work, dataclasses.replace(
        _machine(overlap=False, ranks_per_node=4), cores_per_node=2))
    host = sum(alone.parts[k] for k in ("compute", "runtime", "call"))
    assert shared.step_s == pytest.approx(2 * host)
    assert shared.parts["compute"] == alone.parts["compute"]
    assert shared.parts["comm_exposed"] == pytest.approx(2 * host - host)
    assert sum(shared.parts[k] for k in ("compute", "comm_exposed", "runtime", "call")) \
        == pytest.approx(shared.step_s)


def _two_stages(deadlock: bool = False) -> dict:
    """pp = 2: rank 0 runs kernel k (1 s), sends 1 MiB to rank 1 and
    receives 1 MiB back; rank 1 receives, runs k, sends back. With
    `deadlock`, rank 0 receives before it sends: each waits for the other."""
    on = lambda r: {"axis": "pp", "rank": r}                       # noqa: E731

    def move(op, rank, token, buffer):
        return [{"op": op, "result": token, "stream": "comm", "buffer": buffer,
                 "peer": 1 - rank, "axis": "pp", "on": on(rank)},
                {"op": "collective_wait", "token": token, "stream": "compute", "on": on(rank)}]
    k = [{"op": "launch", "kernel": "k", "stream": "compute", "args": ["%a", "%a"], "on": on(r)}
         for r in (0, 1)]
    first = k[:1] + move("send", 0, "%s0", "%a")
    then = move("recv", 0, "%r0", "%a")
    return {
        "inputs": [{"value": "%a", "local_shape": [1 << 18], "dtype": "float32"}],
        "streams": ["compute", "comm"],
        "mesh": {"axes": ["pp"], "shape": [2], "devices": [0, 1]},
        "instructions": (then + first if deadlock else first + then)
        + move("recv", 1, "%r1", "%a") + k[1:] + move("send", 1, "%s1", "%a")
        + [{"op": "return", "values": []}]}


def test_ranks_simulated_together_wait_for_their_peers():
    """Alone, a recv is taken to find its data sent; together, rank 1
    waits the 1 s rank 0 computes before sending, and rank 0 waits for
    rank 1's kernel: each rank's `waiting` part is the other's kernel, and
    the parts still add up to the step.
    Orders that cannot pair up (both ranks receive before they send) are an
    error, not a hang."""
    from tessera_compiler.cost import KernelWork
    work = {"k": KernelWork(vector=1e8)}                       # 1 s
    machine = _machine(overlap=False)
    transfer = 1e-5 + (1 << 20) * 1e-9
    alone = [predict(_two_stages(), work, machine, r) for r in (0, 1)]
    assert all(p.parts["waiting"] == 0.0 for p in alone)
    together = predict_ranks(_two_stages(), work, machine, [0, 1])
    assert [p.rank for p in together] == [0, 1]
    first, second = together
    assert second.parts["waiting"] == pytest.approx(1.0 + 1e-6, rel=1e-4)    # rank 0's k
    # (rank 0 sends while rank 1 receives: the first transfer costs both the same)
    assert first.parts["waiting"] == pytest.approx(1.0, rel=1e-4)
    assert first.parts["comm_exposed"] == pytest.approx(2 * transfer)
    # A send copies its data out in its start (the CPU's shared-memory slot):
    # only the recv's transfer and the peer's lateness are spent in waits.
    for p in together:
        assert p.waits_s == pytest.approx(p.parts["waiting"] + transfer)
    assert first.step_s == pytest.approx(alone[0].step_s + first.parts["waiting"])
    for p in together:
        assert sum(p.parts[k] for k in ("compute", "comm_exposed", "waiting", "runtime",
                                         "call")) == pytest.approx(p.step_s)
    assert {s[1] for s in second.slices if s[2] == "wait"} == {"waiting for peers"}
    with pytest.raises(ValueError, match="do not pair up"):
        predict_ranks(_two_stages(deadlock=True), work, machine, [0, 1])


def test_a_group_that_leaves_the_node_uses_the_inter_node_link():
    """dp x tp = 2 x 2 with 2 ranks per node: tp pairs (ranks 0,1) stay on a
    node, dp pairs (ranks 0,2) cross nodes and cost 10x here."""
    def one(axis):
        p = _program("none")
        p["mesh"] = {"axes": ["dp", "tp"], "shape": [2, 2], "devices": [0, 1, 2, 3]}
        p["instructions"][1]["axis"] = axis
        return predict(p, {}, _machine(overlap=False, ranks_per_node=2)).parts["comm_exposed"]
    tp, dp = one("tp"), one("dp")
    assert tp == pytest.approx(2 * 1e-5 + (4 << 20) * 1e-9)      # n = 2: 2 alpha + B beta
    assert dp == pytest.approx(10 * tp)


def test_kernel_work_counts_the_ops_of_a_fused_kernel():
    """Eight multiply-adds fused into one kernel over N elements: 16 N
    elementwise ops; softmax's exp is transcendental."""
    x = np.ones(4096, np.float32)

    def chain(x):
        for _ in range(8):
            x = x * 1.5 + 0.5
        return x
    (work,) = kernel_work(ts.graph.trace(chain, x).levels.module).values()
    assert work.vector == 16 * x.size and work.transcendental == 0
    soft = kernel_work(ts.graph.trace(lambda x: op.softmax(x), x.reshape(64, 64)).levels.module)
    assert sum(w.transcendental for w in soft.values()) >= x.size


def test_trace_cost_on_a_tensor_parallel_mlp_prices_its_matmuls_and_all_reduce():
    """`trace.cost(machine)`: each rank's matmuls cost 2 m n k at the GEMM
    rate (plus the kernel one runs as its epilogue), and the one all_reduce of the row-parallel output is on the step."""
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    rng = np.random.default_rng()
    x = rng.standard_normal((64, 128)).astype(np.float32)
    w1, w2 = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(2))
    X = dist.from_numpy(x, layout=dist.ShardSpec(partition=(), mesh_axes=()), mesh=mesh)
    W1 = dist.from_numpy(w1, layout=dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh=mesh)
    W2 = dist.from_numpy(w2, layout=dist.ShardSpec(partition=("row",), mesh_axes=("tp",)), mesh=mesh)
    machine = _machine(overlap=False)
    cost = ts.graph.trace(lambda x, a, b: op.matmul(op.relu(op.matmul(x, a)), b), X, W1, W2,
                          mesh=mesh).cost(machine)
    assert [p.rank for p in cost.ranks] == [0, 1]
    items = cost.ranks[0].items
    gemm = 1e-6 + 2 * 64 * 128 * 64 / 1e9
    matmuls = {"_then_" in what: s for _, what, _, s, _ in items if "[matmul]" in what}
    # The first GEMM runs the relu as its epilogue (tessera-fuse-gemm-epilogues):
    # its cost adds the kernel's (64 x 64 maxima at the vector rate), not its launch.
    assert matmuls == {False: pytest.approx(gemm), True: pytest.approx(gemm + 64 * 64 / 1e8)}
    (comm,) = [(what, s) for _, what, cat, s, _ in items if cat == "comm"]
    assert comm[0] == "tp all_reduce 32768 B"
    assert comm[1] == pytest.approx(2 * 1e-5 + 32768 * 1e-9)
    assert "tp all_reduce" in cost.table()
    h100 = ts.graph.trace(lambda x, a, b: op.matmul(op.relu(op.matmul(x, a)), b), X, W1, W2,
                          mesh=mesh).cost("h100-node")
    assert h100.machine is BUILTIN["h100-node"] and 0 < h100.step_s < cost.step_s


def test_cpu_calibration_is_measured_once_and_cached(tmp_path, monkeypatch):
    """machine("cpu") measures this host (in a separate process) the first
    time, writes it under the cache directory, and reads it afterwards."""
    from tessera import machine as machines
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    said = []
    described = machines.machine("cpu", ranks=1, progress=said.append)
    assert said and "calibrating" in said[0]
    path = machines.cache_path(1)
    assert path.exists() and path.is_relative_to(tmp_path)
    for rate in ("memory_bytes_per_s", "vector_ops_per_s", "transcendental_ops_per_s",
                 "copy_bytes_per_s"):
        assert math.isfinite(getattr(described, rate)) and getattr(described, rate) > 0
    assert described.gemm_rate("float32") > 1e9 and not described.overlap
    said.clear()
    again = machines.machine("cpu", ranks=1, progress=said.append)
    assert not said and again == described
    assert json.loads(path.read_text())["source"].startswith("measured by tessera calibrate")
    # `tessera calibrate` prints the cached description (and says it is cached).
    import subprocess
    import sys
    cli = subprocess.run([sys.executable, "-m", "tessera", "calibrate", "-n", "1"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert Machine.from_json(json.loads(cli.stdout)) == described
    assert f"cached: {path}" in cli.stderr


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_a_calibration_rank_runs_on_the_threads_a_launched_rank_gets(ranks, monkeypatch):
    """`tessera calibrate -n R` measures kernels and GEMMs in one process
    standing in for a rank of an R-rank job: the environment it gets
    (thread_limits, as `tessera launch` gives every rank) sets the kernels'
    team and the GEMMs' cut to what a launched rank works out from the
    job's size. (It did
    not: on 2 cores the calibration ran 2 threads where each of 4 ranks
    gets 1, and the model predicted half the measured step.)"""
    from tessera.machine import thread_limits
    from tessera_runtime.engines.cpu import default_threads, gemm_block_limit
    limits = thread_limits(ranks)
    for name in ("TESSERA_NUM_THREADS", "TESSERA_GEMM_BLOCKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", str(ranks))   # a launched rank
    launched = default_threads(), gemm_block_limit()
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE")
    for name in ("TESSERA_NUM_THREADS", "TESSERA_GEMM_BLOCKS"):
        monkeypatch.setenv(name, limits[name])
    assert (default_threads(), gemm_block_limit()) == launched
    assert limits["OPENBLAS_NUM_THREADS"] == limits["TESSERA_NUM_THREADS"]


def test_hierarchical_all_reduce_is_cheaper_across_h100_nodes():
    """Issue 29 item 4b at scale: a data-parallel step on dp = 64 (8 H100
    nodes of 8), traced in this one process. With ranks_per_node = 8 its
    gradient all-reduce runs inside each node, across the 8 nodes on 1/8 of
    the bytes, inside each node again; the cost model prices the three
    steps below the flat all-reduce over InfiniBand."""
    from tessera_passes.hierarchical_collectives import ranks_per_node_of_axis
    mesh = dist.Mesh(axes=["dp"], devices=range(64))
    rng = np.random.default_rng()
    x = dist.from_numpy(rng.standard_normal((256, 512)).astype(np.float32),
                        layout=dist.ShardSpec(partition=(0,), mesh_axes=("dp",)), mesh=mesh)
    w = rng.standard_normal((512, 512)).astype(np.float32)

    def grad(w, x):
        return ts.grad(lambda w: op.sum(op.tanh(op.matmul(x, w))), 0)(w)

    def comm(options):
        cost = ts.graph.trace(ts.compile(grad, mesh=mesh, target=options), w, x) \
            .cost("h100-node")
        return {what: s for _, what, cat, s, _ in cost.ranks[0].items if cat == "comm"}
    flat = comm(ts.TargetOptions(target="gpu", hierarchical_collectives=False))
    tiered = comm(ts.TargetOptions(target="gpu", ranks_per_node=8))
    assert list(flat) == ["dp all_reduce 1048576 B"]
    assert list(tiered) == ["dp:(8)8 reduce_scatter 1048576 B", "dp:(1)8 all_reduce 131072 B",
                            "dp:(8)8 all_gather 1048576 B"]
    assert sum(tiered.values()) < 0.5 * sum(flat.values())
    # Which axes split into nodes, and how many ranks of a group share a node.
    assert ranks_per_node_of_axis((64,), 0, 8) == 8
    assert ranks_per_node_of_axis((4, 2), 0, 4) == 2          # stride 2: 2 dp ranks a node
    assert ranks_per_node_of_axis((2, 2), 0, 2) == 1          # one dp rank a node
    assert ranks_per_node_of_axis((2, 2), 1, 2) == 2          # the whole tp group on a node
    assert ranks_per_node_of_axis((6,), 0, 4) == 0            # nodes cut groups unevenly
