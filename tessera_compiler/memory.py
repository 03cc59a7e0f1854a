"""The memory plan: every rank's peak bytes, read from the final Schedule IR.

A compiled step allocates and frees every buffer explicitly
(`tsched.alloc` / `tsched.free`, after tile fusion has dropped the
intermediates a fused kernel keeps in registers), so the bytes each rank
holds at every instruction are known before anything runs. `plan_memory`
walks each rank's instructions and records the peak and what is live at
it, grouped as

  parameters       arguments some `ts.grad` differentiates with respect to
  optimizer state  in a function with gradients, the arguments no loss
                   depends on (moments, step counts)
  inputs           the other arguments (the batch, the loss scale)
  activations      what the forward computes (recomputed copies included)
  gradients        what the backward computes (activation and weight
                   gradients) and gradient-only arithmetic after it
                   (accumulation, clipping)
  update           what the optimizer computes from gradients and state
  communication    buffers collectives and transfers write into

The runtime holds exactly these buffers: arguments from the start (it copies
them in), each allocation until its free; a reshape is a view of its input,
so the two share one allocation until both are freed. Its executor counts
the same bytes while it runs (`ScheduleExecutor.memory`), and the CPU test
measures numpy's real allocations against the plan.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tessera_mlir import ir

from .ir.locations import location_name, source_of
from .ir.pipeline import action_rank, tag_of
from .ir.remat import remat_of

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "communication",
              "inputs", "update")


@dataclass(frozen=True)
class Buffer:
    """One allocation live at the peak."""
    name: str          # an argument's name, else what made it (kernel or routine)
    shape: tuple
    dtype: str
    bytes: int
    category: str
    source: str        # file.py:line of the Python code that made it


@dataclass
class RankMemory:
    """One rank's plan: its peak and what holds it."""
    rank: int
    peak: int
    #: bytes live at the peak per category (every category, zeros included)
    by_category: dict = field(default_factory=dict)
    #: the buffers live at the peak, largest first
    live: list = field(default_factory=list)
    #: the instruction at which the peak is reached (its Python line)
    at: str = ""
    #: the most bytes each category holds at any instruction (the
    #: activations' peak may come before the step's: e.g. with recomputation)
    category_peaks: dict = field(default_factory=dict)
    #: activation bytes live where a backward starts (the most over several
    #: backwards): what the forward stored for the backward
    stored_activations: int = 0

    def largest(self, n: int = 5) -> list:
        return self.live[:n]


