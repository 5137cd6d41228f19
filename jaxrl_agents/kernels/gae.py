"""Generalised advantage estimation over action tokens only.

A multi-turn trajectory is one token sequence; only action tokens (mask == 1) are steps
of the MDP. Observation and padding tokens are skipped: they carry the running state
through unchanged and get advantage 0. With s' the next action token after t,

    delta[t] = r[t] + gamma * V[s'] - V[t]          (V after the last one: last_value)
    A[t]     = delta[t] + gamma * lam * A[s']        (A after the last one: 0)
    R[t]     = A[t] + V[t]

so for a terminal episode the last action token gets A = r - V.

`gae_pass_through` is the same recurrence with per-token factors: under constrained
decoding a *forced* action token (one allowed id, `kernels.decision_mask`) is no
decision, so the step after it uses gamma = lam = 1; with `gae` a command of many forced
tokens is discounted more than a short one (`algo.gae_forced_tokens`).

`turn_gae` and `bilevel_gae` run the same recurrence over turns. The learner reaches all
three through the entry points at the end (`gae_advantages`, ...), which the estimator
table (`jaxrl_agents.estimators`) names.
"""

import jax
import jax.numpy as jnp

from jaxrl_agents.kernels import native
from jaxrl_agents.kernels.scan import fill_backward, fill_forward, reverse_linear_recurrence


@jax.jit
def gae(rewards, values, mask, gamma, lam, *, last_value=None):
    """Token-level GAE, one reverse pass over time carrying (V[s'], A[s']).

    Args:
      rewards: [B, T] float; the reward of a turn sits on its last action token.
      values: [B, T] float, the critic's V at every token.
      mask: [B, T], 1 on action tokens, 0 on prompt / observation / padding.
      gamma, lam: scalars.
      last_value: [B] value after the last action token (0 = terminal); None means 0.
    Returns:
      (advantages [B, T], returns [B, T]), both 0 where mask == 0.

    On CPU, in float32, the pass is the C++ kernel of `kernels.native` when it is built
    (same recurrence, read in place); elsewhere `_gae_scan`.
    """
    rewards, mask, next_value = _gae_inputs(rewards, values, mask, last_value)
    if values.dtype != jnp.float32 or not native.available():
        return _gae_scan(rewards, values, mask, next_value, gamma, lam)
    return jax.lax.platform_dependent(
        rewards, values, mask, next_value, gamma, lam,
        cpu=native.gae_cpu, default=_gae_scan,
    )


@jax.jit
def gae_pass_through(rewards, values, mask, decisions, gamma, lam, *, last_value=None):
    """Token-level GAE in which forced action tokens pass the value and advantage through.

    With s' the next action token after t (V after the last one: last_value, A: 0),

        delta[t] = r[t] + g[t] * V[s'] - V[t]
        A[t]     = delta[t] + g[t] * l[t] * A[s']
        R[t]     = A[t] + V[t]

    where g[t], l[t] are gamma, lam at a decision token and 1, 1 at a forced one. The
    factor of the step t -> s' is token t's own: time passes after a decision, not after
    a forced token (its log-prob is 0 under every policy), so a command is discounted
    once per decision token in it, however many forced tokens it has, and a bootstrap
    after a forced last token needs no factor from beyond the sequence. With every action
    token a decision (unconstrained decoding) this is `gae`: bit for bit its scan
    (`_gae_scan`); its C++ kernel can differ in the last bit.

    Args:
      rewards, values, mask, last_value: as in `gae`.
      decisions: [B, T], 1 on the action tokens that were decisions
        (`kernels.decision_mask(mask, allowed)`), 0 on forced and non-action tokens.
      gamma, lam: scalars, applied at decision tokens.
    Returns:
      (advantages [B, T], returns [B, T]), both 0 where mask == 0.

    Always the `lax.scan` (`_gae_recurrence` with per-token factors); the C++ kernel
    takes scalar factors only.
    """
    rewards, mask, next_value = _gae_inputs(rewards, values, mask, last_value)
    value_factor, advantage_factor = pass_through_factors(
        decisions.astype(values.dtype), gamma, lam)
    return _gae_recurrence(rewards, values, mask, next_value, value_factor, advantage_factor)


