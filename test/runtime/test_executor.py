"""ScheduleExecutor on hand-written single-rank bundles with real C++ kernels."""

import json

import numpy as np
import pytest

import tessera_runtime as rt
from runtime_bundle_util import compile_kernels, kernels_cpp, tensor, write_bundle
from tessera_runtime import BundleError, InputError, MeshError, ScheduleError


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """libkernels.so with matmul_4x8x3 (c = a @ b) and relu_12 (in place)."""
    src = kernels_cpp(matmuls=[(4, 8, 3)], relus=[12])
    return compile_kernels(src, tmp_path_factory.mktemp("kernels"))


@pytest.fixture(params=[True, False], ids=["straight-line", "loop"])
def executor_path(request, monkeypatch):
    """Both ways the executor runs a CPU program: the generated straight-line
    function (unprofiled runs) and the interpreting loop (profiled runs)."""
    from tessera_runtime.executor import ScheduleExecutor
    monkeypatch.setattr(ScheduleExecutor, "straight_line", request.param)
    return request.param


def base_program() -> dict:
    """relu(a @ b), then every collective once over a size-1 'tp' axis."""
    return {
        "mesh": {"name": "mesh", "axes": ["tp"], "shape": [1], "devices": [0]},
        "inputs": [tensor("a", "%arg0", [4, 8]), tensor("b", "%arg1", [8, 3])],
        "outputs": [tensor("y", "%1", [4, 3]), tensor("g", "%2", [4, 3]),
                    tensor("s", "%3", [4, 3])],
        "streams": ["compute", "comm"],
        "instructions": [
            {"op": "alloc", "result": "%0", "shape": [4, 3], "dtype": "float32"},
            {"op": "launch", "kernel": "matmul_4x8x3", "stream": "compute",
             "args": ["%arg0", "%arg1", "%0"]},
            {"op": "launch", "kernel": "relu_12", "stream": "compute", "args": ["%0"]},
            {"op": "event_record", "result": "%e0", "stream": "compute"},
            {"op": "event_wait", "event": "%e0", "stream": "comm"},
            {"op": "alloc", "result": "%1", "shape": [4, 3], "dtype": "float32"},
            {"op": "collective_start", "result": "%t0", "stream": "comm",
             "collective": "all_reduce", "axis": "tp", "reduction": "sum",
             "deterministic": False, "dim": 0, "src": "%0", "dst": "%1"},
            {"op": "collective_wait", "token": "%t0", "stream": "compute"},
            {"op": "collective_start", "result": "%t1", "stream": "comm",
             "collective": "all_reduce", "axis": "tp", "reduction": "max",
             "deterministic": True, "src": "%1", "dst": "%1"},
            {"op": "collective_wait", "token": "%t1", "stream": "compute"},
            {"op": "alloc", "result": "%2", "shape": [4, 3], "dtype": "float32"},
            {"op": "collective_start", "result": "%t2", "stream": "comm",
             "collective": "all_gather", "axis": "tp", "dim": 1, "src": "%1", "dst": "%2"},
            {"op": "alloc", "result": "%3", "shape": [4, 3], "dtype": "float32"},
            {"op": "collective_start", "result": "%t3", "stream": "comm",
             "collective": "reduce_scatter", "axis": "tp", "reduction": "sum",
             "deterministic": True, "dim": 0, "src": "%1", "dst": "%3"},
            {"op": "collective_wait", "token": "%t3", "stream": "compute"},
            {"op": "collective_wait", "token": "%t2", "stream": "compute"},
            {"op": "free", "buffer": "%0"},
            {"op": "return", "values": ["%1", "%2", "%3"]},
        ],
    }


def make(tmp_path, lib, program=None, name="p.tsb"):
    return write_bundle(tmp_path / name, program or base_program(), lib)


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((4, 8), dtype=np.float32),
            rng.standard_normal((8, 3), dtype=np.float32)]


