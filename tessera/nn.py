"""Neural-network layers (`ts.nn`) over `tessera.op`, and parameter
initialisation for them (numpy, outside compiled functions)."""

from __future__ import annotations

import numpy as np

from . import simulation
from ._checks import is_int
from ._source import user_frame
from .dtypes import as_dtype, is_float
from .errors import ArgumentError
from .op import (attention, cross_entropy, dropout, embedding, gelu, layernorm, linear,
                 log_softmax, relu, rmsnorm, silu, softmax, transformer_block)

flash_attention = attention

__all__ = ["flash_attention", "attention", "cross_entropy", "dropout", "embedding", "gelu",
           "layernorm", "linear", "log_softmax", "relu", "rmsnorm", "silu", "softmax",
           "transformer_block", "init_transformer"]


def init_transformer(depth: int, width: int, mlp_ratio: int = 4, seed: int = 0,
                     dtype=np.float32, experts: int = 0) -> list[dict]:
    """Parameters of `depth` pre-norm decoder blocks for `op.transformer_block`
    (GPT-2 style init: normal(0, 0.02), output projections scaled by 1/sqrt(2 depth)).
    With `experts=E`, each block's MLP is a mixture of E experts (`op.moe`):
    its parameters are `moe = {router [D, E], w1 [E, D, F], w2 [E, F, D]}`."""
    for name, value, least in (("depth", depth, 1), ("width", width, 1),
                               ("mlp_ratio", mlp_ratio, 1), ("experts", experts, 0)):
        if not is_int(value) or value < least:
            raise ArgumentError(f"nn.init_transformer: {name}={value!r} must be an int >= "
                                f"{least}  [{user_frame()}]")
    dtype = as_dtype(dtype, "nn.init_transformer: dtype")
    if not is_float(dtype):
        raise ArgumentError(f"nn.init_transformer: dtype {dtype} is not a floating-point type "
                            f"(parameters are floats: ts.f32, ts.bf16, ...)  [{user_frame()}]")
    rng = np.random.default_rng(seed)
    hidden = mlp_ratio * width
    std, out_std = 0.02, 0.02 / np.sqrt(2 * depth)

    def normal(shape, s):
        if simulation.active() is not None:     # `tessera simulate`: shapes only
            return simulation.placeholder(shape, dtype)
        return (rng.standard_normal(shape) * s).astype(dtype)

    layers = []
    for _ in range(depth):
        layer = {
            "ln1_w": np.ones(width, dtype), "ln1_b": np.zeros(width, dtype),
            "wqkv": normal((width, 3 * width), std), "wo": normal((width, width), out_std),
            "ln2_w": np.ones(width, dtype), "ln2_b": np.zeros(width, dtype),
        }
        if experts:
            layer["moe"] = {"router": normal((width, experts), std),
                            "w1": normal((experts, width, hidden), std),
                            "w2": normal((experts, hidden, width), out_std)}
        else:
            layer.update({"w1": normal((width, hidden), std), "b1": np.zeros(hidden, dtype),
                          "w2": normal((hidden, width), out_std), "b2": np.zeros(width, dtype)})
        layers.append(layer)
    return layers
