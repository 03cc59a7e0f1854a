"""What every pass needs: `PassError` (a user-facing failure at an IR
location), `run_reporting` (which turns it into a diagnostic) and walks over
functions, kernels and their attributes."""

from __future__ import annotations

import ctypes

from tessera_mlir import ir


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


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_OPERATION_CAPSULE = b"tessera_mlir.ir.Operation._CAPIPtr"


def operation_key(op) -> int:
    """A dictionary key for an operation: its address. The bindings make a
    new Python object per access, and an operation's Python hash changes when
    its attributes or operands are edited (== does not; measured with MLIR
    22.1.8), so a pass that edits operations cannot key a dict by them."""
    return _capsule_pointer(op.operation._CAPIPtr, _OPERATION_CAPSULE)


def i64(value: int) -> ir.IntegerAttr:
    """A signless 64-bit integer attribute."""
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(value))


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


def non_tensor_signature(func_op: ir.Operation) -> str | None:
    """The first argument or result of `func_op` that is not a ranked tensor
    (Graph IR's signatures hold tensors only), described; None if none is."""
    signature = function_type(func_op)
    for what, types in (("argument", signature.inputs), ("result", signature.results)):
        for i, t in enumerate(types):
            if not isinstance(t, ir.RankedTensorType):
                return f"{what} {i} is {t}"
    return None


def set_function_type(func_op: ir.Operation, inputs, results) -> None:
    func_op.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(list(inputs), list(results)))


def kernels_of(module) -> list[ir.Operation]:
    """The ttile.kernel ops of a module (an `ir.Module` or its operation)."""
    op = module.operation if isinstance(module, ir.Module) else module
    return [k.operation for k in op.regions[0].blocks[0].operations
            if k.operation.name == "ttile.kernel"]


def launchables(module_op: ir.Operation) -> dict:
    """symbol -> what a `tsched.launch` may launch in Tile IR: each
    `ttile.kernel` and library declaration (`func.func` with `tsched.library`)."""
    out = {}
    for op in (o.operation for o in module_op.regions[0].blocks[0].operations):
        if op.name == "ttile.kernel" or (op.name == "func.func" and "tsched.library" in op.attributes):
            out[symbol_of(op)] = op
    return out


def callee(launch: ir.Operation, symbols: dict):
    """What a `tsched.launch` launches, looked up in `symbols` (`launchables`):
    a kernel, a library declaration, or None."""
    return symbols.get(ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value)


def library_routine(op) -> str | None:
    """A library declaration's routine ("matmul", "slice", ...); None for a
    kernel or for nothing."""
    if op is None:
        return None
    op = op.operation           # (a func.FuncOp view's `name` is its symbol)
    if op.name != "func.func" or "tsched.library" not in op.attributes:
        return None
    return ir.StringAttr(op.attributes["tsched.library"]).value


def library_attrs(decl: ir.Operation) -> dict:
    """A library declaration's `tsched.library_attrs`, by name."""
    return {n.name: n.attr for n in ir.DictAttr(decl.attributes["tsched.library_attrs"])}


def launched(module_op: ir.Operation) -> set:
    """The symbols the module's functions launch (`tsched.launch`)."""
    return {ir.FlatSymbolRefAttr(o.attributes["kernel"]).value
            for f in functions(module_op) for o in ops_of(f) if o.name == "tsched.launch"}


def symbol_of(op: ir.Operation) -> str:
    """The `sym_name` of a symbol op (a function, a mesh)."""
    return ir.StringAttr(op.attributes["sym_name"]).value


def child_ops(op: ir.Operation) -> list[ir.Operation]:
    """The operations directly inside `op`'s regions (one level down), in order."""
    return [inner.operation for region in op.regions for block in region.blocks
            for inner in block.operations]


def nested_ops(op: ir.Operation) -> list[ir.Operation]:
    """Every operation inside `op`'s regions, in program order (pre-order)."""
    found = []

    def visit(inner):
        if inner is not op:
            found.append(inner)
        return ir.WalkResult.ADVANCE

    op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def marked_args(kernel: ir.Operation, marker: str) -> list[int]:
    """Indices of the kernel arguments whose attributes include `marker`
    (`ttile.symmetric`, `ttile.signals`)."""
    attrs = kernel.attributes
    arg_attrs = list(ir.ArrayAttr(attrs["arg_attrs"])) if "arg_attrs" in attrs else []
    return [i for i, d in enumerate(arg_attrs) if marker in ir.DictAttr(d)]


def partitioned_all_reduces(func_op: ir.Operation, flag: str) -> list[ir.Operation]:
    """The tgraph.all_reduce ops of a function that passes rewriting them
    (bucketing, hierarchical collectives) work on: none in a pipelined
    function (its all_reduces belong to different ranks' stages); in a
    function that is not partitioned, an error naming pass `flag`."""
    reduces = [o for o in ops_of(func_op) if o.name == "tgraph.all_reduce"]
    if not reduces or "tgraph.pipeline" in func_op.attributes:
        return []
    if "tgraph.partitioned" not in func_op.attributes:
        raise PassError("tgraph.all_reduce in a function that is not partitioned: run "
                        f"tessera-partition before {flag}", reduces[0].location)
    return reduces
