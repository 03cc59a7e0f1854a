"""`tessera.compile`, `ts.jit`, `ts.function`: trace, lower through every IR
level, bundle, run.

The first call with a given signature (the shapes, dtypes and layouts of the
tensor arguments, and the values of everything else) traces the function,
lowers it, compiles its kernels and writes a bundle; later calls reuse the
loaded program. Execution always goes through the bundle and the runtime,
exactly as a bundle saved with `.save()` runs elsewhere.

Arguments may be nested dicts, lists and tuples (pytrees). Their numpy arrays,
numpy scalars and DTensors are the compiled function's tensor inputs; every
other leaf (numbers, strings, callables such as a `model_fn`) is static: it is
baked into the trace and a different value compiles again.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:             # numpy < 2
    from numpy import byte_bounds

import tessera_runtime
from tessera_runtime import env
from tessera_compiler.bundle import compiler_fingerprint, write_bundle
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.lowering import CompileError as _PipelineError
from tessera_compiler.ir.context import new_context
from tessera_compiler.memory_budget import apply as apply_remat
from tessera_compiler.memory_budget import choose as choose_remat
from tessera_compiler.memory_budget import parse_bytes
from tessera_compiler.lowering import Levels, collective_report, lower, target_options
from tessera_mlir import ir

from . import _dtensor, simulation
from .autotune import tune
from ._checks import check_callable
from ._mpi import barrier, bcast_text, world_comm
from ._pytree import flatten, paths, unflatten
from ._rank_agreement import CHECK_MODES, agree_on_inputs, agree_on_program
from ._source import user_frame
from ._trace import (ArgSpec, MeshFromCapture, autocast_dtype, current, is_tensor,
                     local_inputs, pin_layout, symbol_name, trace_function)
from .errors import ArgumentError, CompileError, ShardingError
from .profiling import profile_from_env
from .types import check_annotations

DUMP_ENV = "TESSERA_DUMP_IR"
#: the default target of compiled functions ("cpu" or "gpu")
TARGET_ENV = "TESSERA_TARGET"
#: Print the collectives a compiled function needs (those of at least this
#: many bytes per rank) with the Python line behind each.
REPORT_ENV = "TESSERA_COLLECTIVE_REPORT"
#: Print each compiled function's memory plan.
MEMORY_ENV = "TESSERA_MEMORY_REPORT"


def _static_key(x):
    if callable(x):
        return ("callable", id(x))
    try:
        hash(x)
        return x
    except TypeError:
        return ("repr", repr(x))


class Prepared(NamedTuple):
    """A call's arguments as a compiled function sees them."""
    bound: inspect.BoundArguments
    #: the argument leaves, arrays laid out by the strategy (if any) as DTensors
    leaves: list
    structure: object
    mesh: _dtensor.Mesh
    #: the tensor leaves (DTensors and arrays), in the program's argument order
    tensors: list
    specs: list
    #: what identifies the compiled program these arguments run
    key: tuple
    #: the argument leaves' paths, and the leaves as the caller passed them
    #: (before the strategy laid them out): what the ranks check they agree on
    names: list
    passed: list

    def agreed(self) -> list:
        """(path, leaf) of each tensor leaf the ranks must agree on (made
        only when they check: not on every call)."""
        return [(n, leaf) for n, leaf in zip(self.names, self.passed) if is_tensor(leaf)]