def test_run_matches_numpy(tmp_path, lib, executor_path):
    prog = rt.load_bundle(make(tmp_path, lib))
    assert prog.rank == 0 and prog.rank_coords == (0,)
    assert [t.name for t in prog.inputs] == ["a", "b"]
    assert [t.local_shape for t in prog.outputs] == [(4, 3)] * 3
    for seed in range(3):   # fresh random inputs, fresh buffers every run
        a, b = inputs(seed)
        a0 = a.copy()
        outs = prog.run([a, b])
        expect = np.maximum(a @ b, 0)
        assert len(outs) == 3
        for o in outs:
            assert o.dtype == np.float32 and o.shape == (4, 3)
            np.testing.assert_allclose(o, expect, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(a, a0)


def relu_in_place() -> dict:
    """A program running relu in place on its *argument* buffer."""
    return {"mesh": {"name": "mesh", "axes": [], "shape": [], "devices": [0]},
            "inputs": [tensor("x", "%arg0", [3, 4])],
            "outputs": [tensor("x_relu", "%arg0", [3, 4])],
            "streams": ["compute"],
            "instructions": [
                {"op": "launch", "kernel": "relu_12", "stream": "compute", "args": ["%arg0"]},
                {"op": "return", "values": ["%arg0"]}]}


def test_inputs_are_not_modified(tmp_path, lib, executor_path):
    # relu in place on the *argument* buffer: the caller's array is untouched.
    prog = rt.load_bundle(make(tmp_path, lib, relu_in_place()))
    assert prog.rank_coords == ()
    x = np.random.default_rng(1).standard_normal((3, 4), dtype=np.float32)
    x0 = x.copy()
    (y,) = prog.run([x])
    np.testing.assert_array_equal(y, np.maximum(x0, 0))
    np.testing.assert_array_equal(x, x0)


def test_inputs_only_read_are_borrowed_and_unused_ones_left_alone(tmp_path, lib, executor_path, monkeypatch):
    """A launch that says which arguments it writes (`outs`) lets the
    executor read the caller's arrays in place (a training step's parameters
    need no copy each step) and skip inputs this rank never uses (another
    pipeline stage's). A borrowed input returned as a result comes back as a
    copy, as a copied one would."""
    program = {"mesh": {"name": "mesh", "axes": [], "shape": [], "devices": [0]},
               "inputs": [tensor("a", "%arg0", [4, 8]), tensor("b", "%arg1", [8, 3]),
                          tensor("unused", "%arg2", [5])],
               "outputs": [tensor("y", "%0", [4, 3]), tensor("b_out", "%arg1", [8, 3])],
               "streams": ["compute"],
               "instructions": [
                   {"op": "alloc", "result": "%0", "shape": [4, 3], "dtype": "float32"},
                   {"op": "launch", "kernel": "matmul_4x8x3", "stream": "compute",
                    "args": ["%arg0", "%arg1", "%0"], "outs": 1},
                   {"op": "return", "values": ["%0", "%arg1"]}]}
    prog = rt.load_bundle(make(tmp_path, lib, program))
    copied = []
    engine = prog.engine
    from_host = engine.from_host
    monkeypatch.setattr(engine, "from_host", lambda arr: copied.append(arr) or from_host(arr))
    a, b = inputs(7)
    a0, b0 = a.copy(), b.copy()
    unused = np.zeros(10, np.float32)[::2]           # not even a buffer: never touched
    y, b_out = prog.run([a, b, unused])
    np.testing.assert_allclose(y, a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(b_out, b0)
    assert not np.shares_memory(b_out, b)            # the returned input: a copy
    assert len(copied) == 1 and copied[0] is b       # ... the only copy made
    assert prog.memory["borrowed_bytes"] == a.nbytes + b.nbytes
    np.testing.assert_array_equal(a, a0)
    # Without `outs`, every argument of a launch may be written: all copied.
    del program["instructions"][1]["outs"]
    prog = rt.load_bundle(make(tmp_path, lib, program, name="q.tsb"))
    copied.clear()
    monkeypatch.setattr(prog.engine, "from_host",
                        lambda arr: copied.append(arr) or from_host(arr))
    prog.run([a, b, unused])
    assert [id(c) for c in copied] == [id(a), id(b)]


def test_contiguous_slices_are_views_and_the_rest_are_copied(tmp_path, lib, executor_path):
    """A slice that is one contiguous block of its buffer (rows of a matrix,
    a piece of a flat bucket) is a view of it, allocated nowhere; a column
    block is copied; a view of a borrowed input returned as a result comes
    back as a copy of the caller's data."""
    program = {"mesh": {"name": "mesh", "axes": [], "shape": [], "devices": [0]},
               "inputs": [tensor("a", "%arg0", [4, 8]), tensor("b", "%arg1", [8, 3])],
               "outputs": [tensor("top", "%1", [2, 3]), tensor("bottom", "%2", [2, 3]),
                           tensor("col", "%3", [4, 1]), tensor("a_rows", "%4", [1, 8])],
               "streams": ["compute"],
               "instructions": [
                   {"op": "alloc", "result": "%0", "shape": [4, 3], "dtype": "float32"},
                   {"op": "launch", "kernel": "matmul_4x8x3", "stream": "compute",
                    "args": ["%arg0", "%arg1", "%0"], "outs": 1},
                   {"op": "alloc", "result": "%1", "shape": [2, 3], "dtype": "float32"},
                   {"op": "launch", "kernel": "s0", "library": "slice", "stream": "compute",
                    "attrs": {"offsets": [0, 0]}, "args": ["%0", "%1"], "outs": 1},
                   {"op": "alloc", "result": "%2", "shape": [2, 3], "dtype": "float32"},
                   {"op": "launch", "kernel": "s1", "library": "slice", "stream": "compute",
                    "attrs": {"offsets": [2, 0]}, "args": ["%0", "%2"], "outs": 1},
                   {"op": "alloc", "result": "%3", "shape": [4, 1], "dtype": "float32"},
                   {"op": "launch", "kernel": "s2", "library": "slice", "stream": "compute",
                    "attrs": {"offsets": [0, 2]}, "args": ["%0", "%3"], "outs": 1},
                   {"op": "alloc", "result": "%4", "shape": [1, 8], "dtype": "float32"},
                   {"op": "launch", "kernel": "s3", "library": "slice", "stream": "compute",
                    "attrs": {"offsets": [3, 0]}, "args": ["%arg0", "%4"], "outs": 1},
                   {"op": "return", "values": ["%1", "%2", "%3", "%4"]}]}
    prog = rt.load_bundle(make(tmp_path, lib, program))
    a, b = inputs(11)
    top, bottom, col, a_rows = prog.run([a, b])
    y = a @ b
    for got, want in ((top, y[:2]), (bottom, y[2:]), (col, y[:, 2:3]), (a_rows, a[3:])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert top.base is not None and top.base is bottom.base        # views of one buffer
    assert not np.shares_memory(top, bottom)
    assert not np.shares_memory(col, top) and not np.shares_memory(col, bottom)
    assert not np.shares_memory(a_rows, a)                         # the caller's: a copy
    # The row slices (of %0, and of the input) allocate nothing: the peak is
    # the inputs, %0 and the column.
    assert prog.memory["peak_bytes"] == (32 + 24 + 12 + 4) * 4


def test_a_slice_of_an_input_written_in_place_is_a_copy(tmp_path, lib, executor_path):
    """Rows sliced from an input that a later launch rewrites in place (a
    donated buffer) are copied when sliced, not a view that would see the
    rewrite."""
    program = {"mesh": {"name": "mesh", "axes": [], "shape": [], "devices": [0]},
               "inputs": [tensor("x", "%arg0", [3, 4])],
               "outputs": [tensor("first_row", "%0", [1, 4]), tensor("x_relu", "%arg0", [3, 4])],
               "streams": ["compute"],
               "instructions": [
                   {"op": "alloc", "result": "%0", "shape": [1, 4], "dtype": "float32"},
                   {"op": "launch", "kernel": "s0", "library": "slice", "stream": "compute",
                    "attrs": {"offsets": [0, 0]}, "args": ["%arg0", "%0"], "outs": 1},
                   {"op": "launch", "kernel": "relu_12", "stream": "compute", "args": ["%arg0"],
                    "outs": 1},
                   {"op": "return", "values": ["%0", "%arg0"]}]}
    prog = rt.load_bundle(make(tmp_path, lib, program))
    x = -np.abs(np.random.default_rng().standard_normal((3, 4), dtype=np.float32))
    first_row, relu = prog.run([x.copy()], donate=True)
    np.testing.assert_array_equal(first_row, x[:1])               # before the relu
    np.testing.assert_array_equal(relu, np.zeros((3, 4), np.float32))


def test_non_contiguous_input_is_accepted(tmp_path, lib):
    prog = rt.load_bundle(make(tmp_path, lib))
    a, b = inputs(5)
    bt = np.asfortranarray(b)
    out = prog.run([a, bt])
    np.testing.assert_allclose(out[0], np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)


def test_shard_inputs_single_rank(tmp_path, lib):
    prog = rt.load_bundle(make(tmp_path, lib))
    a, b = inputs()
    sa, sb = prog.shard_inputs([a, b])
    np.testing.assert_array_equal(sa, a)
    np.testing.assert_array_equal(sb, b)


# ---------------------------------------------------------------- input errors

def test_wrong_input_shape_names_the_input(tmp_path, lib):
    prog = rt.load_bundle(make(tmp_path, lib))
    a, _ = inputs()
    with pytest.raises(InputError, match=r"input 'b': expected local shape \[8, 3\], got \[8, 4\]"):
        prog.run([a, np.zeros((8, 4), np.float32)])


def test_wrong_input_dtype_names_the_input(tmp_path, lib):
    prog = rt.load_bundle(make(tmp_path, lib))
    a, b = inputs()
    with pytest.raises(InputError, match="input 'a': expected dtype float32, got float64"):
        prog.run([a.astype(np.float64), b])


def test_wrong_input_count(tmp_path, lib):
    prog = rt.load_bundle(make(tmp_path, lib))
    with pytest.raises(InputError, match=r"expected 2 inputs \(a, b\), got 1"):
        prog.run([inputs()[0]])
    with pytest.raises(InputError, match="input 'a': expected an array"):
        prog.run([[1.0], inputs()[1]])


# -------------------------------------------------------------- kernel errors

def test_missing_kernel_names_kernel_and_library(tmp_path, lib):
    p = base_program()
    p["instructions"][2]["kernel"] = "gelu_12"
    with pytest.raises(ScheduleError) as ei:
        rt.load_bundle(make(tmp_path, lib, p))
    msg = str(ei.value)
    assert "kernel 'gelu_12' not found" in msg
    assert str(tmp_path / "p.tsb" / "kernels" / "libkernels.so") in msg
    assert "instructions[2]" in msg


def test_missing_kernel_library(tmp_path, lib):
    root = make(tmp_path, lib)
    (root / "kernels" / "libkernels.so").unlink()
    with pytest.raises(BundleError, match="kernels.cpu.*kernel library not found"):
        rt.load_bundle(root)
    root2 = write_bundle(tmp_path / "nolib.tsb", base_program(), None)
    with pytest.raises(BundleError, match=r"manifest.json: field 'kernels.cpu': missing"):
        rt.load_bundle(root2)


# ------------------------------------------------------ manifest/program errors

def test_missing_bundle_and_manifest(tmp_path, lib):
    with pytest.raises(BundleError, match="bundle directory not found"):
        rt.load_bundle(tmp_path / "nope.tsb")
    root = make(tmp_path, lib)
    (root / "manifest.json").unlink()
    with pytest.raises(BundleError, match=r"bundle manifest not found: .*manifest.json"):
        rt.load_bundle(root)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.pop("entry"), r"manifest.json: field 'entry': missing"),
    (lambda m: m.update(format="onnx"), r"manifest.json: field 'format': expected 'tessera-bundle'"),
    (lambda m: m.update(version=2), r"manifest.json: field 'version': unsupported version 2"),
    (lambda m: m.update(program=3), r"manifest.json: field 'program': expected str"),
    (lambda m: m.update(program="missing.json"), r"bundle program not found: .*missing.json"),
])
def test_bad_manifest(tmp_path, lib, edit, match):
    root = make(tmp_path, lib)
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match=match):
        rt.load_bundle(root)


