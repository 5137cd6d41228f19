"""Optimizers, learning-rate schedules and gradient accumulation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxrl_agents.models.transformer import key_name
from jaxrl_agents.trainer.optim8bit import adam_8bit

SCHEDULES = ("constant", "linear", "step_decay")
OPTIMIZER_STATES = ("float32", "int8")  # Adam moments: float32 | block-wise 8-bit


def lr_schedule(kind: str, lr: float, *, total_steps: int, steps_per_decay: int = 0):
    """Learning rate as a function of the optimizer step.

    constant; linear (to 0 at total_steps); step_decay (x0.9 every `steps_per_decay`
    steps: the paper's "decay 10% every 200 episodes" once episodes are turned into steps).
    """
    if kind == "constant":
        return optax.constant_schedule(lr)
    if kind == "linear":
        return optax.linear_schedule(lr, 0.0, max(total_steps, 1))
    if kind == "step_decay":
        return optax.exponential_decay(lr, max(steps_per_decay, 1), 0.9, staircase=True)
    raise ValueError(f"rl.lr_schedule {kind!r}; allowed: {list(SCHEDULES)}")


def _in_float32(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` run in float32: its state starts from float32 copies of the parameters and
    it reads float32 casts of the gradients.

    optax's Adam makes its moments like the parameters (mu_dtype covers only the first),
    keeps the state's dtypes, and forms (1 - b) * g in the gradient's dtype, so with
    bfloat16 parameters both moments would be bfloat16: the slow second-moment average
    stalls once its increments fall under bfloat16's spacing. The updates come out
    float32; `optax.apply_updates` adds them and casts the sum to the parameters' dtype.
    """

    def to_float32(tree):
        return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)

    def init(params):
        return tx.init(to_float32(params))

    def update(updates, state, params=None):
        return tx.update(to_float32(updates), state, params)

    return optax.GradientTransformation(init, update)


def _adam(schedule, state: str) -> optax.GradientTransformation:
    if state == "float32":
        return _in_float32(optax.adam(schedule))
    if state == "int8":
        return adam_8bit(schedule)
    raise ValueError(f"rl.optimizer_state {state!r}; allowed: {list(OPTIMIZER_STATES)}")


def adam(schedule, max_grad_norm: float = 0.0, state: str = "float32"):
    """Adam with optional global-norm gradient clipping; `state` is the moments' storage
    (float32, or int8: optim8bit's block-wise 8-bit moments)."""
    parts = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm > 0 else []
    return optax.chain(*parts, _adam(schedule, state))


def actor_critic_labels(params):
    """"policy" / "critic" for every parameter of an ActorCritic state.

    "critic": the value head, and the critic's own trunk when it is separate. "policy":
    everything else. A trunk shared with the value head is the policy's: NNX lists a shared
    module once, possibly under critic/trunk (then no "policy" subtree exists at all), so a
    critic/trunk parameter counts as the critic's only when a policy subtree exists beside it.
    """
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    shared_trunk = not any(key_name(path[0]) == "policy" for path in paths)

    def label(path, _):
        names = [key_name(k) for k in path]
        if names[0] != "critic":
            return "policy"
        if len(names) > 1 and names[1] == "trunk" and shared_trunk:
            return "policy"
        return "critic"

    return jax.tree_util.tree_map_with_path(label, params)


def actor_critic_adam(
    policy_schedule, critic_schedule, max_grad_norm: float = 0.0, state: str = "float32"
):
    """Adam with one learning rate for the policy and another for the critic.

    Labels come from `actor_critic_labels`: the value head (and a separate critic's trunk)
    train at the critic's rate, everything else, a trunk shared with the value head
    included, at the policy's. The gradient-norm clip is global, over both. `state` is the
    moments' storage, as in `adam`.
    """

    parts = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm > 0 else []
    split = optax.multi_transform(
        {"policy": _adam(policy_schedule, state), "critic": _adam(critic_schedule, state)},
        actor_critic_labels,
    )
    return optax.chain(*parts, split)


def accumulate_gradients(grad_fn, params, micro, weights):
    """sum_a weights[a] * grad of micro-batch a, one micro-batch at a time (`lax.scan`: only
    one micro-batch's activations are alive at once).

    grad_fn(params, mb) -> ((loss, metrics), grads), as `jax.value_and_grad(..., has_aux=True)`
    gives; micro: a tree of [A, ...] arrays (A micro-batches); weights: [A], each
    micro-batch's share of the whole batch's loss (they sum to 1 when the losses are means
    over the micro-batches, so that the sum is the whole batch's gradient).
    Returns (grads, metrics), the metrics summed over the micro-batches with the same weights.
    """

    def accumulate(grads_sum, mb_and_weight):
        mb, weight = mb_and_weight
        (_, metrics), grads = grad_fn(params, mb)
        grads_sum = jax.tree.map(lambda s, g: s + (weight * g).astype(s.dtype), grads_sum, grads)
        return grads_sum, metrics

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, metrics = jax.lax.scan(accumulate, zeros, (micro, weights))
    return grads, jax.tree.map(lambda m: jnp.sum(weights * m), metrics)
