"""tessera-lower-to-tile: lower Schedule IR kernels to Tile IR kernels.

Kernels arrive from tessera-lower-to-schedule as private `func.func`s holding
one tgraph op each. This pass decides how each runs:

1. Library calls. Matmuls (when the module targets the CPU, attribute
   `tessera.target = "cpu"`), data movement (reshape, transpose, slice,
   pad, concat, gather, scatter_add) and value checks (check_range, a
   launch that writes no buffer) become body-less declarations marked
   `tsched.library = "<routine>"` with the op's attributes in
   `tsched.library_attrs`; the runtime engine implements them (BLAS through
   numpy on the CPU). Which op becomes which routine, and which of its
   attributes the declaration keeps, is the routines' one table
   (`tessera_runtime/routines.py`).
2. Loop fusion. Every maximal run of consecutive launches of tileable kernels
   (elementwise ops, comparisons, selects, casts, fills, iotas, broadcasts
   and reductions over the last dimension) over compatible shapes becomes ONE
   `ttile.kernel`: intermediate buffers that nothing else reads disappear.
   The kernel's grid covers the run's iteration shape in tiles; a run with a
   last-dimension reduction (softmax, norms, losses) keeps whole rows in a
   tile. Reductions over another dimension get a kernel of their own that
   loops over the reduced dimension. Constants (fills, iotas) and
   broadcasts are launched again right before each consumer that fuses
   them (`duplicate_recomputed`): a value CSE shared between kernels is
   computed inside each instead of written to a buffer and read back.
   Data-movement launches that do not read the run's results (a bias
   reshaped for broadcasting) move ahead of it instead of breaking it. A
   kernel whose results only grouped GEMMs read (`SEGMENT_READERS`: a MoE
   layer's activation between its experts' GEMMs, and its backward) takes
   their segment sizes and `row_segments`: its instances past the segments,
   the dispatch's padding, do nothing.
3. GEMMs (targets other than the CPU). A matmul starts a run, and the
   elementwise launches after it over its output's shape (bias, activation,
   residual, cast) become its epilogue. The kernel's grid covers the batch
   and the `[M/BM, N/BN]` output tiles; each instance accumulates its
   `BM x BN` tile over `K` in `BK` steps with `ttile.dot` inside an
   `scf.for`. The configuration (`tile/gemm.py: gemm_config`) is part of the Tile IR:
   tile sizes in the tile types, `warps` on the dot, `stages` and `block` on
   the kernel. Half-precision operands accumulate in f32, cast back after
   the loop.

4. Attention (every target). `tgraph.attention` becomes a flash-attention
   forward kernel and `tgraph.attention_grad` a `_dkdv` and a `_dq` kernel
   on GPUs, one `_bwd` kernel on the CPU (`tile/flash_attention.py`).
5. GEMMs fused with a collective (GPU, an NVSHMEM transport). An all_gather
   + matmul kernel starts a GEMM run like a matmul, epilogue included, and
   becomes one GEMM that puts this rank's rows into every peer's symmetric
   copy of the gathered operand and waits, per output tile, only for the
   rows it reads (`tile/gathered_gemm.py`). A matmul + reduce_scatter kernel
   becomes one GEMM that pushes each partial tile to the rank owning its
   rows and sums what arrives for its own (`tile/scattered_gemm.py`); its
   epilogue runs on the summed tile. The symmetric buffers are allocated
   (`tsched.alloc {symmetric}`) around the launch.
6. Exchanges (GPU, an NVSHMEM transport). An all_to_all kernel becomes a
   kernel that puts each piece into the peer's symmetric receive buffer and
   signals it (`tile/exchange.py`; an MoE layer's dispatch and combine), its
   signal words allocated around the launch. The receive buffer is the
   result itself (its alloc made symmetric), read in place by what follows,
   unless the function returns it: then the kernel copies what arrived out.

Tile sizes are recorded on each kernel (`ttile.tile_sizes`).
"""

from __future__ import annotations

import math

from tessera_mlir import ir
from tessera_mlir.dialects import func, scf, tsched, ttile

from tessera_compiler.ir import graph_builder as gb, ops
from tessera_compiler.ir.routines import ROUTINES
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.pipeline import action_rank, copy_action
from tessera_compiler.ir.sharding import meshes_of
from tessera_compiler.ir.support import (PassError, function_type, functions, operation_key,
                                         ops_of, run_reporting)
from tessera_compiler.ir.tile_builder import (THREADS_PER_BLOCK, grid_offsets, index,
                                              largest_divisor, mark_symmetric, new_kernel,
                                              tile_type)
from tessera_compiler.ir.types import enum_of, memref_of, shape_of

from .tile import exchange, flash_attention
from .tile.collective_gemm import CollectiveGemm
from .tile.gathered_gemm import GatheredGemm
from .tile.gemm import gemm_config, gemm_offsets, gemm_tile
from .tile.scattered_gemm import ScatteredGemm

#: Graph IR op -> the library routine it becomes on every target (the
#: routines' one table, tessera_runtime.routines; matmul only on the CPU).
LIBRARY = {r.graph_op: r.name for r in ROUTINES.values() if r.graph_op and not r.cpu_only}