class CompiledFunction:
    """A function compiled for a mesh. Call it like the Python function.

    With a mesh (`tessera.compile(mesh=...)`), tensor results are DTensors; without
    one (`ts.jit`, `ts.function`) the function runs replicated on every rank and
    tensor results are numpy arrays."""

    def __init__(self, fn, mesh: _dtensor.Mesh | None, numpy_results: bool = False,
                 deterministic: bool | None = None, strategy=None,
                 target: str | TargetOptions | None = None, dynamic=(), memory_budget=None,
                 autotune: bool | None = None):
        _check_arguments(fn, mesh, deterministic, target, autotune)
        functools.update_wrapper(self, fn)
        self.fn = fn
        #: bytes per rank the planned peak must fit (None: no limit); the
        #: compiler chooses which blocks to recompute (tessera_compiler.memory_budget)
        self.memory_budget = None if memory_budget is None else _budget(memory_budget, fn)
        #: the recomputation the memory budget chose at the last compile
        self.remat_choice = None
        self.mesh = mesh
        self.target = target    # a name or TargetOptions; None: TESSERA_TARGET, else "cpu"
        self.numpy_results = numpy_results
        self.deterministic = deterministic     # None: dist.deterministic / env decide
        self.strategy = strategy               # a tessera.strategy.Strategy or None
        self.symbol = symbol_name(fn)          # safe in file names and C symbols
        self._signature = inspect.signature(fn)
        self.dynamic = _dynamic_names(fn, self._signature, dynamic)
        self._annotated = bool(getattr(fn, "__annotations__", None))
        self._programs: dict = {}
        self._names: dict = {}         # argument structure -> its leaves' paths
        self._specs: dict = {}         # call key -> its tensors' ArgSpecs
        self._graph_text: dict = {}    # key -> the traced Graph IR (what the bundle is of)
        self._attention: dict = {}     # key -> how its attention is partitioned (inspect)
        self._plans: dict = {}         # key -> memory plan, once computed
        self._remat_choices: dict = {}  # (program, options, budget) -> memory_budget.Choice
        self._compiled: dict = {}      # (key, options) -> bundle directory
        self._bundles: dict = {}       # key -> the bundle this function runs
        #: measure the options that matter and keep the fastest (tessera.autotune);
        #: None: TESSERA_AUTOTUNE
        self.autotune = autotune
        self._last_key = None
        self._captured_mesh = None     # the mesh of DTensors the function captures
        self._last_layouts = None      # (mesh, ArgSpecs) of the last call
        #: keys whose arguments the ranks compared (_rank_agreement.agree_on_inputs)
        self._inputs_agreed: set = set()
        #: what `@schedule(...)` set (tessera.schedule.Settings): applied to
        #: each trace, checked against each lowering
        self.schedule_settings = None
        #: an op called outside any compiled function (op's eager mode): its
        #: numpy arguments are each rank's own values, not global ones
        self.eager = False

    # -- signature ----------------------------------------------------------
    def _bind(self, args, kwargs):
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"{self.fn.__name__}: {e}  [{user_frame()}]") from None
        bound.apply_defaults()
        for name in self.dynamic:
            # Python numbers of a dynamic argument are 0-d f32 tensors: a new
            # value is new data, not a new program.
            leaves, structure = flatten(bound.arguments[name])
            bound.arguments[name] = unflatten(structure, [
                np.asarray(x, np.float32) if isinstance(x, (int, float)) and
                not isinstance(x, bool) else x for x in leaves])
        return bound

    def _mesh_for(self, leaves) -> _dtensor.Mesh:
        meshes = {a.mesh for a in leaves if isinstance(a, _dtensor.DTensor)}
        if self.mesh is not None:
            meshes.add(self.mesh)
        elif self.strategy is not None and not meshes:
            meshes.add(self.strategy.mesh_for())
        elif self._captured_mesh is not None and not meshes:
            meshes.add(self._captured_mesh)
        if len(meshes) > 1:
            raise ShardingError(f"{self.fn.__name__}: arguments live on different meshes "
                                f"({', '.join(m.topology for m in meshes)})")
        if not meshes:
            # No mesh: replicated over every rank of the job (one rank: one device).
            return _default_mesh()
        return meshes.pop()

    def _prepare(self, args, kwargs) -> "Prepared":
        """What a call's arguments make of this function (see Prepared)."""
        bound = self._bind(args, kwargs)
        if self._annotated:
            check_annotations(self.fn, self._signature, bound.arguments)
        tree = tuple(bound.arguments.values())
        leaves, structure = flatten(tree)
        names = self._names.get(structure)        # (the leaves' paths follow from it)
        if names is None:
            names = self._names[structure] = [n for k, v in bound.arguments.items()
                                              for n in paths(v, k)]
        mesh = self._mesh_for(leaves)
        passed = leaves
        if self.strategy is not None:
            # The strategy lays out the arrays it was given (batch split, state sharded).
            leaves, passed = self.strategy.place_all(names, leaves, mesh)
            self.strategy.check_split(self.fn.__name__, bound.arguments.keys(), leaves)
        # Per tensor leaf: its spec's fields but the name, and the DTensor or
        # (replicated, so also the local value) the array. The key holds
        # plain tuples, its ArgSpecs are made once per key (a dataclass
        # each, made and hashed in Python: too slow to make on every call).
        tensors, metas = [], []
        for leaf in leaves:
            if isinstance(leaf, _dtensor.DTensor):
                tensors.append(leaf)
                metas.append((leaf.shape, leaf.dtype, tuple(leaf.dims), tuple(leaf.layout.partial)))
            elif is_tensor(leaf):
                arr = np.asarray(leaf)
                tensors.append(arr)
                metas.append((arr.shape, arr.dtype, ((),) * arr.ndim, ()))
        static = tuple(_static_key(l) for l in leaves if not is_tensor(l))
        key = (structure, static, tuple(metas), mesh, autocast_dtype(),
               _dtensor.deterministic_enabled(self.deterministic), self._target())
        specs = self._specs.get(key)
        if specs is None:
            tensor_names = [n for n, l in zip(names, leaves)
                            if isinstance(l, _dtensor.DTensor) or is_tensor(l)]
            specs = self._specs[key] = [ArgSpec(n, *m) for n, m in zip(tensor_names, metas)]
        return Prepared(bound, leaves, structure, mesh, tensors, specs, key, names, passed)

    # -- compilation ----------------------------------------------------------
    def _target(self) -> TargetOptions:
        """The options this function compiles with: `target` (a TargetOptions,
        or a target name with the default options), else TESSERA_TARGET,
        else the CPU."""
        return _options(self.target, self.fn.__name__)

    def _trace(self, bound, leaves, specs, mesh):
        def call(traced):
            it = iter(traced)
            filled = [next(it) if is_tensor(l) else l for l in leaves]
            structure = flatten(tuple(bound.arguments.values()))[1]
            values = unflatten(structure, filled)
            rebound = self._signature.bind_partial()
            rebound.arguments.update(zip(bound.arguments.keys(), values))
            out = self.fn(*rebound.args, **rebound.kwargs)
            _refuse_mutated_arguments(self.fn.__name__, bound.arguments.keys(), values,
                                      filled, structure)
            return out
        return self._trace_with(call, bound, leaves, specs, mesh)

    def _trace_with(self, call, bound, leaves, specs, mesh):
        """Graph IR of `call(traced arguments)` (see _trace)."""
        scatter = self.strategy.scatter_axes if self.strategy is not None else ()
        traced = trace_function(self.fn, specs, mesh, call,
                                deterministic=_dtensor.deterministic_enabled(self.deterministic),
                                scatter_axes=scatter, mesh_is_default=mesh is _default_mesh(),
                                remat_candidates=self.memory_budget is not None)
        if self.schedule_settings is not None:
            # Before the bundle's hash is taken from the traced module, so
            # two settings never share a bundle.
            self.schedule_settings.apply(traced.module)
        return traced

    def _prepare_and_trace(self, args, kwargs, prepared=None):
        """`_prepare` (unless given), then the trace: (prepared, traced). A
        function whose mesh nobody chose takes the mesh of the DTensors it
        captures (found while tracing, so it is traced again on that mesh)."""
        prepared = prepared or self._prepare(args, kwargs)
        bound, leaves, mesh, specs = prepared.bound, prepared.leaves, prepared.mesh, prepared.specs
        try:
            return prepared, self._trace(bound, leaves, specs, mesh)
        except MeshFromCapture as found:
            self._captured_mesh = found.mesh
        prepared = self._prepare(args, kwargs)
        bound, leaves, mesh, specs = prepared.bound, prepared.leaves, prepared.mesh, prepared.specs
        return prepared, self._trace(bound, leaves, specs, mesh)

    def lower(self, *args, target: str | TargetOptions | None = None, **kwargs) -> Levels:
        """Every IR level and the kernel sources for these arguments (no
        execution), for the function's own target (its `target=`, else
        TESSERA_TARGET, else "cpu") or `target`: "gpu" keeps matmuls as Tile
        IR GEMMs instead of CPU BLAS calls; a TargetOptions sets every other
        knob too."""
        if target is not None:
            _check_target(target)
        _, traced = self._prepare_and_trace(args, kwargs)
        return self._lower(traced.module, _options(target or self.target, self.fn.__name__))

    def _lower(self, module, target: TargetOptions, plan_only: bool = False) -> Levels:
        with module.context:
            try:
                if self.memory_budget is not None:
                    self._choose_remat(module, target)
                levels = lower(module, target, plan_only=plan_only)
            except _PipelineError as err:
                raise CompileError(f"compiling {self.fn.__name__} failed:\n{err}") from None
        if self.schedule_settings is not None:
            self.schedule_settings.check(self.fn.__name__, levels)
        return levels

    def _choose_remat(self, module, target: TargetOptions) -> None:
        """Sets the recomputation policies that fit the memory budget (once
        per program: memory_report and the call share the choice)."""
        key = (hashlib.sha256(module.operation.get_asm(enable_debug_info=True).encode())
               .hexdigest(), target, self.memory_budget)
        choice = self._remat_choices.get(key)
        if choice is not None:
            apply_remat(module, choice)
        else:
            choice = self._remat_choices[key] = choose_remat(
                module, target, self.memory_budget, _progress if _talks() else None)
            if _talks():
                _progress(choice.describe())
        self.remat_choice = choice

    def memory_report(self, *args, **kwargs):
        """The memory plan (tessera_compiler.memory.MemoryPlan) of this
        function for these arguments (with none: for the last call's):
        each rank's planned peak bytes (`.peak`, `.ranks[r].peak`) and, at
        the peak, the live buffers by category (parameters, gradients,
        optimizer state, activations, communication, inputs, update), the
        largest named with their Python lines. `print()` it for a table.
        Compiles (to Tile IR) without running."""
        if args or kwargs:
            prepared, traced = self._prepare_and_trace(args, kwargs)
            key, module = prepared.key, traced.module
        elif self._last_key is not None:
            key = self._last_key
            if key in self._plans:
                return self._plans[key]
            module = ir.Module.parse(self._graph_text[key], new_context())
        else:
            raise ArgumentError(f"{self.fn.__name__}.memory_report(): pass the arguments "
                                f"(nothing has been compiled yet)  [{user_frame()}]")
        self._plans[key] = self._entry_plan(self._lower(module, self._target(), plan_only=True))
        return self._plans[key]

    def _entry_plan(self, levels: Levels):
        return levels.memory.get(self.symbol) or next(iter(levels.memory.values()))

    def _bundle(self, key, traced, mesh, options: TargetOptions | None = None) -> Path:
        """The bundle of `traced` compiled with `options` (default: the
        function's), compiled now unless it is cached."""
        options = options or self._target()
        if (key, options) in self._compiled:
            return self._compiled[key, options]
        # Locations carry the argument names the bundle records, so they are
        # part of what identifies it.
        text = traced.module.operation.get_asm(enable_debug_info=True)
        self._graph_text[key] = text
        budget = f"memory_budget={self.memory_budget}" if self.memory_budget is not None else ""
        emulated = "emulated" if self._emulated() else ""
        digest = hashlib.sha256((compiler_fingerprint(options) + budget + emulated + text)
                                .encode()).hexdigest()[:20]
        target = env.cache_dir("bundles") / f"{self.symbol}-{digest}.tsb"
        if tessera_runtime.world()[1] > 1:
            self._bundle_on_rank0(key, traced, mesh, target, options)
        else:
            self._write_bundle(key, traced, mesh, target, options)
        self._compiled[key, options] = target
        return target

    def _bundle_on_rank0(self, key, traced, mesh, target: Path, options: TargetOptions) -> None:
        """In a multi-rank job rank 0 compiles while the others wait, then they
        load its bundle (every rank compiling the same program would multiply
        the compile time by the ranks per node). A compile error reaches every
        rank, so none is left waiting in a collective."""
        comm = world_comm()
        failure, error = None, ""
        if comm.Get_rank() == 0:
            try:
                self._write_bundle(key, traced, mesh, target, options)
            except Exception as err:            # every rank must hear of it
                failure = err
                error = str(err) if isinstance(err, CompileError) else \
                    f"rank 0 failed compiling {self.fn.__name__}: {type(err).__name__}: {err}"
        barrier(comm)                           # the others sleep while rank 0 compiles
        error = bcast_text(comm, error, what=f"the compile of {self.fn.__name__} on rank 0")
        if failure is not None:
            raise failure
        if error:
            raise CompileError(error)
        if not (target / "manifest.json").exists():
            self._write_bundle(key, traced, mesh, target, options)   # no shared file system

    @staticmethod
    def _emulated() -> bool:
        """Whether this process runs GPU programs on the CUDA emulator: their
        bundles need no cubin (nvcc took most of an emulated test's time),
        and are cached apart from the bundles a GPU would load."""
        return env.flag("TESSERA_CUDA_EMULATE")

    def _write_bundle(self, key, traced, mesh, target: Path, options: TargetOptions) -> None:
        exists = (target / "manifest.json").exists()
        if exists and not env.get(DUMP_ENV) and not env.is_set(REPORT_ENV) \
                and not env.flag(MEMORY_ENV):
            return
        levels = self._lower(traced.module, options)
        self._plans[key] = self._entry_plan(levels)
        self._attention[key] = levels.attention
        if not exists:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
            write_bundle(tmp / "b", levels, devices=mesh.device_ids,
                         cubin=not self._emulated())
            try:
                os.rename(tmp / "b", target)
            except OSError:
                pass  # another rank wrote the same bundle first
            shutil.rmtree(tmp, ignore_errors=True)
        self._dump(levels)

    def _dump(self, levels: Levels) -> None:
        if env.flag(MEMORY_ENV) and tessera_runtime.world()[0] == 0:
            print("[tessera] " + str(self._entry_plan(levels)), file=sys.stderr)
        threshold = env.raw(REPORT_ENV)
        if threshold is not None and tessera_runtime.world()[0] == 0:
            print("[tessera] " + collective_report(self.fn.__name__, levels.collectives,
                                                   int(threshold or 0)), file=sys.stderr)
        out = env.get(DUMP_ENV)
        if not out or tessera_runtime.world()[0] != 0:
            return
        folder = Path(out) / self.symbol
        folder.mkdir(parents=True, exist_ok=True)
        for stage, text in levels.items():
            ext = {"cpp": "cpp", "cuda": "cu"}.get(stage, "mlir")
            (folder / f"{stage}.{ext}").write_text(text)
        print(f"[tessera] IR of {self.fn.__name__} at every level written to {folder}/",
              file=sys.stderr)

    # -- execution ------------------------------------------------------------
    def _before_call(self, prepared) -> None:
        """Called with each call's `_prepare` result before its program is
        looked up (a pipelined step measures its microbatch count here)."""

    def __call__(self, *args, **kwargs):
        if current() is not None:
            # Called from another function being compiled: inline it.
            check_annotations(self.fn, self._signature, self._bind(args, kwargs).arguments)
            return self.fn(*args, **kwargs)
        if (simulating := simulation.active()) is not None:
            return simulating.call(self, args, kwargs)      # price it, run nothing
        profile_from_env()              # `tessera launch --profile DIR`: from the first call on
        prepared = self._prepare(args, kwargs)
        self._refuse_held(prepared.leaves)
        self._before_call(prepared)
        self._enter_mesh(prepared.mesh)
        entry = self._programs.get(prepared.key)
        if entry is None:
            # (The trace may find the mesh in captured DTensors: a new key.)
            prepared, traced = self._prepare_and_trace(args, kwargs, prepared)
            mesh, key = prepared.mesh, prepared.key
            self._enter_mesh(mesh)
            if tessera_runtime.world()[1] > 1:
                # Before any collective of this program: the ranks must have
                # traced the same one (see _rank_agreement).
                agree_on_program(self.fn.__name__, traced.module, repr(self._target()),
                                 source=str(user_frame()))
            options = self._target()
            if self.autotune or (self.autotune is None and env.flag("TESSERA_AUTOTUNE")):
                options = tune(self, key, traced, mesh, prepared.specs,
                               local_inputs(prepared.tensors, traced))
            path = self._bundles[key] = self._bundle(key, traced, mesh, options)
            program = tessera_runtime.load_bundle(path)
            layouts = []
            for o in program.outputs:
                layout = _dtensor.ShardSpec.from_dims(o.sharding.dims, o.sharding.partial)
                name = f"{self.fn.__name__}.{o.name}"
                layouts.append((layout, not any(o.sharding.dims) and not o.sharding.partial,
                                name, layout.dims_for(len(o.global_shape), mesh, name)))
            entry = self._programs[key] = (program, traced, layouts)
        leaves, mesh, tensors, specs, key = (prepared.leaves, prepared.mesh, prepared.tensors,
                                             prepared.specs, prepared.key)
        program, traced, layouts = entry
        if mesh.size > 1 and (key not in self._inputs_agreed or _check_inputs() == "always"):
            if _check_inputs() != "never":
                captured = list(zip(traced.captured_names, traced.captured))
                inputs = prepared.agreed() + captured
                if self.eager:      # an array is this rank's own value (a DTensor is not)
                    inputs = [(p, leaf) for p, leaf in inputs if isinstance(leaf, _dtensor.DTensor)]
                agree_on_inputs(self.fn.__name__, inputs, mesh, source=str(user_frame()))
            self._inputs_agreed.add(key)
        self._last_layouts = (mesh, specs)
        as_numpy = self.numpy_results and not any(isinstance(l, _dtensor.DTensor) for l in leaves)
        self._last_key = key
        try:
            outputs = program.run(local_inputs(tensors, traced))
        except tessera_runtime.InputError as e:     # (a stage's parameter read by another's rank)
            raise ShardingError(f"{self.fn.__name__}: {e}  [{user_frame()}]") from None
        results, held = [], {}
        for spec, local, (layout, whole, name, dims) in zip(program.outputs, outputs, layouts):
            if spec.on is not None:         # (a pipeline stage's result, results="stage")
                axis, rank = spec.on
                results.append(_dtensor.held_by(local, spec.global_shape, spec.dtype, layout,
                                                mesh, name, axis, (rank,), dims))
                continue
            if as_numpy and whole:
                # The run's own array (an input it returns comes back as a
                # copy, so nothing of the caller's): no DTensor and no copy,
                # unless an earlier result overlaps it (the same buffer
                # returned twice; pieces of one buffer, as a pipeline's
                # results, do not). (A step returns many arrays: copies and
                # DTensors for each are a visible part of a call.)
                owner = id(local if local.base is None else local.base)
                lo, hi = byte_bounds(local)
                spans = held.setdefault(owner, [])
                if any(lo < h and l < hi for l, h in spans):
                    local = local.copy()
                else:
                    spans.append((lo, hi))
                results.append(local)
                continue
            t = _dtensor.DTensor.with_dims(local, spec.global_shape, layout, mesh, name, dims)
            results.append(t.numpy() if as_numpy else t)
        out = unflatten(traced.structure, results)
        return out

    def _refuse_held(self, leaves) -> None:
        """A DTensor that only some ranks of an axis hold (a pipeline
        stage's parameter) is an argument of a step pipelined over that
        axis only: any other program reads every argument on every rank.
        Refused on every rank alike, before anything runs."""
        axis = getattr(self, "axis", None)
        for leaf in leaves:
            if isinstance(leaf, _dtensor.DTensor) and leaf.held is not None \
                    and leaf.held[0] != axis:
                held_axis, ranks = leaf.held
                raise ShardingError(
                    f"{self.fn.__name__}: argument '{leaf.name}' is held by the ranks at "
                    f"{held_axis} = {', '.join(map(str, ranks))} only (a pipeline stage's "
                    f"parameter), but {self.fn.__name__} is not pipelined over '{held_axis}', "
                    f"so every rank would read it: pipeline the step "
                    f"(pipeline.run(axis='{held_axis}')), whose stages read their own "
                    f"parameters  [{user_frame()}]")

    def describe_layouts(self) -> str:
        """How the last call laid out each tensor argument over the mesh
        (what `dist.inspect(fn)` prints): which were split over which axis."""
        if self._last_layouts is None:
            raise RuntimeError(f"{self.fn.__name__} has not been called yet; call it once, "
                               "then inspect it")
        mesh, specs = self._last_layouts
        plan = f", strategy {self.strategy.name}" if self.strategy is not None else ""
        lines = [f"{self.fn.__name__} on the {mesh.topology}{plan}:"]
        width = max((len(s.name) for s in specs), default=0)
        for s in specs:
            split = [f"dim {d} over {' x '.join(axes)}" for d, axes in enumerate(s.dims) if axes]
            split += [f"partial sum over {a}" for a in s.partial]
            lines.append(f"  {s.name:<{width}}  {list(s.shape)} {np.dtype(s.dtype).name}  "
                         + (", ".join(split) or "replicated"))
        attention = self._attention_plans()
        if attention:
            lines.append("attention over a split sequence:")
            lines += [f"  {a}" for a in attention]
        return "\n".join(lines)

    def _attention_plans(self) -> list[str]:
        """How the last call's program partitions each attention over a split
        sequence (`lowering.attention_plans_of`), from its Graph IR (the
        bundle may have come from the cache): Python passes only, no build."""
        key = self._last_key
        if key not in self._attention:          # (this process loaded the bundle)
            module = ir.Module.parse(self._graph_text[key], new_context())
            with module.context:
                try:
                    levels = lower(module, self._target(), until="partitioned")
                except _PipelineError as err:
                    raise CompileError(f"compiling {self.fn.__name__} failed:\n{err}") from None
            self._attention[key] = levels.attention
        return self._attention[key]

    def _enter_mesh(self, mesh: _dtensor.Mesh) -> None:
        """This process must be a device of `mesh`; with several, an error on
        any rank aborts them all (none is left waiting in a collective)."""
        mesh.require_rank(f"calling {self.fn.__name__}")
        if mesh.size > 1:
            _dtensor.install_abort_on_error()

    def build(self, *args, **kwargs) -> tuple[Path, list[np.ndarray]]:
        """Compiles for these arguments without running: the bundle
        directory, and this process' local inputs in the order the program
        takes them, so another machine with only the runtime can run it:
        `tessera_runtime.load_bundle(path).run(inputs)` (e.g. compile on a
        CPU machine, run on a GPU one). `save(path)` then copies the bundle."""
        path, tensors, traced, _ = self._build(args, kwargs)
        return path, local_inputs(tensors, traced)

    def build_for_ranks(self, *args, **kwargs) -> tuple[Path, list[list[np.ndarray]]]:
        """`build` from one process for every rank of the mesh (a job for a
        machine with several GPUs, compiled on one without): the bundle
        directory, and each rank's local inputs. The tensor arguments must
        hold their global values (`dist.from_numpy` outside an MPI job)."""
        path, tensors, traced, mesh = self._build(args, kwargs)
        return path, [local_inputs(tensors, traced, rank) for rank in range(mesh.size)]

    def _build(self, args, kwargs):
        prepared, traced = self._prepare_and_trace(args, kwargs)
        mesh, tensors, key = prepared.mesh, prepared.tensors, prepared.key
        path = self._bundles[key] = self._bundle(key, traced, mesh)
        self._last_key = key
        return path, tensors, traced, mesh

    def save(self, path) -> Path:
        """Copies the bundle of the last call to `path` (a directory)."""
        if self._last_key is None:
            raise RuntimeError(f"{self.fn.__name__} has not been called yet; call it once "
                               "so its signature is known, then save()")
        path = Path(path)
        if path.exists():
            shutil.rmtree(path)
        shutil.copytree(self._bundles[self._last_key], path)
        return path


