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

Argument and result shardings move to `tsched.sharding` attributes.
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import func, tsched

from tessera_compiler.passes_common import (PassError, arg_attr_dicts, functions,
                                            ops_of, run_reporting, set_dict_entry)

COLLECTIVES = {"tgraph.all_reduce": "all_reduce", "tgraph.all_gather": "all_gather",
               "tgraph.reduce_scatter": "reduce_scatter", "tgraph.all_to_all": "all_to_all"}
NOT_COMPUTE = {"tgraph.mesh", "tgraph.shard", "tgraph.grad"}


def is_compute(op: ir.Operation) -> bool:
    return op.name.startswith("tgraph.") and op.name not in COLLECTIVES \
        and op.name not in NOT_COMPUTE


def memref_of(tensor_type: ir.Type) -> ir.MemRefType:
    t = ir.RankedTensorType(tensor_type)
    return ir.MemRefType.get(list(t.shape), t.element_type)


def hoist_collectives(func_op: ir.Operation) -> None:
    """Moves each collective right after the op producing its operand, keeping
    the collectives' relative order, so communication starts as early as it can."""
    block = func_op.regions[0].blocks[0]
    anchors: dict = {}
    for op in ops_of(func_op):
        if op.name not in COLLECTIVES:
            continue
        operand = op.operands[0]
        owner = operand.owner
        key = None if isinstance(owner, ir.Block) else owner
        anchor = anchors.get(key, key)
        if anchor is None:
            # Operand is a function argument: start at the top of the body.
            op.move_before(block.operations[0].operation)
        else:
            op.move_after(anchor)
        anchors[key] = op


