"""What the CUDA emitter and the register-loop emitter share: the wgmma
preprocessor branch, wgmma descriptors, reduction identities and the
register layout of a tensor-core accumulator."""

from __future__ import annotations

from dataclasses import dataclass


# The preprocessor branch of a kernel's wgmma code (sm_90a, and the
# emulator unless told to run the plain-sm_90 branch); its #else is mma.sync.
WGMMA_BRANCH = ("#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || "
                "(defined(TESSERA_EMULATED_PTX) && !defined(TESSERA_EMULATE_NO_WGMMA))")


def swizzled_desc(tile: str, rows: int, k: str, k_major: bool) -> str:
    """The wgmma descriptor of the k step starting at element `k` (a multiple
    of 16) of a `rows`-row tile stored 128-byte swizzled (`cp_async_tile`
    with no pitch: 64-column panels of `rows` 128-byte rows). K-major: the
    tile's rows are M or N and its columns K, so a step is 16 columns within
    a panel (SBO: 8 rows, 1024 bytes). N-major: its rows are K, so a step is
    16 rows (LBO: the panel stride, SBO: 8 rows)."""
    if k_major:
        return f"tessera_wgmma_desc({tile} + ({k} >> 6) * {rows * 64} + ({k} & 63), 16, 1024)"
    return f"tessera_wgmma_desc({tile} + {k} * 64, {rows * 128}, 1024)"


# max / min propagate NaN, as numpy's do (b != b: b is NaN).
REDUCE = {"sum": ("0", "a + b"), "prod": ("1", "a * b"),
          "max": ("-INFINITY", "(b > a || b != b ? b : a)"),
          "min": ("INFINITY", "(b < a || b != b ? b : a)")}


@dataclass
class Fragment:
    """A tile held in registers as the accumulator of a tensor-core main loop:
    thread (warp, lane) holds `name[mi][ni][q]` for element
    row = wm0 + 16*mi + lane/4 + 8*(q/2), col = wn0 + 8*ni + 2*(lane%4) + q%2."""
    name: str
    shape: list[int]        # [BM, BN]
    mt: int                 # 16-row mma tiles per warp
    nt: int                 # 8-column mma tiles per warp
    wm0: str                # C names of this warp's first row / column
    wn0: str
    lane: str
