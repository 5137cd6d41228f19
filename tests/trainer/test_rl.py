import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_agents.trainer.kl_control import KLController
from jaxrl_agents.trainer.rl import RLHyper, RLLearner
from jaxrl_agents.trainer.rl_batch import TrainBatch, on_device
from tests.trainer.helpers import VOCAB, learning_metrics, random_batch, tiny_actor_critic


def _learner(estimator, critic="head", **kw):
    ac = tiny_actor_critic(critic=critic)
    hp = RLHyper.defaults(estimator=estimator, entropy_coef=0.01, kl_where="loss")
    learner = RLLearner(ac, hp, optax.adam(3e-3), ppo_epochs=1, minibatch_size=8, **kw)
    return learner, learner.init_state(ac)


@pytest.mark.parametrize(
    "estimator", ["gae", "turn_gae", "bilevel_gae", "rloo", "grpo", "reinforce_pp"]
)
def test_each_estimator_lowers_its_loss_on_a_fixed_batch(estimator):
    learner, state = _learner(estimator)
    batch = random_batch(0)
    key = jax.random.key(0)
    losses = []
    for i in range(6):
        state, metrics = learner.update(state, batch, jax.random.fold_in(key, i))
        losses.append(metrics["losses/total"])
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0], losses


def test_separate_critic_and_grad_accumulation_run():
    learner, state = _learner("gae", critic="separate", grad_accum=2)
    batch = random_batch(1)
    state, metrics = learner.update(state, batch, jax.random.key(1))
    assert np.isfinite(metrics["losses/value"]) and metrics["losses/skipped"] == 0


def test_first_ratio_is_one_when_logprobs_match_the_policy():
    learner, state = _learner("gae")
    batch = random_batch(2)
    # Replace the sampling log-probs with the policy's own.
    prepared, _ = learner._prepare(state, on_device(batch), jnp.float32(0.0))
    batch.old_logprobs = np.asarray(prepared.ref_logprobs) * batch.action_mask
    learner.ppo_epochs = 1
    learner.minibatch_size = batch.shape[0]
    _, metrics = learner.update(state, batch, jax.random.key(0))
    assert metrics["losses/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["losses/clip_frac"] == 0.0
    assert metrics["kl/ref_kl"] == pytest.approx(0.0, abs=1e-6)


def test_non_finite_loss_skips_the_update_and_keeps_parameters():
    learner, state = _learner("gae")
    batch = random_batch(3)
    batch.rewards[0, :] = np.nan
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = learner.update(state, batch, jax.random.key(0))
    after = jax.tree.map(np.asarray, state.params)
    assert metrics["losses/skipped"] >= 1 and int(state.skipped) >= 1
    for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)


def _moved(before, after) -> set[str]:
    """Names of the parameters that differ between two ActorCritic states."""
    flat = lambda tree: {jax.tree_util.keystr(p): np.asarray(v) for p, v in
                         jax.tree_util.tree_flatten_with_path(tree)[0]}
    b, a = flat(before), flat(after)
    return {name for name in b if not np.array_equal(b[name], a[name])}


@pytest.mark.parametrize("critic", ["head", "detached", "separate"])
def test_value_warmup_trains_only_the_critic(critic):
    # The shared trunk belongs to the policy: the warm-up must not move it either.
    # Two warm-up updates: the head starts at zero, so the first step sends the trunk no
    # gradient whatever the code does.
    learner, state = _learner("gae", critic=critic, value_warmup_updates=2)
    batch = random_batch(4)
    policy_before = jax.tree.map(np.asarray, state.params)
    for i in range(2):
        state, metrics = learner.update(state, batch, jax.random.key(i))
    assert np.isfinite(metrics["losses/value"])
    # NNX may list a shared trunk under critic/trunk: only the head is the critic's then.
    critic_prefix = "['critic']" if critic == "separate" else "['critic']['head']"
    moved = _moved(policy_before, state.params)
    assert moved and all(name.startswith(critic_prefix) for name in moved), moved
    after_warmup = jax.tree.map(np.asarray, state.params)
    state, _ = learner.update(state, batch, jax.random.key(2))
    assert any(not n.startswith(critic_prefix) for n in _moved(after_warmup, state.params))


