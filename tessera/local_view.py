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
import hashlib

import numpy as np

from tessera_compiler.ir import graph_builder as gb
from tessera_compiler.ir.sharding import Sharding
from tessera_compiler.ir import p2p
from tessera_compiler.ir.spmd import new_local_function, returned, unique_symbol, varying_axes
from tessera_compiler.ir.locations import source_of
from tessera_compiler.ir.support import symbol_of
from tessera_mlir import ir
from tessera_mlir.dialects import func, tgraph

from . import _dtensor
from ._checks import check_callable, is_int
from ._primitives import equal, mul, where
from ._pytree import flatten, paths, unflatten
from ._rank_agreement import PEER_PLAN
from ._source import user_frame
from ._trace import (TraceState, Traced, as_traced, current, current_location,
                     declared_sharding, element_type, is_tensor, tracing)
from .compiler import CompiledFunction
from .dtypes import as_dtype
from .errors import ArgumentError, CompileError, ShapeError, ShardingError

__all__ = ["spmd", "axis_index", "send", "recv"]


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
        mesh = self.mesh or next((a.mesh for a in args if isinstance(a, _dtensor.DTensor)), None)
        if mesh not in self._standalone:
            def program(*xs):
                return self(*xs)
            program.__name__ = self.fn.__name__
            self._standalone[mesh] = CompiledFunction(program, mesh, numpy_results=mesh is None)
        return self._standalone[mesh](*args)

    # -- called while tracing a global program ------------------------------
    def _trace_into(self, outer: TraceState, args):
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
            specs = [_declared_spec(x) for x in inputs]
        else:
            specs = _specs_for(self.in_specs, len(inputs), "in_specs", self.fn.__name__)
        block_types, in_attrs = [], []
        for i, (x, spec) in enumerate(zip(inputs, specs)):
            what = f"{self.fn.__name__} argument #{i}"
            dims = spec.dims_for(x.ndim, mesh, what)
            _dtensor.check_divisible(x.shape, dims, mesh, what, src)
            block_types.append(ir.RankedTensorType.get(list(mesh.info.local_shape(x.shape, dims)),
                                                       element_type(x.dtype)))
            in_attrs.append(Sharding(mesh.name, tuple(dims), tuple(spec.partial)).to_attr())

        def arguments(blocks):
            return unflatten(arg_structure, _merge(leaves, is_input, blocks))
        try:
            trace = self._trace_body(outer, inputs, block_types, arguments)
        except TypeNotYetKnown as e:
            trace = e.trace
        if trace.body is None or trace.state.read_rank or trace.state.peers:
            # The body may differ by rank: trace every rank's and pair them.
            trace = _every_rank(self, trace, outer, inputs, block_types, arguments,
                                [_spec_axes(s) for s in specs])
        body, state, outputs, structure = trace.body, trace.state, trace.outputs, trace.structure
        # Tensors the body captured reach it as more inputs, in their layouts.
        for obj, spec in zip([o for o, _ in state.captured], state.capture_specs):
            with current_location(src):
                inputs.append(as_traced(self.fn.__name__, obj, src))
            dims = spec.dims_for(inputs[-1].ndim, mesh, "captured tensor")
            in_attrs.append(Sharding(mesh.name, tuple(dims), tuple(spec.partial)).to_attr())
        axes = varying_axes(body, [_spec_axes(s) for s in specs + state.capture_specs])
        axes.known.update(trace.recv_axes)
        varying = [axes(v) | trace.varying.get(i, set()) for i, v in enumerate(returned(body))]
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

    def body_name(self, outer: TraceState) -> str:
        return f"{symbol_of(outer.func)}_{self.fn.__name__}_local"

    def _trace_body(self, outer: TraceState, inputs, block_types, arguments, rank=None,
                    recv_types=None) -> "Trace":
        """The body function: `self.fn` traced on blocks of `inputs` (typed
        `block_types`) for mesh rank `rank` (None: this process');
        `arguments(blocks)` rebuilds its arguments; `recv_types` are the
        types of named recvs that other ranks' programs gave."""
        body = new_local_function(outer.func.operation.parent.regions[0].blocks[0],
                                  self.body_name(outer),
                                  block_types, outer.fn_loc, [outer.fn_loc] * len(block_types))
        entry = body.regions[0].blocks[0]
        state = TraceState(body, entry, outer.fn_loc, outer.mesh, local=True, rank=rank,
                           recv_types=dict(recv_types or {}))
        try:
            with ir.InsertionPoint(entry):
                args = [Traced(v, ir.RankedTensorType(t).shape, x.dtype)
                        for v, t, x in zip(entry.arguments, block_types, inputs)]
                with tracing(state):
                    out = self.fn(*arguments(args))
                leaves, structure = flatten(out)
                for i, o in enumerate(leaves):
                    if not isinstance(o, Traced):
                        raise ShapeError(f"{self.fn.__name__} must return tensors computed "
                                         f"with tessera ops; result #{i} is a {type(o).__name__}")
                func.ReturnOp([o.placeholder if isinstance(o, PendingRecv) else o.value
                               for o in leaves])
        except BaseException as e:
            body.erase()
            if isinstance(e, TypeNotYetKnown):
                e.trace = Trace(None, state, [], None, [])
            raise
        set_body_type(body)
        return Trace(body, state, leaves, structure, paths(out))

    def _out_specs(self, outputs, varying, mesh, src):
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
            specs.append(spec or _dtensor.ShardSpec())
        return specs


