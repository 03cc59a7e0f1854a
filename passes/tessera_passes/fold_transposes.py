"""tessera-fold-transposes: a matmul reads a transposed operand in place.

Runs after tessera-lower-to-tile, where the CPU target's matmuls and
transposes became library calls (BLAS, and a copy). A `transpose` launch
that only swaps its buffer's last two dimensions, whose result buffer is
read by nothing but `matmul` launches on the same stream (and then freed),
is erased with that buffer: each such matmul reads the transpose's input
instead, through a declaration marked `transpose_lhs` / `transpose_rhs`
(the runtime passes BLAS the transposed view: a transpose flag, no copy).
Autodiff makes these transposes (dW = x^T dy, dx = dy W^T): in the
example GPT's step 18 of its 34 transposes, each a full copy of an
activation or weight (issue 30: "GEMMs without copies").

Left alone: transposes that feed anything else (an attention kernel, a
reshape), that a matmul on another stream reads, and any whose input is
written, freed or used otherwise between the transpose and its last matmul
(the matmuls then read the input later than the copy did).
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.ir.support import (callee, functions, launchables, launched,
                                         library_routine, operation_key, ops_of, run_reporting)


def _routine(launch: ir.Operation, declarations: dict):
    """(routine, declaration) of a launch of a library declaration, else None."""
    decl = callee(launch, declarations)
    return None if decl is None else (library_routine(decl), decl)


def _swaps_last_two(decl: ir.Operation) -> bool:
    attrs = ir.DictAttr(decl.attributes["tsched.library_attrs"])
    if "perm" not in attrs:
        return False
    try:
        perm = list(ir.DenseI64ArrayAttr(attrs["perm"]))
    except ValueError:             # not the i64 array lower-to-tile writes
        return False
    n = len(perm)
    return n >= 2 and perm == list(range(n - 2)) + [n - 1, n - 2]


def _ins(launch: ir.Operation) -> list:
    return list(launch.opview.ins)


def _transposed_declaration(decl: ir.Operation, operand: int, source_type: ir.Type,
                            name: str, flag: str) -> ir.Operation:
    """A copy of matmul declaration `decl`, named `name`, reading argument
    `operand` as `source_type` (the untransposed buffer), marked with `flag`."""
    clone = decl.clone(ip=ir.InsertionPoint(decl))
    clone.attributes["sym_name"] = ir.StringAttr.get(name)
    ftype = ir.FunctionType(ir.TypeAttr(decl.attributes["function_type"]).value)
    inputs = list(ftype.inputs)
    inputs[operand] = source_type
    clone.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(inputs, list(ftype.results)))
    entries = {n.name: n.attr for n in ir.DictAttr(decl.attributes["tsched.library_attrs"])}
    entries[flag] = ir.UnitAttr.get()
    clone.attributes["tsched.library_attrs"] = ir.DictAttr.get(entries)
    return clone


def fold_transposes(module: ir.Operation) -> int:
    """Folds every transpose it can (see the module docs); returns how many."""
    declarations = {n: op for n, op in launchables(module).items() if op.name == "func.func"}
    # What may end up launched by nothing: the declarations launched now and
    # those this pass makes (a matmul with both operands folded is cloned twice).
    candidates = launched(module)
    folded = 0
    for f in functions(module):
        block_ops = ops_of(f)
        # By address (operation_key): this pass edits the operations it
        # looks up. Erasing waits until the function is done; a moved free
        # gets its new position.
        positions = {operation_key(op): i for i, op in enumerate(block_ops)}

        def position(op) -> float:
            return positions.get(operation_key(op), -1)

        doomed: list = []
        for launch in block_ops:
            if launch.name != "tsched.launch":
                continue
            found = _routine(launch, declarations)
            if found is None or found[0] != "transpose" or not _swaps_last_two(found[1]):
                continue
            ins, outs = _ins(launch), list(launch.opview.outs)
            if len(ins) != 1 or len(outs) != 1 or ins[0] == outs[0]:
                continue
            (source,), (result,) = ins, outs
            stream = launch.opview.stream
            readers, frees, other = [], [], False
            for use in result.uses:
                owner = use.owner.operation
                if owner == launch:                      # the transpose writing it
                    continue
                if owner.name == "tsched.free":
                    frees.append(owner)
                    continue
                called = _routine(owner, declarations) if owner.name == "tsched.launch" else None
                ins = _ins(owner) if called else []
                if (called is None or called[0] != "matmul" or owner.opview.stream != stream
                        or position(owner) < 0 or sum(v == result for v in ins) != 1
                        or ins.index(result) > 1 or result in list(owner.opview.outs)):
                    other = True
                    break
                readers.append((owner, ins.index(result)))
            if other or not readers or getattr(result.owner, "name", None) != "tsched.alloc":
                continue
            last = max(position(r) for r, _ in readers)
            # The source must reach the last matmul unchanged: between the
            # transpose and it, only launches may use it, and only as inputs;
            # a free of it (the transpose was its last reader) moves after
            # the last matmul.
            start = position(launch)
            between = [u.owner.operation for u in source.uses
                       if start < position(u.owner.operation) <= last]
            early_frees = [op for op in between if op.name == "tsched.free"]
            if any(op.name != "tsched.free" and not (
                    op.name == "tsched.launch" and source in _ins(op)
                    and source not in list(op.opview.outs)) for op in between):
                continue
            last_reader = next(r for r, _ in readers if position(r) == last)
            for free in early_frees:
                free.move_after(last_reader)
                positions[operation_key(free)] = last + 0.5      # where it is now
            for reader, operand in readers:
                flag = "transpose_lhs" if operand == 0 else "transpose_rhs"
                _, decl = _routine(reader, declarations)
                name = ir.StringAttr(decl.attributes["sym_name"]).value + f"_{flag}"
                if name not in declarations:    # else another launch of decl made it
                    declarations[name] = _transposed_declaration(decl, operand, source.type,
                                                                 name, flag)
                    candidates.add(name)
                reader.attributes["kernel"] = ir.FlatSymbolRefAttr.get(name)
                reader.operands[1 + operand] = source      # operand 0 is the stream
            doomed += frees + [launch, result.owner.operation]
            folded += 1
        for op in doomed:
            op.erase()
    # Declarations nothing launches any more (a matmul whose every launch
    # now reads a transposed operand, the transposes folded away).
    for name in candidates - launched(module):
        declarations[name].erase()
    return folded


def run(op, pass_, options=None):
    run_reporting(op, pass_, lambda: fold_transposes(op))