def test_kl_controllers():
    warm = KLController("warmup", coef=0.1, warmup_start=0.01, warmup_updates=4)
    values = [warm.value] + [warm.update(0.0, 100) for _ in range(6)]
    assert values[0] == 0.01 and values[4] == pytest.approx(0.1) and values[-1] == 0.1
    assert all(b >= a for a, b in zip(values, values[1:]))
    adaptive = KLController("adaptive", coef=0.1, target=0.05, horizon=100)
    assert adaptive.update(0.5, 100) > 0.1  # KL above target: the coefficient grows
    low = KLController("adaptive", coef=0.1, target=0.05, horizon=100)
    assert low.update(0.0, 100) < 0.1
    fixed = KLController("fixed", coef=0.1)
    assert fixed.update(9.0, 100) == 0.1
    state = adaptive.state_dict()
    fresh = KLController("adaptive", coef=0.1)
    fresh.load_state_dict(state)
    assert fresh.value == adaptive.value
    with pytest.raises(ValueError, match="kl.controller"):
        KLController("magic", coef=0.1)


@pytest.mark.parametrize("critic", ["head", "separate"])
def test_critic_gets_its_own_learning_rate(critic):
    from flax import nnx

    from jaxrl_agents.trainer.optim import actor_critic_adam

    ac = tiny_actor_critic(critic=critic)
    tx = actor_critic_adam(optax.constant_schedule(0.0), optax.constant_schedule(1e-2))
    # Two passes: the value head starts at zero, so the trunk gets gradients from step 2.
    learner = RLLearner(ac, RLHyper.defaults(estimator="gae"), tx, minibatch_size=8, ppo_epochs=2)
    state = learner.init_state(ac)
    before = nnx.state(ac)
    state, _ = learner.update(state, random_batch(5), jax.random.key(0))
    moved = jax.tree_util.tree_map_with_path(
        lambda p, a, b: (jax.tree_util.keystr(p), bool(np.any(np.asarray(a) != np.asarray(b)))),
        state.params,
        before,
    )
    changed = {
        name
        for name, diff in jax.tree.leaves(moved, is_leaf=lambda x: isinstance(x, tuple))
        if diff
    }
    # The policy's rate is 0: only the value head moves, and a separate critic's trunk; a
    # trunk shared with the head is the policy's (NNX may list it under critic/trunk).
    moved_head = {n for n in changed if n.startswith("['critic']['head']")}
    assert moved_head, changed
    if critic == "head":
        assert changed == moved_head, changed
    else:
        assert any(n.startswith("['critic']['trunk']") for n in changed), changed
        assert all(n.startswith("['critic']") for n in changed), changed


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_group_estimators_refuse_groups_of_one_at_construction(estimator):
    from jaxrl_agents.config import ConfigError, load_config
    from jaxrl_agents.trainer.rl import make_learner

    cfg = load_config("configs/base.py")
    with cfg.unlocked():  # as an experiment file could set it, bypassing the loader
        cfg.algo.estimator = estimator
    with pytest.raises(ConfigError, match="rollout.group_size"):
        make_learner(cfg, tiny_actor_critic(), total_updates=1, episodes_per_update=8)


def test_chunk_rows_divide_the_batch():
    from jaxrl_agents.trainer.rl import chunk_rows

    assert [chunk_rows(8, m) for m in (1, 2, 3, 4, 5, 8, 100)] == [1, 2, 2, 4, 4, 8, 8]
    assert chunk_rows(12, 8) == 6 and chunk_rows(7, 4) == 1


def _jitted_prepare(learner):
    from jaxrl_agents.trainer import rl

    fn = functools.partial(rl.prepare, learner.hp, learner.graphdef, learner.ref_graphdef)
    return jax.jit(fn, static_argnums=3)


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_prepare_in_row_chunks_equals_the_whole_batch(estimator):
    """Advantages need the whole batch (GAE whitening, GRPO groups): only the forward
    passes are chunked."""
    learner, state = _learner(estimator)
    prepare = _jitted_prepare(learner)
    arrays = on_device(random_batch(5))
    kl = jnp.float32(0.1)
    whole = prepare(state, arrays, kl, None)
    for rows in (4, 2, 1):
        chunked = prepare(state, arrays, kl, rows)
        for a, b in zip(jax.tree.leaves(chunked), jax.tree.leaves(whole)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=str(rows))
    assert float(jnp.abs(whole[0].advantages).max()) > 0