def test_invalid_json(tmp_path, lib):
    root = make(tmp_path, lib)
    (root / "program.json").write_text("{not json")
    with pytest.raises(BundleError, match=r"program.json: invalid JSON"):
        rt.load_bundle(root)


def _edit(fn):
    p = base_program()
    fn(p)
    return p


@pytest.mark.parametrize("edit, match", [
    (lambda p: p.pop("instructions"), r"program.json: field 'instructions': missing"),
    (lambda p: p["instructions"][1].pop("kernel"), r"field 'instructions\[1\].kernel': missing"),
    (lambda p: p["instructions"][0].update(dtype="float33"), r"'instructions\[0\].dtype': unknown dtype"),
    (lambda p: p["instructions"][0].update(op="malloc"), r"'instructions\[0\].op': unknown op 'malloc'"),
    (lambda p: p["instructions"][6].update(reduction="mean"), r"'instructions\[6\].reduction': unknown reduction"),
    (lambda p: p["instructions"][11].pop("dim"), r"'instructions\[11\].dim': missing"),
    (lambda p: p["inputs"][1].pop("local_shape"), r"'inputs\[1\].local_shape': missing"),
    (lambda p: p["inputs"][0].update(local_shape=[2, 8]), r"'inputs\[0\].local_shape': \[2, 8\] does not match"),
    (lambda p: p["inputs"][0]["sharding"].update(dims=[["dp"], []]), r"'inputs\[0\].sharding': axis 'dp' is not a mesh axis"),
    (lambda p: p["mesh"].update(shape=[2]), r"field 'mesh': mesh 'mesh': shape \[2\] needs 2 devices"),
])
def test_bad_program_fields(tmp_path, lib, edit, match):
    with pytest.raises(BundleError, match=match):
        rt.load_bundle(make(tmp_path, lib, _edit(edit)))


