"""Element types (`ts.f32`, `ts.bf16`, ...): numpy dtypes, with bfloat16 from
`ml_dtypes` (a real 16-bit brain float: 8 exponent bits, 7 mantissa bits)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from tessera_compiler.ir.types import ELEMENT_TYPES

from ._source import user_frame
from .errors import ArgumentError

f32 = float32 = np.dtype(np.float32)
f64 = float64 = np.dtype(np.float64)
f16 = float16 = np.dtype(np.float16)
bf16 = bfloat16 = np.dtype(ml_dtypes.bfloat16)
#: 8-bit float (OCP e4m3 "fn": 4 exponent bits, 3 mantissa bits, no
#: infinities, 448 the largest finite): a storage type, what op.moe's
#: `pack_dtype="fp8_e4m3"` sends; casts to and from it compute in float32.
fp8_e4m3 = float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

FLOATS = (f64, f32, bf16, f16)          # widest first
_NAMES = {"f32": f32, "float32": f32, "fp32": f32, "f64": f64, "float64": f64,
          "f16": f16, "float16": f16, "fp16": f16, "bf16": bf16, "bfloat16": bf16,
          "int32": int32, "i32": int32, "int64": int64, "i64": int64, "bool": bool_,
          "int8": np.dtype(np.int8), "i8": np.dtype(np.int8),
          "fp8_e4m3": fp8_e4m3, "float8_e4m3fn": fp8_e4m3}


def as_dtype(d, what: str = "dtype") -> np.dtype:
    """A numpy dtype from a dtype, a numpy type or a name like "bf16"; anything
    else is an ArgumentError naming `what` (the API and its argument, e.g.
    "op.cast: dtype") and the user's line."""
    if isinstance(d, str):
        if d not in _NAMES:
            raise _not_a_dtype(what, d, f"unknown dtype {d!r} (known: {', '.join(sorted(_NAMES))})")
        return _NAMES[d]
    if d is None:
        raise _not_a_dtype(what, d, "None is not a dtype (ts.f32, ts.bf16, ts.int32, \"f32\", ...)")
    try:
        return np.dtype(d)
    except TypeError:
        raise _not_a_dtype(what, d, f"{d!r} ({type(d).__name__}) is not a dtype (ts.f32, "
                                    "ts.bf16, ts.int32, \"f32\", ...)") from None


#: the dtypes a tensor may have, for messages (the element types of Graph IR)
SUPPORTED_DTYPES = ", ".join(dict.fromkeys(str(as_dtype(n)) for n in ELEMENT_TYPES.values()))


def _not_a_dtype(what: str, d, text: str) -> Exception:
    return ArgumentError(f"{what}: {text}  [{user_frame()}]")


def is_float(d) -> bool:
    return np.dtype(d) in FLOATS


def promote(a, b) -> np.dtype:
    """The dtype two operands compute in: the wider float, or float over int."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    if is_float(a) and is_float(b):
        # bf16 and f16 together: neither holds the other, use f32.
        if {a, b} == {bf16, f16}:
            return f32
        return a if FLOATS.index(a) < FLOATS.index(b) else b
    if is_float(a) != is_float(b):
        return a if is_float(a) else b
    return np.promote_types(a, b)


def tensor(value, dtype=None) -> np.ndarray:
    """`ts.tensor(65536.0)`: a constant tensor (a numpy array; f32 for Python
    floats, as the design docs' loss-scale cap expects). Inside a compiled
    function it is captured as an input like any array."""
    if dtype is None and isinstance(value, float):
        dtype = f32
    out = np.asarray(value, dtype=as_dtype(dtype, "ts.tensor: dtype") if dtype is not None else None)
    if out.dtype.kind not in "biufV":
        raise ArgumentError(f"ts.tensor: value is a {type(value).__name__} ({value!r:.60}), which "
                            f"makes a {out.dtype} array, not numbers  [{user_frame()}]")
    return out
