import numpy as np
import pytest

from jaxrl_agents.data import ACTION, PROMPT, Trajectory, bucket, pack


def _traj(n_prompt, n_action, reward, group=0, won=False):
    types = [PROMPT] * n_prompt + [ACTION] * n_action
    rewards = np.zeros(len(types), np.float32)
    rewards[-1] = reward
    return Trajectory(
        tokens=np.arange(len(types)) + 5,
        token_type=types,
        logprobs=[0.0] * n_prompt + [-0.5] * n_action,
        rewards=rewards,
        turn_ends=[len(types) - 1],
        won=won,
        group_id=group,
    )


def test_bucket():
    assert bucket(3, (4, 8)) == 4
    assert bucket(8, (4, 8)) == 8
    assert bucket(9, (4, 8)) == 16


def test_pack_pads_and_keeps_every_token():
    trajs = [_traj(3, 2, 1.0, group=1, won=True), _traj(5, 4, 0.0, group=2)]
    batch = pack(trajs, pad_id=0, length_buckets=(8, 16), row_multiple=4)
    assert batch.shape == (4, 16)
    np.testing.assert_array_equal(batch.input_ids[0, :5], trajs[0].tokens)
    assert batch.valid[0].sum() == 5 and batch.valid[1].sum() == 9
    assert batch.action_mask[1].sum() == 4 and batch.action_mask[0, 3:5].tolist() == [1, 1]
    assert batch.rewards[0, 4] == 1.0 and batch.rewards.sum() == 1.0
    assert batch.old_logprobs[1, 5:9].tolist() == [-0.5] * 4
    np.testing.assert_array_equal(batch.row_valid, [1, 1, 0, 0])
    np.testing.assert_array_equal(batch.won, [1, 0, 0, 0])
    assert len(set(batch.group_ids.tolist())) == 4  # pad rows never share a group
    sub = batch.rows(slice(0, 2))
    assert sub.shape == (2, 16)


def test_pack_carries_the_rollouts_hidden_states_only_when_every_episode_has_them():
    trajs = [_traj(3, 2, 1.0), _traj(5, 4, 0.0)]
    for t, seed in zip(trajs, (0, 1)):
        t.lower_hidden = np.random.default_rng(seed).normal(size=(len(t), 3)).astype(np.float32)
    batch = pack(trajs, length_buckets=(16,), row_multiple=4)
    assert batch.lower_hidden.shape == (4, 16, 3)
    for i, t in enumerate(trajs):
        np.testing.assert_array_equal(batch.lower_hidden[i, :len(t)], t.lower_hidden)
    assert not batch.lower_hidden[0, 5:].any() and not batch.lower_hidden[2:].any()
    assert batch.rows(slice(0, 2)).lower_hidden.shape == (2, 16, 3)
    trajs[1].lower_hidden = None
    assert pack(trajs, length_buckets=(16,)).lower_hidden is None


def test_pack_errors():
    with pytest.raises(ValueError, match="at least one"):
        pack([])
    with pytest.raises(ValueError, match="max_length"):
        pack([_traj(10, 2, 0.0)], max_length=8)
    with pytest.raises(ValueError, match="logprobs"):
        Trajectory(tokens=[1, 2], token_type=[0, 1], logprobs=[0.0], rewards=[0, 0])
    with pytest.raises(ValueError, match="lower_hidden has shape"):
        Trajectory(tokens=[1, 2], token_type=[0, 1], logprobs=[0.0, 0.0], rewards=[0, 0],
                   lower_hidden=np.zeros((3, 4)))
