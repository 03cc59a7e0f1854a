"""Python op builders for Tessera's `tsched` dialect (generated from ODS)."""
from ._tsched_ops_gen import *  # noqa: F401,F403