# ------------------------------------------------------- schedule verification

def _insert(p, index, *instrs):
    p["instructions"][index:index] = list(instrs)


@pytest.mark.parametrize("edit, match", [
    # use of an undefined value
    (lambda p: p["instructions"][1]["args"].__setitem__(1, "%9"), r"instructions\[1\] \(launch matmul_4x8x3\): arg '%9' is not defined"),
    # a launch reads a collective's dst before collective_wait
    (lambda p: _insert(p, 7, {"op": "launch", "kernel": "relu_12", "stream": "compute", "args": ["%1"]}),
     r"reads '%1', the dst of collective '%t0', before its collective_wait"),
    # returning a dst that was never waited / a collective never waited
    (lambda p: p["instructions"].pop(14), r"returns '%3', the dst of collective '%t3', before its collective_wait"),
    (lambda p: _insert(p, 16,
                       {"op": "alloc", "result": "%9", "shape": [4, 3], "dtype": "float32"},
                       {"op": "collective_start", "result": "%t9", "stream": "comm",
                        "collective": "all_reduce", "axis": "tp", "reduction": "sum",
                        "src": "%1", "dst": "%9"}),
     r"return with collectives never waited: '%t9' \(started at instructions\[17\]"),
    # waiting twice, waiting an event
    (lambda p: _insert(p, 8, {"op": "collective_wait", "token": "%t0", "stream": "compute"}),
     r"token '%t0' was already waited on stream 'compute'"),
    (lambda p: p["instructions"][7].update(token="%e0"), r"token '%e0' is an event, expected a token"),
    # use after free, free of an in-flight buffer, double definition
    (lambda p: _insert(p, 2, {"op": "free", "buffer": "%0"}), r"arg '%0' is used after its free at instructions\[2\]"),
    (lambda p: _insert(p, 7, {"op": "free", "buffer": "%0"}), r"frees '%0', the src of collective '%t0'"),
    (lambda p: p["instructions"][5].update(result="%0"), r"'%0' is defined twice"),
    # collective shapes / axes / streams
    (lambda p: p["instructions"][10].update(shape=[4, 6]), r"all_gather over axis 'tp' \(size 1, dim 1\): src '%1' is \[4, 3\] so dst '%2' must be \[4, 3\], got \[4, 6\]"),
    (lambda p: p["instructions"][6].update(axis="dp"), r"axis 'dp' is not a mesh axis"),
    (lambda p: p["instructions"][1].update(stream="copy"), r"unknown stream 'copy'"),
    # return / outputs consistency
    (lambda p: p["instructions"][-1].update(values=["%1", "%2"]), r"returns 2 values but the program declares 3 outputs"),
    (lambda p: p["instructions"][-1].update(values=["%1", "%3", "%2"]), r"returns '%3' where output 'g' declares value '%2'"),
    (lambda p: p["outputs"][0].update(dtype="float64"), r"output 'y' \('%1'\) is \[4, 3\] float32, declared \[4, 3\] float64"),
    (lambda p: p["instructions"].pop(), r"no 'return' instruction"),
    (lambda p: p["instructions"].append({"op": "free", "buffer": "%1"}), r"instruction after return"),
])
def test_schedule_verification(tmp_path, lib, edit, match):
    p = base_program()
    edit(p)
    with pytest.raises(ScheduleError, match=match):
        rt.load_bundle(make(tmp_path, lib, p))


