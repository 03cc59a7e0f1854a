"""tessera-fold-slices: kernels read and write one index of a dimension in place.

Runs on CPU Tile IR after tessera-lower-to-tile, where a kernel may load and
store tiles along chosen buffer dimensions (`ttile.load/store {dims}`, the
flash-attention kernels' way of reading heads where they lie). Two copies
around such kernels go:

* A `slice` that takes index i of dimension j (everything else whole),
  followed by a reshape dropping that unit dimension, whose result only
  `dims` loads read: each reading kernel reads the slice's source instead,
  at index i of dimension j (a clone of the kernel with that argument
  retyped and the index put into each load). The source's frees move after
  the last reader. `op.transformer_block`'s q, k and v
  (`qkv[:, :, :, i]` of the projection `[B, S, H, 3, Dh]`), read by the
  attention kernels forward and backward: 12 copies of a w512 step.
* A `concat` along dimension j of unit pieces, each a reshape adding that
  dimension to a buffer only one kernel writes, and only with `dims`
  stores (and loads: the CPU's attention backward reads back the dQ it is
  summing there): each writing kernel stores into the concat's result at
  the piece's index instead (its allocation moves before the first writer).
  The attention gradient's dq, dk and dv joined into the qkv projection's
  gradient (tessera-autodiff's joined pads): 4 copies of a w512 step.

Left alone: slices and concats that anything else reads or writes, kernels
that read such a buffer other than with `dims` loads, and sources written
between the slice and its last reader.
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import arith, ttile

from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.support import (callee, functions, launchables, launched,
                                         library_attrs, library_routine, operation_key, ops_of,
                                         run_reporting)
from tessera_compiler.ir.types import shape_of


def _kernel(launch: ir.Operation, symbols: dict):
    k = callee(launch, symbols)
    return k if k is not None and k.name == "ttile.kernel" else None


def _users(v: ir.Value) -> list:
    return [u.owner.operation for u in v.uses]


def _only_strided(kernel: ir.Operation, arg: int, *accesses: str) -> bool:
    """Whether every use of `kernel`'s argument `arg` is a `dims` access of
    it of the kinds `accesses` ("ttile.load", "ttile.store")."""
    value = kernel.regions[0].blocks[0].arguments[arg]
    for use in value.uses:
        op = use.owner.operation
        if op.name not in accesses or "dims" not in op.attributes:
            return False
        if op.name == "ttile.store" and op.operands[0] == value:     # (the stored tile)
            return False
    return True


def _without(shape: list[int], j: int) -> list[int]:
    """`shape` without its (unit) dimension j: a reshape's view of it."""
    return shape[:j] + shape[j + 1:]


