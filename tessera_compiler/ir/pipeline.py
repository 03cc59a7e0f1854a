"""Pipeline schedules: which stage action each rank runs when.

A pipeline splits a step into virtual stages `0..V-1` over the `p` ranks of
a mesh axis and the batch into `m` microbatches. Each (stage, microbatch)
has three actions: F (forward), B (the backward part that computes the
gradient of the stage's input, which the previous stage waits for) and W
(the rest of the backward: weight gradients, which nobody waits for). The
schedules differ only in the order each rank runs its actions:

  gpipe        every forward, then every backward (B then W), in microbatch order
  1F1B         at most p - r microbatches in flight on rank r: one forward,
               one backward, ... (PipeDream-flush; Megatron's default)
  interleaved  1F1B over v chunks per rank (stage s on rank s mod p),
               microbatches taken in groups of p (Megatron's interleaved 1F1B)
  zero_bubble  1F1B with W split from B and deferred into the bubbles, at
               1F1B's activation memory (ZB-H1, Qi et al. 2023)

`simulate` runs a schedule's policy on a cost model (each action's cost,
e.g. its flops) and returns every rank's actions with start and end times:
the order the compiler gives each rank's program, and the report's grid
and bubble. Dependencies: F(s, j) after F(s-1, j); B(s, j) after F(s, j)
and B(s+1, j); W(s, j) after B(s, j). The order is a feasible execution, so
the per-rank programs built from it cannot deadlock on each other.

This module also reads the pipeline tags the tracer puts in locations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tessera_mlir import ir

SCHEDULES = ("gpipe", "1F1B", "interleaved", "zero_bubble")
#: spellings accepted for each schedule (the design docs write "1F1B")
ALIASES = {"gpipe": "gpipe", "1f1b": "1F1B", "interleaved": "interleaved",
           "interleaved_1f1b": "interleaved", "zero_bubble": "zero_bubble",
           "zb": "zero_bubble", "zbh1": "zero_bubble", "zb-h1": "zero_bubble"}
#: the name autodiff gives backward ops' locations
BACKWARD = "tessera.backward"
#: ... and the copies it makes of a recomputation region's forward (also backward)
RECOMPUTE = "tessera.recompute"
#: the attribute naming the rank (and stage action) that runs an op:
#: {axis, rank} and, for a stage's work, {kind, stage, chunk, microbatch}
ACTION = "tsched.action"
#: a pipelined schedule function's schedule and cost model (read by the report)
INFO = "tsched.pipeline"
#: the result attribute of a pipelined step's result that stays on the rank
#: making it ({axis, rank}; pipeline.run(results="stage")): the bundle's
#: output spec says `on`, and the other ranks' runs return a placeholder
HELD = "tsched.held"


def schedule_name(name: str) -> str | None:
    """The canonical name of a schedule spelled `name`, or None."""
    return ALIASES.get(str(name).lower())


# -- tags in locations ------------------------------------------------------------
# The tracer names an op's location after the stage call and microbatch it
# belongs to (`loc("tessera.pipeline:stage=2:microbatch=3"("model.py":12:0))`),
# autodiff names backward ops' locations `tessera.backward`: locations
# survive every rewrite (partitioning, autodiff), so the tags reach the
# pipeline pass on every op made from a traced one.

PIPELINE_PREFIX = "tessera.pipeline"


def tag_location(loc: ir.Location, stage: int | None, microbatch: int | None) -> ir.Location:
    """`loc` with the pipeline stage call and microbatch the traced op belongs to."""
    name = PIPELINE_PREFIX + "".join(f":{k}={v}" for k, v in
                                     (("stage", stage), ("microbatch", microbatch))
                                     if v is not None)
    return ir.Location.name(name, childLoc=loc)


def flops(op: ir.Operation) -> float:
    """An op's cost for the cost model: 2 m n k for a matmul, one per result
    element otherwise."""
    total = 0.0
    for r in op.results:
        if isinstance(r.type, ir.RankedTensorType):
            total += math.prod(ir.RankedTensorType(r.type).shape)
    if op.name == "tgraph.matmul":
        k = ir.RankedTensorType(op.operands[0].type).shape[-1]
        total *= 2 * k
    elif op.name == "tgraph.contract_rows":        # K x N outputs, a sum over every row
        total *= 2 * math.prod(ir.RankedTensorType(op.operands[0].type).shape[:-1])
    return total


def balanced_cuts(costs: list, stages: int) -> list[int]:
    """The first of `costs`' items in each of `stages` consecutive runs of
    about equal total cost (an item goes to the run its cost's midpoint
    falls in); ValueError when some run would be empty."""
    total = sum(costs) or 1.0
    owner, before = [], 0.0
    for c in costs:
        owner.append(min(stages - 1, int(stages * (before + c / 2) / total)))
        before += c
    cuts = [owner.index(k) if k in owner else -1 for k in range(stages)]
    if -1 in cuts:
        raise ValueError(f"{len(costs)} op calls do not split into {stages} stages of "
                         "balanced cost")
    return cuts


def backward_location(loc: ir.Location) -> ir.Location:
    """`loc` marked as the location of backward code (made by autodiff)."""
    return ir.Location.name(BACKWARD, childLoc=loc)


def recompute_location(loc: ir.Location) -> ir.Location:
    """`loc` marked as a recomputed forward op's (backward code too)."""
    return ir.Location.name(RECOMPUTE, childLoc=backward_location(loc))