def test_a_token_may_be_waited_once_per_stream(tmp_path, lib):
    """Both streams read a collective's result: each waits for it once."""
    program = base_program()
    waits = [i for i, ins in enumerate(program["instructions"])
             if ins["op"] == "collective_wait" and ins["token"] == "%t0"]
    program["instructions"].insert(waits[0] + 1, {"op": "collective_wait", "token": "%t0", "stream": "comm"})
    prog = rt.load_bundle(make(tmp_path, lib, program))
    a, b = inputs(7)
    np.testing.assert_allclose(prog.run([a, b])[0], np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)


def test_multi_device_mesh_without_mpi(tmp_path, lib):
    p = base_program()
    p["mesh"] = {"name": "mesh", "axes": ["tp"], "shape": [2], "devices": [0, 1]}
    with pytest.raises(MeshError, match=r"has 2 devices.*mpiexec -n 2"):
        rt.load_bundle(make(tmp_path, lib, p), use_mpi=False)


def test_custom_communicators(tmp_path, lib):
    """The executor only needs the Communicator interface (what NCCL will implement)."""
    calls = []

    class Recording(rt.SelfCommunicator):
        def _all_reduce(self, src, dst, reduction, deterministic, stream):
            calls.append(("all_reduce", reduction, deterministic, stream))
            return super()._all_reduce(src, dst, reduction, deterministic, stream)

    prog = rt.load_bundle(make(tmp_path, lib), communicators={"tp": Recording()}, rank=0)
    prog.run(inputs())
    assert calls == [("all_reduce", "sum", False, "comm"), ("all_reduce", "max", True, "comm")]


def test_world_from_env(monkeypatch):
    for var in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    assert rt.world() == (0, 1)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert rt.world() == (3, 4)
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "2")
    assert rt.world() == (1, 2)


