"""Python op builders for Tessera's `tsched` dialect (generated from ODS), and
`CollectiveKindAttr` (typed access to `#tsched.collective<...>`)."""
from ._tsched_ops_gen import *  # noqa: F401,F403
from .._mlir_libs._tesseraDialects import CollectiveKindAttr  # noqa: F401