def test_prepare_in_row_chunks_holds_one_chunk_of_logits():
    """Compiled temp memory of prepare with a 512-token vocabulary (logits dominate): a
    quarter of the rows at a time needs well under half of the whole batch's; with the
    batch's `loss_index` (action positions), logits are made at those positions only and
    the [B, T, V] logits never exist."""
    from flax import nnx

    from jaxrl_agents.models import build_actor_critic
    from tests.trainer.helpers import tiny_policy

    ac = build_actor_critic(tiny_policy(vocab_size=512), "head", rngs=nnx.Rngs(1))
    learner = RLLearner(ac, RLHyper.defaults(estimator="gae"), optax.adam(1e-3), minibatch_size=8)
    state = learner.init_state(ac)
    indexed = on_device(random_batch(0))
    arrays = dataclasses.replace(indexed, loss_index=None)
    prepare = _jitted_prepare(learner)

    def temp_bytes(rows, batch=arrays):
        compiled = prepare.lower(state, batch, jnp.float32(0.1), rows).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    whole, quarter = temp_bytes(None), temp_bytes(2)
    logits = arrays.input_ids.size * 512 * 4
    assert whole > logits  # the whole batch's logits are live at once
    assert quarter < 0.5 * whole, (quarter, whole)
    index = indexed.loss_index
    assert index.shape[1] < arrays.input_ids.shape[1]
    at_actions = temp_bytes(None, indexed)
    assert at_actions < logits * index.shape[1] / arrays.input_ids.shape[1] + 0.5 * logits
    assert at_actions < 0.75 * whole, (at_actions, whole)


def test_update_metrics_do_not_depend_on_the_prepare_chunks():
    ac, batch = tiny_actor_critic(), random_batch(6)
    results = []
    for rows in (8, 2):
        hp = RLHyper.defaults(estimator="gae", entropy_coef=0.01)
        learner = RLLearner(ac, hp, optax.adam(3e-3), minibatch_size=4, prepare_rows=rows)
        state, metrics = learner.update(learner.init_state(ac), batch, jax.random.key(0))
        results.append((metrics, jax.tree.leaves(state.params)))
    (m8, p8), (m2, p2) = results
    assert m8.keys() == m2.keys()
    for k in learning_metrics(m8):
        assert m2[k] == pytest.approx(m8[k], rel=1e-5, abs=1e-6), k
    for a, b in zip(p2, p8):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_ppo_raises_the_probability_of_a_rewarded_action():
    """A one-token bandit through the whole learner: prompt [1, 2, 3], the action token is
    sampled from the current policy (old log-probs as the sampler records them), reward 1
    iff it is token 5. PPO with GAE and a value head must make token 5 the likely action."""
    from flax import nnx

    from jaxrl_agents.data import ACTION, PROMPT, Trajectory, pack
    from jaxrl_agents.trainer import optim

    ac = tiny_actor_critic()
    tx = optim.actor_critic_adam(optax.constant_schedule(3e-3), optax.constant_schedule(3e-3), 1.0)
    learner = RLLearner(ac, RLHyper.defaults(estimator="gae"), tx, ppo_epochs=2, minibatch_size=16,
                        kl=KLController("fixed", 0.01))
    state = learner.init_state(ac)
    prompt, rng = [1, 2, 3], np.random.default_rng(0)

    def p_rewarded():
        nnx.update(ac, state.params)
        logp = np.asarray(jax.nn.log_softmax(ac.policy(jnp.array([prompt]))[0, -1]))
        return logp, float(np.exp(logp[5]))

    logp, start = p_rewarded()
    for update in range(30):
        p = np.exp(logp) / np.exp(logp).sum()
        actions = rng.choice(len(p), size=32, p=p)
        trajs = []
        for i, a in enumerate(actions):
            rewards, old = np.zeros(4, np.float32), np.zeros(4, np.float32)
            rewards[3], old[3] = float(a == 5), logp[a]
            trajs.append(Trajectory(prompt + [int(a)], [PROMPT] * 3 + [ACTION], old, rewards,
                                    [3], won=bool(a == 5), group_id=i))
        state, _ = learner.update(state, pack(trajs, length_buckets=(8,)), jax.random.key(update))
        logp, _ = p_rewarded()
    _, end = p_rewarded()
    assert start < 0.1 and end > 0.8, (start, end)


