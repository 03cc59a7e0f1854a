"""Tessera: a Python-first, MLIR-based compiler for distributed deep learning.

    import tessera as ts
    from tessera import dist, op

    mesh = dist.Mesh(axes=["tp"], devices=range(2))

    @ts.compile(mesh=mesh)
    def mlp(x, w1, w2):
        return op.matmul(op.relu(op.matmul(x, w1)), w2)
"""

from . import dist, graph, op
from .compiler import CompiledFunction, compile
from .errors import CompileError, LaunchError, ShapeError, ShardingError, TesseraError

__version__ = "0.1.0"

__all__ = ["compile", "CompiledFunction", "dist", "graph", "op", "TesseraError",
           "ShardingError", "ShapeError", "LaunchError", "CompileError"]
