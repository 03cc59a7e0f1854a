"""Every rank of a job must run the same compiled program.

A global-view function is one program for the whole mesh: each rank runs its
part and the collectives pair up because every rank issues them in the same
order with the same sizes. Python code that branches on the rank (or on
anything else that differs between processes) traces a different program on
each rank, and nothing in MPI or NCCL notices: the ranks' collectives are
paired with each other's and the result is a mixture of the programs, or
garbage. So before a freshly traced program runs, the ranks compare a
fingerprint of its Graph IR (one 32-byte all-gather per compilation); when they
differ, every rank raises the same error naming the ranks and the first op
where their programs part, and nothing runs.
"""

from __future__ import annotations

import hashlib

import numpy as np

from tessera_compiler.ir.types import ELEMENT_BYTES
from tessera_mlir import ir

from ._mpi import allgather_text, world_comm
from ._source import SourceLine
from .errors import CompileError

DIGEST_BYTES = 32


#: on a per-rank body that sends or receives: every rank's sends and recvs
#: (each process traces every rank's body, so all must find the same plan)
PEER_PLAN = "tessera.peer_plan"

COLLECTIVES = ("tgraph.all_reduce", "tgraph.all_gather", "tgraph.reduce_scatter",
               "tgraph.all_to_all")


def program_ops(module: ir.Module) -> list[str]:
    """One line per op the ranks must agree on: every op of the global
    program, and the collectives of per-rank (local-view) bodies, which may
    otherwise differ by rank. Each line: the op's text (no location), its
    result bytes and the Python line it came from."""
    lines = []
    for op in module.body.operations:
        if PEER_PLAN in op.operation.attributes:
            lines += _plan(op.operation)
        for inner in _agreed_ops(op.operation):
            lines.append(f"{_text(inner)}  ({_bytes(inner)} bytes){_where(inner.location)}")
    return lines


def _plan(body) -> list[str]:
    """A per-rank body's sends and receives on every rank, as this process
    traced them (local_view records them on the body)."""
    name = ir.StringAttr(body.attributes["sym_name"]).value
    return [f"{name} {line}" for line in
            ir.StringAttr(body.attributes[PEER_PLAN]).value.splitlines()]


def _text(op) -> str:
    """An op as the ranks compare it. A per-rank body's collective is named
    by what it does (kind, axis, types), not its SSA names, which depend on
    the rank-specific code before it."""
    if op.name in COLLECTIVES and "tgraph.local" in op.parent.attributes:
        attrs = ", ".join(f"{name} = {op.attributes[name]}" for name in sorted(
            op.attributes[i].name for i in range(len(op.attributes))))
        types = ", ".join(str(v.type) for v in op.operands)
        return f"{op.name} {{{attrs}}} : {types} -> {op.results[0].type}"
    return op.get_asm(enable_debug_info=False).strip().splitlines()[0]


def _agreed_ops(op) -> list:
    if op.name != "func.func":
        return [op]
    inner = [o.operation for o in op.regions[0].blocks[0].operations]
    if "tgraph.local" in op.attributes:
        return [o for o in inner if o.name in COLLECTIVES]
    return inner


def _bytes(op) -> int:
    """Bytes of the op's tensor results (what a differing op would move)."""
    total = 0
    for result in op.results:
        if isinstance(result.type, ir.RankedTensorType):
            t = result.type
            total += int(np.prod(t.shape, dtype=np.int64)) * ELEMENT_BYTES.get(
                str(t.element_type), 4)
    return total


def _where(loc: ir.Location) -> str:
    text = str(loc)          # loc("file.py":12:0) or a fused/named location around one
    start = text.find('"')
    if start < 0:
        return ""
    end = text.find('"', start + 1)
    rest = text[end + 1:].split(":")
    line = rest[1] if len(rest) > 1 else "?"
    return f"  at {SourceLine(text[start + 1:end], int(line) if line.isdigit() else 0)}"


def fingerprint(module: ir.Module, extra: str = "") -> bytes:
    """The program as the ranks must agree on it: its Graph IR without
    locations (two ranks may reach the same op from different lines), its
    per-rank bodies by their collectives (per axis, in order) and the sends
    and receives every rank's copy of them makes, plus `extra` (the
    compilation options)."""
    parts = [extra]
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and "tgraph.local" in op.attributes:
            parts += _plan(op) if PEER_PLAN in op.attributes else []
            parts += [_text(o) for o in _agreed_ops(op)]
        else:
            parts.append(op.get_asm(enable_debug_info=False))
    return hashlib.sha256("\n".join(parts).encode()).digest()


def agree_on_program(name: str, module: ir.Module, extra: str = "") -> None:
    """Raises CompileError on every rank unless every rank of COMM_WORLD
    traced the same program. Collective: every rank must call it."""
    comm = world_comm()
    mine = np.frombuffer(fingerprint(module, extra), np.uint8)
    every = np.empty((comm.Get_size(), DIGEST_BYTES), np.uint8)
    comm.Allgather(mine, every)
    if (every == every[0]).all():
        return
    # Rare and fatal: now exchange the programs themselves to say where they differ.
    texts = allgather_text(comm, "\n".join(program_ops(module)))
    raise CompileError(describe_mismatch(name, [bytes(d) for d in every],
                                         [t.splitlines() for t in texts]))


def describe_mismatch(name: str, digests: list[bytes], programs: list[list[str]]) -> str:
    """The error every rank raises: the groups of ranks that traced the same
    program, and for each group after the first the first op where its
    program differs from rank 0's."""
    groups: dict[bytes, list[int]] = {}
    for rank, digest in enumerate(digests):
        groups.setdefault(digest, []).append(rank)
    ranks = list(groups.values())
    lines = [f"{name}: the ranks traced {len(ranks)} different programs ("
             + "; ".join(f"program {k + 1} on rank{'s' if len(g) > 1 else ''} {_ranks(g)}"
                         for k, g in enumerate(ranks))
             + "), so their collectives would pair with each other's and mix the programs' "
             "data; nothing ran."]
    base = programs[0]
    for group in ranks[1:]:
        other = programs[group[0]]
        i = next((k for k, (a, b) in enumerate(zip(base, other)) if a != b),
                 min(len(base), len(other)))
        lines.append(f"  first difference, op #{i} of the program:")
        lines.append(f"    rank 0: {base[i] if i < len(base) else '(program ends)'}")
        lines.append(f"    rank {group[0]}: {other[i] if i < len(other) else '(program ends)'}")
    lines.append("A compiled function is one program for every rank: its global-view code must "
                 "not depend on the rank (MPI, per-process data used as constants), and per-rank "
                 "code (dist.spmd) may differ by rank only where its collectives still pair up, "
                 "the same kind, axis and size in the same order. Put rank-dependent placement "
                 "in the layouts (ShardSpec), and rank-dependent values in the arguments. "
                 "(Python's hash() of a str differs between processes unless PYTHONHASHSEED is "
                 "set, as `tessera launch` sets it.)")
    return "\n".join(lines)


def _ranks(group: list[int]) -> str:
    return ", ".join(map(str, group))
