"""tessera-pipeline-schedule: turn a partitioned, microbatch-unrolled step
into every pipeline rank's program, in one function.

Runs on functions with a `tgraph.pipeline` attribute (`axis`, `schedule`,
`microbatches`, `stages`: the stage calls per microbatch; see
tessera.pipeline), after tessera-partition. The tracer tagged every op with
its stage call and microbatch, and autodiff marked the backward ops (both in
locations, see tessera_compiler.ir.pipeline). This pass

1. maps stage call `i` to a virtual stage (interleaved: `i`, on rank
   `i mod p`; otherwise the calls of rank `i // (n/p)` form one stage) and
   each op to an action: F, or for backward ops B when the previous stage
   waits for its result (the input's gradient and what it needs) and W
   otherwise (the weights' gradients). Only zero_bubble keeps W apart; the
   other schedules run each W with its B;
2. costs every action (flops of its ops, microbatch 0) and simulates the
   schedule (`ir.pipeline.simulate`): every rank's action order;
3. places the ops no stage owns (the step's combination of the
   microbatches' results, pipeline.run's `then`: an optimizer update) on
   the rank holding most of their operands' elements (a step argument
   counting for the rank whose stage reads it): right after the last of
   their operands' actions when that is on this rank, else in the rank's
   end action (kind E, after all its pipeline work); input slices and
   constants with their users (copied onto each rank that uses them);
4. connects the ranks: a value used on another rank than its own becomes a
   `tgraph.transfer` to it (its recv at the start of the first action that
   reads it; recvs from one peer posted in the order the peer sends, so
   the k-th send pairs with the k-th recv), and each result of the step a
   `tgraph.transfer` from its rank to every rank (a broadcast), unless the
   function says `results = "stage"`: then a result of more than one
   element stays on the rank making it, its result attributes saying
   which (`tsched.held = {axis, rank}`);
5. orders the block by the simulated start times (so every rank's ops, in
   program order, follow its schedule) and tags every op run by one rank
   with `tsched.action = {axis, rank, kind, stage, chunk, microbatch}`.

The function gets `tsched.pipeline` (axis, schedule, ranks, stages,
microbatches, overlap, and each action's cost), which the bundle carries
for `step.pipeline_report()`.
"""

from __future__ import annotations

import math

from tessera_mlir import ir
from tessera_mlir.dialects import tgraph

from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.packing import bucket_all_reduces, fold_repacks, pack, unpack
from tessera_compiler.ir.pipeline import ACTION, HELD, INFO, Action, flops, simulate, tag_of
from tessera_compiler.ir.sharding import meshes_of
from tessera_compiler.ir.support import (PassError, arg_attr_dicts, functions, i64, ops_of,
                                         run_reporting, set_dict_entry)

def _op(x):
    """An op as its Operation (owners and users come back as OpViews; dict
    keys must be one kind), a block as itself."""
    return x if isinstance(x, ir.Block) else x.operation


class Pipeline:
    def __init__(self, func_op: ir.Operation):
        info = ir.DictAttr(func_op.attributes["tgraph.pipeline"])
        self.axis = ir.StringAttr(info["axis"]).value
        self.schedule = ir.StringAttr(info["schedule"]).value
        self.microbatches = ir.IntegerAttr(info["microbatches"]).value
        self.calls = ir.IntegerAttr(info["stages"]).value
        self.overlap = ir.BoolAttr(info["overlap"]).value if "overlap" in info else True
        #: "stage": a result one rank makes stays there (single values excepted)
        results = ir.StringAttr(info["results"]).value if "results" in info else "every"
        if results not in ("every", "stage"):
            raise PassError(f"tgraph.pipeline: results = \"{results}\" must be \"every\" "
                            "(every rank receives every result) or \"stage\" (a stage's "
                            "results stay on its ranks)", func_op.location)
        self.resident = results == "stage"
        self.names = [ir.StringAttr(a).value for a in ir.ArrayAttr(info["names"])] \
            if "names" in info else [f"stage {i}" for i in range(self.calls)]
        module = func_op.parent
        meshes = meshes_of(module)
        mesh = next((m for m in meshes.values() if self.axis in m.axes), None)
        if mesh is None:
            raise PassError(f"tgraph.pipeline: no mesh has an axis '{self.axis}'",
                            func_op.location)
        self.mesh = mesh
        self.ranks = mesh.axis_size(self.axis)
        if self.calls % self.ranks:
            raise PassError(f"the step makes {self.calls} stage calls, which do not split evenly "
                            f"over the {self.ranks} ranks of axis '{self.axis}'",
                            func_op.location)
        interleaved = self.schedule == "interleaved"
        self.stages = self.calls if interleaved else self.ranks
        self.per_rank = 1 if interleaved else self.calls // self.ranks

    def stage_of(self, call: int) -> int:
        return call if self.schedule == "interleaved" else call // self.per_rank

    def rank_of(self, stage: int) -> int:
        return stage % self.ranks

    def describe(self, stage: int) -> str:
        calls = [i for i in range(self.calls) if self.stage_of(i) == stage]
        return ", ".join(self.names[i] for i in calls)


