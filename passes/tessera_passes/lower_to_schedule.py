"""tessera-lower-to-schedule: lower partitioned Graph IR to Schedule IR.

Each partitioned function becomes a per-rank schedule over buffers:

* every compute op becomes a kernel (a private `func.func` on tensors holding
  that one tgraph op, marked `tsched.kernel`) launched on the `compute`
  stream into a freshly allocated buffer;
* every collective starts on the `comm` stream as soon as its operand exists
  (after an event that orders it behind the launch that produced it) and is
  waited for only where its result is first used, so independent compute
  launched in between overlaps the communication;
* buffers are freed after their last use (for a collective's buffers, after
  its wait).

An all_to_all with `transport = nvshmem` (an MoE layer's dispatch or
combine) is not a collective either: it becomes a kernel of its own
(`<fn>_exchange_<n>`) that puts each piece into the peer's symmetric
receive buffer (`tile/exchange.py`). Off the GPU its transport falls back to
the communicator (the request names a GPU kernel; the CPU has none).

An all_gather of a matmul's lhs rows with `transport = nvshmem` is not a
collective: it and the matmul become one kernel (`<fn>_gather_matmul_<n>`),
which `tessera-lower-to-tile` turns into a GEMM that puts its rows into
peers' symmetric buffers and reads theirs as they arrive. Likewise a
reduce_scatter of a matmul's partial sums over rows with `transport =
nvshmem` becomes one kernel with the matmul (`<fn>_matmul_scatter_<n>`): a
GEMM that pushes each partial tile to the rank owning its rows. `transport
= auto` is resolved here: NVSHMEM on the GPU target when the symmetric
buffers the fused kernel needs fit in `TargetOptions.nvshmem_auto_max_bytes`
(256 MiB by default), else the runtime's collective library. Without a
target (option or `tessera.target` attribute) nothing is fused.

A matmul of rows (a 2-D rhs shared by a higher-rank lhs's batches) and a
`tgraph.contract_rows` become 2-D GEMMs over the rows, their operands
reshaped (views) to `[rows, K]` (`gemms_over_rows`).

A value check (`tgraph.check_range`) launches a kernel that reads its
operand's buffer and writes none; its result is that buffer, not a copy.

Argument and result shardings move to `tsched.sharding` attributes.

On the GPU target an attention op whose sequence runs along another
dimension than the second to last (`seq_dim`) gets transposes to and from
`[..., S, D]` around it: the GPU kernels' tiles are a buffer's trailing
dimensions. The CPU kernels read rows where they lie.

A pipeline (after tessera-pipeline-schedule): every op keeps the
`tsched.action` of the Graph IR op it comes from (the rank that runs it), a
`tgraph.transfer` to one rank becomes a `tsched.send` on the sender, right
after the value is made, and a `tsched.recv` on the receiver, waited where
the value is first read; sends are waited at the end of the sender's
program. A transfer to every rank is a `<broadcast>` collective from its
rank. Per-rank code's `tgraph.send` / `tgraph.recv` (each rank's own
program holds its half) become the same `tsched.send` / `tsched.recv`. With
`overlap = false` in `tsched.pipeline`, each collective is waited for where
it starts.

Zero-size tensors launch nothing: a kernel whose results have no elements
is its (empty) result buffers. A sum or matmul whose result has elements
but which reads a zero-size operand (a sum over a zero-size dimension, a
matmul with K = 0, as the backward of a zero-row matmul is) launches a
fill with the reduction's identity, numpy's result (0 for sum and matmul,
-inf / +inf for max / min, 1 for prod).
"""

from __future__ import annotations

import math
from dataclasses import replace

from tessera_mlir import ir
from tessera_mlir.dialects import func, tgraph, tsched

from tessera_compiler.ir import graph_builder as gb
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.pipeline import ACTION, HELD, INFO, copy_action
from tessera_compiler.ir.support import (PassError, arg_attr_dicts, functions, non_tensor_signature,
                                         ops_of, run_reporting, set_dict_entry)
