"""Episode-level estimators without a critic that compare samples of one task instance:
RLOO and GRPO, and their entry points for the learner (`rloo_advantages`,
`grpo_advantages`; the signature of `jaxrl_agents.estimators`).

They take one score per episode (`episode_scores`) and the id of the task instance it
was sampled from; samples that share a `group_id` are compared with each other. Their
advantages are spread over the episode's action tokens with `broadcast_to_tokens`.
"""

import jax
import jax.numpy as jnp

from jaxrl_agents.kernels.gae import turn_boundaries
from jaxrl_agents.kernels.scan import reverse_linear_recurrence


def _group_matrix(group_ids):
    """[N] ids -> [N, N] float, 1 where two episodes share a group."""
    return (group_ids[:, None] == group_ids[None, :]).astype(jnp.float32)


@jax.jit
def rloo(scores, group_ids):
    """REINFORCE leave-one-out: each score minus the mean of the others in its group.

        A_i = s_i - (sum_{j in g(i)} s_j - s_i) / (n_g - 1)

    Args:
      scores: [N] float, one per episode (e.g. its total reward).
      group_ids: [N] int, the task instance each episode was sampled from.
    Returns:
      [N] advantages; 0 for an episode alone in its group.
    """
    same = _group_matrix(group_ids)
    n = same.sum(axis=1)
    others_mean = (same @ scores - scores) / jnp.maximum(n - 1.0, 1.0)
    return jnp.where(n > 1, scores - others_mean, 0.0)


@jax.jit
def _grpo(scores, group_ids, std_normalize, eps):
    same = _group_matrix(group_ids)
    n = same.sum(axis=1)
    mean = same @ scores / n
    centred = scores - mean
    # Sample std over the group (ddof=1), as GRPO implementations use.
    sq_dev = same * jnp.square(scores[None, :] - mean[:, None])  # [N, N]
    std = jnp.sqrt(sq_dev.sum(axis=1) / jnp.maximum(n - 1.0, 1.0))
    normalised = jnp.where(std_normalize, centred / (std + eps), centred)
    return jnp.where(n > 1, normalised, 0.0)


def grpo(scores, group_ids, *, std_normalize=True, eps=1e-6):
    """Group-relative advantages: (s_i - mean_g) / (std_g + eps), std optional.

    Shapes as in `rloo`; std_g is the sample standard deviation of the group.
    """
    return _grpo(scores, group_ids, std_normalize, eps)


def broadcast_to_tokens(episode_values, mask):
    """[N] per-episode values -> [N, T] on the episode's action tokens."""
    return episode_values[:, None] * mask.astype(episode_values.dtype)


def episode_scores(rewards, mask=None, gamma=1.0):
    """Return of each episode from its first turn: [B, T] -> [B].

        score = sum_k gamma^(k-1) * (sum of the rewards on turn k's tokens)

    The discount is per turn, not per token (a turn's reward sits on its last action token;
    per-token penalties such as the KL share their turn's discount). gamma = 1 is the plain
    sum. A gamma other than 1 needs the action `mask` (it defines the turns).
    """
    if mask is None:
        return rewards.sum(axis=1)
    mask = mask.astype(rewards.dtype)
    _, end = turn_boundaries(mask)
    # x[t] = r[t] + c[t] * x[t+1], c = gamma where the next token starts a later turn.
    carry = 1.0 + (gamma - 1.0) * end.astype(rewards.dtype)
    return reverse_linear_recurrence(carry, rewards * mask)[:, 0]


# ----------------------------------------------------------------------------- entry points
# Rows "rloo" and "grpo" of `jaxrl_agents.estimators.ESTIMATORS`:
# (rewards, values, mask, last_value, group_ids, decisions, hp) -> (advantages, returns),
# [B, T] each; the returns are the episode scores on its action tokens (no critic trains
# on them).


def _episode_level(episode_adv_fn, rewards, mask, group_ids, hp):
    """An episode-level estimator's advantages and scores, spread over its action tokens."""
    scores = episode_scores(rewards, mask, hp.score_gamma)
    adv = broadcast_to_tokens(episode_adv_fn(scores, group_ids), mask)
    return adv, broadcast_to_tokens(scores, mask)


def rloo_advantages(rewards, values, mask, last_value, group_ids, decisions, hp):
    return _episode_level(rloo, rewards, mask, group_ids, hp)


def grpo_advantages(rewards, values, mask, last_value, group_ids, decisions, hp):
    normalize = hp.grpo_std_normalize
    return _episode_level(lambda s, g: grpo(s, g, std_normalize=normalize), rewards, mask,
                          group_ids, hp)
