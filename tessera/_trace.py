"""Tracing a Python function into Graph IR.

`trace_function` calls the user's function with `Traced` stand-ins for its
arguments; every `tessera.op` call on them appends a `tgraph` op to a
`func.func` whose arguments carry the arguments' shardings. Each op's location
is the user's source line, and each argument's location is named after the
Python parameter, so diagnostics from any later pass point back at the program.
"""

from __future__ import annotations

import inspect
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from tessera_compiler.ir.context import new_context
from tessera_compiler.ir.pipeline import tag_location
from tessera_compiler.ir.sharding import Sharding
from tessera_compiler.ir.types import ELEMENT_TYPES
from tessera_runtime.errors import in_tessera
from tessera_mlir import ir
from tessera_mlir.dialects import func, tgraph

from . import dtypes
from ._context import set_trace_state, trace_state
from ._dtensor import DTensor, ShardSpec, check_divisible
from ._pytree import flatten
from ._source import SourceLine, user_frame
from .dtypes import FLOATS, SUPPORTED_DTYPES, as_dtype, bf16
from .errors import ArgumentError, ShapeError, ShardingError, TracingError

# numpy dtype -> MLIR element type (bfloat16 is ml_dtypes').
_ELEMENT = {as_dtype(numpy_name): mlir_name for mlir_name, numpy_name in ELEMENT_TYPES.items()}
#: the dtypes a tensor may have, for errors

_state = threading.local()


def element_type(dtype: np.dtype) -> ir.Type:
    dtype = np.dtype(dtype)
    if dtype not in _ELEMENT:
        raise ArgumentError(f"dtype {dtype} is not supported yet (supported: "
                            f"{SUPPORTED_DTYPES})  [{user_frame()}]")
    return ir.Type.parse(_ELEMENT[dtype])


@dataclass(frozen=True)
class ArgSpec:
    """What tracing needs to know about one argument."""
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()


class Traced:
    """A tensor inside a function being traced: a Graph IR value, its shape and
    dtype. Supports the arithmetic operators, `@`, `.reshape`, `.transpose`,
    `.T`, `.sum/.mean/.max` and `.astype` like a numpy array."""

    __array_priority__ = 1000   # `np_scalar * traced` defers to Traced

    def __init__(self, value: ir.Value, shape, dtype, source: SourceLine | None = None):
        self.value = value
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.source = source

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __repr__(self) -> str:
        return f"Traced(shape={self.shape}, dtype={self.dtype})"

    # A traced tensor has no value until the program runs, so everything that
    # asks Python for one (a branch, a number, an index) is an error at the
    # user's line, and every comparison (`==` and `!=` included) is traced:
    # Python's default `==` would compare identities and answer False, so an
    # `if op.sum(x) == 6.0:` would be silently never taken.
    def __bool__(self): raise no_value(self, "bool")
    def __int__(self): raise no_value(self, "int")
    def __float__(self): raise no_value(self, "float")
    def __complex__(self): raise no_value(self, "complex")
    def __index__(self): raise no_value(self, "index")
    def __array__(self, *args, **kwargs): raise no_value(self, "array")

    # `==` builds a comparison, so a traced tensor cannot be a dict key or
    # set member by equality (numpy arrays and JAX tracers are unhashable for
    # the same reason); code that needs identity keys on id(x).
    __hash__ = None

    # Operators: the op functions check shapes and name the caller's line.
    def __add__(self, o): return _op().add(self, o)
    def __radd__(self, o): return _op().add(o, self)
    def __sub__(self, o): return _op().sub(self, o)
    def __rsub__(self, o): return _op().sub(o, self)
    def __mul__(self, o): return _op().mul(self, o)
    def __rmul__(self, o): return _op().mul(o, self)
    def __truediv__(self, o): return _op().div(self, o)
    def __rtruediv__(self, o): return _op().div(o, self)
    def __neg__(self): return _op().neg(self)
    def __pow__(self, p): return _op().pow(self, p)
    def __rpow__(self, b): return _op().pow(b, self)
    def __abs__(self): return _op().abs(self)
    def __matmul__(self, o): return _op().matmul(self, o)
    def __rmatmul__(self, o): return _op().matmul(o, self)
    def __lt__(self, o): return _op().less(self, o)
    def __le__(self, o): return _op().less_equal(self, o)
    def __gt__(self, o): return _op().greater(self, o)
    def __ge__(self, o): return _op().greater_equal(self, o)

    def __eq__(self, o):
        # Not a tensor or a number (None, a string): not equal, as numpy says.
        return _op().equal(self, o) if _comparable(o) else NotImplemented

    def __ne__(self, o):
        return _op().not_equal(self, o) if _comparable(o) else NotImplemented

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of a 0-d traced tensor  [{user_frame()}]")
        return self.shape[0]

    def __iter__(self):
        """Rows along the first dimension, as iterating a numpy array gives."""
        if not self.shape:
            raise TypeError(f"iteration over a 0-d traced tensor  [{user_frame()}]")
        return (self[i] for i in range(self.shape[0]))

    def reshape(self, *shape): return _op().reshape(self, *shape)
    def transpose(self, *dims): return _op().transpose(self, *dims)
    def astype(self, dtype): return _op().cast(self, dtype)
    def sum(self, *args, **kwargs): return _op().sum(self, *args, **kwargs)
    def mean(self, *args, **kwargs): return _op().mean(self, *args, **kwargs)
    def max(self, *args, **kwargs): return _op().max(self, *args, **kwargs)

    @property
    def T(self): return _op().transpose(self)

    def __getitem__(self, index): return _op().index(self, index)


