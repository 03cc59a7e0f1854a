"""The cost model: how long a compiled step takes on each rank of a machine.

A prediction needs only the compiled program (the Schedule IR function as
`program.json` instructions, and the Tile IR kernels) and a `Machine`:

  kernel        launch_s + max(bytes / memory rate, elementwise ops / vector
                rate + transcendental ops / their rate + dot FLOPs / GEMM rate),
                the op counts read from the kernel's Tile IR (ops on tiles,
                times the grid, times constant loop trip counts), each op's
                class from the op table (`ir/ops.py`: `op_class`)
  matmul        gemm_call_s + 2 m n k (x batch) / GEMM rate of the dtype and
                size (small GEMMs run slower: the measured gemm_curve); a
                grouped GEMM (MoE experts) gemm_call_s per group + 2 rows k n
                / the rate of one group's share
  other library launch_s + 2 x its output's bytes / copy (or transpose) rate;
                a value check launch_s + its input's bytes / memory rate (the
                class is the routine's `cost` in tessera_runtime/routines.py)
  collective    the ring alpha-beta model of the link its group uses: an
                all_reduce of B bytes over n ranks takes 2(n-1) alpha +
                2(n-1)/n B beta, all_gather / reduce_scatter / all_to_all
                (n-1) alpha + (n-1)/n B beta (B: the larger buffer), a
                broadcast (pipelined) log2(n) alpha + B beta, a
                send, recv or ring shift alpha + B beta. A group whose ranks all sit on one
                node (`ranks_per_node`) uses the `intra` link, else `inter`.
  instruction   instruction_s of executor work each (allocs, events, ...)
  call          call_s per call of the compiled function, plus argument_s per
                argument and result (Python: pytrees, checks, outputs)

`predict` walks one rank's instructions in order with a clock per stream and
one for the host: a launch runs when its stream is free (the host waits for
it unless the machine launches asynchronously), an event orders two
streams, and a collective runs on its stream from its start, hidden under
compute until the stream that waits for it needs it; on a machine without
`overlap` (the CPU runtime) it runs at its wait instead, except a send,
which copies its data out in its start (into a shared-memory slot). With more ranks on a node than it has cores (4 ranks on this
2-core machine), the ranks take turns: a step lasts at least the ranks' host
work over the cores, and a rank spends the difference in its collectives
waiting for ranks that are not running (`dist.profile`'s "waiting"). The
parts add up to the step: compute, comm exposed, waiting (for peers that
start late, see below), runtime (instructions), call; comm hidden is what
overlapped.

Machines: `h100-node` and `h200-node` are datasheet descriptions (8 GPUs per
node on NVLink, InfiniBand between nodes; rates scaled by typical achieved
efficiency, not measured here); `cpu` is this machine, measured by
`tessera.machine.calibrate` (cached per host and ranks per node).
`predict` takes a rank's peers to be ready when it starts a transfer or
collective. `predict_ranks` walks several ranks together, pairing each recv
with its peer's send and each collective with its group's starts (in
order): what a rank then blocks beyond the transfer's own time is its
`waiting` part. `estimate` does that for a pipeline's stage ranks, so a
pipelined step's prediction holds its bubble as the compiled program has it
(transfers, result broadcasts and executor work included; the schedule
alone, at the actions' FLOP costs, is `tessera_compiler.ir.pipeline.simulate`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from tessera_mlir import ir

from tessera_runtime import routines

from .ir import ops
from .ir.sharding import sub_axis
from .ir.types import DTYPE_BYTES, is_tile, tile_of


@dataclass(frozen=True)
class Link:
    """A link's alpha (seconds per message step) and beta (seconds per byte)."""
    alpha_s: float
    beta_s: float


