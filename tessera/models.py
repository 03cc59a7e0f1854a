"""Models built from the ops: the transformer block, the mixture of experts
(`_moe.py`) and Hugging Face checkpoints (`pretrained.py`), as `ts.models`
(also `op.transformer_block` and `op.moe`, the names the design docs use).
They compose `op` primitives, remat regions and per-rank code (an
expert-parallel MoE exchanges rows with `dist.spmd`), so they sit above
all of them; like the ops, each runs eagerly outside a compiled function
(`_primitives.eager`)."""

from __future__ import annotations

from ._checks import is_int
from ._moe import MULTI_QP_CHANNELS, moe  # noqa: F401  (ts.models.*)
from ._primitives import (add, attention, eager, gelu, layernorm, matmul, operand, reshape,
                          require_float, rmsnorm, where_called)
from .errors import ArgumentError, ShapeError
from .pretrained import from_pretrained
from .remat import policy_name, region

__all__ = ["transformer_block", "moe", "MULTI_QP_CHANNELS", "from_pretrained"]


@eager
def transformer_block(x, depth: int = 1, params=None, heads: int = 1, causal: bool = True,
                      norm: str = "layernorm", remat=None, moe_k: int = 2,
                      capacity_factor=None, return_aux: bool = False):
    """`depth` pre-norm decoder blocks: x + attn(norm(x)), then x + mlp(norm(x)).

    `remat` recomputes each block's forward in the backward instead of
    keeping its activations (see `ts.remat`): True or "full"
    (nothing_saveable), "selective" (attention's core only), "dots_saveable",
    or "auto" (the compile's `memory_budget` chooses). The default, None,
    keeps everything unless the function is compiled with a `memory_budget`,
    which then chooses for every block.

    `params` is a list of `depth` dicts (see `ts.nn.init_transformer`) with
    `ln1_w, ln1_b, wqkv [D, 3D], wo [D, D], ln2_w, ln2_b, w1 [D, F], b1, w2 [F, D], b2`.
    `x` is `[B, S, D]`. A block whose dict holds `moe` (router, w1, w2 of
    `op.moe`) instead of the MLP's weights has a mixture-of-experts MLP with
    `moe_k` experts per token and `capacity_factor`; `return_aux=True` then
    returns `(x, [each such block's op.moe aux])`.

    The columns of `wqkv` are grouped by head: `[D, heads, 3, D // heads]`
    holds each head's q, k and v projections side by side. Splitting its
    columns over a tensor-parallel axis then gives every rank whole heads
    (head-parallel attention, no communication until `wo`)."""
    src = where_called("transformer_block")
    if norm not in ("layernorm", "rmsnorm"):
        raise ArgumentError(f"op.transformer_block: norm={norm!r} must be 'layernorm' or "
                            f"'rmsnorm'  [{src}]")
    if not is_int(heads) or heads < 1:
        raise ArgumentError(f"op.transformer_block: heads={heads!r} must be a number of "
                            f"attention heads (an int >= 1)  [{src}]")
    if params is None or len(params) != depth:
        raise ShapeError(f"op.transformer_block: needs params= with one dict per layer "
                         f"(depth={depth}); create them with ts.nn.init_transformer  [{src}]")
    x = operand("transformer_block", x, src)
    require_float("transformer_block", src, x)
    if x.ndim != 3:
        raise ShapeError(f"op.transformer_block: x must be [B, S, D], got {list(x.shape)}  [{src}]")
    B, S, D = x.shape
    if D % heads:
        raise ShapeError(f"op.transformer_block: width {D} is not divisible by heads={heads}  [{src}]")
    policy = policy_name("auto" if remat is None else remat, "op.transformer_block")
    normalize = layernorm if norm == "layernorm" else (lambda h, w, b: rmsnorm(h, w))
    auxes = []
    for p in params:
        with region(policy):
            h = normalize(x, p["ln1_w"], p["ln1_b"])
            qkv = reshape(matmul(h, p["wqkv"]), B, S, heads, 3, D // heads)
            # Each head's q, k, v as [B, S, heads, Dh]: attention runs along
            # dim 1 where they lie, and its output is already [B, S, D].
            q, k, v = (qkv[:, :, :, i] for i in range(3))
            a = reshape(attention(q, k, v, causal=causal, seq_dim=1), B, S, D)
            x = add(x, matmul(a, p["wo"]))
            h = normalize(x, p["ln2_w"], p["ln2_b"])
            if "moe" in p:
                y, aux = moe(h, experts=p["moe"], k=moe_k, capacity_factor=capacity_factor,
                             return_aux=True)
                x = add(x, y)
                auxes.append(aux)
            else:
                x = add(x, add(matmul(gelu(add(matmul(h, p["w1"]), p["b1"])), p["w2"]),
                               p["b2"]))
    return (x, auxes) if return_aux else x
