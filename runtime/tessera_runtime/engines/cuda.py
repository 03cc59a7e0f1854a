"""The `cuda` engine: cupy device buffers, generated kernels from a cubin.

* Memory: cupy arrays from cupy's memory pool (freed buffers are reused in
  stream order). bf16 is stored as uint16 (cupy has no bfloat16 dtype; Tessera
  has no uint16 dtype, so the NCCL communicators read uint16 as bf16) and
  converted back to `ml_dtypes.bfloat16` by `to_host`.
* Kernels: the bundle's cubin (`cupy.RawModule(path=...)`), or its CUDA
  source compiled with NVRTC (`nvrtc.py`: for the device's architecture,
  sm_90a on Hopper) when the bundle was built without nvcc. Each
  launch uses the grid, block and dynamic shared memory the compiler recorded;
  kernels needing more than 48 KB of dynamic shared memory get their limit
  raised once.
* Streams: one non-blocking cupy stream per Schedule IR stream (`compute`,
  `comm`), so collectives on the comm stream overlap kernels on the compute
  stream; `event_record` / `event_wait` are CUDA events.
* Library routines (data movement) run `library.py` on cupy on the launch's
  stream. A value check (`check_range`) computes its flag on the device; the
  run reads every check's flag in one copy with its results (`read_flags`):
  no check synchronizes the device mid-step.

Device selection: rank r of a job uses GPU r mod (GPUs on the node), or the
device in TESSERA_CUDA_DEVICE.

NVSHMEM (kernels from `transport="nvshmem"`): on the first symmetric
allocation the engine initializes NVSHMEM through nvshmem4py (`pip install
'tessera[cu13]'`), with a unique id from rank 0 broadcast over MPI (PE =
rank in the job), registers the loaded cubin with the NVSHMEM host library
(`cumodule_init`, which fills in the module's device state) and allocates
symmetric cupy arrays (`nvshmem.core.array`), one per allocation site, kept
for later runs. Before each launch of an NVSHMEM kernel its signal
arguments are zeroed and `barrier_all` runs on the launch's stream, so no PE
puts into a buffer a peer may still be reading. (Written against the
nvshmem4py 0.4 API; not yet run on a GPU.)
"""

from __future__ import annotations

import time

from pathlib import Path

import numpy as np

from .. import bf16, env
from . import Engine, EngineError, Event
from .tensor_maps import TensorMaps, cuda_tensor_map

_STATIC_SHARED_LIMIT = 48 * 1024


def _cupy():
    try:
        import cupy
    except ImportError:
        raise EngineError("the cuda engine needs cupy: pip install 'tessera[cu13]' "
                          "(or [cu12]), or set TESSERA_CUDA_EMULATE=1 to emulate the "
                          "GPU on the CPU") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        raise EngineError(f"the cuda engine found no usable GPU ({e}); set "
                          "TESSERA_CUDA_EMULATE=1 to emulate the GPU on the CPU") from None
    if count == 0:
        raise EngineError("the cuda engine found no GPU; set TESSERA_CUDA_EMULATE=1 to "
                          "emulate the GPU on the CPU")
    return cupy, count


class _CudaStreamRef:
    """A cupy stream as nvshmem4py takes streams (the `__cuda_stream__`
    protocol: version 0 and the raw handle)."""

    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return 0, self.stream.ptr


class CUDAEvent(Event):
    def __init__(self, event):
        self.event = event


