"""Library declarations (`func.func` with `tsched.library = "<routine>"` and
its attributes in `tsched.library_attrs`) read and checked against the one
declaration of each routine, `tessera_runtime.routines` (the runtime holds
it: the compiler may read the runtime, never the other way round).

Each attribute type of the table has one MLIR attribute and one JSON value
(what the bundle holds); a declaration whose attribute is of another kind
is refused, not guessed at.
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_runtime import routines

from .support import PassError, function_type
from .types import ELEMENT_TYPES

ROUTINES = routines.ROUTINES


def _i64(a: ir.Attribute) -> bool:
    return isinstance(a, ir.IntegerAttr) and isinstance(a.type, ir.IntegerType) and \
        ir.IntegerType(a.type).width == 64


def attribute_json(kind: str, a: ir.Attribute):
    """The JSON value of MLIR attribute `a` of table type `kind`
    (routines.ATTRIBUTE_TYPES); ContractError when `a` is not of that type."""
    if kind == "i64" and _i64(a):
        return ir.IntegerAttr(a).value
    if kind == "i64[]" and isinstance(a, ir.DenseI64ArrayAttr):
        return list(ir.DenseI64ArrayAttr(a))
    if kind == "f64" and isinstance(a, ir.FloatAttr):
        return ir.FloatAttr(a).value
    if kind == "str" and isinstance(a, ir.StringAttr):
        return ir.StringAttr(a).value
    if kind == "str[]" and isinstance(a, ir.ArrayAttr) and \
            all(isinstance(x, ir.StringAttr) for x in ir.ArrayAttr(a)):
        return [ir.StringAttr(x).value for x in ir.ArrayAttr(a)]
    if kind == "unit" and isinstance(a, ir.UnitAttr):
        return True
    if kind == "symbol" and isinstance(a, ir.FlatSymbolRefAttr):
        return ir.FlatSymbolRefAttr(a).value
    raise routines.ContractError(f"must be {routines.ATTRIBUTE_TYPES[kind]}, got {a}")


def buffer_of(t: ir.Type) -> tuple:
    """(shape, numpy dtype name) of a buffer type, as the table's rules take it."""
    m = ir.MemRefType(t)
    elt = str(m.element_type)
    return tuple(m.shape), ELEMENT_TYPES.get(elt, elt)


def declaration(decl: ir.Operation) -> tuple[str, dict]:
    """(routine name, attributes as JSON) of library declaration `decl`,
    checked against its routine's declaration (name, attributes, buffers and
    result rule); a PassError at `decl` when they disagree."""
    try:
        if not isinstance(decl.attributes["tsched.library"], ir.StringAttr):
            raise routines.ContractError("'tsched.library' must be a routine's name (a string)")
        name = ir.StringAttr(decl.attributes["tsched.library"]).value
        routine = routines.routine(name)
        if "tsched.library_attrs" not in decl.attributes or \
                not isinstance(decl.attributes["tsched.library_attrs"], ir.DictAttr):
            raise routines.ContractError("'tsched.library_attrs' must be a dictionary")
        attrs = {}
        for named in ir.DictAttr(decl.attributes["tsched.library_attrs"]):
            a = routine.attributes.get(named.name)
            if a is None:
                attrs[named.name] = None            # (check_attributes names it)
                continue
            try:
                attrs[named.name] = attribute_json(a.type, named.attr)
            except routines.ContractError as e:
                raise routines.ContractError(f"attribute '{named.name}' of routine "
                                             f"'{name}' {e}") from None
        ftype = function_type(decl)
        if list(ftype.results) or not all(isinstance(t, ir.MemRefType) for t in ftype.inputs):
            raise routines.ContractError("a library declaration takes buffers (memrefs) and "
                                         "returns nothing")
        routine.check([buffer_of(t) for t in ftype.inputs], attrs)
    except routines.ContractError as e:
        symbol = ir.StringAttr(decl.attributes["sym_name"]).value
        raise PassError(f"library declaration @{symbol}: {e}", decl.location) from None
    return name, attrs


def declarations(module_op: ir.Operation) -> list[ir.Operation]:
    """The module's library declarations."""
    return [op.operation for op in module_op.regions[0].blocks[0].operations
            if op.operation.name == "func.func" and "tsched.library" in op.operation.attributes]
