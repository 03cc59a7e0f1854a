"""The CUDA printer's kernel: `CudaKernelEmitter`, one `extern "C"
__global__` function per `ttile.kernel` (each grid point one thread block,
`blockIdx`; its `block` threads cooperate on every tile), composed of one
part per op family, and `emit_cuda_kernels`, the source of a module.

Shared memory is one dynamic buffer (`tessera_smem`) at the offsets
tessera-gpu-alloc-shared chose; each kernel's size is in its launch
configuration, which the runtime passes at launch (and uses to raise the
kernel's dynamic shared memory limit above 48 KB when needed)."""

from __future__ import annotations

import math

from tessera_mlir import ir

from ...ir import cpu_schedule as cs
from ...ir import gpu_schedule as gs
from ...ir.options import DEFAULT, TargetOptions
from ...ir.support import kernels_of, marked_args, nested_ops
from ..build import dump_kernels
from ..printer import EmitError, Tile, TilePrinter
from .gemm import GemmMainLoops
from .mma import TensorCoreDots
from .nvshmem import NvshmemOps
from .pointwise import PointwiseRegions, Region
from .prelude import CUDA_PRELUDE, wgmma_wrapper
from .reduce import Reductions
from .register_loop import RegisterLoop
from .staging import Staging


class CudaKernelEmitter(PointwiseRegions, Reductions, TensorCoreDots, Staging, GemmMainLoops,
                        NvshmemOps, TilePrinter):
    """Prints one `ttile.kernel` that tessera-gpu-software-pipeline, -place and
    -alloc-shared scheduled: it reads their attributes and decides nothing.
    `TilePrinter` (../printer.py, shared with the C++ printer) walks the ops
    and calls `op_<name>`; each part prints one family."""

    def __init__(self, options: TargetOptions = DEFAULT):
        super().__init__()
        self.options = options
        self.region: Region | None = None
        self.frags: dict = {}               # value -> Fragment
        self.scalars: dict = {}             # value -> C name, inside a region loop
        self.smem_decls: list[str] = []
        self.threads = 1            # threads running the code being emitted
        self.barrier_offsets: list[int] = []    # the next mbarrier arrays' (mbarrier_ring)
        # The wgmma instructions used: (N, element type, A in registers, B N-major).
        self.wgmma_shapes: set = set()
        self.tensor_maps: list = []         # {"arg", "box"} of each TMA tensor map, in order
        self.uses_nvshmem = False

    # -- shared memory: offsets from tessera-gpu-alloc-shared -----------------------
    def _release(self) -> None:
        """Tiles died here (`ttile.release`): a barrier before their bytes are
        reused, so no thread still reads one when another overwrites it."""
        if not self.lines or self.lines[-1].strip() != "__syncthreads();":
            self.sync()

    def _offset(self, value: ir.Value) -> int:
        """The byte offset of `value`'s shared tile: its defining op's
        `ttile.smem`, or a shared loop's (for a carried block argument)."""
        owner = value.owner
        if isinstance(owner, ir.Block):         # the carried tile of a shared loop
            loop = owner.owner.operation
            return gs.smem(loop.results[ir.BlockArgument(value).arg_number - 1])
        return gs.smem(value)

    def new_tile(self, value: ir.Value) -> Tile:
        tile = super().new_tile(value)
        offset = self._offset(value)
        self.smem_decls.append(f"{tile.ctype}* const {tile.name} = reinterpret_cast<{tile.ctype}*>"
                               f"(tessera_smem + {offset});  // tile {'x'.join(map(str, tile.shape))}")
        return tile

    def sync(self) -> None:
        self.line("__syncthreads();")

    def math(self, fn: str, arg: str) -> str:
        return f"{fn}({arg})"             # CUDA's math library (float and double overloads)

    def fast(self, ct: str, fn: str, arg: str) -> str:
        # A float exp as 2^(x * log2 e) on the special-function unit
        # (tessera_ex2), where expf without fast math is a longer accurate
        # range reduction (and exp2f made ptxas spill in attention). The
        # multiply's rounding costs |x| * 2^-24 relative: far below what fp32
        # kernels need (softmax exponents are <= 0 and small).
        if fn == "exp" and ct == "float":
            return f"tessera_ex2(({arg}) * 1.4426950408889634f)"
        if fn == "exp2" and ct == "float":
            return f"tessera_ex2({arg})"
        return super().fast(ct, fn, arg)

    def element_loop(self, e: str, n) -> str:
        # Strided by the threads still running (not blockDim.x): a producer
        # warpgroup leaves the kernel after the GEMM main loop.
        return f"for (int64_t {e} = threadIdx.x; {e} < {n}; {e} += {self.threads}) {{"

    # -- kernel ----------------------------------------------------------------
    def emit_kernel(self, kernel: ir.Operation) -> str:
        name, grid, entry, params, prologue = self.signature(kernel)
        block = list(ir.DenseI64ArrayAttr(kernel.attributes["block"]))
        self.threads = block_threads = math.prod(block)
        self.stages = (ir.IntegerAttr(kernel.attributes["stages"]).value
                       if "stages" in kernel.attributes else 2)
        if not gs.planned(kernel):
            raise EmitError(f"kernel @{name} has no GPU schedule: run tessera-gpu-software-pipeline, "
                            "tessera-gpu-place and tessera-gpu-alloc-shared first "
                            "(tessera-translate --ttile-to-cuda does)", kernel.location)
        cpu = next((o for o in nested_ops(kernel) if any(a in o.attributes for a in cs.ATTRIBUTES)),
                   None)
        if cpu is not None:
            raise EmitError(f"'{cpu.name}' in kernel @{name} has a CPU schedule attribute "
                            "(tessera-cpu-in-place, tessera-cpu-fuse): the CUDA printer reads the "
                            "GPU schedule", cpu.location)
        self.shared_bytes = gs.integer(kernel, gs.SMEM_BYTES)
        strided = next((o for o in nested_ops(kernel)
                        if o.name in ("ttile.load", "ttile.store") and "dims" in o.attributes), None)
        if strided is not None:
            raise EmitError(f"'{strided.name}' with 'dims' in kernel @{name}: the CUDA emitter "
                            "takes tiles of a buffer's trailing dimensions", strided.location)
        start = len(self.lines)
        for d in range(len(grid)):
            self.line(f"const int64_t pid{d} = blockIdx.{'xyz'[d]};")
        skip = self.past_segments(kernel, "pid0")
        if skip:               # the whole block leaves, before any barrier
            self.line(f"if ({skip}) return;  // rows nothing reads")
        for op in entry.operations:
            self.emit_op(op.operation)
        self.flush()
        body = self.lines[start:]
        self.launch = {"grid": grid, "block": block, "shared_bytes": self.shared_bytes}
        if self.tensor_maps:
            # One device buffer of 128-byte CUtensorMaps, built by the runtime
            # for this launch's arguments; see _tma_tile.
            params = params + ["const unsigned char* __restrict__ tessera_tmaps"]
            self.launch["tensor_maps"] = self.tensor_maps
        head = [f"// ttile.kernel @{name}",
                f"// launch: grid ({', '.join(map(str, grid))}), block ({', '.join(map(str, block))}), "
                f"dynamic shared memory {self.shared_bytes} bytes",
                f'extern "C" __global__ void __launch_bounds__({block_threads}) '
                f"{name}({', '.join(params)}) {{"]
        # 1024-byte alignment: wgmma's 128-byte swizzle is a function of the
        # shared-memory address, in 1024-byte atoms.
        smem = (["  extern __shared__ __align__(1024) unsigned char tessera_smem[];"]
                + ["  " + d for d in self.smem_decls]) if self.shared_bytes else []
        return "\n".join(head + ["  " + p for p in prologue] + smem + body + ["}"]) + "\n"

    # -- dispatch ----------------------------------------------------------------
    def emit_op(self, op: ir.Operation) -> None:
        if op.name in gs.POINTWISE:
            self._add_to_region(op)
            return
        if op.name == "scf.for":
            pipeline = gs.pipeline(op)
            if pipeline is not None:
                if pipeline.kind == "gemm":
                    self._emit_mma_loop(op, pipeline)
                else:
                    self._emit_register_loop(op, pipeline)
                return
            why = gs.fallback(op)
            if why is not None:
                self.flush()
                self.line(f"// scf.for with its tiles in shared memory: {why}")
        if op.name.startswith("ttile.") or op.name.startswith("scf."):
            self.flush()
            self._spill_read(op.operands, op)
            if gs.flag(op, gs.RELEASE):
                self._release()
        super().emit_op(op)

    def _spill_read(self, values, op) -> None:
        """Before `op` (marked `ttile.spill`), the fragments among `values`
        go to their shared tiles."""
        if gs.flag(op, gs.SPILL):
            for v in values:
                if v in self.frags:
                    self._spill(v)

    def op_ttile_barrier(self, op):
        self.sync()

    # -- loops with their tiles in registers (register_loop.py) ------------------------
    def _emit_register_loop(self, op, pipeline) -> None:
        self.flush()
        self._spill_read(gs.loop_reads(op), op)     # register tiles from before: to shared memory
        if gs.flag(op, gs.RELEASE):
            self._release()
        self.barrier_offsets = gs.barriers(op)
        RegisterLoop(self, op, pipeline).emit()


