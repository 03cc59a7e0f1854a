"""`tessera simulate` (issue 29 item 4): a training script's step predicted
for a mesh of any size in one process: placeholders instead of parameters,
one compilation of the SPMD program (no kernels), the cost model per rank
role, the pipeline bubble, the memory plan, a predicted Perfetto timeline."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tessera import simulation
from tessera.cli import main

REPO = Path(__file__).resolve().parents[2]


def _simulate(capsys, *args):
    """`tessera simulate ARGS` in this process (from the repository root):
    (exit status, stdout, stderr)."""
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        code = main(["simulate", *map(str, args)])
    except SystemExit as stop:
        code = stop.code
    finally:
        os.chdir(cwd)
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def test_the_example_gpt_on_a_pipelined_dp_tp_pp_mesh(tmp_path, capsys):
    """dp x tp x pp = 2 x 2 x 2 on H100 nodes: the pipelined gradients and
    the update are the step (2 functions, each compiled once), the stage
    ranks are 2 roles, the pipeline's bubble is reported, and the trace
    holds the chosen ranks' predicted streams."""
    trace = tmp_path / "sim.json"
    proc = _simulate(capsys, "--mesh", "dp=2,tp=2,pp=2", "--machine", "h100-node", "--trace", trace,
                     "--trace-ranks", "0,7", "examples/train_gpt.py", "--", "--width", 64,
                     "--depth", 2, "--microbatches", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "dp=2 x tp=2 x pp=2 (8 ranks) on h100-node" in out, out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]
            if line.split() and line.split()[0] in ("gradients", "update")}
    assert set(rows) == {"gradients", "update"}, out
    assert rows["gradients"][2] == "2" and rows["update"][2] == "1", out     # roles
    bubble = float(rows["gradients"][9].rstrip("%"))
    assert 0 < bubble < 100 and rows["update"][9] == "-", out
    # The stage ranks wait for each other; a function of no pipeline does not.
    assert float(rows["gradients"][7]) > 0 and float(rows["update"][7]) == 0, out
    assert "step: " in out and "ms predicted on rank" in out and "peak memory" in out, out
    assert "running examples/train_gpt.py --width 64 --depth 2 --microbatches 2 --dp 2 " \
        "--tp 2 --pp 2 as 8 ranks" in proc.stderr
    assert trace.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"      # its picture
    events = json.loads(trace.read_text())["traceEvents"]
    # The stage ranks are simulated together: each waits for the other.
    waits = [e for e in events if e["name"] == "waiting for peers"]
    assert {e["pid"] for e in waits} == {0, 7}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {p for p, _ in threads} == {0, 7} and (0, "host") in threads and (0, "comm") in threads
    slices = [e for e in events if e.get("ph") == "X" and e.get("cat") == "comm"]
    assert slices and all(e["args"]["schedule_op"].startswith("tsched.") for e in slices)
    assert {e["args"]["axis"] for e in slices} >= {"tp", "pp"}


def test_the_llama_example_with_ring_attention_over_dp_cp_tp(capsys):
    """The Llama example over dp x cp x tp with ring attention, its
    parameters placeholders (no checkpoint written): the report gives the
    communication by kind, the ring's shifts named, and on H100 nodes
    (collectives under compute) the shifts hidden behind the blocks."""
    proc = _simulate(capsys, "--mesh", "dp=2,cp=4,tp=2", "--machine", "h100-node",
                     "examples/train_llama.py", "--", "--width", 64, "--heads", 4, "--kv-heads", 2,
                     "--seq", 256, "--batch", 2, "--val-batches", 1, "--cp-attention", "ring")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "dp=2 x cp=4 x tp=2 (16 ranks) on h100-node" in out, out
    [kinds] = [line for line in out.splitlines() if line.startswith("communication, exposed")]
    ring = kinds.split("ring shift (ring attention) ")[1].split(",")[0]
    shown, hidden = (float(x) for x in ring.split(" / "))
    assert hidden > 0 and shown <= 0.1 * hidden, kinds
    assert "all_reduce" in kinds and "all_to_all" in kinds, kinds


def test_a_1024_rank_mesh_compiles_once_and_all_reduces_hierarchically(tmp_path, capsys):
    """dp = 1024 H100s, 8 a node: the step is compiled once for one rank
    role, and its gradient all-reduce spans 128 nodes, so it runs as a
    reduce-scatter inside each node ("dp:(128)8"), an all-reduce across
    nodes ("dp:(1)128") and an all-gather inside each node."""
    trace = tmp_path / "sim.json"
    proc = _simulate(capsys, "--mesh", "dp=1024", "--machine", "h100-node", "--trace", trace,
                     "--trace-ranks", "5", "examples/train_gpt.py", "--", "--width", 32,
                     "--depth", 1, "--heads", 2, "--batch", 1024, "--length", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dp=1024 (1024 ranks)" in proc.stdout, proc.stdout
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith("train_step"))
    assert row[2] == "1", proc.stdout                          # one role
    events = json.loads(trace.read_text())["traceEvents"]
    axes = [e["args"]["axis"] for e in events if e.get("cat") == "comm"]
    assert {"dp:(128)8", "dp:(1)128"} <= set(axes) and "dp" not in axes, axes


def test_errors_name_the_bad_argument(capsys):
    assert _simulate(capsys, "--mesh", "dp=0", "examples/train_gpt.py").returncode == 2
    bad = _simulate(capsys, "--mesh", "dp=2,dp=2", "examples/train_gpt.py")
    assert bad.returncode == 2 and "'dp=2' is not AXIS=SIZE" in bad.stderr
    assert "unknown machine 'tpu'" in _simulate(capsys, "--mesh", "dp=2", "--machine", "tpu",
                                                "examples/train_gpt.py").stderr
    assert "no such script: nope.py" in _simulate(capsys, "--mesh", "dp=2", "nope.py").stderr
    with pytest.raises(ValueError, match="e.g. dp=8,tp=8,pp=16"):
        simulation.parse_mesh("dp8")


def test_a_program_that_cannot_compile_is_a_one_line_error(tmp_path, capsys):
    """A Tessera error in the simulated script (here a pipeline asking to
    measure its microbatch count, which a simulation cannot) is reported
    with its source line, exit 1, no traceback."""
    script = tmp_path / "auto.py"
    script.write_text(
        "import numpy as np, tessera as ts\n"
        "from tessera import dist, op, graph, pipeline\n"
        "mesh = dist.Mesh(axes=['pp'], devices=range(2))\n"
        "@graph.stage('block')\n"
        "def block(w, x):\n"
        "    return op.tanh(op.matmul(x, w))\n"
        "@pipeline.run(mesh=mesh, axis='pp', microbatches='auto')\n"
        "def step(ws, x):\n"
        "    return ts.value_and_grad(lambda ws: op.mean(block(ws[1], block(ws[0], x))))(ws)\n"
        "w = np.ones((4, 4), np.float32)\n"
        "step([w, w], np.ones((8, 4), np.float32))\n")
    done = _simulate(capsys, "--mesh", "pp=2", "--machine", "h100-node", script)
    assert done.returncode == 1, done.stderr
    assert "PipelineError: step: microbatches='auto' is chosen by measuring" in done.stderr
    assert "tessera simulate runs nothing to measure: give a count" in done.stderr
    assert "auto.py:11]" in done.stderr and "Traceback" not in done.stderr


def test_placeholders_take_no_memory():
    big = simulation.placeholder((1 << 20, 1 << 20), np.float32)     # 4 TiB if it were real
    assert big.shape == (1 << 20, 1 << 20) and big.dtype == np.float32
    assert big.strides == (0, 0) and not big.flags.writeable
