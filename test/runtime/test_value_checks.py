"""Value checks (`tgraph.check_range`, library routine `check_range`): the
routine on the host and, with a stand-in for cupy whose arrays refuse every
host read, on a "device"; and the executor, which keeps each check's flag and
raises once the step has run, on the CPU engine (both ways it runs a
program) and on the `cuda` engine over fakes of cupy (one copy of the flags,
after the run's synchronize, and none while the step runs)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import tessera_runtime as rt
from runtime_bundle_util import compile_kernels, kernels_cpp, tensor, write_bundle
from tessera_runtime.engines import library
from tessera_runtime.engines.library import ValueCheckError, check_range
from tessera_runtime.errors import TesseraError


def _first_bad(x, low, high, allowed=()):
    flat = np.asarray(x).reshape(-1)
    bad = ((flat < low) | (flat >= high)) & ~np.isin(flat, list(allowed))
    return (int(np.argmax(bad)), int(flat[np.argmax(bad)])) if bad.any() else None


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint8])
@pytest.mark.parametrize("low,high,allowed", [(0, 7, ()), (0, 7, (-100,)), (-3, 4, (9, -50)),
                                              (0, 0, (-1,)), (0, 200, ())])
def test_the_host_check_finds_the_first_element_outside_its_range(dtype, low, high, allowed):
    rng = np.random.default_rng()
    info = np.iinfo(dtype)
    allowed = tuple(a for a in allowed if info.min <= a <= info.max)
    attrs = {"low": low, "high": high, "allowed": allowed}
    for trial in range(40):
        x = rng.integers(max(low, info.min), max(high, max(low, info.min) + 1), (3, 5)).astype(dtype)
        if high == low:
            x[...] = allowed[0] if allowed else low
        if allowed and trial % 2:
            x.flat[rng.integers(0, x.size, 3)] = rng.choice(allowed)
        if trial % 3:                                   # some elements outside
            for i in rng.integers(0, x.size, rng.integers(1, 3)):
                x.flat[i] = rng.choice([v for v in (low - 1, high, high + 5, info.max, info.min)
                                        if info.min <= v <= info.max
                                        and not low <= v < high and v not in allowed] or [0])
        want = _first_bad(x, low, high, allowed)
        assert check_range(np, attrs, x) == want, (x, attrs)
        # In a block of rows past the first two blocks: its rows count from there.
        got = check_range(np, {**attrs, "block": (2, 4)}, x)
        assert got == (None if want is None else (2 * x.size + want[0], want[1]))
    assert check_range(np, attrs, np.zeros((0, 3), dtype)) is None


class _OnDevice(np.ndarray):
    """A "device" array: any read of its values on the host fails (a read
    would synchronize a GPU in the middle of the step)."""

    def _read(self, *args, **kwargs):
        raise AssertionError("a device array was read on the host")

    __bool__ = __int__ = __index__ = __float__ = item = tolist = _read


def _device(a):
    return np.asarray(a).view(_OnDevice)


class _FakeCupy(types.ModuleType):
    """numpy standing in for cupy: results are _OnDevice arrays; `asnumpy`
    (the only way to the host) is counted."""

    def __init__(self):
        super().__init__("cupy")
        self.copies = []
        self.ndarray = _OnDevice

    def asnumpy(self, a):
        self.copies.append(np.asarray(a).shape)
        return np.asarray(a).view(np.ndarray).copy()

    def __getattr__(self, name):
        fn = getattr(np, name)
        if not callable(fn) or isinstance(fn, type):
            return fn

        def on_device(*args, **kwargs):
            out = fn(*args, **kwargs)
            return _device(out) if isinstance(out, (np.ndarray, np.generic)) else out
        return on_device


def test_the_device_check_reads_nothing_on_the_host_and_agrees_with_the_host_one():
    cp = _FakeCupy()
    rng = np.random.default_rng()
    for trial in range(30):
        attrs = {"low": 0, "high": 7, "allowed": (-100,), "block": (1, 2)}
        x = rng.integers(0, 7, 12).astype(np.int32)
        x[rng.integers(0, 12, 2)] = -100
        if trial % 2:
            x[rng.integers(0, 12)] = rng.choice([7, -1, -5, 2**31 - 1])
        del cp.copies[:]
        flag = check_range(cp, attrs, _device(x))
        assert isinstance(flag, _OnDevice) and flag.shape == (2,)
        assert cp.copies == []                        # nothing left the device
        row, value = cp.asnumpy(flag)
        want = check_range(np, attrs, x)
        assert (None if row < 0 else (row, value)) == want


# -- the executor ---------------------------------------------------------------

@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return compile_kernels(kernels_cpp(relus=[12]), tmp_path_factory.mktemp("kernels"))


@pytest.fixture(params=[True, False], ids=["straight-line", "loop"])
def executor_path(request, monkeypatch):
    from tessera_runtime.executor import ScheduleExecutor
    monkeypatch.setattr(ScheduleExecutor, "straight_line", request.param)
    return request.param


MESSAGE = "checked{where}: value {value} in row {row}"


def _check(arg: str, low: int = 0, high: int = 7, loc: str | None = "train.py:42",
           **attrs) -> dict:
    ins = {"op": "launch", "kernel": f"check_{arg}", "library": "check_range",
           "stream": "compute", "attrs": {"low": low, "high": high, "message": MESSAGE, **attrs},
           "args": [arg], "outs": 0}
    if loc:
        ins["loc"] = loc
    return ins


def checked_program(rows: int = 3) -> dict:
    """relu(x) with two checks of the targets (its rows split over `dp`) in
    between: the second allows -100."""
    return {"mesh": {"name": "mesh", "axes": ["dp"], "shape": [1], "devices": [0]},
            "inputs": [tensor("x", "%arg0", [3, 4]),
                       tensor("t", "%arg1", [rows], dtype="int32")],
            "outputs": [tensor("y", "%arg0", [3, 4]), tensor("t", "%arg1", [rows], dtype="int32")],
            "streams": ["compute"],
            "instructions": [
                _check("%arg1", row_axes=["dp"]),
                {"op": "launch", "kernel": "relu_12", "stream": "compute", "args": ["%arg0"]},
                _check("%arg1", high=5, allowed=[-100], loc=None),
                {"op": "return", "values": ["%arg0", "%arg1"]}]}


def test_a_step_with_a_bad_value_runs_to_its_end_then_raises(tmp_path, lib, executor_path):
    prog = rt.load_bundle(write_bundle(tmp_path / "p.tsb", checked_program(), lib))
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    y, t = prog.run([x, np.array([1, 4, 2], np.int32)])       # every check passes
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(t, [1, 4, 2])
    prog._executor.memory = None
    with pytest.raises(ValueCheckError,
                       match=r"^checked at train.py:42: value 9 in row 1$") as err:
        prog.run([x, np.array([3, 9, -100], np.int32)])
    assert prog._executor.memory is not None        # the step ran to its end, then raised
    e = err.value
    assert (e.row, e.value, e.low, e.high, e.source) == (1, 9, 0, 7, "train.py:42")
    assert isinstance(e, library.LibraryError) and isinstance(e, ValueError)
    # The first check passes here; the second (no location) fails.
    with pytest.raises(ValueCheckError, match=r"^checked: value 6 in row 2$"):
        prog.run([x, np.array([0, 0, 6], np.int32)])
    y, _ = prog.run([x, np.array([0, 4, 4], np.int32)])      # and the program runs on
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_a_failed_check_is_the_class_users_catch():
    """The runtime raises `ts.ValueCheckError` itself (a TesseraError defined
    at the runtime's level), not a class the frontend registers at import."""
    err = library.failed_check({"low": 0, "high": 3, "message": "{row}:{value}{where}"}, 4, -2,
                               "f.py:1")
    assert type(err) is ValueCheckError and str(err) == "4:-2 at f.py:1"
    assert isinstance(err, TesseraError) and isinstance(err, ValueError)


# -- the cuda engine, over a fake cupy ----------------------------------------------

def _fake_cuda(monkeypatch):
    """CUDAEngine on a fake cupy whose buffers are _OnDevice arrays: the log
    says when the engine synchronized and copied to the host."""
    cp = _FakeCupy()
    log = []

    class Stream:
        def __init__(self, non_blocking=False):
            self.ptr = id(self)

        def synchronize(self):
            log.append("synchronize" if self is not Stream.null else "upload")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    Stream.null = Stream()

    def asnumpy(a, copy=cp.asnumpy):
        log.append(("to_host", np.asarray(a).shape))
        return copy(a)

    def array(host, order="C", copy=True):
        return _device(np.array(np.asarray(host).view(np.ndarray), order="C", copy=True))
    cp.cuda = types.SimpleNamespace(
        Stream=Stream, Device=lambda d: types.SimpleNamespace(use=lambda: None, id=d),
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, CUDARuntimeError=RuntimeError))
    cp.asnumpy, cp.array = asnumpy, array
    cp.empty = lambda shape, dtype: _device(np.empty(shape, dtype))
    monkeypatch.setitem(sys.modules, "cupy", cp)
    from tessera_runtime.engines.cuda import CUDAEngine
    return CUDAEngine(device=0), log