def spmd(fn=None, *, mesh=None, in_specs=None, out_specs=None):
    """A per-rank function over `mesh` (see the module docstring): each input
    is resharded to its entry of `in_specs` (one ShardSpec per argument, or
    one for all; default: a DTensor argument's own layout) and the function
    runs on the blocks; `out_specs` says how the results' blocks form global
    values (default: replicated, checked)."""
    if mesh is not None:
        _dtensor.check_mesh("dist.spmd", mesh)
    for what, specs in (("in_specs", in_specs), ("out_specs", out_specs)):
        if specs is not None and not isinstance(specs, (_dtensor.ShardSpec, list, tuple)):
            raise ArgumentError(f"dist.spmd: {what}= is a {type(specs).__name__} "
                                f"({specs!r:.40}); give one dist.ShardSpec for every argument, "
                                f"or a list of them (None: replicated)  [{user_frame()}]")
    if fn is None:
        return lambda f: spmd(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    check_callable("dist.spmd", fn)
    return LocalFunction(fn, mesh, in_specs, out_specs)


def axis_index(axis: str) -> Traced:
    """This rank's coordinate along mesh axis `axis`, inside a local-view
    function (an int32 scalar)."""
    state = _local_state("dist.axis_index")
    src = user_frame()
    if not isinstance(axis, str) or axis not in state.mesh.axes:
        raise ShardingError(f"dist.axis_index: axis {axis!r} is not an axis of the "
                            f"{state.mesh.topology} (axes: {', '.join(state.mesh.axes)})  [{src}]")
    n = state.mesh.axis_size(axis)
    with current_location(src):
        coords = gb.iota([n], 0, ir.IntegerType.get_signless(32))
        mine = gb.axis_slice(coords, state.mesh.name, axis, 0, n)
        return Traced(gb.reshape(mine, []), (), np.dtype(np.int32), src)


def collective(kind: str, x: Traced, axis: str, **args) -> Traced:
    """The collective `kind` of `x` over `axis` inside a local-view function."""
    state = _local_state(f"dist.{kind}")
    src = user_frame()
    mesh = state.mesh
    if axis not in mesh.axes:
        raise ShardingError(f"dist.{kind}: axis {axis!r} is not in the {mesh.topology}  [{src}]")
    n = mesh.axis_size(axis)
    if kind == "all_reduce" and args.get("op", "sum") not in ("sum", "max", "min"):
        raise ArgumentError(f"dist.all_reduce: op must be one of ('sum', 'max', 'min'), got "
                            f"{args['op']!r}  [{src}]")
    if kind == "broadcast" and not (isinstance(args["src"], (int, np.integer))
                                    and 0 <= args["src"] < n):
        raise ArgumentError(f"dist.broadcast: src={args['src']!r} is not a coordinate of axis "
                            f"{axis!r} (0 to {n - 1})  [{src}]")
    for name, d in args.items():
        if name.endswith("dim") and (not is_int(d) or not -x.ndim <= d < max(x.ndim, 1)):
            raise ArgumentError(f"dist.{kind}: {name}={d!r} is not a dimension of the block "
                                f"{list(x.shape)}  [{src}]")
    deterministic = _dtensor.deterministic_enabled()
    with current_location(src):
        if kind == "all_reduce":
            value = gb.all_reduce(x.value, args.get("op", "sum"), mesh.name, axis, deterministic)
        elif kind == "broadcast":
            mine = where(equal(axis_index(axis), np.int32(args["src"])), x, mul(x, 0.0))
            return collective("all_reduce", mine, axis)
        else:
            # all_to_all only, op.moe's exchange: its transport and row counts
            transport, counts = args.pop("transport", None), args.pop("counts", None)
            channels = args.pop("channels", None)
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
                                      dims["concat_dim"], n, transport,
                                      counts and tuple(c.value for c in counts), channels)
        return Traced(value, ir.RankedTensorType(value.type).shape, x.dtype, src)