@dataclass(frozen=True)
class Machine:
    """What the cost model knows about a machine (rates per rank)."""
    name: str
    #: GEMM FLOP/s by dtype name ("default" for the others), for large GEMMs
    gemm_flops: dict
    gemm_call_s: float
    #: generated kernels: bytes/s of loads and stores, elementwise ops/s,
    #: transcendental ops/s, and the fixed cost of a launch
    memory_bytes_per_s: float
    vector_ops_per_s: float
    transcendental_ops_per_s: float
    launch_s: float
    #: library copies (pad, slice, concat, reshape, gather, scatter) and
    #: transposes: bytes/s read and written
    copy_bytes_per_s: float
    transpose_bytes_per_s: float
    #: the executor's work per instruction, and a compiled function's per call
    instruction_s: float
    call_s: float
    #: ... plus this per argument and result of the call (pytrees, checks)
    argument_s: float
    intra: Link
    inter: Link
    ranks_per_node: int
    #: host cores per node that run the ranks' host work: with more ranks
    #: than cores, the ranks take turns (see `predict`)
    cores_per_node: int
    #: collectives progress while the rank computes (NCCL); False: only
    #: inside the wait (MPI on the CPU)
    overlap: bool
    #: the host runs ahead of the streams (GPU); False: a launch returns
    #: when its work is done (CPU engine)
    async_launch: bool
    #: how the numbers were obtained
    source: str = ""
    #: measured [FLOPs of one GEMM, FLOP/s] (ascending): smaller GEMMs run
    #: slower; a GEMM's rate is interpolated (log-log) between these, as a
    #: fraction of the largest one's, times gemm_flops[dtype]
    gemm_curve: list = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Machine":
        d = dict(d)
        d["intra"], d["inter"] = Link(**d["intra"]), Link(**d["inter"])
        return cls(**d)

    def gemm_rate(self, dtype: str, flops: float | None = None) -> float:
        rate = self.gemm_flops.get(dtype, self.gemm_flops["default"])
        curve = self.gemm_curve
        if flops is None or len(curve) < 2:
            return rate
        xs = [math.log(f) for f, _ in curve]
        ys = [math.log(r / curve[-1][1]) for _, r in curve]
        x = min(max(math.log(max(flops, 1.0)), xs[0]), xs[-1])
        i = max(j for j in range(len(xs) - 1) if xs[j] <= x) if x > xs[0] else 0
        t = (x - xs[i]) / (xs[i + 1] - xs[i])
        return rate * math.exp(ys[i] + t * (ys[i + 1] - ys[i]))

    def link(self, stride: int, n: int) -> Link:
        """The link of a group of `n` ranks `stride` apart in world order."""
        return self.intra if stride * (n - 1) < self.ranks_per_node else self.inter


def _gpu_node(name: str, hbm_bytes_per_s: float) -> Machine:
    # H100/H200 SXM datasheet peaks times typical achieved efficiency:
    # dense bf16 989 TFLOP/s (~70% in large GEMMs), fp32 67 TFLOP/s without
    # TF32, NVLink 4 450 GB/s per direction (NCCL reaches ~360 GB/s bus
    # bandwidth), NDR InfiniBand 400 Gb/s per GPU (~45 GB/s).
    return Machine(
        name=name, gemm_flops={"bfloat16": 690e12, "float16": 690e12, "float32": 50e12,
                               "default": 50e12},
        gemm_call_s=4e-6, memory_bytes_per_s=0.85 * hbm_bytes_per_s,
        vector_ops_per_s=30e12, transcendental_ops_per_s=4e12, launch_s=4e-6,
        copy_bytes_per_s=0.8 * hbm_bytes_per_s, transpose_bytes_per_s=0.6 * hbm_bytes_per_s,
        instruction_s=2e-6, call_s=50e-6, argument_s=2e-6,
        intra=Link(2e-6, 1 / 360e9), inter=Link(5e-6, 1 / 45e9), ranks_per_node=8,
        cores_per_node=8,
        overlap=True, async_launch=True,
        source="datasheet peaks x typical efficiency (not measured by Tessera)")


BUILTIN = {"h100-node": _gpu_node("h100-node", 3.35e12),
           "h200-node": _gpu_node("h200-node", 4.8e12)}


# ---------------------------------------------------------------------------
# What each kernel does
# ---------------------------------------------------------------------------
@dataclass
class KernelWork:
    """A generated kernel's work: elementwise, transcendental and dot FLOPs."""
    vector: float = 0.0
    transcendental: float = 0.0
    dot: float = 0.0


def _tile_shape(t: ir.Type) -> list[int]:
    """A `!ttile.tile<AxBxT>`'s shape ([] for other types)."""
    return tile_of(t)[0] if is_tile(t) else []