# ------------------------------------------------ engine / communicator units

def test_cpu_engine(lib, tmp_path):
    from tessera_runtime.engines import EngineError
    from tessera_runtime.engines.cpu import CPUEngine
    eng = CPUEngine()
    with pytest.raises(EngineError, match="kernel library not found: .*nope.so"):
        eng.load_kernels(tmp_path / "nope.so")
    eng.load_kernels(lib)
    assert eng.has_kernel("relu_12") and not eng.has_kernel("relu_13")
    x = eng.alloc((3, 4), "float32")
    x[...] = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    eng.launch("relu_12", [x], eng.stream("compute"))
    np.testing.assert_array_equal(x, np.maximum(np.arange(-6, 6).reshape(3, 4), 0))
    with pytest.raises(EngineError, match="arg 0: expected a C-contiguous numpy array"):
        eng.launch("relu_12", [np.zeros((4, 6), np.float32)[:, :3]])
    with pytest.raises(EngineError, match=r"kernel 'gelu' not found in kernel library .*libkernels.so"):
        eng.launch("gelu", [x])
    ev = eng.record_event("compute")
    eng.wait_event(ev, "comm")             # completed at record: a validated no-op
    with pytest.raises(EngineError, match="is not a CPU event"):
        eng.wait_event("%e0", "comm")


def test_self_communicator_validates_shapes():
    from tessera_runtime.comm import CommError
    c = rt.SelfCommunicator()
    a = np.ones((2, 3), np.float32)
    with pytest.raises(CommError, match="src shape"):
        c.all_reduce(a, np.empty((3, 2), np.float32))
    with pytest.raises(CommError, match="dtype"):
        c.all_gather(a, np.empty((2, 3), np.float64), dim=0)
    with pytest.raises(CommError, match="dim 2 out of range"):
        c.reduce_scatter(a, np.empty((2, 3), np.float32), dim=2)
    with pytest.raises(CommError, match="unknown reduction"):
        c.all_reduce(a, a, "mean")
    out = np.empty((2, 3), np.float32)
    c.all_gather(a, out, dim=1).wait()
    np.testing.assert_array_equal(out, a)


def test_device_outputs_are_the_engine_s_buffers_and_feed_back(tmp_path, lib):
    """run(device_outputs=True) hands back the engine's buffers (on the cuda
    engine, device arrays: a training loop's state need not cross the bus);
    they go back in as inputs, and the program still writes copies of them."""
    prog = rt.load_bundle(make(tmp_path, lib, relu_in_place()))
    x = np.random.default_rng().standard_normal((3, 4), dtype=np.float32)
    (y,) = prog.run([x], device_outputs=True)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    y0 = np.array(y, copy=True)
    (z,) = prog.run([y], device_outputs=True)
    np.testing.assert_array_equal(z, y0)
    np.testing.assert_array_equal(y, y0)            # the fed-back buffer is untouched


def test_a_donated_input_is_the_program_s_buffer(tmp_path, lib, executor_path):
    """run(donate=True) uses an input that is already the engine's buffer
    without copying it (the program writes it in place, as a training loop
    feeding its state back wants); one that is not (a strided view) is
    still copied, and the caller's array is untouched."""
    prog = rt.load_bundle(make(tmp_path, lib, relu_in_place()))
    x = np.random.default_rng().standard_normal((3, 4), dtype=np.float32)
    x0 = x.copy()
    (y,) = prog.run([x], donate=True)
    assert np.shares_memory(y, x)
    np.testing.assert_array_equal(x, np.maximum(x0, 0))
    wide = np.random.default_rng().standard_normal((3, 8), dtype=np.float32)
    wide0 = wide.copy()
    (z,) = prog.run([wide[:, ::2]], donate=True)
    np.testing.assert_array_equal(z, np.maximum(wide0[:, ::2], 0))
    np.testing.assert_array_equal(wide, wide0)


_BLAS_PROBE = """
import os, time
import numpy as np
from tessera_runtime.engines import cpu
engine = cpu.CPUEngine()
lib = cpu._openblas()
untouched = lib.openblas_thread_timeout()
engine.prepare_library("matmul", {}, nbytes=cpu.QUIET_BLAS_MIN_BYTES - 1)   # small GEMMs
assert lib.openblas_thread_timeout() == untouched
engine.prepare_library("matmul", {}, nbytes=cpu.QUIET_BLAS_MIN_BYTES)       # a large one
a = np.ones((512, 512), np.float32)
a @ a                                      # wakes OpenBLAS's workers
cpu_before, t0 = time.process_time(), time.perf_counter()
while time.perf_counter() - t0 < 0.2:      # the main thread busy: 0.2 s of CPU
    pass
spun = time.process_time() - cpu_before - (time.perf_counter() - t0)
print(lib.openblas_thread_timeout(), os.environ.get("OPENBLAS_THREAD_TIMEOUT"), f"{spun:.3f}")
"""


