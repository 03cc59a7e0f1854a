"""bfloat16 as 16-bit patterns (uint16), for array libraries and transports
without the type: cupy stores bf16 buffers as uint16, and MPI and NCCL move
them as bits. Every function takes the array module `xp` (numpy or cupy).

Arithmetic on bf16 rounds each result to bf16 from float32, as ml_dtypes
does on the host (`bits_ufunc`), so a reduction over bits on the GPU and one
over ml_dtypes arrays on the CPU give the same bits.
"""

from __future__ import annotations

import numpy as np


def bits_dtype(dtype) -> np.dtype:
    """What a buffer of `dtype` holds where the library or transport lacks
    the type: the unsigned integer of its width for ml_dtypes' storage-only
    floats (bf16: uint16, FP8 e4m3: uint8), else `dtype` itself."""
    dtype = np.dtype(dtype)
    return np.dtype(f"u{dtype.itemsize}") if dtype.kind == "V" else dtype


def is_bf16(dtype) -> bool:
    """Whether `dtype` is bfloat16 (ml_dtypes' on the host)."""
    dtype = np.dtype(dtype)
    # (.name builds a string: asked last, once per collective)
    return dtype.itemsize == 2 and dtype.kind == "V" and dtype.name == "bfloat16"


def to_f32(xp, bits):
    """float32 values of bf16 bit patterns (exact)."""
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def from_f32(xp, x):
    """bf16 bit patterns of float32 `x`, rounded to nearest even (as the
    kernels' float_to_bf16 and ml_dtypes; NaN stays NaN)."""
    bits = x.view(xp.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return xp.where(xp.isnan(x), (bits >> 16) | 0x40, rounded).astype(xp.uint16)


def bits_ufunc(xp, ufunc):
    """`ufunc` (add, maximum, ...) on arrays of bf16 bits, with bf16's
    rounding: computed in float32 and rounded once to bf16."""
    def combine(a, b):
        return from_f32(xp, ufunc(to_f32(xp, a), to_f32(xp, b)))
    return combine
