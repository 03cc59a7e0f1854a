"""The design documents' remaining API forms (issue 60, item 7):

* `@schedule(pipeline=..., microbatches=..., overlap=..., comm_backend=...,
  epoch=...)` as the collectives guide's 3.4 writes it, on a function or a
  compiled step in either decorator order, each setting observable in the
  compiled program; `tessera.schedule`'s defaults (performance guide 7.7)
  unchanged;
* `dist.profile().start()` / `.stop()` beside `with dist.profile()`, and a
  profile that is never started saying so instead of doing nothing;
* `ts.grad` / `ts.value_and_grad` taking JAX's `argnums=` for `wrt=`."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import dist, graph, op, pipeline, schedule
from tessera.pipeline import PipelinedFunction
from tessera.profiling import ProfileError, ProfileWarning
from tessera.schedule import ScheduleError, ScheduleWarning

REPO = Path(__file__).resolve().parents[2]
HERE = re.escape(Path(__file__).name)


def _line_of(marker: str) -> int:
    """The line of this file holding `marker` (where a decorator stands)."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line and "_line_of" not in line)


# ---------------------------------------------------------------------------
# @schedule(...): the module is callable, its functions stay
# ---------------------------------------------------------------------------

def test_tessera_schedule_is_one_object_the_module_and_the_decorator():
    import tessera.schedule as module
    assert module is ts.schedule is schedule is sys.modules["tessera.schedule"]
    assert callable(schedule)
    before = (pipeline.defaults.microbatches, pipeline.defaults.all_reduce_overlap)
    try:
        schedule.pipeline_microbatches(6)
        schedule.all_reduce_overlap(False)
        assert (pipeline.defaults.microbatches, pipeline.defaults.all_reduce_overlap) == (6, False)
    finally:
        pipeline.defaults.microbatches, pipeline.defaults.all_reduce_overlap = before


def _mlp(x, w):
    return op.sum(op.tanh(op.matmul(x, w)))


def test_schedule_compiles_a_function_or_takes_a_compiled_one_in_either_order():
    rng = np.random.default_rng()
    x, w = rng.standard_normal((5, 4)), rng.standard_normal((4, 3))
    expected = np.tanh(x @ w).sum()

    @schedule(overlap=True, comm_backend="nccl")
    def bare(x, w):
        return _mlp(x, w)

    @schedule(overlap=True, comm_backend="nccl")
    @ts.jit
    def outside(x, w):
        return _mlp(x, w)

    @ts.jit
    @schedule(overlap=True, comm_backend="nccl")
    def inside(x, w):
        return _mlp(x, w)

    for step in (bare, outside, inside):
        assert isinstance(step, ts.CompiledFunction)
        assert step.schedule_settings.given() == {"overlap": True, "comm_backend": "nccl"}
        np.testing.assert_allclose(step(x, w), expected, rtol=1e-12)
    assert schedule(_mlp)(x, w) == pytest.approx(expected, rel=1e-12)   # `@schedule` bare


# ---------------------------------------------------------------------------
# pipeline= and microbatches=
# ---------------------------------------------------------------------------

@graph.stage("layer")
def _layer(w, x):
    return op.tanh(op.matmul(x, w))


def _two_stage_step(ws, x, y):
    def loss_fn(ws):
        return op.mean((_layer(ws[1], _layer(ws[0], x)) - y) ** 2)
    return ts.value_and_grad(loss_fn)(ws)


def _numpy_two_stage(ws, x, y):
    """(loss, [dloss/dw0, dloss/dw1]) in float64."""
    h1 = np.tanh(x @ ws[0])
    h2 = np.tanh(h1 @ ws[1])
    g2 = 2 * (h2 - y) / h2.size * (1 - h2 ** 2)
    g1 = (g2 @ ws[1].T) * (1 - h1 ** 2)
    return np.mean((h2 - y) ** 2), [x.T @ g1, h1.T @ g2]


