"""The local view: per-rank code with explicit collectives (`dist.spmd`,
`@op.kernel`), as JAX's `shard_map` sits beside `jit`.

    @dist.spmd(mesh=mesh, in_specs=(dist.ShardSpec((0,), ("dp",)),))
    def dp_step(x):                        # x: this rank's rows
        grad = op.matmul(x.T, x)
        return dist.all_reduce(grad, axis="dp")

Inside, tensors have their per-rank (block) shapes, `ts.mesh.current()` is
the mesh, `dist.axis_index("dp")` this rank's coordinate as a traced value,
and `dist.all_reduce / all_gather / reduce_scatter / all_to_all / broadcast`
are collectives over one mesh axis. The function is traced once into a
`func.func` marked `tgraph.local` and called by a `tgraph.spmd` op in the
global program, which `tessera-partition` inlines after resharding each input
to its spec: so a local-view function composes with the global view (call
it inside a `ts.jit` function) and runs alone (called on DTensors or arrays,
it compiles a global program around itself).

Results: `out_specs` says how each result's blocks form a global value (a
split: the blocks side by side; `partial=`: they are summands). Without
`out_specs`, a result that is the same on every rank (after an all_reduce,
say) is replicated; one that differs across an axis is an error asking for
its spec, found by following which axes each value varies over.
"""

from __future__ import annotations

import functools

import numpy as np

from tessera_compiler.ir import graph_builder as gb
from tessera_compiler.ir.sharding import Sharding
from tessera_compiler.ir.spmd import new_local_function, returned, varying_axes
from tessera_compiler.ir.support import symbol_of
from tessera_mlir import ir
from tessera_mlir.dialects import func, tgraph

from ._pytree import flatten, unflatten
from ._source import user_frame
from ._trace import (TraceState, Traced, as_traced, current, current_location, element_type,
                     is_tensor, tracing)
from .errors import ShapeError, ShardingError

__all__ = ["spmd", "axis_index"]