def pass_through_factors(decisions, gamma, lam):
    """The per-token factors of `gae_pass_through`'s step t -> s', from `decisions` [B, T]
    (1 at decision tokens): (g [B, T], g * l [B, T]), i.e. (gamma, gamma * lam) at a
    decision and (1, 1) elsewhere (only action tokens are read).

    gamma * lam is formed as `_gae_scan` forms it (and 1 * x + 0 is exact), so with every
    action token a decision the scan computes what `_gae_scan` does, bit for bit.
    """
    forced = 1.0 - decisions
    return decisions * gamma + forced, decisions * (gamma * lam) + forced


def _gae_inputs(rewards, values, mask, last_value):
    """`gae`'s inputs in the values' dtype: (rewards [B, T], mask [B, T], next_value [B],
    the value after the last action token: `last_value`, or 0 when None)."""
    mask = mask.astype(values.dtype)
    batch = values.shape[0]
    next_value = jnp.zeros((batch,), values.dtype) if last_value is None else last_value
    next_value = next_value.astype(values.dtype)
    rewards = rewards.astype(values.dtype)
    return rewards, mask, next_value


def _gae_scan(rewards, values, mask, next_value, gamma, lam):
    """`gae` as a `lax.scan` over time-major slices (any platform, any float dtype);
    gamma, lam scalars."""
    return _gae_recurrence(rewards, values, mask, next_value, gamma, gamma * lam)


def _gae_recurrence(rewards, values, mask, next_value, value_factor, advantage_factor):
    """The reverse scan of GAE with the step t -> s' (s': next action token) weighted
    by factors that may vary per token:

        A[t] = r[t] + value_factor[t] * V[s'] - V[t] + advantage_factor[t] * A[s']

    Args:
      rewards, values, mask: [B, T] in one float dtype; next_value: [B].
      value_factor, advantage_factor: scalars (gamma, gamma * lam) or [B, T]. Scalars are
        closed over, not scanned: `gae`'s scan does the arithmetic it always did.
    Returns:
      (advantages [B, T], returns [B, T]), both 0 where mask == 0.
    """

    def step(carry, x):
        next_v, next_adv = carry
        r, v, m, g, gl = x
        g = value_factor if g is None else g
        gl = advantage_factor if gl is None else gl
        adv = r + g * next_v - v + gl * next_adv
        is_action = m > 0
        carry = (jnp.where(is_action, v, next_v), jnp.where(is_action, adv, next_adv))
        return carry, adv * m

    init = (next_value, jnp.zeros_like(next_value))
    xs = (rewards.T, values.T, mask.T, _time_major_or_none(value_factor),
          _time_major_or_none(advantage_factor))
    _, advantages = jax.lax.scan(step, init, xs, reverse=True)
    advantages = advantages.T  # (B, T)
    return advantages, (advantages + values) * mask


def _time_major_or_none(factor):
    """A [B, T] per-token factor as [T, B] scan input; None for a scalar (closed over)."""
    return factor.T if jnp.ndim(factor) == 2 else None


def turn_boundaries(mask):
    """First and last action token of every turn (a maximal run of mask == 1).

    [B, T] -> (turn_start [B, T], turn_end [B, T]) as 0/1 floats.
    """
    mask = mask.astype(jnp.float32)
    before = jnp.pad(mask[:, :-1], ((0, 0), (1, 0)))
    after = jnp.pad(mask[:, 1:], ((0, 0), (0, 1)))
    return mask * (1.0 - before), mask * (1.0 - after)


@jax.jit
def turn_gae(rewards, values, mask, gamma, lam, *, last_value=None):
    """Turn-level GAE: one MDP step per turn, broadcast back to the turn's action tokens.

    A turn is a maximal run of action tokens. Its value is V at the turn's first action
    token (the state after the observation), its reward the sum of rewards over its
    tokens (normally only on the last one). GAE runs over turns; every action token of a
    turn gets the turn's advantage and return.

    Shapes as in `gae`.
    """
    mask = mask.astype(values.dtype)
    start, end = turn_boundaries(mask)
    turn_value = fill_forward(values, start)  # at every token: V at its turn's start
    turn_reward = _turn_sums(rewards * mask, start)
    adv_at_end, ret_at_end = gae(
        turn_reward * end, turn_value * end, end, gamma, lam, last_value=last_value
    )
    advantages = fill_backward(adv_at_end, end) * mask
    returns = fill_backward(ret_at_end, end) * mask
    return advantages, returns