def _op():
    # A back edge (see test/test_layers.py): a traced tensor's operators
    # (a + b, a @ b, a[i]) are the op primitives, which build on Traced.
    from . import _primitives
    return _primitives


def _comparable(x) -> bool:
    return isinstance(x, (bool, int, float)) or is_tensor(x)


#: what each conversion of a traced tensor is called in its error
_CONVERSIONS = {"bool": "bool() (an `if`, `while`, `and`, `or`, `not` or assert on it)",
                "int": "int()", "float": "float()", "complex": "complex()",
                "index": "an integer index (range(), a list index, a slice bound)",
                "array": "a numpy array (np.asarray() or a numpy function)"}


def no_value(x: "Traced", conversion: str) -> Exception:
    """The error of asking a traced tensor for a concrete value (`conversion`
    names how): at the user's line, with what to write instead."""
    src = user_frame()
    state = current()
    where = "the function is being compiled"
    if state is not None:
        where = f"{ir.StringAttr(state.func.attributes['sym_name']).value} is being compiled"
    text = (f"{_CONVERSIONS[conversion]} of a traced tensor ({list(x.shape)} "
            f"{x.dtype.name}): it has no value while {where}, only when the compiled "
            "program runs. ")
    if conversion == "bool":
        text += ("Select values with ts.where(cond, a, b) instead of branching on them "
                 "(comparisons such as `x == 0` are traced tensors)")
        if state is not None and state.local:
            text += ("; in per-rank code, branch on the rank with a Python number: "
                     "ts.mesh.current().coords[axis] (dist.axis_index is a traced tensor)")
    elif conversion == "array":
        text += "Use tessera ops (op.exp, op.sum, ...) on it, or return it and use the result"
    else:
        text += "Return it from the compiled function and read the result"
    return TracingError(f"{text}  [{src}]")


