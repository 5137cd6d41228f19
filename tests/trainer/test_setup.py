"""The trainer's actor-critic from a config: one path (`models.build_policy`) for a
Hugging Face checkpoint and for the config's own sizes."""

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_agents.config import load_config
from jaxrl_agents.models import ModelConfig, Transformer, hf_io
from jaxrl_agents.models.transformer import default_positions
from jaxrl_agents.trainer.setup import build_actor_critic_from_config
from tests.models.hf_helpers import make_hf_model, padded_batch, torch_logits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(*overrides):
    return load_config(os.path.join(ROOT, "configs", "base.py"), list(overrides))


def test_checkpoint_through_the_config_honours_the_model_section(tmp_path):
    torch_model = make_hf_model("qwen2", tie=False, layers=3)
    torch_model.save_pretrained(tmp_path / "ckpt")
    path = str(tmp_path / "ckpt")
    cfg = _config(f"model.hf_path={path}", "model.remat=full", "model.scan_layers=True")
    policy = build_actor_critic_from_config(cfg, vocab_size=7).policy
    assert policy.config.remat == "full" and policy.config.scan_layers
    assert policy.config.num_layers == 3 and policy.config.vocab_size == 97  # the checkpoint's
    plain, plain_cfg = hf_io.load(path)
    assert plain_cfg.remat == "none" and not plain_cfg.scan_layers
    ids, mask = padded_batch(plain_cfg.vocab_size)
    positions = default_positions(mask)
    ours, reference = policy(ids, positions, mask), plain(ids, positions, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(reference)[real], atol=1e-5)
    theirs = torch_logits(torch_model, ids, mask, positions)
    np.testing.assert_allclose(np.asarray(ours)[real], theirs[real], atol=1e-4)


def test_checkpoint_parameters_take_the_sections_param_dtype(tmp_path):
    make_hf_model("llama", layers=1).save_pretrained(tmp_path / "ckpt")
    overrides = (f"model.hf_path={tmp_path / 'ckpt'}", "model.dtype=bfloat16")
    for param_dtype in ("float32", "bfloat16"):
        cfg = _config(*overrides, f"model.param_dtype={param_dtype}")
        policy = build_actor_critic_from_config(cfg, vocab_size=7).policy
        assert (policy.config.dtype, policy.config.param_dtype) == ("bfloat16", param_dtype)
        leaves = jax.tree.leaves(nnx.state(policy, nnx.Param))
        assert {x.dtype for x in leaves} == {jnp.dtype(param_dtype)}


def test_fresh_policy_takes_the_tokenizer_vocab_and_the_run_seed():
    cfg = _config("model.num_layers=1", "model.scan_layers=True", "seed=3")
    policy = build_actor_critic_from_config(cfg, vocab_size=40).policy
    expected = ModelConfig.from_config(cfg.model).replace(vocab_size=40)
    assert policy.config == expected
    same = Transformer(expected, rngs=nnx.Rngs(3))
    for a, b in zip(jax.tree.leaves(nnx.state(policy)), jax.tree.leaves(nnx.state(same))):
        np.testing.assert_array_equal(a, b)