@pytest.mark.parametrize("bootstrap", [False, True])
def test_a_cut_episode_is_bootstrapped_with_the_value_of_its_final_observation(bootstrap):
    """A hand-built episode cut by its budget: prompt, action (reward 0.3), then the final
    observation as prompt tokens. Bootstrapped, the return of its last action token is
    0.3 + gamma * V(the final observation's last token), that value read from the critic
    here; by default, or when the record ends at the action, the return is the reward."""
    from flax import nnx

    from jaxrl_agents.data import ACTION, PROMPT, Trajectory, pack

    learner, state = _learner("gae")
    learner.hp = dataclasses.replace(learner.hp, bootstrap_truncated=bootstrap)
    for i in range(2):  # the value head starts at 0: train it to predict something
        state, _ = learner.update(state, random_batch(6), jax.random.key(i))
    prompt, action, final = [3, 4, 5], [6, 7], [8, 9, 10]
    ended_at_observation = Trajectory(prompt + action + final, [PROMPT] * 3 + [ACTION] * 2 +
                                      [PROMPT] * 3, np.zeros(8), [0, 0, 0, 0, 0.3, 0, 0, 0],
                                      [4], truncated=True)
    ended_at_action = Trajectory(prompt + action, [PROMPT] * 3 + [ACTION] * 2, np.zeros(5),
                                 [0, 0, 0, 0, 0.3], [4], truncated=True)
    batch = pack([ended_at_observation, ended_at_action], length_buckets=(8,))
    arrays = on_device(batch)
    returns = _jitted_prepare(learner)(state, arrays, jnp.float32(0.0), None)[0].returns
    model = nnx.merge(learner.graphdef, state.params)
    _, values = model.hidden_and_values(arrays.input_ids, arrays.positions, arrays.valid)
    v_final = float(values[0, 7])
    assert abs(v_final) > 1e-3
    expected = 0.3 + learner.hp.gamma * v_final if bootstrap else 0.3
    assert float(returns[0, 4]) == pytest.approx(expected, abs=1e-5)
    assert float(returns[1, 4]) == pytest.approx(0.3, abs=1e-6)


def _padded_far(seed, columns=64):
    """random_batch(seed) (episodes of 9-24 tokens) right-padded to `columns` tokens."""
    batch = random_batch(seed)
    widen = lambda v: np.pad(v, ((0, 0), (0, columns - v.shape[1]))) if v.ndim == 2 else v
    batch = dataclasses.replace(batch, **{k: widen(v) for k, v in batch.as_dict().items()})
    assert batch.shape[1] == columns
    return batch


