"""Hugging Face checkpoints as Tessera models: `ts.models.from_pretrained`.

    from tessera import models
    m = models.from_pretrained("path/to/hf_dir")     # config.json + *.safetensors
    logits = m(input_ids, attention_mask=mask)        # numpy [B, S, V]
    logits = m.forward(m.params, ids, mask)           # traceable: inside ts.jit / ts.grad

The Llama family (Llama 2/3 without rope scaling, Mistral with its sliding
window, Qwen2's bias on q/k/v, Mixtral's experts) and GPT-2 are written here as Hugging Face's
modeling code computes them: RMSNorm, rotary embeddings (rotate-half),
grouped-query attention, SwiGLU; learned positions, LayerNorm, fused q/k/v
and GELU for GPT-2. `m.params` is a dict under Hugging Face's parameter names
(`model.layers.0.self_attn.q_proj.weight`), weights in their [out, in]
layout (`op.linear(..., weight_layout="out_in")`).

Every field of config.json is either used, one that cannot change the
forward pass (token ids, the dtype it was saved in, ...), or an error that
names it: a checkpoint is never run as a different model than it is.

Attention is `op.attention` (flash kernels, never the [S, S] scores): the
padding mask a [B, 1, 1, S] key mask, grouped-query key/value heads read in
place by their query heads.

Mixtral (`op.moe`) keeps its experts fused, as transformers 5 does
(`LlamaConfig.checkpoint_pieces`); `generate` decodes with a KV cache.
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import dtypes
from ._checks import is_int
from ._primitives import (add, arange, attention, broadcast_to, cast, concat, cos, dropout,
                          dynamic_update_slice, embedding, gelu, index, layernorm, linear, mul,
                          neg, reshape, rmsnorm, silu, sin, transpose)
from .compiler import jit
from ._source import user_frame
from .errors import ArgumentError

__all__ = ["from_pretrained", "Pretrained", "LlamaConfig", "GPT2Config", "parallel_layout",
           "stage_ranks"]

#: KV-cache slots come in multiples of this (Pretrained.generate)
CACHE_SLOTS = 64

#: safetensors dtypes a checkpoint's weights may have -> (numpy dtype, the
#: config's name): read into float32 exactly, written back as they were
STORED = {"F32": (np.float32, "float32"), "BF16": (dtypes.bfloat16, "bfloat16"),
          "F16": (np.float16, "float16")}

#: model_type -> whether q, k and v projections carry a bias
FAMILIES = {"llama": False, "mistral": False, "mixtral": False, "qwen2": True}

#: config.json fields of every family that cannot change the forward pass
NO_EFFECT = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range",
    "_name_or_path", "return_dict", "output_hidden_states", "output_attentions",
})


class _ConfigFields:
    """A config.json being read: every field is known to the reader (used,
    checked, or in NO_EFFECT), and each error names the folder, the field and
    the user's line."""

    def __init__(self, raw: dict, where: str, known: set):
        self.raw, self.where = raw, where
        unknown = sorted(set(raw) - known - NO_EFFECT)
        if unknown:
            raise self.bad(unknown[0], "is a config field Tessera does not know; it could change "
                                       "the model, so it is not ignored")

    def bad(self, field: str, why: str) -> ArgumentError:
        return ArgumentError(f"models.from_pretrained: {self.where}: {field}="
                             f"{self.raw.get(field)!r} {why}  [{user_frame()}]")

    def get(self, field: str, default=None):
        return self.raw.get(field, default)

    def __getitem__(self, field: str):
        if field not in self.raw:
            raise ArgumentError(f"models.from_pretrained: {self.where}: config.json has no "
                                f"{field}  [{user_frame()}]")
        return self.raw[field]

    def require(self, field: str, want) -> None:
        """The field, where given, must be `want` (what Tessera computes)."""
        if self.raw.get(field, want) != want:
            raise self.bad(field, f"is not supported ({want})")


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
    #: Mistral's sliding window: a query sees the last `window` positions
    window: int | None = None
    #: Mixtral: SwiGLU experts per layer (0: one dense MLP), chosen per token
    experts: int = 0
    experts_per_token: int = 0
    #: dropout of the attention probabilities in training (forward's dropout_key)
    attention_dropout: float = 0.0

    #: fields that cannot change the forward pass
    NO_EFFECT = frozenset({"max_position_embeddings", "max_window_layers"})
    #: fields read or checked below
    CHECKED = frozenset({"attention_dropout", "vocab_size", "hidden_size", "intermediate_size",
                         "num_hidden_layers",
                         "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                         "rope_theta", "rope_parameters", "rope_scaling", "hidden_act",
                         "pretraining_tp", "mlp_bias", "attention_bias", "use_sliding_window",
                         "sliding_window", "layer_types", "tie_word_embeddings", "head_dim"})

    #: Mixtral's fields (the router's auxiliary loss only counts in HF's loss
    #: with output_router_logits, which is refused)
    MOE = frozenset({"num_local_experts", "num_experts_per_tok", "output_router_logits",
                     "router_aux_loss_coef", "router_jitter_noise"})

    @classmethod
    def from_json(cls, raw: dict, where: str) -> "LlamaConfig":
        moe = raw.get("model_type") == "mixtral"
        f = _ConfigFields(raw, where, cls.NO_EFFECT | cls.CHECKED | (cls.MOE if moe else set()))
        kind = f["model_type"]
        f.require("hidden_act", "silu")
        f.require("rope_scaling", None)
        f.require("pretraining_tp", 1)
        f.require("mlp_bias", False)
        f.require("attention_bias", FAMILIES[kind])
        # transformers 5 writes RoPE's settings as one dict
        rope = f.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default" or set(rope) - {"rope_type",
                                                                          "rope_theta"}:
            raise f.bad("rope_parameters", "is not supported yet (rope_type 'default' only)")
        window = f.get("sliding_window") if kind in ("mistral", "mixtral") else None
        if moe:
            f.require("output_router_logits", False)
            f.require("router_jitter_noise", 0.0)
        if kind != "mistral" and f.get("use_sliding_window") and \
                f.get("sliding_window") is not None:
            # Qwen2 windows the layers from max_window_layers on
            raise f.bad("use_sliding_window", "is not supported yet for "
                        f"{kind} (Mistral's sliding window is)")
        if any(t != "full_attention" for t in f.get("layer_types") or ()):
            raise f.bad("layer_types", "is not supported yet (full_attention layers only)")
        heads, width = int(f["num_attention_heads"]), int(f["hidden_size"])
        config = cls(kind, int(f["vocab_size"]), width, int(f["intermediate_size"]),
                     int(f["num_hidden_layers"]), heads,
                     int(f.get("num_key_value_heads") or heads),
                     int(f.get("head_dim") or width // heads),
                     float(f.get("rms_norm_eps", 1e-6)),
                     float(rope.get("rope_theta", f.get("rope_theta", 10000.0))),
                     bool(f.get("tie_word_embeddings", False)), FAMILIES[kind],
                     None if window is None else int(window),
                     int(f["num_local_experts"]) if moe else 0,
                     int(f["num_experts_per_tok"]) if moe else 0,
                     _rate(f, "attention_dropout", 0.0))
        if moe and not 1 <= config.experts_per_token <= config.experts:
            raise f.bad("num_experts_per_tok", f"must be in [1, num_local_experts="
                        f"{config.experts}]")
        if heads % config.num_key_value_heads:
            raise f.bad("num_key_value_heads", f"must divide num_attention_heads={heads}")
        return config

    def describe(self) -> str:
        return (f"{self.num_hidden_layers} layers, width {self.hidden_size}, "
                f"{self.num_attention_heads} heads ({self.num_key_value_heads} key/value), "
                + (f"{self.experts} experts ({self.experts_per_token} per token), "
                   if self.experts else "") + f"vocabulary {self.vocab_size}")

    def parameter_names(self) -> list[str]:
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        names += [] if self.tie_word_embeddings else ["lm_head.weight"]
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
            names += [p + f"self_attn.{w}_proj.weight" for w in "qkvo"]
            names += [p + f"self_attn.{w}_proj.bias" for w in "qkv"] if self.qkv_bias else []
            if self.experts:
                names += [p + "mlp.gate.weight", p + "mlp.experts.gate_up_proj",
                          p + "mlp.experts.down_proj"]
            else:
                names += [p + f"mlp.{w}_proj.weight" for w in ("gate", "up", "down")]
        return names

    def parameter_shapes(self) -> dict:
        """Each parameter's shape under HF's names (nn.Linear: [out, in])."""
        w, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        by_leaf = {"embed_tokens.weight": (self.vocab_size, w), "lm_head.weight":
                   (self.vocab_size, w), "q_proj.weight": (q, w), "k_proj.weight": (kv, w),
                   "v_proj.weight": (kv, w), "o_proj.weight": (w, q), "q_proj.bias": (q,),
                   "k_proj.bias": (kv,), "v_proj.bias": (kv,), "gate_proj.weight": (i, w),
                   "up_proj.weight": (i, w), "down_proj.weight": (w, i),
                   "gate.weight": (self.experts, w),
                   "experts.gate_up_proj": (self.experts, 2 * i, w),
                   "experts.down_proj": (self.experts, w, i)}
        return {n: by_leaf.get(".".join(n.split(".")[-2:]), (w,)) for n in self.parameter_names()}

    def checkpoint_pieces(self) -> dict:
        """Where each parameter is in the checkpoint's files: its own key,
        or for Mixtral's experts what transformers 5 fuses on loading (and
        splits again on saving): the router `mlp.gate.weight` is the file's
        `block_sparse_moe.gate.weight`; `mlp.experts.gate_up_proj` [E, 2F, D]
        stacks each expert's w1 and w3 rows, `mlp.experts.down_proj`
        [E, D, F] each expert's w2. -> {name: key, or [[keys of expert e,
        concatenated along rows] for each e]}."""
        pieces = {n: n for n in self.parameter_names()}
        for i in range(self.num_hidden_layers if self.experts else 0):
            p, f = f"model.layers.{i}.", f"model.layers.{i}.block_sparse_moe."
            pieces[p + "mlp.gate.weight"] = f + "gate.weight"
            pieces[p + "mlp.experts.gate_up_proj"] = [
                [f"{f}experts.{e}.w1.weight", f"{f}experts.{e}.w3.weight"]
                for e in range(self.experts)]
            pieces[p + "mlp.experts.down_proj"] = [[f"{f}experts.{e}.w2.weight"]
                                                   for e in range(self.experts)]
        return pieces

    @property
    def layers(self) -> int:
        return self.num_hidden_layers

    def forward(self, params, ids, mask, positions, attend=None, drop=None, staged=False):
        return _llama(self, params, ids, mask, positions, attend, drop, staged)


#: GPT-2's `activation_function` -> op.gelu's `approximate`
GPT2_ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}

