"""Small helpers shared by the pass modules in `tessera_passes`."""

from __future__ import annotations

import re

from tessera_mlir import ir


def enum_of(op: ir.Operation, attr: str = "kind") -> str:
    """The value of an enum attribute: `sum` of `#tgraph.reduction<sum>`,
    `nvshmem` of `#tgraph.transport<nvshmem>`."""
    return str(op.attributes[attr]).split("<")[1].rstrip(">")


def memref_of(tensor_type: ir.Type) -> ir.MemRefType:
    """The buffer type holding a ranked tensor type."""
    t = ir.RankedTensorType(tensor_type)
    return ir.MemRefType.get(list(t.shape), t.element_type)


class PassError(Exception):
    """A user-facing failure at an IR location; passes turn it into a diagnostic."""

    def __init__(self, message: str, location: ir.Location | None = None):
        super().__init__(message)
        self.location = location


def run_reporting(op: ir.Operation, pass_, body) -> None:
    """Runs `body()` with `op`'s context and location as the defaults for IR
    building; a PassError becomes an error diagnostic plus pass failure."""
    try:
        with op.context, op.location:
            body()
    except PassError as err:
        loc = err.location or ir.Location.unknown()
        loc.emit_error(str(err))
        pass_.signal_pass_failure()


def functions(module_op: ir.Operation):
    """The func.func ops (with bodies) directly inside `module_op`."""
    block = module_op.regions[0].blocks[0]
    for op in block.operations:
        if op.operation.name == "func.func" and len(op.operation.regions[0].blocks):
            yield op.operation


def ops_of(func_op: ir.Operation) -> list[ir.Operation]:
    return [o.operation for o in func_op.regions[0].blocks[0].operations]


def arg_attr_dicts(func_op: ir.Operation, key: str) -> list[ir.DictAttr]:
    """The argument (`key="arg_attrs"`) or result (`"res_attrs"`) attribute
    dictionaries of a function, empty ones where it has none."""
    attrs = func_op.attributes
    ftype = function_type(func_op)
    n = len(ftype.inputs if key == "arg_attrs" else ftype.results)
    if key in attrs:
        return [ir.DictAttr(a) for a in ir.ArrayAttr(attrs[key])]
    return [ir.DictAttr.get({}) for _ in range(n)]


def set_dict_entry(d: ir.DictAttr, name: str, value: ir.Attribute | None) -> ir.DictAttr:
    entries = {n.name: n.attr for n in d}
    if value is None:
        entries.pop(name, None)
    else:
        entries[name] = value
    return ir.DictAttr.get(entries)


def function_type(func_op: ir.Operation) -> ir.FunctionType:
    return ir.FunctionType(ir.TypeAttr(func_op.attributes["function_type"]).value)


def set_function_type(func_op: ir.Operation, inputs, results) -> None:
    func_op.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(list(inputs), list(results)))


def location_name(loc: ir.Location) -> str | None:
    """The name of a NameLoc (`loc("w1"(...))`), which the frontend uses to
    record Python parameter names; None for other locations."""
    m = re.match(r'loc\("([^"]+)"(?:\(|\)$)', str(loc))
    return m.group(1) if m else None


def source_of(loc: ir.Location) -> str:
    """`file.py:12` for a file location (possibly wrapped in a name), else ''."""
    text = str(loc)
    m = re.search(r'"([^"]+)":(\d+):\d+', text)
    return f"{m.group(1)}:{m.group(2)}" if m else ""
