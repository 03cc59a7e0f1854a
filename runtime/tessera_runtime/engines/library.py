"""Library routines: launches the compiler hands to a well-kept library
instead of generating a kernel (matmul to BLAS, data movement to the array
library). Written against the numpy array API, so the same code runs on
numpy (CPU engine) and, later, cupy (GPU engine).

Each routine takes the launch's buffers (inputs, then the one output) and
the op's attributes, and writes the output in place. What each routine
takes and gives is declared in `tessera_runtime/routines.py`; ROUTINES
below registers against those names.
"""

from __future__ import annotations

import math
import re

import numpy as np

from .. import random, routines
from ..errors import TesseraError


class LibraryError(RuntimeError):
    """A library routine got arguments it cannot handle (e.g. an index out of range)."""


class ValueCheckError(TesseraError, LibraryError, ValueError):
    """A value a compiled step checks was out of range: `ts.nn.cross_entropy`'s
    targets outside [0, C) that are not its ignore_index. Raised once the
    step has run (a check, `tgraph.check_range`, never stops a step
    half-way, on any device), naming the row of the flattened targets, the
    value, C and the user's line. `row`: the element's position in the
    flattened global tensor, `value`: the element, `low`, `high`,
    `allowed`: what passes (`[low, high)` and the values of `allowed`),
    `source`: the user's Python line (`file:line`, or None). It is
    `ts.ValueCheckError`."""

    def __init__(self, message: str = "", row: int | None = None, value: int | None = None,
                 low: int | None = None, high: int | None = None, allowed: tuple = (),
                 source: str | None = None):
        super().__init__(message)
        self.row, self.value, self.low, self.high = row, value, low, high
        self.allowed, self.source = tuple(allowed), source


def _compute_dtype(xp, dtype):
    # Half precision (bf16, f16) is multiplied in fp32: BLAS has no bf16, and
    # fp32 accumulation is what mixed precision means.
    return xp.float32 if np.dtype(dtype).itemsize < 4 and np.dtype(dtype).kind in "fV" else None


def matmul(xp, attrs, a, b, out):
    # tessera-fold-transposes: an operand arrives untransposed; its transposed
    # view hands BLAS a transpose flag instead of a copy.
    if attrs.get("transpose_lhs"):
        a = a.swapaxes(-1, -2)
    if attrs.get("transpose_rhs"):
        b = b.swapaxes(-1, -2)
    wide = _compute_dtype(xp, out.dtype)
    if wide is None:
        xp.matmul(a, b, out=out)
    else:
        out[...] = xp.matmul(a.astype(wide), b.astype(wide)).astype(out.dtype)


def reshape(xp, attrs, a, out):
    out[...] = a.reshape(out.shape)


def transpose(xp, attrs, a, out):
    out[...] = a.transpose(attrs["perm"])


def _box(offsets, shape):
    return tuple(slice(o, o + n) for o, n in zip(offsets, shape))


def slice_(xp, attrs, a, out):
    out[...] = a[_box(attrs["offsets"], out.shape)]


def pad(xp, attrs, a, out):
    out.fill(0)
    out[_box(attrs["offsets"], a.shape)] = a


def concat(xp, attrs, *args):
    *inputs, out = args
    xp.concatenate(inputs, axis=attrs["dim"], out=out)


def _dynamic_box(start, dim: int, size: int, shape) -> tuple:
    """The index of a block of `size` along `dim` at run-time `start` (an
    int32 scalar buffer). The frontend's check_range fails the step with
    the user's error when the start leaves no room; the start is clamped
    here only so that such a step never reads or writes past the buffer
    (its results are not returned)."""
    first = min(max(int(start), 0), shape[dim] - size)
    return (slice(None),) * dim + (slice(first, first + size),)


def dynamic_slice(xp, attrs, x, start, out):
    out[...] = x[_dynamic_box(start, attrs["dim"], out.shape[attrs["dim"]], x.shape)]


def dynamic_update_slice(xp, attrs, x, start, update, out):
    box = _dynamic_box(start, attrs["dim"], update.shape[attrs["dim"]], x.shape)
    if out is not x:
        out[...] = x
    out[box] = update


def index_out_of_range(routine: str, index: int, rows: int) -> LibraryError:
    """The error of embedding routine `routine` given id `index` for a table
    of `rows` rows (the CPU engine's C versions raise it too)."""
    return LibraryError(f"{routines.ROUTINES[routine].what}: index {index} is out of range for a table "
                        f"of {rows} rows")


def _check_indices(xp, ids, rows, routine):
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        bad = ids[(ids < 0) | (ids >= rows)]
        raise index_out_of_range(routine, int(bad[0]), rows)