def test_pipeline_true_makes_the_step_a_pipeline_with_its_microbatches_in_either_order():
    rng = np.random.default_rng()
    ws = [rng.standard_normal((4, 4)) * 0.5 for _ in range(2)]
    x, y = rng.standard_normal((8, 4)), rng.standard_normal((8, 4))
    loss_ref, grads_ref = _numpy_two_stage(ws, x, y)

    plain = schedule(pipeline=True, microbatches=4)(_two_stage_step)
    outside = schedule(pipeline=True, microbatches=4)(ts.jit(_two_stage_step))
    inside = ts.jit(schedule(pipeline=True, microbatches=4)(_two_stage_step))
    for step in (plain, outside, inside):
        assert isinstance(step, PipelinedFunction) and step.microbatches == 4
        loss, grads = step(ws, x, y)
        np.testing.assert_allclose(np.asarray(loss), loss_ref, rtol=1e-12)
        for g, r in zip(grads, grads_ref):
            np.testing.assert_allclose(np.asarray(g), r, rtol=1e-10, atol=1e-14)
        # The compiled schedule ran 4 microbatches (one pp rank here: its stages merge).
        assert step.pipeline_report().plan.microbatches == 4


def test_microbatches_auto_and_a_later_schedule_keep_the_earlier_settings():
    step = schedule(overlap=False)(schedule(pipeline=True, microbatches="auto")(_two_stage_step))
    assert step.auto_microbatches and step.microbatches is None and step.overlap is False
    assert step.schedule_settings.given() == {"pipeline": True, "microbatches": "auto",
                                              "overlap": False}


def _all_reduce_waits(levels) -> list[int]:
    """For each all_reduce of the Schedule IR: the kernel launches between
    its start and its first wait (0: waited where it starts)."""
    lines = levels.schedule.splitlines()
    out = []
    for i, line in enumerate(lines):
        started = re.search(r"(%\w+) = tsched.collective_start <all_reduce>", line)
        if started:
            token = started.group(1) + " "
            end = next(j for j in range(i + 1, len(lines))
                       if "collective_wait " + token in lines[j])
            out.append(sum("tsched.launch" in lines[k] for k in range(i + 1, end)))
    return out


def test_overlap_decides_whether_a_pipelined_steps_all_reduces_run_under_compute():
    """On pp x dp the gradients' all-reduces over dp either start early and
    are waited late, with kernels launched in between, or are waited where
    they start; the program's `tsched.pipeline` records the choice."""
    mesh = dist.Mesh(axes=["pp", "dp"], devices=range(4))
    rng = np.random.default_rng()
    ws = [dist.from_numpy(rng.standard_normal((4, 4)).astype(np.float32), mesh=mesh)
          for _ in range(2)]
    x, y = [dist.from_numpy(rng.standard_normal((16, 4)).astype(np.float32),
                            dist.ShardSpec((0,), ("dp",)), mesh) for _ in range(2)]
    waits = {}
    for overlap in (True, False):
        step = schedule(pipeline=True, microbatches=2, overlap=overlap)(
            ts.compile(_two_stage_step, mesh=mesh))
        levels = graph.trace(step, ws, x, y)
        waits[overlap] = _all_reduce_waits(levels)
        assert f"overlap = {str(overlap).lower()}" in levels.schedule
    assert len(waits[True]) == len(waits[False]) > 0
    assert all(n == 0 for n in waits[False]), waits
    assert any(n > 0 for n in waits[True]), waits


# ---------------------------------------------------------------------------
# comm_backend=
# ---------------------------------------------------------------------------

def _sequence_parallel_operands():
    """x split by rows times w split by columns over tp: x's rows are
    all-gathered before the GEMM, or inside it over NVSHMEM."""
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    rng = np.random.default_rng()
    x = dist.from_numpy(rng.standard_normal((32, 16)).astype(np.float32),
                        dist.ShardSpec(("row",), ("tp",)), mesh)
    w = dist.from_numpy(rng.standard_normal((16, 32)).astype(np.float32),
                        dist.ShardSpec(("col",), ("tp",)), mesh)
    return x, w


def test_comm_backend_nvshmem_fuses_the_gather_into_the_gemm_on_the_gpu_target():
    x, w = _sequence_parallel_operands()

    @schedule(comm_backend="nvshmem")
    def fused(x, w):
        return op.matmul(x, w)

    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)     # honoured: nothing to say
        levels = graph.trace(fused, x, w, target="gpu")
    assert "gather_matmul" in levels.schedule
    assert "collective_start <all_gather>" not in levels.schedule
    assert "[nvshmem: auto: its symmetric buffers (2,048 B) fit" in levels.report()
    unscheduled = graph.trace(lambda x, w: op.matmul(x, w), x, w, target="gpu")
    assert "collective_start <all_gather>" in unscheduled.schedule

    @schedule(comm_backend="nccl")
    def library(x, w):
        return op.matmul(x, w)
    levels = graph.trace(library, x, w, target="gpu")
    assert "collective_start <all_gather>" in levels.schedule
    assert "[nccl: asked for]" in levels.report()


