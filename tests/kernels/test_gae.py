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


@pytest.mark.parametrize("gamma, lam", CASES)
@pytest.mark.parametrize("token_gamma, token_lam", [(1.0, 1.0), (0.9, 0.8)])
@pytest.mark.parametrize("seed", [5, 6])
@pytest.mark.parametrize("truncated", [False, True])
def test_bilevel_gae_matches_loop(gamma, lam, token_gamma, token_lam, seed, truncated):
    rewards, values, mask, last_value = ref.random_batch(seed)
    lv = last_value if truncated else None
    adv, ret = kernels.bilevel_gae(
        rewards, values, mask, gamma, lam, last_value=lv, token_gamma=token_gamma,
        token_lam=token_lam,
    )
    want_adv, want_ret = ref.bilevel_gae(
        rewards, values, mask, gamma, lam, lv, token_gamma, token_lam
    )
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(adv)[mask == 0] == 0)
    assert np.all(np.asarray(adv)[0] == 0)  # the all-padding row


def test_bilevel_gae_by_hand():
    # Two turns: tokens 1-2 (values 0.2, 0.5) and 4 (value 0.25); reward 1 at the end.
    rewards = np.array([[0.0, 0.0, 0.3, 0.0, 1.0]], np.float32)
    values = np.array([[9.0, 0.2, 0.5, 9.0, 0.25]], np.float32)
    mask = np.array([[0, 1, 1, 0, 1]], np.float32)
    g, lam = 0.9, 0.5
    adv, ret = kernels.bilevel_gae(rewards, values, mask, g, lam)
    a2 = 1.0 - 0.25  # last turn: terminal
    a1 = 0.3 + g * 0.25 - 0.5 + g * lam * a2  # first turn, at its last token
    np.testing.assert_allclose(adv[0], [0, 0.5 - 0.2 + a1, a1, 0, a2], rtol=1e-6)
    np.testing.assert_allclose(ret[0, [2, 4]], [a1 + 0.5, 1.0], rtol=1e-6)
    assert ret[0, 1] == pytest.approx(a1 + 0.5)  # gamma = lam = 1 inside: the turn's return


def test_bilevel_gae_one_token_episode_equals_gae():
    rewards = np.array([[0.0, 2.0, 0.0]], np.float32)
    values = np.array([[5.0, 0.5, 5.0]], np.float32)
    mask = np.array([[0, 1, 0]], np.float32)
    lv = np.array([1.0], np.float32)
    got = kernels.bilevel_gae(rewards, values, mask, 0.99, 0.95, last_value=lv)
    want = kernels.gae(rewards, values, mask, 0.99, 0.95, last_value=lv)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_bilevel_gae_gamma_lam_one_is_turn_return_minus_value():
    # gamma = lam = 1 at both levels: A[t] = (sum of rewards from t's turn on) - V[t].
    rewards, values, mask, _ = ref.random_batch(8)
    adv, _ = kernels.bilevel_gae(rewards, values, mask, 1.0, 1.0)
    for b in range(mask.shape[0]):
        rows = ref.turns(mask[b])
        for k, (start, end) in enumerate(rows):
            to_go = sum(rewards[b, s : e + 1].sum() for s, e in rows[k:])
            np.testing.assert_allclose(
                adv[b, start : end + 1], to_go - values[b, start : end + 1], rtol=1e-4, atol=1e-4
            )


def test_bilevel_gae_program_does_not_grow_with_length():
    def size(length):
        r, v, m, _ = ref.random_batch(0, length=length)
        fn = lambda r, v, m: kernels.bilevel_gae(r, v, m, 0.99, 0.95)  # noqa: E731
        (outer,) = jax.make_jaxpr(fn)(r, v, m).eqns  # the jitted kernel
        return len(outer.params["jaxpr"].eqns)  # (printed lines vary with name reuse)

    assert size(16) == size(256)


# ------------------------------------------------------ forced tokens as pass-through steps


def _pass_through_loop(rewards, values, mask, decisions, gamma, lam, last_value=None):
    """`gae_pass_through` as a plain loop: the step after action token t uses gamma, lam
    when t is a decision and 1, 1 when it is forced."""
    adv = np.zeros_like(values)
    for b in range(values.shape[0]):
        next_v = 0.0 if last_value is None else last_value[b]
        next_adv = 0.0
        for t in reversed(np.flatnonzero(mask[b])):
            g, lm = (gamma, lam) if decisions[b, t] else (1.0, 1.0)
            next_adv = rewards[b, t] + g * next_v - values[b, t] + g * lm * next_adv
            adv[b, t] = next_adv
            next_v = values[b, t]
    return adv, (adv + values) * mask


def _random_decisions(mask, seed, forced_share=0.6):
    """[B, T]: the action tokens of `mask` that are decisions; the first token of each
    action run always is (a command starts with a choice), later ones are forced with
    probability `forced_share`."""
    rng = np.random.default_rng(seed)
    start, _ = kernels.turn_boundaries(mask)
    later_decision = rng.random(mask.shape) >= forced_share
    return (mask * np.maximum(np.asarray(start), later_decision)).astype(np.float32)


