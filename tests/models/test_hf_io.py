"""Checkpoint import against transformers' PyTorch models, export round trip, bad inputs."""

import json
import os

import numpy as np
import pytest
import transformers

from jaxrl_agents.models import hf_io
from jaxrl_agents.models.transformer import default_positions
from tests.models.hf_helpers import padded_batch, torch_logits

CASES = [
    dict(arch="qwen2", tie=True, heads=4, kv_heads=2, theta=10000.0),
    dict(arch="qwen2", tie=False, heads=4, kv_heads=1, theta=1e6),
    dict(arch="llama", tie=False, heads=4, kv_heads=4, theta=10000.0),
    dict(arch="llama", tie=True, heads=8, kv_heads=2, theta=5e5, head_dim=8),
]


def _max_diff_on_real_tokens(ours, theirs, mask):
    real = mask.astype(bool)
    return float(np.max(np.abs(np.asarray(ours)[real] - theirs[real])))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_logits_match_transformers(hf_checkpoint, case):
    path, torch_model = hf_checkpoint(**case)
    model, config = hf_io.load(path, dtype="float32")
    assert config.qkv_bias == (case["arch"] == "qwen2")
    assert config.tie_embeddings == case["tie"] and config.rope_theta == case["theta"]
    ids, mask = padded_batch(config.vocab_size)
    positions = default_positions(mask)
    ours = model(ids, positions, mask)
    assert ours.shape == (*ids.shape, config.vocab_size)
    theirs = torch_logits(torch_model, ids, mask, positions)
    assert _max_diff_on_real_tokens(ours, theirs, mask) <= 1e-4


def test_sharded_index_and_scan_layers(hf_checkpoint):
    path, torch_model = hf_checkpoint("llama", tie=False, max_shard_size="20KB")
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
    model, _ = hf_io.load(path, scan_layers=True)
    ids, mask = padded_batch(97, seed=1)
    positions = default_positions(mask)
    theirs = torch_logits(torch_model, ids, mask, positions)
    assert _max_diff_on_real_tokens(model(ids, positions, mask), theirs, mask) <= 1e-4


def test_old_config_form_with_rope_theta(hf_checkpoint):
    path, _ = hf_checkpoint("qwen2", theta=123456.0)
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    hf.pop("rope_parameters", None)
    hf["rope_theta"] = 123456.0
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f)
    assert hf_io.read_config(path).rope_theta == 123456.0


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("arch,tie", [("qwen2", True), ("llama", False)])
def test_export_round_trip(hf_checkpoint, tmp_path, arch, tie, scan):
    path, _ = hf_checkpoint(arch, tie=tie)
    model, config = hf_io.load(path, scan_layers=scan)
    out = hf_io.save(model, config, str(tmp_path / "export"))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids, mask = padded_batch(config.vocab_size, seed=2)
    positions = default_positions(mask)
    theirs = torch_logits(reloaded, ids, mask, positions)
    assert _max_diff_on_real_tokens(model(ids, positions, mask), theirs, mask) <= 1e-4


def test_unsupported_architecture_is_named(hf_checkpoint):
    path, _ = hf_checkpoint("qwen2")
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        hf = json.load(f)
    hf["architectures"] = ["GPT2LMHeadModel"]
    with open(cfg_path, "w") as f:
        json.dump(hf, f)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        hf_io.load(path)


def _rewrite_tensors(path, edit):
    from safetensors.numpy import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def test_missing_tensor_is_named(hf_checkpoint):
    path, _ = hf_checkpoint("qwen2")
    _rewrite_tensors(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        hf_io.load(path)


def test_shape_mismatch_is_named(hf_checkpoint):
    path, _ = hf_checkpoint("qwen2")

    def shrink(t):
        name = "model.layers.0.self_attn.k_proj.weight"
        t[name] = t[name][:-1]

    _rewrite_tensors(path, shrink)
    with pytest.raises(ValueError, match=r"self_attn\.k_proj\.weight.*shape"):
        hf_io.load(path)


def test_offline_hub_id_gives_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="could not be downloaded"):
        hf_io.load("no-such-org/no-such-model-xyz")