def _classify(pipe: Pipeline, body: list) -> tuple[dict, list]:
    """Each tagged op's action, and the ops no stage owns (in block order)."""
    actions, floating = {}, []
    backward: dict = {}
    for op in body:
        tag = tag_of(op.location)
        # A constant (fill, iota) goes with its users, whatever stage traced
        # it: CSE leaves one fill for identical ones in every stage.
        if tag.stage is None or tag.microbatch is None or not list(op.operands):
            floating.append(op)
            continue
        if not 0 <= tag.stage < pipe.calls or not 0 <= tag.microbatch < pipe.microbatches:
            raise PassError(f"op tagged with stage call {tag.stage} / microbatch "
                            f"{tag.microbatch}, outside the pipeline's {pipe.calls} calls and "
                            f"{pipe.microbatches} microbatches", op.location)
        stage = pipe.stage_of(tag.stage)
        if tag.backward:
            backward.setdefault((stage, tag.microbatch), []).append(op)
        else:
            actions[op] = Action("F", stage, tag.microbatch)
    split = pipe.schedule == "zero_bubble"
    stage_of = {op: a.stage for op, a in actions.items()}
    for (stage, j), ops in backward.items():
        for op in ops:
            stage_of[op] = stage
    for (stage, j), ops in backward.items():
        members = set(ops)
        # B: what another stage reads (the input's gradient), and what it needs.
        needed = {op for op in ops if any(
            stage_of.get(_op(u.owner), stage) != stage for r in op.results for u in r.uses)}
        for op in reversed(ops):
            if op in needed:
                for v in op.operands:
                    owner = _op(v.owner)
                    if not isinstance(owner, ir.Block) and owner in members:
                        needed.add(owner)
        for op in ops:
            kind = "B" if op in needed or not split else "W"
            actions[op] = Action(kind, stage, j)
    return actions, floating


def _check_shared_parameters(pipe: Pipeline, func_op, actions: dict) -> None:
    """A parameter used by two stages on different ranks would need its
    gradient summed across ranks: refused, naming both stages."""
    block = func_op.regions[0].blocks[0]
    for arg in block.arguments:
        ranks = {}
        for use in arg.uses:
            a = actions.get(_op(use.owner))
            if a is not None:
                ranks.setdefault(pipe.rank_of(a.stage), (a.stage, _op(use.owner)))
        if len(ranks) > 1 and any(actions.get(_op(u.owner), Action("F", 0, 0)).kind != "F"
                                  for u in arg.uses):
            (s1, _), (s2, op2) = list(ranks.values())[:2]
            raise PassError(
                f"a parameter is used by stage {pipe.describe(s1)} and by stage "
                f"{pipe.describe(s2)}, which run on different ranks of '{pipe.axis}' "
                "(its gradient would be split between them); give each stage its own "
                "parameters", op2.location)


#: the kind of a rank's end action: the epilogue ops placed after all its
#: pipeline work (tessera-verify-schedule orders it after F, B and W)
END = "E"


def _elements(v) -> int:
    """The elements of value `v`, or of what it broadcasts (a broadcast
    scalar weighs one element)."""
    owner = v.owner
    if not isinstance(owner, ir.Block) and owner.name == "tgraph.broadcast":
        v = owner.operands[0]
    t = ir.ShapedType(v.type)
    return math.prod(t.shape) if t.has_static_shape else 0


def _argument_homes(pipe: Pipeline, block, actions: dict) -> dict:
    """Each step argument that the stage ops of one rank only read (a
    stage's parameter) -> that rank."""
    homes = {}
    for arg in block.arguments:
        ranks = {pipe.rank_of(actions[_op(u.owner)].stage) for u in arg.uses
                 if _op(u.owner) in actions}
        if len(ranks) == 1:
            homes[arg] = ranks.pop()
    return homes


