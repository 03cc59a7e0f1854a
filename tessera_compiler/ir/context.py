"""One place that creates MLIR contexts with Tessera's dialects loaded."""

from tessera_mlir import ir


def new_context() -> ir.Context:
    ctx = ir.Context()
    # The site initializer registers the dialects; loading them up front lets
    # Python builders create their ops before anything has been parsed.
    for name in ("tgraph", "tsched", "ttile", "func", "arith", "scf"):
        ctx.dialects[name]
    return ctx