@pytest.mark.parametrize("frozen_layers", [0, 1])
def test_prepare_by_length_equals_prepare_of_the_whole_batch(frozen_layers):
    """prepare's forward passes over chunks of rows of like length, each cut to its own
    bucket, give the whole batch's Prepared (row order kept) and metrics."""
    ac, arrays = tiny_actor_critic(), on_device(_padded_far(7))
    hp = RLHyper.defaults(estimator="gae", frozen_layers=frozen_layers)
    learner = RLLearner(ac, hp, optax.sgd(0.02), minibatch_size=2,
                        length_buckets=(8, 16, 24, 32))
    state, kl = learner.init_state(ac), jnp.float32(0.1)
    whole, whole_metrics = learner._prepare(state, arrays, kl, None)
    lengths = learner._row_lengths(arrays)
    assert lengths.max() <= 24 and len(set(lengths.tolist())) > 2
    cut_to = []

    def recording(state, rows, passes=learner._forward_passes):
        cut_to.append(rows.input_ids.shape[1])
        return passes(state, rows)

    learner._forward_passes = recording
    by_length, metrics = learner._prepare_by_length(state, arrays, kl, 2, lengths)
    assert len(cut_to) == 4 and max(cut_to) <= 24 and len(set(cut_to)) > 1, cut_to
    assert cut_to == sorted(cut_to, reverse=True)  # longest rows first
    valid = np.asarray(arrays.valid, bool)
    for name in ("advantages", "returns", "old_values", "ref_logprobs", "lower_hidden"):
        a, b = getattr(by_length, name), getattr(whole, name)
        if frozen_layers == 0 and name == "lower_hidden":
            assert a is None and b is None
            continue
        np.testing.assert_allclose(np.asarray(a)[valid], np.asarray(b)[valid],
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    assert float(jnp.abs(whole.advantages).max()) > 0
    for k, v in whole_metrics.items():
        assert float(metrics[k]) == pytest.approx(float(v), rel=1e-5, abs=1e-6), k


def test_the_rollouts_frozen_layer_output_stands_in_for_the_learners():
    """A batch carrying the frozen layers' output (`Batch.lower_hidden`, kept by the
    rollout) gives the update of one without it, and that output is what the learner
    reads: shifted, the reference log-probs move."""
    ac, batch = tiny_actor_critic(), _padded_far(7)
    hp = RLHyper.defaults(estimator="gae", entropy_coef=0.01, frozen_layers=1)
    arrays = on_device(batch)
    lower = np.asarray(ac.policy.lower_hidden(arrays.input_ids, arrays.positions,
                                              arrays.valid, 1))
    lower = lower * np.asarray(batch.valid, np.float32)[..., None]  # 0 on padding, as packed
    results = []
    for given in (None, lower, lower + 0.5):
        learner = RLLearner(ac, hp, optax.sgd(0.02), ppo_epochs=2, minibatch_size=2,
                            length_buckets=(8, 16, 24, 32))
        state = learner.init_state(ac)
        rows = dataclasses.replace(batch, lower_hidden=given)
        lengths = learner._row_lengths(on_device(rows))
        prepared, _ = learner._prepare_by_length(state, on_device(rows), jnp.float32(0.1), 2,
                                                 lengths)
        state, metrics = learner.update(state, rows, jax.random.key(0))
        results.append((prepared, metrics, jax.tree.leaves(state.params)))
    (p_own, m_own, w_own), (p_given, m_given, w_given), (p_shifted, *_) = results
    assert (m_own["perf/frozen_output_reused"], m_given["perf/frozen_output_reused"]) == (0, 1)
    valid = np.asarray(batch.valid, bool)
    for name in ("old_values", "ref_logprobs", "advantages", "lower_hidden"):
        np.testing.assert_allclose(np.asarray(getattr(p_given, name))[valid],
                                   np.asarray(getattr(p_own, name))[valid], atol=1e-5,
                                   err_msg=name)
    for k in learning_metrics(m_own):
        assert m_given[k] == pytest.approx(m_own[k], rel=1e-4, abs=1e-5), k
    for a, b in zip(w_given, w_own):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    moved = np.abs(np.asarray(p_shifted.ref_logprobs) - np.asarray(p_own.ref_logprobs))
    assert moved[np.asarray(batch.action_mask) > 0].max() > 1e-3


def test_cutting_minibatches_to_their_own_length_changes_nothing():
    """A batch padded far past its episodes (T=64, episodes of 9-24 tokens): minibatches
    cut to their own bucket give the update of the uncut batch."""
    ac, batch = tiny_actor_critic(), _padded_far(7)
    results, cut_lengths = [], []
    for buckets in (None, (8, 16, 24, 32)):
        hp = RLHyper.defaults(estimator="gae", entropy_coef=0.01)
        # Plain SGD: Adam would turn float noise on a ~0 gradient into an lr-sized step.
        learner = RLLearner(ac, hp, optax.sgd(0.02), ppo_epochs=2, minibatch_size=2,
                            length_buckets=buckets)

        def recording(rows, idx, accum, length, real=None, cut=learner._micro_batches):
            cut_lengths.append(length)
            return cut(rows, idx, accum, length, real)

        learner._micro_batches = recording
        state, metrics = learner.update(learner.init_state(ac), batch, jax.random.key(0))
        results.append((metrics, jax.tree.leaves(state.params)))
    assert set(cut_lengths[:8]) == {64} and max(cut_lengths[8:]) <= 32
    assert len(set(cut_lengths[8:])) > 1  # minibatches of different lengths
    (m_full, p_full), (m_cut, p_cut) = results
    for k in learning_metrics(m_full):
        assert m_cut[k] == pytest.approx(m_full[k], rel=1e-4, abs=1e-5), k
    for a, b in zip(p_cut, p_full):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    start = jax.tree.leaves(learner.init_state(ac).params)
    assert max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(p_full, start)) > 1e-3


