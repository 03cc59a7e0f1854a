"""The `cuda` engine's plumbing without a GPU: cupy, cuda.core and nvshmem4py
replaced by fakes that record what the engine asks of them, in order.

What this checks is the engine's own logic, which otherwise runs only on a
GPU: one distinct non-blocking stream per Schedule IR stream; inputs uploaded
and synchronized before a non-blocking stream can read them; launches with
the bundle's grid, block and shared memory on the stream they were given;
the dynamic shared memory limit raised once per kernel; a bundle without a
cubin compiled by NVRTC for the device (sm_90a on Hopper); and the NVSHMEM
launch protocol (initialize once with rank 0's id, register the module
once, zero the signal words and run barrier_all on the launch's stream
before every launch). The fakes model what those checks depend on (cupy
copies on the current stream), not more. What it cannot check is cupy's or NVSHMEM's behaviour
itself: that is test_cuda_engine.py, on a GPU."""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest

from tessera_runtime.engines import EngineError


class _Recorder:
    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, *call):
        self.calls.append(call)


class _DeviceArray:
    """A device buffer: host memory with the `.data.ptr` cupy arrays have."""

    def __init__(self, host: np.ndarray):
        self.host = np.array(host, order="C", copy=True)
        self.data = types.SimpleNamespace(ptr=self.host.ctypes.data)
        self.nbytes, self.dtype, self.shape = self.host.nbytes, self.host.dtype, self.host.shape



def _fake_cupy(log: _Recorder, compute_capability: str = "90"):
    cp = types.ModuleType("cupy")

    class Stream:
        count = 0

        def __init__(self, non_blocking=False, null=False):
            Stream.count += 1
            self.ptr = 0 if null else 0x1000 * Stream.count
            self.non_blocking = non_blocking

        def synchronize(self):
            log("synchronize", self.ptr)

        def wait_event(self, event):
            log("wait_event", self.ptr, event)

        def __enter__(self):                  # `with stream:` makes it current
            self.previous, Stream.current = Stream.current, self
            return self

        def __exit__(self, *exc):
            Stream.current = self.previous
            return False

    Stream.null = Stream.current = Stream(null=True)

    class Event:
        def __init__(self, disable_timing=False):
            pass

        def record(self, stream):
            log("record", stream.ptr)

    class Function:
        def __init__(self, name):
            self.name, self.max_dynamic_shared_size_bytes = name, 0

        def __call__(self, grid, block, args, shared_mem=0, stream=None):
            log("launch", self.name, grid, block, len(args), shared_mem,
                None if stream is None else stream.ptr)

    class RawModule:
        def __init__(self, path=None, code=None, **kw):
            assert code is None, "the engine compiles CUDA source itself (NVRTC), then loads a cubin"
            log("module", str(path))
            self.module = types.SimpleNamespace(ptr=0xbeef)

        def get_function(self, name):
            return Function(name)

    class Device:
        def __init__(self, device):
            self.id, self.compute_capability = device, compute_capability

        def use(self):
            pass

    def array(host, order="C", copy=True):     # cupy copies on the current stream
        device = isinstance(host, _DeviceArray)
        log("device_copy" if device else "upload", Stream.current.ptr)
        return _DeviceArray(host.host if device else host)

    def memset_async(ptr, value, nbytes, stream):
        log("memset", ptr, value, nbytes, stream)

    class CUDARuntimeError(RuntimeError):
        pass

    cp.cuda = types.SimpleNamespace(
        Stream=Stream, Event=Event, Device=Device,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, memsetAsync=memset_async,
                                      runtimeGetVersion=lambda: 13000,
                                      CUDARuntimeError=CUDARuntimeError))
    cp.RawModule, cp.array, cp.ndarray = RawModule, array, _DeviceArray
    cp.empty = lambda shape, dtype: _DeviceArray(np.empty(shape, dtype))
    cp.asnumpy = lambda a: a.host.copy()
    return cp


