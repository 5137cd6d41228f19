"""Critic construction: a head on the shared trunk, or a separate copy of the policy."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_agents.models import ModelConfig, Transformer
from jaxrl_agents.models.value import build_actor_critic

CFG = ModelConfig(vocab_size=31, hidden_size=16, intermediate_size=32, num_layers=1,
                  num_heads=2, num_kv_heads=1, head_dim=8)
IDS = jnp.array([[3, 4, 5, 0], [6, 7, 8, 9]], jnp.int32)
MASK = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1]], jnp.int32)


def _with_random_head(kind):
    ac = build_actor_critic(Transformer(CFG, rngs=nnx.Rngs(0)), kind)
    ac.critic.head.weight[...] = jnp.linspace(-1.0, 1.0, CFG.hidden_size)
    return ac


@pytest.mark.parametrize("kind", ["head", "detached", "separate"])
def test_values_shape_and_joint_call(kind):
    ac = _with_random_head(kind)
    values = ac.values(IDS, attention_mask=MASK)
    assert values.shape == (2, 4) and values.dtype == jnp.float32
    logits, joint_values = ac.logits_and_values(IDS, attention_mask=MASK)
    np.testing.assert_allclose(joint_values, values, atol=1e-6)
    np.testing.assert_allclose(logits, ac(IDS, attention_mask=MASK), atol=1e-6)


def test_separate_critic_starts_from_policy_weights_and_is_its_own():
    ac = _with_random_head("separate")
    assert ac.critic.trunk is not ac.policy
    np.testing.assert_array_equal(ac.critic.trunk.embed_tokens[...], ac.policy.embed_tokens[...])
    grads = nnx.grad(lambda m: m.values(IDS, attention_mask=MASK).sum())(ac)
    assert float(jnp.abs(grads["critic"]["trunk"]["embed_tokens"][...]).sum()) > 0
    assert "policy" not in grads or not jnp.abs(grads["policy"]["embed_tokens"][...]).sum()


def test_head_critic_shares_the_policy_trunk():
    ac = _with_random_head("head")
    assert ac.critic.trunk is ac.policy
    n_separate = len(nnx.to_flat_state(nnx.state(_with_random_head("separate"), nnx.Param)))
    n_head = len(nnx.to_flat_state(nnx.state(ac, nnx.Param)))
    assert n_head < n_separate  # the trunk is stored once


def test_detached_head_reads_the_trunk_but_does_not_train_it():
    shared, detached = _with_random_head("head"), _with_random_head("detached")
    assert detached.critic.trunk is detached.policy
    np.testing.assert_allclose(detached.values(IDS, attention_mask=MASK),
                               shared.values(IDS, attention_mask=MASK), atol=1e-6)

    def value_grads(ac):
        return nnx.grad(lambda m: m.logits_and_values(IDS, attention_mask=MASK)[1].sum())(ac)

    for ac, trunk_moves in ((shared, True), (detached, False)):
        grads = value_grads(ac)
        trunk = grads["policy"] if "policy" in grads else grads["critic"]["trunk"]
        assert (float(jnp.abs(trunk["embed_tokens"][...]).sum()) > 0) == trunk_moves
        assert float(jnp.abs(grads["critic"]["head"]["weight"][...]).sum()) > 0


def test_unknown_kind_lists_the_allowed():
    with pytest.raises(ValueError, match="'head', 'detached', 'separate'"):
        build_actor_critic(Transformer(CFG, rngs=nnx.Rngs(0)), "shared")
