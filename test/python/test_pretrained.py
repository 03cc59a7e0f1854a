"""`ts.models.from_pretrained` against Hugging Face `transformers` itself:
tiny Llama (grouped-query attention, tied embeddings), Mistral (sliding
window), Mixtral (4 experts, 2 per token, through op.moe), Qwen2 (q/k/v bias, one key/value head) and GPT-2 checkpoints with
random weights, and the logits `transformers` computed for them under a
left-padding mask (its default attention, PyTorch's SDPA), all made by
test/fixtures/make_hf_fixtures.py (versions in test/fixtures/hf/versions.json),
so no `transformers` is needed here."""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import models, op

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.mark.parametrize("name", ["llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt2_exact_gelu"])
def test_logits_match_transformers_under_a_padding_mask(name):
    m = models.from_pretrained(HF / name)
    ref = np.load(HF / name / "reference.npz")
    logits = m(ref["input_ids"], attention_mask=ref["attention_mask"])
    assert logits.shape == ref["logits"].shape and logits.dtype == np.float32
    # Every row, padding too: a padding row with no key gets SDPA's 0.
    np.testing.assert_allclose(logits, ref["logits"], rtol=0, atol=5e-5)


def test_forward_is_traceable_and_differentiable_under_hf_names():
    m = models.from_pretrained(HF / "llama")
    ref = np.load(HF / "llama" / "reference.npz")
    ids, mask = ref["input_ids"][:1], ref["attention_mask"][:1]
    labels = np.roll(ids, -1, axis=1)

    @ts.jit
    def loss_and_grads(params, ids, mask, labels):
        logits = m.forward(params, ids, mask)
        loss = op.cross_entropy(op.reshape(logits, -1, logits.shape[-1]), op.reshape(labels, -1))
        return loss, ts.grad(loss, params)
    loss, grads = loss_and_grads(m.params, ids, mask, labels)
    assert set(grads) == set(m.params)
    # the loss from the fixture's logits (float64 softmax)
    z = ref["logits"][0].astype(np.float64)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    np.testing.assert_allclose(loss, np.mean(lse - z[np.arange(z.shape[0]), labels[0]]),
                               rtol=1e-5)
    assert all(np.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_training_mode_applies_the_configs_dropouts(name):
    """forward(dropout_key=) is HF's train mode: at the config's rates the
    logits change, the same key gives the same bits, another step another
    mask, and gradients flow; at rate 0 it is the evaluation forward."""
    ref = np.load(HF / name / "reference.npz")
    ids, mask = ref["input_ids"], ref["attention_mask"]
    m = models.from_pretrained(HF / name)
    fields = ("attn_pdrop", "resid_pdrop", "embd_pdrop") if name == "gpt2" else \
        ("attention_dropout",)
    m.config = dataclasses.replace(m.config, **{f: 0.25 for f in fields})

    @ts.jit
    def train(params, ids, mask, step):
        logits = m.forward(params, ids, mask, dropout_key=(11, step))
        return logits, ts.grad(op.sum(op.mul(logits, logits)), params)
    eval_logits = m(ids, attention_mask=mask)
    a, grads = train(m.params, ids, mask, np.int64(0))
    again, _ = train(m.params, ids, mask, np.int64(0))
    other, _ = train(m.params, ids, mask, np.int64(1))
    rows = mask.astype(bool)
    assert np.abs(a - eval_logits)[rows].max() > 1e-3, "dropout changed nothing"
    assert np.array_equal(a, again) and not np.array_equal(a, other)
    assert all(np.isfinite(g).all() for g in grads.values())
    m.config = dataclasses.replace(m.config, **{f: 0.0 for f in fields})
    off = ts.jit(lambda p, i, k: m.forward(p, i, k, dropout_key=(11, 0)))(m.params, ids, mask)
    np.testing.assert_array_equal(off, eval_logits)


def _copy(tmp_path, name="llama") -> Path:
    return Path(shutil.copytree(HF / name, tmp_path / name))


@pytest.mark.parametrize("field,value,names", [
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0},
     "rope_parameters="),
    ("model_type", "gpt_neox", "model_type='gpt_neox' is not supported"),
    ("hidden_act", "gelu", "hidden_act='gelu'"),
    ("num_key_value_heads", 3, "must divide num_attention_heads=4"),
    ("some_new_field", 1, "some_new_field=1 is a config field Tessera does not know"),
    ("attention_dropout", 1.5, "attention_dropout=1.5 must be a number in"),
])
def test_an_unsupported_config_field_is_an_error_naming_it(tmp_path, field, value, names):
    folder = _copy(tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    raw[field] = value
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ts.ArgumentError, match=names.replace("(", r"\(").replace("[", r"\[")):
        models.from_pretrained(folder)