from tessera_compiler.ir.types import enum_of, memref_of, shape_of

COLLECTIVES = {"tgraph.all_reduce": "all_reduce", "tgraph.all_gather": "all_gather",
               "tgraph.reduce_scatter": "reduce_scatter", "tgraph.all_to_all": "all_to_all",
               "tgraph.ring_shift": "shift"}
NOT_COMPUTE = {"tgraph.mesh", "tgraph.shard", "tgraph.grad", "tgraph.send", "tgraph.recv"}
# What a reduction over no elements is.
EMPTY_REDUCTION = {"sum": 0.0, "max": -math.inf, "min": math.inf, "prod": 1.0}


def _is_empty(value: ir.Value) -> bool:
    return 0 in ir.ShapedType(value.type).shape


def _empty_reduction_value(op: ir.Operation) -> float | None:
    """The value every element of `op`'s result has when it reads a
    zero-size operand but has elements itself, or None when it is not such
    an op."""
    if not any(_is_empty(v) for v in op.operands) or all(_is_empty(r) for r in op.results):
        return None
    if op.name == "tgraph.matmul":
        return 0.0
    if op.name == "tgraph.reduce":
        return EMPTY_REDUCTION[enum_of(op)]
    return None


def is_compute(op: ir.Operation) -> bool:
    return op.name.startswith("tgraph.") and op.name not in COLLECTIVES \
        and op.name not in NOT_COMPUTE


def hoist_collectives(func_op: ir.Operation) -> None:
    """Moves each collective right after the last op producing one of its
    operands (a ragged all_to_all's counts too), keeping the collectives'
    relative order, so communication starts as early as it can."""
    block = func_op.regions[0].blocks[0]
    anchors: dict = {}
    at = {op: float(i) for i, op in enumerate(ops_of(func_op))}    # where each op is
    for op in ops_of(func_op):
        if op.name not in COLLECTIVES:
            continue
        owners = [v.owner for v in op.operands if not isinstance(v.owner, ir.Block)]
        key = max(owners, key=at.__getitem__) if owners else None
        anchor = anchors.get(key, key)
        if anchor is None:
            # Operands are function arguments: start at the top of the body.
            op.move_before(block.operations[0].operation)
            at[op] = -1.0
        else:
            op.move_after(anchor)
            at[op] = at[anchor] + 1e-6
        anchors[key] = op