def _check_inputs() -> str:
    """TESSERA_CHECK_INPUTS: when the ranks compare their arguments."""
    mode = env.get("TESSERA_CHECK_INPUTS", "first")
    if mode not in CHECK_MODES:
        raise ValueError(f"TESSERA_CHECK_INPUTS={mode!r}: expected one of {', '.join(CHECK_MODES)}")
    return mode


def _budget(budget, fn) -> int:
    try:
        return parse_bytes(budget)
    except (ValueError, TypeError) as err:
        raise ArgumentError(f"{getattr(fn, '__name__', 'fn')}: {err}  [{user_frame()}]") from None


def _check_target(target) -> None:
    from tessera_compiler.ir.options import TARGETS
    if not isinstance(target, TargetOptions) and target not in TARGETS:
        raise ArgumentError(f"unknown target {target!r}: target= is one of {', '.join(TARGETS)} "
                            f"or a ts.TargetOptions  [{user_frame()}]")


def _check_arguments(fn, mesh, deterministic, target, autotune) -> None:
    """A compiled function's settings, checked where it is made (not at its
    first call, far from the line that got them wrong)."""
    check_callable("ts.jit", fn)
    if mesh is not None:
        _dtensor.check_mesh(getattr(fn, "__name__", "fn"), mesh)
    for name, value in (("deterministic", deterministic), ("autotune", autotune)):
        if value is not None and not isinstance(value, (bool, np.bool_)):
            raise ArgumentError(f"{getattr(fn, '__name__', 'fn')}: {name}={value!r} must be "
                                f"True, False or None  [{user_frame()}]")
    if target is not None:
        _check_target(target)


