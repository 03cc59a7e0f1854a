"""Tessera: a Python-first, MLIR-based compiler for distributed deep learning.

    import tessera as ts
    from tessera import dist, op

    mesh = dist.Mesh(axes=["tp"], devices=range(2))

    @ts.compile(mesh=mesh)
    def mlp(x, w1, w2):
        return op.matmul(op.relu(op.matmul(x, w1)), w2)

    @ts.jit
    def step(params, batch):
        loss = ts.nn.cross_entropy(model(params, batch["x"]), batch["y"])
        return loss, ts.grad(loss, params)
"""

from . import checkpoint, dist, errors, graph, mesh, models, nn, op, optim, pipeline, schedule
from . import dist as distributed          # `ts.distributed.all_gather`, as the docs write it
from ._trace import autocast
from .autodiff import grad, value_and_grad
from .compiler import CompiledFunction, compile, function, jit
from .remat import remat
from .strategy import distribute
from .dtypes import (bf16, bfloat16, bool_, f16, f32, f64, float16, float32, float64, int32,
                     int64, tensor)
from .errors import (ArgumentError, CompileError, LaunchError, ShapeError, ShardingError,
                     TesseraError, TracingError, ValueCheckError)
from .op import (concat, exp, isfinite, log, matmul, maximum, minimum, relu, reshape, softmax,
                 split, sqrt, tanh, transpose, where)
from .types import Tensor
from tessera_compiler.ir.options import GemmConfig, TargetOptions

__version__ = "0.2.0"

__all__ = ["distributed", "compile", "jit", "function", "CompiledFunction", "distribute", "mesh", "grad",
           "remat",
           "value_and_grad",
           "autocast", "Tensor", "checkpoint", "dist", "graph", "models", "nn", "op", "optim", "pipeline", "schedule", "f32", "f64", "f16",
           "bf16", "int32", "int64", "bool_", "TesseraError", "ValueCheckError", "ShardingError", "ShapeError", "TracingError",
           "ArgumentError", "LaunchError", "CompileError", "matmul", "split", "concat", "reshape", "transpose",
           "softmax", "relu", "exp", "log", "sqrt", "tanh", "where", "isfinite", "minimum",
           "maximum", "TargetOptions", "GemmConfig", "tensor"]