class ScheduleBuilder:
    def __init__(self, func_op: ir.Operation, fused: set = frozenset()):
        self.src = func_op
        self.action = None             # the tsched.action of the op being lowered
        self.sends: list = []          # (token, action) of every send, waited at the end
        self.transfers: dict = {}      # producer op -> transfers reading its result
        info = ir.DictAttr(func_op.attributes[INFO]) if INFO in func_op.attributes else None
        self.overlap = info is None or "overlap" not in info or ir.BoolAttr(info["overlap"]).value
        self.name = ir.StringAttr(func_op.attributes["sym_name"]).value
        self.buffers: dict = {}        # tensor value -> buffer value
        self.pending: dict = {}        # buffer -> token of the collective writing it
        self.waited: dict = {}         # token -> streams already made to wait for it
        self.on_compute: set = set()   # buffers last written by a compute launch
        self.kernel_count = 0
        self.fused = fused             # collectives lowered inside their matmul's kernel
        # (Parameterless types, spelled as IR: nothing to read back from them.)
        self.stream_t = ir.Type.parse("!tsched.stream")
        self.token_t = ir.Type.parse("!tsched.token")
        self.event_t = ir.Type.parse("!tsched.event")

    def tag(self, op, action=None):
        """Marks `op` as run only by the rank of the op being lowered (or of `action`)."""
        action = action if action is not None else self.action
        if action is not None:
            op.operation.attributes[ACTION] = action
        return op

    # -- kernels ---------------------------------------------------------
    def make_kernel(self, ops: list[ir.Operation], kind: str | None = None,
                    returns: bool = True) -> tuple[str, list[ir.Value]]:
        """A kernel holding `ops` (in order; each later op may read earlier
        ones' results) and the values it reads from outside, its inputs (one
        per operand, repeats included, so a one-op kernel's inputs are its
        op's operands). It returns the last op's results (nothing unless
        `returns`: a value check writes no buffer)."""
        kind = kind or ops[0].name.split(".", 1)[1]
        name = f"{self.name}_{kind}_{self.kernel_count}"
        self.kernel_count += 1
        inside = {r for op in ops for r in op.results}
        inputs = [v for op in ops for v in op.operands if v not in inside]
        out_types = [r.type for r in ops[-1].results] if returns else []
        with ir.InsertionPoint(self.src), ops[-1].location:
            k = func.FuncOp(name, ([v.type for v in inputs], out_types), visibility="private")
            k.attributes["tsched.kernel"] = ir.UnitAttr.get()
            entry = k.add_entry_block()
            with ir.InsertionPoint(entry):
                args, mapped = iter(entry.arguments), {}
                for op in ops:
                    clone = op.clone()
                    for i, v in enumerate(list(op.operands)):
                        clone.operands[i] = mapped[v] if v in inside else next(args)
                    for r, c in zip(op.results, clone.results):
                        mapped[r] = c
                    for attr in ("tgraph.sharding", "tgraph.recompute"):   # (kernels merge
                        if attr in clone.attributes:                       # by their text)
                            del clone.attributes[attr]
                func.ReturnOp(list(clone.results) if returns else [])
        return name, inputs

    def launch(self, ops: list[ir.Operation], kind: str | None, compute) -> None:
        """Launches a kernel of `ops` on the compute stream into new buffers
        for the last op's results."""
        results = list(ops[-1].results)
        inside = {r for op in ops for r in op.results}
        reads = list(dict.fromkeys(v for op in ops for v in op.operands if v not in inside))
        identity = _empty_reduction_value(ops[0]) if len(ops) == 1 else None
        if all(_is_empty(r) for r in results):
            ops = []                                   # nothing to compute
        elif identity is not None:
            with ir.InsertionPoint(ops[0]):
                ops = [tgraph.FillOp(results[0].type, ir.FloatAttr.get_f64(identity)).operation]
            kind = "fill"
        kernel, inputs = self.make_kernel(ops, kind) if ops else (None, [])
        ins = [self.use(v, compute) for v in inputs]
        for v in reads:     # what a fill or no launch no longer reads: its collective is waited
            self.use(v, compute)
        outs = [self.tag(tsched.AllocOp(memref_of(r.type))).result for r in results]
        if ops:
            self.tag(tsched.LaunchOp(ir.FlatSymbolRefAttr.get(kernel), compute, ins, outs))
        for r, out in zip(results, outs):
            self.buffers[r] = out
            self.on_compute.add(out)

    def check(self, op: ir.Operation, compute) -> None:
        """A value check (`tgraph.check_range`) launches a kernel that reads
        its operand's buffer and writes none: its result is that buffer, not
        a copy (the runtime reads the check's flag with the step's results)."""
        buf = self.use(op.operands[0], compute)
        self.buffers[op.results[0]] = buf
        if not _is_empty(op.operands[0]):               # (no elements: nothing to check)
            kernel, _ = self.make_kernel([op], returns=False)
            self.tag(tsched.LaunchOp(ir.FlatSymbolRefAttr.get(kernel), compute, [buf], []))

    # -- buffers ---------------------------------------------------------
    def use(self, value: ir.Value, stream: ir.Value) -> ir.Value:
        """The buffer holding `value`, after making `stream` wait for the
        collective writing it (once per stream: each stream needs its own wait)."""
        buf = self.buffers[value]
        token = self.pending.get(buf)
        if token is not None:
            streams = self.waited.setdefault(token, [])
            if stream not in streams:
                self.tag(tsched.CollectiveWaitOp(token, stream))
                streams.append(stream)
        return buf

    def build(self) -> ir.Operation:
        src = self.src
        block = src.regions[0].blocks[0]
        in_types = [memref_of(a.type) for a in block.arguments]
        ret = ops_of(src)[-1]
        out_types = [memref_of(v.type) for v in ret.operands]
        arg_dicts = [set_dict_entry(ir.DictAttr.get({}), "tsched.sharding", d["tgraph.sharding"])
                     if "tgraph.sharding" in d else ir.DictAttr.get({})
                     for d in arg_attr_dicts(src, "arg_attrs")]
        res_dicts = [set_dict_entry(ir.DictAttr.get({}), "tsched.sharding", d["tgraph.sharding"])
                     if "tgraph.sharding" in d else ir.DictAttr.get({})
                     for d in arg_attr_dicts(src, "res_attrs")]
        # (A pipeline's result kept on the rank making it says where.)
        res_dicts = [set_dict_entry(r, HELD, d[HELD]) if HELD in d else r
                     for r, d in zip(res_dicts, arg_attr_dicts(src, "res_attrs"))]
        with ir.InsertionPoint(src), src.location:
            sched = func.FuncOp(self.name + ".schedule", (in_types, out_types))
            if INFO in src.attributes:
                sched.attributes[INFO] = src.attributes[INFO]
            sched.attributes["arg_attrs"] = ir.ArrayAttr.get(arg_dicts)
            sched.attributes["res_attrs"] = ir.ArrayAttr.get(res_dicts)
            entry = sched.add_entry_block(arg_locs=[a.location for a in block.arguments])
        for tensor_arg, buf in zip(block.arguments, entry.arguments):
            self.buffers[tensor_arg] = buf

        with ir.InsertionPoint(entry), src.location:
            compute = tsched.StreamOp(self.stream_t, "compute").result
            comm = tsched.StreamOp(self.stream_t, "comm").result
            for op in ops_of(src):
                if op.name == "tgraph.transfer" and "to" in op.attributes:
                    producer = op.operands[0].owner
                    self.transfers.setdefault(producer, []).append(op)
            for op in ops_of(src):
                self.action = op.attributes[ACTION] if ACTION in op.attributes else None
                with op.location:
                    self.lower_op(op, compute, comm)
                for transfer in self.transfers.get(op, []):
                    with transfer.location:
                        self.send(transfer, compute, comm)
        self.insert_frees(entry)
        return sched.operation

    def start_on_comm(self, value, compute, comm) -> ir.Value:
        """`value`'s buffer, ordered after the compute launch that wrote it."""
        src_buf = self.use(value, comm)
        if src_buf in self.on_compute:
            event = self.tag(tsched.EventRecordOp(self.event_t, compute)).result
            self.tag(tsched.EventWaitOp(event, comm))
        return src_buf

    def send(self, transfer: ir.Operation, compute, comm) -> None:
        """The sender's half of a transfer, right after its value is made."""
        attrs = transfer.attributes
        buf = self.start_on_comm(transfer.operands[0], compute, comm)
        token = self.tag(tsched.SendOp(self.token_t, buf, attrs["to"], comm, attrs["mesh"],
                                       attrs["axis"])).result
        self.sends.append((token, self.action))

    def receive(self, transfer: ir.Operation, compute, comm) -> None:
        """The receiver's half of a transfer (the sender's was emitted with
        its value); a transfer to every rank is a broadcast from its rank."""
        attrs = transfer.attributes
        dst = self.tag(tsched.AllocOp(memref_of(transfer.results[0].type))).result
        if "to" in attrs or transfer.name == "tgraph.recv":
            token = self.tag(tsched.RecvOp(self.token_t, dst, attrs["from"], comm, attrs["mesh"],
                                           attrs["axis"])).result
        else:
            # Only the root reads the value: what orders it runs there alone.
            self.action = ir.DictAttr.get({"axis": attrs["axis"], "rank": attrs["from"]})
            src_buf = self.start_on_comm(transfer.operands[0], compute, comm)
            token = tsched.CollectiveStartOp(
                self.token_t, tsched.CollectiveKindAttr.get("broadcast"), src_buf, dst, [], comm,
                attrs["mesh"], attrs["axis"], root=attrs["from"]).result
        self.pending[dst] = token
        self.buffers[transfer.results[0]] = dst
        if not list(transfer.results[0].uses):
            self.use(transfer.results[0], compute)      # unread: done with it at once

    def lower_op(self, op: ir.Operation, compute, comm) -> None:
        if op.name in ("tgraph.transfer", "tgraph.recv"):
            self.receive(op, compute, comm)
            return
        if op.name == "tgraph.send":                   # per-rank code's own send
            self.send(op, compute, comm)
            return
        if op.name == "func.return":
            for token, action in self.sends:
                self.tag(tsched.CollectiveWaitOp(token, comm), action)
            bufs = [self.use(v, compute) for v in op.operands]
            func.ReturnOp(bufs)
            return
        if op in self.fused:
            if op.name == "tgraph.reduce_scatter":     # with the matmul it sums
                self.launch([op.operands[0].owner, op], "matmul_scatter", compute)
            elif op.name == "tgraph.all_to_all":       # a kernel of its own
                self.launch([op], "exchange", compute)
            return                                     # a gather: with its matmul
        if op.name == "tgraph.check_range":
            self.check(op, compute)
            return
        if is_compute(op):
            gather = op.operands[0].owner if op.name == "tgraph.matmul" else None
            if gather in self.fused:
                self.launch([gather, op], "gather_matmul", compute)
            elif not (op.name == "tgraph.matmul" and
                      any(u.owner in self.fused for u in op.results[0].uses)):
                self.launch([op], None, compute)       # (else: with its reduce_scatter)
            return
        if op.name in COLLECTIVES:
            src_buf = self.start_on_comm(op.operands[0], compute, comm)
            counts = [self.start_on_comm(v, compute, comm) for v in list(op.operands)[1:]]
            dst = self.tag(tsched.AllocOp(memref_of(op.results[0].type))).result
            attrs = op.attributes
            kind = tsched.CollectiveKindAttr.get(COLLECTIVES[op.name])
            start = tsched.CollectiveStartOp(
                self.token_t, kind, src_buf, dst, counts, comm, attrs["mesh"], attrs["axis"],
                reduction=attrs["kind"] if "kind" in attrs else None,
                dim=attrs["dim"] if "dim" in attrs else attrs["split_dim"] if "split_dim" in attrs
                else None,
                concat_dim=attrs["concat_dim"] if "concat_dim" in attrs else None,
                offset=attrs["offset"] if "offset" in attrs else None,
                deterministic=attrs["deterministic"] if "deterministic" in attrs else None)
            self.tag(start)
            self.pending[dst] = start.result
            self.buffers[op.results[0]] = dst
            if not list(op.results[0].uses) or not self.overlap:
                # Nothing reads it (a per-rank body's forward collective whose
                # value only its backward recomputes): every rank still runs
                # it, so wait for it at once and let its buffers go.
                self.use(op.results[0], compute)
            return
        raise PassError(f"tessera-lower-to-schedule cannot lower '{op.name}'", op.location)

    @staticmethod
    def insert_frees(entry: ir.Block) -> None:
        """Frees every allocated, non-returned buffer after its last use. A
        collective keeps its buffers in use until its token is waited on."""
        ops = [o.operation for o in entry.operations]
        last_use: dict = {}
        token_buffers: dict = {}
        allocated = []                             # (buffer, index of its alloc)
        for i, op in enumerate(ops):
            if op.name == "tsched.alloc":
                allocated.append((op.results[0], i))
            if op.name == "tsched.collective_start":
                token_buffers[op.results[0]] = [v for v in op.operands      # not the stream
                                                if isinstance(v.type, ir.MemRefType)]
            if op.name in ("tsched.send", "tsched.recv"):
                token_buffers[op.results[0]] = [op.operands[0]]
            for v in op.operands:
                last_use[v] = i
                for b in token_buffers.get(v, []):
                    last_use[b] = i
        returned = set(ops[-1].operands)
        for buf, made in allocated:
            if buf in returned:
                continue
            at = ops[last_use.get(buf, made)]
            with ir.InsertionPoint.after(at), at.location:
                free = tsched.FreeOp(buf)
            copy_action(buf.owner, free)           # freed by the rank that made it


