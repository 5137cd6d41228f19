"""REINFORCE++: discounted returns over action tokens, whitened over the batch (no critic,
no groups), and its entry point for the learner (`reinforce_pp_advantages`; the
signature of `jaxrl_agents.estimators`)."""

import jax

from jaxrl_agents.kernels.scan import reverse_linear_recurrence
from jaxrl_agents.kernels.stats import masked_whiten


@jax.jit
def reinforce_pp(rewards, mask, gamma):
    """REINFORCE++: per-token discounted returns over action tokens, whitened batch-wide.

        G[t] = r[t] + gamma * G[s']   (s' the next action token),   A = whiten(G)

    Args:
      rewards: [B, T]; mask: [B, T] action tokens; gamma: scalar.
    Returns:
      (advantages [B, T], returns [B, T]), 0 where mask == 0.
    """
    mask = mask.astype(rewards.dtype)
    returns = reverse_linear_recurrence(1.0 - mask + mask * gamma, rewards * mask) * mask
    return masked_whiten(returns, mask), returns


def reinforce_pp_advantages(rewards, values, mask, last_value, group_ids, decisions, hp):
    """Row "reinforce_pp" of `jaxrl_agents.estimators.ESTIMATORS`: [B, T] -> (adv, ret)."""
    return reinforce_pp(rewards, mask, hp.gamma)
