"""Python op builders for Tessera's `ttile` dialect (generated from ODS)."""
from ._ttile_ops_gen import *  # noqa: F401,F403