def _nbytes(value: ir.Value) -> int:
    """Bytes of a float tensor (fused collectives move matmul operands and products)."""
    t = ir.RankedTensorType(value.type)
    return math.prod(t.shape) * ir.FloatType(t.element_type).width // 8


def _fusable_gather(gather: ir.Operation) -> str | None:
    """Why `gather` cannot be fused into the GEMM reading it, or None."""
    users = [u.owner for u in gather.results[0].uses]
    rank = len(ir.RankedTensorType(gather.results[0].type).shape)
    if rank != 2:
        return f"the gathered operand has rank {rank} (the fused kernel takes 2-D rows)"
    if ir.IntegerAttr(gather.attributes["dim"]).value != 0:
        return "it gathers columns, not rows"
    if len(users) != 1 or users[0].name != "tgraph.matmul" or \
            users[0].operands[0] != gather.results[0]:
        return "its result is read by something other than one matmul's lhs"
    return None


def _fusable_scatter(scatter: ir.Operation) -> str | None:
    """Why `scatter` cannot be fused into the GEMM producing its operand, or None."""
    source = scatter.operands[0].owner
    rank = len(ir.RankedTensorType(scatter.operands[0].type).shape)
    if rank != 2:
        return f"the scattered operand has rank {rank} (the fused kernel takes 2-D rows)"
    if ir.IntegerAttr(scatter.attributes["dim"]).value != 0:
        return "it scatters columns, not rows"
    if enum_of(scatter) != "sum":
        return f"it reduces with '{enum_of(scatter)}', not a sum"
    if isinstance(source, ir.Block) or source.name != "tgraph.matmul" or \
            len(list(source.results[0].uses)) != 1:
        return "its operand is not a matmul's product that nothing else reads"
    return None