# -- point-to-point: sends and receives between ranks ----------------------

def send(x, to: int, *, axis: str | None = None, name: str | None = None) -> None:
    """Per-rank code: send this rank's `x` to rank `to` of the mesh (with
    `axis`: the rank whose coordinate along `axis` is `to`, the others as
    this rank's). It pairs, in program order, with a `dist.recv` from this
    rank on `to`; `name` lets the receiver ask for it by name."""
    state = _local_state("dist.send")
    src = user_frame()
    x = as_traced("dist.send", x, src)
    _check_peer(state, to, "to", axis, "dist.send", src)
    axis, coord, peer = _peer(state, to, axis, "dist.send", src)
    with current_location(src):
        op = gb.send(x.value, state.mesh.name, axis, coord)
    state.peers.append(PeerOp("send", peer, name, src, op, x))


def recv(frm: int, name: str | None = None, *, like=None, shape=None, dtype=None,
         axis: str | None = None) -> Traced:
    """Per-rank code: the value rank `frm` sends this rank (see `send`).
    Its type is `like`'s, or `shape` and `dtype`; without them, `name` finds
    it in the sender's program: a value it sends with that `name`, or else
    the result it returns under that key, which it then sends here without
    being told (`ts.distributed.recv_from(owner_rank, param_name)`)."""
    state = _local_state("dist.recv")
    src = user_frame()
    _check_peer(state, frm, "frm", axis, "dist.recv", src)
    if like is not None:
        if not hasattr(like, "shape") or not hasattr(like, "dtype"):
            raise ArgumentError(f"dist.recv: like= is a {type(like).__name__}, not a tensor  "
                                f"[{src}]")
        shape, dtype = like.shape, like.dtype
    if shape is not None:
        if not isinstance(shape, (tuple, list)) or not all(is_int(d) and d >= 0 for d in shape):
            raise ArgumentError(f"dist.recv: shape={shape!r} must be a tuple of sizes (ints "
                                f">= 0)  [{src}]")
        if dtype is None:
            raise ArgumentError(f"dist.recv: shape= needs dtype= too (the received value's "
                                f"element type)  [{src}]")
        dtype = as_dtype(dtype, "dist.recv: dtype")
    elif name is None:
        raise ShapeError(f"dist.recv from rank {frm} at {src}: give the value's type "
                         "(like=, or shape= and dtype=), or the name= its sender uses")
    axis, coord, peer = _peer(state, frm, axis, "dist.recv", src)
    index = sum(1 for p in state.peers if p.kind == "recv")
    if shape is None:
        shape, dtype = state.recv_types.get(index, (None, None))
    pending = shape is None
    dtype = np.dtype(np.float32) if pending else as_dtype(dtype)
    result_type = ir.RankedTensorType.get([] if pending else list(shape), element_type(dtype))
    with current_location(src):
        value = gb.recv(result_type, state.mesh.name, axis, coord)
    state.peers.append(PeerOp("recv", peer, name, src, value.owner.operation, None, pending))
    if pending:
        return PendingRecv(value, frm, name, src)
    return Traced(value, tuple(shape), dtype, src)


class PeerOp:
    """A send or recv of a per-rank body, in trace order: `peer` is the
    other rank (a mesh rank), `traced` what a send sends; a `pending` recv
    waits for its type from the sender's program."""

    def __init__(self, kind, peer, name, source, op, traced=None, pending=False):
        self.kind, self.peer, self.name = kind, peer, name
        self.source, self.op, self.traced, self.pending = source, op, traced, pending


