"""Memory options of the RL learner: float32 master weights for bfloat16 parameters,
gradient accumulation, and a checkpoint of a learner state that uses both memory options."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_agents.trainer.optim import actor_critic_adam
from jaxrl_agents.trainer.rl import RLHyper, RLLearner, apply_gradients
from tests.trainer.helpers import random_batch, tiny_actor_critic

BF16_SPACING_AT_ONE = 2.0**-7  # distance from 1.0 to the next bfloat16


def test_steps_below_bf16_resolution_add_up_in_the_master_copy():
    tx = optax.sgd(1.0)
    step = 1e-4  # under half the bfloat16 spacing at 1.0: 1.0 - 1e-4 rounds back to 1.0
    assert step < BF16_SPACING_AT_ONE / 2
    bf16 = {"w": jnp.ones(4, jnp.bfloat16)}
    plain, opt_plain = bf16, tx.init(bf16)
    params, master = bf16, {"w": jnp.ones(4, jnp.float32)}
    opt = tx.init(master)
    for _ in range(100):
        plain, _, opt_plain = apply_gradients(
            tx, {"w": jnp.full(4, step, jnp.bfloat16)}, opt_plain, plain
        )
        params, master, opt = apply_gradients(
            tx, {"w": jnp.full(4, step, jnp.float32)}, opt, params, master
        )
    np.testing.assert_array_equal(np.asarray(plain["w"], np.float32), 1.0)  # lost in bf16
    np.testing.assert_allclose(master["w"], 1.0 - 100 * step, rtol=1e-5)  # 0.99
    assert params["w"].dtype == jnp.bfloat16 and master["w"].dtype == jnp.float32
    np.testing.assert_array_equal(params["w"], master["w"].astype(jnp.bfloat16))
    assert float(params["w"][0]) < 1.0


def _bf16_actor_critic():
    ac = tiny_actor_critic()
    nnx.update(ac, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(ac)))
    return ac


def _large_entries(tree):
    """Concatenated entries of magnitude > 0.01 (their bf16 spacing is > 6e-5)."""
    flat = np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(tree)])
    return flat[np.abs(flat) > 0.01]


@pytest.mark.parametrize("master", [False, True])
def test_learner_with_bf16_params_and_master_weights(master):
    ac = _bf16_actor_critic()
    learner = RLLearner(ac, RLHyper.defaults(estimator="gae"), optax.sgd(1e-5),
                        master_weights=master)
    state = learner.init_state(ac)
    assert (state.master is not None) == master
    before = _large_entries(state.params)
    batch = random_batch(0)
    for i in range(3):
        state, metrics = learner.update(state, batch, jax.random.key(i))
        assert np.isfinite(metrics["losses/total"]) and metrics["losses/skipped"] == 0
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(state.params))
    # lr * grad is far below the bf16 spacing of these entries: in bf16 they never move
    np.testing.assert_array_equal(_large_entries(state.params), before)
    if master:
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.master))
        moved = _large_entries(state.master) - before
        assert np.mean(moved != 0) > 0.5, np.mean(moved != 0)
        for p, m in zip(jax.tree.leaves(state.params), jax.tree.leaves(state.master)):
            np.testing.assert_array_equal(p, m.astype(jnp.bfloat16))


def _flat(tree):
    return np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_accumulated_micro_batches_give_the_big_batch_update(loss_agg):
    """SGD (linear in the gradient) over one minibatch of 8 episodes, taken whole or as
    2 or 4 micro-batches (whose action-token counts differ)."""
    ac = tiny_actor_critic()
    hp = RLHyper.defaults(estimator="gae", loss_agg=loss_agg, entropy_coef=0.01, kl_where="loss")
    learner = RLLearner(ac, hp, optax.sgd(0.1), minibatch_size=8)
    batch, start = random_batch(6), _flat(nnx.state(ac))
    steps = {}
    for accum in (1, 2, 4):
        learner.grad_accum = accum
        state, _ = learner.update(learner.init_state(ac), batch, jax.random.key(0))
        steps[accum] = _flat(state.params) - start
    scale = np.abs(steps[1]).max()
    assert scale > 1e-4
    for accum in (2, 4):
        np.testing.assert_allclose(steps[accum], steps[1], atol=1e-4 * scale, err_msg=accum)


def test_checkpoint_round_trip_of_int8_state_and_master_weights(tmp_path):
    from jaxrl_agents.checkpoint import Checkpointer

    ac = _bf16_actor_critic()
    tx = actor_critic_adam(
        optax.constant_schedule(1e-3), optax.constant_schedule(1e-3), state="int8"
    )
    learner = RLLearner(ac, RLHyper.defaults(estimator="gae"), tx, master_weights=True)
    state, _ = learner.update(learner.init_state(ac), random_batch(0), jax.random.key(0))
    saved = jax.tree.map(np.asarray, state)
    ckpt = Checkpointer(str(tmp_path / "ckpt"), keep=1)
    ckpt.save(1, {"learner": state}, {})
    ckpt.wait()
    restored, _ = ckpt.restore(1, template={"learner": learner.init_state(ac)})
    ckpt.close()
    got = restored["learner"]
    assert jax.tree.structure(got) == jax.tree.structure(saved)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(saved)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def _moments(opt_state):
    """Every Adam moment array (mu and nu) of an optax state, Variables unwrapped."""
    found = optax.tree_utils.tree_get_all_with_path(opt_state, "mu")
    found += optax.tree_utils.tree_get_all_with_path(opt_state, "nu")
    return [x for _, tree in found for x in jax.tree.leaves(tree)]


def test_float32_state_keeps_float32_moments_for_bf16_params():
    """rl.optimizer_state=float32 with bfloat16 parameters: moments stay float32 and
    follow float64 Adam, where bfloat16 moments stall (the second moment's increments
    fall under bfloat16's spacing)."""
    from jaxrl_agents.trainer.optim import adam

    b1, b2, steps = 0.9, 0.999, 1000
    rng = np.random.default_rng(0)
    grad = jnp.asarray(rng.uniform(0.5, 2.0, 64) * 1e-2, jnp.bfloat16)
    params = {"w": jnp.ones(64, jnp.bfloat16)}
    tx = adam(optax.constant_schedule(1e-4), state="float32")

    def step(state, _):
        return tx.update({"w": grad}, state, params)[1], None

    state = jax.lax.scan(step, tx.init(params), length=steps)[0]
    mu, nu = (optax.tree_utils.tree_get(state, name)["w"] for name in ("mu", "nu"))
    assert mu.dtype == nu.dtype == jnp.float32
    g = np.asarray(grad, np.float64)
    np.testing.assert_allclose(mu, g * (1 - b1**steps), rtol=1e-5)
    np.testing.assert_allclose(nu, g * g * (1 - b2**steps), rtol=1e-4)
    # what plain optax.adam keeps for these params: a bfloat16 second moment, far off
    plain = optax.adam(1e-4)
    nu_bf16 = jax.lax.scan(
        lambda s, _: (plain.update({"w": grad}, s, params)[1], None),
        plain.init(params),
        length=steps,
    )[0][0].nu["w"]
    assert nu_bf16.dtype == jnp.bfloat16
    assert np.abs(np.asarray(nu_bf16, np.float64) / (g * g * (1 - b2**steps)) - 1).max() > 0.1


def test_learner_float32_state_with_bf16_params():
    ac = _bf16_actor_critic()
    lr = optax.constant_schedule(1e-3)
    tx = actor_critic_adam(lr, lr, max_grad_norm=1.0, state="float32")
    learner = RLLearner(ac, RLHyper.defaults(estimator="gae"), tx)
    state = learner.init_state(ac)
    assert len(_moments(state.opt_state)) == 2 * len(jax.tree.leaves(state.params))
    state, metrics = learner.update(state, random_batch(0), jax.random.key(0))
    assert metrics["losses/skipped"] == 0
    assert all(x.dtype == jnp.float32 for x in _moments(state.opt_state))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(state.params))