@dataclass
class TraceState:
    """What the function being traced has built so far."""
    func: object
    entry: ir.Block
    fn_loc: ir.Location
    mesh: object
    captured: list = field(default_factory=list)     # (object, Traced), in argument order
    #: the mesh was not chosen (no mesh=, no DTensor argument): a captured
    #: DTensor may supply it (see MeshFromCapture)
    mesh_is_default: bool = False
    #: tracing a local-view (per-rank) body: values have block shapes and
    #: collectives are explicit (see local_view)
    local: bool = False
    #: in a local body, the layout of each captured tensor (its block is passed)
    capture_specs: list = field(default_factory=list)
    #: in a local body: the mesh rank it is traced for (None: this process'),
    #: whether its Python code read the rank, its sends and recvs in order
    #: (see local_view.PeerOp), and the types of named recvs found so far
    rank: int | None = None
    read_rank: bool = False
    peers: list = field(default_factory=list)
    recv_types: dict = field(default_factory=dict)
    #: recomputation regions marked so far (see tessera.remat), and whether
    #: unmarked candidates (`remat="auto"`, transformer blocks) become regions
    #: for the memory budget to choose from
    remat_regions: int = 0
    remat_candidates: bool = False


def declared_sharding(x: Traced):
    """The layout `x` was given as an argument of the function being traced
    (its `tgraph.sharding`), or None for any other value."""
    from tessera_compiler.ir.sharding import Sharding
    state = current()
    value = x.value
    if state is not None and isinstance(value, ir.BlockArgument) and value.owner == state.entry \
            and "arg_attrs" in state.func.attributes:
        attrs = ir.DictAttr(ir.ArrayAttr(state.func.attributes["arg_attrs"])[value.arg_number])
        if "tgraph.sharding" in attrs:
            return Sharding.from_attr(attrs["tgraph.sharding"])
    return None


class MeshFromCapture(Exception):
    """Raised while tracing a function whose mesh nobody chose when it uses a
    DTensor it captured (a closure): trace again on that tensor's mesh."""

    def __init__(self, mesh):
        super().__init__(f"trace again on {mesh}")
        self.mesh = mesh


def current() -> TraceState | None:
    return trace_state()


def autocast_dtype() -> np.dtype | None:
    """The dtype matmuls compute in under `ts.autocast`, or None."""
    stack = getattr(_state, "autocast", None)
    return stack[-1] if stack else None


class autocast:
    """`with ts.autocast(dtype=ts.bf16):` matmuls inside (traced or called)
    compute in `dtype` with fp32 accumulation; norms, softmax and losses stay
    in fp32; weights and gradients keep their own dtype."""

    def __init__(self, dtype=None, enabled: bool = True):
        self.dtype = as_dtype(dtype, "ts.autocast: dtype") if dtype is not None else bf16
        if self.dtype not in FLOATS:
            raise ArgumentError(f"ts.autocast: dtype {self.dtype} is not a floating-point type "
                                f"(ts.bf16, ts.f16, ts.f32)  [{user_frame()}]")
        self.enabled = enabled

    def __enter__(self):
        if not hasattr(_state, "autocast"):
            _state.autocast = []
        _state.autocast.append(self.dtype if self.enabled else None)
        return self

    def __exit__(self, *exc):
        _state.autocast.pop()
        return False


def current_location(src: SourceLine | None = None) -> ir.Location:
    """The location of an op traced now: the user's line, tagged with the
    pipeline stage call and microbatch while a pipelined step is traced."""
    src = src or user_frame()
    loc = ir.Location.file(src.filename, src.line, 0)
    tag = getattr(_state, "pipeline_tag", None)
    split = getattr(_state, "pipeline_split", None)
    if tag is not None and tag[0] is not None and split is not None:
        tag = (split.next_stage(), tag[1])
    return tag_location(loc, *tag) if tag is not None else loc


def set_pipeline_tag(tag: tuple | None) -> None:
    """(stage call, microbatch) of the ops traced from now on (either may be
    None), or None outside a pipelined step (see tessera.pipeline)."""
    _state.pipeline_tag = tag