class LocalFunction:
    """A per-rank function; see the module docstring."""

    def __init__(self, fn, mesh=None, in_specs=None, out_specs=None):
        functools.update_wrapper(self, fn)
        self.fn, self.mesh, self.in_specs, self.out_specs = fn, mesh, in_specs, out_specs
        self._standalone: dict = {}

    def __call__(self, *args):
        if current() is not None:
            return self._trace_into(current(), args)
        return self._run(args)

    # -- called outside any compiled function: a global program around it ---
    def _run(self, args):
        """A global program that calls this function: its arguments keep
        their layouts (a DTensor's is its in-spec unless in_specs says)."""
        from . import dist
        from .compiler import CompiledFunction
        mesh = self.mesh or next((a.mesh for a in args if isinstance(a, dist.DTensor)), None)
        if mesh not in self._standalone:
            def program(*xs):
                return self(*xs)
            program.__name__ = self.fn.__name__
            self._standalone[mesh] = CompiledFunction(program, mesh, numpy_results=mesh is None)
        return self._standalone[mesh](*args)

    # -- called while tracing a global program ------------------------------
    def _trace_into(self, outer: TraceState, args):
        from . import dist
        if outer.local:
            raise ShardingError(f"{self.fn.__name__}: a local-view function called inside "
                                f"another one  [{user_frame()}]; call its Python function")
        mesh = outer.mesh
        if self.mesh is not None and self.mesh != mesh:
            raise ShardingError(f"{self.fn.__name__} is for the {self.mesh.topology}, but it is "
                                f"called in a function compiled for the {mesh.topology}")
        src = user_frame()
        leaves, arg_structure = flatten(tuple(args))
        is_input = [is_tensor(a) for a in leaves]
        inputs = [as_traced(self.fn.__name__, a, src) for a, t in zip(leaves, is_input) if t]
        if self.in_specs is None:     # each argument's own layout, where it has one
            specs = [_declared_spec(x, outer) for x in inputs]
        else:
            specs = _specs_for(self.in_specs, len(inputs), "in_specs", self.fn.__name__)
        block_types, in_attrs = [], []
        for i, (x, spec) in enumerate(zip(inputs, specs)):
            what = f"{self.fn.__name__} argument #{i}"
            dims = spec.dims_for(x.ndim, mesh, what)
            dist.check_divisible(x.shape, dims, mesh, what, src)
            block_types.append(ir.RankedTensorType.get(list(mesh.info.local_shape(x.shape, dims)),
                                                       element_type(x.dtype)))
            in_attrs.append(Sharding(mesh.name, tuple(dims), tuple(spec.partial)).to_attr())
        body, state, outputs, structure = self._trace_body(
            outer, inputs, block_types, lambda blocks: unflatten(arg_structure, _merge(
                leaves, is_input, blocks)))
        # Tensors the body captured reach it as more inputs, in their layouts.
        for obj, spec in zip([o for o, _ in state.captured], state.capture_specs):
            with current_location(src):
                inputs.append(as_traced(self.fn.__name__, obj, src))
            dims = spec.dims_for(inputs[-1].ndim, mesh, "captured tensor")
            in_attrs.append(Sharding(mesh.name, tuple(dims), tuple(spec.partial)).to_attr())
        axes = varying_axes(body, [_spec_axes(s) for s in specs + state.capture_specs])
        varying = [axes(v) for v in returned(body)]
        out_specs = self._out_specs(outputs, varying, mesh, src)
        result_types, out_attrs = [], []
        for i, (o, spec) in enumerate(zip(outputs, out_specs)):
            dims = spec.dims_for(o.ndim, mesh, f"{self.fn.__name__} result #{i}")
            shape = [n * int(np.prod([mesh.axis_size(a) for a in axes], dtype=np.int64))
                     for n, axes in zip(o.shape, dims)]
            result_types.append(ir.RankedTensorType.get(shape, element_type(o.dtype)))
            out_attrs.append(Sharding(mesh.name, tuple(dims), tuple(spec.partial)).to_attr())
        with current_location(src):
            op = tgraph.SpmdOp(result_types, ir.FlatSymbolRefAttr.get(symbol_of(body)),
                               [x.value for x in inputs], ir.ArrayAttr.get(in_attrs),
                               ir.ArrayAttr.get(out_attrs))
        results = [Traced(r, ir.RankedTensorType(t).shape, o.dtype, src)
                   for r, t, o in zip(op.results, result_types, outputs)]
        return unflatten(structure, results)

    def _trace_body(self, outer: TraceState, inputs, block_types, arguments):
        """The body function: `self.fn` traced on blocks of `inputs` (typed
        `block_types`); `arguments(blocks)` rebuilds its arguments."""
        body = new_local_function(outer.func.operation.parent.regions[0].blocks[0],
                                  f"{symbol_of(outer.func)}_{self.fn.__name__}_local",
                                  block_types, outer.fn_loc, [outer.fn_loc] * len(block_types))
        entry = body.regions[0].blocks[0]
        state = TraceState(body, entry, outer.fn_loc, outer.mesh, local=True)
        with ir.InsertionPoint(entry):
            args = [Traced(v, ir.RankedTensorType(t).shape, x.dtype)
                    for v, t, x in zip(entry.arguments, block_types, inputs)]
            with tracing(state):
                out = self.fn(*arguments(args))
            leaves, structure = flatten(out)
            for i, o in enumerate(leaves):
                if not isinstance(o, Traced):
                    raise ShapeError(f"{self.fn.__name__} must return tensors computed with "
                                     f"tessera ops; result #{i} is a {type(o).__name__}")
            func.ReturnOp([o.value for o in leaves])
        body.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [a.type for a in entry.arguments], [o.value.type for o in leaves]))
        return body, state, leaves, structure

    def _out_specs(self, outputs, varying, mesh, src):
        from . import dist
        given = _specs_for(self.out_specs, len(outputs), "out_specs", self.fn.__name__) \
            if self.out_specs is not None else [None] * len(outputs)
        specs = []
        for i, (spec, axes) in enumerate(zip(given, varying)):
            covered = _spec_axes(spec) if spec is not None else set()
            loose = sorted(set(axes) - covered)
            if loose:
                which = ", ".join(repr(a) for a in loose)
                raise ShardingError(
                    f"{self.fn.__name__} result #{i} differs across mesh axis {which} (it "
                    f"depends on inputs split over it, with no collective over it since), but "
                    + ("out_specs does not say how" if spec is not None else "no out_specs "
                       "says how") + " its blocks form a global value: give out_specs, e.g. "
                    f"dist.ShardSpec((0,), ({loose[0]!r},)) to lay the blocks side by side or "
                    f"dist.ShardSpec(partial=({loose[0]!r},)) for a sum of them, or reduce it "
                    f"with dist.all_reduce(..., axis={loose[0]!r})  [{src}]")
            specs.append(spec or dist.ShardSpec())
        return specs