def _exchangeable(exchange: ir.Operation) -> str | None:
    """Why `exchange` (an all_to_all) cannot be an NVSHMEM exchange kernel,
    or None: its pieces must be contiguous, and of one shape, in its operand
    and its result (the kernel puts whole pieces)."""
    concat = ir.IntegerAttr(exchange.attributes["concat_dim"]).value
    # (The verifier keeps split_dim and concat_dim apart: concat_dim grew by
    # the axis size.)
    parts = shape_of(exchange.results[0])[concat] // shape_of(exchange.operands[0])[concat]
    pieces = []
    for what, value, dim in (("operand", exchange.operands[0], "split_dim"),
                             ("result", exchange.results[0], "concat_dim")):
        d = ir.IntegerAttr(exchange.attributes[dim]).value
        shape = shape_of(value)
        if any(n != 1 for n in shape[:d]):
            return (f"its {what}'s pieces are not contiguous (dimensions {shape[:d]} before "
                    f"{dim} {d})")
        shape[d] //= parts
        pieces.append(shape)
    if pieces[0] != pieces[1]:
        return f"its pieces are {pieces[0]} in the operand but {pieces[1]} in the result"
    return None


FUSABLE = {"tgraph.all_gather": _fusable_gather, "tgraph.reduce_scatter": _fusable_scatter,
           "tgraph.all_to_all": _exchangeable}