@dataclass
class Tag:
    stage: int | None = None
    microbatch: int | None = None
    backward: bool = False
    recompute: bool = False


def tag_of(loc: ir.Location) -> Tag:
    """The pipeline tag in `loc`: the innermost stage and microbatch, and
    whether any level marks it backward."""
    tag = Tag()

    def walk(loc):
        if loc.is_a_name():
            name = loc.name_str
            if name == BACKWARD:
                tag.backward = True
            elif name == RECOMPUTE:
                tag.recompute = True
            elif name.startswith(PIPELINE_PREFIX):
                for part in name[len(PIPELINE_PREFIX) + 1:].split(":"):
                    key, _, value = part.partition("=")
                    if key in ("stage", "microbatch") and getattr(tag, key) is None:
                        setattr(tag, key, int(value))
            walk(loc.child_loc)
        elif loc.is_a_fused():
            for inner in loc.locations:
                walk(inner)
        elif loc.is_a_callsite():
            walk(loc.callee)
    walk(loc)
    return tag


def action_rank(op: ir.Operation) -> tuple[str, int] | None:
    """(axis, rank) of the one rank that runs `op`; None: every rank does."""
    if ACTION not in op.attributes:
        return None
    d = ir.DictAttr(op.attributes[ACTION])
    return ir.StringAttr(d["axis"]).value, ir.IntegerAttr(d["rank"]).value


def copy_action(src: ir.Operation, *made) -> None:
    """Gives ops made in place of (or for) `src` its action: the same rank runs them."""
    if ACTION in src.attributes:
        for op in made:
            op.operation.attributes[ACTION] = src.attributes[ACTION]


# -- schedules ----------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Action:
    kind: str          # "F", "B" or "W"
    stage: int         # virtual stage
    microbatch: int

    def label(self, ranks: int) -> str:
        return f"{self.stage // ranks}{self.kind}{self.microbatch}"


@dataclass
class Timed:
    action: Action
    start: float
    end: float


@dataclass
class Plan:
    """A simulated schedule: each rank's actions in order, with times."""
    schedule: str
    ranks: int
    stages: int
    microbatches: int
    rows: list = field(default_factory=list)       # per rank: [Timed]

    @property
    def makespan(self) -> float:
        return max((t.end for row in self.rows for t in row), default=0.0)

    @property
    def bubble(self) -> float:
        """The fraction of rank-time spent idle."""
        span = self.makespan
        if span == 0:
            return 0.0
        busy = sum(t.end - t.start for row in self.rows for t in row)
        return 1.0 - busy / (self.ranks * span)

    def peak_activations(self) -> list[int]:
        """Per rank: the most (stage, microbatch) forwards whose activations
        are held at once (from its F until its W frees them)."""
        peaks = []
        for row in self.rows:
            held = peak = 0
            for t in row:
                if t.action.kind == "F":
                    held += 1
                    peak = max(peak, held)
                elif t.action.kind == "W":
                    held -= 1
            peaks.append(peak)
        return peaks

    def grid(self) -> str:
        """A rank x time grid of actions (`0F3` = chunk 0, forward of
        microbatch 3), one column per time quantum, `.` where idle."""
        durations = [t.end - t.start for row in self.rows for t in row]
        longest = max(durations, default=0.0)
        if longest <= 0:
            return ""
        # (Actions of no cost, such as a W run inside its B, get no cell.)
        quantum = min(d for d in durations if d >= longest / 64)
        width = max(len(t.action.label(self.ranks)) for row in self.rows for t in row)
        lines = []
        for r, row in enumerate(self.rows):
            cells = ["." * width] * int(round(self.makespan / quantum))
            for t in row:
                if t.end - t.start < quantum / 2:
                    continue
                first = int(round(t.start / quantum))
                last = max(first + 1, int(round(t.end / quantum)))
                for c in range(first, min(last, len(cells))):
                    cells[c] = t.action.label(self.ranks).ljust(width)
            lines.append(f"rank {r}: " + " ".join(cells))
        return "\n".join(lines)


def stage_rank(stage: int, ranks: int) -> int:
    return stage % ranks