def spmd(fn=None, *, mesh=None, in_specs=None, out_specs=None):
    """A per-rank function over `mesh` (see the module docstring): each input
    is resharded to its entry of `in_specs` (one ShardSpec per argument, or
    one for all; default: a DTensor argument's own layout) and the function
    runs on the blocks; `out_specs` says how the results' blocks form global
    values (default: replicated, checked)."""
    if fn is None:
        return lambda f: spmd(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    return LocalFunction(fn, mesh, in_specs, out_specs)


def axis_index(axis: str) -> Traced:
    """This rank's coordinate along mesh axis `axis`, inside a local-view
    function (an int32 scalar)."""
    state = _local_state("dist.axis_index")
    src = user_frame()
    n = state.mesh.axis_size(axis)
    with current_location(src):
        coords = gb.iota([n], 0, ir.IntegerType.get_signless(32))
        mine = gb.axis_slice(coords, state.mesh.name, axis, 0, n)
        return Traced(gb.reshape(mine, []), (), np.dtype(np.int32), src)


def collective(kind: str, x: Traced, axis: str, **args) -> Traced:
    """The collective `kind` of `x` over `axis` inside a local-view function."""
    from . import dist
    state = _local_state(f"dist.{kind}")
    src = user_frame()
    mesh = state.mesh
    if axis not in mesh.axes:
        raise ShardingError(f"dist.{kind}: axis {axis!r} is not in the {mesh.topology}  [{src}]")
    n = mesh.axis_size(axis)
    deterministic = dist.deterministic_enabled()
    with current_location(src):
        if kind == "all_reduce":
            value = gb.all_reduce(x.value, args.get("op", "sum"), mesh.name, axis, deterministic)
        elif kind == "broadcast":
            from . import op
            mine = op.where(op.equal(axis_index(axis), np.int32(args["src"])), x,
                            op.mul(x, 0.0))
            return collective("all_reduce", mine, axis)
        else:
            dims = {k: v % max(x.ndim, 1) for k, v in args.items() if k.endswith("dim")}
            cut = dims.get("split_dim", dims.get("dim")) if kind != "all_gather" else None
            if cut is not None and x.shape[cut] % n:
                raise ShapeError(f"dist.{kind}: dimension {cut} of {list(x.shape)} does not "
                                 f"split over axis {axis!r} (size {n})  [{src}]")
            if kind == "all_gather":
                value = gb.all_gather(x.value, mesh.name, axis, dims["dim"], n)
            elif kind == "reduce_scatter":
                value = gb.reduce_scatter(x.value, mesh.name, axis, dims["dim"], n,
                                          deterministic)
            else:
                value = gb.all_to_all(x.value, mesh.name, axis, dims["split_dim"],
                                      dims["concat_dim"], n)
        return Traced(value, ir.RankedTensorType(value.type).shape, x.dtype, src)


def _merge(leaves, is_input, blocks) -> list:
    it = iter(blocks)
    return [next(it) if t else leaf for leaf, t in zip(leaves, is_input)]


def _declared_spec(x: Traced, outer: TraceState):
    """The layout an argument of the compiled function was given (its
    `tgraph.sharding`); replicated for any other value."""
    from . import dist
    value = x.value
    if isinstance(value, ir.BlockArgument) and value.owner == outer.entry:
        attrs = ir.ArrayAttr(outer.func.attributes["arg_attrs"])[value.arg_number]
        sharding = Sharding.from_attr(ir.DictAttr(attrs)["tgraph.sharding"])
        return dist.ShardSpec.from_dims(sharding.dims, sharding.partial)
    return dist.ShardSpec()


def _spec_axes(spec) -> set:
    return set(spec.mesh_axes) | set(spec.partial)


def _specs_for(specs, n: int, what: str, name: str) -> list:
    from . import dist
    if specs is None:
        return [dist.ShardSpec()] * n
    if isinstance(specs, dist.ShardSpec):
        return [specs] * n
    specs = list(specs)
    if len(specs) != n:
        raise ShardingError(f"{name}: {what} has {len(specs)} entries for {n} "
                            f"{'arguments' if what == 'in_specs' else 'results'}")
    return [s or dist.ShardSpec() for s in specs]


def _local_state(what: str) -> TraceState:
    state = current()
    if state is None or not state.local:
        raise ShardingError(f"{what} at {user_frame()} is for per-rank code: call it inside a "
                            "function decorated with @dist.spmd (or @op.kernel)")
    return state