def _symmetric_bytes(op: ir.Operation) -> int:
    """Bytes of the symmetric buffers `op`'s fused kernel needs."""
    if op.name in ("tgraph.all_gather", "tgraph.all_to_all"):
        return _nbytes(op.results[0])
    return 2 * _nbytes(op.operands[0])


def choose_transport(op: ir.Operation, gpu: bool, auto_max_bytes: int
                     ) -> tuple[str, str, str | None]:
    """(transport, why, error) for a collective with a `transport`
    attribute: "nvshmem" (a kernel: fused into its matmul's GEMM, or an
    all_to_all's exchange kernel) or "nccl" (the runtime's collective
    library), the reason in words (the collective report prints it), and
    the error an explicit request that cannot be honoured is (else None).
    `auto` picks NVSHMEM when the kernel's symmetric buffers (a gather's
    gathered operand; a reduce-scatter's two copies of the product; an
    exchange's received pieces) take at most `auto_max_bytes`: by default a
    quarter of NVSHMEM's default symmetric heap (1 GiB per PE), which every
    such kernel's buffers share (a bound from memory, not yet from
    measurement: no GPU has run them)."""
    asked = enum_of(op, "transport")
    what = op.name.split(".", 1)[1]
    into = "an exchange kernel" if what == "all_to_all" else "a GEMM"
    why_not = FUSABLE[op.name](op)
    if asked == "nccl":
        return "nccl", "asked for", None
    if not gpu:
        if asked == "nvshmem" and what != "all_to_all":
            return "nccl", "", ("transport = nvshmem needs the GPU target (NVSHMEM kernels are "
                                "CUDA); use 'auto' to fall back to the collective library")
        # An MoE layer's request the CPU cannot honour: the communicator.
        return "nccl", f"{asked} asked for; the CPU target has no NVSHMEM kernels", None
    if why_not:
        if asked == "nvshmem":
            return "nccl", "", (f"transport = nvshmem: this {what} cannot be fused into {into}: "
                                f"{why_not}; use 'auto' or 'nccl'")
        return "nccl", f"auto: not fusable into {into}: {why_not}", None
    if asked == "nvshmem":
        return "nvshmem", "asked for", None
    size = _symmetric_bytes(op)
    if size <= auto_max_bytes:
        return "nvshmem", (f"auto: its symmetric buffers ({size:,} B) fit nvshmem-auto-max-bytes "
                           f"({auto_max_bytes:,} B)"), None
    return "nccl", (f"auto: its symmetric buffers ({size:,} B) exceed nvshmem-auto-max-bytes "
                    f"({auto_max_bytes:,} B)"), None


