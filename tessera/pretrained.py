"""Hugging Face checkpoints as Tessera models: `ts.models.from_pretrained`.

    from tessera import models
    m = models.from_pretrained("path/to/hf_dir")     # config.json + *.safetensors
    logits = m(input_ids, attention_mask=mask)        # numpy [B, S, V]
    logits = m.forward(m.params, ids, mask)           # traceable: inside ts.jit / ts.grad

The Llama family (Llama 2/3 without rope scaling, Mistral without a sliding
window, Qwen2's bias on q/k/v) is written here as Hugging Face's modeling
code computes it: RMSNorm, rotary embeddings (rotate-half), grouped-query
attention, SwiGLU. `m.params` is a dict under Hugging Face's parameter names
(`model.layers.0.self_attn.q_proj.weight`), weights in their [out, in]
layout (`op.linear(..., weight_layout="out_in")`).

Every field of config.json is either used, one that cannot change the
forward pass (token ids, the dtype it was saved in, ...), or an error that
names it: a checkpoint is never run as a different model than it is.

What is not here yet (issue 62): GPT-2 and Mixtral, KV-cache generation,
`save_pretrained`, reading only a rank's shard under a mesh; attention is
written out (it holds [S, S] scores: the flash kernels take no mask yet),
and grouped-query heads are broadcast to every query head.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import dtypes
from ._primitives import (add, arange, argmax, broadcast_to, cast, concat, cos, embedding,
                          index, linear, matmul, mul, neg, reshape, rmsnorm, silu, sin, softmax,
                          take_along_axis, transpose, where)
from .compiler import jit
from ._source import user_frame
from .errors import ArgumentError

__all__ = ["from_pretrained", "Pretrained", "LlamaConfig"]

#: model_type -> whether q, k and v projections carry a bias
FAMILIES = {"llama": False, "mistral": False, "qwen2": True}

#: config.json fields that cannot change the forward pass
IGNORED = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range",
    "max_position_embeddings", "max_window_layers", "attention_dropout", "_name_or_path",
    "return_dict", "output_hidden_states", "output_attentions", "tie_word_embeddings",
    "use_sliding_window", "sliding_window", "layer_types", "rope_scaling", "pretraining_tp",
    "attention_bias", "mlp_bias", "hidden_act", "head_dim", "rope_parameters",
})


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of a Llama-family config.json the forward pass reads."""
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool

    @classmethod
    def from_json(cls, raw: dict, where: str) -> "LlamaConfig":
        def bad(field: str, why: str) -> ArgumentError:
            return ArgumentError(f"models.from_pretrained: {where}: {field}={raw.get(field)!r} "
                                 f"{why}  [{user_frame()}]")
        kind = raw.get("model_type")
        if kind not in FAMILIES:
            raise bad("model_type", f"is not supported (supported: {', '.join(FAMILIES)})")
        used = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta"}
        unknown = sorted(set(raw) - used - IGNORED)
        if unknown:
            raise bad(unknown[0], "is a config field Tessera does not know; it could change the "
                                  "model, so it is not ignored")
        if raw.get("hidden_act", "silu") != "silu":
            raise bad("hidden_act", "is not supported (silu)")
        if raw.get("rope_scaling") is not None:
            raise bad("rope_scaling", "is not supported yet (plain RoPE only)")
        # transformers 5 writes RoPE's settings as one dict
        rope = raw.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default" or set(rope) - {"rope_type",
                                                                          "rope_theta"}:
            raise bad("rope_parameters", "is not supported yet (rope_type 'default' only)")
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        if raw.get("pretraining_tp", 1) != 1:
            raise bad("pretraining_tp", "is not supported (1)")
        if raw.get("mlp_bias", False):
            raise bad("mlp_bias", "is not supported (no MLP bias)")
        if raw.get("attention_bias", FAMILIES[kind]) != FAMILIES[kind]:
            raise bad("attention_bias", f"is not supported for {kind} "
                                        f"({FAMILIES[kind]})")
        window = raw.get("sliding_window") if kind == "mistral" or raw.get(
            "use_sliding_window") else None
        if window is not None:
            raise bad("sliding_window", "is not supported yet (full attention only)")
        if any(t != "full_attention" for t in raw.get("layer_types") or ()):
            raise bad("layer_types", "is not supported yet (full_attention layers only)")
        heads = int(raw["num_attention_heads"])
        try:
            config = cls(kind, int(raw["vocab_size"]), int(raw["hidden_size"]),
                         int(raw["intermediate_size"]), int(raw["num_hidden_layers"]), heads,
                         int(raw.get("num_key_value_heads") or heads),
                         int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
                         float(raw.get("rms_norm_eps", 1e-6)),
                         float(theta),
                         bool(raw.get("tie_word_embeddings", False)), FAMILIES[kind])
        except KeyError as e:
            raise ArgumentError(f"models.from_pretrained: {where}: config.json has no "
                                f"{e.args[0]}  [{user_frame()}]") from None
        if heads % config.num_key_value_heads:
            raise bad("num_key_value_heads", f"must divide num_attention_heads={heads}")
        return config


