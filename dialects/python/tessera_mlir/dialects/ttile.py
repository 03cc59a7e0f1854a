"""Python op builders for Tessera's `ttile` dialect (generated from ODS), and
typed access to its type and attributes: `TileType` (`!ttile.tile<...>`),
and the GPU schedule's `PlaceAttr`, `MmaAttr`, `PipelineAttr`."""
from ._ttile_ops_gen import *  # noqa: F401,F403
from .._mlir_libs._tesseraDialects import MmaAttr, PipelineAttr, PlaceAttr, TileType  # noqa: F401
