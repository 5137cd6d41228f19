"""Pure, jitted maths of multi-turn RL. Arrays are [B, T] unless a docstring says not."""

from jaxrl_agents.kernels.gae import (
    bilevel_gae,
    gae,
    gae_pass_through,
    turn_boundaries,
    turn_gae,
)
from jaxrl_agents.kernels.group import broadcast_to_tokens, episode_scores, grpo, rloo
from jaxrl_agents.kernels.kl import kl, kl_per_token
from jaxrl_agents.kernels.losses import (
    LOSS_TOKENS,
    aggregate,
    allowed_logits,
    chunked_next_token_logprobs_and_entropy,
    decision_mask,
    entropy,
    explained_variance,
    loss_positions_logprobs_and_entropy,
    next_token_logprobs,
    next_token_logprobs_and_entropy,
    ppo_policy_loss,
    shift_right,
    target_logprobs_and_entropy,
    token_entropy,
    token_logprobs,
    value_loss,
)
from jaxrl_agents.kernels.reinforce import reinforce_pp
from jaxrl_agents.kernels.stats import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "allowed_logits",
    "chunked_next_token_logprobs_and_entropy",
    "LOSS_TOKENS",
    "aggregate",
    "bilevel_gae",
    "broadcast_to_tokens",
    "decision_mask",
    "entropy",
    "episode_scores",
    "explained_variance",
    "gae",
    "gae_pass_through",
    "grpo",
    "kl",
    "kl_per_token",
    "loss_positions_logprobs_and_entropy",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "next_token_logprobs",
    "next_token_logprobs_and_entropy",
    "ppo_policy_loss",
    "reinforce_pp",
    "rloo",
    "shift_right",
    "target_logprobs_and_entropy",
    "token_entropy",
    "token_logprobs",
    "turn_boundaries",
    "turn_gae",
    "value_loss",
]