class Pretrained:
    """A checkpoint's model: `params` (Hugging Face's names), `config`, and
    its forward pass, eager (`m(ids, attention_mask=)`) or traced
    (`m.forward(params, ids, attention_mask)`)."""

    def __init__(self, config: LlamaConfig, params: dict, path: Path, eos=(), pad=None):
        self.config, self.params, self.path = config, params, path
        #: generation's stop tokens and the token a finished row repeats
        self.eos_token_ids, self.pad_token_id = tuple(eos), pad
        self._compiled = self._next_token = None

    def forward(self, params: dict, input_ids, attention_mask=None, position_ids=None):
        """Logits [B, S, V] (float32) of `input_ids` [B, S]; `attention_mask`
        [B, S] (1: a token, 0: padding) masks padded keys. `position_ids`
        [B, S] (int32) place each token for RoPE; without them positions
        count from 0 at the first column, padding included, as Hugging
        Face's forward does. Rows of a padded query see no key: their logits
        follow softmax over equal scores, as HF's eager attention; read only
        rows whose mask is 1."""
        return _llama(self.config, params, input_ids, attention_mask, position_ids)

    def generate(self, input_ids, max_new_tokens: int = 32, attention_mask=None) -> np.ndarray:
        """Greedy decoding, as `transformers`' `generate(do_sample=False)`:
        the prompt [B, S] (left-padded, `attention_mask` 0 on padding) and up
        to `max_new_tokens` tokens after it, [B, S + n]. Positions start at
        each row's first token; a row that emits a stop token
        (generation_config.json's `eos_token_id`) repeats the pad token
        after it, and decoding ends when every row has stopped.

        One compiled step for every token: the whole sequence buffer
        [B, S + max_new_tokens] runs through the model each time (no KV
        cache yet), and the next token is the argmax at the last column."""
        ids, mask = self._batch(input_ids, attention_mask)
        if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
            raise ArgumentError(f"Pretrained.generate: max_new_tokens={max_new_tokens!r} must "
                                f"be an int >= 1  [{user_frame()}]")
        batch, length = ids.shape
        total = length + max_new_tokens
        buf = np.zeros((batch, total), np.int32)
        seen = np.zeros((batch, total), np.int32)
        buf[:, :length], seen[:, :length] = ids, mask
        if self._next_token is None:
            def next_token(params, ids, mask, positions, last):
                logits = self.forward(params, ids, mask, positions)
                return argmax(take_along_axis(logits, last, 1), -1)
            self._next_token = jit(next_token)
        running = np.ones(batch, bool)
        pad = self.pad_token_id if self.pad_token_id is not None else (
            self.eos_token_ids[0] if self.eos_token_ids else 0)
        for step in range(max_new_tokens):
            end = length + step
            positions = np.maximum(np.cumsum(seen, axis=1) - 1, 0).astype(np.int32)
            last = np.full((batch, 1, 1), end - 1, np.int32)
            token = self._next_token(self.params, buf, seen, positions, last).reshape(batch)
            token = np.where(running, token, pad).astype(np.int32)
            buf[:, end], seen[:, end] = token, 1
            running &= ~np.isin(token, self.eos_token_ids)
            if not running.any():
                return buf[:, :end + 1]
        return buf

    def _batch(self, input_ids, attention_mask):
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise ArgumentError(f"Pretrained: input_ids must be integer token ids [batch, "
                                f"sequence], got {ids.dtype} {list(ids.shape)}  [{user_frame()}]")
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
        if mask.shape != ids.shape:
            raise ArgumentError(f"Pretrained: attention_mask {list(mask.shape)} must have "
                                f"input_ids' shape {list(ids.shape)}  [{user_frame()}]")
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ArgumentError(f"Pretrained: token ids must be in [0, {self.config.vocab_size})"
                                f", got {ids.min()}..{ids.max()}  [{user_frame()}]")
        return ids.astype(np.int32), mask.astype(np.int32)

    def __call__(self, input_ids, attention_mask=None) -> np.ndarray:
        ids, mask = self._batch(input_ids, attention_mask)
        if self._compiled is None:
            self._compiled = jit(lambda params, ids, mask: self.forward(params, ids, mask))
        return self._compiled(self.params, ids, mask)

    def __repr__(self) -> str:
        c = self.config
        return (f"<{c.model_type} from {self.path}: {c.num_hidden_layers} layers, width "
                f"{c.hidden_size}, {c.num_attention_heads} heads ({c.num_key_value_heads} "
                f"key/value), vocabulary {c.vocab_size}>")


