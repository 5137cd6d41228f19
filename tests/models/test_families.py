"""Qwen3 (per-head q/k RMSNorm, explicit head_dim) and Llama 3.x (scaled RoPE) against
transformers' PyTorch models: logits, export round trip, greedy generation, bad configs."""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers

from jaxrl_agents.models import ModelConfig, RopeScaling, Transformer, hf_io
from jaxrl_agents.models.transformer import default_positions, llama3_inv_freq, rope_inv_freq
from jaxrl_agents.rollout import generate
from tests.models.hf_helpers import LLAMA3_ROPE, make_hf_model, padded_batch, torch_logits

# head_dim 12 != hidden 32 / heads 4: Qwen3's explicit head_dim must be honoured.
QWEN3 = dict(arch="qwen3", heads=4, kv_heads=2, head_dim=12)
LLAMA3 = dict(arch="llama", heads=4, kv_heads=2, theta=10000.0, rope_scaling=LLAMA3_ROPE)
# Long enough that positions reach the scaled low-frequency band (wavelength > 16).
LENGTH = 48
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [3, 4, 5, 6, 7, 8, 9, 10, 11, 40, 41]]
MAX_NEW = 12


def _max_diff_on_real_tokens(ours, theirs, mask):
    real = mask.astype(bool)
    return float(np.max(np.abs(np.asarray(ours)[real] - theirs[real])))


def _batch(vocab, seed=0):
    ids, mask = padded_batch(vocab, seed=seed, length=LENGTH)
    return ids, mask, default_positions(mask)


CASES = {
    "qwen3-tied": dict(QWEN3, tie=True),
    "qwen3-untied-mqa": dict(QWEN3, tie=False, kv_heads=1, theta=1e6),
    "llama3-rope": dict(LLAMA3, tie=False),
    "llama3-rope-tied-gqa": dict(LLAMA3, tie=True, heads=8, kv_heads=2, head_dim=8, theta=5e5),
    "qwen3-llama3-rope": dict(QWEN3, tie=False, rope_scaling=LLAMA3_ROPE),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_logits_match_transformers(hf_checkpoint, case):
    path, torch_model = hf_checkpoint(**case)
    model, config = hf_io.load(path, dtype="float32")
    assert config.qk_norm == (case["arch"] == "qwen3") and not (
        config.qk_norm and config.qkv_bias)
    assert config.head_dim == case.get("head_dim", 32 // case["heads"])
    scaled = case.get("rope_scaling") is not None
    assert (config.rope_scaling is not None) == scaled
    ids, mask, positions = _batch(config.vocab_size)
    theirs = torch_logits(torch_model, ids, mask, positions)
    assert _max_diff_on_real_tokens(model(ids, positions, mask), theirs, mask) <= 1e-4


def test_llama3_scaling_matters_in_the_test(hf_checkpoint):
    """Without the scaling the logits differ clearly: the parity test above is sensitive."""
    path, torch_model = hf_checkpoint(**LLAMA3)
    model, config = hf_io.load(path, rope_scaling=None)
    ids, mask, positions = _batch(config.vocab_size)
    theirs = torch_logits(torch_model, ids, mask, positions)
    assert _max_diff_on_real_tokens(model(ids, positions, mask), theirs, mask) > 1e-2


@pytest.mark.parametrize("head_dim,theta,scaling", [
    (128, 5e5, RopeScaling(8.0, 1.0, 4.0, 8192)),  # Llama 3.1 8B
    (64, 5e5, RopeScaling(32.0, 1.0, 4.0, 8192)),  # Llama 3.2 1B
    (8, 1e4, RopeScaling(**{k: v for k, v in LLAMA3_ROPE.items() if k != "rope_type"})),
])
def test_llama3_inv_freq_equals_transformers(head_dim, theta, scaling):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.LlamaConfig(head_dim=head_dim, rope_parameters={
        **scaling.to_hf(), "rope_theta": theta})
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    ours = llama3_inv_freq(rope_inv_freq(head_dim, theta), scaling.factor,
                           scaling.low_freq_factor, scaling.high_freq_factor,
                           scaling.original_max_position_embeddings)
    assert attention_factor == 1.0
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), rtol=1e-6)


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("name", ["qwen3-untied-mqa", "llama3-rope-tied-gqa"])
def test_export_round_trip(hf_checkpoint, tmp_path, name, scan):
    case = CASES[name]
    path, _ = hf_checkpoint(**case)
    model, config = hf_io.load(path, scan_layers=scan)
    out = hf_io.save(model, config, str(tmp_path / "export"))
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    if case["arch"] == "qwen3":
        assert written["architectures"] == ["Qwen3ForCausalLM"]
        assert written["model_type"] == "qwen3" and written["attention_bias"] is False
    else:
        assert written["rope_parameters"] == {**LLAMA3_ROPE, "rope_theta": case["theta"]}
    assert hf_io.read_config(out, scan_layers=scan) == config
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == config.architecture
    ids, mask, positions = _batch(config.vocab_size, seed=2)
    theirs = torch_logits(reloaded, ids, mask, positions)
    assert _max_diff_on_real_tokens(model(ids, positions, mask), theirs, mask) <= 1e-4


# ----------------------------------------------------------------------------- generation