def emit_cuda_kernels(module, options: TargetOptions = DEFAULT) -> tuple[str, dict]:
    """CUDA C++ for every ttile.kernel of `module`, and each kernel's launch
    configuration: {name: {"grid", "block", "shared_bytes"}}, plus, for
    kernels calling NVSHMEM, `"nvshmem": True` and `"signals"`: the indices
    of arguments marked `ttile.signals` (the runtime zeroes them, then runs a
    barrier over all PEs, before each launch).

    `options.wait_watchdog_s` (None: no check) makes a thread still waiting
    on an mbarrier after that many seconds trap, so a ring whose phases are
    wrong fails its launch in seconds instead of hanging the GPU
    (bench/gpu_kit.py builds its checks with it). The check only reads the
    global timer and traps: a printf would be a function call, across which
    ptxas serializes every wgmma (measured: "wgmma pipeline crossing
    function boundary"), so the checks would not test the asynchronous
    kernels."""
    parts, launches, nvshmem = [CUDA_PRELUDE], {}, False
    wgmma_shapes = set()
    for kernel in kernels_of(module):
        emitter = CudaKernelEmitter(options)
        parts.append(emitter.emit_kernel(kernel))
        wgmma_shapes |= emitter.wgmma_shapes
        launch = dict(emitter.launch)
        if emitter.uses_nvshmem:
            launch["nvshmem"] = True
            launch["signals"] = marked_args(kernel, "ttile.signals")
        launches[ir.StringAttr(kernel.attributes["sym_name"]).value] = launch
        nvshmem |= emitter.uses_nvshmem
    dump_kernels(parts[1:], ".cu")
    parts[1:1] = [wgmma_wrapper(*shape) for shape in sorted(wgmma_shapes)]
    if options.wait_watchdog_s is not None:
        watchdog_ns = int(options.wait_watchdog_s * 1e9)
        parts.insert(0, f"#define TESSERA_WAIT_WATCHDOG_NS {watchdog_ns}ull\n")
    if nvshmem:
        # Device-initiated communication: NVSHMEM's device API (compile with
        # -rdc=true and link libnvshmem_device; see build.build_cuda_cubin).
        parts.insert(1, "#include <nvshmem.h>\n#include <nvshmemx.h>\n")
    return "\n".join(parts), launches


def emit_cuda(module, options: TargetOptions = DEFAULT) -> str:
    """CUDA C++: one `extern "C" __global__` kernel per ttile.kernel."""
    return emit_cuda_kernels(module, options)[0]