def _fake_nvshmem(log: _Recorder):
    core = types.ModuleType("nvshmem.core")

    class UniqueId:
        def __init__(self):
            self._data = np.zeros(128, np.uint8)

    core.get_unique_id = lambda empty=False: (log("unique_id", empty), UniqueId())[1]
    core.init = lambda device, uid, rank, nranks, initializer_method: log(
        "init", rank, nranks, initializer_method)
    core.NvshmemKernelObject = types.SimpleNamespace(from_handle=lambda ptr: ("kernel", ptr))
    core.module_init = lambda handle: log("module_init", handle)
    core.barrier_all = lambda stream: log("barrier_all", stream.__cuda_stream__()[1])
    core.array = lambda shape, dtype: _DeviceArray(np.zeros(shape, dtype))
    package = types.ModuleType("nvshmem")
    package.core = core
    cuda_core = types.ModuleType("cuda.core")

    class Device:
        def __init__(self, device_id):
            self.device_id = device_id

        def set_current(self):
            log("set_current", self.device_id)

    cuda_core.Device = Device
    cuda = types.ModuleType("cuda")
    cuda.core = cuda_core
    return {"nvshmem": package, "nvshmem.core": core, "cuda": cuda, "cuda.core": cuda_core}


@pytest.fixture
def engine(monkeypatch):
    """A CUDAEngine on the fakes, and the log of what it asked of them."""
    log = _Recorder()
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(log))
    for name, module in _fake_nvshmem(log).items():
        monkeypatch.setitem(sys.modules, name, module)
    from tessera_runtime.engines.cuda import CUDAEngine
    return CUDAEngine(device=0), log


def test_streams_are_distinct_non_blocking_and_uploads_synchronize(engine):
    eng, log = engine
    compute, comm = eng.stream("compute"), eng.stream("comm")
    assert compute is not comm and compute.non_blocking and comm.non_blocking
    assert eng.stream("compute") is compute
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with compute:                   # whatever stream is current, the copy runs on
        buf = eng.from_host(x.T)    # the null stream; nothing reads it before it lands
    assert log.calls == [("upload", 0), ("synchronize", 0)]
    np.testing.assert_array_equal(eng.to_host(buf), x.T)
    scalar = eng.to_host(eng.from_host(np.float32(2.5)))     # a 0-d input stays 0-d
    assert scalar.shape == () and scalar == 2.5
    # A device array (a run's output fed back) is copied on the device, on
    # the null stream too: no upload, and the caller's buffer stays its own.
    del log.calls[:]
    with compute:
        again = eng.from_host(buf)
    assert log.calls == [("device_copy", 0), ("synchronize", 0)] and again is not buf
    np.testing.assert_array_equal(eng.to_host(again), x.T)
    assert eng.is_buffer(buf, np.float32) and not eng.is_buffer(x, np.float32)


def test_launches_use_the_bundle_config_on_the_given_stream(engine, tmp_path):
    eng, log = engine
    cubin = tmp_path / "kernels.cubin"
    cubin.write_bytes(b"\x7fELF")
    eng.load_kernels(cubin, {"k": {"grid": [4, 1, 1], "block": [128], "shared_bytes": 96 * 1024}})
    stream = eng.stream("compute")
    args = [eng.alloc((8,), np.float32)]
    launch = eng.prepare_launch("k", 1, stream)
    launch(args)
    launch(args)
    assert log.calls[0] == ("module", str(cubin))
    assert log.calls[1:] == [("launch", "k", (4, 1, 1), (128,), 1, 96 * 1024, stream.ptr)] * 2
    assert eng._functions["k"].max_dynamic_shared_size_bytes == 96 * 1024
    with pytest.raises(EngineError, match="kernel 'missing' has no launch configuration"):
        eng.prepare_launch("missing", 0, stream)


def test_a_bundle_without_a_cubin_is_compiled_by_nvrtc_for_the_device(engine, tmp_path,
                                                                      monkeypatch):
    from tessera_runtime.engines import nvrtc
    eng, log = engine
    compiled = []

    def compile_cubin(source, arch, name="kernels.cu", cuda_major=None):
        compiled.append((arch, name, cuda_major))
        out = tmp_path / "built.cubin"
        out.write_bytes(b"\x7fELF")
        return out
    monkeypatch.setattr(nvrtc, "compile_cubin", compile_cubin)
    source = tmp_path / "kernels.cu"
    source.write_text('extern "C" __global__ void k() {}\n')
    eng.load_kernels(source, {"k": {"grid": [1], "block": [32], "shared_bytes": 0}})
    assert compiled == [("sm_90a", "kernels.cu", 13)]      # NVRTC of cupy's CUDA
    assert log.calls == [("module", str(tmp_path / "built.cubin"))]
    assert eng.kernel_library == source          # errors name the bundle's file


