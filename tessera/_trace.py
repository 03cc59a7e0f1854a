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
from dataclasses import dataclass

import numpy as np

from tessera_compiler.mlir_context import new_context
from tessera_compiler.sharding import ELEMENT_TYPES, Sharding
from tessera_mlir import ir
from tessera_mlir.dialects import func, tgraph

from ._source import SourceLine, user_frame
from .errors import ShapeError

# numpy dtype -> MLIR element type; bf16 waits for a numpy bfloat16 (ml_dtypes).
_ELEMENT = {np.dtype(numpy_name): mlir_name for mlir_name, numpy_name in ELEMENT_TYPES.items()
            if mlir_name != "bf16"}

_state = threading.local()


def element_type(dtype: np.dtype) -> ir.Type:
    dtype = np.dtype(dtype)
    if dtype not in _ELEMENT:
        raise TypeError(f"dtype {dtype} is not supported yet (supported: "
                        f"{', '.join(str(d) for d in _ELEMENT)})")
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
    """A tensor inside a function being traced: a Graph IR value and its shape."""

    def __init__(self, value: ir.Value, shape, dtype, source: SourceLine | None = None):
        self.value = value
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.source = source

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"Traced(shape={self.shape}, dtype={self.dtype})"

    def __matmul__(self, other):
        from .op import matmul
        return matmul(self, other)

    def __add__(self, other):
        from .op import add
        return add(self, other)


def current_location(src: SourceLine | None = None) -> ir.Location:
    src = src or user_frame()
    return ir.Location.file(src.filename, src.line, 0)


def require_tracing(op_name: str, *operands) -> SourceLine:
    src = user_frame()
    if getattr(_state, "active", False) is False:
        raise RuntimeError(f"op.{op_name} at {src} was called outside a function compiled by "
                           "tessera.compile; decorate the function with @tessera.compile(mesh=...)")
    for i, x in enumerate(operands):
        if not isinstance(x, Traced):
            raise ShapeError(f"op.{op_name}: operand #{i} is a {type(x).__name__}, not a traced "
                             f"tensor  [{src}]")
    return src


def symbol_name(fn) -> str:
    """A C- and MLIR-safe symbol for a Python function (`<lambda>` -> `lambda`);
    it prefixes kernel names, which become C symbols."""
    name = re.sub(r"[^A-Za-z0-9_]", "", getattr(fn, "__name__", "fn")) or "fn"
    return name if not name[0].isdigit() else f"fn_{name}"


def trace_function(fn, specs: list[ArgSpec], mesh) -> tuple[ir.Module, list[Traced]]:
    """Graph IR for `fn` called on arguments described by `specs`."""
    ctx = new_context()
    fn_src = SourceLine(inspect.getsourcefile(fn) or "<unknown>",
                        inspect.getsourcelines(fn)[1] if inspect.getsourcefile(fn) else 0)
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
        with ir.InsertionPoint(entry):
            args = [Traced(v, s.shape, s.dtype) for v, s in zip(entry.arguments, specs)]
            _state.active = True
            try:
                out = fn(*args)
            finally:
                _state.active = False
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            for i, o in enumerate(outs):
                if not isinstance(o, Traced):
                    raise ShapeError(f"{fn.__name__} must return tensors computed with tessera.op; "
                                     f"result #{i} is a {type(o).__name__}  [{fn_src}]")
            func.ReturnOp([o.value for o in outs])
        f.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(arg_types, [o.value.type for o in outs]))
    return module, outs
