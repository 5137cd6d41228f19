import jax
import numpy as np
import pytest

from jaxrl_agents import kernels
from tests.kernels import references as ref

CASES = [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0), (0.5, 0.7)]


@pytest.mark.parametrize("gamma, lam", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("truncated", [False, True])
def test_gae_matches_loop(gamma, lam, seed, truncated):
    rewards, values, mask, last_value = ref.random_batch(seed)
    lv = last_value if truncated else None
    adv, ret = kernels.gae(rewards, values, mask, gamma, lam, last_value=lv)
    want_adv, want_ret = ref.gae(rewards, values, mask, gamma, lam, lv)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(adv)[mask == 0] == 0)
    assert np.all(np.asarray(adv)[0] == 0)  # the all-padding row


def test_terminal_last_action_token_gets_r_minus_v():
    # The paper's snippet never sets gae[-1]; ours must give r - V there.
    rewards = np.array([[0.0, 0.0, 0.0, 1.0, 0.0]], np.float32)
    values = np.array([[9.0, 0.5, 9.0, 0.25, 9.0]], np.float32)
    mask = np.array([[0, 1, 0, 1, 0]], np.float32)
    adv, _ = kernels.gae(rewards, values, mask, 0.99, 0.95)
    assert adv[0, 3] == pytest.approx(1.0 - 0.25)
    assert adv[0, 1] == pytest.approx(0.99 * 0.25 - 0.5 + 0.99 * 0.95 * 0.75)


def test_one_token_episode():
    rewards = np.array([[0.0, 2.0, 0.0]], np.float32)
    values = np.array([[5.0, 0.5, 5.0]], np.float32)
    mask = np.array([[0, 1, 0]], np.float32)
    adv, ret = kernels.gae(rewards, values, mask, 0.99, 0.95, last_value=np.array([1.0]))
    assert adv[0, 1] == pytest.approx(2.0 + 0.99 * 1.0 - 0.5)
    assert ret[0, 1] == pytest.approx(2.0 + 0.99)


@pytest.mark.parametrize("gamma, lam", CASES)
@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("truncated", [False, True])
def test_turn_gae_matches_loop(gamma, lam, seed, truncated):
    rewards, values, mask, last_value = ref.random_batch(seed)
    lv = last_value if truncated else None
    adv, ret = kernels.turn_gae(rewards, values, mask, gamma, lam, last_value=lv)
    want_adv, want_ret = ref.turn_gae(rewards, values, mask, gamma, lam, lv)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_turn_boundaries():
    mask = np.array([[0, 1, 1, 0, 1, 0, 1, 1, 1]], np.float32)
    start, end = kernels.turn_boundaries(mask)
    np.testing.assert_array_equal(start[0], [0, 1, 0, 0, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(end[0], [0, 0, 1, 0, 1, 0, 0, 0, 1])


def test_gae_long_sequence_is_stable():
    rewards, values, mask, _ = ref.random_batch(7, batch=4, length=4096)
    adv, _ = kernels.gae(rewards, values, mask, 0.99, 0.95)
    want, _ = ref.gae(rewards, values, mask, 0.99, 0.95)
    np.testing.assert_allclose(adv, want, rtol=1e-4, atol=1e-4)


def test_gae_program_does_not_grow_with_length():
    # No Python loop over T: the traced program has the same size for any length.
    def size(length):
        r, v, m, _ = ref.random_batch(0, length=length)
        jaxpr = jax.make_jaxpr(lambda r, v, m: kernels.gae(r, v, m, 0.99, 0.95))(r, v, m)
        return len(str(jaxpr).splitlines())

    assert size(16) == size(256)
