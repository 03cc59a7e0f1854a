"""How a step's work is scheduled (`tessera.schedule`).

Per step, as the collectives guide writes it (section 3.4):

    @schedule(pipeline=True, overlap=True, comm_backend="nvshmem", epoch="soft")
    def train_step(ws, x, y): ...

As defaults for pipelined steps compiled afterwards (the performance guide's
7.7; an explicit argument of `pipeline.run` or `@schedule` wins):

    schedule.all_reduce_overlap(True)   # gradient sync overlaps with compute
    schedule.pipeline_microbatches(8)   # microbatches of pipelined steps

`@schedule(...)` takes a function (compiling it as `ts.jit` does, or as
`pipeline.run` does with `pipeline=True`) or a compiled one (`ts.jit`,
`tessera.compile`, `pipeline.run`), in either decorator order, and returns
the compiled step with its settings; `step.schedule_settings` shows them.
The settings:

- `pipeline` (bool): True compiles the step as a pipeline over the `pp` axis
  of its mesh (`pipeline.run`; without a mesh, `pp` over every rank); the
  step must call `@graph.stage` functions. False on a step `pipeline.run`
  made is an error.
- `microbatches` (int or "auto"): the pipelined step's microbatch count
  (as `pipeline.run(microbatches=)`); needs a pipelined step.
- `overlap` (bool): whether each collective runs under the compute after it
  (waited where its result is first read) or is waited for where it
  starts. A pipelined step takes either (its `tsched.pipeline` attribute);
  a plain step's collectives always overlap (tessera-lower-to-schedule has
  no switch for it yet), so `overlap=False` there is an error.
- `comm_backend` ("nccl" or "nvshmem"): the transport of each op of the step
  that can choose one and names none (`op.matmul(transport=)`, `op.moe`'s
  exchanges). "nccl": every collective in the collective library (NCCL on
  the GPU, the communicator on the CPU). "nvshmem": every collective the
  compiler can run as an NVSHMEM kernel is one (a matmul's gathered rows or
  scattered partial products, an MoE layer's exchanges), within the
  symmetric-heap budget `TargetOptions.nvshmem_auto_max_bytes`; the others
  stay collectives. That is the ops' `transport="auto"`, plus a
  `ScheduleWarning` where it cannot be honoured: on the CPU target (no
  NVSHMEM kernels), or where none of the step's collectives can move over
  NVSHMEM (each named with the reason).
- `epoch` ("soft"): how an MoE routing epoch ends. Tessera's NVSHMEM
  exchanges always end with a stream-ordered barrier (the kernel's
  `nvshmem_quiet` and per-source signals, `barrier_all` on the stream
  before the next launch), which is what "soft" names, so it is accepted
  and changes nothing; a host-side ("hard") barrier is not implemented and
  is an error.

Unknown settings and wrong value types are errors naming the setting, the
known ones and the decorator's line.

`tessera.schedule` is this module and, for the decorator, callable: its
class is a `ModuleType` subclass with `__call__` (Python allows assigning a
module's `__class__`). One object keeps `import tessera.schedule`,
`from tessera import schedule` and `schedule.all_reduce_overlap(...)`
meaning what they did, where a separate decorator object would make
`tessera.schedule` and `sys.modules["tessera.schedule"]` two things.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import warnings

from tessera_compiler.ir.support import nested_ops
from tessera_mlir.dialects import tgraph

from ._checks import is_int
from ._source import SourceLine, user_frame
from .compiler import CompiledFunction
from .compiler import compile as _compile
from .errors import ArgumentError, TesseraError
from .pipeline import AUTO, PipelinedFunction, defaults
from .pipeline import run as _pipeline_run

__all__ = ["all_reduce_overlap", "pipeline_microbatches", "Settings", "ScheduleError",
           "ScheduleWarning"]


# -- defaults (performance guide 7.7) ------------------------------------------------

def pipeline_microbatches(n: int) -> None:
    """The number of microbatches of pipelined steps that do not say."""
    if not is_int(n) or n < 1:
        raise ArgumentError(f"schedule.pipeline_microbatches: expected a positive int, got "
                            f"{n!r}  [{user_frame()}]")
    defaults.microbatches = n


def all_reduce_overlap(enabled: bool = True) -> None:
    """Whether the collectives of pipelined steps compiled afterwards (the
    gradients' all-reduce over `dp`) overlap the compute after them (the
    default), or each is waited for where it starts. Plain steps always
    overlap (see the module)."""
    defaults.all_reduce_overlap = bool(enabled)


# -- @schedule(...) -------------------------------------------------------------------

class ScheduleError(TesseraError, ValueError):
    """A setting the step cannot honour (names the setting, the step and the line)."""


class ScheduleWarning(UserWarning):
    """A `comm_backend` this compilation cannot honour (the CPU target, or no
    collective of the step that NVSHMEM can carry)."""


COMM_BACKENDS = ("nccl", "nvshmem")
EPOCHS = ("soft",)
#: what each comm_backend sets as the transport of ops that name none:
#: "nvshmem" is op transport "auto" (NVSHMEM wherever a kernel can carry the
#: collective within the symmetric-heap budget); an explicit "nvshmem" on
#: every matmul would be an error at each one that meets no fusable collective.
_OP_TRANSPORT = {"nccl": "nccl", "nvshmem": "auto"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """A step's `@schedule` settings (None: not given); `source` is the
    decorator's line."""
    pipeline: bool | None = None
    microbatches: int | str | None = None
    overlap: bool | None = None
    comm_backend: str | None = None
    epoch: str | None = None
    source: SourceLine | None = dataclasses.field(default=None, compare=False)

    def given(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "source" and getattr(self, f.name) is not None}

    def merged_over(self, older: "Settings | None") -> "Settings":
        """These settings with `older`'s for the ones not given here (an
        outer `@schedule` over an inner one)."""
        if older is None:
            return self
        return dataclasses.replace(older, **self.given(), source=self.source)

    # -- what a compiled step asks of its settings (CompiledFunction calls
    # these on each trace and each lowering)
    def apply(self, module) -> None:
        """The settings' effect on a traced step's Graph IR: `comm_backend`'s
        transport on every op that takes one and names none."""
        if self.comm_backend is not None:
            _default_transports(module, _OP_TRANSPORT[self.comm_backend])

    def check(self, name: str, levels) -> None:
        """A ScheduleWarning (once per step and reason) where
        comm_backend="nvshmem" moves nothing over NVSHMEM in `levels`."""
        if self.comm_backend != "nvshmem":
            return
        if levels.target != "gpu":
            why = (f"the {levels.target.upper()} target has no NVSHMEM kernels: its collectives "
                   "run over the communicator")
        else:
            chosen = [c for c in levels.collectives if c.transport.startswith("nvshmem")]
            if chosen or not levels.collectives:
                return
            why = (f"none of its {len(levels.collectives)} collectives can move over NVSHMEM: "
                   + "; ".join(f"{c.op} over {c.axis} ({c.source}): "
                               + (c.transport or "no NVSHMEM kernel for it")
                               for c in levels.collectives))
        if (name, why) in _WARNED:
            return
        _WARNED.add((name, why))
        src = self.source
        warnings.warn_explicit(f"schedule(comm_backend='nvshmem') on {name}: {why}  [{src}]",
                               ScheduleWarning, src.filename, src.line)