def _costs(actions: dict) -> dict:
    """(kind, stage) -> cost of microbatch 0's action (the cost model)."""
    costs: dict = {}
    for op, a in actions.items():
        if a.microbatch == 0:
            costs[(a.kind, a.stage)] = costs.get((a.kind, a.stage), 0.0) + flops(op)
    return costs


def _keep_results(func_op, ret, actions: dict, rank, owner_of, axis) -> set:
    """pipeline.run(results="stage"): each result of more than one element
    (a loss still reaches every rank) that one rank's action makes stays
    there, its result attributes saying where (HELD: {axis, rank}, which
    the bundle's output spec carries; the other ranks' runs hand back a
    placeholder), so the next step finds a stage's parameters and
    optimizer state where that stage runs. Returns their result numbers."""
    dicts, kept = arg_attr_dicts(func_op, "res_attrs"), set()
    for i, v in enumerate(ret.operands):
        producer = owner_of(v)
        if producer is None or producer not in actions or \
                math.prod(ir.RankedTensorType(v.type).shape) <= 1:
            continue
        dicts[i] = set_dict_entry(dicts[i], HELD, ir.DictAttr.get(
            {"axis": axis, "rank": i64(rank(producer))}))
        kept.add(i)
    func_op.attributes["res_attrs"] = ir.ArrayAttr.get(dicts)
    return kept


def _broadcast_results(ret, actions: dict, position: dict, rank, owner_of, mesh_ref, axis,
                       bucket_elements: int, kept: set) -> tuple[list, list]:
    """The step's results made by a stage (but those `kept` there) reach
    every rank: one broadcast per rank and element type, of its results flattened and concatenated
    (as tessera-bucket-collectives packs all_reduces; at most
    `bucket_elements` a broadcast), sliced apart on every rank. Each
    broadcast sorts right after the last action making one of its results,
    so a rank done early (the last stage, in 1F1B) sends while the others
    still compute, instead of 46 broadcasts after everything. The pack ops
    join that action (they run on its rank).

    Returns ([(result number, value)], [(placement key, op)]) for the ops
    that every rank runs (the broadcasts and the slicing)."""
    groups: dict = {}
    for i, v in enumerate(ret.operands):
        producer = owner_of(v)
        if producer is not None and producer in actions and i not in kept:
            t = ir.RankedTensorType(v.type)
            groups.setdefault((rank(producer), str(t.element_type)), []).append(
                (i, v, actions[producer], math.prod(t.shape)))
    buckets = []
    for (root, _), members in groups.items():
        bucket, size = [], 0
        for m in members:
            if bucket and size + m[3] > bucket_elements:
                buckets.append((root, bucket))
                bucket, size = [], 0
            bucket.append(m)
            size += m[3]
        buckets.append((root, bucket))
    results, late = [], []
    for root, bucket in buckets:
        last = max((a for _, _, a, _ in bucket), key=lambda a: position[a])
        # After the last action's own ops (1) on its rank: before any later action.
        key = position[last] + (2,)
        loc = owner_of(bucket[-1][1]).location
        if len(bucket) == 1:
            i, v, _, _ = bucket[0]
            with ir.InsertionPoint(ret), loc:
                b = tgraph.TransferOp(v, mesh_ref, axis, i64(root))
            late.append((key, b.operation))
            results.append((i, b.results[0]))
            continue
        with ir.InsertionPoint(ret), loc:
            made, joined = pack([v for _, v, _, _ in bucket])
            for op in made:
                actions[op] = last
            b = tgraph.TransferOp(joined, mesh_ref, axis, i64(root))
            late.append((key, b.operation))
            made, outs = unpack(b.result, [v.type for _, v, _, _ in bucket])
        late.extend(((math.inf, 0, 0, 0), op) for op in made)
        results.extend((i, out) for (i, _, _, _), out in zip(bucket, outs))
    return results, late