def resolve_transports(func_op: ir.Operation, gpu: bool, auto_max_bytes: int) -> set:
    """Settles each all_gather's, reduce_scatter's and all_to_all's
    transport (`choose_transport`) and returns the collectives that become
    kernels: fused into their matmul's GEMM, or an exchange of their own."""
    fused = set()
    for op in ops_of(func_op):
        if op.name not in FUSABLE or "transport" not in op.attributes:
            continue
        transport, _, error = choose_transport(op, gpu, auto_max_bytes)
        if error:
            raise PassError(error, op.location)
        op.attributes["transport"] = tgraph.TransportAttr.get(transport)
        if transport == "nvshmem":
            fused.add(op)
    return fused


def _is_graph_function(f: ir.Operation) -> bool:
    """Graph IR: tgraph ops, or (an identity, a pass-through) tensors in its
    signature and no Schedule IR yet."""
    body = ops_of(f)
    if any(o.name.startswith("tgraph.") for o in body):
        return True
    return not any(o.name.startswith("tsched.") for o in body) and non_tensor_signature(f) is None


def attention_rows_second_to_last(func_op: ir.Operation) -> None:
    """GPU target: its attention kernels read tiles of a buffer's trailing
    dimensions (TMA boxes, cp.async rows), so an attention op whose
    sequence runs along another `seq_dim` has its operands transposed to
    `[..., S, D]` and its results back: the copies the CPU target's kernels,
    which read rows where they lie, do without."""
    for op in [o for o in ops_of(func_op) if o.name in gb.ATTENTION_OPS]:
        rank, seq = len(shape_of(op.operands[0])), gb.seq_dim_of(op)
        if seq == rank - 2:
            continue
        perm = [d for d in range(rank) if d not in (seq, rank - 1)] + [seq, rank - 1]
        back = [perm.index(d) for d in range(rank)]
        spec = replace(gb.AttentionSpec.of(op), seq_dim=None)
        # q, k, v (and dout, lse, delta) run along seq_dim; the mask and
        # segment ids are [lead..., Sq, Sk] / [lead..., S, 1] whatever it is.
        rows = list(op.operands)[:len(op.operands) - len(spec.sides)]
        with ir.InsertionPoint(op), op.location:
            moved: dict = {}            # one transpose per distinct operand
            for v in rows:
                if v not in moved:
                    moved[v] = gb.transpose(v, perm)
            ins = [moved[v] for v in rows]
            outs = list(gb.attention(*ins, spec) if op.name == "tgraph.attention"
                        else gb.attention_grad(*ins, spec))
            # (A result nothing reads, as a forward's lse often is, stays put.)
            results = [gb.transpose(new, back) if list(old.uses) else None
                       for old, new in zip(op.results, outs)]
        copy_action(op, outs[0].owner, *(v.owner for v in list(moved.values()) + results if v))
        for old, new in zip(op.results, results):
            if new is not None:
                old.replace_all_uses_with(new)
        op.erase()


