"""Python op builders for Tessera's `tgraph` dialect (generated from ODS)."""
from ._tgraph_ops_gen import *  # noqa: F401,F403