def _transformers_greedy(torch_model, prompts, max_new):
    longest = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # transformers wants left padding for generation
        ids[i, longest - len(p):], mask[i, longest - len(p):] = torch.tensor(p), 1
    torch_model.generation_config.eos_token_id = None
    torch_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = torch_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                                   do_sample=False)
    return out[:, longest:].tolist()


def _teacher_forced_greedy(model: Transformer, prompts, max_new):
    """Greedy decoding by full forward passes (no KV cache): prompts left-padded, then
    slots for the new tokens, which the mask reveals one step at a time."""
    longest = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), longest + max_new), np.int32)
    mask = np.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):longest], mask[i, longest - len(p):longest] = p, 1
    forward = jax.jit(lambda ids, mask: model(ids, attention_mask=mask))
    for step in range(max_new):
        last = longest + step - 1
        ids[:, last + 1] = np.asarray(forward(ids, mask))[:, last].argmax(-1)
        mask[:, last + 1] = 1
    return ids[:, longest:].tolist()


@pytest.fixture(scope="module", params=["qwen3-untied-mqa", "llama3-rope"])
def family(request, tmp_path_factory):
    """(our model loaded through hf_io, the torch model) of one family, same weights."""
    case = {**CASES[request.param], "seed": 1}
    torch_model = make_hf_model(case.pop("arch"), **case)
    path = str(tmp_path_factory.mktemp(request.param))
    torch_model.save_pretrained(path)
    model, _ = hf_io.load(path)
    return model, torch_model


def test_teacher_forced_greedy_equals_transformers_generate(family):
    model, torch_model = family
    theirs = _transformers_greedy(torch_model, PROMPTS, MAX_NEW)
    assert _teacher_forced_greedy(model, PROMPTS, MAX_NEW) == theirs
    assert len({tuple(t) for t in theirs}) == len(PROMPTS)  # not a degenerate model


def test_sampler_greedy_equals_transformers_generate(family):
    model, torch_model = family
    ours = generate(model, PROMPTS, MAX_NEW).tokens
    assert ours == _transformers_greedy(torch_model, PROMPTS, MAX_NEW)


# ----------------------------------------------------------------------------- configs


def _qwen3_hf(**changes):
    hf = transformers.Qwen3Config(vocab_size=97, hidden_size=32, intermediate_size=72,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=12).to_dict()
    hf["architectures"] = ["Qwen3ForCausalLM"]
    hf.update(changes)
    return hf


def _llama3_hf(**changes):
    hf = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=72,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  rope_parameters={**LLAMA3_ROPE, "rope_theta": 5e5}).to_dict()
    hf["architectures"] = ["LlamaForCausalLM"]
    hf.update(changes)
    return hf


def test_qwen3_config_from_transformers():
    cfg = ModelConfig.from_hf(_qwen3_hf())
    assert cfg.qk_norm and not cfg.qkv_bias and cfg.head_dim == 12
    assert cfg.architecture == "Qwen3ForCausalLM" and cfg.rope_scaling is None
    assert cfg.to_hf()["model_type"] == "qwen3"


def test_llama3_config_forms():
    """transformers 5 `rope_parameters` and the older `rope_theta` + `rope_scaling` (with
    `type` or `rope_type`) give the same config; it is hashable (a static jit argument)."""
    new = ModelConfig.from_hf(_llama3_hf())
    old_hf = _llama3_hf(rope_theta=5e5, rope_scaling={
        **{k: v for k, v in LLAMA3_ROPE.items() if k != "rope_type"}, "type": "llama3"})
    del old_hf["rope_parameters"]
    assert ModelConfig.from_hf(old_hf) == new
    assert new.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 16) and new.rope_theta == 5e5
    assert hash(new) == hash(ModelConfig.from_hf(new.to_hf()))
    assert ModelConfig.from_hf(new.to_hf()) == new
    from_section = ModelConfig.from_config(dict(rope_scaling=dict(LLAMA3_ROPE)))
    assert from_section.rope_scaling == new.rope_scaling


def test_llama3_original_length_defaults_like_transformers():
    hf = _llama3_hf(max_position_embeddings=96)
    del hf["rope_parameters"]["original_max_position_embeddings"]
    assert ModelConfig.from_hf(hf).rope_scaling.original_max_position_embeddings == 96


@pytest.mark.parametrize("hf,match", [
    (_qwen3_hf(attention_bias=True), "attention_bias"),
    (_qwen3_hf(use_sliding_window=True, sliding_window=8), "use_sliding_window"),
    (_qwen3_hf(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    (_qwen3_hf(hidden_act="gelu"), "hidden_act"),
    (_llama3_hf(mlp_bias=True), "mlp_bias"),
    (_llama3_hf(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
     r"rope_type='yarn'.*allowed: \['default', 'llama3'\]"),
    (_llama3_hf(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}),
     r"low_freq_factor"),
    (_llama3_hf(rope_parameters={**LLAMA3_ROPE, "rope_theta": 1e4, "mrope_section": [2]}),
     "mrope_section"),
    (_llama3_hf(rope_parameters={**LLAMA3_ROPE, "rope_theta": 1e4,
                                 "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    (_llama3_hf(architectures=["Qwen3MoeForCausalLM"]), "Qwen3MoeForCausalLM"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_unsupported_settings_are_named(hf, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(hf)


def test_qk_norm_with_qkv_bias_is_rejected():
    with pytest.raises(ValueError, match="qk_norm"):
        ModelConfig(qk_norm=True, qkv_bias=True)
