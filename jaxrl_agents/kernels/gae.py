"""Generalised advantage estimation over action tokens only.

A multi-turn trajectory is one token sequence; only action tokens (mask == 1) are steps
of the MDP. Observation and padding tokens are skipped: they carry the running state
through unchanged and get advantage 0. With s' the next action token after t,

    delta[t] = r[t] + gamma * V[s'] - V[t]          (V after the last one: last_value)
    A[t]     = delta[t] + gamma * lam * A[s']        (A after the last one: 0)
    R[t]     = A[t] + V[t]

so for a terminal episode the last action token gets A = r - V.
"""

import jax
import jax.numpy as jnp

from jaxrl_agents.kernels.scan import fill_backward, fill_forward


@jax.jit
def gae(rewards, values, mask, gamma, lam, *, last_value=None):
    """Token-level GAE, one reverse scan over time carrying (V[s'], A[s']).

    Args:
      rewards: [B, T] float; the reward of a turn sits on its last action token.
      values: [B, T] float, the critic's V at every token.
      mask: [B, T], 1 on action tokens, 0 on prompt / observation / padding.
      gamma, lam: scalars.
      last_value: [B] value after the last action token (0 = terminal); None means 0.
    Returns:
      (advantages [B, T], returns [B, T]), both 0 where mask == 0.
    """
    mask = mask.astype(values.dtype)
    batch = values.shape[0]
    next_value = jnp.zeros((batch,), values.dtype) if last_value is None else last_value

    def step(carry, x):
        next_v, next_adv = carry
        r, v, m = x
        adv = r + gamma * next_v - v + gamma * lam * next_adv
        is_action = m > 0
        carry = (jnp.where(is_action, v, next_v), jnp.where(is_action, adv, next_adv))
        return carry, adv * m

    init = (next_value.astype(values.dtype), jnp.zeros((batch,), values.dtype))
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