class TypeNotYetKnown(ShapeError):
    """A named recv's value was used before the sender's program gave its
    type (the body is traced again once it has)."""

    def __init__(self, pending: "PendingRecv"):
        super().__init__(
            f"ts.distributed.recv_from({pending.frm}, {pending.name!r}) at {pending.source}: its "
            f"value is used before rank {pending.frm}'s program gives its shape; give it with "
            "like=, or shape= and dtype=")
        self.trace = None


class PendingRecv(Traced):
    """A named recv whose type only the sender's program knows: it may be
    returned, not computed with, until the body is traced again with it."""

    def __init__(self, placeholder: ir.Value, frm: int, name: str, source):
        self.placeholder, self.frm, self.name, self.source = placeholder, frm, name, source

    def _unknown(self):
        raise TypeNotYetKnown(self)

    value = property(lambda self: self._unknown())
    shape = property(lambda self: self._unknown())
    dtype = property(lambda self: self._unknown())


class Trace:
    """One rank's traced body: the function, its trace state, its result
    leaves, their structure and their paths (`weights.wq`)."""

    def __init__(self, body, state, outputs, structure, leaf_paths):
        self.body, self.state, self.outputs = body, state, outputs
        self.structure, self.paths = structure, leaf_paths
        self.error = None
        self.implicit_sends: list = []    # (result index, peer rank)
        self.varying: dict = {}           # result index -> axes it differs along across ranks
        self.recv_axes: dict = {}         # recv result -> axes its value differs along


def set_body_type(body: ir.Operation) -> None:
    block = body.regions[0].blocks[0]
    ret = list(block.operations)[-1]
    body.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [a.type for a in block.arguments], [v.type for v in ret.operands]))


def _check_peer(state: TraceState, peer, param: str, axis, what: str, src) -> None:
    """`peer` (the `param` argument) names a rank of the mesh (with `axis`: a
    coordinate along it); checked before asking which rank traces, so that a
    wrong argument is named wherever the body is traced."""
    mesh = state.mesh
    if not is_int(peer):
        raise ArgumentError(f"{what}: {param}={peer!r} must be a rank (an int)  [{src}]")
    if axis is not None and axis not in mesh.axes:
        raise ShardingError(f"{what}: axis {axis!r} is not in the {mesh.topology}  [{src}]")
    size = mesh.size if axis is None else mesh.axis_size(axis)
    if not 0 <= peer < size:
        which = f"axis {axis!r} (size {size})" if axis is not None else f"the {mesh.topology}"
        raise ShardingError(f"{what}: {peer} is not a rank of {which}  [{src}]")


def _peer(state: TraceState, peer: int, axis: str | None, what: str, src):
    """(axis, coordinate along it, mesh rank) of `peer` as seen by the rank
    `state` traces for (`peer` and `axis` checked by `_check_peer`, or a
    rank of the mesh already: recv_from's implied sends)."""
    mesh = state.mesh
    me = state.rank if state.rank is not None else mesh._job_rank()
    if me is None:
        raise ShardingError(f"{what} at {src}: sends and receives are between the ranks of a "
                            f"running job, and this process is not one of the {mesh.topology}'s "
                            f"ranks; start it with `tessera launch -n {mesh.size}`")
    mine = list(mesh.info.coords(me))
    peer = int(peer)
    if axis is not None:
        coord = peer
        theirs = list(mine)
        theirs[mesh.axes.index(axis)] = coord
        peer = mesh.info.rank_at(theirs)
    else:
        theirs = list(mesh.info.coords(peer))
        differ = [a for a, x, y in zip(mesh.axes, mine, theirs) if x != y]
        if len(differ) > 1:
            raise ShardingError(f"{what}: rank {me} and rank {peer} differ on axes "
                                f"{', '.join(differ)}; a send or recv runs along one mesh axis "
                                f"(give axis=)  [{src}]")
        axis = differ[0] if differ else mesh.axes[0]
        coord = theirs[mesh.axes.index(axis)]
    if peer == me:
        verb = "send to" if what == "dist.send" else "receive from"
        raise ShardingError(f"{what}: rank {me} would {verb} itself  [{src}]")
    return axis, coord, peer


def _trace_for(fn, outer, inputs, block_types, arguments, rank, recv_types) -> Trace:
    """`fn`'s body traced for `rank`; a trace that used a named recv's
    value before its type was known comes back with no body."""
    try:
        return fn._trace_body(outer, inputs, block_types, arguments, rank, recv_types)
    except TypeNotYetKnown as e:
        e.trace.error = e
        return e.trace