def _turn_sums(x, start):
    """At every token, the sum of `x` from its turn's start up to it.  [B, T].

    At a turn's last token this is the sum over the whole turn.
    """
    cumsum = jnp.cumsum(x, axis=1)
    before_start = fill_forward(cumsum - x, start)  # cumsum just before the turn began
    return cumsum - before_start


@jax.jit
def bilevel_gae(
    rewards, values, mask, gamma, lam, *, last_value=None, token_gamma=1.0, token_lam=1.0
):
    """Bi-level GAE (ArCHer / RAGEN style): GAE over turns, then GAE over tokens inside a turn.

    Turn k is a maximal run of action tokens s_k..e_k; its value is U_k = V[e_k] (the
    critic at the turn boundary), its reward R_k the sum of rewards over its tokens.

    Turn level (k = K..1, U_{K+1} = last_value, Ahat_{K+1} = 0):
        delta_k = R_k + gamma * U_{k+1} - U_k
        Ahat_k  = delta_k + gamma * lam * Ahat_{k+1}
    Token level inside turn k (no reward inside a turn; the last token's target is the
    turn's):
        A[e_k] = Ahat_k
        A[t]   = token_gamma * V[t+1] - V[t] + token_gamma * token_lam * A[t+1],  s_k <= t < e_k
        R[t]   = A[t] + V[t]      (so R[e_k] = Ahat_k + U_k, the turn-level return)

    With token_gamma = token_lam = 1, A[t] = Ahat_k + V[e_k] - V[t]: each token is credited
    with the turn's advantage plus how much the critic's estimate rose after it.

    Args / returns as in `gae`; gamma and lam are the turn-level discount and lambda,
    token_gamma and token_lam the ones inside a turn.
    """
    mask = mask.astype(values.dtype)
    start, end = turn_boundaries(mask)
    turn_reward = _turn_sums(rewards * mask, start)
    turn_adv, _ = gae(turn_reward * end, values * end, end, gamma, lam, last_value=last_value)
    inner = mask - end  # action tokens that are not the last of their turn
    next_value = jnp.pad(values[:, 1:], ((0, 0), (0, 1)))  # V[t+1]: same turn when inner
    delta = token_gamma * next_value - values
    advantages = reverse_linear_recurrence(
        token_gamma * token_lam * inner, delta * inner + turn_adv * end
    )
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


# ----------------------------------------------------------------------------- entry points
# Rows "gae", "turn_gae" and "bilevel_gae" of `jaxrl_agents.estimators.ESTIMATORS`:
# (rewards, values, mask, last_value, group_ids, decisions, hp) -> (advantages, returns),
# [B, T] each; `hp` is the learner's `RLHyper` (gamma, lam, gae_forced_tokens;
# token_gamma, token_lam for bilevel_gae).


def gae_advantages(rewards, values, mask, last_value, group_ids, decisions, hp):
    # decisions None: unconstrained decoding, no forced tokens, so both settings are `gae`
    # (and keep its C++ kernel on CPU).
    if hp.gae_forced_tokens == "pass_through" and decisions is not None:
        return gae_pass_through(rewards, values, mask, decisions, hp.gamma, hp.lam,
                                last_value=last_value)
    return gae(rewards, values, mask, hp.gamma, hp.lam, last_value=last_value)


def turn_gae_advantages(rewards, values, mask, last_value, group_ids, decisions, hp):
    return turn_gae(rewards, values, mask, hp.gamma, hp.lam, last_value=last_value)


def bilevel_gae_advantages(rewards, values, mask, last_value, group_ids, decisions, hp):
    return bilevel_gae(rewards, values, mask, hp.gamma, hp.lam, last_value=last_value,
                       token_gamma=hp.token_gamma, token_lam=hp.token_lam)