def _talks() -> bool:
    """Whether this process reports compile progress (rank 0 does)."""
    return tessera_runtime.world()[0] == 0


def _progress(text: str) -> None:
    print(f"[tessera] {text}", file=sys.stderr, flush=True)


def _refuse_mutated_arguments(name, arg_names, values, leaves, structure) -> None:
    """A compiled function runs on its arguments' values, so an assignment
    into an argument's dict or list (`state["loss_scale"] *= 0.5`) would
    change nothing the caller sees: refuse it at trace time, naming the entry
    and the line that computed the new value."""
    now, now_structure = flatten(tuple(values))
    if now_structure == structure and all(a is b for a, b in zip(now, leaves)):
        return
    before = dict(zip(paths(unflatten(structure, leaves)), leaves))
    after = dict(zip(paths(tuple(values)), now))
    changed = next((p for p in after if p not in before or after[p] is not before[p]), None) \
        or next(p for p in before if p not in after)
    index, _, rest = changed.partition(".")
    shown = list(arg_names)[int(index)] + "".join(
        f"[{k}]" if k.isdigit() else f"[{k!r}]" for k in rest.split(".") if k)
    source = getattr(after.get(changed), "source", None)
    where = f" (the new value is computed at {source})" if source else ""
    raise CompileError(
        f"{name} changes its argument {shown} in place{where}: a compiled function works on "
        "its arguments' values, so the change would be lost. Return the new value instead "
        "(e.g. `return loss, {**state, 'loss_scale': new_scale}`) and keep the returned one.")


