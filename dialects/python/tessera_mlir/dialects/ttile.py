"""Python op builders for Tessera's `ttile` dialect (generated from ODS), and
`TileType` (typed access to `!ttile.tile<...>`)."""
from ._ttile_ops_gen import *  # noqa: F401,F403
from .._mlir_libs._tesseraDialects import TileType  # noqa: F401
