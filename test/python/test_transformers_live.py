"""`tessera.models` against the `transformers` installed beside it, live
(issue 62, item 5): collected only where `torch` and `transformers` import
(test/python/conftest.py leaves this file out otherwise: CI has neither,
and checks the committed fixtures instead, test_pretrained.py). On fresh
random token ids with left padding, for every fixture architecture: the
logits of HF's model (its default SDPA attention) and Tessera's, the
greedy tokens of both `generate`s, and the weights Tessera writes after a
training step read back by `transformers` to the same logits."""

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import tessera as ts
from tessera import models, op

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"

NAMES = ["llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt2_exact_gelu"]


def _hf(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="sdpa").eval()


def _batch(vocab: int):
    rng = np.random.default_rng()
    ids = rng.integers(0, vocab, size=(2, 9)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, :int(rng.integers(1, 5))] = 0                  # left padding
    return ids, mask


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids).long(),
                     attention_mask=torch.tensor(mask).long()).logits.numpy()


@pytest.mark.parametrize("name", NAMES)
def test_logits_and_greedy_tokens_equal_installed_transformers(name):
    ours, theirs = models.from_pretrained(HF / name), _hf(HF / name)
    ids, mask = _batch(ours.config.vocab_size)
    got = ours(ids, attention_mask=mask)
    rows = mask.astype(bool)
    np.testing.assert_allclose(got[rows], _logits(theirs, ids, mask)[rows], rtol=0, atol=5e-5)
    with torch.no_grad():
        want = theirs.generate(input_ids=torch.tensor(ids).long(),
                               attention_mask=torch.tensor(mask).long(), max_new_tokens=6,
                               do_sample=False).numpy()
    tokens = ours.generate(ids, max_new_tokens=6, attention_mask=mask)
    np.testing.assert_array_equal(tokens, want[:, :tokens.shape[1]])
    # m.params is HF's state_dict: its names, shapes and values (Mixtral's
    # experts fused as transformers 5 holds them; a tied head only once)
    state = {k: v.numpy() for k, v in theirs.state_dict().items()}
    assert set(ours.params) <= set(state)
    assert set(state) - set(ours.params) <= {"lm_head.weight"}
    for key, value in ours.params.items():
        np.testing.assert_array_equal(value, state[key], err_msg=key)


@pytest.mark.parametrize("name", ["llama", "gpt2", "mixtral"])
def test_weights_tessera_trained_are_what_transformers_reads(name, tmp_path):
    m = models.from_pretrained(HF / name)
    ids, mask = _batch(m.config.vocab_size)
    labels = np.where(mask == 1, ids, 0).astype(np.int32)

    @ts.jit
    def grads(params, ids, mask, labels):
        logits = m.forward(params, ids, mask)
        return ts.grad(op.cross_entropy(op.reshape(logits, -1, logits.shape[-1]),
                                        op.reshape(labels, -1)), params)
    g = grads(m.params, ids, mask, labels)
    m.params = {k: v - 0.5 * g[k] for k, v in m.params.items()}
    trained = _hf(m.save_pretrained(tmp_path / "trained"))
    rows = mask.astype(bool)
    np.testing.assert_allclose(m(ids, attention_mask=mask)[rows],
                               _logits(trained, ids, mask)[rows], rtol=0, atol=5e-5)