def test_missing_files_and_weights_are_errors(tmp_path):
    with pytest.raises(ts.ArgumentError, match="has no config.json"):
        models.from_pretrained(tmp_path)
    folder = _copy(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ts.ArgumentError, match="has no model.safetensors"):
        models.from_pretrained(folder)
    folder = _copy(tmp_path, "qwen2")
    raw = json.loads((folder / "config.json").read_text())
    raw["num_hidden_layers"] = 3
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ts.ArgumentError, match=r"missing \['model.layers.2."):
        models.from_pretrained(folder)


def test_the_docs_example_runs(monkeypatch, capsys):
    """docs/models.md's example, as written, from the repository's root."""
    import re
    text = (HF.parents[2] / "docs" / "models.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(HF.parents[2])
    exec(compile(code, "docs/models.md", "exec"), {})
    out = capsys.readouterr().out
    assert "<llama from test/fixtures/hf/llama: 2 layers" in out
    assert "'model.embed_tokens.weight'" in out


@pytest.mark.parametrize("name", ["llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt2_exact_gelu"])
def test_greedy_generation_equals_transformers_token_for_token(name):
    """With a KV cache: the prompt's prefill, then one decode step per token,
    compiled once, writing each layer's cache at a run-time index."""
    m = models.from_pretrained(HF / name)
    ref = np.load(HF / name / "reference.npz")
    out = m.generate(ref["input_ids"], max_new_tokens=8, attention_mask=ref["attention_mask"])
    np.testing.assert_array_equal(out, ref["generated"])
    prefill, decode = m._decoding()
    assert len(prefill._bundles) == 1 and len(decode._bundles) == 1
    program = (decode._bundles[decode._last_key] / "program.json").read_text()
    layers = len([n for n in m.params if n.endswith(("k_proj.weight", "c_attn.weight"))])
    assert program.count('"dynamic_update_slice"') == 2 * layers      # each layer's k and v


def test_generation_stops_when_every_row_has_emitted_a_stop_token():
    m = models.from_pretrained(HF / "llama")
    ref = np.load(HF / "llama" / "reference.npz")
    length = ref["input_ids"].shape[1]
    first = ref["generated"][:, length]               # each row's first new token
    m.eos_token_ids = (int(first[0]),)
    out = m.generate(ref["input_ids"], max_new_tokens=8, attention_mask=ref["attention_mask"])
    # row 0 stops at once and repeats its stop token; row 1 runs on
    assert (out[0, length:] == first[0]).all()
    np.testing.assert_array_equal(out[1], ref["generated"][1][:out.shape[1]])
    m.eos_token_ids = tuple(int(t) for t in first)
    out = m.generate(ref["input_ids"], max_new_tokens=8, attention_mask=ref["attention_mask"])
    np.testing.assert_array_equal(out, ref["generated"][:, :length + 1])


@pytest.mark.parametrize("name", ["llama", "gpt2", "mixtral"])
def test_save_pretrained_round_trips_bit_for_bit(tmp_path, name):
    """What save_pretrained writes reads back to the same bits, under the
    tensor names (and so the file layout) transformers wrote: the file's
    tensors are the checkpoint's, byte for byte (Mixtral's fused experts
    split per expert again)."""
    from safetensors.numpy import load_file
    m = models.from_pretrained(HF / name)
    out = m.save_pretrained(tmp_path / "out")
    again = models.from_pretrained(out)
    assert set(again.params) == set(m.params)
    for key, value in m.params.items():
        assert again.params[key].tobytes() == value.tobytes(), key
    written, original = (load_file(str(f / "model.safetensors")) for f in (out, HF / name))
    assert set(written) == set(original)
    for key, value in original.items():
        assert written[key].tobytes() == value.tobytes(), key
    assert json.loads((out / "config.json").read_text()) == \
        json.loads((HF / name / "config.json").read_text())


def test_a_bf16_checkpoint_is_read_exactly_and_written_back_in_bf16(tmp_path):
    """Most published checkpoints are bf16: each value is read as the
    float32 it is, the model computes on them as on a float32 checkpoint of
    the same values, and save_pretrained writes bf16 again, the same bytes
    (and config dtype bfloat16); a quantized tensor is an error naming it."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
    folder = _copy(tmp_path, "llama")
    weights = load_file(str(folder / "model.safetensors"))
    save_file({k: v.astype(ts.bf16) for k, v in weights.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((folder / "config.json").read_text())
    raw["dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(raw))
    m = models.from_pretrained(folder)
    for k, v in weights.items():
        if k in m.params:
            assert m.params[k].dtype == np.float32
            np.testing.assert_array_equal(m.params[k], v.astype(ts.bf16).astype(np.float32))
    assert set(m.stored_dtypes.values()) == {"BF16"}
    ref = np.load(HF / "llama" / "reference.npz")
    rounded = models.from_pretrained(HF / "llama")
    rounded.params = dict(m.params)
    np.testing.assert_array_equal(m(ref["input_ids"], attention_mask=ref["attention_mask"]),
                                  rounded(ref["input_ids"], attention_mask=ref["attention_mask"]))
    out = m.save_pretrained(tmp_path / "out")
    with safe_open(str(out / "model.safetensors"), framework="np") as f, \
            safe_open(str(folder / "model.safetensors"), framework="np") as g:
        for k in f.keys():
            assert f.get_slice(k).get_dtype() == "BF16"
            assert f.get_tensor(k).tobytes() == g.get_tensor(k).tobytes(), k
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    save_file({k: (v * 100).astype(np.int8) for k, v in weights.items()},
              str(folder / "model.safetensors"))
    with pytest.raises(ts.ArgumentError, match=r"is stored as I8; Tessera reads F32, BF16, F16"):
        models.from_pretrained(folder)


@pytest.mark.parametrize("name", ["llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt2_exact_gelu"])
def test_loss_and_every_gradient_match_transformers(name):
    """HF's causal-LM loss (labels shifted by one, padding -100, mean over
    the rest) and its gradient for every parameter, against the fixture's
    (torch autograd in float32)."""
    m = models.from_pretrained(HF / name)
    ref = np.load(HF / name / "reference.npz")
    targets = ref["labels"][:, 1:]

    @ts.jit
    def loss_and_grads(params, ids, mask, targets):
        logits = m.forward(params, ids, mask)
        loss = op.cross_entropy(logits[:, :-1], targets)
        return loss, ts.grad(loss, params)
    loss, grads = loss_and_grads(m.params, ref["input_ids"], ref["attention_mask"], targets)
    np.testing.assert_allclose(loss, ref["loss"], rtol=1e-6)
    hf = {k[len("grad."):]: ref[k] for k in ref.files if k.startswith("grad.")}
    assert set(grads) == set(m.params)
    # (under the checkpoint's names, as the fixture holds them: Mixtral's
    # fused experts split per expert)
    grads = m.to_checkpoint(grads)
    assert set(hf) == set(grads)
    for key, g in grads.items():
        np.testing.assert_allclose(g, hf[key], rtol=1e-4, atol=2e-6, err_msg=key)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    m = models.from_pretrained(HF / "llama")
    ref = np.load(HF / "llama" / "reference.npz")
    args = dict(max_new_tokens=8, attention_mask=ref["attention_mask"])
    m.eos_token_ids = ()
    first = m.generate(ref["input_ids"], temperature=1.3, seed=5, **args)
    assert np.array_equal(first, m.generate(ref["input_ids"], temperature=1.3, seed=5, **args))
    assert any(not np.array_equal(first, m.generate(ref["input_ids"], temperature=1.3, seed=s,
                                                    **args)) for s in (6, 7, 8))
    greedy = m.generate(ref["input_ids"], **args)
    assert np.array_equal(greedy, m.generate(ref["input_ids"], temperature=0.7, top_k=1,
                                             seed=1, **args))


def test_sample_draws_from_the_tempered_top_k_top_p_distribution():
    """The sampler against its distribution on fixed logits: 40,000 draws per
    setting, every token's frequency within 4 standard errors of
    softmax(logits / T) cut to the top k, then to the top-p mass."""
    from tessera.pretrained import sample
    rng = np.random.default_rng()
    logits = rng.standard_normal((1, 12)) * 2
    for temperature, top_k, top_p in ((1.0, None, None), (0.5, 5, None), (2.0, None, 0.6),
                                      (1.5, 8, 0.8)):
        z = logits[0] / temperature
        if top_k is not None:
            z = np.where(z < np.sort(z)[-top_k], -np.inf, z)
        p = np.exp(z - z.max())
        p /= p.sum()
        if top_p is not None:
            order = np.argsort(-p)
            keep = np.zeros(12, bool)
            keep[order[(np.cumsum(p[order]) - p[order]) < top_p]] = True
            p = np.where(keep, p, 0)
            p /= p.sum()
        n = 40000
        draws = sample(np.repeat(logits, n, 0), temperature, top_k, top_p, rng)
        freq = np.bincount(draws, minlength=12) / n
        assert not freq[p == 0].any(), (temperature, top_k, top_p)
        assert (np.abs(freq - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-12).all(), \
            (temperature, top_k, top_p, freq, p)


@pytest.mark.parametrize("kwargs,names", [
    (dict(top_k=3), "top_k=3 samples: pass temperature="),
    (dict(temperature=0), "temperature=0 must be a number > 0"),
    (dict(temperature=1.0, top_k=0), "top_k=0 must be an int >= 1"),
    (dict(temperature=1.0, top_p=1.5), "top_p=1.5 must be in (0, 1]"),
])
def test_sampling_misuses_are_errors_naming_the_argument(kwargs, names):
    m = models.from_pretrained(HF / "llama")
    with pytest.raises(ts.ArgumentError, match=re.escape(names) + ".*test_pretrained.py"):
        m.generate(np.zeros((1, 3), np.int32), max_new_tokens=2, **kwargs)


@pytest.mark.parametrize("name", ["llama", "mistral", "mixtral", "gpt2"])
def test_twenty_adamw_steps_follow_transformers_loss_curve(name):
    """ts.optim.AdamW with torch.optim.AdamW's hyperparameters, 20 steps on
    the fixture's batch from its weights: the loss before every step against
    the one torch computed (test/fixtures/make_hf_fixtures.py ADAMW)."""
    m = models.from_pretrained(HF / name)
    ref = np.load(HF / name / "reference.npz")
    opt = ts.optim.AdamW(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    @ts.jit
    def step(params, state, ids, mask, targets):
        loss = op.cross_entropy(m.forward(params, ids, mask)[:, :-1], targets)
        params, state = opt.update(params, ts.grad(loss, params), state)
        return loss, params, state
    params, state, losses = m.params, opt.init(m.params), []
    for _ in range(len(ref["adamw_losses"])):
        loss, params, state = step(params, state, ref["input_ids"], ref["attention_mask"],
                                   ref["labels"][:, 1:])
        losses.append(float(loss))
    np.testing.assert_allclose(losses, ref["adamw_losses"], rtol=2e-5)