def test_the_cpu_engine_makes_openblas_idle_workers_sleep():
    """numpy's OpenBLAS workers spin ~0.1 s after each call by default,
    taking a core from the kernels that follow a GEMM: once the CPU engine
    prepares a large GEMM (QUIET_BLAS_MIN_BYTES) it has them sleep after
    2**4 cycles (TESSERA_BLAS_THREAD_TIMEOUT), unless the user set
    OpenBLAS's own OPENBLAS_THREAD_TIMEOUT or turned it off."""
    import os
    import subprocess
    import sys
    from tessera_runtime.engines.cpu import _openblas
    if _openblas() is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS with thread-timeout entry points")
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OPENBLAS_THREAD_TIMEOUT", "TESSERA_BLAS_THREAD_TIMEOUT",
                          "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}

    def probe(**env):
        out = subprocess.run([sys.executable, "-c", _BLAS_PROBE], env={**clean, **env},
                             capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]), out[1], float(out[2])
    timeout, exported, spun = probe()
    assert (timeout, exported) == (4, "4")
    # Only the main thread's 0.2 s of CPU: no worker spinning beside it
    # (OpenBLAS's default spins ~0.1 s; more than one core needed to see it).
    if len(os.sched_getaffinity(0)) > 1:
        assert spun < 0.05, spun
    assert probe(OPENBLAS_THREAD_TIMEOUT="10")[:2] == (10, "10")       # the user's
    assert probe(TESSERA_BLAS_THREAD_TIMEOUT="0")[:2] == (0, "None")   # left as it is