class ScheduleBuilder:
    def __init__(self, func_op: ir.Operation):
        self.src = func_op
        self.name = ir.StringAttr(func_op.attributes["sym_name"]).value
        self.buffers: dict = {}        # tensor value -> buffer value
        self.pending: dict = {}        # buffer -> token of the collective writing it
        self.waited: dict = {}         # token -> streams already made to wait for it
        self.on_compute: set = set()   # buffers last written by a compute launch
        self.kernel_count = 0
        self.stream_t = ir.Type.parse("!tsched.stream")
        self.token_t = ir.Type.parse("!tsched.token")
        self.event_t = ir.Type.parse("!tsched.event")

    # -- kernels ---------------------------------------------------------
    def make_kernel(self, op: ir.Operation) -> str:
        kind = op.name.split(".", 1)[1]
        name = f"{self.name}_{kind}_{self.kernel_count}"
        self.kernel_count += 1
        in_types = [v.type for v in op.operands]
        out_types = [r.type for r in op.results]
        with ir.InsertionPoint(self.src), op.location:
            k = func.FuncOp(name, (in_types, out_types), visibility="private")
            k.attributes["tsched.kernel"] = ir.UnitAttr.get()
            entry = k.add_entry_block()
            with ir.InsertionPoint(entry):
                clone = op.clone()
                for i, arg in enumerate(entry.arguments):
                    clone.operands[i] = arg
                if "tgraph.sharding" in clone.attributes:
                    del clone.attributes["tgraph.sharding"]
                func.ReturnOp(list(clone.results))
        return name

    # -- buffers ---------------------------------------------------------
    def use(self, value: ir.Value, stream: ir.Value) -> ir.Value:
        """The buffer holding `value`, after making `stream` wait for the
        collective writing it (once per stream: each stream needs its own wait)."""
        buf = self.buffers[value]
        token = self.pending.get(buf)
        if token is not None:
            streams = self.waited.setdefault(token, [])
            if stream not in streams:
                tsched.CollectiveWaitOp(token, stream)
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
        with ir.InsertionPoint(src), src.location:
            sched = func.FuncOp(self.name + ".schedule", (in_types, out_types))
            sched.attributes["arg_attrs"] = ir.ArrayAttr.get(arg_dicts)
            sched.attributes["res_attrs"] = ir.ArrayAttr.get(res_dicts)
            entry = sched.add_entry_block(arg_locs=[a.location for a in block.arguments])
        for tensor_arg, buf in zip(block.arguments, entry.arguments):
            self.buffers[tensor_arg] = buf

        with ir.InsertionPoint(entry), src.location:
            compute = tsched.StreamOp(self.stream_t, "compute").result
            comm = tsched.StreamOp(self.stream_t, "comm").result
            for op in ops_of(src):
                with op.location:
                    self.lower_op(op, compute, comm)
        self.insert_frees(entry)
        return sched.operation

    def lower_op(self, op: ir.Operation, compute, comm) -> None:
        if op.name == "func.return":
            bufs = [self.use(v, compute) for v in op.operands]
            func.ReturnOp(bufs)
            return
        if is_compute(op):
            kernel = self.make_kernel(op)
            ins = [self.use(v, compute) for v in op.operands]
            outs = [tsched.AllocOp(memref_of(r.type)).result for r in op.results]
            tsched.LaunchOp(ir.FlatSymbolRefAttr.get(kernel), compute, ins, outs)
            for r, out in zip(op.results, outs):
                self.buffers[r] = out
                self.on_compute.add(out)
            return
        if op.name in COLLECTIVES:
            src_buf = self.use(op.operands[0], comm)
            if src_buf in self.on_compute:
                event = tsched.EventRecordOp(self.event_t, compute).result
                tsched.EventWaitOp(event, comm)
            dst = tsched.AllocOp(memref_of(op.results[0].type)).result
            attrs = op.attributes
            kind = ir.Attribute.parse(f"#tsched.collective<{COLLECTIVES[op.name]}>")
            start = tsched.CollectiveStartOp(
                self.token_t, kind, src_buf, dst, comm, attrs["mesh"], attrs["axis"],
                reduction=attrs["kind"] if "kind" in attrs else None,
                dim=attrs["dim"] if "dim" in attrs else attrs["split_dim"] if "split_dim" in attrs
                else None,
                concat_dim=attrs["concat_dim"] if "concat_dim" in attrs else None,
                deterministic=attrs["deterministic"] if "deterministic" in attrs else None)
            self.pending[dst] = start.result
            self.buffers[op.results[0]] = dst
            return
        raise PassError(f"tessera-lower-to-schedule cannot lower '{op.name}'", op.location)

    @staticmethod
    def insert_frees(entry: ir.Block) -> None:
        """Frees every allocated, non-returned buffer after its last use. A
        collective keeps its buffers in use until its token is waited on."""
        ops = [o.operation for o in entry.operations]
        last_use: dict = {}
        token_buffers: dict = {}
        allocated = []
        for i, op in enumerate(ops):
            if op.name == "tsched.alloc":
                allocated.append(op.results[0])
            if op.name == "tsched.collective_start":
                token_buffers[op.results[0]] = list(op.operands)[:2]
            for v in op.operands:
                last_use[v] = i
                for b in token_buffers.get(v, []):
                    last_use[b] = i
        returned = set(ops[-1].operands)
        for buf in allocated:
            if buf in returned:
                continue
            at = ops[last_use.get(buf, ops.index(buf.owner))]
            with ir.InsertionPoint.after(at), at.location:
                tsched.FreeOp(buf)


def lower_function(func_op: ir.Operation) -> None:
    if "tgraph.partitioned" not in func_op.attributes:
        raise PassError("run tessera-partition before tessera-lower-to-schedule "
                        f"(function @{ir.StringAttr(func_op.attributes['sym_name']).value} is not partitioned)",
                        func_op.location)
    hoist_collectives(func_op)
    builder = ScheduleBuilder(func_op)
    sched = builder.build()
    name = builder.name
    func_op.erase()
    sched.attributes["sym_name"] = ir.StringAttr.get(name)


def run(op, pass_):
    def body():
        for f in list(functions(op)):
            if "tsched.kernel" in f.attributes or not any(
                    o.name.startswith("tgraph.") for o in ops_of(f)):
                continue
            lower_function(f)
    run_reporting(op, pass_, body)
