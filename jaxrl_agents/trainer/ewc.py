"""Elastic weight consolidation (EWC) against forgetting earlier curriculum stages.

When the curriculum leaves a stage, the parameters at that moment become the anchor and
the diagonal of the empirical Fisher information of the policy on that stage's episodes
measures how much each parameter mattered there:

    F_i = mean over episodes e of (d/d theta_i  sum_t log pi(a_t | s_t))^2     (action tokens)

Later updates pay  coef / 2 * sum_i F_i (theta_i - anchor_i)^2.  Over several stages the
Fishers add up, the older ones scaled by `decay` ("online" EWC), and the anchor moves to the
newest stage's parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def diagonal_fisher(episode_logp, params, batch):
    """Empirical diagonal Fisher of `params` over the episodes (rows) of `batch`.

    batch: a `Batch` on device (a pytree, `trainer/rl_batch.py`), arrays [B, ...].
    episode_logp(params, rows) -> [b]: the summed action log-likelihood of each row of a
    batch slice (a Batch of arrays [b, ...]). Rows with `row_valid` 0 (packing filler) do
    not count.
    Gradients are taken one row at a time (`lax.scan`), so memory holds one gradient
    and the running sum.
    Returns a tree like `params` (float32).
    """

    def squared_grad(row):
        rows = jax.tree.map(lambda x: x[None], row)
        grad = jax.grad(lambda p: episode_logp(p, rows)[0])(params)
        return jax.tree.map(lambda g: jnp.square(g.astype(jnp.float32)), grad)

    def add_row(total, row):
        weight = row.row_valid.astype(jnp.float32)
        total = jax.tree.map(lambda t, g: t + weight * g, total, squared_grad(row))
        return total, None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    total, _ = jax.lax.scan(add_row, zeros, batch)
    count = jnp.maximum(batch.row_valid.astype(jnp.float32).sum(), 1.0)
    return jax.tree.map(lambda t: t / count, total)


def penalty(params, anchor, fisher) -> jax.Array:
    """0.5 * sum_i F_i (theta_i - anchor_i)^2 over every leaf (a float32 scalar)."""
    terms = jax.tree.map(
        lambda p, a, f: jnp.sum(f * jnp.square(p.astype(jnp.float32) - a.astype(jnp.float32))),
        params, anchor, fisher)
    return 0.5 * sum(jax.tree.leaves(terms))


def merge(old_fisher, new_fisher, decay: float):
    """The Fisher after one more stage: decay * old + new."""
    return jax.tree.map(lambda o, n: decay * o + n, old_fisher, new_fisher)
