"""Runs Graph IR through every level and keeps the IR of each one.

  graph        traced Graph IR (global shapes)
  autodiff     after tessera-autodiff (tgraph.grad replaced by backward Graph IR)
  partitioned  after tessera-propagate-sharding, tessera-partition,
               tessera-bucket-collectives, tessera-hierarchical-collectives,
               (pipelines) tessera-pipeline-schedule and tessera-hoist-selects
  schedule     after tessera-lower-to-schedule, checked by tessera-verify-schedule
  tile         after tessera-lower-to-tile (the schedule plus ttile kernels),
               tessera-fold-transposes (matmuls read transposed operands in place),
               tessera-merge-kernels (one kernel for identical copies) and, on
               the CPU, tessera-fold-slices (kernels read and write one index of
               a dimension in place) and tessera-fuse-gemm-epilogues (a GEMM
               runs the kernel after it)
  gpu          (GPU target) after tessera-gpu-software-pipeline, -place and
               -alloc-shared: the Tile IR with how each kernel runs on an SM,
               which the CUDA printer reads
  cpp / cuda   kernel sources emitted from the Tile IR
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import tessera_passes
from tessera_mlir import ir, passmanager
from tessera_runtime import env

from .codegen import emit_cpp, emit_cuda_kernels
from .codegen.tile_emitter import EmitError
from .ir import graph_builder as gb
from .ir.locations import source_of
from .ir.options import TARGETS, TargetOptions
from .ir.sharding import PER_RANK_OPS
from .memory import graph_facts, plan_memory

STAGES = [
    ("autodiff", ["tessera-autodiff", "canonicalize", "cse"]),
    ("partitioned", ["tessera-propagate-sharding", "tessera-partition", "tessera-ring-attention",
                     "canonicalize",
                     "tessera-bucket-collectives", "tessera-hierarchical-collectives",
                     "tessera-pipeline-schedule", "tessera-hoist-selects"]),
    ("schedule", ["tessera-lower-to-schedule", "tessera-verify-schedule"]),
    ("tile", ["tessera-lower-to-tile", "tessera-fold-transposes", "canonicalize", "cse",
              "tessera-merge-kernels", "tessera-fold-slices", "tessera-fuse-gemm-epilogues",
              "tessera-verify-schedule"]),
    ("cpu", list(tessera_passes.CPU_SCHEDULE)),        # CPU target only
    ("gpu", list(tessera_passes.GPU_SCHEDULE)),        # GPU target only
]


class CompileError(Exception):
    """A compile failure with MLIR's diagnostics (file:line: message)."""


@dataclass
class Collective:
    """A communication (or local reshard) op tessera-partition inserted."""
    op: str            # all_reduce, all_gather, ...
    axis: str
    bytes: int         # per rank: the larger of its input and result
    shape: tuple       # local input shape
    source: str        # file.py:line of the Python code that needed it
    #: how it moves, when the program asked ("nvshmem" or "nccl", and why)
    transport: str = ""

    def __str__(self) -> str:
        return (f"{self.op:<15} {self.axis:<4} {self.bytes:>12,} B  {list(self.shape)}  "
                f"{self.source}" + (f"  [{self.transport}]" if self.transport else ""))


def collective_report(name: str, collectives: list, min_bytes: int = 0) -> str:
    """A table of the collectives moving at least `min_bytes` per rank,
    largest first, each with the Python line that needed it."""
    rows = sorted((c for c in collectives if c.bytes >= min_bytes), key=lambda c: -c.bytes)
    total = sum(c.bytes for c in collectives)
    head = f"{name}: {len(collectives)} collectives, {total:,} B per rank"
    return "\n".join([head] + [f"  {c}" for c in rows])


