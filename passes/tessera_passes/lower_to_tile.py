"""tessera-lower-to-tile: lower Schedule IR kernels to Tile IR kernels.

1. Epilogue fusion. When a launch's output buffer is read only by the next
   launch of an elementwise kernel (relu, or add of another buffer), the two
   kernels merge into one (matmul + relu) and the intermediate buffer and its
   launch disappear.
2. Tiling. Each kernel (a function on tensors) becomes a `ttile.kernel` on
   buffers (its inputs, then its outputs):
   * a matmul `[M, K] x [K, N]` becomes a grid of `[M/BM, N/BN]` instances,
     each accumulating a `BM x BN` tile over `K` in `BK` steps with `ttile.dot`
     inside an `scf.for`, then applying the fused elementwise epilogue and
     storing the tile;
   * an elementwise chain becomes a grid over tiles of its output.
   Tile sizes are the largest divisors of each dimension up to a cap and are
   recorded on the kernel (`ttile.tile_sizes`).
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import arith, func, scf, tsched, ttile

from tessera_compiler.passes_common import (PassError, functions, function_type,
                                            ops_of, run_reporting)

ELEMENTWISE = {"tgraph.relu": ttile.ReluOp, "tgraph.add": ttile.AddOp}
MATMUL_TILE_CAP = (32, 32, 32)      # BM, BN, BK
ELEMENTWISE_TILE_ELEMENTS = 4096
THREADS_PER_BLOCK = 128


def largest_divisor(n: int, cap: int) -> int:
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


# --------------------------------------------------------------------------
# 1. Epilogue fusion on the schedule
# --------------------------------------------------------------------------

def kernel_body(kernel: ir.Operation) -> list[ir.Operation]:
    return [o for o in ops_of(kernel) if o.name != "func.return"]


def fuse_epilogues(sched: ir.Operation, kernels: dict, module_block: ir.Block) -> None:
    """Fuses until no matmul launch has a fusable elementwise consumer left; a
    fused kernel still starts with its matmul, so chains fuse one op at a time."""
    fused = True
    while fused:
        fused = False
        for launch in ops_of(sched):
            if launch.name != "tsched.launch":
                continue
            body = kernel_body(kernels[ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value])
            if body and body[0].name == "tgraph.matmul" and \
                    _fuse_next(sched, launch, kernels, module_block) is not None:
                fused = True
                break   # the op list changed: rescan


def _launch_parts(launch: ir.Operation):
    view = launch.opview
    return view.stream, list(view.ins), list(view.outs)


def _fuse_next(sched, producer, kernels, module_block):
    """Fuses the single elementwise consumer of `producer`'s output into it.
    Returns the new launch, or None."""
    stream, ins, outs = _launch_parts(producer)
    if len(outs) != 1:
        return None
    out = outs[0]
    users = [u.owner.operation for u in out.uses if u.owner.operation != producer.operation]
    launches = [u for u in users if u.name == "tsched.launch"]
    others = [u for u in users if u.name not in ("tsched.launch", "tsched.free")]
    if len(launches) != 1 or others:
        return None
    consumer = launches[0]
    c_stream, c_ins, c_outs = _launch_parts(consumer)
    cname = ir.FlatSymbolRefAttr(consumer.attributes["kernel"]).value
    cbody = kernel_body(kernels[cname])
    if len(cbody) != 1 or cbody[0].name not in ELEMENTWISE or len(c_outs) != 1:
        return None
    if c_stream != stream or [v for v in c_ins].count(out) != 1:
        return None
    extra = [v for v in c_ins if v != out]
    # Extra inputs must already exist where the producer launches.
    if any(not isinstance(v.owner, ir.Block) and not v.owner.is_before_in_block(producer)
           for v in extra):
        return None
    pname = ir.FlatSymbolRefAttr(producer.attributes["kernel"]).value
    fused_name = f"{pname}_{cbody[0].name.split('.')[1]}"
    fused = _merge_kernels(kernels[pname], kernels[cname], c_ins.index(out), fused_name,
                           module_block)
    kernels[fused_name] = fused
    # The consumer's output buffer is now written by the fused launch.
    out_def = c_outs[0].owner
    if not isinstance(out_def, ir.Block) and out_def.name == "tsched.alloc":
        out_def.move_before(producer)
    with ir.InsertionPoint(producer), producer.location:
        new = tsched.LaunchOp(ir.FlatSymbolRefAttr.get(fused_name), stream,
                              list(ins) + extra, list(c_outs)).operation
    frees = [u for u in users if u.name == "tsched.free"]
    alloc = out.owner
    consumer.erase()
    producer.erase()
    for f in frees:
        f.erase()
    alloc.erase()
    return new


def _merge_kernels(first: ir.Operation, second: ir.Operation, slot: int, name: str,
                   module_block: ir.Block) -> ir.Operation:
    """A kernel computing `second(first(...))`, where first's result feeds
    `second`'s input `slot`; second's other inputs become extra arguments."""
    t1, t2 = function_type(first), function_type(second)
    extra_types = [t for i, t in enumerate(t2.inputs) if i != slot]
    with ir.InsertionPoint(module_block), first.location:
        k = func.FuncOp(name, (list(t1.inputs) + extra_types, list(t2.results)),
                        visibility="private")
        k.attributes["tsched.kernel"] = ir.UnitAttr.get()
        entry = k.add_entry_block()
        args = list(entry.arguments)
        with ir.InsertionPoint(entry):
            mapping = dict(zip(first.regions[0].blocks[0].arguments, args[: len(t1.inputs)]))
            result = _clone_body(first, mapping)
            second_args = list(second.regions[0].blocks[0].arguments)
            extra_args = iter(args[len(t1.inputs):])
            mapping2 = {a: (result if i == slot else next(extra_args))
                        for i, a in enumerate(second_args)}
            func.ReturnOp([_clone_body(second, mapping2)])
    return k.operation


def _clone_body(kernel: ir.Operation, mapping: dict) -> ir.Value:
    """Clones a kernel's body at the current insertion point; returns the value
    the kernel returns."""
    for op in ops_of(kernel):
        if op.name == "func.return":
            return mapping[op.operands[0]]
        clone = op.clone()
        for i, v in enumerate(op.operands):
            clone.operands[i] = mapping[v]
        for old, new in zip(op.results, clone.results):
            mapping[old] = new
    raise PassError("kernel has no return", kernel.location)


# --------------------------------------------------------------------------
# 2. Tiling
# --------------------------------------------------------------------------

def _index(v: int) -> ir.Value:
    return arith.ConstantOp(ir.IndexType.get(), v).result


def _i64_array(values) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get(list(values))


def _tile_type(shape, element) -> ir.Type:
    return ir.Type.parse(f"!ttile.tile<{'x'.join(map(str, shape))}x{element}>")


def _memref(t: ir.Type) -> ir.MemRefType:
    r = ir.RankedTensorType(t)
    return ir.MemRefType.get(list(r.shape), r.element_type)


def tile_kernel(kernel: ir.Operation, module_block: ir.Block) -> ir.Operation:
    name = ir.StringAttr(kernel.attributes["sym_name"]).value
    ftype = function_type(kernel)
    body = kernel_body(kernel)
    arg_types = [_memref(t) for t in list(ftype.inputs) + list(ftype.results)]
    if body and body[0].name == "tgraph.matmul":
        head, epilogue = body[0], body[1:]
        return _tiled_matmul(kernel, name, arg_types, head, epilogue, module_block)
    if all(o.name in ELEMENTWISE for o in body):
        return _tiled_elementwise(kernel, name, arg_types, body, module_block)
    bad = next(o for o in body if o.name not in ELEMENTWISE)
    raise PassError(f"tessera-lower-to-tile cannot tile '{bad.name}' in kernel @{name}",
                    bad.location)


def _new_kernel(kernel, name, arg_types, grid, tile_sizes, loc, module_block):
    """An empty ttile.kernel replacing the tensor-level `kernel`: returns it, its
    entry block, and a map from `kernel`'s arguments to the new buffer arguments."""
    with ir.InsertionPoint(module_block), loc:
        k = ttile.KernelOp(name, ir.TypeAttr.get(ir.FunctionType.get(arg_types, [])),
                           _i64_array(grid), _i64_array([THREADS_PER_BLOCK]))
        k.attributes["ttile.tile_sizes"] = _i64_array(tile_sizes)
        entry = k.body.blocks.append(*arg_types, arg_locs=[loc] * len(arg_types))
    buffer_of = dict(zip(kernel.regions[0].blocks[0].arguments, entry.arguments))
    return k, entry, buffer_of


