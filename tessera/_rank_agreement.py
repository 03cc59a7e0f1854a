"""Every rank of a job must run the same compiled program.

A global-view function is one program for the whole mesh: each rank runs its
part and the collectives pair up because every rank issues them in the same
order with the same sizes. Python code that branches on the rank (or on
anything else that differs between processes) traces a different program on
each rank, and nothing in MPI or NCCL notices: the ranks' collectives are
paired with each other's and the result is a mixture of the programs, or
garbage. So before a freshly traced program runs, the ranks compare a
fingerprint of its Graph IR (32 bytes a rank, gathered once per compilation,
under TESSERA_COLLECTIVE_TIMEOUT); when they differ, every rank raises the
same error naming the ranks and the first op where their programs part, and
nothing runs; a rank that never comes (stuck before the call) is named by
the others' CollectiveTimeout.
"""

from __future__ import annotations

import hashlib

import numpy as np

from tessera_compiler.ir.types import ELEMENT_BYTES
from tessera_mlir import ir

from ._dtensor import DTensor
from ._mpi import allgather_text, exchange, listed, world_comm
from ._source import SourceLine
from .errors import CompileError, InputMismatch

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


def agree_on_program(name: str, module: ir.Module, extra: str = "",
                     source: str | None = None) -> None:
    """Raises CompileError on every rank unless every rank of COMM_WORLD
    traced the same program, or CollectiveTimeout naming the ranks that
    never came to compare it (within TESSERA_COLLECTIVE_TIMEOUT). Every rank
    must call it; `source` is the user's line that called `name`."""
    comm = world_comm()
    at = f" (called at {source})" if source else ""
    what = (f"the program agreement before the first run of {name}{at}: the ranks check "
            "that they traced the same program")
    every = exchange(comm, fingerprint(module, extra), f"the program agreement of {name}", what,
                     source=source)
    if all(d == every[0] for d in every):
        return
    # Rare and fatal: now exchange the programs themselves to say where they differ.
    texts = allgather_text(comm, "\n".join(program_ops(module)),
                           what=f"the program listings of {name}")
    raise CompileError(describe_mismatch(name, every, [t.splitlines() for t in texts]))


def describe_mismatch(name: str, digests: list[bytes], programs: list[list[str]]) -> str:
    """The error every rank raises: the groups of ranks that traced the same
    program, and for each group after the first the first op where its
    program differs from rank 0's."""
    groups: dict[bytes, list[int]] = {}
    for rank, digest in enumerate(digests):
        groups.setdefault(digest, []).append(rank)
    ranks = list(groups.values())
    lines = [f"{name}: the ranks traced {len(ranks)} different programs ("
             + "; ".join(f"program {k + 1} on {listed(g)}"
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


# -- the arguments' values -----------------------------------------------------------
#
# The arguments of a global-view call are global values: every rank passes
# the same numpy array, and the blocks of a DTensor replicated over an axis
# are the same along it. Nothing in the program can see a breach (each rank
# computes with what it was given), so the DDP habit of passing each rank's
# own batch would silently give each rank its own result. Before the first
# run of each signature (every run with TESSERA_CHECK_INPUTS=always) the ranks
# compare an 8-byte checksum of every such argument.

#: TESSERA_CHECK_INPUTS values: check before each signature's first run, before
#: every run, or not at all
CHECK_MODES = ("first", "always", "never")


def checksum(array: np.ndarray) -> int:
    """xxh3 of the array's bytes in C order (the same bits, the same sum)."""
    import xxhash
    flat = np.ascontiguousarray(array).reshape(-1)
    return xxhash.xxh3_64_intdigest(flat.view(np.uint8))


def agreement_groups(leaf, mesh) -> list | None:
    """For each mesh rank, which ranks must hold the same bytes of `leaf`
    (a group label per rank), or None when no two must: an array is a
    global value, the same on every rank; a DTensor's block is the same on
    the ranks that differ only along the axes it is replicated over."""
    if not isinstance(leaf, DTensor):
        return [0] * mesh.size
    distinct = {a for d in leaf.dims for a in d} | set(leaf.layout.partial)
    if leaf.held is not None:       # (held by some ranks of an axis: none to compare along it)
        distinct.add(leaf.held[0])
    if len(distinct) == len(mesh.axes):
        return None
    keep = [i for i, a in enumerate(mesh.axes) if a in distinct]
    return [tuple(mesh.info.coords(r)[i] for i in keep) for r in range(mesh.size)]


def agree_on_inputs(name: str, inputs: list, mesh, source: str | None = None) -> None:
    """Raises InputMismatch on every rank unless every `(path, leaf)` of
    `inputs` (the call's tensor arguments and the constants the function
    captured) holds the same bytes on the ranks that must agree on it (see
    agreement_groups). Every rank of `mesh` (the job) must call it."""
    mine = np.array([(checksum(leaf.local()) if leaf.holds() else 0)
                     if isinstance(leaf, DTensor) else checksum(np.asarray(leaf))
                     for _, leaf in inputs], np.uint64)
    at = f" (called at {source})" if source else ""
    every = exchange(world_comm(), mine.tobytes(), f"the argument check of {name}",
                     f"the argument check before the first run of {name}{at}: the ranks "
                     "compare checksums of the arguments they must agree on", source=source)
    sums = np.stack([np.frombuffer(b, np.uint64) for b in every])      # [ranks, inputs]
    for i, (path, leaf) in enumerate(inputs):
        groups = agreement_groups(leaf, mesh)
        if groups is None:
            continue
        for label in dict.fromkeys(groups):
            members = [r for r in range(mesh.size) if groups[r] == label]
            values = {}
            for r in members:
                values.setdefault(int(sums[r, i]), []).append(r)
            if len(values) > 1:
                raise InputMismatch(_describe_input_mismatch(name, path, leaf, mesh,
                                                             list(values.values()), at))


def _describe_input_mismatch(name, path, leaf, mesh, holders: list, at: str) -> str:
    which = "; ".join(f"{listed(h)} {'hold' if len(h) > 1 else 'holds'} "
                      f"{'one value' if k == 0 else 'another'}" for k, h in enumerate(holders))
    if isinstance(leaf, DTensor):
        split = {a for d in leaf.dims for a in d} | set(leaf.layout.partial)
        over = ", ".join(repr(a) for a in mesh.axes if a not in split)
        what = (f"{path} is a DTensor replicated over {over}, so its block must be the same on "
                f"the ranks along {'it' if len(split) == len(mesh.axes) - 1 else 'them'}, but "
                f"it differs: {which}")
    else:
        what = (f"{path} is a numpy array, so it is a global value that every rank passes "
                f"alike, but it differs: {which}")
    return (f"{name}{at}: {what}. The arguments of a compiled (global-view) function are "
            "global values. For per-rank data (each rank's own batch): build the global "
            "value from every rank's block with dist.from_local(x, axis='dp') (or "
            "ts.distribute(strategy='data_parallel', batch_is_local=True)); for a value laid "
            "out over the mesh, pass a DTensor with its layout (dist.from_numpy(x, layout=...)); "
            "for per-rank code, use @dist.spmd. Nothing ran.")