def gemms_over_rows(func_op: ir.Operation) -> None:
    """A matmul whose rhs is 2-D and lhs of higher rank (a linear layer over
    `[B, S, K]` rows) and a `tgraph.contract_rows` (its weight gradient)
    become 2-D GEMMs over the rows: their operands are reshaped (views of
    the local buffers, which are contiguous) to `[rows, K]`, contract_rows's
    lhs transposed (tessera-fold-transposes makes that a GEMM flag). The
    Graph IR keeps the rows in their dimensions so that a split of any of
    them partitions; once shapes are local, every GEMM is 2-D."""
    rows: dict = {}             # a value -> its [rows, K] view (one per value)
    for op in ops_of(func_op):
        name = op.name
        if name not in ("tgraph.matmul", "tgraph.contract_rows") or (name == "tgraph.matmul" and (
                len(shape_of(op.operands[0])) == 2 or len(shape_of(op.operands[1])) != 2)):
            continue
        made = []

        def kept(v: ir.Value) -> ir.Value:
            made.append(v.owner)
            return v

        def flat(v: ir.Value) -> ir.Value:
            if len(shape_of(v)) == 2:
                return v
            if v not in rows:
                rows[v] = kept(gb.reshape(v, [math.prod(shape_of(v)[:-1]), shape_of(v)[-1]]))
            return rows[v]
        with ir.InsertionPoint(op), op.location:
            a, b = flat(op.operands[0]), flat(op.operands[1])
            if name == "tgraph.matmul":
                transport = enum_of(op, "transport") if "transport" in op.attributes else None
                product = kept(gb.matmul(a, b, transport))
                out = kept(gb.reshape(product, shape_of(op.results[0])))
                rows[out] = product
            else:
                out = kept(gb.matmul(kept(gb.swap_last(a)), b))
        # (A cached [rows, K] view takes its first reader's pipeline action:
        # autodiff makes a linear layer's dx, which reads it too, before its dW.)
        copy_action(op, *made)
        op.results[0].replace_all_uses_with(out)
        op.erase()


def lower_function(func_op: ir.Operation, gpu: bool, options: TargetOptions) -> None:
    if "tgraph.partitioned" not in func_op.attributes:
        raise PassError("run tessera-partition before tessera-lower-to-schedule "
                        f"(function @{ir.StringAttr(func_op.attributes['sym_name']).value} is not partitioned)",
                        func_op.location)
    gemms_over_rows(func_op)
    if gpu:
        attention_rows_second_to_last(func_op)
    fused = resolve_transports(func_op, gpu, options.nvshmem_auto_max_bytes)
    hoist_collectives(func_op)
    builder = ScheduleBuilder(func_op, fused)
    sched = builder.build()
    name = builder.name
    func_op.erase()
    sched.attributes["sym_name"] = ir.StringAttr.get(name)


def run(op, pass_, options: TargetOptions):
    def body():
        gpu = options.resolved_target(op, default="cpu") == "gpu"
        for f in list(functions(op)):
            if "tsched.kernel" in f.attributes or not _is_graph_function(f):
                continue
            lower_function(f, gpu, options)
    run_reporting(op, pass_, body)
