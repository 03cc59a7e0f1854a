"""Counter-based random numbers: Philox-4x32-10 (Salmon et al., "Parallel
random numbers: as easy as 1, 2, 3", SC'11; the generator of cuRAND, JAX's
`rbg` and PyTorch's CUDA dropout).

A counter-based generator is a pure function of (key, counter), so element
`e` of a tensor gets its random word from its **global** flat index alone:
the same number on one rank or on any mesh that splits the tensor, in any
order, with no generator state to carry between ranks or steps. Tessera
draws element `e` of a tensor under key (seed, step) as word `e % 4` of

    philox4x32_10(counter = (e // 4 low, e // 4 high, step low, step high),
                  key     = (seed low, seed high))

(the 64-bit halves of each as 32-bit words). Dropout keeps element `e` when
the word's top 24 bits are at least `round(p * 2**24)`: it drops with
probability p to 2**-24, and p = 0 keeps everything.

Written once over an array module `xp` (numpy or cupy), so the CPU and GPU
engines draw the same bits. It imports nothing but numpy.
"""

from __future__ import annotations

import numpy as np

#: Philox-4x32's round multipliers and Weyl key increments (Random123).
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LOW = np.uint64(0xFFFFFFFF)
_ROUNDS = 10
#: dropout compares a word's top 24 bits (a float32's mantissa of uniforms)
DROPOUT_BITS = 24


def philox4x32(counter: list, key: list, xp=np) -> list:
    """The four output words of Philox-4x32-10 for each counter: `counter`
    four uint32 arrays (broadcast together), `key` two uint32 scalars or
    arrays. Returns four uint32 arrays."""
    c0, c1, c2, c3 = (xp.asarray(c, dtype=xp.uint32) for c in counter)
    k0, k1 = (xp.asarray(k, dtype=xp.uint32) for k in key)
    with np.errstate(over="ignore"):
        for r in range(_ROUNDS):
            if r:
                k0, k1 = k0 + _W0, k1 + _W1            # uint32: wraps
            p0 = c0.astype(xp.uint64) * _M0
            p1 = c2.astype(xp.uint64) * _M1
            hi0, lo0 = (p0 >> np.uint64(32)).astype(xp.uint32), (p0 & _LOW).astype(xp.uint32)
            hi1, lo1 = (p1 >> np.uint64(32)).astype(xp.uint32), (p1 & _LOW).astype(xp.uint32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return [c0, c1, c2, c3]


def _words(x64, xp):
    """(low, high) uint32 halves of uint64 array or scalar `x64`."""
    x64 = xp.asarray(x64).astype(xp.uint64)
    return (x64 & _LOW).astype(xp.uint32), (x64 >> np.uint64(32)).astype(xp.uint32)


def global_index(shape, blocks=None, xp=np):
    """The flat row-major index in the global tensor of each element of a
    local block of `shape`: `blocks` gives (index, count) per dimension
    (this rank's block along it; None: the whole tensor). uint64."""
    blocks = blocks or [(0, 1)] * len(shape)
    index = xp.zeros((), dtype=xp.uint64)
    stride = 1
    for d in reversed(range(len(shape))):
        n = shape[d]
        i, count = blocks[d]
        coord = xp.arange(n, dtype=xp.uint64) + np.uint64(i * n)
        index = index + (coord * np.uint64(stride)).reshape((n,) + (1,) * (len(shape) - 1 - d))
        stride *= n * count
    return xp.broadcast_to(index, tuple(shape))


def random_words(key, index, xp=np):
    """The uint32 word of each element at global flat indices `index`
    (uint64 array) under `key` = (seed, step) (two integers or a 2-element
    integer array, read as uint64). Computes each Philox block once when
    the indices come in aligned runs of four (the last dimension's local
    extent and offset multiples of 4), else once per element."""
    key = xp.asarray(key).astype(xp.uint64).reshape(2)
    seed, step = _words(key[0], xp), _words(key[1], xp)
    shape = index.shape
    aligned = len(shape) and shape[-1] % 4 == 0 and shape[-1] and \
        bool((index[..., :1] % np.uint64(4) == 0).all())
    if aligned:
        blocks = index[..., ::4] >> np.uint64(2)
        out = philox4x32([*_words(blocks, xp), *step], list(seed), xp)
        return xp.stack(out, axis=-1).reshape(shape)
    lane = (index & np.uint64(3)).astype(xp.int64)
    out = philox4x32([*_words(index >> np.uint64(2), xp), *step], list(seed), xp)
    return xp.where(lane == 0, out[0], xp.where(lane == 1, out[1],
                                                 xp.where(lane == 2, out[2], out[3])))


def dropout_threshold(p: float) -> int:
    """Elements whose word's top DROPOUT_BITS bits fall below this are dropped."""
    return int(round(p * (1 << DROPOUT_BITS)))


def dropout_keep(key, p: float, shape, blocks=None, xp=np):
    """Which elements of a (block of a) tensor dropout with rate `p` keeps
    under `key` = (seed, step): a boolean array of `shape`."""
    words = random_words(key, global_index(shape, blocks, xp), xp)
    return (words >> np.uint32(32 - DROPOUT_BITS)) >= np.uint32(dropout_threshold(p))