@dataclass(frozen=True)
class GPT2Config:
    """The fields of a GPT-2 config.json the forward pass reads."""
    model_type: str
    vocab_size: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    n_positions: int
    layer_norm_epsilon: float
    approximate: str
    #: dropout rates in training (forward's dropout_key): of the attention
    #: probabilities, of each block's two residual branches, of the embeddings
    attn_pdrop: float = 0.0
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0

    #: fields that cannot change the forward pass (the summary_* fields:
    #: GPT2DoubleHeadsModel's extra head)
    NO_EFFECT = frozenset({"n_positions", "n_ctx", "summary_type", "summary_use_proj",
                           "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
                           "task_specific_params"})
    #: fields read or checked below
    CHECKED = frozenset({"attn_pdrop", "resid_pdrop", "embd_pdrop", "vocab_size", "n_embd",
                         "n_layer", "n_head", "n_inner",
                         "layer_norm_epsilon", "activation_function", "scale_attn_weights",
                         "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
                         "add_cross_attention", "tie_word_embeddings"})

    @classmethod
    def from_json(cls, raw: dict, where: str) -> "GPT2Config":
        f = _ConfigFields(raw, where, cls.NO_EFFECT | cls.CHECKED)
        act = f.get("activation_function", "gelu_new")
        if act not in GPT2_ACTIVATIONS:
            raise f.bad("activation_function", f"is not supported "
                                               f"({', '.join(GPT2_ACTIVATIONS)})")
        for field, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx",
                                                            False),
                            ("reorder_and_upcast_attn", False), ("add_cross_attention", False),
                            ("tie_word_embeddings", True)):
            f.require(field, want)
        n = int(f["n_embd"])
        return cls("gpt2", int(f["vocab_size"]), n, int(f["n_layer"]), int(f["n_head"]),
                   int(f.get("n_inner") or 4 * n), int(f.get("n_positions", 1024)),
                   float(f.get("layer_norm_epsilon", 1e-5)), GPT2_ACTIVATIONS[act],
                   *(_rate(f, name, 0.1) for name in ("attn_pdrop", "resid_pdrop", "embd_pdrop")))

    @property
    def tie_word_embeddings(self) -> bool:
        return True

    def describe(self) -> str:
        return (f"{self.n_layer} layers, width {self.n_embd}, {self.n_head} heads, "
                f"vocabulary {self.vocab_size}")

    def parameter_names(self) -> list[str]:
        names = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                 "transformer.ln_f.bias"]
        for i in range(self.n_layer):
            p = f"transformer.h.{i}."
            names += [p + f"{m}.{w}" for m in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj",
                                              "mlp.c_fc", "mlp.c_proj") for w in ("weight", "bias")]
        return names

    def parameter_shapes(self) -> dict:
        """Each parameter's shape under HF's names (Conv1D: [in, out])."""
        n, inner = self.n_embd, self.n_inner
        by_leaf = {"wte.weight": (self.vocab_size, n), "wpe.weight": (self.n_positions, n),
                   "c_attn.weight": (n, 3 * n), "c_attn.bias": (3 * n,),
                   "attn.c_proj.weight": (n, n), "c_fc.weight": (n, inner),
                   "c_fc.bias": (inner,), "mlp.c_proj.weight": (inner, n)}
        return {name: by_leaf.get(".".join(name.split(".")[-2:]),
                                  by_leaf.get(".".join(name.split(".")[-3:]), (n,)))
                for name in self.parameter_names()}

    def checkpoint_pieces(self) -> dict:
        """Each parameter is its own key of the checkpoint."""
        return {n: n for n in self.parameter_names()}

    @property
    def layers(self) -> int:
        return self.n_layer

    def forward(self, params, ids, mask, positions, attend=None, drop=None, staged=False):
        return _gpt2(self, params, ids, mask, positions, attend, drop, staged)