def _row_block(attrs, rows):
    """(first row, row count of the whole table) of this rank's block of a
    table split by rows over mesh axes (`block` = (index, count), filled in
    by the executor), or (0, rows) for a whole table."""
    index, count = attrs.get("block", (0, 1))
    return index * rows, rows * count


def gather(xp, attrs, table, ids, out):
    rows = table.shape[0]
    first, total = _row_block(attrs, rows)
    _check_indices(xp, ids, total, "gather")
    if total == rows:
        xp.take(table, ids, axis=0, out=out)
        return
    # Vocab-parallel: look up the rows this rank holds, -0.0 elsewhere (the
    # identity of the sum over the ranks: x + -0.0 == x, -0.0 included).
    local = ids - first
    mine = (local >= 0) & (local < rows)
    xp.take(table, xp.where(mine, local, 0), axis=0, out=out)
    out[~mine] = -0.0


def scatter_add(xp, attrs, updates, ids, out):
    rows = out.shape[0]
    first, total = _row_block(attrs, rows)
    _check_indices(xp, ids, total, "scatter_add")
    out.fill(0)
    if total == rows:
        _add_rows(xp, out, ids, updates)
        return
    local = ids - first
    mine = (local >= 0) & (local < rows)
    _add_rows(xp, out, local[mine], updates[mine])