class CUDAEngine(Engine):
    name = "cuda"

    def __init__(self, device: int | None = None):
        from .. import world
        cp, count = _cupy()
        self.cp = cp
        if device is None:
            device = env.integer("TESSERA_CUDA_DEVICE", world()[0] % count)
        self.device = cp.cuda.Device(device)
        self.device.use()
        self._streams: dict = {}
        self._module = None
        self._launches: dict = {}
        self._functions: dict = {}
        self._nvshmem = None               # nvshmem.core once initialized
        self._module_registered = False

    # -- memory -----------------------------------------------------------------
    def _storage(self, dtype):
        return bf16.bits_dtype(dtype)       # cupy has neither bf16 nor FP8

    def alloc(self, shape, dtype):
        return self.cp.empty(tuple(shape), dtype=self._storage(dtype))

    def free(self, buffer) -> None:
        pass    # the memory pool reclaims it when the executor drops its reference

    def is_buffer(self, array, dtype) -> bool:
        return isinstance(array, self.cp.ndarray) and array.dtype == self._storage(dtype)

    def from_host(self, array):
        # A device array (a run's output fed back) is copied where it is, by
        # the same call, so the program may still write its buffer.
        if not isinstance(array, self.cp.ndarray):
            array = np.asarray(array)
            array = array.view(self._storage(array.dtype))
        return self._upload(array)

    def to_host(self, buffer, dtype=None):
        host = self.cp.asnumpy(buffer)
        if dtype is not None and np.dtype(dtype).kind == "V":
            host = host.view(np.dtype(dtype))
        return host

    # -- kernels ------------------------------------------------------------------
    def load_kernels(self, path, launches=None) -> None:
        path = Path(path)
        if not path.is_file():
            raise EngineError(f"kernel binary not found: {path}")
        cubin = path
        if path.suffix != ".cubin":
            from . import nvrtc
            arch = nvrtc.arch_of(self.device.compute_capability)
            cuda_major = self.cp.cuda.runtime.runtimeGetVersion() // 1000
            cubin = nvrtc.compile_cubin(path.read_text(), arch, name=path.name,
                                        cuda_major=cuda_major)
        self._module = self.cp.RawModule(path=str(cubin))
        self.kernel_library = path
        self._launches = dict(launches or {})
        self._functions.clear()
        self._module_registered = False

    def _function(self, kernel: str):
        fn = self._functions.get(kernel)
        if fn is None:
            if kernel not in self._launches:
                raise EngineError(f"kernel '{kernel}' has no launch configuration in the bundle")
            try:
                fn = self._module.get_function(kernel)
            except Exception as e:     # cupy raises CUDADriverError (no public base class)
                raise EngineError(f"kernel '{kernel}' not found in {self.kernel_library}: {e}") \
                    from None
            shared = self._launches[kernel]["shared_bytes"]
            if shared > _STATIC_SHARED_LIMIT:
                fn.max_dynamic_shared_size_bytes = shared
            self._functions[kernel] = fn
        return fn

    def has_kernel(self, kernel: str) -> bool:
        return self._module is not None and kernel in self._launches

    def launch(self, kernel: str, args, stream=None) -> None:
        self.prepare_launch(kernel, len(args), stream)(args)

    def prepare_launch(self, kernel: str, n_args: int, stream=None):
        fn = self._function(kernel)
        cfg = self._launches[kernel]
        grid, block, shared = tuple(cfg["grid"]), tuple(cfg["block"]), cfg["shared_bytes"]
        if cfg.get("tensor_maps"):
            maps = TensorMaps(cfg["tensor_maps"], cuda_tensor_map, lambda a: a.data.ptr,
                              lambda blob: self._upload(np.frombuffer(blob, np.uint8)))

            def arguments(args):
                return tuple(args) + (maps.for_args(args),)
        else:
            arguments = tuple
        if not cfg.get("nvshmem"):
            return lambda args: fn(grid, block, arguments(args), shared_mem=shared, stream=stream)
        signals = cfg.get("signals", [])
        on_stream = _CudaStreamRef(stream)

        def launch_nvshmem(args):
            nvshmem = self._nvshmem_core()
            self._register_module(nvshmem)
            for i in signals:
                self.cp.cuda.runtime.memsetAsync(args[i].data.ptr, 0, args[i].nbytes, stream.ptr)
            nvshmem.barrier_all(on_stream)
            fn(grid, block, arguments(args), shared_mem=shared, stream=stream)
        return launch_nvshmem

    def _upload(self, host):
        """`host` (a numpy or cupy array, any layout, 0-d included) in C
        order in (new) device memory, there before any stream's next kernel. The copy runs on the null
        stream, which the engine's non-blocking streams do not wait for (and
        a copy from pageable memory may return before the DMA lands), hence
        the synchronize."""
        null = self.cp.cuda.Stream.null
        with null:
            buffer = self.cp.array(host, order="C", copy=True)
        null.synchronize()
        return buffer

    # -- NVSHMEM -------------------------------------------------------------------
    def _nvshmem_core(self):
        """nvshmem.core, initialized once for this job (PE = rank)."""
        if self._nvshmem is None:
            try:
                import nvshmem.core as nvshmem
                from cuda.core import Device
            except ImportError as err:
                raise EngineError(f"kernels using transport='nvshmem' need nvshmem4py: pip install "
                                  f"'tessera[cu13]' (or [cu12]) ({err})") from err
            from .. import world
            rank, size = world()
            uid = nvshmem.get_unique_id(empty=rank != 0)
            if size > 1:
                from .. import mpi_comm
                mpi_comm.MPI.COMM_WORLD.Bcast(uid._data.view(np.int8), root=0)
            device = Device(self.device.id)
            device.set_current()
            nvshmem.init(device=device, uid=uid, rank=rank, nranks=size,
                         initializer_method="uid")
            self._nvshmem = nvshmem
        return self._nvshmem

    def _register_module(self, nvshmem) -> None:
        """A cubin loaded by cupy has its own copy of NVSHMEM's device state,
        which the host library must fill in before its kernels run."""
        if not self._module_registered:
            handle = nvshmem.NvshmemKernelObject.from_handle(self._module.module.ptr)
            nvshmem.module_init(handle)
            self._module_registered = True

    def new_symmetric(self, shape, dtype):
        return self._nvshmem_core().array(tuple(shape), dtype=self._storage(dtype))

    def prepare_library(self, routine: str, attrs: dict, stream=None, nbytes: int = 0):
        from .library import ROUTINES
        impl, cp = ROUTINES[routine], self.cp

        def call(args):
            with stream:
                if routine == "scatter_add" and args[-1].dtype == np.uint16:
                    # bf16 bits: accumulate in f32, round once.
                    wide = [bf16.to_f32(cp, a) if a.dtype == np.uint16 else a for a in args]
                    impl(cp, attrs, *wide)
                    args[-1][...] = bf16.from_f32(cp, wide[-1])
                    return None
                return impl(cp, attrs, *args)       # (a value check's flag, on the device)
        return call

    def read_flags(self, flags) -> list[tuple[int, int]]:
        """The run's check flags (device arrays [row, value]) in one copy to
        the host: the only read a value check costs (after the run's
        synchronize, beside its results' copies)."""
        host = self.cp.asnumpy(self.cp.stack(flags) if len(flags) > 1 else flags[0])
        return [tuple(int(v) for v in f) for f in host.reshape(len(flags), 2)]

    def call_library(self, routine: str, attrs: dict, args, stream=None) -> None:
        self.prepare_library(routine, attrs, stream)(args)

    # -- streams and events --------------------------------------------------------
    def stream(self, name: str):
        s = self._streams.get(name)
        if s is None:
            s = self._streams[name] = self.cp.cuda.Stream(non_blocking=True)
        return s

    def record_event(self, stream) -> CUDAEvent:
        event = self.cp.cuda.Event(disable_timing=True)
        event.record(stream)
        return CUDAEvent(event)

    def wait_event(self, event, stream) -> None:
        if not isinstance(event, CUDAEvent):
            raise EngineError(f"event_wait on a {type(event).__name__}, not a CUDA event")
        stream.wait_event(event.event)

    def synchronize(self) -> None:
        for s in self._streams.values():
            s.synchronize()

    # -- profiling: CUDA events, placed on the host clock after the run ----------------
    def begin_timestamps(self) -> None:
        # An origin event recorded on an idle device, at a known host time:
        # every later event's elapsed time from it is a host time.
        self.synchronize()
        origin = self.cp.cuda.Event()
        origin.record(self.cp.cuda.Stream.null)
        origin.synchronize()
        self._origin = (origin, time.perf_counter())

    def timestamp(self, stream):
        event = self.cp.cuda.Event()
        event.record(stream)
        return event

    def resolve_timestamps(self, stamps) -> list[float]:
        origin, host = self._origin
        return [host + self.cp.cuda.get_elapsed_time(origin, e) * 1e-3 for e in stamps]