def schedule_function(func_op: ir.Operation, bucket_elements: int) -> None:
    pipe = Pipeline(func_op)
    block = func_op.regions[0].blocks[0]
    body = ops_of(func_op)
    ret = body[-1]
    body = body[:-1]
    actions, floating = _classify(pipe, body)
    _check_shared_parameters(pipe, func_op, actions)
    costs = _costs(actions)      # (a forward-only step has no B or W costs: they take no time)
    plan = simulate(pipe.schedule, pipe.ranks, pipe.stages, pipe.microbatches,
                    cost=lambda a: costs.get((a.kind, a.stage), 0.0))
    position = {}          # action -> (start, rank, index in the rank's order)
    for r, row in enumerate(plan.rows):
        for i, t in enumerate(row):
            position[t.action] = (t.start, r, i)

    def rank(op):
        a = actions.get(op)
        return None if a is None else pipe.rank_of(a.stage)

    def owner_of(v):
        o = v.owner
        return None if isinstance(o, ir.Block) else o.operation

    # Ops that combine stage results (the step's epilogue: the microbatches'
    # sum, pipeline.run's `then`): on the rank holding most of their
    # operands' elements (a parameter's update where the parameter and its
    # gradient are), at the latest of their operands' actions when that is
    # on this rank, else in the rank's end action, after all its work (the
    # operands made elsewhere received at its start).
    homes = _argument_homes(pipe, block, actions)
    ends: dict = {}
    last_start = max((t.start for row in plan.rows for t in row), default=0.0)

    def end_of(r: int) -> Action:
        if r not in ends:
            ends[r] = Action(END, r, -1)
            position[ends[r]] = (last_start + 1.0, r, len(plan.rows[r]))
        return ends[r]

    unplaced = []
    for op in floating:
        placed = [actions[owner_of(v)] for v in op.operands if owner_of(v) in actions]
        if not placed:
            unplaced.append(op)
            continue
        latest = max(placed, key=lambda a: position[a])
        here = pipe.rank_of(latest.stage)
        weight: dict = {}
        for v in op.operands:
            producer = owner_of(v)
            r = pipe.rank_of(actions[producer].stage) if producer in actions else homes.get(v)
            if r is not None:
                weight[r] = weight.get(r, 0) + _elements(v)
        best = max(weight, key=lambda r: (weight[r], r == here))
        actions[op] = latest if best == here else end_of(best)
    # A broadcast (a clipping scale made [rows, cols]) that only one end
    # action reads is made there: its small operand travels, not its result.
    for op in floating:
        if op.name == "tgraph.broadcast" and op in actions:
            users = {actions.get(_op(u.owner)) for r in op.results for u in r.uses}
            if len(users) == 1 and next(iter(users)) in ends.values():
                actions[op] = users.pop()
    # Input slices and constants: with each rank's first user. (An op's
    # hash follows its operands and attributes, so every dict above is read
    # before any op is changed: rewiring waits in `rewire` until the end.)
    global_ops = set()
    rewire = []            # (user, operand number, new value)
    for op in reversed(unplaced):
        by_rank: dict = {}
        for r in op.results:
            for use in r.uses:
                user = _op(use.owner)
                a = actions.get(user)
                if a is None:
                    by_rank.setdefault(None, user)
                    continue
                rk = pipe.rank_of(a.stage)
                if rk not in by_rank or position[a] < position[actions[by_rank[rk]]]:
                    by_rank[rk] = user
        ranked = [rk for rk in by_rank if rk is not None]
        if None in by_rank or not ranked:
            global_ops.add(op)          # every rank computes it
            continue
        first, *others = ranked
        actions[op] = actions[by_rank[first]]
        for rk in others:
            copy = op.clone(ip=ir.InsertionPoint(op)).operation
            actions[copy] = actions[by_rank[rk]]
            for i, r in enumerate(op.results):
                for use in r.uses:
                    user = _op(use.owner)
                    if actions.get(user) is not None and pipe.rank_of(actions[user].stage) == rk:
                        rewire.append((user, use.operand_number, copy.results[i]))

    mesh_ref = ir.FlatSymbolRefAttr.get(pipe.mesh.name)
    axis = ir.StringAttr.get(pipe.axis)
    # Values read on another rank: one transfer per (value, rank).
    made: dict = {}        # (value, rank) -> [transfer op, action, producer]
    copied = {(user, number) for user, number, _ in rewire}   # they read their rank's copy
    for op in [o.operation for o in block.operations]:
        a = actions.get(op)
        if a is None:
            continue
        here = pipe.rank_of(a.stage)
        for i, v in enumerate(op.operands):
            if (op, i) in copied:
                continue
            producer = owner_of(v)
            if producer is None or producer not in actions:
                continue
            there = pipe.rank_of(actions[producer].stage)
            if there == here:
                continue
            entry = made.get((v, here))
            if entry is None:
                with ir.InsertionPoint(op), op.location:
                    t = tgraph.TransferOp(v, mesh_ref, axis, i64(there), to=i64(here))
                entry = made[(v, here)] = [t.operation, a, producer]
            elif position[a] < position[entry[1]]:
                entry[1] = a
            rewire.append((op, i, entry[0].results[0]))
    kept = _keep_results(func_op, ret, actions, rank, owner_of, axis) if pipe.resident \
        else set()
    results, late = _broadcast_results(ret, actions, position, rank, owner_of, mesh_ref, axis,
                                       bucket_elements, kept)

    # Order: by simulated start time, then rank, then program order.
    placed = []            # [key, op, action or None]
    for index, op in enumerate([o.operation for o in block.operations][:-1]):
        if op in global_ops:
            placed.append([(-1.0, -1, -1, 0, index), op, None])
        elif op in actions:
            start, r, i = position[actions[op]]
            placed.append([(start, r, i, 1, index), op, actions[op]])
    for key, op in late:
        placed.append([key + (len(placed),), op, None])
    # A transfer's recv goes first in its action; recvs from one peer in the
    # order the peer sends (the k-th send pairs with the k-th recv). A send
    # follows its value's producer (tessera-lower-to-schedule), so values
    # made in one action are sent in their producers' program order.
    program = {op: i for i, op in enumerate(o.operation for o in block.operations)}
    channels: dict = {}
    for (v, here), (t, a, producer) in made.items():
        entry = [position[a][:3] + (0, 0), t, a]
        placed.append(entry)
        send_key = position[actions[producer]] + (program[producer],)
        channels.setdefault((rank(producer), here), []).append((send_key, entry))
    for chan in channels.values():
        chan.sort(key=lambda e: e[0])
        order = [entry for _, entry in chan]
        for k in range(len(order) - 1, -1, -1):
            current = order[k][0][:3] + (0, k)
            if k + 1 < len(order) and current > order[k + 1][0]:
                current = order[k + 1][0][:3] + (0, k)
            order[k][0] = current
    if len(placed) != len(list(block.operations)) - 1:
        stray = [o.operation for o in block.operations][:-1]
        raise PassError("tessera-pipeline-schedule: an op was placed on no rank", stray[0].location)

    # Now change the IR.
    for user, number, value in rewire:
        user.operands[number] = value
    for i, value in results:
        ret.operands[i] = value
    placed.sort(key=lambda e: e[0])
    for _, op, _ in placed:
        op.move_before(ret)
    _check_order(block)
    for _, op, a in placed:
        if a is not None:
            op.attributes[ACTION] = ir.DictAttr.get({
                "axis": axis, "rank": i64(pipe.rank_of(a.stage)),
                "kind": ir.StringAttr.get(a.kind), "stage": i64(a.stage),
                "chunk": i64(a.stage // pipe.ranks), "microbatch": i64(a.microbatch)})
    func_op.attributes[INFO] = ir.DictAttr.get({
        "axis": axis, "schedule": ir.StringAttr.get(pipe.schedule),
        "ranks": i64(pipe.ranks), "stages": i64(pipe.stages),
        "microbatches": i64(pipe.microbatches), "overlap": ir.BoolAttr.get(pipe.overlap),
        "costs": ir.ArrayAttr.get([ir.DictAttr.get({
            "kind": ir.StringAttr.get(k), "stage": i64(s),
            "cost": ir.FloatAttr.get(ir.F64Type.get(), float(c))})
            for (k, s), c in sorted(costs.items())]),
    })
    del func_op.attributes["tgraph.pipeline"]


def _check_order(block: ir.Block) -> None:
    """Every operand is defined before its use (the schedule respects the
    program's dependences); a violation is a compiler bug, reported with
    both lines."""
    seen = set(block.arguments)
    for op in block.operations:
        op = op.operation
        for v in op.operands:
            if v not in seen:
                raise PassError(f"tessera-pipeline-schedule: this op ({op.name}) was scheduled "
                                f"before the value it reads (made at {v.owner.location}); the "
                                "pipeline schedule does not follow the program's dependences",
                                op.location)
        seen.update(op.results)


def run(op, pass_, options: TargetOptions):
    def body():
        for f in list(functions(op)):
            if "tgraph.pipeline" not in f.attributes:
                continue
            if "tgraph.partitioned" not in f.attributes:
                raise PassError("run tessera-partition before tessera-pipeline-schedule",
                                f.location)
            schedule_function(f, options.bucket_elements)
            # The dp gradients' all_reduces, now on their ranks: bucketed
            # per rank (tessera-bucket-collectives leaves pipelines alone).
            bucket_all_reduces(f, options.bucket_elements)
            fold_repacks(ops_of(f))
    run_reporting(op, pass_, body)