class _Folder:
    def __init__(self, module: ir.Operation):
        self.module = module
        self.positions: dict = {}   # op (operation_key) -> its place in the function
        self.erased: set = set()    # operation_key of the ops a fold erased
        self.symbols = launchables(module)
        self.clones: dict = {}      # (kernel, arg, type, j, index) -> clone name
        self.origin: dict = {}      # clone -> the kernel it was first cloned from

    def clone(self, name: str, arg: int, buffer: ir.Type, j: int, index: int) -> str:
        """A copy of kernel `name` whose argument `arg` is `buffer` (one
        dimension more, j) and whose `dims` accesses of it are at `index` of
        dimension j."""
        key = (name, arg, str(buffer), j, index)
        if key in self.clones:
            return self.clones[key]
        kernel = self.symbols[name]
        copy = kernel.clone(ip=ir.InsertionPoint.after(kernel))
        base = self.origin.get(name, name)
        new, n = f"{base}_in_place", 1
        while new in self.symbols:
            n += 1
            new = f"{base}_in_place{n}"
        self.origin[new] = base
        copy.attributes["sym_name"] = ir.StringAttr.get(new)
        ftype = ir.FunctionType(ir.TypeAttr(copy.attributes["function_type"]).value)
        inputs = list(ftype.inputs)
        inputs[arg] = buffer
        copy.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, []))
        entry = copy.regions[0].blocks[0]
        value = entry.arguments[arg]
        value.set_type(buffer)
        with ir.InsertionPoint.at_block_begin(entry), copy.location:
            at = arith.ConstantOp(ir.IndexType.get(), index).result
        for op in [u.owner.operation for u in value.uses]:
            dims = [d + (d >= j) for d in ir.DenseI64ArrayAttr(op.attributes["dims"])]
            with ir.InsertionPoint(op), op.location:
                if op.name == "ttile.load":
                    offsets = list(op.operands[1:])
                    offsets.insert(j, at)
                    made = ttile.LoadOp(op.results[0].type, value, offsets, dims=dims)
                    op.results[0].replace_all_uses_with(made.result)
                else:
                    offsets = list(op.operands[2:])
                    offsets.insert(j, at)
                    ttile.StoreOp(op.operands[0], value, offsets, dims=dims)
            op.erase()
        self.symbols[new] = copy
        self.clones[key] = new
        return new

    def retarget(self, launch: ir.Operation, old: ir.Value, buffer: ir.Value, j: int,
                 index: int) -> None:
        """`launch` passes `buffer` where it passed `old`, to a clone of its
        kernel reading or writing it at `index` of dimension j."""
        name = ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value
        for pos, v in enumerate(list(launch.operands)[1:]):     # operand 0: the stream
            if v == old:
                name = self.clone(name, pos, buffer.type, j, index)
                launch.operands[1 + pos] = buffer
        launch.attributes["kernel"] = ir.FlatSymbolRefAttr.get(name)

    # -- slices -------------------------------------------------------------------
    def fold_slice(self, launch: ir.Operation, position) -> bool:
        decl = callee(launch, self.symbols)
        if library_routine(decl) != "slice":
            return False
        (src,), (piece,) = list(launch.opview.ins), list(launch.opview.outs)
        big, unit = shape_of(src), shape_of(piece)
        offsets = list(ir.DenseI64ArrayAttr(library_attrs(decl)["offsets"]))
        cut = [d for d in range(len(big)) if unit[d] != big[d]]
        if len(cut) != 1 or unit[cut[0]] != 1 or \
                any(o for d, o in enumerate(offsets) if d != cut[0]):
            return False
        j, index = cut[0], offsets[cut[0]]
        reshapes, frees = [], []
        for user in _users(piece):
            if operation_key(user) == operation_key(launch):
                continue
            if user.name == "tsched.free":
                frees.append(user)
            elif user.name == "tsched.launch" and \
                    library_routine(callee(user, self.symbols)) == "reshape" and \
                    list(user.opview.ins) == [piece] and \
                    shape_of(user.opview.outs[0]) == _without(unit, j):
                reshapes.append(user)
            else:
                return False
        readers, view_frees = [], []
        for reshape in reshapes:
            view = reshape.opview.outs[0]
            for user in _users(view):
                if operation_key(user) == operation_key(reshape):
                    continue
                if user.name == "tsched.free":
                    view_frees.append(user)
                    continue
                kernel = _kernel(user, self.symbols) if user.name == "tsched.launch" else None
                ins = list(user.opview.ins) if kernel is not None else []
                if kernel is None or view in list(user.opview.outs) or position(user) < 0 or \
                        not all(_only_strided(kernel, a, "ttile.load")
                                for a, v in enumerate(ins) if v == view):
                    return False
                readers.append((user, view))
        if not readers:
            return False
        start, last = position(launch), max(position(r) for r, _ in readers)
        # The source reaches the last reader as the slice saw it.
        between = [u for u in _users(src) if start < position(u) <= last]
        if any(u.name == "tsched.launch" and src in list(u.opview.outs) or
               u.name == "tsched.collective_start" and u.opview.dst == src or
               u.name not in ("tsched.launch", "tsched.free", "tsched.collective_start")
               for u in between):
            return False
        last_reader = next(r for r, _ in readers if position(r) == last)
        after = last_reader
        for n, free in enumerate(u for u in between if u.name == "tsched.free"):
            free.move_after(after)
            after = free
            self.positions[operation_key(free)] = last + 0.5 + n * 1e-3
        for reader, view in readers:
            self.retarget(reader, view, src, j, index)
        views = [r.opview.outs[0] for r in reshapes]
        for op in view_frees + reshapes + frees + [launch]:
            self.erase(op)
        for buffer in views + [piece]:
            if not isinstance(buffer.owner, ir.Block) and not list(buffer.uses):
                self.erase(buffer.owner)
        return True

    # -- concats ------------------------------------------------------------------
    def fold_concat(self, launch: ir.Operation, position) -> bool:
        decl = callee(launch, self.symbols)
        if library_routine(decl) != "concat":
            return False
        j = ir.IntegerAttr(library_attrs(decl)["dim"]).value
        pieces, (out,) = list(launch.opview.ins), list(launch.opview.outs)
        if isinstance(out.owner, ir.Block) or out.owner.name != "tsched.alloc":
            return False
        plan = []                       # (writer launch, its buffer, reshape, piece index)
        for k, piece in enumerate(pieces):
            if shape_of(piece)[j] != 1 or sum(p == piece for p in pieces) != 1:
                return False
            if isinstance(piece.owner, ir.Block) or piece.owner.name != "tsched.alloc":
                return False
            writers = [u for u in _users(piece) if u.name == "tsched.launch"
                       and piece in list(u.opview.outs)]
            others = [u for u in _users(piece) if u.name not in ("tsched.launch", "tsched.free")
                      or (u.name == "tsched.launch" and operation_key(u) != operation_key(launch)
                          and piece not in list(u.opview.outs))]
            if len(writers) != 1 or others:
                return False
            reshape = writers[0]
            if library_routine(callee(reshape, self.symbols)) != "reshape":
                return False
            (buffer,) = list(reshape.opview.ins)
            if shape_of(buffer) != _without(shape_of(piece), j) or \
                    isinstance(buffer.owner, ir.Block) or buffer.owner.name != "tsched.alloc":
                return False
            users = [u for u in _users(buffer) if operation_key(u) != operation_key(reshape)
                     and u.name != "tsched.free"]
            if len(users) != 1 or users[0].name != "tsched.launch" or \
                    buffer in list(users[0].opview.ins):
                return False
            writer = users[0]
            kernel = _kernel(writer, self.symbols)
            if kernel is None or position(writer) < 0 or not all(
                    _only_strided(kernel, a, "ttile.store", "ttile.load")
                    for a, v in enumerate(list(writer.opview.outs), len(writer.opview.ins))
                    if v == buffer):
                return False
            plan.append((writer, buffer, reshape, k))
        first = min(position(w) for w, _, _, _ in plan)
        first_writer = next(w for w, _, _, _ in plan if position(w) == first)
        out.owner.move_before(first_writer)
        for writer, buffer, reshape, k in plan:
            self.retarget(writer, buffer, out, j, k)
            piece = reshape.opview.outs[0]
            doomed = [u for v in (buffer, piece) for u in _users(v)
                      if u.name == "tsched.free"] + [reshape]
            for op in doomed:
                self.erase(op)
        pieces_allocs = [p.owner for p in pieces]
        self.erase(launch)
        for alloc in pieces_allocs + [b.owner for _, b, _, _ in plan]:
            if not list(alloc.results[0].uses):
                self.erase(alloc)
        return True

    def erase(self, op: ir.Operation) -> None:
        self.erased.add(operation_key(op))
        op.erase()


