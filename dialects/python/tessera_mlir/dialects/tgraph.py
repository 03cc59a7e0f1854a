"""Python op builders for Tessera's `tgraph` dialect (generated from ODS), and
typed access to its attributes: `ShardingAttr` and the enum attributes
`ReductionKindAttr`, `TransportAttr`, `CompareKindAttr`."""
from ._tgraph_ops_gen import *  # noqa: F401,F403
from .._mlir_libs._tesseraDialects import (CompareKindAttr, ReductionKindAttr,  # noqa: F401
                                           ShardingAttr, TransportAttr)