#: model_type -> its config class
CONFIGS = {"llama": LlamaConfig, "mistral": LlamaConfig, "mixtral": LlamaConfig,
           "qwen2": LlamaConfig,
           "gpt2": GPT2Config}


class Pretrained:
    """A checkpoint's model: `params` (Hugging Face's names), `config`, and
    its forward pass, eager (`m(ids, attention_mask=)`) or traced
    (`m.forward(params, ids, attention_mask)`)."""

    def __init__(self, config: LlamaConfig | GPT2Config, params: dict, path: Path, eos=(),
                 pad=None, stored=None):
        self.config, self.params, self.path = config, params, path
        #: each weight's dtype in the checkpoint (safetensors' names: "BF16"),
        #: which save_pretrained writes it back in
        self.stored_dtypes = dict(stored or {})
        #: generation's stop tokens and the token a finished row repeats
        self.eos_token_ids, self.pad_token_id = tuple(eos), pad
        #: the mesh whose `pp` axis the layers are split over (from_pretrained
        #: with such a mesh): forward marks each layer a pipeline stage
        self.pipeline_mesh = None
        self._compiled, self._decoders = {}, None

    def forward(self, params: dict, input_ids, attention_mask=None, position_ids=None, *,
                dropout_key=None):
        """Logits [B, S, V] (float32) of `input_ids` [B, S]; `attention_mask`
        [B, S] (1: a token, 0: padding) masks padded keys. `position_ids`
        [B, S] (int32) place each token for RoPE; without them positions
        count from 0 at the first column, padding included, as Hugging
        Face's forward does. Rows of a padded query see no key: their logits
        follow softmax over equal scores, as HF's eager attention; read only
        rows whose mask is 1.

        Without `dropout_key` this is the model in evaluation mode (HF's
        `model.eval()`): no dropout. `dropout_key=(seed, step)` (seed an
        int; the step an int or an integer scalar of the program, to
        compile once) is training mode (`model.train()`): the config's
        dropouts where HF applies them (Llama's `attention_dropout` on the
        attention probabilities; GPT-2's `embd_pdrop` on the embeddings,
        `attn_pdrop` on the probabilities and `resid_pdrop` on each residual
        branch), each site with its own stream of `op.dropout`'s
        counter-based masks: the same on any mesh."""
        return self.config.forward(params, input_ids, attention_mask, position_ids, None,
                                   _Dropouts(dropout_key), self.pipeline_mesh is not None)

    def generate(self, input_ids, max_new_tokens: int = 32, attention_mask=None, *,
                 temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None) -> np.ndarray:
        """Greedy decoding, as `transformers`' `generate(do_sample=False)`:
        the prompt [B, S] (left-padded, `attention_mask` 0 on padding) and up
        to `max_new_tokens` tokens after it, [B, S + n]. Positions start at
        each row's first token; a row that emits a stop token
        (generation_config.json's `eos_token_id`) repeats the pad token
        after it, and decoding ends when every row has stopped.

        Sampling with `temperature=` (> 0): each token is drawn from
        softmax(logits / temperature), kept to the `top_k` most likely
        tokens and then to the fewest whose probability reaches `top_p`
        (HF's order of its warpers), by numpy's generator seeded with
        `seed` (the same seed, the same tokens).

        A KV cache: the prompt runs once (the prefill, compiled per prompt
        shape), then each new token alone (the decode step, compiled once
        for the batch and the cache's length S + max_new_tokens) writes its
        keys and values into every layer's fixed-size cache with
        `op.dynamic_update_slice` at a run-time index and attends over the
        slots written so far."""
        ids, mask = self._batch(input_ids, attention_mask)
        self._refuse_split_layers("generate")
        if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
            raise ArgumentError(f"Pretrained.generate: max_new_tokens={max_new_tokens!r} must "
                                f"be an int >= 1  [{user_frame()}]")
        choose = _chooser(temperature, top_k, top_p, seed)
        batch, length = ids.shape
        # The cache's slots: a multiple of 64, so the decode step's attention
        # streams 64-key blocks whatever the lengths (the spare slots stay
        # masked).
        total = -(-(length + max_new_tokens) // CACHE_SLOTS) * CACHE_SLOTS
        buf = np.zeros((batch, total), np.int32)
        seen = np.zeros((batch, total), np.int32)
        buf[:, :length], seen[:, :length] = ids, mask
        prefill, decode = self._decoding()
        counted = np.cumsum(mask, axis=1)           # each row's tokens so far
        positions = np.maximum(counted - 1, 0).astype(np.int32)
        logits, *caches = prefill(self.params, ids, mask, positions, total)
        counted = counted[:, -1]
        running = np.ones(batch, bool)
        pad = self.pad_token_id if self.pad_token_id is not None else (
            self.eos_token_ids[0] if self.eos_token_ids else 0)
        for step in range(max_new_tokens):
            at = length + step
            token = np.where(running, choose(np.asarray(logits)), pad).astype(np.int32)
            buf[:, at], seen[:, at] = token, 1
            running &= ~np.isin(token, self.eos_token_ids)
            if not running.any():
                return buf[:, :at + 1]
            if step + 1 == max_new_tokens:
                break
            counted += 1                             # the token just written
            logits, *caches = decode(self.params, token[:, None],
                                     (counted - 1)[:, None].astype(np.int32), seen, np.int32(at),
                                     caches)
        return buf[:, :length + max_new_tokens]

    def _decoding(self):
        """The compiled prefill and decode steps (made once per model): each
        gives the last position's logits [B, V] and the layers' caches."""
        if self._decoders is None:
            c = self.config
            window = getattr(c, "window", None)

            def prefill(params, ids, mask, positions, slots: int):
                # Each layer's keys and values, in slots 0 .. S-1 of a
                # [B, slots, KV, D] cache made here: on a mesh it stays in the
                # layout the step computes it in (heads split over tp), never
                # gathered whole on every rank.
                attend = _Sequence(keep=True)
                logits = c.forward(params, ids, mask, positions, attend)
                batch, length = ids.shape
                caches = tuple(concat([kv, broadcast_to(0.0, (batch, slots - length,
                                                              *kv.shape[2:]))], 1)
                               for kv in attend.kept)
                return (logits[:, -1],) + caches

            def decode(params, token, position, seen, at, caches):
                slots = caches[0].shape[1]
                keys = cast(seen, dtypes.float32)
                if window is not None:      # the last `window` positions, this one's included
                    near = cast(arange(slots), dtypes.float32) > cast(at, dtypes.float32) - window
                    keys = mul(keys, cast(near, dtypes.float32))
                attend = _Decode(list(caches), at,
                                 reshape(keys > 0.5, token.shape[0], 1, 1, slots))
                logits = c.forward(params, token, None, position, attend)
                return (logits[:, -1],) + tuple(attend.written)
            self._decoders = (jit(prefill), jit(decode))
        return self._decoders

    def save_pretrained(self, folder) -> Path:
        """Writes `params` as a Hugging Face checkpoint folder `transformers`
        reads back: config.json (the checkpoint's own, its dtype the one the
        weights are written in), generation_config.json when the checkpoint
        had one, and model.safetensors under HF's names (a tied head is not
        written, as HF does not), each weight in the dtype the checkpoint
        stored it in (`stored_dtypes`: a bf16 checkpoint stays bf16, each
        value rounded to nearest even; float32 for weights it did not
        have). Returns the folder."""
        from safetensors.numpy import save_file
        if not isinstance(folder, (str, os.PathLike)):
            raise ArgumentError(f"Pretrained.save_pretrained: folder={folder!r:.60} must be a "
                                f"path  [{user_frame()}]")
        self._refuse_split_layers("save_pretrained")
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        raw = json.loads((self.path / "config.json").read_text())
        tensors = self.to_checkpoint(self.params)
        kinds = {k: self.stored_dtypes.get(k, "F32") for k in tensors}
        one = set(kinds.values())
        for key in ("dtype", "torch_dtype"):
            if key in raw and len(one) == 1:    # (mixed: the checkpoint's own word stays)
                raw[key] = STORED[next(iter(one))][1]
        (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        generation = self.path / "generation_config.json"
        if generation.is_file() and generation.resolve() != (out / generation.name).resolve():
            (out / generation.name).write_text(generation.read_text())
        save_file({k: np.ascontiguousarray(v.astype(STORED[kinds[k]][0], copy=False))
                   for k, v in tensors.items()},
                  str(out / "model.safetensors"), metadata={"format": "pt"})
        return out

    def layout(self, mesh):
        """`dist.from_tree`'s layout function for this model's parameters on
        `mesh`, and for anything keyed like them (gradients, an optimizer
        state's `m.<name>` moments): `parallel_layout` of each parameter,
        other leaves (a step count) replicated."""
        from ._dtensor import Mesh
        if not isinstance(mesh, Mesh):
            raise ArgumentError(f"Pretrained.layout: mesh={mesh!r:.60} must be a dist.Mesh  "
                                f"[{user_frame()}]")
        names, sizes = set(self.config.parameter_names()), _axis_sizes(mesh)

        def spec(path: str, array):
            while path not in names and "." in path:
                path = path.split(".", 1)[1]
            return parallel_layout(self.config, path, array.shape, **sizes) \
                if path in names else None
        return spec

    def to_checkpoint(self, tree: dict) -> dict:
        """`tree` (the params, their gradients or an optimizer moment: a
        dict under `params`' names, numpy arrays or DTensors) under the
        checkpoint's names, as float32 numpy arrays: what save_pretrained
        writes. Mixtral's fused experts are split per expert again (w1 and
        w3 [F, D] from gate_up_proj's rows, w2 [D, F] from down_proj); a
        DTensor is gathered."""
        if not isinstance(tree, dict):
            raise ArgumentError(f"Pretrained.to_checkpoint: tree is a {type(tree).__name__}, "
                                f"not a dict under the model's parameter names  "
                                f"[{user_frame()}]")
        out = {}
        for name, piece in self.config.checkpoint_pieces().items():
            if name not in tree:
                raise ArgumentError(f"Pretrained.to_checkpoint: the tree has no {name} (a "
                                    f"dict under the model's parameter names)  [{user_frame()}]")
            value = np.asarray(tree[name], np.float32)
            if isinstance(piece, str):
                out[piece] = value
                continue
            for e, keys in enumerate(piece):
                out.update(zip(keys, np.split(value[e], len(keys))))
        return out

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

    def _refuse_split_layers(self, what: str) -> None:
        if self.pipeline_mesh is not None:
            raise ArgumentError(
                f"Pretrained.{what}: this model's layers are split over the "
                f"{self.pipeline_mesh.axis_size('pp')} ranks of 'pp' (from_pretrained(mesh=) "
                f"with a pp axis), each rank holding its stage's; {what} needs every layer on "
                f"every rank: load it with a mesh without pp  [{user_frame()}]")

    def __call__(self, input_ids, attention_mask=None) -> np.ndarray:
        """The logits [B, S, V] (numpy, on every rank). With the layers
        split over a `pp` axis, a pipeline over it: each rank runs its
        stage's layers, the batch in up to `pp` microbatches (the most
        that divide it, and whose tokens an `ep` axis splits)."""
        ids, mask = self._batch(input_ids, attention_mask)
        mesh = self.pipeline_mesh
        parts = 1
        if mesh is not None:            # (op.moe splits each microbatch's tokens over ep)
            ep = mesh.axis_size("ep") if "ep" in mesh.axes else 1
            parts = max(d for d in range(1, mesh.axis_size("pp") + 1)
                        if d == 1 or (len(ids) % d == 0 and (ids.size // d) % ep == 0))
        compiled = self._compiled.get(parts)
        if compiled is None:
            def forward(params, ids, mask):
                return self.forward(params, ids, mask)
            if mesh is None:
                compiled = jit(forward)
            else:
                from .pipeline import run
                compiled = run(forward, mesh=mesh, axis="pp", microbatches=parts,
                               batch=("ids", "mask"))
            self._compiled[parts] = compiled
        return np.asarray(compiled(self.params, ids, mask))   # (gathers a DTensor)

    def __repr__(self) -> str:
        return f"<{self.config.model_type} from {self.path}: {self.config.describe()}>"


def from_pretrained(path, mesh=None) -> Pretrained:
    """The Hugging Face checkpoint in folder `path` (config.json and
    model.safetensors, or shards listed by model.safetensors.index.json):
    its config checked field by field, its weights as float32 numpy arrays
    (bf16 and f16 weights read exactly: each is a float32 value; the
    dtypes they had are `stored_dtypes`, which save_pretrained writes).

    With `mesh=` (a `dist.Mesh`; every rank calls this), the weights are
    DTensors and each rank reads only its block from the files
    (`parallel_layout`): over a `tp` axis the Llama family's projections
    Megatron-style, over an `ep` axis Mixtral's experts by expert;
    everything else, and every other axis but `pp`, replicated. Over a
    `pp` axis each rank reads only its stage's layers (`stage_ranks`; the
    others' parameters are DTensors it does not hold) and the model's
    forward marks each layer a pipeline stage: `m(ids)` runs as a pipeline,
    a training step must be one (`pipeline.run(then=, results="stage")`
    keeps each stage's parameters on its ranks).

    Mixtral's experts are held as transformers 5 holds them (and names
    them: `m.params` has the names of its `state_dict()`):
    `mlp.experts.gate_up_proj` [E, 2F, D] and `mlp.experts.down_proj`
    [E, D, F], fused from the files' per-expert w1/w3/w2 on reading and
    split again by save_pretrained (`LlamaConfig.checkpoint_pieces`)."""
    from safetensors import safe_open
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
    raw = json.loads(config_file.read_text())
    family = CONFIGS.get(raw.get("model_type"))
    if family is None:
        raise ArgumentError(f"models.from_pretrained: {where}: model_type="
                            f"{raw.get('model_type')!r} is not supported (supported: "
                            f"{', '.join(CONFIGS)})  [{user_frame()}]")
    config = family.from_json(raw, where)
    index_file = folder / "model.safetensors.index.json"
    if index_file.is_file():
        files = sorted(set(json.loads(index_file.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    from ._dtensor import Mesh
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ArgumentError(f"models.from_pretrained: mesh={mesh!r:.60} must be a dist.Mesh "
                            f"(or None: numpy weights)  [{user_frame()}]")
    pp = 1 if mesh is None else _pipeline_ranks(mesh)
    if config.layers % pp:
        field = "n_layer" if isinstance(config, GPT2Config) else "num_hidden_layers"
        raise ArgumentError(f"models.from_pretrained: {where}: {field}={config.layers} layers "
                            f"do not split evenly over the {pp} ranks of the mesh's 'pp' axis "
                            f"(each rank holds one stage's layers: use a pp that divides "
                            f"{config.layers})  [{user_frame()}]")
    if pp > 1:          # (each rank reads its stage's layers: one process of the job each)
        mesh.require_rank("models.from_pretrained with a pp axis")
    from contextlib import ExitStack
    params, stored = {}, {}
    with ExitStack() as stack:
        opened = {}                 # checkpoint key -> its open file
        for name in files:
            if not (folder / name).is_file():
                raise ArgumentError(f"models.from_pretrained: {where} has no {name}  "
                                    f"[{user_frame()}]")
            f = stack.enter_context(safe_open(str(folder / name), framework="np"))
            for key in f.keys():
                stored[key] = f.get_slice(key).get_dtype()
                if stored[key] not in STORED:
                    raise ArgumentError(f"models.from_pretrained: {where}: {key} is stored as "
                                        f"{stored[key]}; Tessera reads {', '.join(STORED)} "
                                        f"weights (quantized checkpoints are not supported)  "
                                        f"[{user_frame()}]")
                opened[key] = f
        if config.tie_word_embeddings:
            opened.pop("lm_head.weight", None)
            stored.pop("lm_head.weight", None)
        pieces = config.checkpoint_pieces()
        wanted = {k for piece in pieces.values()
                  for keys in ([[piece]] if isinstance(piece, str) else piece) for k in keys}
        missing = sorted(wanted - set(opened))
        extra = sorted(set(opened) - wanted)
        if missing or extra:
            raise ArgumentError(f"models.from_pretrained: {where}: the weights do not match "
                                f"the config: missing {missing[:3]}, unexpected {extra[:3]}  "
                                f"[{user_frame()}]")
        shapes = config.parameter_shapes() if mesh is not None else {}
        for name, piece in pieces.items():
            params[name] = _read(opened, piece, shapes.get(name), config, mesh, name)
    generation = folder / "generation_config.json"
    settings = {**raw, **(json.loads(generation.read_text()) if generation.is_file() else {})}
    eos = settings.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    model = Pretrained(config, params, folder, eos, settings.get("pad_token_id"), stored)
    model.pipeline_mesh = mesh if pp > 1 else None
    return model


def parallel_layout(config, name: str, shape, tp: int = 1, ep: int = 1):
    """The `dist.ShardSpec` of parameter `name` (of `shape`) on a mesh with
    a `tp` axis of `tp` ranks and an `ep` axis of `ep` (None: replicated).
    Over tp, Megatron's layout for the Llama family's nn.Linear [out, in]
    weights: q, k, v, gate and up split their output rows (whole heads), o
    and down their input columns, the embedding and the head their
    vocabulary rows. Over ep, Mixtral's fused experts by expert (dimension
    0). A dimension the axis does not divide stays whole, as do GPT-2's
    fused projections and the experts over tp."""
    from ._dtensor import ShardSpec
    if not isinstance(config, LlamaConfig):
        return None
    if ".experts." in name:
        return ShardSpec((0,), ("ep",)) if ep > 1 and shape[0] % ep == 0 else None
    leaf = name.split(".")[-2] if name.endswith(".weight") else ""
    dim = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "gate_proj": 0, "up_proj": 0,
           "o_proj": 1, "down_proj": 1, "embed_tokens": 0, "lm_head": 0}.get(leaf)
    # (q, k, v and o by whole heads: a rank's rows are heads of its own)
    unit = config.head_dim if leaf in ("q_proj", "k_proj", "v_proj", "o_proj") else 1
    if tp == 1 or dim is None or (shape[dim] // unit) % tp:
        return None
    return ShardSpec((dim,), ("tp",))


def _axis_sizes(mesh) -> dict:
    """{'tp': n, 'ep': n} of `mesh` (1 for an axis it does not have)."""
    return {a: mesh.axis_size(a) if a in mesh.axes else 1 for a in ("tp", "ep")}


def _pipeline_ranks(mesh) -> int:
    """The ranks of `mesh`'s `pp` axis (1 without one)."""
    return mesh.axis_size("pp") if "pp" in mesh.axes else 1


def _read(opened: dict, piece, shape, config, mesh, name: str):
    """Parameter `name` (of `shape`, for a fused one) as float32, from
    checkpoint key `piece` or (fused experts) the per-expert keys `piece`
    lists, in the open files `opened`:
    all of it, or under `mesh` a DTensor of which this rank read only its
    block (a split parameter's rows first..first+n of its dimension)."""
    def rows(first=0, n=None, dim=0):
        """The parameter's rows first..first+n along `dim` (all: n None)."""
        if isinstance(piece, str):
            f = opened[piece]
            block = f.get_tensor(piece) if n is None else \
                f.get_slice(piece)[(slice(None),) * dim + (slice(first, first + n),)]
        else:                                            # experts: dim 0
            chosen = piece if n is None else piece[first:first + n]
            block = np.stack([np.concatenate([opened[k].get_tensor(k) for k in keys])
                              for keys in chosen])
        return np.ascontiguousarray(block.astype(np.float32, copy=False))
    if mesh is None:
        return rows()
    from ._dtensor import ShardSpec, from_local, from_numpy, held_by
    if isinstance(piece, str):
        shape = opened[piece].get_slice(piece).get_shape()
    spec = parallel_layout(config, name, shape, **_axis_sizes(mesh))

    def block():
        """This rank's block: all of it, or its rows of the split dimension."""
        if spec is None:
            return rows()
        dim, axis = spec.partition[0], spec.mesh_axes[0]
        n = shape[dim] // mesh.axis_size(axis)
        return rows(mesh.coords[axis] * n, n, dim)
    if _pipeline_ranks(mesh) > 1:
        # Held by its stage's pp ranks only, each reading its block; no
        # collective (the other ranks do not read this parameter at all).
        ranks = stage_ranks(config, name, _pipeline_ranks(mesh))
        return held_by(block() if mesh.coords["pp"] in ranks else None, shape, np.float32,
                       spec or ShardSpec(), mesh, name, "pp", ranks)
    if spec is None:
        return from_numpy(block(), ShardSpec(), mesh, name=name)
    return from_local(block(), axis=spec.mesh_axes[0], dim=spec.partition[0], mesh=mesh,
                      name=name)


def _key_padding(batch: int, length: int, mask):
    """The boolean key mask [B, 1, 1, S] of `mask` [B, S] (0: padding), or
    None. A padding row before every token (left padding) has no key to
    attend to: 0, as PyTorch's SDPA (HF's default attention) gives it; HF's
    eager attention averages every value there instead, and its loss reads
    that row (it predicts the first token), so the two HF losses differ."""
    if mask is None:
        return None
    return reshape(cast(mask, dtypes.float32) > 0.5, batch, 1, 1, length)


def _chooser(temperature, top_k, top_p, seed):
    """The next token of each row of logits [B, V]: the argmax (greedy), or
    a draw as `Pretrained.generate` describes for `temperature` > 0."""
    where = user_frame()
    if temperature is None:
        for name, value in (("top_k", top_k), ("top_p", top_p), ("seed", seed)):
            if value is not None:
                raise ArgumentError(f"Pretrained.generate: {name}={value!r} samples: pass "
                                    f"temperature= too (1.0: the model's own distribution)  "
                                    f"[{where}]")
        return lambda logits: np.argmax(logits, axis=-1)
    if not (isinstance(temperature, numbers.Real) and not isinstance(temperature, bool)
            and temperature > 0 and np.isfinite(temperature)):
        raise ArgumentError(f"Pretrained.generate: temperature={temperature!r} must be a number "
                            f"> 0 (None: greedy)  [{where}]")
    if top_k is not None and not (isinstance(top_k, numbers.Integral)
                                  and not isinstance(top_k, bool) and top_k >= 1):
        raise ArgumentError(f"Pretrained.generate: top_k={top_k!r} must be an int >= 1  [{where}]")
    if top_p is not None and not (isinstance(top_p, numbers.Real) and 0 < top_p <= 1):
        raise ArgumentError(f"Pretrained.generate: top_p={top_p!r} must be in (0, 1]  [{where}]")
    rng = np.random.default_rng(seed)

    def draw(logits):
        return sample(logits, temperature, top_k, top_p, rng)
    return draw


def sample(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
           rng: np.random.Generator) -> np.ndarray:
    """One token per row of `logits` [B, V] from softmax(logits /
    temperature) kept to the `top_k` most likely tokens, then to the fewest
    (most likely first) whose probability reaches `top_p`."""
    z = np.asarray(logits, np.float64) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, axis=-1, kind="stable")
        ranked = np.take_along_axis(p, order, -1)
        before = np.cumsum(ranked, -1) - ranked           # the mass of the likelier tokens
        keep = np.zeros_like(p, bool)
        np.put_along_axis(keep, order, before < top_p, -1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    return np.array([rng.choice(p.shape[-1], p=row) for row in p], np.int32)


class _Sequence:
    """Attention over the whole sequence (the forward pass, a prefill):
    causal, padded keys masked, Mistral's window, the probabilities dropped
    at `rate` under `drop` (training); `keep` records each layer's keys and
    values (the KV cache a prefill starts)."""

    def __init__(self, keep: bool = False, drop: "_Dropouts | None" = None, rate: float = 0.0):
        self.kept = [] if keep else None
        self.drop, self.rate = drop or _Dropouts(), rate

    def __call__(self, layer: int, q, k, v, keys, window):
        if self.kept is not None:
            self.kept += [k, v]
        rate, key = self.drop.attention(self.rate, layer)
        return attention(q, k, v, causal=True, seq_dim=1, mask=keys, window=window,
                         dropout_p=rate, dropout_key=key)


class _Dropouts:
    """Training's dropout sites of one forward pass (`key` = (seed, step);
    None: evaluation, no dropout): each (layer, site) draws from its own
    key, the seed mixed with the site (Philox's words of distinct keys are
    independent), the step as given."""

    #: the sites of a layer, numbered (layer -1: before the layers)
    SITES = ("embeddings", "attention", "attention_out", "mlp_out")
    #: 64-bit odd constants mixing (seed, site) into a site's seed
    _MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9)

    def __init__(self, key=None):
        self.seed = self.step = None
        if key is None:
            return
        seed, step = (key, 0) if is_int(key) else tuple(key) if isinstance(key, (tuple, list)) \
            and len(key) == 2 else (None, None)
        if not is_int(seed) or not 0 <= seed < 1 << 63:
            raise ArgumentError(f"Pretrained.forward: dropout_key={key!r:.80} must be (seed, "
                                f"step): seed an int in [0, 2**63), the step an int or an "
                                f"integer scalar of the program  [{user_frame()}]")
        self.seed, self.step = int(seed), step

    def key(self, layer: int, site: str) -> tuple:
        """The (seed, step) of `site` of layer `layer`."""
        n = (layer + 1) * len(self.SITES) + self.SITES.index(site) + 1
        return (self.seed * self._MIX[0] + n * self._MIX[1]) % (1 << 63), self.step

    def attention(self, rate: float, layer: int) -> tuple:
        """op.attention's (dropout_p, dropout_key) in layer `layer`."""
        return (rate, self.key(layer, "attention")) if rate and self.seed is not None \
            else (0.0, None)

    def __call__(self, x, rate: float, layer: int, site: str):
        """x dropped at `rate` at `site` (x itself at rate 0 or in evaluation)."""
        return dropout(x, rate, self.key(layer, site)) if rate and self.seed is not None else x


def _rate(f: "_ConfigFields", field: str, default: float) -> float:
    """A dropout rate of the config, checked to lie in [0, 1)."""
    rate = f.get(field, default)
    if not isinstance(rate, numbers.Real) or isinstance(rate, bool) or not 0 <= rate < 1:
        raise f.bad(field, "must be a number in [0, 1)")
    return float(rate)


class _Decode:
    """One new token per row against a fixed-size KV cache: each layer's
    key and value [B, L, KV, D] written at run-time index `at` by
    dynamic_update_slice, then attended under `keys` [B, 1, 1, L] (the
    written, unpadded slots in the window). `written` collects the new
    caches."""

    def __init__(self, caches: list, at, keys):
        self.caches, self.at, self.keys, self.written = caches, at, keys, []

    def __call__(self, layer: int, q, k, v, _keys, _window):
        ck, cv = (dynamic_update_slice(cache, new, self.at, dim=1)
                  for cache, new in zip(self.caches[2 * layer: 2 * layer + 2], (k, v)))
        self.written += [ck, cv]
        return attention(q, ck, cv, seq_dim=1, mask=self.keys)


def _positions(length: int, positions):
    return reshape(arange(length), 1, length) if positions is None else positions


def _rotary(c: LlamaConfig, positions):
    """cos and sin [B or 1, S, 1, D] of Hugging Face's rotate-half RoPE at
    `positions` [B or 1, S] (for [B, S, H, D] heads)."""
    d = c.head_dim
    inv = 1.0 / c.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d)
    rows, length = positions.shape
    angles = mul(reshape(cast(positions, dtypes.float32), rows, length, 1, 1),
                 reshape(inv.astype(np.float32), 1, 1, 1, d // 2))
    angles = concat([angles, angles], -1)
    return cos(angles), sin(angles)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = concat([neg(index(x, (Ellipsis, slice(half, None)))),
                      index(x, (Ellipsis, slice(None, half)))], -1)
    return add(mul(x, cos), mul(rotated, sin))


def _layers(c, layer, x, staged: bool):
    """`x` through the model's layers, `layer(i, x)` each; `staged`: each
    layer one pipeline stage call (`pipeline.Stage`: the pipeline places
    call i on rank i // (layers / pp), as `stage_ranks` reads the
    parameters; the embeddings, before the first call, belong to the first
    stage and the final norm and head, after the last, to the last)."""
    from functools import partial
    from .pipeline import Stage
    for i in range(c.layers):
        step = partial(layer, i)
        x = Stage(step, name=f"layer {i}")(x) if staged else step(x)
    return x


def stage_ranks(config, name: str, pp: int) -> tuple[int, ...]:
    """The ranks of a `pp` axis of `pp` ranks that hold parameter `name`
    when the model's layers are split over it (from_pretrained(mesh=) with
    a pp axis): layer i's on rank i // (layers / pp), the embeddings on
    the first, the final norm and the head on the last, a table tied to
    the head on both. One table with the forward's stage calls
    (`_layers`), which the pipeline places the same way."""
    per = config.layers // pp
    parts = name.split(".")
    for k, part in enumerate(parts[:-1]):
        if part in ("layers", "h") and parts[k + 1].isdigit():
            return (int(parts[k + 1]) // per,)
    if name in ("model.embed_tokens.weight", "transformer.wte.weight"):
        return (0, pp - 1) if config.tie_word_embeddings and pp > 1 else (0,)
    if name == "transformer.wpe.weight":
        return (0,)
    return (pp - 1,)          # the final norm, the head


def _llama(c: LlamaConfig, params: dict, ids, mask, positions=None, attend=None, drop=None,
           staged=False):
    batch, length = ids.shape
    h, kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    x = embedding(ids, params["model.embed_tokens.weight"])
    cos, sin = _rotary(c, _positions(length, positions))
    keys = _key_padding(batch, length, mask)
    attend = attend or _Sequence(drop=drop, rate=c.attention_dropout)

    def proj(v, name, bias_too=False):
        return linear(v, params[name + ".weight"], params[name + ".bias"] if bias_too else None,
                      weight_layout="out_in")

    def heads(v, name, n):
        return reshape(proj(v, name, c.qkv_bias), batch, length, n, d)

    def layer(i, x):
        p = f"model.layers.{i}."
        a = rmsnorm(x, params[p + "input_layernorm.weight"], c.rms_norm_eps)
        # [B, S, H, D] heads, as the projections lay them out; grouped-query
        # key/value heads (kv of them) are read in place by each group.
        q, k = (_rope(heads(a, p + f"self_attn.{n}_proj", m), cos, sin)
                for n, m in (("q", h), ("k", kv)))
        v = heads(a, p + "self_attn.v_proj", kv)
        out = reshape(attend(i, q, k, v, keys, c.window), batch, length, h * d)
        x = add(x, proj(out, p + "self_attn.o_proj"))
        m = rmsnorm(x, params[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        if c.experts:
            return add(x, _experts(c, params, p + "mlp.", m))
        gate = silu(proj(m, p + "mlp.gate_proj"))
        return add(x, proj(mul(gate, proj(m, p + "mlp.up_proj")), p + "mlp.down_proj"))

    x = _layers(c, layer, x, staged)
    x = rmsnorm(x, params["model.norm.weight"], c.rms_norm_eps)
    head = params["model.embed_tokens.weight"] if c.tie_word_embeddings else \
        params["lm_head.weight"]
    return linear(x, head, weight_layout="out_in")


def _experts(c: LlamaConfig, params: dict, p: str, x):
    """Mixtral's sparse block as `op.moe`: the router `gate` [E, D] and the
    fused experts (transformers 5's layout: gate_up_proj [E, 2F, D], w1's
    rows then w3's; down_proj [E, D, F]) as op.moe's [D, E], [E, D, F] and
    [E, F, D]: top-k of the router's logits, softmax over the chosen (HF's
    softmax renormalised over them). Over an `ep` axis the experts stay
    split: each rank transposes its own."""
    from ._moe import moe
    f = c.intermediate_size
    gate_up = transpose(params[p + "experts.gate_up_proj"], 1, 2)         # [E, D, 2F]
    experts = {"router": transpose(params[p + "gate.weight"], 0, 1),
               "w1": index(gate_up, (Ellipsis, slice(None, f))),
               "w3": index(gate_up, (Ellipsis, slice(f, None))),
               "w2": transpose(params[p + "experts.down_proj"], 1, 2)}
    return moe(x, experts, k=c.experts_per_token)


def _gpt2(c: GPT2Config, params: dict, ids, mask, positions=None, attend=None, drop=None,
          staged=False):
    """GPT-2 as Hugging Face's GPT2LMHeadModel computes it: learned positions,
    pre-LayerNorm blocks, one fused q/k/v projection, GELU MLP; its Conv1D
    weights are [in, out], Tessera's own layout; the head is the token table."""
    batch, length = ids.shape
    h, d = c.n_head, c.n_embd // c.n_head
    p = "transformer."
    x = add(embedding(ids, params[p + "wte.weight"]),
            embedding(_positions(length, positions), params[p + "wpe.weight"]))
    keys = _key_padding(batch, length, mask)
    drop = drop or _Dropouts()
    attend = attend or _Sequence(drop=drop, rate=c.attn_pdrop)
    x = drop(x, c.embd_pdrop, -1, "embeddings")

    def heads(t):
        return reshape(t, batch, length, h, d)

    def layer(i, x):
        b = f"{p}h.{i}."
        a = layernorm(x, params[b + "ln_1.weight"], params[b + "ln_1.bias"], c.layer_norm_epsilon)
        qkv = linear(a, params[b + "attn.c_attn.weight"], params[b + "attn.c_attn.bias"])
        q, k, v = (heads(index(qkv, (Ellipsis, slice(j * c.n_embd, (j + 1) * c.n_embd))))
                   for j in range(3))
        out = reshape(attend(i, q, k, v, keys, None), batch, length, c.n_embd)
        x = add(x, drop(linear(out, params[b + "attn.c_proj.weight"],
                               params[b + "attn.c_proj.bias"]), c.resid_pdrop, i, "attention_out"))
        m = layernorm(x, params[b + "ln_2.weight"], params[b + "ln_2.bias"], c.layer_norm_epsilon)
        m = gelu(linear(m, params[b + "mlp.c_fc.weight"], params[b + "mlp.c_fc.bias"]),
                 approximate=c.approximate)
        return add(x, drop(linear(m, params[b + "mlp.c_proj.weight"],
                                  params[b + "mlp.c_proj.bias"]), c.resid_pdrop, i, "mlp_out"))

    x = _layers(c, layer, x, staged)
    x = layernorm(x, params[p + "ln_f.weight"], params[p + "ln_f.bias"], c.layer_norm_epsilon)
    return linear(x, params[p + "wte.weight"], weight_layout="out_in")