def _trip_count(op: ir.Operation) -> int:
    """A constant-bound scf.for's trip count (1 if not constant)."""
    try:
        lo, hi, step = (ir.IntegerAttr(v.owner.attributes["value"]).value
                        for v in op.operands[:3])
    except (KeyError, ValueError, TypeError, AttributeError):
        return 1
    return max(0, -(-(hi - lo) // step)) if step > 0 else 1


def _count(block: ir.Block, scale: float, work: KernelWork) -> None:
    for op in block.operations:
        op = op.operation
        name = op.name
        if name == "scf.for":
            inner = scale * _trip_count(op)
            for region in op.regions:
                for b in region.blocks:
                    _count(b, inner, work)
            continue
        for region in op.regions:
            for b in region.blocks:
                _count(b, scale, work)
        kind = ops.op_class(name)
        if not name.startswith("ttile.") or kind == "move":
            continue
        if name == "ttile.dot":
            a, b = (_tile_shape(v.type) for v in op.operands[:2])
            work.dot += scale * 2 * math.prod(a) * b[-1]
            continue
        elements = max([math.prod(_tile_shape(v.type)) for v in list(op.operands) + list(op.results)
                        if _tile_shape(v.type)], default=0)
        if kind == "transcendental":
            work.transcendental += scale * elements
        else:
            work.vector += scale * elements


def kernel_work(module: ir.Module) -> dict:
    """{kernel symbol: KernelWork} of the module's Tile IR kernels."""
    out = {}
    for op in module.body.operations:
        op = op.operation
        if op.name != "ttile.kernel":
            continue
        grid = math.prod(ir.DenseI64ArrayAttr(op.attributes["grid"])) \
            if "grid" in op.attributes else 1
        work = KernelWork()
        for b in op.regions[0].blocks:
            _count(b, float(grid), work)
        out[ir.StringAttr(op.attributes["sym_name"]).value] = work
    return out


# ---------------------------------------------------------------------------
# One rank's step
# ---------------------------------------------------------------------------
@dataclass
class Prediction:
    """One rank's predicted step: seconds by part and the costed instructions."""
    rank: int
    step_s: float
    parts: dict
    #: (instruction index, what, category, seconds, Python line)
    items: list = field(default_factory=list, repr=False)
    #: the predicted timeline: (stream, what, category, start s, end s, args),
    #: dist.profile's slice form (`tessera simulate` writes it as a trace)
    slices: list = field(default_factory=list, repr=False)
    #: seconds blocked in collective waits (transfers finishing there and
    #: peers starting late): what the profiler's "collective:wait" measures
    waits_s: float = 0.0
    #: communication by kind ("all_reduce", "shift": a ring's, "send", ...):
    #: [exposed, hidden] seconds
    comm_by_kind: dict = field(default_factory=dict)


@dataclass
class Cost:
    """A step's prediction on every rank (`trace.cost()`)."""
    machine: Machine
    ranks: list
    #: how many distinct rank roles were predicted (ranks that run the same
    #: instructions share one prediction)
    roles: int = 1

    @property
    def step_s(self) -> float:
        return max(p.step_s for p in self.ranks)

    def table(self, top: int = 8) -> str:
        cols = ("compute", "comm_exposed", "waiting", "runtime", "call")
        lines = [f"predicted on {self.machine.name} ({self.machine.source})",
                 f"{'rank':>4} {'step ms':>9} " + " ".join(f"{c:>13}" for c in cols)
                 + f" {'comm hidden':>12}"]
        for p in self.ranks:
            lines.append(f"{p.rank:>4} {p.step_s * 1e3:9.2f} " + " ".join(
                f"{p.parts[c] * 1e3:8.2f} {p.parts[c] / p.step_s:4.0%}" if p.step_s else
                f"{0:13.2f}" for c in cols) + f" {p.parts['comm_hidden'] * 1e3:9.2f} ms")
        first = self.ranks[0]
        if first.items and top:
            lines.append(f"rank {first.rank}'s most expensive instructions:")
            for i, what, cat, s, loc in sorted(first.items, key=lambda x: -x[3])[:top]:
                lines.append(f"  {s * 1e3:8.3f} ms  {cat:<10} instructions[{i}] {what}"
                             + (f"  ({loc})" if loc else ""))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _buffer_bytes(shape, dtype: str) -> int:
    return math.prod(shape) * DTYPE_BYTES[dtype]


def _coordinates(mesh: dict, rank: int) -> dict:
    """{axis: coordinate} of world rank `rank` on the program's mesh."""
    pos = mesh["devices"].index(rank)
    out = {}
    for axis, n in reversed(list(zip(mesh["axes"], mesh["shape"]))):
        out[axis] = pos % n
        pos //= n
    return out


def _group(mesh: dict | None, axis: str) -> tuple[int, int]:
    """(ranks, stride in world order) of the groups of mesh axes `axis`
    ("dp" or "dp,tp"), or of a sub-axis ("dp:(2)4", see
    `tessera_compiler.ir.sharding.sub_axis`)."""
    if mesh is None:
        return 1, 1
    part = sub_axis(axis)
    if part is not None:
        name, pre, size = part
        n, stride = _group(mesh, name)
        return size, stride * (n // (pre * size))
    names = [a for a in axis.split(",") if a]
    sizes = dict(zip(mesh["axes"], mesh["shape"]))
    n = math.prod(sizes.get(a, 1) for a in names)
    inner = [i for i, a in enumerate(mesh["axes"]) if a in names]
    stride = math.prod(mesh["shape"][max(inner) + 1:]) if inner else 1
    return n, stride


def collective_seconds(kind: str, nbytes: int, n: int, link: Link) -> float:
    """The ring alpha-beta time of a collective of `nbytes` over `n` ranks."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * nbytes * link.beta_s
    if kind == "shift":
        # One message to the next rank around the ring (every rank sends at once).
        return link.alpha_s + nbytes * link.beta_s
    if kind == "broadcast":
        # Pipelined (NCCL's ring, the CPU's shared-memory pieces): the bytes
        # cross a link about once, the latency once per tree level.
        return math.ceil(math.log2(n)) * link.alpha_s + nbytes * link.beta_s
    # all_gather, reduce_scatter, all_to_all: each rank sends (n-1)/n of the larger buffer
    return (n - 1) * link.alpha_s + (n - 1) / n * nbytes * link.beta_s


def _members(mesh: dict, rank: int, axis: str) -> tuple:
    """The world ranks of `rank`'s group over mesh axes `axis`: those that
    share its coordinates on every other axis. (A sub-axis' group is taken
    as its whole axis': a joint prediction then waits for a few more ranks
    than the collective does.)"""
    part = sub_axis(axis)
    names = {part[0]} if part is not None else {a for a in axis.split(",") if a}
    mine = _coordinates(mesh, rank)
    return tuple(r for r in mesh["devices"]
                 if all(c == mine[a] for a, c in _coordinates(mesh, r).items() if a not in names))


def _walk(program: dict, work: dict, machine: Machine, rank: int):
    """World rank `rank`'s step, as a generator: it yields ("post", key,
    seconds) when a send or collective starts (when its data is ready) and
    ("need", keys) at the first wait for a recv or collective (the start
    times of the peers' matching send or starts: a list of seconds, or None
    where they are not known), and returns the Prediction."""
    mesh = program.get("mesh")
    coords = _coordinates(mesh, rank) if mesh else {}
    shapes = {s["value"]: (s["local_shape"], s["dtype"]) for s in program["inputs"]}
    host = 0.0
    free = {s: 0.0 for s in program["streams"]}
    events: dict = {}
    tokens: dict = {}          # token -> [start, seconds, done, peer keys]
    pending: dict = {}         # token -> its timeline slice, placed at its first wait
    issued: dict = {}          # (kind, axis, peer) -> transfers or collectives so far
    compute = exposed = hidden = waiting = in_waits = 0.0
    items, slices = [], []
    by_kind: dict = {}         # communication kind -> [exposed, hidden] seconds

    def nbytes(value):
        shape, dtype = shapes[value]
        return _buffer_bytes(shape, dtype)

    def count(key) -> int:
        issued[key] = issued.get(key, -1) + 1
        return issued[key]

    groups: dict = {}

    def group_of(axis) -> tuple:
        if axis not in groups:
            groups[axis] = _members(mesh, rank, axis) if mesh else (rank,)
        return groups[axis]

    for index, ins in enumerate(program["instructions"]):
        on = ins.get("on")
        if on is not None and coords.get(on["axis"]) != on["rank"]:
            continue
        op = ins["op"]
        host += machine.instruction_s
        if op == "alloc":
            shapes[ins["result"]] = (ins["shape"], ins["dtype"])
        elif op == "launch":
            seconds = _launch_seconds(ins, work, shapes, machine)
            stream = ins["stream"]
            start = max(host, free.get(stream, 0.0))
            free[stream] = start + seconds
            if not machine.async_launch:
                host = free[stream]
            compute += seconds
            what = ins["kernel"] + (f" [{ins['library']}]" if "library" in ins else "")
            items.append((index, what, "compute", seconds, ins.get("loc")))
            slices.append((stream, what, "compute", start, free[stream],
                           {"op": ins.get("library", "kernel"), "source": ins.get("loc"),
                            "schedule_op": f"tsched.launch, instructions[{index}]"}))
        elif op == "event_record":
            events[ins["result"]] = free.get(ins["stream"], host)
        elif op == "event_wait":
            free[ins["stream"]] = max(free.get(ins["stream"], 0.0), events.get(ins["event"], 0.0))
        elif op in ("collective_start", "send", "recv"):
            n, stride = _group(mesh, ins["axis"])
            link = machine.link(stride, n)
            if op == "collective_start":
                # (A broadcast's src exists on its root only: the sizes agree.)
                size = max(nbytes(ins["dst"]), nbytes(ins["src"]) if ins["src"] in shapes else 0)
                seconds = collective_seconds(ins["collective"], size, n, link)
                what = f"{ins['axis']} {ins['collective']} {size} B"
            else:
                size = nbytes(ins["buffer"])
                seconds = link.alpha_s + size * link.beta_s
                what = f"{ins['axis']} {op} {size} B"
            stream = ins["stream"]
            start = max(host, free.get(stream, 0.0))
            done = None
            args = {"op": ins.get("collective", op), "axis": ins["axis"], "bytes": size,
                    "source": ins.get("loc"), "schedule_op": f"tsched.{op}, instructions[{index}]"}
            items.append((index, what, "comm", seconds, ins.get("loc")))
            if machine.overlap:
                done = free[stream] = start + seconds
            elif op == "send":
                # Without overlap (the CPU runtime), a send copies its data out
                # in its start (into a shared-memory slot, or MPI's eager
                # buffer); its wait finds it done.
                done = start + seconds
                exposed += seconds
                by_kind.setdefault(op, [0.0, 0.0])[0] += seconds
                if not machine.async_launch:
                    host = done
                slices.append((stream, what, "comm", start, done, args))
            # Peers pair up by order: the k-th send from a to b with b's k-th
            # recv from a; the k-th collective of a group on every member.
            # A key's last element is the rank that posts it.
            if op == "collective_start":
                group = group_of(ins["axis"])
                k = count(("collective", ins["axis"], group))
                mine = ("collective", ins["axis"], group, k, rank)
                peers = [("collective", ins["axis"], group, k, r) for r in group if r != rank]
            else:
                other = group_of(ins["axis"])[ins["peer"]]
                src, dst = (rank, other) if op == "send" else (other, rank)
                k = count((op, ins["axis"], other))
                mine = ("p2p", ins["axis"], dst, k, src) if op == "send" else None
                peers = [("p2p", ins["axis"], dst, k, src)] if op == "recv" else []
            if mine is not None:
                yield ("post", mine, start)
            if done is not None and not machine.overlap:       # paid in full at the start
                tokens[ins["result"]] = [start, 0.0, done, peers, "waited"]
            else:
                tokens[ins["result"]] = [start, seconds, done, peers]
                pending[ins["result"]] = (stream, what, args)
        elif op == "collective_wait":
            token = tokens[ins["token"]]
            start, seconds, done, peers = token[:4]
            waiter = ins["stream"]
            ready = max(host, free.get(waiter, 0.0))
            if len(token) == 4:     # the first wait: what it blocks is exposed
                starts = (yield ("need", peers)) if peers else None
                # The transfer begins once every rank taking part has started it.
                begin = max([start] + list(starts or ()))
                if done is None:    # no overlap: the transfer happens inside the wait
                    done = max(ready, begin) + seconds
                else:
                    done = max(done, begin + seconds)
                token[2] = done
                # Blocked: the peers' lateness (waiting), then the transfer's
                # own time (exposed) as far as compute did not hide it.
                late = max(0.0, begin - max(ready, start))
                own = min(seconds, max(0.0, done - ready) - late)
                exposed += own
                waiting += late
                in_waits += own + late
                hidden += seconds - own
                token.append("waited")
                stream, what, args = pending.pop(ins["token"])
                kind = by_kind.setdefault(args["op"], [0.0, 0.0])
                kind[0] += own
                kind[1] += seconds - own
                slices.append((stream, what, "comm", done - seconds, done, args))
                if late:
                    slices.append((waiter, "waiting for peers", "wait", max(ready, start),
                                   max(ready, start) + late,
                                   {"what": "the peers had not started it yet"}))
            free[waiter] = max(free.get(waiter, 0.0), done)
            if not machine.async_launch:
                host = max(host, done)
    call = machine.call_s + machine.argument_s * (len(program["inputs"])
                                                  + len(program.get("outputs", ())))
    end = max([host] + list(free.values())) + call
    # What the streams do not cover is the host's: all of the executor's
    # work on a synchronous engine, the gaps where the device waits for the
    # host on an asynchronous one. The parts add up to the step.
    runtime = max(0.0, end - call - compute - exposed - waiting)
    if not machine.async_launch and machine.ranks_per_node > machine.cores_per_node:
        # More ranks than cores: the ranks' host work (all of it, on a
        # synchronous engine) takes turns on the cores, so a step lasts at
        # least its total over the cores; a rank spends the difference in
        # its collectives, waiting for ranks that are not running.
        shared = (compute + runtime + call) * machine.ranks_per_node / machine.cores_per_node
        if shared > end:
            exposed += shared - end
            end = shared
    parts = {"compute": compute, "comm_exposed": exposed, "comm_hidden": hidden,
             "runtime": runtime, "call": call, "waiting": waiting}
    slices.append(("host", "step", "run", 0.0, end, {"what": "one call, as predicted"}))
    return Prediction(rank, end, parts, items, slices, in_waits, by_kind)


def predict(program: dict, work: dict, machine: Machine, rank: int = 0) -> Prediction:
    """World rank `rank`'s step of `program` (program.json's dict) on `machine`;
    `work` is `kernel_work` of the program's module. Alone: each transfer and
    collective starts when this rank starts it (its peers are taken to be
    ready; `predict_ranks` simulates them together)."""
    return _alone(_walk(program, work, machine, rank))


def _alone(walk) -> Prediction:
    """Runs a rank's walk with its peers taken to be ready."""
    try:
        while True:
            walk.send(None)
    except StopIteration as finished:
        return finished.value


def predict_ranks(program: dict, work: dict, machine: Machine, ranks) -> list[Prediction]:
    """The steps of world ranks `ranks` of `program`, simulated together: a
    recv completes no earlier than its peer's matching send starts plus the
    transfer, a collective no earlier than the last of its members (among
    `ranks`; the others are taken to be ready) starts it plus its time. The
    time a rank blocks beyond the transfer's own is its `waiting` part: a
    pipeline's bubble as the compiled program has it (stage actions at the
    cost model's times, with the transfers, the results' broadcasts and the
    executor's work), where `ir.pipeline.simulate` prices actions alone."""
    ranks = list(ranks)
    inside = set(ranks)
    walks = {r: _walk(program, work, machine, r) for r in ranks}
    posted: dict = {}
    blocked: dict = {r: None for r in ranks}     # rank -> the keys it waits for
    done: dict = {}
    answers = {r: None for r in ranks}
    while walks:
        moved = False
        for r in list(walks):
            keys = blocked[r]
            if keys is not None:
                needed = [k for k in keys if k[-1] in inside]
                if any(k not in posted for k in needed):
                    continue
                answers[r], blocked[r] = [posted[k] for k in needed], None
            try:
                while True:
                    request = walks[r].send(answers[r])
                    answers[r] = None
                    moved = True
                    if request[0] == "post":
                        posted[request[1]] = request[2]
                    else:
                        blocked[r] = request[1]
                        break
            except StopIteration as finished:
                done[r] = finished.value
                del walks[r]
                moved = True
        if not moved:
            stuck = {r: blocked[r] for r in walks}
            raise ValueError(f"the ranks' transfers do not pair up: ranks {sorted(stuck)} wait "
                             f"for peers that never start theirs ({stuck})")
    return [done[r] for r in ranks]


def _launch_seconds(ins: dict, work: dict, shapes: dict, machine: Machine) -> float:
    args = [shapes[a] for a in ins["args"]]
    if "library" not in ins:
        return _kernel_seconds(ins["kernel"], args, work, machine)
    # Priced by the routine's cost class (routines.COST_CLASSES).
    kind = routines.routine(ins["library"]).cost
    if kind == "gemm":
        a, dtype = args[0]
        out = args[-1][0]
        attrs = ins.get("attrs", {})
        k = a[-2] if attrs.get("transpose_lhs") else a[-1]
        flops = 2.0 * math.prod(out) * k
        gemm = machine.gemm_call_s + flops / machine.gemm_rate(dtype, flops)
        if "epilogue" not in attrs:
            return gemm
        # The kernel it runs on each block of rows (no launch of its own).
        return gemm + _kernel_seconds(attrs["epilogue"], [args[i] for i in attrs["epilogue_args"]],
                                      work, machine) - machine.launch_s
    if kind == "grouped_gemm":
        # One GEMM per group over its segment of rows: 2 rows k n in all.
        (rows, k), dtype = args[0]
        flops = 2.0 * rows * k * args[-1][0][-1]
        return (machine.gemm_call_s * math.prod(args[2][0]) +
                flops / machine.gemm_rate(dtype, flops / max(1, math.prod(args[2][0]))))
    if kind == "view":                  # the runtime makes it a view of its input
        return 0.0
    if kind == "read":                  # reads its input once, writes nothing
        return machine.launch_s + _buffer_bytes(*args[0]) / machine.memory_bytes_per_s
    # A copy reads and writes about its output's bytes (a slice reads only
    # the part it keeps).
    out_bytes = _buffer_bytes(*args[-1])
    rate = machine.transpose_bytes_per_s if kind == "transpose" else machine.copy_bytes_per_s
    return machine.launch_s + 2 * out_bytes / rate


def _kernel_seconds(kernel: str, args: list, work: dict, machine: Machine) -> float:
    """A generated kernel's launch on buffers `args` ((shape, dtype) each)."""
    moved = sum(_buffer_bytes(s, d) for s, d in args)
    w = work.get(kernel, KernelWork())
    arithmetic = (w.vector / machine.vector_ops_per_s
                  + w.transcendental / machine.transcendental_ops_per_s
                  + w.dot / machine.gemm_rate(args[0][1] if args else "default"))
    return machine.launch_s + max(moved / machine.memory_bytes_per_s, arithmetic)


def estimate(module: ir.Module, machine: Machine, ranks=None) -> Cost:
    """The prediction of the compiled (Tile IR level) `module` on `machine`
    for world ranks `ranks` (default: every rank of its mesh; ranks with the
    same role share one prediction)."""
    from .bundle import program_json
    program = program_json(module)
    work = kernel_work(module)
    mesh = program.get("mesh")
    world = mesh["devices"] if mesh else [0]
    ranks = list(world if ranks is None else ranks)
    roles = {}
    out = []
    # Ranks differ only in the instructions that run on one coordinate of
    # an axis (a pipeline stage's): one prediction per distinct coordinate
    # along those axes (a role), however many ranks share it.
    role_axes = sorted({i["on"]["axis"] for i in program["instructions"] if "on" in i})

    def role(r):
        coords = _coordinates(mesh, r) if mesh else {}
        return tuple(coords.get(a) for a in role_axes)

    if role_axes:
        # A pipeline: one rank per role, along the role axes from the first
        # rank, simulated together (each stage waits for the one before).
        base = _coordinates(mesh, world[0])
        together = [r for r in world if all(c == base[a] for a, c in
                                            _coordinates(mesh, r).items() if a not in role_axes)]
        roles = {role(r): p for r, p in zip(together, predict_ranks(program, work, machine,
                                                                    together))}
    for r in ranks:
        key = role(r)
        if key not in roles:
            roles[key] = predict(program, work, machine, r)
        p = roles[key]
        out.append(Prediction(r, p.step_s, p.parts, p.items, p.slices, p.waits_s, p.comm_by_kind))
    return Cost(machine, out, len(roles))