@pytest.mark.parametrize("at_actions", [False, True])
def test_logits_made_in_chunks_give_the_same_update_and_hold_less_memory(at_actions):
    """rl.logits_chunk: an update with the logits made 8 positions at a time equals the
    whole-sequence one; with a 4096-token vocabulary, the compiled train step then needs
    under half the temporary memory. With the logits made at the action positions only
    (the batch's `loss_index`, fewer than T), chunks give the same update and still save."""
    from flax import nnx

    from jaxrl_agents.models import build_actor_critic
    from jaxrl_agents.trainer import rl
    from tests.trainer.helpers import tiny_policy

    ac = build_actor_critic(tiny_policy(vocab_size=4096), "head", rngs=nnx.Rngs(1))
    batch = random_batch(3)
    if not at_actions:
        batch.loss_index = None
    results, temp = [], []
    for chunk in (0, 8):
        hp = RLHyper.defaults(estimator="gae", entropy_coef=0.01, logits_chunk=chunk)
        learner = RLLearner(ac, hp, optax.adam(3e-3), ppo_epochs=1, minibatch_size=8)
        state = learner.init_state(ac)
        arrays = on_device(batch)
        prepared, _ = learner._prepare(state, arrays, jnp.float32(0.0), None)
        micro = jax.tree.map(lambda x: x[None], TrainBatch(arrays, prepared))
        step = jax.jit(functools.partial(rl.train_step, hp, learner.graphdef, learner.tx))
        compiled = step.lower(state, micro, jnp.float32(0.0), jnp.float32(1.0)).compile()
        temp.append(compiled.memory_analysis().temp_size_in_bytes)
        new_state, metrics = learner.update(state, batch, jax.random.key(0))
        results.append((metrics, jax.tree.leaves(new_state.params)))
    (m_whole, p_whole), (m_chunk, p_chunk) = results
    for k in learning_metrics(m_whole):
        assert m_chunk[k] == pytest.approx(m_whole[k], rel=1e-4, abs=1e-5), k
    for a, b in zip(p_chunk, p_whole):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    if at_actions:
        assert batch.loss_index.shape[1] < batch.input_ids.shape[1]
        assert temp[1] < temp[0], temp
    else:
        assert temp[1] < 0.5 * temp[0], temp


@pytest.mark.parametrize("chunk", [0, 8])
@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_learner_log_probs_are_those_of_the_tempered_policy(temperature, chunk):
    """Rollouts sampled at temperature tau record log-probs of softmax(logits / tau); the
    learner must score tokens under the same distribution, or PPO's first ratio is not 1."""
    ac = tiny_actor_critic()
    hp = RLHyper.defaults(estimator="gae", temperature=temperature, logits_chunk=chunk)
    learner = RLLearner(ac, hp, optax.adam(1e-3), ppo_epochs=1, minibatch_size=8)
    state = learner.init_state(ac)
    batch = random_batch(4)
    arrays = on_device(batch)
    prepared, _ = learner._prepare(state, arrays, jnp.float32(0.0), None)
    logits = np.asarray(ac.policy(arrays.input_ids, arrays.positions, arrays.valid))
    logp = jax.nn.log_softmax(logits[:, :-1] / temperature, axis=-1)
    expected = np.take_along_axis(np.asarray(logp), batch.input_ids[:, 1:, None], -1)[..., 0]
    mask = batch.action_mask[:, 1:]
    np.testing.assert_allclose(np.asarray(prepared.ref_logprobs)[:, 1:] * mask,
                               expected * mask, atol=1e-5)