def _dynamic_names(fn, signature, dynamic) -> tuple[str, ...]:
    names = (dynamic,) if isinstance(dynamic, str) else tuple(dynamic)
    if not all(isinstance(n, str) for n in names):
        raise ArgumentError(f"{fn.__name__}: dynamic={dynamic!r} must name parameters (strs)  "
                            f"[{user_frame()}]")
    unknown = [n for n in names if n not in signature.parameters]
    if unknown:
        raise ArgumentError(f"{fn.__name__}: dynamic= names {unknown}, which are not parameters "
                            f"of {fn.__name__}{signature}  [{user_frame()}]")
    return names


_RESHARDERS: dict = {}


def reshard(x, layout) -> _dtensor.DTensor:
    """`dist.redistribute` of a DTensor outside a compiled function: `x` in
    `layout`, moved by one small compiled program per (layout, mesh), cached."""
    if not isinstance(layout, _dtensor.ShardSpec):
        raise ArgumentError(f"dist.redistribute: layout is a {type(layout).__name__} "
                            f"({layout!r:.40}), not a dist.ShardSpec  [{user_frame()}]")
    if not isinstance(x, _dtensor.DTensor):
        raise ArgumentError(f"dist.redistribute: x is a {type(x).__name__}, not a DTensor (or a "
                            f"traced tensor inside a compiled function); make one with "
                            f"dist.from_numpy  [{user_frame()}]")
    # The layout must fit before a program is compiled (and run) to move it.
    _dtensor.check_divisible(x.shape, layout.dims_for(x.ndim, x.mesh, x.name or "tensor"),
                             x.mesh, x.name or "tensor", user_frame())
    key = (layout, x.mesh)
    if key not in _RESHARDERS:
        def reshard_program(t):
            return pin_layout(t, layout)
        reshard_program.__name__ = "reshard"
        _RESHARDERS[key] = compile(reshard_program, mesh=x.mesh)
    out = _RESHARDERS[key](x)
    out.name = x.name
    return out