def tile_elementwise(op: ir.Operation, result_type: ir.Type, xs: list[ir.Value]) -> ir.Value:
    """`ttile.<name>` of elementwise `tgraph.<name>` op `op` on tiles `xs`
    (compare keeps its kind, compare and cast their result type)."""
    name = op.name.split(".", 1)[1]
    if name == "compare":
        return ttile.CompareOp(result_type, xs[0], xs[1], op.attributes["kind"]).result
    if name == "cast":
        return ttile.CastOp(result_type, xs[0]).result
    return getattr(ttile, "".join(p.capitalize() for p in name.split("_")) + "Op")(*xs).result


def kernel_body(kernel: ir.Operation) -> list[ir.Operation]:
    return [o for o in ops_of(kernel) if o.name != "func.return"]


def _launch_parts(launch: ir.Operation):
    view = launch.opview
    return view.stream, list(view.ins), list(view.outs)


# --------------------------------------------------------------------------
# 1. Library calls
# --------------------------------------------------------------------------

def _library_routine(kernel: ir.Operation, cpu_target: bool) -> str | None:
    body = kernel_body(kernel)
    if len(body) != 1:
        return None
    routine = next((r for r in ROUTINES.values() if r.graph_op == body[0].name), None)
    return routine.name if routine and (cpu_target or not routine.cpu_only) else None


def make_library_declaration(kernel: ir.Operation, routine: str, module_block) -> ir.Operation:
    """Replaces a one-op tensor kernel by a declaration on buffers that names
    the runtime routine implementing it and the op's attributes its
    declaration names (the op's others, a mesh symbol, stay behind)."""
    name = ir.StringAttr(kernel.attributes["sym_name"]).value
    ftype = function_type(kernel)
    op = kernel_body(kernel)[0]
    arg_types = [memref_of(t) for t in list(ftype.inputs) + list(ftype.results)]
    with ir.InsertionPoint(module_block), op.location:
        decl = func.FuncOp(name, (arg_types, []), visibility="private")
        decl.attributes["tsched.library"] = ir.StringAttr.get(routine)
        decl.attributes["tsched.library_attrs"] = ir.DictAttr.get(
            {a: op.attributes[a] for a in ROUTINES[routine].attributes if a in op.attributes})
    decl.operation.move_before(kernel)
    return decl.operation


# --------------------------------------------------------------------------
# 2-3. Loop fusion of tileable launches, GEMMs with their epilogues
# --------------------------------------------------------------------------

def _first_op(kernel) -> ir.Operation:
    """A kernel function's first op (its `func.return` when it computes nothing)."""
    return kernel.regions[0].blocks[0].operations[0].operation


def _kernel_op(kernels, launch) -> ir.Operation:
    """The op the kernel `launch` launches holds (its function's first; the
    pass refuses a launched kernel without one before asking)."""
    return _first_op(kernels[ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value])


def _reduced_dims(op) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes["dims"])) if op.name == "tgraph.reduce" else []


def _is_column_reduce(op) -> bool:
    dims = _reduced_dims(op)
    rank = len(shape_of(op.operands[0])) if dims else 0
    return bool(dims) and (len(dims) != 1 or dims[0] != rank - 1)


def _domain(shapes) -> list[int] | None:
    """The common iteration shape of `shapes` (same rank; each dim equal or 1),
    or None when they do not fit one grid."""
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1:
        return None
    dom = [max(d) for d in zip(*shapes)] if shapes[0] else []
    for s in shapes:
        if any(a not in (1, b) for a, b in zip(s, dom)):
            return None
    return dom


def _op_shapes(op) -> list[list[int]]:
    return [shape_of(v) for v in list(op.operands) + list(op.results)]


def _is_gemm(op) -> bool:
    return op.name == "tgraph.matmul"


# Ops that read rows only inside segments: {op: its operands so read}; the
# segment sizes are operand 2. What an expert-parallel MoE layer's grouped
# GEMMs read of the dispatched rows, whose blocks are padded to their worst
# case (see op.moe).
SEGMENT_READERS = {"tgraph.grouped_matmul": (0,), "tgraph.grouped_outer": (0, 1)}


def _segment_sizes(kernels, outputs: list, members: list) -> ir.Value | None:
    """The segment sizes buffer when every read of `outputs` (outside
    `members`) is a segment reader's over their rows with that one buffer,
    else None."""
    sizes = None
    for b in outputs:
        for use in b.uses:
            user = use.owner.operation
            if user in members or user.name == "tsched.free":
                continue
            if user.name != "tsched.launch":
                return None
            _, ins, outs = _launch_parts(user)
            read = SEGMENT_READERS.get(_kernel_op(kernels, user).name, ())
            if b in outs or any(v == b and i not in read for i, v in enumerate(ins)):
                return None
            if sizes is not None and ins[2] != sizes:
                return None
            sizes = ins[2]
    return sizes


# Kernels that fuse a GEMM with its collective (an NVSHMEM transport;
# tessera-lower-to-schedule makes them), by the op names of their bodies.
COLLECTIVE_GEMMS: dict[tuple[str, str], CollectiveGemm] = {
    impl.body: impl for impl in (GatheredGemm(), ScatteredGemm())}