@pytest.mark.parametrize("gamma, lam", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("truncated", [False, True])
def test_gae_pass_through_matches_loop(gamma, lam, seed, truncated):
    rewards, values, mask, last_value = ref.random_batch(seed)
    decisions = _random_decisions(mask, seed)
    forced = (mask > 0) & (decisions == 0)
    assert forced.sum() > 10 and decisions.sum() > 10  # both kinds present
    lv = last_value if truncated else None
    adv, ret = kernels.gae_pass_through(rewards, values, mask, decisions, gamma, lam,
                                        last_value=lv)
    want_adv, want_ret = _pass_through_loop(rewards, values, mask, decisions, gamma, lam, lv)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(adv)[mask == 0] == 0)
    assert np.all(np.asarray(adv)[0] == 0)  # the all-padding row


def _two_commands():
    """Two one-command episodes, one per row, with the same reward and values: the
    command of row 0 is 1 decision + 5 forced tokens, that of row 1 is 1 decision + 1
    forced. Tokens 0-1 are the prompt; the reward 1 sits on each command's last token."""
    mask = np.array([[0, 0, 1, 1, 1, 1, 1, 1],
                     [0, 0, 1, 1, 0, 0, 0, 0]], np.float32)
    decisions = np.zeros_like(mask)
    decisions[:, 2] = 1.0
    rewards = np.zeros_like(mask)
    rewards[0, 7] = rewards[1, 3] = 1.0
    values = np.full_like(mask, 0.5)
    return rewards, values, mask, decisions


@pytest.mark.parametrize("truncated", [False, True])
def test_pass_through_gives_a_long_and_a_short_command_equal_advantages(truncated):
    rewards, values, mask, decisions = _two_commands()
    lv = np.array([0.3, 0.3], np.float32) if truncated else None
    g, lam = 0.9, 0.8
    adv, _ = kernels.gae_pass_through(rewards, values, mask, decisions, g, lam, last_value=lv)
    adv = np.asarray(adv)
    # every forced token passes through: A = r + V(after) - V = 1 + v_end - 0.5 at each
    v_end = 0.0 if lv is None else 0.3
    forced_adv = 1.0 + v_end - 0.5
    np.testing.assert_allclose(adv[0, 3:], forced_adv, rtol=1e-6)
    np.testing.assert_allclose(adv[1, 3], forced_adv, rtol=1e-6)
    # the decision is one discounted step before them, in both rows
    want = g * 0.5 - 0.5 + g * lam * forced_adv
    assert adv[0, 2] == pytest.approx(want, rel=1e-6)
    assert adv[1, 2] == adv[0, 2]

    discounted, _ = kernels.gae(rewards, values, mask, g, lam, last_value=lv)
    assert abs(float(discounted[0, 2]) - float(discounted[1, 2])) > 1e-2


@pytest.mark.parametrize("gamma, lam", CASES + [(0.97, 0.93)])
@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("truncated", [False, True])
def test_pass_through_without_forced_tokens_is_gae_exactly(gamma, lam, seed, truncated):
    """Every action token a decision: the same numbers as `gae`'s scan, bit for bit (the
    C++ kernel, which `gae` runs on CPU, may differ from the scan in the last bit)."""
    from jaxrl_agents.kernels.gae import _gae_scan

    rewards, values, mask, last_value = ref.random_batch(seed)
    lv = last_value if truncated else None
    got = kernels.gae_pass_through(rewards, values, mask, mask, gamma, lam, last_value=lv)
    next_value = np.zeros(mask.shape[0], np.float32) if lv is None else lv
    scan = jax.jit(_gae_scan)(rewards, values, mask, next_value, gamma, lam)
    for a, b in zip(got, scan):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(got, kernels.gae(rewards, values, mask, gamma, lam, last_value=lv)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_pass_through_factors():
    from jaxrl_agents.kernels.gae import pass_through_factors

    decisions = np.array([[1.0, 0.0, 1.0, 0.0]], np.float32)
    g, gl = pass_through_factors(decisions, 0.9, 0.5)
    np.testing.assert_allclose(g, [[0.9, 1.0, 0.9, 1.0]], rtol=1e-7)
    np.testing.assert_allclose(gl, [[0.45, 1.0, 0.45, 1.0]], rtol=1e-7)


@pytest.mark.parametrize("forced_tokens", ["discount", "pass_through"])
def test_gae_entry_point_reads_gae_forced_tokens(forced_tokens):
    """The learner's entry point: pass_through only where decoding was constrained
    (`decisions` given); unconstrained (None) both settings are `gae`, bit for bit."""
    from jaxrl_agents.kernels.gae import gae_advantages
    from jaxrl_agents.trainer.rl import RLHyper

    hp = RLHyper.defaults(estimator="gae", gae_forced_tokens=forced_tokens)
    rewards, values, mask, last_value = ref.random_batch(5)
    decisions = _random_decisions(mask, 5)
    plain = kernels.gae(rewards, values, mask, hp.gamma, hp.lam, last_value=last_value)
    free = gae_advantages(rewards, values, mask, last_value, None, None, hp)
    for a, b in zip(free, plain):
        np.testing.assert_array_equal(a, b)
    constrained = gae_advantages(rewards, values, mask, last_value, None, decisions, hp)
    want = plain if forced_tokens == "discount" else kernels.gae_pass_through(
        rewards, values, mask, decisions, hp.gamma, hp.lam, last_value=last_value)
    for a, b in zip(constrained, want):
        np.testing.assert_array_equal(a, b)
    assert forced_tokens == "discount" or not np.allclose(constrained[0], plain[0])