def _every_rank(fn, first: Trace, outer, inputs, block_types, arguments, arg_axes) -> Trace:
    """The body of a per-rank function whose code may differ by rank (it
    read the rank, or sends and receives): traced for every rank of the
    mesh, its named recvs typed from their senders' programs, every rank's
    sends, recvs and collectives checked to pair up and finish (the same
    check, with the same verdict, on every rank), and this rank's body
    with the sends other ranks' recv_from asked of it."""
    mesh = outer.mesh
    me = mesh._job_rank()
    if me is None or mesh.size == 1:
        if first.error is not None:
            raise first.error
        return first
    traces = {me: first}
    try:
        for r in range(mesh.size):
            if r != me:
                traces[r] = _trace_for(fn, outer, inputs, block_types, arguments, r, {})
        # Twice at most: again for recvs of values that were themselves received.
        for attempt in range(3):
            types = _resolve(traces, fn.fn.__name__)
            redo = [r for r, t in traces.items()
                    if t.body is None or any(p.pending for p in t.state.peers)]
            if not redo or attempt == 2:
                break
            for r in redo:
                if traces[r].body is not None:
                    traces[r].body.erase()
                traces[r] = _trace_for(fn, outer, inputs, block_types, arguments,
                                       r if r != me else None, types.get(r, {}))
        for t in traces.values():
            if t.error is not None:
                raise t.error
            pending = next((p for p in t.state.peers if p.pending), None)
            if pending is not None:
                raise TypeNotYetKnown(PendingRecv(None, pending.peer, pending.name,
                                                  pending.source))
        _check_names(traces, fn.fn.__name__)
        plan = _check_pairing(traces, mesh, fn.fn.__name__)
        _varying_across_ranks(traces, mesh, arg_axes)
    finally:
        for r, t in traces.items():
            if r != me and t.body is not None:
                t.body.erase()
    own = traces[me]
    # Named as if traced once (the other ranks' bodies took names meanwhile),
    # so every rank's global program calls the same symbol.
    own.body.attributes["sym_name"] = ir.StringAttr.get(unique_symbol(
        own.body.parent.regions[0].blocks[0], fn.body_name(outer), but=own.body))
    own.body.attributes[PEER_PLAN] = ir.StringAttr.get(plan)
    ret = list(own.body.regions[0].blocks[0].operations)[-1]
    for index, peer in own.implicit_sends:
        axis, coord, _ = _peer(own.state, peer, None, "recv_from", own.paths[index])
        with ir.InsertionPoint(ret), ret.location:
            gb.send(own.outputs[index].value, mesh.name, axis, coord)
    return own


def _named_result(trace: Trace, name: str):
    return next((i for i, p in enumerate(trace.paths)
                 if p == name or p.endswith("." + name)), None)


def _resolve(traces: dict, fn_name: str) -> dict:
    """The types of every rank's named recvs, from their senders' programs
    ({rank: {recv index: (shape, dtype)}}); records on each sender the
    results it must send (`implicit_sends`)."""
    types: dict = {}
    for t in traces.values():
        t.implicit_sends = []
    for rank, t in traces.items():
        recvs = [p for p in t.state.peers if p.kind == "recv"]
        for index, p in enumerate(recvs):
            if p.name is None:
                continue
            sender = traces[p.peer]
            explicit = [s for s in sender.state.peers
                        if s.kind == "send" and s.peer == rank and s.name == p.name]
            if explicit:
                x = explicit[0].traced
                types.setdefault(rank, {})[index] = (x.shape, x.dtype)
                continue
            if sender.body is None:
                continue        # its program is traced again first
            leaf = _named_result(sender, p.name)
            if leaf is None:
                returns = ", ".join(sender.paths) or "nothing"
                raise CompileError(
                    f"{fn_name}: ts.distributed.recv_from({p.peer}, {p.name!r}) on rank {rank} "
                    f"at {p.source}: rank {p.peer} neither sends a value named {p.name!r} to "
                    f"it (dist.send(x, {rank}, name={p.name!r})) nor returns one under that "
                    f"key (it returns {returns})")
            out = sender.outputs[leaf]
            if not isinstance(out, PendingRecv):
                types.setdefault(rank, {})[index] = (out.shape, out.dtype)
            sender.implicit_sends.append((leaf, rank))
    return types


