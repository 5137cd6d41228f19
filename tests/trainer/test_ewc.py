"""EWC: the diagonal Fisher against per-episode gradients, the penalty's value, and the
learner holding consolidated parameters near their anchor."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_agents.trainer import ewc
from jaxrl_agents.trainer.rl import RLHyper, RLLearner, episode_logprobs
from jaxrl_agents.trainer.rl_batch import on_device
from tests.trainer.helpers import random_batch, tiny_actor_critic


def test_diagonal_fisher_is_the_mean_squared_episode_gradient():
    ac = tiny_actor_critic()
    graphdef, params = nnx.split(ac)
    batch = random_batch(0)
    batch.row_valid[-1] = 0.0  # a filler row does not count
    arrays = on_device(batch)
    hp = RLHyper.defaults()
    logp_fn = lambda p, rows: episode_logprobs(graphdef, p, rows, hp)  # noqa: E731
    fisher = jax.jit(ewc.diagonal_fisher, static_argnums=0)(logp_fn, params, arrays)
    rows = [i for i in range(batch.shape[0]) if batch.row_valid[i]]
    grads = [jax.grad(lambda p, i=i: logp_fn(p, jax.tree.map(lambda v: v[i:i + 1], arrays))[0])(
        params) for i in rows]
    want = jax.tree.map(lambda *g: np.mean([np.square(np.asarray(x, np.float64)) for x in g], 0),
                        *grads)
    for got, ref in zip(jax.tree.leaves(fisher), jax.tree.leaves(want)):
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=1e-10)
    assert sum(float(jnp.sum(x)) for x in jax.tree.leaves(fisher)) > 0


def test_penalty_and_merge():
    params = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([[3.0]])}
    anchor = {"a": jnp.array([0.0, 2.0]), "b": jnp.array([[1.0]])}
    fisher = {"a": jnp.array([2.0, 5.0]), "b": jnp.array([[0.5]])}
    assert float(ewc.penalty(params, anchor, fisher)) == pytest.approx(0.5 * (2 * 1 + 0.5 * 4))
    merged = ewc.merge(fisher, fisher, 0.5)
    np.testing.assert_allclose(merged["a"], [3.0, 7.5])


def _distance(a, b):
    return sum(float(jnp.sum(jnp.square(x - y))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_consolidated_parameters_stay_near_their_anchor():
    """Same batches, same seed: with a large EWC weight the policy moves far less from the
    consolidated parameters than with a negligible one."""
    results = {}
    for coef in (1e-12, 1e4):
        ac = tiny_actor_critic()
        hp = RLHyper.defaults(estimator="gae", ewc_coef=coef)
        learner = RLLearner(ac, hp, optax.adam(3e-3), ppo_epochs=1, minibatch_size=8)
        state = learner.init_state(ac)
        assert state.ewc_fisher is not None and state.ewc_anchor is not None
        state = learner.consolidate(state, random_batch(0))
        anchor = jax.tree.map(jnp.copy, state.ewc_anchor)
        assert _distance(anchor, state.params) == 0.0
        for i in range(4):
            state, metrics = learner.update(state, random_batch(1), jax.random.key(i))
        assert "losses/ewc" in metrics and np.isfinite(metrics["losses/total"])
        results[coef] = _distance(anchor, state.params)
    assert results[1e4] < 0.5 * results[1e-12], results


def test_consolidate_needs_ewc_on():
    ac = tiny_actor_critic()
    learner = RLLearner(ac, RLHyper.defaults(estimator="gae"), optax.adam(1e-3))
    state = learner.init_state(ac)
    assert state.ewc_fisher is None
    with pytest.raises(ValueError, match="ewc_coef"):
        learner.consolidate(state, random_batch(0))
