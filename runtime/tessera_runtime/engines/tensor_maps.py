"""Tensor maps for kernels that load tiles with the tensor memory accelerator.

A kernel whose launch record lists `"tensor_maps"` (each `{"arg": i,
"box": [..., rows, 64]}`: which argument, and the box of elements one copy
moves, outermost dimension first) takes one extra last parameter: a device
buffer of 128-byte tensor maps in that order, built here on the host from
the launch's arguments. The copies land 128-byte swizzled (the layout wgmma
reads); out-of-bounds elements read as zero.

The cuda engine encodes real `CUtensorMap`s with the driver's
`cuTensorMapEncodeTiled` (through ctypes: no extra package); the emulator
gets its own plain record of the same geometry (`emulated_tensor_map`).
Maps are cached per argument addresses and shapes: a memory pool hands the
same addresses back, and a map depends on nothing else.
"""

from __future__ import annotations

import ctypes
import struct

from . import EngineError

TENSOR_MAP_BYTES = 128
_MAX_CACHED = 1024

# cuda.h's enums (CUDA 12 and 13).
_CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1        # 2-byte elements, copied bit for bit
_CU_TENSOR_MAP_INTERLEAVE_NONE = 0
_CU_TENSOR_MAP_SWIZZLE_128B = 3
_CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3
_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0


def geometry(shape, itemsize: int, box):
    """(sizes, byte strides, box) innermost dimension first, as tensor maps
    take them, for a C-contiguous array of `shape`."""
    if len(box) != len(shape):
        raise EngineError(f"a tensor map box {list(box)} for an array of shape {list(shape)}")
    sizes = [int(d) for d in reversed(shape)]
    strides, stride = [], itemsize
    for d in sizes:
        strides.append(stride)
        stride *= d
    return sizes, strides, [int(b) for b in reversed(box)]


def emulated_tensor_map(address: int, shape, itemsize: int, box) -> bytes:
    """The emulator's record (cuda_emulator's EmulatedTensorMap): base,
    rank, element bytes, then sizes, byte strides and box, 5 entries each."""
    sizes, strides, box = geometry(shape, itemsize, box)
    pad = [0] * (5 - len(sizes))
    record = struct.pack("<QII5Q5Q5I", address, len(sizes), itemsize, *(sizes + pad),
                         *(strides + pad), *(box + pad))
    return record.ljust(TENSOR_MAP_BYTES, b"\0")


_libcuda = None


def cuda_tensor_map(address: int, shape, itemsize: int, box) -> bytes:
    """A CUtensorMap from the CUDA driver: 2-byte elements, 128-byte swizzle."""
    global _libcuda
    if itemsize != 2:
        raise EngineError(f"TMA loads 2-byte elements; got {itemsize}-byte ones")
    if _libcuda is None:
        try:
            _libcuda = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise EngineError(f"TMA needs the CUDA driver library (libcuda.so.1): {e}") from None
        _libcuda.cuTensorMapEncodeTiled.restype = ctypes.c_int
    sizes, strides, box = geometry(shape, itemsize, box)
    rank = len(sizes)
    # cuda.h declares CUtensorMap alignas(128): carve an aligned one out of
    # a larger buffer.
    raw = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 128)
    at = (ctypes.addressof(raw) + 127) // 128 * 128
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    status = _libcuda.cuTensorMapEncodeTiled(
        ctypes.c_void_p(at), ctypes.c_int(_CU_TENSOR_MAP_DATA_TYPE_UINT16), u32(rank),
        ctypes.c_void_p(address), (u64 * rank)(*sizes), (u64 * max(rank - 1, 1))(*strides[1:]),
        (u32 * rank)(*box), (u32 * rank)(*([1] * rank)),
        ctypes.c_int(_CU_TENSOR_MAP_INTERLEAVE_NONE), ctypes.c_int(_CU_TENSOR_MAP_SWIZZLE_128B),
        ctypes.c_int(_CU_TENSOR_MAP_L2_PROMOTION_L2_256B),
        ctypes.c_int(_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    if status != 0:
        raise EngineError(f"cuTensorMapEncodeTiled failed (CUresult {status}) for an array of "
                          f"shape {list(shape)} at {address:#x} with box {list(reversed(box))}")
    return ctypes.string_at(at, TENSOR_MAP_BYTES)


class TensorMaps:
    """The tensor-map buffer of one kernel's launches. `encode(address,
    shape, itemsize, box)` makes one map; `address(array)` is an argument's
    device address; `upload(blob)` puts the maps where the kernel reads them
    and returns what to pass as the kernel's last argument."""

    def __init__(self, specs, encode, address, upload):
        self.specs = [(int(s["arg"]), tuple(s["box"])) for s in specs]
        self.encode, self.address, self.upload = encode, address, upload
        self._cache: dict = {}

    def for_args(self, args):
        key = tuple((self.address(args[i]), args[i].shape) for i, _ in self.specs)
        buffer = self._cache.get(key)
        if buffer is None:
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
            blob = b"".join(self.encode(self.address(args[i]), args[i].shape,
                                        args[i].dtype.itemsize, box) for i, box in self.specs)
            buffer = self._cache[key] = self.upload(blob)
        return buffer
