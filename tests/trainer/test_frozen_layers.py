"""rl.frozen_layers: the policy's first layers and the embedding stay fixed in RL, their
output is computed once per update (`prepare`) and the gradient steps run the layers above
(of both trunks when the critic has its own: a separate critic shares the frozen ones).

The split forward equals the whole one; `prepare` gives the same old values, reference
log-probs and advantages either way; a gradient step from the cached output equals one
through the whole model with the frozen gradients zeroed; an update leaves the frozen
parameters bit for bit as they were and moves the rest."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_agents.models import ModelConfig, Transformer, build_actor_critic, lora
from jaxrl_agents.trainer.rl import RLHyper, RLLearner, train_step
from jaxrl_agents.trainer.rl_batch import TrainBatch, on_device
from tests.trainer.helpers import VOCAB, random_batch

LAYERS = 3


def _actor_critic(scan: bool, critic: str = "head", seed: int = 0):
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_layers=LAYERS, num_heads=2, num_kv_heads=1, head_dim=16,
                      scan_layers=scan)
    return build_actor_critic(Transformer(cfg, rngs=nnx.Rngs(seed)), critic,
                              rngs=nnx.Rngs(seed + 1))


def _learner(ac, frozen: int, tx=None, **kw):
    hp = RLHyper.defaults(estimator="gae", entropy_coef=0.01, frozen_layers=frozen)
    return RLLearner(ac, hp, tx or optax.adam(3e-2), ppo_epochs=1, minibatch_size=8, **kw)


def _leaves(state):
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}


@pytest.mark.parametrize("scan", [True, False])
def test_upper_layers_continue_the_lower_ones_exactly(scan):
    model = _actor_critic(scan).policy
    ids = jnp.asarray(np.random.default_rng(0).integers(1, VOCAB, (2, 9)), jnp.int32)
    mask = jnp.ones((2, 9), bool).at[0, :3].set(False)  # left padding in row 0
    whole = model.hidden_states(ids, None, mask)
    for n in range(LAYERS + 1):
        split = model.upper_hidden(model.lower_hidden(ids, None, mask, n), None, mask, n)
        # the same maths; a scan over fewer layers is compiled apart (rounding only)
        np.testing.assert_allclose(np.asarray(split), np.asarray(whole), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scan, critic", [(True, "head"), (False, "head"), (True, "separate")])
def test_prepare_gives_the_same_targets_from_the_cached_lower_layers(scan, critic):
    ac, arrays = _actor_critic(scan, critic), on_device(random_batch(0))
    results = []
    for frozen in (0, 2):
        learner = _learner(ac, frozen)
        prepared, metrics = learner._prepare(learner.init_state(ac), arrays, jnp.float32(0.1), 4)
        results.append((prepared, metrics))
    (plain, m0), (cached, m2) = results
    assert plain.lower_hidden is None and cached.lower_hidden.shape == (
        *arrays.input_ids.shape, 32)
    for field in dataclasses.fields(plain):
        key = field.name
        if key != "lower_hidden":
            np.testing.assert_allclose(getattr(cached, key), getattr(plain, key), rtol=1e-5,
                                       atol=1e-6, err_msg=key)
    for key in m0:
        assert float(m2[key]) == pytest.approx(float(m0[key]), rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("scan, critic", [(True, "head"), (False, "head"), (True, "separate"),
                                          (False, "separate")])
def test_a_step_from_the_cached_output_equals_one_through_the_whole_model(scan, critic):
    ac, arrays = _actor_critic(scan, critic), on_device(random_batch(1))
    learner = _learner(ac, 2, optax.sgd(0.1))  # parameter changes linear in the gradients
    state = learner.init_state(ac)
    prepared, _ = learner._prepare(state, arrays, jnp.float32(0.0), 8)
    rows = TrainBatch(arrays, prepared)
    with_cache = jax.tree.map(lambda v: v[None], rows)  # one micro-batch of all rows
    without = dataclasses.replace(
        with_cache, prepared=dataclasses.replace(with_cache.prepared, lower_hidden=None))
    step = jax.jit(lambda s, m: train_step(learner.hp, learner.graphdef, learner.tx, s, m,
                                           jnp.float32(0.0), jnp.float32(1.0)))
    copy = lambda s: jax.tree.map(jnp.copy, s)  # noqa: E731 (the step donates nothing here)
    a, metrics_a = step(copy(state), with_cache)
    b, metrics_b = step(copy(state), without)
    assert float(metrics_a["losses/total"]) == pytest.approx(float(metrics_b["losses/total"]),
                                                             rel=1e-5)
    la, lb = _leaves(a.params), _leaves(b.params)
    for name in la:
        np.testing.assert_allclose(la[name], lb[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("scan, critic", [(True, "head"), (False, "head"), (True, "separate")])
def test_an_update_keeps_the_frozen_parameters_and_moves_the_rest(scan, critic):
    ac = _actor_critic(scan, critic)
    # The head starts at 0, which sends no gradient into a trunk of its own in a first step.
    ac.critic.head.weight[...] = jnp.full((32,), 0.1)
    learner = _learner(ac, 2)
    before = _leaves(nnx.state(ac))
    state, metrics = learner.update(learner.init_state(ac), random_batch(2), jax.random.key(0))
    assert np.isfinite(metrics["losses/total"])
    after = _leaves(state.params)
    moved = {name for name in before if not np.array_equal(before[name], after[name])}
    for name in before:
        if "embed_tokens" in name:
            assert name not in moved
        elif scan and "blocks" in name:  # stacked [L, ...]: rows 0, 1 frozen, row 2 trains
            np.testing.assert_array_equal(after[name][:2], before[name][:2], err_msg=name)
            # A key bias adds one score to every key of a query: its gradient is 0 up to
            # rounding, which may leave it exactly where it was.
            if "k_bias" not in name:
                assert not np.array_equal(after[name][2], before[name][2]), name
        elif not scan and "/layers/" in name:
            layer = int(name.split("/layers/")[1].split("/")[0])
            assert (name in moved) == (layer == 2), name
    assert any("final_norm" in name for name in moved)
    assert any("head" in name for name in moved)
    if critic == "separate":  # the critic's own upper layers train too
        assert any(name.startswith("critic/trunk/") and "final_norm" in name for name in moved)


@pytest.mark.parametrize("scan", [True, False])
def test_a_separate_critic_takes_the_policys_frozen_layers(scan):
    """After SFT the policy's lower layers differ from the critic's copy: the learner gives
    the critic the policy's, so its values from the cached lower output equal its own whole
    pass, and its upper layers stay its own."""
    ac = _actor_critic(scan, "separate")
    other = _actor_critic(scan, "head", seed=7).policy  # stands in for SFT's changes
    nnx.update(ac.policy, nnx.state(other, nnx.Param))
    before = _leaves(nnx.state(ac.critic.trunk))
    _learner(ac, 2).init_state(ac)
    policy, own = _leaves(nnx.state(ac.policy)), _leaves(nnx.state(ac.critic.trunk))
    for name in own:  # the frozen parts are the policy's, the rest the critic's own
        if "embed_tokens" in name:
            np.testing.assert_array_equal(own[name], policy[name])
        elif scan and "blocks" in name:
            np.testing.assert_array_equal(own[name][:2], policy[name][:2], err_msg=name)
            np.testing.assert_array_equal(own[name][2:], before[name][2:], err_msg=name)
        elif not scan and name.startswith("layers/"):
            layer = int(name.split("/")[1])
            np.testing.assert_array_equal(own[name], (policy if layer < 2 else before)[name])
        else:
            np.testing.assert_array_equal(own[name], before[name], err_msg=name)
    ids = jnp.asarray(np.random.default_rng(3).integers(1, VOCAB, (2, 9)), jnp.int32)
    mask = jnp.ones((2, 9), bool).at[1, :2].set(False)
    lower = ac.policy.lower_hidden(ids, None, mask, 2)
    np.testing.assert_allclose(np.asarray(ac.values_above(lower, 2, None, mask)),
                               np.asarray(ac.values(ids, None, mask)), rtol=1e-5, atol=1e-6)


def test_frozen_layers_the_model_cannot_run_are_refused():
    with pytest.raises(ValueError, match="below the model's 3 layers"):
        _learner(_actor_critic(True), LAYERS)
    ac = _actor_critic(True)
    lora.attach(ac.policy, lora.LoRAConfig(rank=2, alpha=4.0), rngs=nnx.Rngs(3))
    with pytest.raises(ValueError, match="model.lora"):
        _learner(ac, 1)