def _check_pairing(traces: dict, mesh, fn_name: str) -> str:
    """Raises CompileError unless every rank's sends, recvs and collectives
    pair up and finish (tessera_compiler.ir.p2p); returns the plan, one line
    per rank, for the ranks to agree on."""
    def describe(op) -> str:
        if op.name == "func.return":
            return f"the end of {fn_name}"
        where = source_of(op.location)
        return f"{op.name} at {where}" if where else op.name

    programs = []
    for rank, t in sorted(traces.items()):
        coords = list(mesh.info.coords(rank))

        def peer_rank(op, coords=coords):
            axis = ir.StringAttr(op.attributes["axis"]).value
            other = list(coords)
            other[mesh.axes.index(axis)] = ir.IntegerAttr(
                op.attributes["to" if op.name == "tgraph.send" else "from"]).value
            return mesh.info.rank_at(other)

        extra = [(t.outputs[i].value, peer, f"the send of result {t.paths[i]!r} to rank {peer} "
                  f"(its recv_from)") for i, peer in t.implicit_sends]
        programs.append(p2p.program_of(
            t.body, rank, peer_rank, lambda axis, r=rank: tuple(mesh.info.axis_group(axis, r)),
            describe, extra_sends=extra))
    try:
        p2p.check(programs, mesh.axis_size)
    except p2p.PeerError as e:
        raise CompileError(f"{fn_name}: {e}; nothing ran") from None
    return "\n".join(f"rank {p.rank}: " + ", ".join(
        (f"send to {s.channel[1]}" if s.kind == "send" else f"recv from {s.channel[0]}")
        + f" {s.type} ({s.what})" for s in p.steps
        if isinstance(s, p2p.Start) and s.kind in ("send", "recv")) for p in programs)


def _varying_across_ranks(traces: dict, mesh, arg_axes: list) -> None:
    """Which axes each rank's results differ along: a received value along
    those of the value its sender sent (`recv_axes`, seeds for the body's
    own analysis), and a result along the axes where ranks' programs compute
    it differently (by the ops that make it; a received value stands for
    what its sender sent), so a result that a branch on the rank makes
    differ is not taken for a replicated one."""
    for _ in range(2):          # twice: a value sent may itself have been received
        analyses = {}
        for r, t in traces.items():
            analyses[r] = varying_axes(t.body, arg_axes + [_spec_axes(c) for c in
                                                            t.state.capture_specs])
            analyses[r].known.update(t.recv_axes)
        for r, t in traces.items():
            for p in t.state.peers:
                if p.kind == "recv":
                    t.recv_axes[p.op.results[0]] = set(analyses[p.peer](
                        _sent_value(traces, t, p)))
    prints: dict = {}
    prints.update({r: _Fingerprints(t, traces, prints) for r, t in traces.items()})
    own = next(iter(traces.values()))
    for index in range(len(own.outputs)):
        axes = set()
        for axis in mesh.axes:
            for r in traces:
                group = mesh.info.axis_group(axis, r)
                if len({prints[g].of_result(index) for g in group}) > 1:
                    axes.add(axis)
        for t in traces.values():
            t.varying[index] = axes


class _Fingerprints:
    """A value of one rank's body as the ops that compute it (hash-consed),
    with each recv standing for what its sender sent (read from the
    sender's fingerprints in `prints`, rank -> _Fingerprints, shared so that
    every value is hashed once)."""

    def __init__(self, trace: Trace, traces: dict, prints: dict):
        self.trace, self.traces, self.prints, self.memo = trace, traces, prints, {}
        self.coll_index = {}
        counts: dict = {}
        for op in [o.operation for o in trace.body.regions[0].blocks[0].operations]:
            if op.name in ("tgraph.all_reduce", "tgraph.all_gather"):
                axis = ir.StringAttr(op.attributes["axis"]).value
                counts[axis] = counts.get(axis, -1) + 1
                self.coll_index[op.results[0]] = f"{op.name}#{counts[axis]}@{axis}"

    def of_result(self, index: int) -> str:
        ret = list(self.trace.body.regions[0].blocks[0].operations)[-1]
        return self.of(ret.operands[index])

    def of(self, value) -> str:
        if value in self.memo:
            return self.memo[value]
        if value in self.coll_index:           # the same on every rank of its group
            text = self.coll_index[value]
        elif isinstance(value.owner, ir.Block):
            text = f"arg{value.arg_number}"
        else:
            op = value.owner.operation
            if op.name == "tgraph.recv":        # stands for what was sent
                record = next(p for p in self.trace.state.peers if p.op == op)
                self.memo[value] = self.prints[record.peer].of(
                    _sent_value(self.traces, self.trace, record))
                return self.memo[value]
            attrs = [f"{a}={op.attributes[a]}" for a in op.attributes]
            text = "|".join([op.name, str(value.type)] + attrs +
                            [self.of(v) for v in op.operands])
        self.memo[value] = hashlib.sha1(text.encode()).hexdigest()
        return self.memo[value]


