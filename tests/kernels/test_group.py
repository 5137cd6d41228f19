"""RLOO, GRPO and episode scores (kernels/group.py) against NumPy loops."""

import numpy as np
import pytest

from jaxrl_agents import kernels
from tests.kernels import references as ref


def _groups(seed, n=12):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=n).astype(np.float32)
    group_ids = rng.integers(0, 4, size=n).astype(np.int32)
    group_ids[-1] = 99  # an episode alone in its group
    return scores, group_ids


@pytest.mark.parametrize("seed", range(4))
def test_rloo_matches_loop(seed):
    scores, group_ids = _groups(seed)
    np.testing.assert_allclose(
        kernels.rloo(scores, group_ids), ref.rloo(scores, group_ids), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("std_normalize", [True, False])
def test_grpo_matches_loop(seed, std_normalize):
    scores, group_ids = _groups(seed)
    got = kernels.grpo(scores, group_ids, std_normalize=std_normalize)
    np.testing.assert_allclose(
        got, ref.grpo(scores, group_ids, std_normalize), rtol=1e-4, atol=1e-5
    )


def test_grpo_group_of_equal_scores_gives_zero():
    got = kernels.grpo(np.ones(4, np.float32), np.zeros(4, np.int32))
    np.testing.assert_allclose(got, 0.0)


def test_broadcast_to_tokens():
    mask = np.array([[0, 1, 1], [1, 0, 0]], np.float32)
    out = kernels.broadcast_to_tokens(np.array([2.0, -1.0], np.float32), mask)
    np.testing.assert_array_equal(out, [[0, 2, 2], [-1, 0, 0]])


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_episode_scores_discount_per_turn(gamma, seed):
    rewards, _, mask, _ = ref.random_batch(seed)
    got = kernels.episode_scores(rewards, mask, gamma)
    np.testing.assert_allclose(got, ref.episode_scores(rewards, mask, gamma), rtol=1e-5, atol=1e-5)
    if gamma == 1.0:  # the plain sum over action tokens
        np.testing.assert_allclose(got, (rewards * mask).sum(axis=1), rtol=1e-5, atol=1e-5)