#: (step, reason) of every ScheduleWarning given, so each is given once
_WARNED: set = set()


KNOWN = tuple(f.name for f in dataclasses.fields(Settings) if f.name != "source")


def _check_settings(given: dict, src: SourceLine) -> Settings:
    """`given` as Settings; unknown names, wrong types and values raise."""
    for name in given:
        if name not in KNOWN:
            close = difflib.get_close_matches(name, KNOWN, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ArgumentError(f"schedule(): unknown setting {name!r}{hint}; the settings are "
                                f"{', '.join(KNOWN)}  [{src}]")

    def expect(name, ok: bool, wanted: str, error=ArgumentError):
        if not ok:
            value = given[name]
            raise error(f"schedule(): {name} must be {wanted}, got {value!r} "
                        f"({type(value).__name__})  [{src}]")

    for name in ("pipeline", "overlap"):
        if name in given:
            expect(name, isinstance(given[name], bool), "True or False")
    if "microbatches" in given:
        m = given["microbatches"]
        auto = isinstance(m, str) and m == AUTO
        expect("microbatches", auto or is_int(m),
               f"a count or {AUTO!r}")
        expect("microbatches", auto or m >= 1, f"a positive count or {AUTO!r}")
    for name, known in (("comm_backend", COMM_BACKENDS), ("epoch", EPOCHS)):
        if name in given:
            expect(name, isinstance(given[name], str), f"one of {list(known)}")
    if given.get("comm_backend", COMM_BACKENDS[0]) not in COMM_BACKENDS:
        raise ArgumentError(f"schedule(): comm_backend must be one of {list(COMM_BACKENDS)}, "
                            f"got {given['comm_backend']!r}  [{src}]")
    if given.get("epoch", EPOCHS[0]) not in EPOCHS:
        raise ArgumentError(
            f"schedule(): epoch={given['epoch']!r} is not supported; the one epoch is 'soft': "
            "Tessera ends every MoE routing epoch (an NVSHMEM exchange) with a stream-ordered "
            "barrier (nvshmem_quiet and per-source signals in the kernel, barrier_all on the "
            "stream before the next launch); a host-side barrier after each epoch is not "
            f"implemented  [{src}]")
    return Settings(**given, source=src)


def scheduled(fn, settings: Settings):
    """`fn` (a function or a compiled one) compiled with `settings` applied."""
    src = settings.source
    settings = settings.merged_over(getattr(fn, "schedule_settings", None))
    name = getattr(getattr(fn, "fn", fn), "__name__", "step")
    if not callable(fn):
        raise ArgumentError(f"schedule(): decorates a function or a compiled step, got "
                            f"{type(fn).__name__}  [{src}]")
    pipelined = isinstance(fn, PipelinedFunction)
    if settings.pipeline is False and pipelined:
        raise ScheduleError(f"schedule(pipeline=False): {name} is a pipelined step "
                            f"(pipeline.run); drop pipeline.run or the setting  [{src}]")
    if settings.pipeline and not pipelined:
        step = _as_pipelined(fn)
    elif isinstance(fn, CompiledFunction):
        step = fn
    else:
        step = _compile(fn)
    if isinstance(step, PipelinedFunction):
        if settings.microbatches is not None:
            step.auto_microbatches = settings.microbatches == AUTO
            step.microbatches = None if step.auto_microbatches else settings.microbatches
        if settings.overlap is not None:
            step.overlap = settings.overlap
    else:
        if settings.microbatches is not None:
            raise ScheduleError(f"schedule(microbatches={settings.microbatches!r}): {name} is "
                                f"not a pipelined step; add pipeline=True  [{src}]")
        if settings.overlap is False:
            raise ScheduleError(
                f"schedule(overlap=False): {name} is not a pipelined step, and a plain step's "
                "collectives always overlap the compute after them (tessera-lower-to-schedule "
                "waits for each where its result is first read); overlap=False applies to "
                f"pipelined steps (pipeline=True)  [{src}]")
    step.schedule_settings = settings
    return step


def _as_pipelined(fn) -> PipelinedFunction:
    """`fn` (a function, or a compiled step that is not pipelined) as a
    pipelined step over `pp`, keeping a compiled step's own settings."""
    if not isinstance(fn, CompiledFunction):
        return _pipeline_run(fn)
    step = _pipeline_run(fn.fn, mesh=fn.mesh, deterministic=fn.deterministic, target=fn.target)
    step.strategy, step.dynamic = fn.strategy, fn.dynamic
    step.memory_budget, step.autotune = fn.memory_budget, fn.autotune
    return step


def _default_transports(module, transport: str) -> None:
    """`transport` on every op of `module` that takes one and names none:
    matmuls (whose transport the partitioner hands to the collectives next
    to them) and op.moe's row exchanges (the ragged all_to_alls; the counts'
    all_to_all before them stays a collective, as with op.moe(transport=))."""
    with module.context:
        attr = tgraph.TransportAttr.get(transport)
        for op in nested_ops(module.operation):
            takes = op.name == "tgraph.matmul" or (op.name == "tgraph.all_to_all"
                                                   and len(op.operands) > 1)
            if takes and "transport" not in op.attributes:
                op.attributes["transport"] = attr


class _CallableModule(types.ModuleType):
    """`tessera.schedule`'s class: the module, callable as `@schedule(...)`."""

    def __call__(self, fn=None, /, **settings):
        """`@schedule(pipeline=..., microbatches=..., overlap=..., comm_backend=...,
        epoch=...)` (or `@schedule` bare, or `schedule(fn, ...)`): see the module."""
        checked = _check_settings(settings, user_frame())
        if fn is None:
            return lambda f: scheduled(f, checked)
        return scheduled(fn, checked)


sys.modules[__name__].__class__ = _CallableModule