def test_comm_backend_leaves_an_ops_own_transport_alone():
    x, w = _sequence_parallel_operands()

    @schedule(comm_backend="nvshmem")
    def explicit(x, w):
        return op.matmul(x, w, transport="nccl")
    with pytest.warns(ScheduleWarning, match=r"none of its 1 collectives can move over NVSHMEM: "
                                             r"all_gather over tp .*: nccl: asked for"):
        levels = graph.trace(explicit, x, w, target="gpu")
    assert "collective_start <all_gather>" in levels.schedule


def test_comm_backend_nvshmem_says_when_the_cpu_target_cannot_honour_it():
    x, w = _sequence_parallel_operands()

    @schedule(comm_backend="nvshmem")                       # nvshmem-cpu
    def step(x, w):
        return op.matmul(x, w)

    with pytest.warns(ScheduleWarning, match=rf"comm_backend='nvshmem'\) on step: the CPU target "
                                             rf"has no NVSHMEM kernels.*\[.*{HERE}:"
                                             rf"{_line_of('# nvshmem-cpu')}\]"):
        levels = graph.trace(step, x, w, target="cpu")
    assert "collective_start <all_gather>" in levels.schedule


def test_comm_backend_nvshmem_names_each_collective_it_cannot_move():
    """A data-parallel gradient's all-reduce has no NVSHMEM kernel: on the
    GPU target the warning names it and its line instead of staying quiet."""
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    rng = np.random.default_rng()
    w = dist.from_numpy(rng.standard_normal((4, 4)).astype(np.float32), mesh=mesh)
    x = dist.from_numpy(rng.standard_normal((8, 4)).astype(np.float32),
                        dist.ShardSpec((0,), ("dp",)), mesh)

    @schedule(comm_backend="nvshmem")
    def step(w, x):
        return ts.grad(op.mean(op.matmul(x, w)), w)

    with pytest.warns(ScheduleWarning, match=r"none of its 1 collectives can move over NVSHMEM: "
                                             rf"all_reduce over dp \(.*{HERE}:\d+\): no NVSHMEM "
                                             "kernel for it"):
        graph.trace(step, w, x, target="gpu")


def test_comm_backend_nvshmem_makes_an_moe_layers_exchanges_nvshmem_kernels():
    """op.moe naming no transport: the row exchanges become NVSHMEM
    exchange kernels on the GPU target (the count exchange stays a
    collective, as with op.moe(transport="nvshmem"))."""
    mesh = dist.Mesh(axes=["ep"], devices=range(2))
    rng = np.random.default_rng()
    x = dist.from_numpy(rng.standard_normal((16, 8)).astype(np.float32),
                        dist.ShardSpec((0,), ("ep",)), mesh)
    ex = {"router": rng.standard_normal((8, 4)).astype(np.float32),
          "w1": rng.standard_normal((4, 8, 12)).astype(np.float32),
          "w2": rng.standard_normal((4, 12, 8)).astype(np.float32)}

    def layer(x, ex):
        return op.moe(x, experts=ex, k=2, mesh=mesh)
    plain = graph.trace(layer, x, ex, mesh=mesh, target="gpu")
    assert "_exchange_" not in plain.schedule
    nvshmem = graph.trace(schedule(comm_backend="nvshmem")(ts.compile(layer, mesh=mesh)),
                          x, ex, target="gpu")
    assert nvshmem.schedule.count("collective_start <all_to_all>") == 1      # the counts
    assert "_exchange_" in nvshmem.schedule


# ---------------------------------------------------------------------------
# epoch= and the errors
# ---------------------------------------------------------------------------

def test_epoch_soft_is_accepted_and_hard_says_why_not():
    step = schedule(epoch="soft")(_mlp)
    assert step.schedule_settings.epoch == "soft"
    with pytest.raises(ValueError, match=rf"epoch='hard' is not supported; the one epoch is "
                                         rf"'soft'.*stream-ordered barrier.*\[.*{HERE}:\d+\]"):
        schedule(epoch="hard")