def _with_forced_tokens(batch, seed=0):
    """`batch` with constrained-decoding lists: about half its action tokens forced (one
    allowed id: the token itself), the rest decisions between the token and another id."""
    rng = np.random.default_rng(seed)
    ids = batch.input_ids
    allowed = np.full(ids.shape + (2,), -1, np.int32)
    act = batch.action_mask > 0
    allowed[..., 0] = np.where(act, ids, -1)
    decide = act & (rng.random(ids.shape) < 0.5)
    allowed[..., 1] = np.where(decide, (ids + 1) % VOCAB, -1)
    # the sampler's log-prob of a forced token is 0; of a two-way decision, about log 1/2
    old = np.where(decide, np.log(0.5), 0.0).astype(np.float32) * act
    return dataclasses.replace(batch, allowed=allowed, old_logprobs=old), decide


def test_decision_mask_leaves_out_forced_tokens_only():
    from jaxrl_agents import kernels

    batch, decide = _with_forced_tokens(random_batch(3))
    mask = np.asarray(kernels.decision_mask(jnp.asarray(batch.action_mask),
                                            jnp.asarray(batch.allowed)))
    np.testing.assert_array_equal(mask, decide.astype(np.float32))
    free = np.asarray(kernels.decision_mask(jnp.asarray(batch.action_mask)))
    np.testing.assert_array_equal(free, batch.action_mask)


def test_forced_tokens_only_dilute_the_policy_gradient_when_counted():
    """One SGD step of the policy loss alone (no critic loss, entropy or KL; advantages not
    whitened): counting every action token gives the step over decisions scaled by
    decisions / actions, since a forced token's log-prob is 0 under every policy."""

    from jaxrl_agents.trainer.kl_control import KLController

    batch, decide = _with_forced_tokens(random_batch(4))
    steps = {}
    for tokens in ("decisions", "actions"):
        ac = tiny_actor_critic()
        hp = RLHyper.defaults(estimator="gae", value_coef=0.0, normalize_advantages=False,
                     loss_tokens=tokens)
        learner = RLLearner(ac, hp, optax.sgd(1.0), ppo_epochs=1,
                            minibatch_size=batch.shape[0], kl=KLController("fixed", 0.0))
        state = learner.init_state(ac)
        # the value head gets no gradient (value_coef 0): every leaf moves by the policy's step
        before = [np.asarray(x) for x in jax.tree.leaves(state.params)]  # (the step donates)
        new, metrics = learner.update(state, batch, jax.random.key(0))
        steps[tokens] = [np.asarray(a) - b for a, b in zip(jax.tree.leaves(new.params), before)]
        assert metrics["charts/decision_share"] == pytest.approx(
            decide.sum() / batch.action_mask.sum(), rel=1e-5)
    share = decide.sum() / batch.action_mask.sum()
    assert 0.2 < share < 0.8
    for d, a in zip(steps["decisions"], steps["actions"]):
        np.testing.assert_allclose(a, d * share, rtol=2e-3, atol=1e-7)
    assert max(float(np.abs(d).max()) for d in steps["decisions"]) > 1e-4


@pytest.mark.parametrize("loss_tokens", ["decisions", "actions"])
def test_prepare_passes_forced_tokens_through_gae_when_asked(loss_tokens):
    """algo.gae_forced_tokens reaches the advantages: with "pass_through" `prepare` gives
    `gae_pass_through` over the batch's decision tokens (whatever tokens the policy terms
    count); without constrained decoding both settings give the same advantages, bit for
    bit."""
    from jaxrl_agents import kernels

    constrained, decide = _with_forced_tokens(random_batch(4))
    free = random_batch(4)
    got = {}
    for forced_tokens in ("discount", "pass_through"):
        hp = RLHyper.defaults(estimator="gae", normalize_advantages=False, kl_where="loss",
                              loss_tokens=loss_tokens, gae_forced_tokens=forced_tokens)
        ac = tiny_actor_critic()
        learner = RLLearner(ac, hp, optax.adam(1e-3), minibatch_size=8)
        state = learner.init_state(ac)
        for name, batch in (("constrained", constrained), ("free", free)):
            prepared, _ = _jitted_prepare(learner)(state, on_device(batch), jnp.float32(0.0),
                                                   None)
            got[forced_tokens, name] = prepared
    for name, batch, decisions in (("constrained", constrained, decide), ("free", free, None)):
        prepared = got["pass_through", name]
        mask = batch.action_mask
        want = kernels.gae_pass_through(batch.rewards, prepared.old_values, mask,
                                        mask if decisions is None else decisions,
                                        hp.gamma, hp.lam)[0]
        np.testing.assert_allclose(prepared.advantages, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["pass_through", "free"].advantages,
                                  got["discount", "free"].advantages)
    assert not np.allclose(got["pass_through", "constrained"].advantages,
                           got["discount", "constrained"].advantages)