def _sends_to(sender: Trace, rank: int) -> list:
    """(name, value) of what `sender` sends `rank`, in the order it sends
    them: its own sends, then the results other ranks' recv_from asked for."""
    sends = [(s.name, s.traced.value) for s in sender.state.peers
             if s.kind == "send" and s.peer == rank]
    return sends + [(sender.paths[i], sender.outputs[i].value)
                    for i, peer in sender.implicit_sends if peer == rank]


def _sent_value(traces: dict, receiver: Trace, record: PeerOp):
    """The sender's value that `record` (a recv of `receiver`) receives."""
    rank = next(r for r, t in traces.items() if t is receiver)
    from_same = [p for p in receiver.state.peers if p.kind == "recv" and p.peer == record.peer]
    return _sends_to(traces[record.peer], rank)[from_same.index(record)][1]


def _check_names(traces: dict, fn_name: str) -> None:
    """The k-th recv on a rank from a sender pairs with the sender's k-th
    send to it: a named recv must get the value of that name."""
    for rank, t in traces.items():
        for sender in {p.peer for p in t.state.peers if p.kind == "recv"}:
            recvs = [p for p in t.state.peers if p.kind == "recv" and p.peer == sender]
            sends = _sends_to(traces[sender], rank)
            for k, (p, (name, _)) in enumerate(zip(recvs, sends)):
                if p.name is not None and name is not None and \
                        not (name == p.name or name.endswith("." + p.name)):
                    raise CompileError(
                        f"{fn_name}: recv #{k} on rank {rank} from rank {sender} asks for "
                        f"{p.name!r} at {p.source}, but rank {sender}'s send #{k} to it is "
                        f"{name!r} (sends pair with recvs in program order: receive them in "
                        "the order they are sent; values recv_from names are sent after the "
                        "sender's own sends); nothing ran")


def _merge(leaves, is_input, blocks) -> list:
    it = iter(blocks)
    return [next(it) if t else leaf for leaf, t in zip(leaves, is_input)]


def _declared_spec(x: Traced):
    """The layout an argument of the compiled function was given; replicated
    for any other value."""
    sharding = declared_sharding(x)
    if sharding is None:
        return _dtensor.ShardSpec()
    return _dtensor.ShardSpec.from_dims(sharding.dims, sharding.partial)


def _spec_axes(spec) -> set:
    return set(spec.mesh_axes) | set(spec.partial)


def _specs_for(specs, n: int, what: str, name: str) -> list:
    if specs is None:
        return [_dtensor.ShardSpec()] * n
    if isinstance(specs, _dtensor.ShardSpec):
        return [specs] * n
    specs = list(specs)
    if len(specs) != n:
        raise ShardingError(f"{name}: {what} has {len(specs)} entries for {n} "
                            f"{'arguments' if what == 'in_specs' else 'results'}  "
                            f"[{user_frame()}]")
    for i, s in enumerate(specs):
        if s is not None and not isinstance(s, _dtensor.ShardSpec):
            raise ArgumentError(f"{name}: {what}[{i}] is a {type(s).__name__} ({s!r:.40}), not "
                                f"a dist.ShardSpec or None  [{user_frame()}]")
    return [s or _dtensor.ShardSpec() for s in specs]


def _local_state(what: str) -> TraceState:
    state = current()
    if state is None or not state.local:
        raise ShardingError(f"{what} at {user_frame()} is for per-rank code: call it inside a "
                            "function decorated with @dist.spmd (or @op.kernel)")
    return state
