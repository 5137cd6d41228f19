"""KL estimators between the policy and the frozen reference, per sampled token.

With d = logp - ref_logp (log pi(a) - log pi_ref(a), a sampled from pi):
    k1 = d                        unbiased, can be negative
    k2 = d^2 / 2                  low variance, biased
    k3 = exp(-d) - 1 + d          unbiased, always >= 0 (Schulman's estimator)
"""

import functools

import jax
import jax.numpy as jnp

from jaxrl_agents.kernels.losses import aggregate
from jaxrl_agents.kernels.stats import masked_mean

KL_KINDS = ("k1", "k2", "k3")


def kl_per_token(logp, ref_logp, kind="k1"):
    """[B, T], [B, T] -> [B, T] estimate of KL(pi || pi_ref) at every token."""
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * jnp.square(d)
    if kind == "k3":
        return jnp.expm1(-d) + d
    raise ValueError(f"unknown KL estimator {kind!r}; choose from {KL_KINDS}")


@functools.partial(jax.jit, static_argnames=("kind", "agg"))
def kl(logp, ref_logp, mask, kind="k1", agg="token-mean"):
    """KL penalty aggregated over action tokens: ([B, T] x3) -> (scalar, metrics)."""
    per_token = kl_per_token(logp, ref_logp, kind)
    loss = aggregate(per_token, mask, agg)
    return loss, {f"kl_{kind}": loss, "kl_k1_mean": masked_mean(logp - ref_logp, mask)}