def simulate(schedule: str, ranks: int, stages: int, microbatches: int,
             cost=None, split_backward: bool | None = None) -> Plan:
    """Runs `schedule` for `stages` virtual stages (stage s on rank s mod
    ranks) and `microbatches` under `cost(action) -> seconds` (default: 1
    for every action). Without `split_backward` (every schedule but
    zero_bubble), W runs right after its B."""
    schedule = schedule_name(schedule) or schedule
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; choose one of {list(SCHEDULES)}")
    p, V, m = ranks, stages, microbatches
    chunks = V // p
    cost = cost or (lambda a: 1.0)
    split = schedule == "zero_bubble" if split_backward is None else split_backward
    todo = [[] for _ in range(p)]
    for s in range(V):
        for j in range(m):
            for kind in "FBW":
                todo[stage_rank(s, p)].append(Action(kind, s, j))
    finished: dict = {}

    def deps(a: Action):
        if a.kind == "F":
            return [Action("F", a.stage - 1, a.microbatch)] if a.stage else []
        if a.kind == "B":
            d = [Action("F", a.stage, a.microbatch)]
            if a.stage + 1 < V:
                d.append(Action("B", a.stage + 1, a.microbatch))
            return d
        return [Action("B", a.stage, a.microbatch)]

    def ready(a, t):
        return all(d in finished and finished[d] <= t for d in deps(a))

    counts = [{"F": 0, "B": 0, "W": 0} for _ in range(p)]
    # Activations in flight (forwards whose W has not run) allowed per rank.
    limit = [m if schedule == "gpipe" else min(m, p - r) for r in range(p)]

    def order_key(a: Action):
        return a.microbatch

    fixed = _interleaved_orders(p, chunks, m) if schedule == "interleaved" else None

    def pick(r, t, relaxed=False):
        if fixed is not None:           # Megatron's order, each W right after its B
            a = fixed[r][len(rows[r])]
            return a if ready(a, t) else None
        c = counts[r]
        pending_w = [a for a in todo[r] if a.kind == "W" and ready(a, t)]
        if pending_w and not split:
            return min(pending_w, key=order_key)         # W right after its B
        bs = sorted((a for a in todo[r] if a.kind == "B" and ready(a, t)), key=order_key)
        fs = sorted((a for a in todo[r] if a.kind == "F" and ready(a, t)), key=order_key)
        in_flight = c["F"] - c["W"]
        if schedule == "gpipe":
            if fs:
                return fs[0]
            forwards_left = any(a.kind == "F" for a in todo[r])
            return bs[0] if bs and not forwards_left else None
        if bs:
            return bs[0]
        if fs and (in_flight < limit[r] or relaxed):
            return fs[0]
        if pending_w:
            return min(pending_w, key=order_key)         # zero bubble: W in the gaps
        return None

    rows = [[] for _ in range(p)]
    free_at = [0.0] * p
    t = 0.0
    relaxed = False
    while any(todo):
        # Start what can start at t; an action of no cost (a W run inside its
        # B) ends at t, so its rank may start another at t: ask again until
        # no rank starts anything. (Costs are FLOPs or seconds: no epsilon
        # duration survives both scales.)
        started = True
        while started:
            started = False
            for r in range(p):
                if free_at[r] > t or not todo[r]:
                    continue
                a = pick(r, t, relaxed)
                if a is None:
                    continue
                relaxed, started = False, True
                end = t + max(float(cost(a)), 0.0)
                rows[r].append(Timed(a, t, end))
                todo[r].remove(a)
                counts[r][a.kind] += 1
                finished[a] = end
                free_at[r] = end
        upcoming = [x for x in free_at if x > t] + [x for x in finished.values() if x > t]
        if not upcoming and any(todo) and not relaxed:
            # Every rank at its activation limit waits for a backward whose
            # forward is behind another rank's limit: let one more forward in.
            relaxed = True
            continue
        if not upcoming:
            if any(todo):
                stuck = {r: [a.label(p) for a in todo[r][:3]] for r in range(p) if todo[r]}
                raise RuntimeError(f"pipeline schedule {schedule} made no progress: {stuck}")
            break
        t = min(upcoming)
    return Plan(schedule, p, V, m, rows)


def _interleaved_orders(p: int, chunks: int, m: int) -> list[list[Action]]:
    """Megatron's interleaved 1F1B order for each rank: microbatches in
    groups of p, each group through chunk 0, 1, ... forward and the last
    chunk first backward; (p - r - 1) * 2 + (chunks - 1) * p forwards of
    warm-up, then one forward and one backward in turn."""
    total = m * chunks
    group = p if m >= p else m
    if m % group:
        raise ValueError(f"the interleaved schedule takes microbatches in groups of the {p} "
                         f"ranks: {m} microbatches is not a multiple of {p}")

    def step(k, backward):
        chunk = (k // group) % chunks
        if backward:
            chunk = chunks - 1 - chunk
        return chunk, (k // (group * chunks)) * group + k % group

    orders = []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (chunks - 1) * p, total)
        order, f, b = [], 0, 0

        def forward():
            nonlocal f
            chunk, mb = step(f, False)
            order.append(Action("F", chunk * p + r, mb))
            f += 1

        def backward():
            nonlocal b
            chunk, mb = step(b, True)
            order.append(Action("B", chunk * p + r, mb))
            order.append(Action("W", chunk * p + r, mb))
            b += 1
        for _ in range(warmup):
            forward()
        while f < total:
            forward()
            backward()
        while b < total:
            backward()
        orders.append(order)
    return orders


def formula_bubble(ranks: int, microbatches: int) -> float:
    """GPipe's and 1F1B's idle fraction for equal stage costs: (p-1)/(m+p-1)."""
    return (ranks - 1) / (microbatches + ranks - 1)