def test_an_unknown_setting_names_itself_the_known_ones_and_the_line():
    with pytest.raises(TypeError) as err:
        @schedule(pipeline=True, overlapp=True)               # misspelt
        def step(x):
            return x
    message = str(err.value)
    assert "unknown setting 'overlapp' (did you mean 'overlap'?)" in message
    assert "the settings are pipeline, microbatches, overlap, comm_backend, epoch" in message
    assert re.search(rf"\[.*{HERE}:{_line_of('# misspelt')}\]$", message), message


@pytest.mark.parametrize("settings, error, says", [
    ({"overlap": "yes"}, TypeError, r"overlap must be True or False, got 'yes' \(str\)"),
    ({"pipeline": 1}, TypeError, r"pipeline must be True or False, got 1 \(int\)"),
    ({"microbatches": 2.0}, TypeError, r"microbatches must be a count or 'auto', got 2.0"),
    ({"microbatches": True}, TypeError, r"microbatches must be a count or 'auto', got True"),
    ({"microbatches": 0}, ValueError, r"microbatches must be a positive count or 'auto', got 0"),
    ({"comm_backend": 3}, TypeError, r"comm_backend must be one of \['nccl', 'nvshmem'\], got 3"),
    ({"comm_backend": "mpi"}, ValueError,
     r"comm_backend must be one of \['nccl', 'nvshmem'\], got 'mpi'"),
    ({"epoch": None}, TypeError, r"epoch must be one of \['soft'\], got None"),
])
def test_a_wrong_value_names_the_setting_and_the_line(settings, error, says):
    with pytest.raises(error, match=rf"schedule\(\): {says}.*\[.*{HERE}:\d+\]"):
        schedule(**settings)


def test_settings_a_step_cannot_honour_are_errors_not_no_ops():
    with pytest.raises(ScheduleError, match=r"overlap=False\): _mlp is not a pipelined step, "
                                            r"and a plain step's collectives always overlap"):
        schedule(overlap=False)(_mlp)
    with pytest.raises(ScheduleError, match=r"microbatches=4\): _mlp is not a pipelined step; "
                                            r"add pipeline=True"):
        schedule(microbatches=4)(_mlp)
    piped = pipeline.run(_two_stage_step, microbatches=2)
    with pytest.raises(ScheduleError, match=r"pipeline=False\): _two_stage_step is a pipelined "
                                            r"step"):
        schedule(pipeline=False)(piped)
    with pytest.raises(TypeError, match=r"decorates a function or a compiled step, got int"):
        schedule(overlap=True)(3)


# ---------------------------------------------------------------------------
# dist.profile(): start / stop, and never silently nothing
# ---------------------------------------------------------------------------

def _tanh_step():
    f = ts.jit(lambda x: op.tanh(x) * 2.0)
    x = np.ones(64, np.float32)
    f(x)                                    # compiled outside the profiles
    return lambda: f(x)


def test_a_profile_runs_from_start_to_stop_as_a_with_block_does():
    run = _tanh_step()
    prof = dist.profile(None, show=False).start()
    run()
    run()
    assert prof.stop() is prof
    assert prof.ranks[0]["steps"] == 2 and "[tessera profile] 1 rank, 2 steps" in prof.table
    with dist.profile(None, show=False) as block:
        run()
    assert block.ranks[0]["steps"] == 1


def test_a_bare_profile_statement_profiles_until_stopped_and_one_never_started_says_so():
    """`dist.profile()` as a statement (the tutorial's wording) starts a
    profile that `dist.profile().stop()` (or the exit) ends; one made some
    other way and never started warns at the line that made it."""
    run = _tanh_step()
    dist.profile(None, show=False)          # a bare statement: profiles from here
    run()
    run()
    prof = dist.profile().stop()
    assert prof.ranks[0]["steps"] == 2 and "[tessera profile] 1 rank, 2 steps" in prof.table
    with pytest.warns(ProfileWarning, match=rf"dist.profile\(\) was never started, so it recorded "
                                            rf"nothing: use `with dist.profile\(\) as prof:`.*"
                                            rf"\[.*{HERE}:{_line_of('# made, never started')}\]"):
        made = dist.profile(None)           # made, never started
        del made
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        started = dist.profile(None, show=False).start()
        started.stop()
        del started                         # started: nothing to say