def fold_slices(module: ir.Operation) -> int:
    """Folds every slice and concat it can (see the module docs); returns how many."""
    folder = _Folder(module)
    before = launched(module)
    folded = 0
    for f in functions(module):
        # By address, kept up to date for the frees a fold moves (not the
        # block's order queries: a step has thousands of ops).
        positions = folder.positions = {operation_key(op): i for i, op in enumerate(ops_of(f))}

        def position(op) -> float:
            return positions.get(operation_key(op), -1)
        # (A fold erases launches further down: each is skipped by its key,
        # never touched once erased.)
        launches = [(operation_key(op), op) for op in ops_of(f) if op.name == "tsched.launch"]
        for key, launch in launches:
            if key in folder.erased:
                continue
            if folder.fold_slice(launch, position) or folder.fold_concat(launch, position):
                folded += 1
    # Kernels and declarations nothing launches any more: the slices',
    # concats' and reshapes', the originals of the clones, and the clones
    # that a later fold of the same launch cloned again.
    now = launched(module)
    for name in before - now | set(folder.clones.values()) - now:
        folder.symbols.pop(name).erase()
    return folded


def run(op, pass_, options: TargetOptions):
    if options.resolved_target(op) != "cpu":
        return
    run_reporting(op, pass_, lambda: fold_slices(op))
