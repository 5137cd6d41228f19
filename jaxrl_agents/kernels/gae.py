"""Generalised advantage estimation over action tokens only.

A multi-turn trajectory is one token sequence; only action tokens (mask == 1) are steps
of the MDP. Observation and padding tokens are skipped: they carry the running state
through unchanged and get advantage 0. With s' the next action token after t,

    delta[t] = r[t] + gamma * V[s'] - V[t]          (V after the last one: last_value)
    A[t]     = delta[t] + gamma * lam * A[s']        (A after the last one: 0)
    R[t]     = A[t] + V[t]

so for a terminal episode the last action token gets A = r - V.

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
    mask = mask.astype(values.dtype)
    batch = values.shape[0]
    next_value = jnp.zeros((batch,), values.dtype) if last_value is None else last_value
    next_value = next_value.astype(values.dtype)
    rewards = rewards.astype(values.dtype)
    if values.dtype != jnp.float32 or not native.available():
        return _gae_scan(rewards, values, mask, next_value, gamma, lam)
    return jax.lax.platform_dependent(
        rewards, values, mask, next_value, gamma, lam,
        cpu=native.gae_cpu, default=_gae_scan,
    )


def _gae_scan(rewards, values, mask, next_value, gamma, lam):
    """`gae` as a `lax.scan` over time-major slices (any platform, any float dtype)."""

    def step(carry, x):
        next_v, next_adv = carry
        r, v, m = x
        adv = r + gamma * next_v - v + gamma * lam * next_adv
        is_action = m > 0
        carry = (jnp.where(is_action, v, next_v), jnp.where(is_action, adv, next_adv))
        return carry, adv * m

    init = (next_value, jnp.zeros_like(next_value))
    _, advantages = jax.lax.scan(step, init, (rewards.T, values.T, mask.T), reverse=True)
    advantages = advantages.T  # (B, T)
    return advantages, (advantages + values) * mask


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
# (rewards, values, mask, last_value, group_ids, hp) -> (advantages, returns), [B, T] each;
# `hp` is the learner's `RLHyper` (gamma, lam; token_gamma, token_lam for bilevel_gae).


def gae_advantages(rewards, values, mask, last_value, group_ids, hp):
    return gae(rewards, values, mask, hp.gamma, hp.lam, last_value=last_value)


def turn_gae_advantages(rewards, values, mask, last_value, group_ids, hp):
    return turn_gae(rewards, values, mask, hp.gamma, hp.lam, last_value=last_value)


def bilevel_gae_advantages(rewards, values, mask, last_value, group_ids, hp):
    return bilevel_gae(rewards, values, mask, hp.gamma, hp.lam, last_value=last_value,
                       token_gamma=hp.token_gamma, token_lam=hp.token_lam)