class StageSplit:
    """Stages without markers (`pipeline.run(stages=N)`): the op calls of a
    microbatch, counted in trace order, each get stage k from `cuts[k]` on;
    with no cuts, each call is its own stage (to measure their costs)."""

    def __init__(self, cuts: list | None = None):
        self.cuts, self.count = cuts, 0

    def next_stage(self) -> int:
        i, self.count = self.count, self.count + 1
        if self.cuts is None:
            return i
        return sum(1 for c in self.cuts[1:] if c <= i)


def set_pipeline_split(split: StageSplit | None) -> None:
    _state.pipeline_split = split


def local_inputs(tensors, traced, rank: int | None = None) -> list[np.ndarray]:
    """What the program takes: this rank's (or `rank`'s) block of each tensor
    argument, then the constants the trace captured."""
    def block(t):
        return t.local() if rank is None else t.block(rank)
    return [block(t) if isinstance(t, DTensor) else np.asarray(t)
            for t in list(tensors) + list(traced.captured)]


def pin_layout(x: Traced, layout) -> Traced:
    """`dist.redistribute` inside a compiled function (global view): `x`
    with its layout pinned (a tgraph.shard op); the partitioner inserts the
    collectives, as JAX's with_sharding_constraint."""
    if not isinstance(layout, ShardSpec):
        raise ArgumentError(f"dist.redistribute: layout is a {type(layout).__name__} "
                            f"({layout!r:.40}), not a dist.ShardSpec  [{user_frame()}]")
    state = current()
    dims = layout.dims_for(x.ndim, state.mesh, getattr(x, "name", None) or "tensor")
    where = user_frame()
    check_divisible(x.shape, dims, state.mesh, "dist.redistribute", where)
    with current_location(where):
        attr = Sharding(state.mesh.name, dims, layout.partial).to_attr()
        value = tgraph.ShardOp(x.value, attr).result
    return Traced(value, x.shape, x.dtype, where)


def capture(obj, src: SourceLine) -> Traced:
    """A concrete tensor (numpy array or DTensor) used inside a traced function
    becomes an extra argument of the compiled function (like a closure)."""
    state = current()
    for held, traced in state.captured:
        if held is obj:
            return traced
    if isinstance(obj, DTensor):
        shape, dtype, dims, partial = obj.shape, obj.dtype, tuple(obj.dims), tuple(obj.layout.partial)
        name = obj.name
        if obj.mesh != state.mesh:
            if state.mesh_is_default:
                raise MeshFromCapture(obj.mesh)
            raise ShardingError(
                f"{_variable_name(obj) or name} (used at {src}) is a DTensor on the "
                f"{obj.mesh.topology}, but {ir.StringAttr(state.func.attributes['sym_name']).value} "
                f"is compiled for the {state.mesh.topology}; make it on that mesh, or compile "
                "for its mesh (mesh=)")
    else:
        arr = np.asarray(obj)
        shape, dtype, dims, partial = arr.shape, arr.dtype, tuple(() for _ in arr.shape), ()
        name = None
    name = name or _variable_name(obj) or f"captured{len(state.captured)}"
    if any(t.name == name for _, t in state.captured):
        name = f"{name}_{len(state.captured)}"      # (two arrays the code calls `w`)
    if state.local:
        # A per-rank body sees a captured DTensor's block, in its layout.
        spec = obj.layout if isinstance(obj, DTensor) else ShardSpec()
        shape = state.mesh.info.local_shape(shape, dims)
        state.capture_specs.append(spec)
    t = ir.RankedTensorType.get(list(shape), element_type(dtype))
    arg = state.entry.add_argument(t, ir.Location.name(name, childLoc=state.fn_loc))
    if not state.local:
        attrs = list(ir.ArrayAttr(state.func.attributes["arg_attrs"]))
        attrs.append(ir.DictAttr.get(
            {"tgraph.sharding": Sharding(state.mesh.name, dims, partial).to_attr()}))
        state.func.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)
    else:
        state.func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [a.type for a in state.entry.arguments], []))
    traced = Traced(arg, shape, dtype, src)
    traced.name = name
    state.captured.append((obj, traced))
    return traced