@functools.lru_cache(maxsize=None)
def _default_mesh() -> _dtensor.Mesh:
    return _dtensor.Mesh(axes=["dp"], devices=range(tessera_runtime.world()[1]), name="mesh")


def _options(target, name: str) -> TargetOptions:
    """`target` (a name, TargetOptions or None: TESSERA_TARGET, else "cpu")
    as the TargetOptions a function named `name` compiles with."""
    nodes = env.get("TESSERA_RANKS_PER_NODE")
    try:
        return _resolved_options(target, env.get(TARGET_ENV), nodes)
    except ValueError:
        raise CompileError(f"{name}: TESSERA_RANKS_PER_NODE must be a number of ranks, got "
                           f"{nodes!r}") from None
    except _PipelineError as err:
        raise CompileError(f"{name}: {err} (from {'target=' if target else TARGET_ENV})"
                           ) from None


@functools.lru_cache(maxsize=64)
def _resolved_options(target, env_target: str | None, env_nodes: str | None) -> TargetOptions:
    """`_options` once per (target, TESSERA_TARGET, TESSERA_RANKS_PER_NODE):
    every call of a compiled function asks for its options."""
    options = target_options(target or env_target)
    if not options.ranks_per_node and env_nodes:
        options = options.with_(ranks_per_node=int(env_nodes))
    return options


