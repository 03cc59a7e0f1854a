"""Pipeline parallelism (`tessera.pipeline`, `graph.stage`, `graph.pipeline`).

    @graph.stage("block")                  # every call of a stage function is one stage
    def block(w, x):
        return op.tanh(op.matmul(x, w))

    @pipeline.run(mesh=mesh, axis="pp", schedule="1F1B", microbatches=8)
    def step(ws, x, y):
        def loss_fn(ws):
            h = x
            for w in ws:
                h = block(w, h)
            return op.mean((h - y) * (h - y))
        return ts.value_and_grad(loss_fn)(ws)

The step is traced once per microbatch (its batch arguments split along dim
0), every op tagged with the stage call it belongs to (ops after a stage
call belong to that stage, ops before the first to the first). The
compiler (`tessera-pipeline-schedule`) then places stage call `i` on rank
`i // (n / p)` of the `pp` axis (`i mod p` for the interleaved schedule),
splits each stage's backward into B (its input's gradient) and W (its
weights' gradients), orders every rank's actions by the schedule, and
connects the stages with point-to-point transfers that a static check
proves deadlock-free (`tessera-verify-schedule`). Results are the
microbatches' mean for scalars and gradients, and their concatenation for
per-example outputs; every rank receives them, unless `results="stage"`
keeps each on the stage that made it. `then=` continues the step once on
the combined results (an optimizer update, run where each parameter is).

The batch arguments are every argument but the first (the parameters), or
the only one; `batch=("x", "y")` names them.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
from tessera_compiler.ir.pipeline import (SCHEDULES, balanced_cuts, flops, formula_bubble,
                                          schedule_name, simulate, tag_of)
from tessera_compiler.ir.support import i64, ops_of
from tessera_mlir import ir
from tessera_runtime import env

from . import _dtensor, _trace, simulation
from ._primitives import concat
from .autotune import tune_microbatches
from ._checks import check_callable, is_int
from ._pytree import flatten, unflatten
from ._source import user_frame
from ._trace import Traced, current
from .compiler import CompiledFunction
from .errors import ArgumentError, CompileError, TesseraError

_local = threading.local()
#: microbatches="auto": measured per signature on its first call (tessera.autotune)
AUTO = "auto"


class PipelineError(TesseraError, ValueError):
    """A pipeline that cannot run as written (names the stage and the line)."""


# -- defaults set by tessera.schedule -------------------------------------------------

class _Defaults:
    microbatches: int | None = None
    all_reduce_overlap: bool = True


defaults = _Defaults()


# -- stages ---------------------------------------------------------------------------

class _Tracing:
    """The microbatch being traced and the stage calls made in it so far."""

    def __init__(self, microbatch: int):
        self.microbatch = microbatch
        self.calls: list = []          # (stage name, SourceLine)


def _tracing() -> _Tracing | None:
    return getattr(_local, "tracing", None)


class Stage:
    """A function whose every call (while a pipelined step is traced) is one
    pipeline stage; called anywhere else it is the plain function."""

    def __init__(self, fn, name: str | None = None):
        check_callable("pipeline.Stage", fn)
        if name is not None and not isinstance(name, str):
            raise ArgumentError(f"pipeline.Stage: name={name!r} must be a str or None  "
                                f"[{user_frame()}]")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "stage")

    def __repr__(self) -> str:
        return f"<pipeline stage {self.name!r}>"

    def __call__(self, *args, **kwargs):
        tracing = _tracing()
        if tracing is None or current() is None:
            return self.fn(*args, **kwargs)
        src = user_frame()
        index = len(tracing.calls)
        tracing.calls.append((self.name, src))
        _trace.set_pipeline_tag((index, tracing.microbatch))
        out = self.fn(*args, **kwargs)
        if not any(isinstance(leaf, Traced) for leaf in flatten(out)[0]):
            raise PipelineError(
                f"stage '{self.name}' (stage {index}, called at {src}) returns "
                f"{'nothing' if out is None else type(out).__name__}; a stage must return the "
                "tensors the next stage takes")
        return out


def stage(name=None):
    """`@graph.stage("encoder")`: mark a function as a pipeline stage (also
    `@graph.stage` without a name)."""
    if callable(name):
        return Stage(name)
    if name is not None and not isinstance(name, str):
        raise ArgumentError(f"pipeline.stage: name={name!r} must be a str (or the function "
                            f"itself, as @graph.stage)  [{user_frame()}]")
    return lambda fn: Stage(fn, name)


def compose(stages: int, assign: list):
    """`pipeline.compose(stages=4, assign=[b0, b1, b2, b3])`: makes each
    callable of `assign` a stage, in that list (so a loop over it afterwards
    calls the stages), and returns the list."""
    if not isinstance(assign, list):
        raise ArgumentError(f"pipeline.compose: assign={assign!r:.40} must be a list of the "
                            f"stages' functions  [{user_frame()}]")
    if len(assign) != stages:
        raise PipelineError(f"pipeline.compose(stages={stages}) got {len(assign)} callables to "
                            f"assign  [{user_frame()}]")
    for i, f in enumerate(assign):
        check_callable("pipeline.compose", f, f"assign[{i}]")
    assign[:] = [f if isinstance(f, Stage) else Stage(f, getattr(f, "__name__", f"b{i}"))
                 for i, f in enumerate(assign)]
    return assign


# -- the pipelined step -----------------------------------------------------------------

class Report:
    """What `step.pipeline_report()` returns: `str()` is the rank x time grid
    of actions (`0F3`: chunk 0, forward of microbatch 3; `B` input
    gradient, `W` weight gradient; `.` idle), `.bubble` the idle fraction
    under the cost model, `.peak_activations` per rank (in microbatches),
    and `.formula` = (p-1)/(m+p-1) for comparison."""

    def __init__(self, plan, costs: dict, split_costs: list | None = None):
        self.plan = plan
        self.split_costs = split_costs        # stages=N: each stage's forward cost
        self.schedule = plan.schedule
        self.bubble = plan.bubble
        self.peak_activations = plan.peak_activations()
        self.costs = costs
        self.formula = formula_bubble(plan.ranks, plan.microbatches)

    def __str__(self) -> str:
        head = (f"{self.schedule} pipeline: {self.plan.ranks} ranks, {self.plan.stages} stages, "
                f"{self.plan.microbatches} microbatches; bubble {self.bubble:.1%} "
                f"((p-1)/(m+p-1) = {self.formula:.1%}); peak activations per rank "
                f"{self.peak_activations} microbatches")
        forward = [self.costs.get(("F", s), 0.0) for s in range(self.plan.stages)]
        head += "\nforward cost per stage (flops of microbatch 0): " + " ".join(
            f"{c:.3g}" for c in forward)
        if self.split_costs is not None:
            head += (f" (stages={self.plan.stages} without markers: cut where the cumulative "
                     f"cost crosses k/{self.plan.stages} of the total)")
        return head + "\n" + self.plan.grid()

    __repr__ = __str__


class PipelinedFunction(CompiledFunction):
    """A step compiled as a pipeline over one mesh axis (see the module)."""

    def __init__(self, fn, mesh, axis: str, schedule: str, microbatches: int | None,
                 virtual_stages: int | None, batch, stages: list | None,
                 deterministic=None, target=None, then=None, results: str = "every"):
        name = schedule_name(schedule)
        src = user_frame()
        if name is None:
            raise PipelineError(f"unknown pipeline schedule {schedule!r} for {fn.__name__}; "
                                f"choose one of {list(SCHEDULES)}  [{src}]")
        _check_run_arguments(getattr(fn, "__name__", "step"), mesh, axis, microbatches,
                             virtual_stages, stages, batch, src)
        super().__init__(fn, mesh, numpy_results=False, deterministic=deterministic,
                         target=target)
        self.axis = axis
        self.schedule = name
        #: microbatches="auto": each signature's count is measured on its first call
        self.auto_microbatches = microbatches == AUTO
        self.microbatches = None if self.auto_microbatches else microbatches
        self._tuned_microbatches: dict = {}     # signature key -> the count measured
        self.virtual_stages = virtual_stages
        self.batch = (batch,) if isinstance(batch, str) else tuple(batch) if batch else None
        # stages: the Stage list graph.pipeline declared, or a count to split into
        self.auto_stages = stages if isinstance(stages, int) else None
        self.stages = None if isinstance(stages, int) else stages
        self.split_costs = None
        self.overlap = defaults.all_reduce_overlap
        #: traced once on the microbatches' combined results and the step's
        #: arguments (an optimizer update): its ops run where their operands are
        self.then = then
        #: "every": the results reach every rank; "stage": a result one stage
        #: makes stays on its ranks (single values still reach every rank)
        self.results = results

    # -- tracing ------------------------------------------------------------------
    def _mesh_for(self, leaves):
        mesh = super()._mesh_for(leaves)
        if self.axis not in mesh.axes:
            raise PipelineError(f"{self.fn.__name__}: the pipeline axis '{self.axis}' is not an "
                                f"axis of the {mesh.topology}")
        return mesh

    def _microbatches(self) -> int:
        if self.auto_microbatches and self.microbatches is None:
            when = ("tessera simulate runs nothing to measure: give a count" if
                    simulation.active() else "call it once first (or give a count)")
            raise PipelineError(f"{self.fn.__name__}: microbatches='auto' is chosen by measuring "
                                f"on the step's first call; {when}  [{user_frame()}]")
        m = self.microbatches = self.microbatches or defaults.microbatches
        if m is None:
            raise PipelineError(f"{self.fn.__name__}: say how many microbatches "
                                "(pipeline.run(microbatches=...) or "
                                "@schedule(pipeline=True, microbatches=...), microbatches='auto', "
                                "or schedule.pipeline_microbatches(n))")
        return int(m)

    # -- microbatches="auto" -----------------------------------------------------------
    def _before_call(self, prepared) -> None:
        if not self.auto_microbatches and self.microbatches is None \
                and defaults.microbatches is None \
                and (self.autotune or (self.autotune is None and env.flag("TESSERA_AUTOTUNE"))):
            self.auto_microbatches = True       # autotuning with no count given: measure one
        if self.auto_microbatches:
            key = prepared.key
            if key not in self._tuned_microbatches:
                counts, reference = self._microbatch_counts(prepared)
                self._tuned_microbatches[key] = tune_microbatches(self, prepared, counts,
                                                                  reference)
            self.microbatches = self._tuned_microbatches[key]

    def _microbatch_counts(self, prepared) -> tuple[list, int]:
        """The counts microbatches="auto" measures for these arguments, and
        the reference: the counts dividing each data-parallel rank's rows
        from one per stage rank (p) to 8p (that the schedule takes; the
        interleaved one multiples of p), at most TESSERA_AUTOTUNE_CANDIDATES
        (default 5) spread evenly from p to the largest; a batch of fewer
        rows than p ranks: its largest divisors."""
        bound, mesh = prepared.bound, prepared.mesh
        rows = _local_rows(self.fn.__name__, bound, self._batch_names(list(bound.arguments)),
                           mesh)
        p = mesh.axis_size(self.axis)
        fits = [d for d in range(1, rows + 1) if rows % d == 0 and
                (self.schedule != "interleaved" or d <= p or d % p == 0)]
        counts = [d for d in fits if p <= d <= 8 * p] or fits[-1:]
        budget = max(1, env.integer("TESSERA_AUTOTUNE_CANDIDATES"))
        if len(counts) > budget:
            pick = sorted({round(i * (len(counts) - 1) / max(budget - 1, 1))
                           for i in range(budget)})
            counts = [counts[i] for i in pick]
        return counts, counts[0]

    def _batch_names(self, names) -> list[str]:
        if self.batch is not None:
            unknown = [b for b in self.batch if b not in names]
            if unknown:
                raise PipelineError(f"{self.fn.__name__}: batch= names {unknown}, which are not "
                                    f"parameters of {self.fn.__name__}{self._signature}")
            return list(self.batch)
        return list(names) if len(names) == 1 else list(names)[1:]

    def _trace(self, bound, leaves, specs, mesh):
        m = self._microbatches()
        p = mesh.axis_size(self.axis)
        split = self._split_points(bound, leaves, specs, mesh) if self.auto_stages else None
        traced, calls_per_microbatch = self._trace_microbatches(bound, leaves, specs, mesh, m,
                                                                split)
        calls = calls_per_microbatch[0]
        self._check_stages(calls, calls_per_microbatch, p)
        with traced.module.context:
            f = next(o for o in traced.module.body.operations if o.operation.name == "func.func")
            f.attributes["tgraph.pipeline"] = ir.DictAttr.get({
                "axis": ir.StringAttr.get(self.axis),
                "schedule": ir.StringAttr.get(self.schedule),
                "microbatches": i64(m),
                "stages": i64(len(calls)),
                "overlap": ir.BoolAttr.get(self.overlap),
                "results": ir.StringAttr.get(self.results),
                "names": ir.ArrayAttr.get([ir.StringAttr.get(f"'{n}' (called at {s})")
                                           for n, s in calls]),
            })
        return traced

    def _trace_microbatches(self, bound, leaves, specs, mesh, count: int, split):
        """`self.fn` traced on microbatches 0 .. count-1 (of the step's m),
        each op tagged with its stage call (or, with `split`, the stage of
        its op call) and microbatch, the results combined; returns the
        traced program and each microbatch's stage calls."""
        m = self._microbatches()
        names = list(bound.arguments.keys())
        batch_names = self._batch_names(names)
        fn_name = self.fn.__name__
        calls_per_microbatch = []

        def call(traced):
            it = iter(traced)
            filled = [next(it) if _trace.is_tensor(l) else l for l in leaves]
            structure = flatten(tuple(bound.arguments.values()))[1]
            values = dict(zip(names, unflatten(structure, filled)))
            batch = _batch_size(fn_name, values, batch_names, m)
            blocks = _row_blocks(values, batch_names, mesh)
            results = []
            for j in range(count):
                tracing = _Tracing(j)
                _local.tracing = tracing
                _trace.set_pipeline_tag((None, j))
                try:
                    args = {k: (_split(v, j, m, mesh, fn_name) if k in batch_names else v)
                            for k, v in values.items()}
                    _trace.set_pipeline_tag((0, j))
                    if split is not None:
                        split.count = 0
                        _trace.set_pipeline_split(split)
                    rebound = self._signature.bind_partial()
                    rebound.arguments.update(args)
                    results.append(self.fn(*rebound.args, **rebound.kwargs))
                finally:
                    _local.tracing = None
                    _trace.set_pipeline_tag(None)
                    _trace.set_pipeline_split(None)
                if split is not None:
                    if tracing.calls:
                        raise PipelineError(f"{fn_name}: stages={self.auto_stages} splits a step "
                                            "without stage markers, but it calls @graph.stage "
                                            "functions; use one or the other  "
                                            f"[{tracing.calls[0][1]}]")
                    tracing.calls = [(f"part {k}", user_frame())
                                     for k in range(len(split.cuts or ()))]
                calls_per_microbatch.append(tracing.calls)
            combined = _combine(results, batch // m, blocks)
            if self.then is None:
                return combined
            # Traced once, on the whole batch's results, tagged with no stage:
            # the pipeline pass runs each of its ops on the rank of its
            # operands (a parameter's update where its gradient is).
            whole = self._signature.bind_partial()
            whole.arguments.update(values)
            return self.then(combined, *whole.args, **whole.kwargs)

        traced = super()._trace_with(call, bound, leaves, specs, mesh)
        return traced, calls_per_microbatch

    def _split_points(self, bound, leaves, specs, mesh) -> _trace.StageSplit:
        """Where to cut a step without stage markers into `auto_stages`
        stages: trace microbatch 0 once with every op call its own stage,
        cost each call's forward ops (the pipeline cost model's flops), and
        cut the calls into runs of about equal cost."""
        counting = _trace.StageSplit()
        traced, _ = self._trace_microbatches(bound, leaves, specs, mesh, 1, counting)
        costs = [0.0] * counting.count
        with traced.module.context:
            for f in traced.module.body.operations:
                for op in ops_of(f.operation) if f.operation.name == "func.func" else []:
                    tag = tag_of(op.location)
                    if tag.stage is not None and tag.microbatch == 0 and not tag.backward \
                            and op.name != "tgraph.grad":      # (its backward comes later)
                        costs[tag.stage] += flops(op)
        try:
            cuts = balanced_cuts(costs, self.auto_stages)
        except ValueError as e:
            raise PipelineError(f"{self.fn.__name__}: stages={self.auto_stages}: {e}  "
                                f"[{user_frame()}]") from None
        self.split_costs = [sum(costs[a:b]) for a, b in zip(cuts, cuts[1:] + [len(costs)])]
        return _trace.StageSplit(cuts)

    def _check_stages(self, calls, per_microbatch, p: int) -> None:
        name = self.fn.__name__
        n = len(calls)
        where = f"  [{user_frame()}]"
        if any(len(c) != n for c in per_microbatch):
            raise PipelineError(f"{name} calls its stages a different number of times for "
                                "different microbatches; a pipeline's stages must not depend "
                                "on the data" + where)
        if n == 0:
            raise PipelineError(
                f"{name} calls no pipeline stage: mark the functions each stage runs with "
                "@graph.stage (or pipeline.compose) and call them in the step" + where)
        if self.stages is not None:
            expected = [s.name for s in self.stages]
            got = [c[0] for c in calls]
            if got != expected:
                raise PipelineError(f"{name} was declared with stages {expected} but calls "
                                    f"{got}" + where)
        if n % p:
            raise PipelineError(
                f"{name} calls {n} pipeline stages ({', '.join(f'{c[0]} at {c[1]}' for c in calls)}) "
                f"but the '{self.axis}' axis has {p} ranks: the stages must split evenly over "
                f"the ranks (a multiple of {p} stage calls)" + where)
        m = self.microbatches
        if self.schedule == "interleaved" and m > p and m % p:
            raise PipelineError(f"{name}: the interleaved schedule takes microbatches in groups "
                                f"of the {p} ranks of '{self.axis}'; {m} microbatches is not a "
                                f"multiple of {p}" + where)
        if self.schedule == "interleaved":
            v = self.virtual_stages or n // p
            if v * p != n or v < 2:
                raise PipelineError(
                    f"{name}: the interleaved schedule with virtual_stages={v} on {p} ranks "
                    f"needs {v * p} stage calls (at least 2 per rank), the step makes {n}" + where)
        elif self.virtual_stages not in (None, 1):
            raise PipelineError(f"{name}: virtual_stages={self.virtual_stages} needs "
                                f"schedule='interleaved', not {self.schedule!r}" + where)

    def pipeline_report(self) -> Report:
        """The schedule of the last call: grid, bubble, peak activations
        (computed by the cost model the compiler scheduled with)."""
        if self._last_key is None or self._last_key not in self._programs:
            raise RuntimeError(f"{self.fn.__name__} has not been called yet; call it once, "
                               "then ask for its pipeline_report()")
        program = self._programs[self._last_key][0]
        info = program.bundle.program.pipeline
        if info is None:
            raise CompileError(f"{self.fn.__name__}'s bundle has no pipeline schedule")
        return self.report_of(info)

    def report_of(self, info: dict) -> Report:
        """The Report of a compiled program's pipeline schedule (program.json's
        `pipeline`: schedule, ranks, stages, microbatches, each action's cost)."""
        costs = {(a["kind"], a["stage"]): a["cost"] for a in info["costs"]}
        plan = simulate(info["schedule"], info["ranks"], info["stages"], info["microbatches"],
                        cost=lambda a: costs.get((a.kind, a.stage), 0.0))
        return Report(plan, costs, self.split_costs)


def _local_rows(fn_name, bound, batch_names, mesh) -> int:
    """Rows of the batch each data-parallel replica of the pipeline runs
    (dim 0 of the batch arguments over the mesh axes splitting it)."""
    rows = set()
    for name in batch_names:
        for leaf in flatten(bound.arguments[name])[0]:
            if isinstance(leaf, _dtensor.DTensor) and leaf.ndim:
                blocks = 1
                for axis in leaf.dims[0]:
                    blocks *= mesh.axis_size(axis)
                rows.add(leaf.shape[0] // blocks)
            elif _trace.is_tensor(leaf) and np.ndim(leaf):
                rows.add(np.shape(leaf)[0])
    if len(rows) != 1:
        raise PipelineError(f"{fn_name}: microbatches='auto' needs batch arguments "
                            f"({', '.join(batch_names)}) with one batch size, found "
                            f"{sorted(rows) or 'none'}")
    return rows.pop()


def _batch_size(fn_name, values: dict, batch_names, m: int) -> int:
    sizes = {}
    for name in batch_names:
        for leaf in flatten(values[name])[0]:
            if isinstance(leaf, Traced):
                if not leaf.shape:
                    raise PipelineError(f"{fn_name}: batch argument '{name}' holds a scalar; "
                                        "batch arguments are split along dim 0 into microbatches")
                sizes[name] = leaf.shape[0]
    if not sizes:
        raise PipelineError(f"{fn_name}: no batch tensor to split into microbatches "
                            f"(batch arguments: {batch_names})")
    if len(set(sizes.values())) > 1:
        raise PipelineError(f"{fn_name}: the batch arguments have different batch sizes "
                            f"{sizes}; they are split together along dim 0")
    batch = next(iter(sizes.values()))
    if batch % m:
        raise PipelineError(f"{fn_name}: the batch of {batch} (dim 0 of "
                            f"{', '.join(sizes)}) does not split into {m} microbatches of equal "
                            f"size; choose microbatches dividing {batch}")
    return batch


def _split(value, j: int, m: int, mesh, fn_name: str):
    """Microbatch `j` of `m` of each batch tensor in `value`. A batch split
    over other mesh axes (dp) is cut within each rank's block: microbatch j
    is the j-th slice of every dp block, so each dp replica of the pipeline
    runs its own rows (no gather)."""
    leaves, structure = flatten(value)
    return unflatten(structure, [_microbatch(leaf, j, m, mesh, fn_name)
                                 if isinstance(leaf, Traced) else leaf for leaf in leaves])


def _blocks(x: Traced, mesh) -> int:
    """How many row blocks `x` is split into (over dp, say)."""
    sharding = _trace.declared_sharding(x)
    k = 1
    for axis in sharding.dims[0] if sharding is not None and x.ndim else ():
        k *= mesh.axis_size(axis)
    return k


def _row_blocks(values: dict, batch_names, mesh) -> int:
    return max([_blocks(leaf, mesh) for name in batch_names
                for leaf in flatten(values[name])[0] if isinstance(leaf, Traced)] or [1])


def _microbatch(x: Traced, j: int, m: int, mesh, fn_name: str) -> Traced:
    k = _blocks(x, mesh)
    rows = x.shape[0]
    if rows % (k * m):
        raise PipelineError(f"{fn_name}: a batch of {rows} rows split over {k} data-parallel "
                            f"ranks ({rows // k} each) does not split into {m} microbatches of "
                            f"equal size; choose microbatches dividing {rows // k}")
    size = rows // (k * m)
    if k == 1:
        return x[j * size:(j + 1) * size]
    blocks = x.reshape(k, rows // k, *x.shape[1:])
    return blocks[:, j * size:(j + 1) * size].reshape(k * size, *x.shape[1:])


def _combine(results: list, size: int, blocks: int):
    """One result from the microbatches': gradients and scalars averaged (a
    mean loss over the whole batch and its gradient), per-example outputs
    (leading dimension the microbatch size) concatenated back into batch
    order (within each of the `blocks` row blocks, see _split)."""
    leaves = [flatten(r)[0] for r in results]
    structure = flatten(results[0])[1]
    out = []
    for parts in zip(*leaves):
        first = parts[0]
        if not isinstance(first, Traced):
            out.append(first)
            continue
        is_grad = getattr(first.value.owner, "name", None) == "tgraph.grad"
        if first.shape and first.shape[0] == size and not is_grad:
            if blocks == 1:
                out.append(concat(list(parts), dim=0))
            else:
                rest = tuple(first.shape[1:])
                cut = [x.reshape(blocks, size // blocks, *rest) for x in parts]
                out.append(concat(cut, dim=1).reshape(size * len(parts), *rest))
        else:
            total = parts[0]
            for x in parts[1:]:
                total = total + x
            out.append(total * (1.0 / len(parts)) if len(parts) > 1 else total)
    return unflatten(structure, out)


def _check_run_arguments(name, mesh, axis, microbatches, virtual_stages, stages, batch,
                         src) -> None:
    """pipeline.run's settings, checked where the step is made."""
    if mesh is not None:
        _dtensor.check_mesh("pipeline.run", mesh, src)
    if not isinstance(axis, str):
        raise ArgumentError(f"pipeline.run: axis={axis!r} must be a mesh axis name (a str)  "
                            f"[{src}]")
    if mesh is not None and axis not in mesh.axes:
        raise PipelineError(f"{name}: the pipeline axis {axis!r} is not an axis of the "
                            f"{mesh.topology} (axes: {', '.join(mesh.axes)})  [{src}]")
    if microbatches is not None and microbatches != AUTO and (
            not is_int(microbatches) or microbatches < 1):
        raise PipelineError(f"{name}: microbatches={microbatches!r}: give a count or {AUTO!r} "
                            f"(measured on the first call); a count is an int >= 1  [{src}]")
    for what, value in (("virtual_stages", virtual_stages), ("stages", stages)):
        if value is not None and not (what == "stages" and isinstance(value, list)) and (
                not is_int(value) or value < 1):
            raise PipelineError(f"{name}: {what}={value!r} must be a count (an int >= 1)  "
                                f"[{src}]")
    if batch is not None and not isinstance(batch, str) and not (
            isinstance(batch, (tuple, list)) and all(isinstance(b, str) for b in batch)):
        raise ArgumentError(f"pipeline.run: batch={batch!r} must name the batch arguments (a str "
                            f"or a tuple of strs)  [{src}]")


def run(fn=None, *, mesh=None, axis: str | None = None, mesh_axes=None, schedule: str = "1F1B",
        microbatches: int | str | None = None, virtual_stages: int | None = None, batch=None,
        stages: list | None = None, deterministic: bool | None = None, target=None,
        then=None, results: str = "every"):
    """`@pipeline.run(mesh=mesh, axis="pp", schedule="1F1B", microbatches=8)`:
    compile a step as a pipeline (see the module). `mesh_axes=("pp",)` is the
    collectives guide's spelling of `axis`; without a mesh, one `pp` axis over
    every rank of the job. `schedule`: "gpipe", "1F1B", "interleaved" (with
    `virtual_stages` chunks per rank) or "zero_bubble". `stages=N` on a step
    that calls no @graph.stage function cuts its op calls, in trace order,
    into N runs of about equal forward cost (the pipeline cost model's
    flops); `pipeline_report()` shows each stage's cost. `microbatches="auto"`
    (or none given, with autotuning on: `TESSERA_AUTOTUNE=1`) measures the
    counts dividing the batch from one per stage rank to 8 per rank on the
    first call of each signature, runs the fastest and stores the choice
    (`tessera.autotune`; `tessera autotune --show` lists it): a later
    process with the same step and shapes searches nothing.

    `then(results, *args)`: traced once after the microbatches, on their
    combined results and the step's own arguments (the whole batch); what
    it returns is the step's result. Its ops run on the ranks holding their
    operands: an optimizer update there runs each parameter's update on its
    stage's ranks (a global gradient norm's partial sums travel to one rank
    and its scale back). `results="stage"`: each result that one stage's
    ranks make stays there (a DTensor the other ranks do not hold:
    `DTensor.held`), single values (a loss) reaching every rank as before;
    with `then`, parameters and optimizer state stay with their stage from
    step to step (`"every"`, the default: every result reaches every rank)."""
    if axis is None:
        axis = mesh_axes[0] if mesh_axes else "pp"
    _check_run_arguments("pipeline.run", mesh, axis, microbatches, virtual_stages, stages, batch,
                         user_frame())
    if then is not None:
        check_callable("pipeline.run", then, "then")
    if results not in ("every", "stage"):
        raise ArgumentError(f"pipeline.run: results={results!r} must be 'every' (every rank "
                            f"receives every result) or 'stage' (a stage's results stay on its "
                            f"ranks)  [{user_frame()}]")
    if schedule_name(schedule) is None:
        raise PipelineError(f"unknown pipeline schedule {schedule!r}; choose one of "
                            f"{list(SCHEDULES)}  [{user_frame()}]")

    def wrap(f):                  # (PipelinedFunction refuses an unknown schedule)
        check_callable("pipeline.run", f)
        m = mesh
        if m is None:
            import tessera_runtime
            m = _dtensor.Mesh(axes=[axis], devices=range(tessera_runtime.world()[1]))
        return PipelinedFunction(f, m, axis, schedule, microbatches, virtual_stages, batch,
                                 stages, deterministic=deterministic, target=target, then=then,
                                 results=results)
    return wrap if fn is None else wrap(fn)


def pipeline(stages: list, mesh=None, axis: str = "pp", schedule: str = "1F1B",
             microbatches: int | None = None, **kwargs):
    """`@graph.pipeline(stages=[encoder, decoder], mesh=mesh, axis="pp")`: a
    step whose stage calls must be exactly `stages`, in order."""
    if not isinstance(stages, (list, tuple)):
        raise ArgumentError(f"graph.pipeline: stages={stages!r:.60} must be a list of @graph.stage "
                            f"functions  [{user_frame()}]")
    bad = [s for s in stages if not isinstance(s, Stage)]
    if bad:
        raise PipelineError(f"graph.pipeline(stages=...): {bad[0]!r} is not a @graph.stage "
                            f"function  [{user_frame()}]")
    m = microbatches or defaults.microbatches or len(stages)
    return run(mesh=mesh, axis=axis, schedule=schedule, microbatches=m, stages=list(stages),
               **kwargs)


__all__ = ["run", "compose", "stage", "pipeline", "Stage", "Report", "PipelineError",
           "PipelinedFunction"]
