"""The advantage estimators, in one table: config validation, the learner and the docs
read it. JAX-free (a config loads without importing JAX): each entry names its kernel,
which is imported only when the learner asks for it.

Adding an estimator: one entry here, its kernel in `jaxrl_agents/kernels/` with an entry
point of the signature below next to it, and its test.

    kernel(rewards [B, T], values [B, T], mask [B, T], last_value [B], group_ids [B],
           decisions [B, T] or None, hp) -> (advantages [B, T], returns [B, T])

`decisions` marks the action tokens that were decisions, not forced by constrained
decoding (`kernels.decision_mask`); None when decoding was unconstrained (every action
token a decision). `hp` is the learner's `RLHyper` (gamma, lam and the estimator's own
settings).
"""

from __future__ import annotations

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Estimator:
    kernel: str  # "module:function", see the module docstring
    needs_critic: bool  # reads the value head (and trains it)
    needs_groups: bool  # compares samples of one task instance: rollout.group_size >= 2
    about: str


ESTIMATORS: dict[str, Estimator] = {
    "gae": Estimator("jaxrl_agents.kernels.gae:gae_advantages", True, False,
                     "token-level GAE over action tokens (gamma, lam, gae_forced_tokens)"),
    "turn_gae": Estimator("jaxrl_agents.kernels.gae:turn_gae_advantages", True, False,
                          "GAE with one step per turn; a turn's advantage on all its tokens"),
    "bilevel_gae": Estimator("jaxrl_agents.kernels.gae:bilevel_gae_advantages", True,
                             False, "turn-level GAE, then token-level GAE inside each turn "
                             "(token_gamma, token_lam)"),
    "rloo": Estimator("jaxrl_agents.kernels.group:rloo_advantages", False, True,
                      "episode score minus the mean of the others in its group"),
    "grpo": Estimator("jaxrl_agents.kernels.group:grpo_advantages", False, True,
                      "episode score standardised within its group (grpo_std_normalize)"),
    "reinforce_pp": Estimator("jaxrl_agents.kernels.reinforce:reinforce_pp_advantages",
                              False, False, "discounted returns, whitened over the batch"),
}
GROUP_ESTIMATORS = tuple(name for name, e in ESTIMATORS.items() if e.needs_groups)


def kernel(name: str):
    """The advantage function of estimator `name` (imports its module, and JAX)."""
    module, function = ESTIMATORS[name].kernel.split(":")
    return getattr(importlib.import_module(module), function)