def _add_rows(xp, out, ids, updates) -> None:
    """out[ids[i]] += updates[i] (rows of `out`; `ids` of any shape, `updates`
    of that shape + a row). On the host: the updates sorted by id (stably)
    and each id's run summed with np.add.reduceat: np.add.at loops per
    element in Python-level dispatch (the measurement:
    bench/results/docstring-timings-moved-2026-12-02.md). Deterministic: the same sums in the
    same order on every run and for every split of the table's rows (a
    vocab-parallel rank sums its rows' runs exactly as one rank would)."""
    if _on_device(xp):
        xp.add.at(out, ids, updates)
        return
    flat = ids.reshape(-1)
    rows = updates.reshape(flat.size, -1)
    if not flat.size:
        return
    order = np.argsort(flat, kind="stable")
    sorted_ids = flat[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    out.reshape(out.shape[0], -1)[sorted_ids[starts]] = np.add.reduceat(rows[order], starts, axis=0)


# -- value checks -------------------------------------------------------------------
#
# A check writes no buffer. It returns a flag, which the executor keeps
# until the step has run and then reads (`Engine.read_flags`, one small copy
# on a GPU) and turns into an error (`failed_check`): a check never
# synchronizes a device, and a step is never abandoned half-way, with
# collectives in flight.

#: the routines that check values (they return a flag instead of writing)
CHECKS = routines.CHECKS

#: the unsigned integer type of each integer width (bytes)
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def check_range(xp, attrs, x):
    """`tgraph.check_range` on this rank's block `x`: every element must lie
    in [low, high) or be one of `allowed`. The flag: None when every element
    passes, else (row, value) of the first that fails, its row counted in
    the flattened global tensor (`global_index`). On a device
    (a cupy array) the flag is always a device array [row or -1, value],
    computed there with no host read (`_check_on_device`): the engine reads
    it with the step's results. (The CPU engine checks int32 and int64 blocks
    in one call of its kernel library instead: `_check_by_address`.)"""
    if type(x) is not np.ndarray:
        return _check_on_device(xp, attrs, x)
    if not x.size:
        return None
    low, high = attrs["low"], attrs["high"]
    if low == 0 and x.dtype.kind == "i" and high <= 1 << (8 * x.dtype.itemsize - 1):
        # One reduction: seen unsigned, a negative value is at least `high`
        # (on 256 int32 one max is ~1.6 us, a min and a max ~4).
        if x.view(_UNSIGNED[x.dtype.itemsize]).max() < high:
            return None
    elif low <= x.min() and x.max() < high:
        return None
    flat = x.reshape(-1)
    bad = _failing(flat, attrs)
    i = int(bad.argmax())
    return (global_index(attrs, x.shape, i), int(flat[i])) if bad[i] else None


def global_index(attrs, shape, i):
    """Where element `i` (row-major) of this rank's block, of `shape`, lies
    in the flattened global tensor: from `block` (the first dimension split:
    the block's first element is its index times its size) or `blocks` (an
    (index, count) per dimension). `i` may be a device scalar (the result
    is then one, computed there)."""
    blocks = attrs.get("blocks")
    if blocks is None:
        return attrs.get("block", (0, 1))[0] * math.prod(shape) + i
    at, local_stride, global_stride = 0, 1, 1
    for n, (index, count) in zip(reversed(shape), reversed(blocks)):
        at = at + (index * n + i // local_stride % n) * global_stride
        local_stride, global_stride = local_stride * n, global_stride * n * count
    return at


def _failing(flat, attrs):
    """Which elements of `flat` (numpy or device) check_range refuses."""
    bad = (flat < attrs["low"]) | (flat >= attrs["high"])
    for a in attrs.get("allowed", ()):
        bad &= flat != a
    return bad


def _check_on_device(xp, attrs, x):
    """check_range's flag as a device array [row or -1, value] of the first
    failing element: argmax of the failing mask, read where it lies, with
    no synchronization (no value leaves the device)."""
    flat = x.reshape(-1)
    if not flat.size:
        return None
    bad = _failing(flat, attrs)
    i = xp.argmax(bad)                          # the first failing element, or 0
    row = xp.where(xp.take(bad, i), global_index(attrs, x.shape, i.astype(xp.int64)), -1)
    return xp.stack([row, xp.take(flat, i).astype(xp.int64)])


def failed_check(attrs: dict, row: int, value: int, source: str | None) -> ValueCheckError:
    """The error of a check (its launch's `attrs`) whose flag names `row`
    and `value`; `source` is the launch's Python line. The op's `message`
    says what was checked, in its user's words; `{row}`, `{value}` and
    `{where}` are filled in here."""
    fields = {"row": str(row), "value": str(value), "where": f" at {source}" if source else ""}
    text = re.sub(r"\{(row|value|where)\}", lambda m: fields[m.group(1)], attrs["message"])
    return ValueCheckError(text, row=row, value=value, low=attrs["low"], high=attrs["high"],
                           allowed=tuple(attrs.get("allowed", ())), source=source)


# -- mixture of experts -------------------------------------------------------------

def _on_device(xp) -> bool:
    """Whether `xp` is a device array module (cupy), not numpy (or the CPU
    engine's numpy with GEMMs on its kernel team)."""
    return hasattr(xp, "asnumpy")


def _host(xp, a) -> np.ndarray:
    """A small device array (segment sizes) on the host."""
    return xp.asnumpy(a) if _on_device(xp) else np.asarray(a)


def topk(xp, attrs, x, out):
    """Indices of the k largest along the last dim, largest first, ties to the
    lower index (a stable sort of the negated values)."""
    values = x if x.dtype.itemsize >= 4 else x.astype(xp.float32)
    order = xp.argsort(-values, axis=-1, kind="stable")
    out[...] = order[..., :out.shape[-1]]


def _dispatch_slots(xp, experts, attrs, rows: int, base=None):
    """The row of each (token, choice) in the dispatch layout of `rows` rows
    (-1 where dropped) and each expert's kept row count. Rows are packed by
    expert (each block of E / blocks experts padded to rows / blocks); within an
    expert, by (choice, token). A choice's position in its expert's fill
    order is base[j, e] (default: this call's earlier choices of e) plus its
    rank among the (j, e) rows; a capacity keeps positions below it."""
    num_experts, capacity = attrs["num_experts"], attrs["capacity"]
    blocks = attrs.get("blocks", 1)
    tokens, k = experts.shape
    n = tokens * k
    flat = experts.T.reshape(-1).astype(xp.int64)          # choice-major: (j, t)
    if n and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
        bad = flat[(flat < 0) | (flat >= num_experts)]
        raise LibraryError(f"moe routing: expert index {int(bad[0])} is out of range for "
                           f"{num_experts} experts")
    group = xp.repeat(xp.arange(k), tokens) * num_experts + flat      # (j, e)
    order = xp.argsort(group * n + xp.arange(n), axis=0)              # by (j, e), then token
    counts = xp.bincount(group, minlength=k * num_experts)            # [k * E]
    rank = xp.empty(n, dtype=xp.int64)
    rank[order] = xp.arange(n) - (xp.cumsum(counts) - counts)[group[order]]
    counts = counts.reshape(k, num_experts)
    if base is None:                                   # this call's earlier choices of e
        base = xp.cumsum(counts, axis=0) - counts
    base = xp.asarray(base, dtype=xp.int64).reshape(-1)
    limit = n if capacity == 0 else capacity
    position = base[group] + rank
    kept_je = xp.clip(limit - base.reshape(k, num_experts), 0, counts)   # [k, E]
    kept = kept_je.sum(axis=0)                                           # [E]
    per_block = num_experts // blocks
    first = xp.cumsum(kept.reshape(blocks, per_block), axis=1) - kept.reshape(blocks, per_block)
    first = first.reshape(-1) + xp.repeat(xp.arange(blocks) * (rows // blocks), per_block)
    before = (xp.cumsum(kept_je, axis=0) - kept_je).reshape(-1)          # earlier choices kept
    slots = xp.where(position < limit, first[flat] + before[group] + rank, -1)
    return slots.reshape(k, tokens).T, kept


def moe_dispatch(xp, attrs, x, experts, *rest):
    *base, rows, sizes = rest
    slots, kept = _dispatch_slots(xp, experts, attrs, rows.shape[0], *base)
    sizes[...] = kept
    per_block = _host(xp, kept).reshape(attrs.get("blocks", 1), -1)
    _zero_past(rows, _segments(xp, per_block, rows.shape[0], "moe_dispatch"))
    t, j = xp.nonzero(slots >= 0)
    rows[slots[t, j]] = x[t] if x.ndim == 2 else x[t, j]


def moe_collect(xp, attrs, rows, experts, *rest):
    *base, out = rest
    slots, _ = _dispatch_slots(xp, experts, attrs, rows.shape[0], *base)
    out.fill(0)
    t, j = xp.nonzero(slots >= 0)
    out[t, j] = rows[slots[t, j]]


def _segments(xp, sizes, rows: int, what: str):
    """(start, stop) of each segment of `sizes` ([S], or [B, S]: B blocks of
    rows / B rows, each block's segments from its first row)."""
    host = _host(xp, sizes).astype(np.int64)
    host = host[None] if host.ndim == 1 else host
    height = rows // host.shape[0]
    out = []
    for b, block in enumerate(host):
        bounds = b * height + np.concatenate([[0], np.cumsum(block)])
        if (block < 0).any() or bounds[-1] > (b + 1) * height:
            raise LibraryError(f"{what}: segment sizes {host.tolist()} do not fit {rows} rows "
                               f"in {host.shape[0]} block(s)")
        out += list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    return out


def _zero_past(out, segments) -> None:
    """Zeroes the rows of `out` outside `segments` (in order): the padding
    past each block's segments; what they cover is written anyway."""
    covered = 0
    for a, b in segments:
        if a > covered:
            out[covered:a] = 0
        covered = max(covered, b)
    out[covered:] = 0


def grouped_matmul(xp, attrs, x, w, sizes, out):
    wide = _compute_dtype(xp, out.dtype)
    segments = _segments(xp, sizes, x.shape[0], "grouped_matmul")
    _zero_past(out, segments)
    for s, (a, b) in enumerate(segments):
        if a == b:
            continue
        wg = w[s % w.shape[0]]
        wg = wg.T if attrs.get("transpose_rhs") else wg
        if wide is None:
            xp.matmul(x[a:b], wg, out=out[a:b])
        else:
            out[a:b] = xp.matmul(x[a:b].astype(wide), wg.astype(wide)).astype(out.dtype)


def grouped_outer(xp, attrs, x, g, sizes, out):
    wide = _compute_dtype(xp, out.dtype)
    # Half precision sums in float32 and rounds once; float32 and float64 sum
    # in `out` itself, x^T read in place (a BLAS transpose flag, no copy).
    acc = out if wide is None else xp.zeros(out.shape, dtype=wide)
    acc.fill(0)
    for s, (a, b) in enumerate(_segments(xp, sizes, x.shape[0], "grouped_outer")):
        if a != b:                   # segments in order: a deterministic sum
            xs, gs = (x[a:b], g[a:b]) if wide is None else \
                (x[a:b].astype(wide), g[a:b].astype(wide))
            acc[s % out.shape[0]] += xp.matmul(xs.T, gs)
    if acc is not out:
        out[...] = acc.astype(out.dtype)


def axis_slice(xp, attrs, a, out):
    """This rank's block along `dim` of a value replicated over a mesh axis."""
    dim, (index, _) = attrs["dim"], attrs["block"]
    n = out.shape[dim]
    box = [slice(None)] * a.ndim
    box[dim] = slice(index * n, (index + 1) * n)
    out[...] = a[tuple(box)]


def dropout(xp, attrs, x, key, out):
    """Dropout of this rank's block `x`: each element kept by the word of
    its global index (random.dropout_keep; `blocks` says where the block
    lies) and scaled by 1/(1-p), in x's dtype."""
    p = attrs["p"]
    keep = random.dropout_keep(key, p, x.shape, attrs.get("blocks"), xp)
    out[...] = xp.where(keep, x * x.dtype.type(1.0 / (1.0 - p)), x.dtype.type(0))


#: The implementations, by declared name (routines.ROUTINES); an engine
#: claiming a routine runs these (on numpy or cupy) or its own by address.
ROUTINES = routines.implementations({
    "matmul": matmul, "reshape": reshape, "transpose": transpose, "slice": slice_, "pad": pad,
    "concat": concat, "gather": gather, "scatter_add": scatter_add, "axis_slice": axis_slice,
    "dynamic_slice": dynamic_slice, "dynamic_update_slice": dynamic_update_slice,
    "dropout": dropout,
    "topk": topk, "moe_dispatch": moe_dispatch, "moe_collect": moe_collect,
    "grouped_matmul": grouped_matmul, "grouped_outer": grouped_outer,
    "check_range": check_range})