def _tile_offsets(tile_shape) -> list[ir.Value]:
    """Element offsets of this instance's tile: program_id(d) * tile[d]."""
    i64 = ir.IntegerType.get_signless(64)
    return [arith.MulIOp(ttile.ProgramIdOp(ir.IntegerAttr.get(i64, d)).result, _index(t)).result
            for d, t in enumerate(tile_shape)]


def _apply_elementwise(ops, tiles: dict, load) -> ir.Value:
    """Applies elementwise `ops` to tiles; an operand without a tile yet (a
    kernel input such as a bias or residual) is loaded with `load(value)`.
    Returns the last op's tile."""
    for op in ops:
        with op.location:
            operands = [tiles[v] if v in tiles else tiles.setdefault(v, load(v))
                        for v in op.operands]
            tiles[op.results[0]] = ELEMENTWISE[op.name](*operands).result
    return tiles[ops[-1].results[0]]


def _tiled_matmul(kernel, name, arg_types, matmul, epilogue, module_block):
    lhs_t, rhs_t = (ir.RankedTensorType(v.type) for v in matmul.operands)
    if lhs_t.rank != 2:
        raise PassError(f"tessera-lower-to-tile tiles 2-D matmuls; kernel @{name} has a "
                        f"rank-{lhs_t.rank} matmul", matmul.location)
    (M, K), (_, N) = lhs_t.shape, rhs_t.shape
    BM, BN, BK = (largest_divisor(n, cap) for n, cap in zip((M, N, K), MATMUL_TILE_CAP))
    elt = lhs_t.element_type
    k, entry, buffer_of = _new_kernel(kernel, name, arg_types, [M // BM, N // BN],
                                      [BM, BN, BK], matmul.location, module_block)
    with ir.InsertionPoint(entry), matmul.location:
        row, col = _tile_offsets([BM, BN])
        acc_t = _tile_type([BM, BN], elt)
        acc0 = ttile.FillOp(acc_t, ir.FloatAttr.get_f64(0.0)).result
        loop = scf.ForOp(_index(0), _index(K), _index(BK), [acc0])
        with ir.InsertionPoint(loop.body):
            kk = loop.induction_variable
            a = ttile.LoadOp(_tile_type([BM, BK], elt), buffer_of[matmul.operands[0]], [row, kk]).result
            b = ttile.LoadOp(_tile_type([BK, BN], elt), buffer_of[matmul.operands[1]], [kk, col]).result
            scf.YieldOp([ttile.DotOp(a, b, loop.inner_iter_args[0]).result])
        result = loop.results[0]
        if epilogue:
            result = _apply_elementwise(
                epilogue, {matmul.results[0]: result},
                lambda v: ttile.LoadOp(acc_t, buffer_of[v], [row, col]).result)
        ttile.StoreOp(result, entry.arguments[-1], [row, col])
        ttile.ReturnOp()
    return k.operation


def _tiled_elementwise(kernel, name, arg_types, body, module_block):
    out_t = ir.RankedTensorType(body[-1].results[0].type)
    shape = list(out_t.shape)
    if not 1 <= len(shape) <= 3:
        raise PassError(f"tessera-lower-to-tile tiles elementwise kernels of rank 1 to 3; "
                        f"kernel @{name} has rank {len(shape)}", body[-1].location)
    tile, budget = [1] * len(shape), ELEMENTWISE_TILE_ELEMENTS
    for d in reversed(range(len(shape))):
        tile[d] = largest_divisor(shape[d], max(1, budget))
        budget //= tile[d]
    grid = [s // t for s, t in zip(shape, tile)]
    k, entry, buffer_of = _new_kernel(kernel, name, arg_types, grid, tile,
                                      body[0].location, module_block)
    tile_t = _tile_type(tile, out_t.element_type)
    with ir.InsertionPoint(entry), body[0].location:
        offsets = _tile_offsets(tile)
        result = _apply_elementwise(
            body, {}, lambda v: ttile.LoadOp(tile_t, buffer_of[v], offsets).result)
        ttile.StoreOp(result, entry.arguments[-1], offsets)
        ttile.ReturnOp()
    return k.operation


def run(op, pass_):
    def body():
        module_block = op.regions[0].blocks[0]
        kernels = {ir.StringAttr(f.attributes["sym_name"]).value: f
                   for f in functions(op) if "tsched.kernel" in f.attributes}
        if not kernels:
            return
        for f in list(functions(op)):
            if "tsched.kernel" not in f.attributes and any(
                    o.name == "tsched.launch" for o in ops_of(f)):
                fuse_epilogues(f, kernels, module_block)
        launched = {ir.FlatSymbolRefAttr(o.attributes["kernel"]).value
                    for f in functions(op) if "tsched.kernel" not in f.attributes
                    for o in ops_of(f) if o.name == "tsched.launch"}
        for name, kernel in kernels.items():
            if name in launched:
                tiled = tile_kernel(kernel, module_block)
                tiled.move_before(kernel)
            kernel.erase()
    run_reporting(op, pass_, body)