def collectives_of(module: ir.Module, options: TargetOptions | None = None) -> list[Collective]:
    """The collectives of partitioned Graph IR, in program order; with
    `options`, each that names a transport says which one it gets and why
    (as tessera-lower-to-schedule will decide)."""
    from tessera_passes.lower_to_schedule import FUSABLE, choose_transport
    gpu = options is not None and options.target == "gpu"
    out = []
    for op in _body_ops(module, PER_RANK_OPS):
        src = ir.RankedTensorType(op.operands[0].type)
        res = ir.RankedTensorType(op.results[0].type)
        width = max(1, src.element_type.width // 8) if hasattr(src.element_type, "width") else 4
        size = max(math.prod(src.shape), math.prod(res.shape)) * width
        transport = ""
        if options is not None and op.name in FUSABLE and "transport" in op.attributes:
            chosen, why, error = choose_transport(op, gpu, options.nvshmem_auto_max_bytes)
            transport = f"{chosen}: {why}" if not error else f"error: {error}"
        out.append(Collective(op.name.split(".")[1], ir.StringAttr(op.attributes["axis"]).value,
                              size, tuple(src.shape), source_of(op.location), transport))
    return out


def _body_ops(module: ir.Module, names):
    """The ops named in `names` of the module's functions, in program order."""
    for f in module.body.operations:
        if f.operation.name != "func.func" or not f.operation.regions[0].blocks:
            continue
        for op in f.operation.regions[0].blocks[0].operations:
            if op.operation.name in names:
                yield op.operation


def attention_plans_of(module: ir.Module) -> list[str]:
    """How tessera-partition placed each attention whose sequence was split
    (context parallelism), in program order: "file.py:line: attention:
    sequence over 'cp' exchanged for heads (all-to-all, Ulysses)" (with
    "; K and V gathered (one head)" for multi-query attention), or "...
    gathered over 'cp' (every rank attends over the whole sequence)" where
    no leading dimension could take the split, or "... kept split over
    'cp': ring (...)" (tessera-ring-attention's first step)."""
    out = []
    for op in _body_ops(module, gb.ATTENTION_OPS):
        what = "attention" if op.name == "tgraph.attention" else "attention backward"
        where = f"{source_of(op.location)}: {what}: sequence"
        if "ulysses_axes" in op.attributes:
            axes = [ir.StringAttr(a).value for a in ir.ArrayAttr(op.attributes["ulysses_axes"])]
            kv = "; K and V gathered (one head)" if _gathered_over(op, 1) else ""
            out.append(f"{where} over {' x '.join(map(repr, axes))} exchanged for heads "
                       f"(all-to-all, Ulysses){kv}")
        elif "ring_axes" in op.attributes:
            axes = [ir.StringAttr(a).value for a in ir.ArrayAttr(op.attributes["ring_axes"])]
            balance = ", striped over the ranks for causal balance" \
                if "causal" in op.attributes else ""
            out.append(f"{where} kept split over {axes[0]!r}: ring (key/value blocks passed "
                       f"around the axis, merged by log-sum-exp{balance})")
        elif _gathered_over(op, 0):
            out.append(f"{where} gathered over {_gathered_over(op, 0)!r} "
                       f"(every rank attends over the whole sequence)")
    return out


def _gathered_over(attention: ir.Operation, operand: int) -> str | None:
    """The axis an attention operand's sequence was gathered over, if it was."""
    owner = attention.operands[operand].owner
    owner = getattr(owner, "operation", owner)
    if isinstance(owner, ir.Operation) and owner.name == "tgraph.all_gather" and \
            ir.IntegerAttr(owner.attributes["dim"]).value == gb.seq_dim_of(attention):
        return ir.StringAttr(owner.attributes["axis"]).value
    return None


IR_STAGES = ("graph", "autodiff", "partitioned", "schedule", "tile", "cpu", "gpu")


def _printed_level(stage: str) -> property:
    def text(self) -> str:
        if stage not in self._texts:
            snapshot = self._snapshots.pop(stage, None)
            self._texts[stage] = "" if snapshot is None else str(snapshot)
        return self._texts[stage]
    return property(text, doc=f"the module's IR after the {stage} stage")


@dataclass
class Levels:
    """The program at every level. Each IR level is a copy of the module
    taken after its stage (copying is cheap, printing is not: a few percent
    of a small model's first call) and printed when first read."""
    cpp: str = ""
    cuda: str = ""
    #: {kernel: {"grid", "block", "shared_bytes"}} of the CUDA kernels
    cuda_launches: dict = field(default_factory=dict, repr=False)
    target: str = "cpu"
    #: the options the levels were compiled with
    options: TargetOptions = field(default_factory=TargetOptions, repr=False)
    module: ir.Module | None = field(default=None, repr=False)
    #: what tessera-partition inserted, with the Python line that caused each
    collectives: list = field(default_factory=list, repr=False)
    #: how each attention over a split sequence was partitioned (attention_plans_of)
    attention: list = field(default_factory=list, repr=False)
    #: {function: MemoryPlan}: each rank's planned peak (see memory.py)
    memory: dict = field(default_factory=dict, repr=False)
    _snapshots: dict = field(default_factory=dict, repr=False)
    _texts: dict = field(default_factory=dict, repr=False)

    graph, autodiff, partitioned, schedule, tile, cpu, gpu = (_printed_level(s) for s in IR_STAGES)

    def keep(self, stage: str, module: ir.Module) -> None:
        """Keeps a copy of `module` as it is now, as level `stage`."""
        self._snapshots[stage] = module.operation.clone()
        self._texts.pop(stage, None)

    def items(self):
        return [(stage, getattr(self, stage)) for stage in IR_STAGES] + \
            [("cpp", self.cpp), ("cuda", self.cuda)]


def add_passes(pm: passmanager.PassManager, flags, options: TargetOptions) -> None:
    """Tessera passes by flag (through the registry, given `options`),
    upstream passes by name."""
    for flag in flags:
        if flag in tessera_passes.PASSES:
            tessera_passes.get(flag).add_to(pm, options)
        else:
            pm.add(flag)


def _format_diagnostics(err: ir.MLIRError) -> str:
    """MLIR's errors with their Python lines. The note with the failing
    operation's IR (often the whole function) only with TESSERA_SHOW_IR=1:
    the message and the line are what a user acts on."""
    show_ir = env.flag("TESSERA_SHOW_IR")
    lines, hidden = [], False
    for d in err.error_diagnostics:
        lines.append(f"{_where(d.location)}error: {d.message}")
        for note in d.notes:
            if note.message.startswith("see current operation") and not show_ir:
                hidden = True
                continue
            lines.append(f"{_where(note.location)}note: {note.message}")
    if hidden:
        lines.append("(TESSERA_SHOW_IR=1 shows the IR of the failing operation)")
    return "\n".join(lines) or str(err)


def _where(loc: ir.Location) -> str:
    src = source_of(loc)
    return f"{src}: " if src else ""


def target_options(target: str | TargetOptions | None) -> TargetOptions:
    """`target` as TargetOptions: a target name ("cpu", "gpu") with every
    other option at its default, or the options themselves (no target:
    "cpu")."""
    if target is None:
        return TargetOptions(target="cpu")
    if isinstance(target, TargetOptions):
        return target if target.target is not None else target.with_(target="cpu")
    if target not in TARGETS:
        raise CompileError(f"unknown target {target!r}; choose one of {list(TARGETS)}")
    return TargetOptions(target=target)


def lower(module: ir.Module, target: str | TargetOptions = "cpu",
          plan_only: bool = False, until: str | None = None) -> Levels:
    """Lowers `module` (Graph IR) in place through every level, with
    `target`'s options (a TargetOptions, or a target name for the default
    options). On the CPU matmuls become BLAS library calls and the kernels
    C++; on the GPU matmuls are tiled Tile IR GEMMs (see
    tessera-lower-to-tile) and the kernels CUDA C++ for sm_90a.
    `plan_only`: stop at Tile IR, with the memory plan (no GPU schedule, no
    kernel source). `until`: stop after that stage (e.g. "partitioned")."""
    if until is not None and until not in IR_STAGES:
        raise ValueError(f"lower: until={until!r} is not a stage ({', '.join(IR_STAGES)})")
    options = target_options(target)
    target = options.target
    levels = Levels(target=target, options=options)
    levels.keep("graph", module)
    module.operation.attributes["tessera.target"] = ir.StringAttr.get(target)
    facts = graph_facts(module)
    for stage, flags in STAGES:
        if stage in ("cpu", "gpu") and (target != stage or plan_only):
            continue
        pm = passmanager.PassManager("builtin.module", context=module.context)
        add_passes(pm, flags, options)
        try:
            pm.run(module.operation)
        except ir.MLIRError as err:
            raise CompileError(_format_diagnostics(err)) from None
        levels.keep(stage, module)
        if stage == "partitioned":
            levels.collectives = collectives_of(module, options)
            levels.attention = attention_plans_of(module)
        if stage == "tile":
            levels.memory = plan_memory(module, facts)
        if stage == until:
            break
    levels.module = module
    if plan_only or until is not None:
        return levels
    try:
        if target == "cpu":
            levels.cpp = emit_cpp(module)
        else:
            levels.cuda, levels.cuda_launches = emit_cuda_kernels(module, options)
    except EmitError as err:
        where = _where(err.location) if err.location is not None else ""
        raise CompileError(f"{where}error: {err}") from None
    return levels