def test_update_reports_the_kl_of_the_steps_that_can_move():
    from jaxrl_agents.trainer.rl import _mean_metrics

    steps = [{"losses/approx_kl": jnp.float32(k), "losses/skipped": jnp.float32(0)}
             for k in (0.0, 0.1, 0.3)]
    out = _mean_metrics(steps)
    assert float(out["losses/approx_kl"]) == pytest.approx(0.2)
    assert float(out["losses/approx_kl_end"]) == pytest.approx(0.3)


def test_explained_variance_pools_the_steps_so_a_minibatch_of_equal_returns_cannot_swamp_it():
    """Two minibatches: one with returns 0, 1, 0, 1 and values 0.1, 0.9, 0.2, 0.8; one whose
    games were all lost (returns all 0, values 0.1). Alone the second reads
    1 - 0 / 1e-8 = 1 (no residual variance) or, with any spread in its values, far below
    zero; the update reports 1 - mean residual variance / mean return variance."""
    from jaxrl_agents import kernels
    from jaxrl_agents.trainer.rl import _mean_metrics

    mask = jnp.ones((1, 4))
    batches = [(jnp.array([[0.0, 1, 0, 1]]), jnp.array([[0.1, 0.9, 0.2, 0.8]])),
               (jnp.zeros((1, 4)), jnp.array([[0.1, 0.0, 0.1, 0.0]]))]
    steps = []
    for returns, values in batches:
        _, m = kernels.value_loss(values, values, returns, mask, clip=None)
        steps.append({"losses/approx_kl": jnp.float32(0), "losses/skipped": jnp.float32(0),
                      **{f"losses/{k}": v for k, v in m.items()}})
    assert float(steps[1]["losses/explained_var"]) < -1e4  # one step alone: swamped
    resid = [np.var(np.asarray(r - v)) for r, v in batches]
    want = 1 - np.mean(resid) / np.mean([0.25, 0.0])
    out = _mean_metrics(steps)
    assert float(out["losses/explained_var"]) == pytest.approx(want, rel=1e-5)
    assert -1 < want < 1 and "losses/resid_var" not in out and "losses/return_var" not in out


def test_every_row_is_used_every_epoch_when_the_minibatch_does_not_divide_the_batch():
    """8 rows in minibatches of 3: three steps an epoch, the last topped up with rows whose
    action mask is zeroed, so each row enters the losses exactly once an epoch."""
    ac, batch = tiny_actor_critic(), random_batch(5)
    learner = RLLearner(ac, RLHyper.defaults(estimator="gae"), optax.sgd(0.01), ppo_epochs=2,
                        minibatch_size=3)
    seen = []

    def recording(rows, idx, accum, length, real=None, cut=learner._micro_batches):
        micro = cut(rows, idx, accum, length, real)
        counted = np.asarray(micro.batch.action_mask).reshape(len(idx), -1).sum(axis=1) > 0
        seen.append(idx[counted[:len(idx)]])
        return micro

    learner._micro_batches = recording
    _, metrics = learner.update(learner.init_state(ac), batch, jax.random.key(0))
    assert len(seen) == 6 and np.isfinite(metrics["losses/total"])
    for epoch in (seen[:3], seen[3:]):
        np.testing.assert_array_equal(np.sort(np.concatenate(epoch)), np.arange(8))