def is_tensor(x) -> bool:
    """Whether a leaf of a function's arguments is a tensor (a numpy array or
    scalar, a DTensor, a traced tensor) rather than static data."""
    return isinstance(x, (Traced, np.ndarray, np.generic, DTensor))


def as_traced(what: str, x, src: SourceLine, like: Traced | None = None) -> Traced:
    """`x` as a tensor of the function being traced: a traced tensor as is, a
    Python number as a constant of `like`'s dtype (f32 if none), a numpy
    array or DTensor captured as an input. `what` names the caller in errors."""
    from tessera_compiler.ir import graph_builder as gb

    if isinstance(x, Traced):
        return x
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.ndarray):
        dtype = like.dtype if like is not None else dtypes.f32
        if isinstance(x, float) and not dtypes.is_float(dtype):
            dtype = dtypes.f32
        with current_location(src):
            return Traced(gb.fill([], element_type(dtype), float(x)), (), dtype, src)
    if isinstance(x, (np.ndarray, np.generic, DTensor)):
        with current_location(src):
            return capture(x, src)
    raise not_a_tensor(what, x, src)


def not_a_tensor(what: str, x, src: SourceLine) -> Exception:
    """The error of passing `x` (a string, None, a list, ...) where `what`
    takes a tensor: it names the API the user called and the parameter that
    holds `x` (`op.layernorm: weight is a str, ...`), found on the stack."""
    found = _parameter_holding(x)
    head = what.split(" ")[0]
    if found is not None:
        module = head.rpartition(".")[0]
        api = f"{module}.{found[0]}" if module else head
        return ArgumentError(f"{api}: {found[1]} is a {type(x).__name__} ({_short(x)}), not a "
                             "tensor (a numpy array, a DTensor, a traced tensor or a Python "
                             f"number)  [{src}]")
    return ArgumentError(f"{what}: cannot use a {type(x).__name__} ({_short(x)}) as a tensor "
                         f"(a numpy array, a DTensor, a traced tensor or a Python number)  [{src}]")


def _short(x) -> str:
    import reprlib
    return reprlib.repr(x)


def _parameter_holding(x) -> tuple[str, str] | None:
    """(function, parameter) of the outermost public API function on the
    stack (one its module's `__all__` names, below the user's frame) one of
    whose parameters is `x`: the API the user called and the argument they
    passed `x` as (`linear`'s `w`, not the `matmul` it calls). Only on the
    error path."""
    frame = inspect.currentframe().f_back
    found = None
    while frame is not None and in_tessera(frame):
        code = frame.f_code
        if code.co_name in frame.f_globals.get("__all__", ()):
            for p in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
                if frame.f_locals.get(p) is x:
                    found = (code.co_name, p)
                    break
        frame = frame.f_back
    return found


@contextmanager
def tracing(state: TraceState):
    """Records ops into `state` (a nested function, such as a per-rank body)
    inside the block, then returns to the trace that was current."""
    previous = set_trace_state(state)
    try:
        yield state
    finally:
        set_trace_state(previous)


def _variable_name(obj) -> str | None:
    """The name the user's code refers to `obj` by (for gradient dicts and
    argument names), found in the innermost user frame."""
    frame = inspect.currentframe()
    while frame is not None and in_tessera(frame):
        frame = frame.f_back
    if frame is None:
        return None
    for scope in (frame.f_locals, frame.f_globals):
        for key, value in scope.items():
            if value is obj and not key.startswith("_"):
                return key
    return None


def symbol_name(fn) -> str:
    """A C- and MLIR-safe symbol for a Python function (`<lambda>` -> `lambda`);
    it prefixes kernel names, which become C symbols."""
    name = re.sub(r"[^A-Za-z0-9_]", "", getattr(fn, "__name__", "fn")) or "fn"
    return name if not name[0].isdigit() else f"fn_{name}"