def test_kernel_threads_default_to_this_rank_s_share_of_the_cores(monkeypatch):
    """TESSERA_NUM_THREADS wins; else the usable cores divided among the
    job's ranks on this machine (never below one)."""
    import os
    from tessera_runtime.engines import EngineError
    from tessera_runtime.engines.cpu import default_threads
    for var in ("TESSERA_NUM_THREADS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                "PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)
    cores = len(os.sched_getaffinity(0))
    assert default_threads() == cores
    monkeypatch.setenv("MPI_LOCALNRANKS", str(2 * cores))
    assert default_threads() == 1
    monkeypatch.setenv("MPI_LOCALNRANKS", "1")
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", str(4 * cores))        # other ranks on other machines
    assert default_threads() == cores
    monkeypatch.setenv("TESSERA_NUM_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("TESSERA_NUM_THREADS", "many")
    with pytest.raises(EngineError, match="TESSERA_NUM_THREADS must be a number, got 'many'"):
        default_threads()


def chain_program() -> dict:
    """relu(a @ b) copied through two intermediates (size-1 all_reduces):
    %0 and %1 live and die within the run, %2 is returned."""
    alloc = lambda v: {"op": "alloc", "result": v, "shape": [4, 3], "dtype": "float32"}  # noqa: E731
    copy = lambda t, src, dst: {"op": "collective_start", "result": t, "stream": "compute",  # noqa: E731
                                "collective": "all_reduce", "axis": "tp", "reduction": "sum",
                                "deterministic": True, "src": src, "dst": dst}
    wait = lambda t: {"op": "collective_wait", "token": t, "stream": "compute"}  # noqa: E731
    return {
        "mesh": {"name": "mesh", "axes": ["tp"], "shape": [1], "devices": [0]},
        "inputs": [tensor("a", "%arg0", [4, 8]), tensor("b", "%arg1", [8, 3])],
        "outputs": [tensor("y", "%2", [4, 3])],
        "streams": ["compute"],
        "instructions": [
            alloc("%0"),
            {"op": "launch", "kernel": "matmul_4x8x3", "stream": "compute",
             "args": ["%arg0", "%arg1", "%0"]},
            {"op": "launch", "kernel": "relu_12", "stream": "compute", "args": ["%0"]},
            alloc("%1"), copy("%t0", "%0", "%1"), wait("%t0"), {"op": "free", "buffer": "%0"},
            alloc("%2"), copy("%t1", "%1", "%2"), wait("%t1"), {"op": "free", "buffer": "%1"},
            {"op": "return", "values": ["%2"]}]}


def test_each_run_s_results_are_fresh_and_its_memory_is_the_schedule_s(tmp_path, lib):
    """Launches get each buffer's address, taken when the buffer is made (a
    view has its buffer's): the results are right on every run, each run's
    results are new arrays that the next run leaves alone, and the bytes
    the run held follow the schedule's allocs and frees."""
    prog = rt.load_bundle(make(tmp_path, lib, chain_program()))
    (first,) = prog.run(inputs(0))
    kept = first.copy()
    for seed in (1, 2):
        a, b = inputs(seed)
        (y,) = prog.run([a, b])
        np.testing.assert_allclose(y, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)
        assert not np.shares_memory(y, first)
    np.testing.assert_array_equal(first, kept)
    assert prog.memory == {"peak_bytes": (32 + 24 + 2 * 12) * 4, "end_bytes": (32 + 24 + 12) * 4,
                           "borrowed_bytes": 0,      # (no `outs`: every input copied)
                           "arena_bytes": 2 * 64}    # %0 and %1 (padded), made once


def test_the_straight_line_run_keeps_its_buffers_in_an_arena_one_per_run_in_progress(tmp_path,
                                                                                     lib):
    """Unprofiled CPU runs take their intermediates from an arena made once:
    a buffer allocated after another's free reuses its bytes (64-byte
    aligned), a returned buffer stays out of it (each run's result is
    new), every run is right; a run while the arena is taken (another
    thread's) gets a second one."""
    program = chain_program()
    steps = program["instructions"]
    # %1 -> %3 -> %2: %3 is allocated after %0's free, so it may take %0's bytes.
    steps[steps.index({"op": "alloc", "result": "%2", "shape": [4, 3], "dtype": "float32"}):-1] = [
        {"op": "alloc", "result": "%3", "shape": [4, 3], "dtype": "float32"},
        {"op": "collective_start", "result": "%t1", "stream": "compute",
         "collective": "all_reduce", "axis": "tp", "reduction": "sum",
         "deterministic": True, "src": "%1", "dst": "%3"},
        {"op": "collective_wait", "token": "%t1", "stream": "compute"},
        {"op": "free", "buffer": "%1"},
        {"op": "alloc", "result": "%2", "shape": [4, 3], "dtype": "float32"},
        {"op": "collective_start", "result": "%t2", "stream": "compute",
         "collective": "all_reduce", "axis": "tp", "reduction": "sum",
         "deterministic": True, "src": "%3", "dst": "%2"},
        {"op": "collective_wait", "token": "%t2", "stream": "compute"},
        {"op": "free", "buffer": "%3"}]
    prog = rt.load_bundle(make(tmp_path, lib, program))
    executor = prog._executor
    results = []
    for seed in range(3):
        a, b = inputs(seed)
        (y,) = prog.run([a, b])
        np.testing.assert_allclose(y, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)
        results.append(y)
    assert not any(np.shares_memory(x, y) for i, x in enumerate(results) for y in results[i + 1:])
    slots, views, nbytes = executor._layout
    assert set(slots) == {"%0", "%1", "%3"} and not views
    assert slots["%3"][0] == slots["%0"][0] != slots["%1"][0] and nbytes == 2 * 64
    (buffers, addresses), = executor._arenas
    assert all(address % 64 == 0 for address in addresses)
    held = executor._arenas.pop()              # as if another thread's run had it
    a, b = inputs(7)
    (y,) = prog.run([a, b])
    np.testing.assert_allclose(y, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)
    (other,) = executor._arenas
    assert not any(np.shares_memory(x, z) for x in held[0] for z in other[0])


def test_the_embedding_gradient_sums_each_id_s_rows_and_splits_by_row_blocks():
    """library scatter_add (the embedding gradient): out[id] = the sum of the
    update rows with that id (float64 reference, ids repeating, some never
    used); a vocab-parallel rank's block (`block` = (index, count)) holds
    exactly its rows of the whole table, bit for bit."""
    from tessera_runtime.engines.library import scatter_add
    rng = np.random.default_rng()
    vocab, dim = 10, 6
    ids = rng.integers(0, vocab - 2, size=(4, 7))            # the last two rows unused
    updates = rng.standard_normal((4, 7, dim)).astype(np.float32)
    whole = np.full((vocab, dim), np.nan, np.float32)
    scatter_add(np, {}, updates, ids, whole)
    expect = np.zeros((vocab, dim))
    for i, row in zip(ids.reshape(-1), updates.reshape(-1, dim).astype(np.float64)):
        expect[i] += row
    np.testing.assert_allclose(whole, expect, rtol=1e-5, atol=1e-5)
    assert not whole[-2:].any()
    for index in range(2):
        block = np.full((vocab // 2, dim), np.nan, np.float32)
        scatter_add(np, {"block": (index, 2)}, updates, ids, block)
        np.testing.assert_array_equal(block, whole[index * vocab // 2:(index + 1) * vocab // 2])