def test_starting_twice_or_stopping_what_is_not_running_is_an_error():
    prof = dist.profile(None, show=False)
    with pytest.raises(ProfileError, match=rf"was never started; start it with .start\(\).*"
                                           rf"\[.*{HERE}:\d+\]"):
        prof.stop()
    prof.start()
    with pytest.raises(ProfileError, match=r"was already started and is running"):
        prof.start()
    prof.stop()
    with pytest.raises(ProfileError, match=r"was already stopped; make a new dist.profile\(\)"):
        prof.stop()
    with pytest.raises(ProfileError, match=r"was already started and is stopped"):
        prof.start()


def test_a_profile_left_running_is_stopped_and_reported_at_exit():
    script = ("import numpy as np, tessera as ts\n"
              "from tessera import dist, op\n"
              "f = ts.jit(lambda x: op.tanh(x))\n"
              "f(np.ones(8, np.float32))\n"
              "prof = dist.profile(None).start()\n"
              "f(np.ones(8, np.float32))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dist.profile() started at <string>:5 was not stopped; stopping it at exit" \
        in proc.stderr
    assert "[tessera profile] 1 rank, 1 step" in proc.stdout


# ---------------------------------------------------------------------------
# ts.grad / ts.value_and_grad: argnums=
# ---------------------------------------------------------------------------

def _loss(a, b, c):
    return op.sum(op.tanh(op.matmul(a, b)) * c)


def _numpy_loss_and_grads(a, b, c):
    t = np.tanh(a @ b)
    d = (1 - t ** 2) * c
    return (t * c).sum(), (d @ b.T, a.T @ d, t)


@pytest.mark.parametrize("argnums", [0, 1, 2, (0, 2), (2, 1, 0), -1])
def test_argnums_is_wrt_under_jaxs_name(argnums):
    rng = np.random.default_rng()
    a, b, c = rng.standard_normal((3, 5)), rng.standard_normal((5, 4)), rng.standard_normal((3, 4))
    value, grads = _numpy_loss_and_grads(a, b, c)
    picked = grads[argnums] if isinstance(argnums, int) else tuple(grads[i] for i in argnums)

    by_argnums = ts.jit(lambda a, b, c: ts.grad(_loss, argnums=argnums)(a, b, c))(a, b, c)
    by_wrt = ts.jit(lambda a, b, c: ts.grad(_loss, wrt=argnums)(a, b, c))(a, b, c)
    loss, with_value = ts.jit(
        lambda a, b, c: ts.value_and_grad(_loss, argnums=argnums)(a, b, c))(a, b, c)
    np.testing.assert_allclose(loss, value, rtol=1e-13)
    for got in (by_argnums, by_wrt, with_value):
        assert isinstance(got, tuple) == isinstance(argnums, tuple)
        for g, r in zip(*((got, picked) if isinstance(argnums, tuple) else ((got,), (picked,)))):
            assert g.dtype == np.float64
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-14)


def test_argnums_and_wrt_together_or_wrong_are_errors_at_the_users_line():
    with pytest.raises(TypeError, match=rf"ts.grad: got both wrt=0 and argnums=1; they are the "
                                        rf"same setting.*\[.*{HERE}:\d+\]"):
        ts.grad(_loss, 0, argnums=1)
    with pytest.raises(TypeError, match=r"ts.value_and_grad: got both wrt=\(0,\) and argnums=0"):
        ts.value_and_grad(_loss, wrt=(0,), argnums=0)
    with pytest.raises(TypeError, match=r"argnums= must be an argument number or a non-empty "
                                        r"tuple of them, got 'a'"):
        ts.value_and_grad(_loss, argnums="a")
    with pytest.raises(TypeError, match=r"argnums= must be .* got \(\)"):
        ts.grad(_loss, argnums=())
    a = np.ones((2, 2))
    with pytest.raises(IndexError, match=rf"ts.grad: argument number 3 is out of range: _loss got "
                                         rf"3 positional arguments  \[.*{HERE}:\d+\]"):
        ts.jit(lambda a: ts.grad(_loss, argnums=3)(a, a, a))(a)
    with pytest.raises(TypeError, match=r"ts.grad: argnums= numbers the arguments of a function"):
        ts.jit(lambda a: ts.grad(op.sum(a), argnums=0))(a)
