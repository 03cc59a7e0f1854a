"""Library routines: launches the compiler hands to a well-kept library
instead of generating a kernel (matmul to BLAS, data movement to the array
library). Written against the numpy array API, so the same code runs on
numpy (CPU engine) and, later, cupy (GPU engine).

Each routine takes the launch's buffers (inputs, then the one output) and
the op's attributes, and writes the output in place.
"""

from __future__ import annotations

import numpy as np


class LibraryError(RuntimeError):
    """A library routine got arguments it cannot handle (e.g. an index out of range)."""


def _compute_dtype(xp, dtype):
    # Half precision (bf16, f16) is multiplied in fp32: BLAS has no bf16, and
    # fp32 accumulation is what mixed precision means.
    return xp.float32 if np.dtype(dtype).itemsize < 4 and np.dtype(dtype).kind in "fV" else None


def matmul(xp, attrs, a, b, out):
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


def _check_indices(xp, ids, rows, what):
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        bad = ids[(ids < 0) | (ids >= rows)]
        raise LibraryError(f"{what}: index {int(bad[0])} is out of range for a table of "
                           f"{rows} rows")


def _row_block(attrs, rows):
    """(first row, row count of the whole table) of this rank's block of a
    table split by rows over mesh axes (`block` = (index, count), filled in
    by the executor), or (0, rows) for a whole table."""
    index, count = attrs.get("block", (0, 1))
    return index * rows, rows * count


def gather(xp, attrs, table, ids, out):
    rows = table.shape[0]
    first, total = _row_block(attrs, rows)
    _check_indices(xp, ids, total, "gather (embedding lookup)")
    if total == rows:
        xp.take(table, ids, axis=0, out=out)
        return
    # Vocab-parallel: look up the rows this rank holds, zeros elsewhere.
    local = ids - first
    mine = (local >= 0) & (local < rows)
    xp.take(table, xp.where(mine, local, 0), axis=0, out=out)
    out *= mine[..., None].astype(out.dtype)


def scatter_add(xp, attrs, updates, ids, out):
    rows = out.shape[0]
    first, total = _row_block(attrs, rows)
    _check_indices(xp, ids, total, "scatter_add (embedding gradient)")
    out.fill(0)
    if total == rows:
        xp.add.at(out, ids, updates)
        return
    local = ids - first
    mine = (local >= 0) & (local < rows)
    xp.add.at(out, local[mine], updates[mine])


def axis_slice(xp, attrs, a, out):
    """This rank's block along `dim` of a value replicated over a mesh axis."""
    dim, (index, _) = attrs["dim"], attrs["block"]
    n = out.shape[dim]
    box = [slice(None)] * a.ndim
    box[dim] = slice(index * n, (index + 1) * n)
    out[...] = a[tuple(box)]


ROUTINES = {"matmul": matmul, "reshape": reshape, "transpose": transpose, "slice": slice_,
            "pad": pad, "concat": concat, "gather": gather, "scatter_add": scatter_add,
            "axis_slice": axis_slice}