def _collective_gemm(kernels, launch) -> list[ir.Operation] | None:
    """[all_gather, matmul] or [matmul, reduce_scatter] when `launch` runs a
    GEMM fused with its collective, else None."""
    body = kernel_body(kernels[ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value])
    return body if tuple(o.name for o in body) in COLLECTIVE_GEMMS else None


def _matmul_of(body: list[ir.Operation]) -> ir.Operation:
    return next(o for o in body if o.name == "tgraph.matmul")


def _fits_epilogue(op, out_shape: list[int]) -> bool:
    """Whether tileable `op` can run in the epilogue of a GEMM producing
    `out_shape` (pointwise over it; no reductions; no iota over a batch dim)."""
    if op.name == "tgraph.reduce":
        return False
    if op.name == "tgraph.iota" and ir.IntegerAttr(op.attributes["dim"]).value < len(out_shape) - 2:
        return False
    return _domain(_op_shapes(op) + [out_shape]) == out_shape


def _hoist(launch, before, produced) -> bool:
    """Moves a data-movement launch that reads nothing in `produced` (and its
    output allocations) before `before`; False when it cannot move."""
    _, ins, outs = _launch_parts(launch)
    if any(b in produced for b in ins):
        return False
    for b in outs:
        owner = b.owner
        if isinstance(owner, ir.Block) or owner.name != "tsched.alloc":
            return False
    # Each output's alloc goes just before it (nothing touches a buffer
    # before the launch writing it). Not `is_before_in_block`: after the
    # block's edits that renumbers the block on every query (quadratic in
    # the block: it dominated the depth-24 example's compile).
    # A zero-size value has no launch writing it, only its alloc, which may
    # come after `before` (a scatter_add of no rows into zeros): then the
    # launch stays. (Zero-size inputs are rare: the order query is cheap here.)
    for b in ins:
        if not isinstance(b.owner, ir.Block) and 0 in ir.MemRefType(b.type).shape and \
                not b.owner.is_before_in_block(before):
            return False
    for b in outs:
        b.owner.move_before(before)
    launch.move_before(before)
    return True


def _written_before(buf: ir.Value, at: ir.Operation) -> bool:
    """Whether `buf` (a block argument or an alloc's result) holds its
    value before `at`: the op writing it (a launch, or a collective into
    it) precedes `at` in the block."""
    if isinstance(buf.owner, ir.Block):
        return True
    writers = [u.owner.operation for u in buf.uses
               if (u.owner.operation.name == "tsched.launch"
                   and buf in _launch_parts(u.owner.operation)[2])
               or (u.owner.operation.name == "tsched.collective_start"
                   and u.owner.operation.opview.dst == buf)]
    return len(writers) == 1 and writers[0].is_before_in_block(at)


def fusion_groups(sched: ir.Operation, kernels: dict, gemm: bool = False) -> list[list[ir.Operation]]:
    """Maximal runs of consecutive tileable launches (allocs and frees between
    them do not break a run) whose shapes share one iteration domain. With
    `gemm`, a matmul starts a run and only pointwise launches over its output
    join it. Library launches that read nothing the run produced move ahead
    of the run."""
    # `domain`: the run's iteration domain so far (None: its first launch's
    # shapes fit none, so nothing joins). The domain of the run's shapes
    # and a new launch's is that of the run's domain and the new shapes.
    groups, current, domain, head = [], [], None, None
    produced = set()

    def start(launch, kop):
        nonlocal current, domain, head
        if current:
            groups.append(current)
        current, produced_now = [launch], _launch_parts(launch)[2]
        produced.clear()
        produced.update(produced_now)
        if gemm and _is_gemm(kop):
            head = domain = shape_of(produced_now[0])
        else:
            head, domain = None, _domain(_op_shapes(kop))

    for op in ops_of(sched):
        if op.name in ("tsched.alloc", "tsched.free"):
            continue
        # Launches of different pipeline ranks never share a kernel.
        if op.name == "tsched.launch" and current and action_rank(op) != action_rank(current[0]):
            groups.append(current)
            current, domain, head = [], None, None
            produced.clear()
        if op.name == "tsched.launch":
            kop = _kernel_op(kernels, op)
            fused = _collective_gemm(kernels, op)
            if fused:
                kop = _matmul_of(fused)
            if gemm and _is_gemm(kop):
                start(op, kop)
                continue
            if kop.name in ops.TILEABLE:
                if head is not None:
                    joins = _fits_epilogue(kop, head)
                else:
                    joined = _domain([domain] + _op_shapes(kop)) \
                        if current and domain is not None else None
                    joins = joined is not None and not _is_column_reduce(kop) and \
                        not _is_column_reduce(_kernel_op(kernels, current[0]))
                if joins:
                    current.append(op)
                    produced.update(_launch_parts(op)[2])
                    if head is None:
                        domain = joined
                    continue
                start(op, kop)
                continue
            if current and kop.name in LIBRARY and _hoist(op, current[0], produced):
                continue
        if current:
            groups.append(current)
        current, domain, head = [], None, None
        produced.clear()
    if current:
        groups.append(current)
    return groups


