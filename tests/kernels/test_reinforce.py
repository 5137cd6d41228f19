"""REINFORCE++ (kernels/reinforce.py) against a NumPy loop."""

import numpy as np
import pytest

from jaxrl_agents import kernels
from tests.kernels import references as ref


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5])
@pytest.mark.parametrize("seed", range(3))
def test_reinforce_pp_matches_loop(gamma, seed):
    rewards, _, mask, _ = ref.random_batch(seed)
    adv, ret = kernels.reinforce_pp(rewards, mask, gamma)
    want_adv, want_ret = ref.reinforce_pp(rewards, mask, gamma)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-4)