def function_source(fn) -> SourceLine:
    try:
        return SourceLine(inspect.getsourcefile(fn) or "<unknown>", inspect.getsourcelines(fn)[1])
    except (OSError, TypeError):
        return SourceLine("<unknown>", 0)


@dataclass
class TraceResult:
    module: ir.Module
    outputs: list            # Traced leaves of the result
    structure: object        # pytree structure of the result
    captured: list           # objects captured as extra trailing arguments
    captured_names: list = field(default_factory=list)     # and what the program calls them


def trace_function(fn, specs: list[ArgSpec], mesh, call=None, deterministic: bool = False,
                   scatter_axes: tuple = (), mesh_is_default: bool = False,
                   remat_candidates: bool = False) -> TraceResult:
    """Graph IR for `fn` called on tensors described by `specs`. `call(traced)`
    calls `fn` with the traced tensors placed in its arguments (default:
    positionally). `deterministic` and `scatter_axes` become the function's
    `tgraph.deterministic` and `tgraph.scatter_partials` (see tessera-partition);
    `remat_candidates` marks candidate recomputation regions (see tessera.remat)."""
    for s in specs:
        if np.dtype(s.dtype) not in _ELEMENT:
            raise ArgumentError(f"{getattr(fn, '__name__', 'fn')}: argument {s.name} has dtype "
                                f"{np.dtype(s.dtype)}, which tessera does not support (supported: "
                                f"{SUPPORTED_DTYPES})  [{user_frame()}]")
    ctx = new_context()
    fn_src = function_source(fn)
    fn_loc = ir.Location.file(fn_src.filename, fn_src.line, 0, context=ctx)
    with ctx, fn_loc:
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            tgraph.MeshOp(mesh.name, ir.ArrayAttr.get([ir.StringAttr.get(a) for a in mesh.axes]),
                          ir.DenseI64ArrayAttr.get(list(mesh.info.shape)))
            arg_types = [ir.RankedTensorType.get(list(s.shape), element_type(s.dtype)) for s in specs]
            f = func.FuncOp(symbol_name(fn), (arg_types, []))
            entry = f.add_entry_block(arg_locs=[ir.Location.name(s.name, childLoc=fn_loc)
                                                for s in specs])
            f.attributes["arg_attrs"] = ir.ArrayAttr.get([
                ir.DictAttr.get({"tgraph.sharding": Sharding(mesh.name, s.dims, s.partial).to_attr()})
                for s in specs])
            if deterministic:
                f.attributes["tgraph.deterministic"] = ir.UnitAttr.get()
            if scatter_axes:
                f.attributes["tgraph.scatter_partials"] = ir.ArrayAttr.get(
                    [ir.StringAttr.get(a) for a in scatter_axes])
        state = TraceState(f, entry, fn_loc, mesh, mesh_is_default=mesh_is_default,
                           remat_candidates=remat_candidates)
        with ir.InsertionPoint(entry):
            args = [Traced(v, s.shape, s.dtype) for v, s in zip(entry.arguments, specs)]
            previous = set_trace_state(state)
            try:
                out = call(args) if call is not None else fn(*args)
            finally:
                set_trace_state(previous)
            leaves, structure = flatten(out)
            for i, o in enumerate(leaves):
                if not isinstance(o, Traced):
                    raise ShapeError(f"{fn.__name__} must return tensors computed with tessera ops "
                                     f"(possibly in tuples, lists and dicts); output #{i} is a "
                                     f"{type(o).__name__}  [{fn_src}]")
            func.ReturnOp([o.value for o in leaves])
        f.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in entry.arguments], [o.value.type for o in leaves]))
    return TraceResult(module, leaves, structure, [obj for obj, _ in state.captured],
                       [t.name for _, t in state.captured])