def from_pretrained(path) -> Pretrained:
    """The Hugging Face checkpoint in folder `path` (config.json and
    model.safetensors, or shards listed by model.safetensors.index.json):
    its config checked field by field, its weights as float32 numpy arrays."""
    from safetensors.numpy import load_file
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"models.from_pretrained: path={path!r:.60} must be a folder's path "
                            f"(a str or a Path)  [{user_frame()}]")
    folder = Path(path)
    where = str(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ArgumentError(f"models.from_pretrained: {where} has no config.json (a Hugging "
                            f"Face checkpoint folder holds config.json and *.safetensors)  "
                            f"[{user_frame()}]")
    config = LlamaConfig.from_json(json.loads(config_file.read_text()), where)
    index_file = folder / "model.safetensors.index.json"
    if index_file.is_file():
        files = sorted(set(json.loads(index_file.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    params: dict = {}
    for name in files:
        if not (folder / name).is_file():
            raise ArgumentError(f"models.from_pretrained: {where} has no {name}  "
                                f"[{user_frame()}]")
        for key, value in load_file(str(folder / name)).items():
            params[key] = np.ascontiguousarray(value.astype(np.float32))
    if config.tie_word_embeddings:
        params.pop("lm_head.weight", None)
    missing = [n for n in _parameter_names(config) if n not in params]
    extra = sorted(set(params) - set(_parameter_names(config)))
    if missing or extra:
        raise ArgumentError(f"models.from_pretrained: {where}: the weights do not match the "
                            f"config: missing {missing[:3]}, unexpected {extra[:3]}  "
                            f"[{user_frame()}]")
    generation = config_file.parent / "generation_config.json"
    settings = {**json.loads(config_file.read_text()),
                **(json.loads(generation.read_text()) if generation.is_file() else {})}
    eos = settings.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return Pretrained(config, params, folder, eos, settings.get("pad_token_id"))


def _parameter_names(c: LlamaConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    names += [] if c.tie_word_embeddings else ["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [p + f"self_attn.{w}_proj.weight" for w in "qkvo"]
        names += [p + f"self_attn.{w}_proj.bias" for w in "qkv"] if c.qkv_bias else []
        names += [p + f"mlp.{w}_proj.weight" for w in ("gate", "up", "down")]
    return names


def _rotary(c: LlamaConfig, positions):
    """cos and sin [B or 1, 1, S, D] of Hugging Face's rotate-half RoPE at
    `positions` [B or 1, S]."""
    d = c.head_dim
    inv = 1.0 / c.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d)
    rows, length = positions.shape
    angles = mul(reshape(cast(positions, dtypes.float32), rows, 1, length, 1),
                 reshape(inv.astype(np.float32), 1, 1, 1, d // 2))
    angles = concat([angles, angles], -1)
    return cos(angles), sin(angles)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = concat([neg(index(x, (Ellipsis, slice(half, None)))),
                      index(x, (Ellipsis, slice(None, half)))], -1)
    return add(mul(x, cos), mul(rotated, sin))


def _llama(c: LlamaConfig, params: dict, ids, mask, positions=None):
    batch, length = ids.shape
    h, kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    x = embedding(ids, params["model.embed_tokens.weight"])
    cos, sin = _rotary(c, reshape(arange(length), 1, length) if positions is None else positions)
    # Additive mask [B, 1, S, S]: a key is seen if it is not after the query
    # and not padding (float32's lowest for the rest, as Hugging Face's).
    lowest = float(np.finfo(np.float32).min)
    rows = reshape(arange(length), length, 1)
    cols = reshape(arange(length), 1, length)
    causal = reshape(cast(rows >= cols, dtypes.float32), 1, 1, length, length)
    seen = causal if mask is None else mul(causal, reshape(cast(mask, dtypes.float32), batch, 1,
                                                           1, length))
    bias = where(seen > 0.5, 0.0, lowest)
    scale = 1.0 / math.sqrt(d)

    def proj(v, name, bias_too=False):
        return linear(v, params[name + ".weight"], params[name + ".bias"] if bias_too else None,
                      weight_layout="out_in")

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        a = rmsnorm(x, params[p + "input_layernorm.weight"], c.rms_norm_eps)
        q = transpose(reshape(proj(a, p + "self_attn.q_proj", c.qkv_bias), batch, length, h, d),
                      1, 2)
        k = transpose(reshape(proj(a, p + "self_attn.k_proj", c.qkv_bias), batch, length, kv, d),
                      1, 2)
        v = transpose(reshape(proj(a, p + "self_attn.v_proj", c.qkv_bias), batch, length, kv, d),
                      1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if kv != h:       # grouped-query: each key/value head serves h // kv query heads
            k = reshape(broadcast_to(reshape(k, batch, kv, 1, length, d),
                                     (batch, kv, h // kv, length, d)), batch, h, length, d)
            v = reshape(broadcast_to(reshape(v, batch, kv, 1, length, d),
                                     (batch, kv, h // kv, length, d)), batch, h, length, d)
        scores = add(mul(matmul(q, transpose(k, 2, 3)), scale), bias)
        out = matmul(softmax(scores, -1), v)
        out = reshape(transpose(out, 1, 2), batch, length, h * d)
        x = add(x, proj(out, p + "self_attn.o_proj"))
        m = rmsnorm(x, params[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        gate = silu(proj(m, p + "mlp.gate_proj"))
        x = add(x, proj(mul(gate, proj(m, p + "mlp.up_proj")), p + "mlp.down_proj"))
    x = rmsnorm(x, params["model.norm.weight"], c.rms_norm_eps)
    head = params["model.embed_tokens.weight"] if c.tie_word_embeddings else \
        params["lm_head.weight"]
    return linear(x, head, weight_layout="out_in")
