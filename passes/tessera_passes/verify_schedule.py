"""tessera-verify-schedule: run every rank's schedule symbolically and
reject one that would hang or mispair at run time.

A schedule function holds every rank's program: an op with a `tsched.action`
(`{axis, rank, ...}`) runs only on that rank of the axis, the others on
every rank. For each rank of each axis that actions name, the pass takes
that rank's ops in program order and runs them all together, with the
blocking rules of the runtime:

* `tsched.send` / `tsched.recv` start at once; the k-th send from rank A to
  rank B pairs with the k-th recv on B from A, which must move the same
  type. Waiting on a send's or a recv's token blocks until its partner has
  started.
* a collective over the axis completes once every rank of the axis has
  started it; the n-th collective over the axis must be the same one (kind,
  types) on every rank. Collectives over other axes pair up by themselves
  (the ranks of such a group run the same program).
* for each stage and microbatch, F comes before B and B before W.

A mismatch, an unpaired send or recv, or a state where no rank can move
(a deadlock) is an error at the op concerned, naming the ranks and where
each one waits: found here, before anything runs, instead of as a hang.

Library declarations (`func.func` with `tsched.library`, from
tessera-lower-to-tile on) are checked against their routine's declaration
in `tessera_runtime/routines.py`: a known routine, only its attributes,
each required one present and of its type, its number of buffers, and the
result buffers its result rule gives. The pipeline runs this pass again
after the tile passes, so that no bundle names a routine the runtime does
not declare.
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.ir.routines import declaration, declarations
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.pipeline import ACTION, action_rank
from tessera_compiler.ir.sharding import meshes_of
from tessera_compiler.ir.support import PassError, functions, ops_of, run_reporting
from tessera_compiler.ir.locations import source_of

#: the ops that do an action's work (its F / B / W order is checked on them)
ORDERED = ("tsched.launch", "tsched.send", "tsched.recv", "tsched.collective_start")


def _action(op: ir.Operation):
    if ACTION not in op.attributes:
        return None
    d = ir.DictAttr(op.attributes[ACTION])
    if "axis" not in d or "rank" not in d:
        raise PassError("'tsched.action' must name an 'axis' and a 'rank'", op.location)
    return d


def _where(op: ir.Operation) -> str:
    src = source_of(op.location)
    return f"{op.name} at {src}" if src else op.name


def _describe(op: ir.Operation) -> str:
    d = _action(op)
    if d is None or "kind" not in d:
        return _where(op)
    kind = ir.StringAttr(d["kind"]).value
    stage, mb = ir.IntegerAttr(d["stage"]).value, ir.IntegerAttr(d["microbatch"]).value
    return f"{_where(op)} ({kind} of stage {stage}, microbatch {mb})"


class _Rank:
    def __init__(self, rank: int, ops: list):
        self.rank = rank
        self.ops = ops
        self.pc = 0

    @property
    def current(self):
        return self.ops[self.pc] if self.pc < len(self.ops) else None


def verify_axis(func_op: ir.Operation, axis: str, size: int) -> None:
    body = ops_of(func_op)
    ranks = []
    for r in range(size):
        mine = []
        for op in body:
            where = action_rank(op)
            if where is None or where[0] != axis or where[1] == r:
                mine.append(op)
        ranks.append(_Rank(r, mine))
    _check_action_order(ranks)

    sends: dict = {}        # (src, dst) -> [op]
    recvs: dict = {}        # (src, dst) -> [op]
    collectives: dict = {}  # rank -> [op] over this axis
    token_of: dict = {}     # (rank, token value) -> what completes it

    def posted(key, table, k):
        return len(table.get(key, [])) > k

    def start(rank: _Rank, op) -> None:
        name = op.name
        if name == "tsched.send":
            peer = ir.IntegerAttr(op.attributes["peer"]).value
            if peer == rank.rank:
                raise PassError(f"rank {rank.rank} sends to itself", op.location)
            chan = sends.setdefault((rank.rank, peer), [])
            chan.append(op)
            token_of[(rank.rank, op.results[0])] = ("recv", (rank.rank, peer), len(chan) - 1)
            _match(chan, recvs.get((rank.rank, peer), []), len(chan) - 1)
        elif name == "tsched.recv":
            peer = ir.IntegerAttr(op.attributes["peer"]).value
            chan = recvs.setdefault((peer, rank.rank), [])
            chan.append(op)
            token_of[(rank.rank, op.results[0])] = ("send", (peer, rank.rank), len(chan) - 1)
            _match(sends.get((peer, rank.rank), []), chan, len(chan) - 1)
        elif name == "tsched.collective_start" and ir.StringAttr(op.attributes["axis"]).value == axis:
            mine = collectives.setdefault(rank.rank, [])
            mine.append(op)
            n = len(mine) - 1
            for other, theirs in collectives.items():
                if other != rank.rank and len(theirs) > n and not _same_collective(theirs[n], op):
                    raise PassError(
                        f"collective #{n} over '{axis}' differs between ranks: rank {rank.rank} "
                        f"runs {_describe(op)}, rank {other} runs {_describe(theirs[n])}; every "
                        f"rank of '{axis}' must issue the same collectives in the same order",
                        op.location)
            token_of[(rank.rank, op.results[0])] = ("collective", None, n)

    def blocked(rank: _Rank, op) -> str | None:
        """Why `op` cannot complete yet on `rank` (None: it can)."""
        if op.name != "tsched.collective_wait":
            return None
        what = token_of.get((rank.rank, op.operands[0]))
        if what is None:
            return None
        kind, chan, k = what
        if kind == "recv" and not posted(chan, recvs, k):
            return f"for rank {chan[1]} to receive its send #{k} from rank {chan[0]}"
        if kind == "send" and not posted(chan, sends, k):
            return f"for rank {chan[0]}'s send #{k} to rank {chan[1]}"
        if kind == "collective":
            missing = [r.rank for r in ranks if len(collectives.get(r.rank, [])) <= k]
            if missing:
                return f"for ranks {missing} to start collective #{k} over '{axis}'"
        return None

    while True:
        moved = False
        for rank in ranks:
            while rank.current is not None:
                op = rank.current
                if blocked(rank, op):
                    break
                start(rank, op)
                rank.pc += 1
                moved = True
        if all(r.current is None for r in ranks):
            break
        if not moved:
            waiting = [r for r in ranks if r.current is not None]
            detail = "; ".join(f"rank {r.rank} waits at {_describe(r.current)} "
                               f"{blocked(r, r.current)}" for r in waiting)
            raise PassError(f"the ranks of '{axis}' deadlock: {detail}", waiting[0].current.location)
    for (src, dst), chan in sends.items():
        got = recvs.get((src, dst), [])
        if len(chan) != len(got):
            extra = chan[len(got)] if len(chan) > len(got) else got[len(chan)]
            raise PassError(f"rank {src} sends {len(chan)} buffers to rank {dst}, which receives "
                            f"{len(got)} from it: {_describe(extra)} has no partner",
                            extra.location)
    for (src, dst), chan in recvs.items():
        if (src, dst) not in sends:
            raise PassError(f"rank {dst} receives from rank {src}, which never sends to it: "
                            f"{_describe(chan[0])} has no partner", chan[0].location)


def _match(sends: list, recvs: list, k: int) -> None:
    if len(sends) > k and len(recvs) > k:
        s, r = sends[k], recvs[k]
        if s.operands[0].type != r.operands[0].type:
            raise PassError(f"send #{k} ({_describe(s)}) moves {s.operands[0].type} but the "
                            f"recv it pairs with ({_describe(r)}) expects {r.operands[0].type}",
                            r.location)


def _same_collective(a: ir.Operation, b: ir.Operation) -> bool:
    return (str(a.attributes["kind"]) == str(b.attributes["kind"]) and
            [v.type for v in a.operands][:2] == [v.type for v in b.operands][:2])


def _check_action_order(ranks: list) -> None:
    order = {"F": 0, "B": 1, "W": 2, "E": 3}     # (E: a rank's end action, the epilogue's)
    for rank in ranks:
        seen: dict = {}
        for op in rank.ops:
            d = _action(op)
            # (Frees and waits of an action's buffers may come later.)
            if d is None or "kind" not in d or op.name not in ORDERED:
                continue
            kind = ir.StringAttr(d["kind"]).value
            if kind not in order:
                raise PassError(f"unknown action kind '{kind}' (F, B, W or E)", op.location)
            key = (ir.IntegerAttr(d["stage"]).value, ir.IntegerAttr(d["microbatch"]).value)
            last = seen.get(key, -1)
            if order[kind] < last:
                later = [k for k, v in order.items() if v == last][0]
                raise PassError(f"rank {rank.rank} runs {kind} of stage {key[0]}, microbatch "
                                f"{key[1]} after its {later}: each microbatch's F must come "
                                "before its B, and B before W", op.location)
            seen[key] = max(last, order[kind])


def run(op, pass_, options: TargetOptions):
    def body():
        meshes = meshes_of(op)
        for f in list(functions(op)):
            axes = {}
            for inner in ops_of(f):
                where = action_rank(inner)
                if where is not None:
                    axes.setdefault(where[0], inner)
            for axis, first in axes.items():
                mesh = next((m for m in meshes.values() if axis in m.axes), None)
                if mesh is None:
                    raise PassError(f"'tsched.action' names axis '{axis}', which no mesh has",
                                    first.location)
                verify_axis(f, axis, mesh.axis_size(axis))
        for decl in declarations(op):
            declaration(decl)
    run_reporting(op, pass_, body)