class GroupTiler:
    """Builds one ttile.kernel for a fusion group of launches."""

    def __init__(self, group, kernels, name, module_block, options: TargetOptions, meshes=None):
        self.group = group
        self.options = options
        self.ops = [_kernel_op(kernels, l) for l in group]
        # A GEMM fused with its collective (NVSHMEM) stands for its matmul.
        self.fused = _collective_gemm(kernels, group[0])
        if self.fused:
            self.ops[0] = _matmul_of(self.fused)
        self.meshes = meshes or {}
        self.symmetric = []          # types of the fused GEMM's symmetric buffers
        self.name = name
        self.module_block = module_block
        # Tiles are tracked per buffer (a kernel may be launched twice in a
        # group, so its body values do not identify data; buffers do).
        self.members = []                  # (tgraph op, input buffers, output buffer)
        produced = {}
        for launch, op in zip(group, self.ops):
            _, ins, outs = _launch_parts(launch)
            self.members.append((op, ins, outs[0]))
            produced[outs[0]] = op
        self.produced = produced
        members = list(group)
        self.inputs = []
        for launch in group:
            for b in _launch_parts(launch)[1]:
                if b not in produced and b not in self.inputs:
                    self.inputs.append(b)
        self.outputs = []
        for b in produced:
            users = [u.owner.operation for u in b.uses]
            if any(u not in members and u.name != "tsched.free" for u in users):
                self.outputs.append(b)
        self.internal = [b for b in produced if b not in self.outputs]
        self.kernels = kernels

    # -- tiling ------------------------------------------------------------
    def _protocol(self) -> CollectiveGemm:
        """What builds the fused GEMM's communication."""
        return COLLECTIVE_GEMMS[tuple(o.name for o in self.fused)]

    def build(self) -> ir.Operation:
        if len(self.ops) == 1 and _is_column_reduce(self.ops[0]):
            return self._column_reduce(self.ops[0])
        self.lead = 0        # leading dimensions (tile size 1) left out of tile types
        self.gemm = None
        if _is_gemm(self.ops[0]):
            # (A reduce-scatter's instances cover its result, not the product.)
            out = shape_of(self.fused[-1].results[0] if self.fused else self.ops[0].results[0])
            *batch, m, n = out
            k = shape_of(self.ops[0].operands[0])[-1]
            elt = str(ir.ShapedType(self.ops[0].operands[0].type).element_type)
            if self.fused:
                collective = next(o for o in self.fused if o is not self.ops[0])
                self.mesh = self.meshes[ir.FlatSymbolRefAttr(collective.attributes["mesh"]).value]
                self.gemm, self.symmetric = self._protocol().plan(*self.fused, self.mesh,
                                                                  self.options)
            else:
                self.gemm = gemm_config(math.prod(batch), m, n, k, elt, self.options)
            dom, tile = out, [1] * len(batch) + [self.gemm.bm, self.gemm.bn]
            self.lead = len(batch)
        else:
            dom = _domain([s for op in self.ops for s in _op_shapes(op)])
            row_mode = any(_reduced_dims(op) for op in self.ops)
            rank = len(dom)
            if rank == 0:
                tile = []
            else:
                elements = self.options.elementwise_tile_elements
                last = dom[-1] if row_mode else largest_divisor(dom[-1], elements)
                tile, budget = [1] * rank, max(1, elements // last)
                tile[-1] = last
                for d in reversed(range(rank - 1)):
                    tile[d] = largest_divisor(dom[d], budget)
                    budget = max(1, budget // tile[d])
        self.dom = dom
        segments = None if self.gemm else self._segments_argument()
        if segments:
            # Bands inside one block of rows, so that each can be skipped.
            arg, block_rows = segments
            tile[0] = largest_divisor(block_rows, tile[0])
        grid = math.prod(d // t for d, t in zip(dom, tile))
        self.tile = tile
        arg_types = [ir.MemRefType(b.type) for b in self.inputs + self.outputs] + self.symmetric
        loc = self.ops[0].location
        threads = self.gemm.threads if self.gemm else THREADS_PER_BLOCK
        sizes = [self.gemm.bm, self.gemm.bn, self.gemm.bk] if self.gemm else (tile or [1])
        k, entry = new_kernel(self.name, arg_types, grid, threads, sizes, self.module_block, loc,
                              self.gemm.stages if self.gemm else None)
        if segments:
            k.attributes["row_segments"] = ir.DenseI64ArrayAttr.get([arg, dom[0], tile[0]])
        self.arg_of = dict(zip(self.inputs + self.outputs, entry.arguments))
        with ir.InsertionPoint(entry), loc:
            tiles = {}
            if self.fused:
                # The instance's output tile is wherever the protocol puts it
                # (a gather's own rows first): the epilogue follows its offsets.
                n_sym = len(self.symmetric)
                mark_symmetric(k, len(arg_types), n_sym)
                _, ins, out = self.members[0]
                tiles[out], *self.offsets = self._protocol().emit(
                    *self.fused, self.mesh, self.gemm, self.arg_of[ins[0]], self.arg_of[ins[1]],
                    *list(entry.arguments)[-n_sym:])
            else:
                self.offsets = self._offsets()
            for op, ins, out in self.members[1 if self.fused else 0:]:
                with op.location:
                    tiles[out] = (self._gemm(op, ins) if op is self.ops[0] and self.gemm
                                  else self._tile_op(op, ins, out, tiles))
            for b in self.outputs:
                with self.produced[b].location:
                    ttile.StoreOp(tiles[b], self.arg_of[b], self._value_offsets(b))
            ttile.ReturnOp()
        return k

    def _segments_argument(self) -> tuple[int, int] | None:
        """(the sizes' argument, the rows of a block) when only segment
        readers read this kernel's outputs, over the rows of its domain's
        first dimension; their sizes buffer joins the inputs. Then the
        kernel skips the bands past the segments: the padding of a MoE
        layer's dispatched blocks, `ep` times the rows that carry tokens."""
        rows = self.dom[0] if len(self.dom) > 1 else 0
        if rows < 2 or any(shape_of(b)[0] != rows for b in self.outputs):
            return None
        sizes = _segment_sizes(self.kernels, self.outputs, self.group)
        # Written before this launch (buffers are written once, by the op
        # defining them or by the one launch with them in its outs).
        if sizes is None or not _written_before(sizes, self.group[0]):
            return None
        sizes_shape = shape_of(sizes)
        if len(sizes_shape) == 2 and rows % sizes_shape[0]:
            return None
        if sizes not in self.inputs:
            self.inputs.append(sizes)
        blocks = sizes_shape[0] if len(sizes_shape) == 2 else 1
        return self.inputs.index(sizes), rows // blocks

    def _gemm(self, op, ins) -> ir.Value:
        *batch_offsets, row, col = self.offsets
        return gemm_tile(self.gemm, self.arg_of[ins[0]], self.arg_of[ins[1]], batch_offsets,
                         row, col, ir.ShapedType(op.results[0].type).element_type)

    def _offsets(self) -> list[ir.Value]:
        if not self.dom:
            return []
        if self.gemm:
            *batch, m, n = self.dom
            return gemm_offsets(batch, m // self.gemm.bm, n // self.gemm.bn, self.gemm.bm,
                                self.gemm.bn, self.options)
        return grid_offsets([d // t for d, t in zip(self.dom, self.tile)], self.tile)

    def _tile_shape(self, v: ir.Value) -> list[int]:
        shape = shape_of(v)
        if not shape:
            return [1]
        return [t if s == d else 1 for s, d, t in zip(shape, self.dom, self.tile)][self.lead:]

    def _value_offsets(self, v: ir.Value) -> list[ir.Value]:
        shape = shape_of(v)
        return [o if s == d else index(0) for s, d, o in zip(shape, self.dom, self.offsets)]

    def _value_tile_type(self, v: ir.Value) -> ir.Type:
        return tile_type(self._tile_shape(v), ir.ShapedType(v.type).element_type)

    def _operand(self, buf: ir.Value, tiles: dict) -> ir.Value:
        """The tile of `buf`: computed earlier in this kernel, or loaded."""
        if buf not in tiles:
            tiles[buf] = ttile.LoadOp(self._value_tile_type(buf), self.arg_of[buf],
                                      self._value_offsets(buf)).result
        return tiles[buf]

    def _tile_op(self, op, ins, out, tiles) -> ir.Value:
        name = op.name
        result = out
        rtype = self._value_tile_type(result)
        xs = [self._operand(b, tiles) for b in ins]
        if name in ops.GRAPH_ELEMENTWISE:
            return tile_elementwise(op, rtype, xs)
        if name == "tgraph.fill":
            return ttile.FillOp(rtype, op.attributes["value"]).result
        if name == "tgraph.iota":
            dim = ir.IntegerAttr(op.attributes["dim"]).value
            return ttile.IotaOp(rtype, self._value_offsets(result)[dim], ir.IntegerAttr.get(
                ir.IntegerType.get_signless(64), dim - self.lead)).result
        if name == "tgraph.broadcast":
            if self._tile_shape(ins[0]) == self._tile_shape(result):
                return xs[0]
            return ttile.BroadcastOp(rtype, xs[0]).result
        if name == "tgraph.reduce":
            dim = _reduced_dims(op)[0]
            return ttile.ReduceOp(rtype, xs[0], op.attributes["kind"],
                                  ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim)).result
        raise PassError(f"tessera-lower-to-tile cannot tile '{name}'", op.location)

    def _column_reduce(self, op) -> ir.Operation:
        """A reduction over one non-last dimension `d`: instances cover the
        other dimensions (the last one in chunks), and loop over `d`."""
        dims = _reduced_dims(op)
        if len(dims) != 1:
            raise PassError("tessera-lower-to-tile reduces one dimension per kernel; split "
                            f"the reduction over {dims}", op.location)
        d = dims[0]
        src = op.operands[0]
        shape = shape_of(src)
        rank = len(shape)
        last = largest_divisor(shape[-1], 64)
        chunk = largest_divisor(shape[d], max(1, self.options.elementwise_tile_elements // last))
        in_tile = [1] * rank
        in_tile[-1], in_tile[d] = last, chunk
        out_tile = list(in_tile)
        out_tile[d] = 1
        counts = [1 if i == d else (s // last if i == rank - 1 else s) for i, s in enumerate(shape)]
        grid = 1
        for c in counts:
            grid *= c
        in_buf, out_buf = self.inputs[0], self.outputs[0] if self.outputs else None
        bufs = [in_buf] + ([out_buf] if out_buf is not None else [])
        arg_types = [ir.MemRefType(b.type) for b in bufs]
        elt = ir.ShapedType(src.type).element_type
        k, entry = new_kernel(self.name, arg_types, grid, THREADS_PER_BLOCK, in_tile,
                              self.module_block, op.location)
        with ir.InsertionPoint(entry), op.location:
            offsets = grid_offsets(counts, in_tile)
            kind = enum_of(op)
            init = {"sum": 0.0, "max": float("-inf"), "min": float("inf"), "prod": 1.0}[kind]
            acc0 = ttile.FillOp(tile_type(out_tile, elt), ir.FloatAttr.get_f64(init)).result
            loop = scf.ForOp(index(0), index(shape[d]), index(chunk), [acc0])
            with ir.InsertionPoint(loop.body):
                at = list(offsets)
                at[d] = loop.induction_variable
                t = ttile.LoadOp(tile_type(in_tile, elt), entry.arguments[0], at).result
                r = ttile.ReduceOp(tile_type(out_tile, elt), t, op.attributes["kind"],
                                   ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d)).result
                acc = loop.inner_iter_args[0]
                if kind == "min":           # Tile IR has max only: min(a, b) = -max(-a, -b)
                    neg = [ttile.NegOp(x).result for x in (acc, r)]
                    combined = ttile.NegOp(ttile.MaxOp(*neg).result).result
                else:
                    combine = {"sum": ttile.AddOp, "max": ttile.MaxOp, "prod": ttile.MulOp}[kind]
                    combined = combine(acc, r).result
                scf.YieldOp([combined])
            if out_buf is not None:
                ttile.StoreOp(loop.results[0], entry.arguments[1], offsets)
            ttile.ReturnOp()
        return k


#: What loop fusion recomputes inside each consumer instead of reading a
#: buffer that holds it: constants, and broadcasts (reading the small input
#: costs less than writing and reading the full result).
RECOMPUTED = ("tgraph.fill", "tgraph.iota", "tgraph.broadcast")
#: A broadcast's input at most this large lives on until the last consumer
#: that computes the broadcast again (AdamW's scalars); a larger one is not
#: kept past its free, and consumers after it read the broadcast's buffer.
KEPT_ALIVE_BYTES = 256


def _writes(op: ir.Operation, buf: ir.Value) -> bool:
    """Whether `op`, a user of `buf`, may write it: anything but a launch
    reading it, a collective sending it, a free or a return."""
    if op.name == "tsched.launch":
        return buf in _launch_parts(op)[2]
    if op.name == "tsched.collective_start":
        return op.opview.dst == buf
    return op.name not in ("tsched.free", "func.return")


def duplicate_recomputed(sched: ir.Operation, kernels: dict) -> None:
    """Gives every consumer of a constant (fill, iota) launch, and every
    tileable consumer of a broadcast launch, its own copy launched right
    before it, so loop fusion computes the value inside the consumer's
    kernel instead of reading a buffer that holds it. Why broadcasts: CSE
    makes one broadcast serve every consumer of the same shape (AdamW's bias
    corrections and the clipping scale, over every gradient of a shape), and
    its full-size buffer then is written once and read by each (a w128 GPT
    step: 12 such buffers). A broadcast's input must hold its value where a
    copy reads it: written once, before the broadcast, and not yet freed,
    unless it is a few scalars (KEPT_ALIVE_BYTES): its free then moves after
    the last copy's consumer."""
    launches = [op for op in ops_of(sched) if op.name == "tsched.launch"]
    # Each op's position, kept true through the edits below: ops made here
    # are placed where they go and erased ones are forgotten, since an
    # operation's key is its address and a new op may take an erased one's
    # (an unknown op read as "last" once let a copy read its input after the
    # input's free, and only when the allocator did not hand the address on).
    order = {operation_key(op): float(i) for i, op in enumerate(ops_of(sched))}

    def at(op) -> float:
        key = operation_key(op)
        if key not in order and op.parent is not None and op.parent.name != "func.func":
            return at(op.parent)            # (a nested op: where its top-level op is)
        return order[key]

    def erase(op) -> None:
        del order[operation_key(op)]
        op.erase()

    candidates = [op for op in launches if _kernel_op(kernels, op).name in RECOMPUTED]
    for launch in candidates:       # (collected first: the loop erases ops)
        stream, ins, outs = _launch_parts(launch)
        buf = outs[0]
        users = [u.owner.operation for u in buf.uses]
        consumers = [u for u in users if u.name == "tsched.launch" and u != launch]
        if any(u.name not in ("tsched.launch", "tsched.free") for u in users) or not consumers:
            continue
        if _kernel_op(kernels, launch).name == "tgraph.broadcast":
            src = ins[0]
            writers = [u.owner.operation for u in src.uses if _writes(u.owner.operation, src)]
            if len(shape_of(src)) != len(shape_of(buf)) or len(writers) > 1 or \
                    any(at(w) > at(launch) for w in writers) or \
                    (not writers and not isinstance(src.owner, ir.Block)):
                continue
            # A copy reads the input where its consumer runs; past the
            # input's free only for a few scalars: keeping a larger input
            # alive raises the peak (recomputation frees exactly such).
            frees = [u.owner.operation for u in src.uses
                     if u.owner.operation.name == "tsched.free"]
            small = math.prod(shape_of(src)) * 8 <= KEPT_ALIVE_BYTES   # (8 B: the widest)
            consumers = [u for u in consumers if buf not in _launch_parts(u)[2]
                         and _kernel_op(kernels, u).name in ops.TILEABLE
                         and (small or all(at(u) < at(f) for f in frees))]
            if not consumers:
                continue
            last = max(consumers, key=at)
            for free in frees:
                if at(free) < at(last):
                    free.move_after(last)
                    order[operation_key(free)] = at(last) + 0.5
        for consumer in consumers:
            with ir.InsertionPoint(consumer), consumer.location:
                alloc = tsched.AllocOp(ir.MemRefType(buf.type))
                copy = alloc.result
                made = tsched.LaunchOp(launch.attributes["kernel"], stream, ins, [copy])
            for i, v in enumerate(list(consumer.operands)):
                if v == buf:
                    consumer.operands[i] = copy
            with ir.InsertionPoint.after(consumer), consumer.location:
                free = tsched.FreeOp(copy)
            copy_action(consumer, alloc, made, free)
            place = at(consumer)
            order.update({operation_key(alloc): place - 0.5, operation_key(made): place - 0.25,
                          operation_key(free): place + 0.25})
        if any(u.name == "tsched.launch" and u != launch
               for u in (use.owner.operation for use in buf.uses)):
            continue                    # (a consumer that does not fuse reads the original)
        for u in [u.owner.operation for u in buf.uses]:
            if u.name == "tsched.free":
                erase(u)
        alloc = buf.owner
        erase(launch)
        erase(alloc)


def fuse_and_tile(sched: ir.Operation, kernels: dict, module_block, taken: set,
                  gemm: bool, options: TargetOptions, meshes: dict | None = None) -> set:
    """Replaces each fusion group by one launch of a new ttile.kernel; returns
    the names of the tensor kernels the groups consumed. `taken` holds the
    fused kernels' names so far (a constant's kernel, launched once per
    consumer, can start several groups). `gemm`: matmuls (and all_gather +
    matmul kernels, whose symmetric buffers are allocated around the
    launch) become tiled GEMMs."""
    consumed = set()
    for group in fusion_groups(sched, kernels, gemm):
        consumed.update(ir.FlatSymbolRefAttr(l.attributes["kernel"]).value for l in group)
        base = ir.FlatSymbolRefAttr(group[0].attributes["kernel"]).value
        # A single launch keeps its kernel's name (the tensor kernel is erased).
        name = stem = base if len(group) == 1 else f"{base}_fused{len(group)}"
        copy = 1
        while name in taken:
            copy += 1
            name = f"{stem}_{copy}"
        taken.add(name)
        tiler = GroupTiler(group, kernels, name, module_block, options, meshes)
        kernel = tiler.build()
        first = group[0]
        stream = _launch_parts(first)[0]
        # Output buffers must exist where the fused launch goes (the first
        # member's place): their allocs move there, whether they were before
        # it or after (nothing touches a buffer before the launch writing it;
        # see `_hoist` on is_before_in_block). Internal buffers disappear
        # with their frees.
        for b in tiler.outputs:
            owner = b.owner
            if not isinstance(owner, ir.Block) and owner.name == "tsched.alloc":
                owner.move_before(first)
        _launch_with_symmetric(first, name, stream, tiler.inputs, tiler.outputs,
                               tiler.symmetric)
        for launch in group:
            launch.erase()
        for b in tiler.internal:
            for u in [u.owner.operation for u in b.uses]:
                u.erase()
            b.owner.erase()
        kernel.move_before(next(iter(kernels.values())))
    return consumed


def _launch_with_symmetric(at: ir.Operation, kernel: str, stream, ins, outs,
                           symmetric: list) -> None:
    """A launch of `kernel` before `at` (whose pipeline rank it takes), with
    buffers of the `symmetric` types (NVSHMEM's heap) allocated right before
    it, passed after `outs`, and freed right after it."""
    with ir.InsertionPoint(at), at.location:
        scratch = [tsched.AllocOp(t, symmetric=True) for t in symmetric]
        made = tsched.LaunchOp(ir.FlatSymbolRefAttr.get(kernel), stream, ins,
                               outs + [a.result for a in scratch])
    with ir.InsertionPoint.after(made), at.location:
        frees = [tsched.FreeOp(a.result) for a in scratch]
    copy_action(at, made, *scratch, *frees)


def _leaves_function(buf: ir.Value, kernels: dict) -> bool:
    """Whether `buf`, or a reshape of it (a view at run time), is returned."""
    for use in buf.uses:
        user = use.owner.operation
        if user.name == "func.return":
            return True
        if user.name == "tsched.launch" and buf in _launch_parts(user)[1] and \
                ir.FlatSymbolRefAttr(user.attributes["kernel"]).value in kernels and \
                _kernel_op(kernels, user).name == "tgraph.reshape" and \
                _leaves_function(_launch_parts(user)[2][0], kernels):
            return True
    return False


def lower_exchanges(sched: ir.Operation, kernels: dict, module_block, meshes: dict) -> set:
    """Replaces each launch of an NVSHMEM all_to_all's kernel by a launch of
    its exchange kernel (`tile/exchange.py`), its symmetric buffers
    allocated around it. Returns the tensor kernels it consumed."""
    consumed = set()
    for launch in [o for o in ops_of(sched) if o.name == "tsched.launch"]:
        name = ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value
        kop = _kernel_op(kernels, launch) if name in kernels else None
        if kop is None or kop.name != "tgraph.all_to_all":
            continue
        mesh = meshes[ir.FlatSymbolRefAttr(kop.attributes["mesh"]).value]
        stream, ins, outs = _launch_parts(launch)
        in_place = not _leaves_function(outs[0], kernels)
        kernel, symmetric = exchange.exchange_kernel(kop, name, mesh, module_block, in_place)
        if in_place:
            # The result is the symmetric receive buffer: its alloc becomes
            # symmetric (its free stays where it was).
            old = outs[0].owner
            with ir.InsertionPoint(old), old.location:
                made = tsched.AllocOp(outs[0].type, symmetric=True)
            copy_action(old, made)
            outs[0].replace_all_uses_with(made.result)
            old.erase()
            outs, symmetric = [made.result], symmetric[1:]
        _launch_with_symmetric(launch, name, stream, ins, outs, symmetric)
        kernel.move_before(next(iter(kernels.values())))
        launch.erase()
        consumed.add(name)
    return consumed


def lower_attention(sched: ir.Operation, kernels: dict, module_block, cpu_target: bool,
                    options: TargetOptions) -> set:
    """Replaces each attention launch by launches of flash-attention kernels
    (`tile/flash_attention.py`): one for the forward op, two (`_dkdv`, `_dq`)
    for its gradient. Returns the tensor kernels it consumed."""
    consumed = set()
    for launch in [o for o in ops_of(sched) if o.name == "tsched.launch"]:
        name = ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value
        kop = _kernel_op(kernels, launch) if name in kernels else None
        if kop is None or kop.name not in gb.ATTENTION_OPS:
            continue
        stream, ins, outs = _launch_parts(launch)
        if kop.name == "tgraph.attention":
            made = [(flash_attention.forward_kernel(kop, name, ins, outs, module_block,
                                                    cpu_target, options), ins, outs)]
        else:
            made = flash_attention.backward_kernels(kop, name, ins, outs, module_block,
                                                    cpu_target, options)
        with ir.InsertionPoint(launch), launch.location:
            for kernel, k_ins, k_outs in made:
                symbol = ir.FlatSymbolRefAttr.get(ir.StringAttr(kernel.attributes["sym_name"]).value)
                copy_action(launch, tsched.LaunchOp(symbol, stream, k_ins, k_outs))
                kernel.move_before(next(iter(kernels.values())))
        launch.erase()
        consumed.add(name)
    return consumed


def _launched(schedules) -> set[str]:
    """The names of the kernels `schedules` launch."""
    return {ir.FlatSymbolRefAttr(o.attributes["kernel"]).value
            for f in schedules for o in ops_of(f) if o.name == "tsched.launch"}


def run(op, pass_, options: TargetOptions):
    def body():
        module_block = op.regions[0].blocks[0]
        cpu_target = options.resolved_target(op) == "cpu"
        kernels = {ir.StringAttr(f.attributes["sym_name"]).value: f
                   for f in functions(op) if "tsched.kernel" in f.attributes}
        if not kernels:
            return
        schedules = [f for f in functions(op) if "tsched.kernel" not in f.attributes
                     and any(o.name == "tsched.launch" for o in ops_of(f))]
        launched = _launched(schedules)
        for name, kernel in kernels.items():
            if name in launched and _first_op(kernel).name == "func.return":
                # (A check whose result nothing reads is dead code to
                # canonicalize: its kernel is left with nothing to run.)
                raise PassError(f"tessera-lower-to-tile: kernel @{name} computes nothing (a "
                                "tsched.kernel function holds the op it launches)",
                                kernel.location)
        consumed, taken = set(), set()
        for f in schedules:
            duplicate_recomputed(f, kernels)
            consumed |= fuse_and_tile(f, kernels, module_block, taken, not cpu_target, options,
                                      meshes_of(op))
            consumed |= lower_attention(f, kernels, module_block, cpu_target, options)
            consumed |= lower_exchanges(f, kernels, module_block, meshes_of(op))
        launched = _launched(schedules)
        for name, kernel in kernels.items():
            if name in launched and name not in consumed:
                routine = _library_routine(kernel, cpu_target)
                if routine is None:
                    bad = (kernel_body(kernel) or [kernel])[0]
                    raise PassError(f"tessera-lower-to-tile cannot lower '{bad.name}' in kernel "
                                    f"@{name}", bad.location)
                make_library_declaration(kernel, routine, module_block)
            kernel.erase()
    run_reporting(op, pass_, body)
