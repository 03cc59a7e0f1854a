"""Tile IR -> kernel source. `emit_cpp` (CPU engine) and `emit_cuda` (GPU) walk the
same `ttile.kernel`s; they differ only in how a tile is stored and how a
loop over a tile's elements is spread over threads."""

from .tile_emitter import emit_cpp, emit_cuda  # noqa: F401
