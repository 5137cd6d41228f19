"""The RL learner's typed data on device: the packed `Batch` as a pytree, what `prepare`
adds to it (`Prepared`), and both together (`TrainBatch`), the rows a gradient step reads.

`Batch` (data/trajectory.py) is packed on the host without JAX. Registering it here makes
it a pytree (every field a leaf; an unused optional field, None, holds none), so that
`jax.jit`, tree maps (row chunks, micro-batch slicing) and mesh placement take it whole
and the learner reads its fields by name.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_agents import distributed
from jaxrl_agents.data import Batch

jax.tree_util.register_dataclass(Batch)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prepared:
    """What `rl.prepare` computes once per update for the gradient steps (B rows, T tokens).

    advantages, returns: [B, T] of the configured estimator, 0 off the action tokens.
    old_values: [B, T] the critic before the update, aligned as the Batch (index t: token t).
    ref_logprobs: [B, T] the reference policy's log-probs of the batch's tokens.
    lower_hidden: [B, T, D] the frozen layers' output (rl.frozen_layers > 0), else None.
    """

    advantages: jax.Array
    returns: jax.Array
    old_values: jax.Array
    ref_logprobs: jax.Array
    lower_hidden: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """A batch and what `prepare` computed from it: the rows of an update, [B, ...], or one
    minibatch split as micro-batches, [A, b, ...] (`RLLearner._micro_batches`)."""

    batch: Batch
    prepared: Prepared


def on_device(batch: Batch, mesh: jax.sharding.Mesh | None = None) -> Batch:
    """`batch` as jax.Arrays: on the default device, or on `mesh` with its rows split over
    the batch axes (multi-host: every process passes its own rows of one global batch)."""
    if mesh is None:
        return jax.tree.map(jnp.asarray, batch)
    return distributed.global_batch(batch, mesh)