def test_nvshmem_launches_initialize_once_and_reset_signals_every_time(engine, tmp_path,
                                                                       monkeypatch):
    import tessera_runtime
    monkeypatch.setattr(tessera_runtime, "world", lambda: (0, 1))
    eng, log = engine
    cubin = tmp_path / "kernels.cubin"
    cubin.write_bytes(b"\x7fELF")
    eng.load_kernels(cubin, {"ag": {"grid": [2], "block": [128], "shared_bytes": 0,
                                    "nvshmem": True, "signals": [1]}})
    flags = eng.new_symmetric((4,), np.int64)
    data = eng.new_symmetric((16, 8), np.float32)
    # Rank 0 makes the unique id (the others receive it over MPI).
    assert log.calls[1:] == [("unique_id", False), ("set_current", 0), ("init", 0, 1, "uid")]
    stream = eng.stream("compute")
    launch = eng.prepare_launch("ag", 2, stream)
    del log.calls[:]
    launch([data, flags])
    launch([data, flags])
    once = [("module_init", ("kernel", 0xbeef))]
    every = [("memset", flags.data.ptr, 0, flags.nbytes, stream.ptr),
             ("barrier_all", stream.ptr),
             ("launch", "ag", (2,), (128,), 2, 0, stream.ptr)]
    assert log.calls == once + every + every


def test_an_nccl_communicator_is_made_at_its_first_collective(engine, monkeypatch):
    """NCCL refuses two ranks of one communicator on one GPU (NCCL 2.28 on
    the first H100 run), which a program whose collectives are all NVSHMEM
    kernels never needs: the axis' NCCL communicator is made (unique id over
    the MPI group, then ncclCommInitRank) when the first collective asks for
    it, once, not when the program loads."""
    _, log = engine
    made = []

    class NcclCommunicator:
        def __init__(self, size, unique_id, rank):
            made.append((size, bytes(unique_id), rank))

    names = ("SUM", "PROD", "MAX", "MIN", "FLOAT32", "FLOAT64", "FLOAT16", "INT32", "INT64",
             "INT8", "UINT8")
    nccl = types.SimpleNamespace(NcclCommunicator=NcclCommunicator,
                                 get_unique_id=lambda: bytes(range(128)),
                                 **{f"NCCL_{n}": i for i, n in enumerate(names)})
    cp = sys.modules["cupy"]
    cp.cuda.nccl = nccl
    cp.add = cp.multiply = cp.maximum = cp.minimum = None    # the deterministic trees' ufuncs
    monkeypatch.setitem(sys.modules, "cupy.cuda", cp.cuda)
    # The module imported over these fakes, forgotten after the test (the
    # setitem/setattr restore what was there before, the delitem clears).
    import tessera_runtime
    monkeypatch.setitem(sys.modules, "tessera_runtime.nccl_comm", None)
    monkeypatch.delitem(sys.modules, "tessera_runtime.nccl_comm")
    monkeypatch.setattr(tessera_runtime, "nccl_comm", None, raising=False)
    nccl_comm = importlib.import_module("tessera_runtime.nccl_comm")

    class Group:                                 # an axis' MPI sub-communicator, rank 0 of 2
        def Get_rank(self):
            return 0

        def Bcast(self, buffer, root):
            log("bcast", root, bytes(buffer))

    comm = nccl_comm.NCCLCommunicator(Group(), 2, 0)
    assert made == [] and log.calls == []        # loading the program made nothing
    first = comm.comm
    assert made == [(2, bytes(range(128)), 0)]
    assert log.calls == [("bcast", 0, bytes(range(128)))]
    assert comm.comm is first and len(made) == 1