@dataclass
class MemoryPlan:
    """The plan of one compiled function: one RankMemory per rank."""
    function: str
    ranks: list
    #: {recomputation region: policy} of the function's Graph IR (ts.remat)
    remat: dict = field(default_factory=dict)

    @property
    def peak(self) -> int:
        """The largest rank's planned peak, in bytes."""
        return max(r.peak for r in self.ranks)

    def rank(self, r: int) -> RankMemory:
        return self.ranks[r]

    def __str__(self) -> str:
        lines = [f"memory plan of {self.function}: peak {_size(self.peak)} "
                 f"({self.peak:,} B) on the largest of {len(self.ranks)} rank(s)"]
        if self.remat:
            policies: dict = {}
            for policy in self.remat.values():
                policies[policy] = policies.get(policy, 0) + 1
            lines.append("  recomputed regions: " + ", ".join(
                f"{n} {p}" for p, n in sorted(policies.items())))
        shown = {}
        for r in self.ranks:      # ranks with the same plan are shown once
            key = (r.peak, tuple(sorted(r.by_category.items())))
            shown.setdefault(key, []).append(r)
        for group in shown.values():
            r = group[0]
            who = "rank " + ", ".join(str(g.rank) for g in group) if len(self.ranks) > 1 else "rank 0"
            lines.append(f"  {who}: peak {_size(r.peak)} at {r.at or 'the start'}")
            for cat in CATEGORIES:
                if r.by_category.get(cat):
                    share = 100.0 * r.by_category[cat] / r.peak if r.peak else 0.0
                    lines.append(f"    {cat:<16} {_size(r.by_category[cat]):>10}  {share:5.1f}%")
            lines.append("    largest live at the peak:")
            groups: dict = {}
            for b in r.live:
                groups.setdefault((b.name, b.shape, b.dtype, b.category, b.source), []).append(b)
            for (name, shape, dtype, cat, source), bs in sorted(
                    groups.items(), key=lambda kv: -sum(b.bytes for b in kv[1]))[:8]:
                count = f"{len(bs)} x " if len(bs) > 1 else ""
                lines.append(f"      {_size(sum(b.bytes for b in bs)):>10}  {cat:<15} {count}{name} "
                             f"{list(shape)} {dtype}  {source}")
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _memref(t: ir.Type) -> tuple[tuple, str, int]:
    m = ir.MemRefType(t)
    shape = tuple(m.shape)
    width = getattr(m.element_type, "width", 8)
    return shape, str(m.element_type), math.prod(shape) * max(1, width // 8)


@dataclass
class GraphFacts:
    """What the plan needs from Graph IR before tessera-autodiff, per function."""
    #: indices of the arguments a tgraph.grad differentiates with respect to
    parameters: dict = field(default_factory=dict)
    #: {region: policy} of its recomputation regions
    remat: dict = field(default_factory=dict)
    #: indices of the arguments some differentiated loss depends on (the
    #: others of a function with gradients are optimizer state)
    loss_inputs: dict = field(default_factory=dict)


def graph_facts(module: ir.Module) -> GraphFacts:
    facts = GraphFacts()
    for f in module.body.operations:
        f = f.operation
        if f.name != "func.func" or not f.regions[0].blocks:
            continue
        block = f.regions[0].blocks[0]
        name = ir.StringAttr(f.attributes["sym_name"]).value
        for op in block.operations:
            op = op.operation
            if op.name == "tgraph.grad":
                for v in list(op.operands)[1:]:
                    if isinstance(v, ir.BlockArgument) and v.owner == block:
                        facts.parameters.setdefault(name, set()).add(v.arg_number)
                facts.loss_inputs.setdefault(name, set()).update(_arguments_under(op.operands[0]))
            marked = remat_of(op)
            if marked is not None and marked[1] != "none":
                facts.remat.setdefault(name, {})[marked[0]] = marked[1]
    return facts


def _arguments_under(value: ir.Value) -> set:
    """Indices of the block arguments `value` is computed from."""
    found, seen, todo = set(), set(), [value]
    while todo:
        v = todo.pop()
        if isinstance(v, ir.BlockArgument):
            found.add(v.arg_number)
            continue
        op = v.owner.operation
        if op in seen:
            continue
        seen.add(op)
        todo.extend(op.operands)
    return found


def _mesh(module: ir.Module) -> tuple[list, list]:
    for op in module.body.operations:
        if op.operation.name == "tgraph.mesh":
            attrs = op.operation.attributes
            return ([ir.StringAttr(a).value for a in ir.ArrayAttr(attrs["axes"])],
                    list(ir.DenseI64ArrayAttr(attrs["shape"])))
    return [], []


def _coords(rank: int, shape: list) -> list:
    coords = []
    for size in reversed(shape):
        coords.append(rank % size)
        rank //= size
    return list(reversed(coords))


def _schedules(module: ir.Module):
    """The schedule functions (the ones holding tsched launches)."""
    for f in module.body.operations:
        f = f.operation
        if f.name == "func.func" and f.regions[0].blocks and any(
                o.operation.name.startswith("tsched.") for o in f.regions[0].blocks[0].operations):
            yield f


def plan_memory(module: ir.Module, facts: GraphFacts | None = None) -> dict:
    """{function: MemoryPlan} for every schedule function of the final
    module (after tessera-lower-to-tile); `facts` are `graph_facts` of its
    Graph IR."""
    facts = facts or GraphFacts()
    symbols = {ir.StringAttr(f.operation.attributes["sym_name"]).value: f.operation
               for f in module.body.operations
               if "sym_name" in f.operation.attributes}
    axes, shape = _mesh(module)
    size = math.prod(shape) if shape else 1
    plans = {}
    for f in _schedules(module):
        name = ir.StringAttr(f.attributes["sym_name"]).value
        ops = [o.operation for o in f.regions[0].blocks[0].operations]
        runs = [action_rank(o) for o in ops]
        # Ranks differ only by their coordinates along the axes that actions
        # run on (a pipeline's stages): one walk per such role.
        role_axes = sorted({r[0] for r in runs if r is not None})
        ranks, cache = [], {}
        for rank in range(size):
            coords = dict(zip(axes, _coords(rank, shape)))
            role = tuple(coords.get(a) for a in role_axes)
            if role not in cache:
                mine = [r is None or coords.get(r[0]) == r[1] for r in runs]
                cache[role] = _walk(f, [o for o, keep in zip(ops, mine) if keep], symbols,
                                    facts.parameters.get(name, set()),
                                    facts.loss_inputs.get(name))
            plan = cache[role]
            ranks.append(RankMemory(rank, plan.peak, dict(plan.by_category), list(plan.live),
                                    plan.at, dict(plan.category_peaks), plan.stored_activations))
        plans[name] = MemoryPlan(name, ranks, facts.remat.get(name, {}))
    return plans


def _library(symbols: dict, launch: ir.Operation) -> str | None:
    kernel = symbols.get(ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value)
    if kernel is not None and "tsched.library" in kernel.attributes:
        return ir.StringAttr(kernel.attributes["tsched.library"]).value
    return None


def _kernel_kind(symbols: dict, launch: ir.Operation, function: str) -> str:
    """What a launch computes, for people: its library routine, or its
    kernel's name without the function's prefix and the numbering
    (`step_gelu_12_fused3` -> `gelu (fused)`)."""
    library = _library(symbols, launch)
    if library:
        return library
    kernel = ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value
    if kernel.startswith(function + "_"):
        kernel = kernel[len(function) + 1:]
    fused = re.search(r"_fused\d+$", kernel) is not None
    kernel = re.sub(r"(_fused)?_?\d+", "", kernel)
    return kernel + (" (fused)" if fused else "")


def _walk(f: ir.Operation, ops: list, symbols: dict, params: set,
          loss_inputs: set | None) -> RankMemory:
    """The peak over `ops` (one rank's instructions of schedule function `f`)."""
    function = ir.StringAttr(f.attributes["sym_name"]).value
    args = list(f.regions[0].blocks[0].arguments)
    launches = [(op, *_ins_outs(op)) for op in ops if op.name == "tsched.launch"]
    views = {outs[0]: ins[0] for op, ins, outs in launches if _library(symbols, op) == "reshape"}
    category = _categories(args, launches, views, params, loss_inputs)
    made: dict = {}          # buffer -> (what made it, Python line)
    for op, _, outs in launches:
        for buf in outs:
            made[buf] = (_kernel_kind(symbols, op, function), source_of(op.location))
    for op in ops:
        if op.name in ("tsched.collective_start", "tsched.recv"):
            dst = op.operands[1] if op.name == "tsched.collective_start" else op.operands[0]
            category[dst] = "communication"
            made[dst] = (op.name.split(".", 1)[1], source_of(op.location))
        elif op.name == "tsched.alloc" and "symmetric" in op.attributes:
            category[op.results[0]] = "communication"

    storage: dict = {}       # buffer -> its allocation (a view shares its input's)
    holders: dict = {}       # allocation -> buffers still referring to it
    size: dict = {}          # allocation -> bytes
    live = 0
    by_category = dict.fromkeys(CATEGORIES, 0)
    category_peaks = dict.fromkeys(CATEGORIES, 0)
    best = (-1, [], "")

    def allocate(buf) -> None:
        nonlocal live
        storage[buf], holders[buf], size[buf] = buf, {buf}, _memref(buf.type)[2]
        live += size[buf]
        cat = category.get(buf, "activations")
        by_category[cat] += size[buf]
        category_peaks[cat] = max(category_peaks[cat], by_category[cat])

    def note(where: str):
        nonlocal best
        if live > best[0]:
            best = (live, list(size), where)

    for a in args:
        allocate(a)
    note("")
    stored, in_backward = 0, False
    for op in ops:
        if op.name == "tsched.launch":
            backward = tag_of(op.location).backward
            if backward and not in_backward:
                stored = max(stored, by_category["activations"])
            in_backward = backward
        if op.name == "tsched.alloc" and op.results[0] not in views:
            allocate(op.results[0])
            note(f"{made.get(op.results[0], ('alloc',))[0]} at {source_of(op.location)}")
        elif op.name == "tsched.launch" and list(op.opview.outs)[:1] and \
                op.opview.outs[0] in views:
            dst = op.opview.outs[0]
            storage[dst] = storage[views[dst]]
            holders[storage[dst]].add(dst)
        elif op.name == "tsched.free" and op.operands[0] in storage:
            buf = op.operands[0]
            root = storage.pop(buf)
            holders[root].discard(buf)
            if not holders[root]:
                live -= size[root]
                by_category[category.get(root, "activations")] -= size.pop(root)
                del holders[root]

    def describe(buf) -> Buffer:
        shape, dtype, nbytes = _memref(buf.type)
        if isinstance(buf, ir.BlockArgument):
            name = location_name(buf.location) or f"argument {buf.arg_number}"
            source = source_of(buf.location)
        else:
            name, source = made.get(buf, ("alloc", source_of(buf.owner.location)))
        return Buffer(name, shape, dtype, nbytes, category.get(buf, "activations"), source)

    held = sorted((describe(b) for b in best[1]), key=lambda b: -b.bytes)
    totals = dict.fromkeys(CATEGORIES, 0)
    for b in held:
        totals[b.category] += b.bytes
    return RankMemory(0, best[0], totals, held, best[2], category_peaks, stored)


def _categories(args: list, launches: list, views: dict, params: set,
                loss_inputs: set | None) -> dict:
    """Each argument's and launch result's category (see the module docstring)."""
    category: dict = {}
    for i, a in enumerate(args):
        category[a] = ("parameters" if i in params else
                       "optimizer state" if loss_inputs is not None and i not in loss_inputs
                       else "inputs")
    for op, ins, outs in launches:
        tag = tag_of(op.location)
        if outs and outs[0] in views:
            category[outs[0]] = category.get(views[outs[0]], "activations")
            continue
        read = [category.get(v, "activations") for v in ins]
        if tag.recompute:
            cat = "activations"
        elif tag.backward:
            cat = "gradients"
        elif any(c in ("gradients", "update", "optimizer state") for c in read):
            cat = "gradients" if all(c == "gradients" for c in read) else "update"
        else:
            cat = "activations"
        for buf in outs:
            category[buf] = cat
    return category


def _ins_outs(launch: ir.Operation) -> tuple[list, list]:
    """A launch's input and output buffers."""
    view = launch.opview
    return list(view.ins), list(view.outs)
