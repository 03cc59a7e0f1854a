"""Every rank's per-rank program at once: do its sends, receives and
collectives pair up, and does every rank finish?

Per-rank (local-view) code may differ by rank (`if ts.mesh.current().rank ==
owner:`), and then nothing in MPI or NCCL checks that a send meets the
receive meant for it: a missing partner is a hang, a mismatched one garbage.
The frontend traces the body once for every rank and hands the programs
here, so every rank runs the same check on the same programs and raises the
same error, before anything runs.

The model is the runtime's (tessera-lower-to-schedule): each communication
starts, without blocking, where the program makes it; a recv or collective is
waited for where its value is first read (at once if nothing reads it), a
send at the end.
The k-th send from rank A to rank B pairs with the k-th recv on B from A and
must move the same type; the n-th collective over an axis must be the same
on every rank of the axis group. A state where some rank waits and no rank
can move is a deadlock, reported with what each rank waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera_mlir import ir

from .spmd import PER_RANK_COLLECTIVES

class PeerError(Exception):
    """The ranks' programs do not pair up (the message says where)."""


@dataclass
class Start:
    kind: str                 # "send", "recv" or a collective's op name
    channel: tuple            # (src, dst) global ranks, or (axis, group) for a collective
    type: str                 # what it moves (a collective: its kind, axis and types)
    what: str                 # for messages: the op and its Python line
    token: int


@dataclass
class Wait:
    token: int
    what: str


@dataclass
class Program:
    """One rank's communication, in program order."""
    rank: int
    steps: list = field(default_factory=list)


def program_of(body: ir.Operation, rank: int, peer_rank, group_of, describe,
               extra_sends=()) -> Program:
    """The communication steps of `rank`'s traced `body` (a func.func).
    `peer_rank(op)` is the global rank a send/recv names, `group_of(axis)`
    this rank's group along `axis`, `describe(op)` names an op for messages,
    and `extra_sends` are (value, peer, what) sent just before the return."""
    program = Program(rank)
    waiting: dict = {}        # value -> token not yet waited for
    sends: list = []
    for op in [o.operation for o in body.regions[0].blocks[0].operations]:
        if op.name == "func.return":
            for value, peer, what in extra_sends:
                t = len(program.steps)
                program.steps.append(Start("send", (rank, peer), str(value.type), what, t))
                sends.append(t)
        for v in op.operands:
            if v in waiting:
                program.steps.append(Wait(waiting.pop(v), describe(op)))
        if op.name == "func.return":
            break
        token = len(program.steps)
        if op.name == "tgraph.send":
            program.steps.append(Start("send", (rank, peer_rank(op)), str(op.operands[0].type),
                                       describe(op), token))
            sends.append(token)
        elif op.name == "tgraph.recv":
            program.steps.append(Start("recv", (peer_rank(op), rank), str(op.results[0].type),
                                       describe(op), token))
            _wait_where_read(program, waiting, op, token, describe)
        elif op.name in PER_RANK_COLLECTIVES and op.name != "tgraph.axis_slice":
            axis = ir.StringAttr(op.attributes["axis"]).value
            text = f"{op.name} over '{axis}' {', '.join(str(v.type) for v in op.operands)}"
            program.steps.append(Start(op.name, (axis, group_of(axis)), text, describe(op), token))
            _wait_where_read(program, waiting, op, token, describe)
    for token in list(waiting.values()) + sends:
        program.steps.append(Wait(token, "the end of the program"))
    return program


def _wait_where_read(program: Program, waiting: dict, op: ir.Operation, token: int,
                     describe) -> None:
    """A value nothing reads is waited for at once (as the runtime does)."""
    if list(op.results[0].uses):
        waiting[op.results[0]] = token
    else:
        program.steps.append(Wait(token, describe(op)))


def check(programs: list[Program], group_size) -> None:
    """Raises PeerError unless `programs` (one per rank) pair up and all
    finish; `group_size(axis)` is the number of ranks a collective waits for."""
    sends: dict = {}          # (src, dst) -> [Start]
    recvs: dict = {}          # (src, dst) -> [Start]
    colls: dict = {}          # (axis, group) -> {rank: [Start]}
    started: dict = {}        # (rank, token) -> (table, key, index)
    pc = {p.rank: 0 for p in programs}

    def start(rank: int, step: Start) -> None:
        if step.kind in ("send", "recv"):
            mine, theirs = (sends, recvs) if step.kind == "send" else (recvs, sends)
            chan = mine.setdefault(step.channel, [])
            chan.append(step)
            k = len(chan) - 1
            other = theirs.get(step.channel, [])
            if len(other) > k and other[k].type != step.type:
                send, recv = (step, other[k]) if step.kind == "send" else (other[k], step)
                raise PeerError(f"send #{k} from rank {step.channel[0]} to rank "
                                f"{step.channel[1]} moves {send.type} ({send.what}) but the "
                                f"recv it pairs with expects {recv.type} ({recv.what})")
            started[(rank, step.token)] = (theirs, step.channel, k)
            return
        group = colls.setdefault(step.channel, {})
        mine = group.setdefault(rank, [])
        mine.append(step)
        n = len(mine) - 1
        for other, theirs in group.items():
            if len(theirs) > n and theirs[n].type != step.type:
                raise PeerError(f"collective #{n} over '{step.channel[0]}' differs between "
                                f"ranks: rank {rank} runs {step.type} ({step.what}), rank "
                                f"{other} runs {theirs[n].type} ({theirs[n].what})")
        started[(rank, step.token)] = (colls, step.channel, n)

    def blocked(wait: Wait, rank: int) -> str | None:
        """Why `wait` cannot complete yet on `rank` (None: it can)."""
        table, key, k = started[(rank, wait.token)]
        if table is colls:
            axis = key[0]
            got = sum(1 for steps in colls[key].values() if len(steps) > k)
            need = group_size(axis)
            return None if got >= need else (
                f"for {need - got} more rank(s) of axis '{axis}' to start collective #{k} "
                f"({colls[key][rank][k].what})")
        if len(table.get(key, [])) > k:
            return None
        src, dst = key
        mine = (sends if table is recvs else recvs)[key][k]
        return (f"for rank {dst} to receive its send #{k} ({mine.what})" if table is recvs
                else f"for rank {src}'s send #{k} to it ({mine.what})")

    while True:
        moved = False
        for p in programs:
            while pc[p.rank] < len(p.steps):
                step = p.steps[pc[p.rank]]
                if isinstance(step, Wait):
                    if blocked(step, p.rank):
                        break
                else:
                    start(p.rank, step)
                pc[p.rank] += 1
                moved = True
        stuck = [p for p in programs if pc[p.rank] < len(p.steps)]
        if not stuck:
            break
        if not moved:
            detail = "; ".join(f"rank {p.rank} waits at {p.steps[pc[p.rank]].what} "
                               f"{blocked(p.steps[pc[p.rank]], p.rank)}" for p in stuck)
            raise PeerError(f"the ranks would wait for each other forever: {detail}")
    for (src, dst), chan in sends.items():
        got = recvs.get((src, dst), [])
        if len(got) != len(chan):
            extra = chan[len(got)] if len(chan) > len(got) else got[len(chan)]
            raise PeerError(f"rank {src} sends {len(chan)} value(s) to rank {dst}, which "
                            f"receives {len(got)} from it: {extra.what} has no partner")
    for (src, dst), chan in recvs.items():
        if (src, dst) not in sends:
            raise PeerError(f"rank {dst} receives from rank {src}, which never sends to it: "
                            f"{chan[0].what} has no partner")