def compile(fn=None, *, mesh: _dtensor.Mesh | None = None, deterministic: bool | None = None,
            target: str | TargetOptions | None = None, dynamic=(), memory_budget=None,
            autotune: bool | None = None):
    """Compile `fn` for `mesh`. Use as `@tessera.compile(mesh=mesh)` or
    `tessera.compile(fn, mesh=mesh)`. Without a mesh, results are numpy arrays.
    `deterministic=True` fixes every reduction order (see `dist.deterministic`;
    the default follows that context and TESSERA_DETERMINISTIC). `target` is
    "cpu" (the default; or TESSERA_TARGET) or "gpu": CUDA kernels for sm_90a (Hopper)
    run by the `cuda` engine (cupy, NCCL), or emulated on the CPU with
    TESSERA_CUDA_EMULATE=1; or a `ts.TargetOptions` naming one of them and
    any other compilation option (GEMM configurations, wgmma, TMA, ...).
    `dynamic` names arguments whose Python numbers are data (learning rate,
    loss scale): a new value runs the same program instead of compiling
    another (other numbers are baked into the program). `memory_budget`
    (bytes, or a string such as "6GiB") bounds every rank's planned peak:
    the compiler chooses which transformer blocks and `ts.remat(policy="auto")`
    regions to recompute (see `ts.remat`), or fails naming the smallest peak
    it can reach; `fn.memory_report(*args)` shows the plan. `autotune=True`
    (or TESSERA_AUTOTUNE=1) measures, on the first call of each signature,
    the compile options that matter (kernel tile sizes, gradient bucket
    size; GEMM configurations on the GPU) and runs the fastest; the choice
    is cached per architecture, shapes, dtypes and compiler version
    (`tessera autotune --show`; see `tessera.autotune`)."""
    if fn is None:
        return lambda f: compile(f, mesh=mesh, deterministic=deterministic, target=target,
                                 dynamic=dynamic, memory_budget=memory_budget, autotune=autotune)
    if isinstance(fn, CompiledFunction):
        _check_arguments(fn, mesh, deterministic, target, autotune)
        if mesh is not None:
            fn.mesh = mesh
        if deterministic is not None:
            fn.deterministic = deterministic
        if target is not None:
            fn.target = target
        if dynamic:
            fn.dynamic = _dynamic_names(fn.fn, fn._signature, dynamic)
        if memory_budget is not None:
            fn.memory_budget = _budget(memory_budget, fn.fn)
        if autotune is not None:
            fn.autotune = autotune
        return fn
    return CompiledFunction(fn, mesh, numpy_results=mesh is None, deterministic=deterministic,
                            target=target, dynamic=dynamic, memory_budget=memory_budget,
                            autotune=autotune)


#: `ts.jit(step)`, the design docs' training guide's name, and
#: `@ts.function` (with shape-annotated arguments, `ts.Tensor["B", "S", ts.int32]`,
#: checked at every call, as any compiled function's): both `compile`.
jit = compile
function = compile