def test_the_cuda_engine_reads_every_flag_in_one_copy_after_the_step(tmp_path, monkeypatch):
    engine, log = _fake_cuda(monkeypatch)
    program = checked_program()
    program["instructions"] = [i for i in program["instructions"] if "library" in i or
                               i["op"] == "return"]                   # (no kernels: no cubin)
    from tessera_runtime.bundle import read_bundle
    from tessera_runtime.executor import ScheduleExecutor
    bundle = read_bundle(write_bundle(tmp_path / "p.tsb", program, None))
    executor = ScheduleExecutor(bundle.program, engine, {"dp": rt.SelfCommunicator()})
    x = np.ones((3, 4), np.float32)
    y, t = executor.run([x, np.array([1, 4, 2], np.int32)])
    np.testing.assert_array_equal(t, [1, 4, 2])
    # Both checks' flags in one copy, after the run's synchronize, and before
    # the results' copies; nothing else read on the host.
    assert log == ["upload", "upload", "synchronize", ("to_host", (2, 2)),
                   ("to_host", (3, 4)), ("to_host", (3,))], log
    del log[:]
    with pytest.raises(ValueCheckError, match=r"^checked at train.py:42: value -1 in row 0$"):
        executor.run([x, np.array([-1, 4, 2], np.int32)])
    assert log == ["upload", "upload", "synchronize", ("to_host", (2, 2))], log
