"""The RL learner: one jitted update over a packed Batch (PPO / RLOO / GRPO / REINFORCE++).

Per collected batch:
  1. `prepare`: forward passes of the critic and of the reference policy give the old
     values and reference log-probs, a chunk of rows at a time (a training micro-batch's
     rows by default; with length buckets, rows of like length, each chunk cut to its
     bucket); the KL penalty goes into the rewards (kl.where = "reward"); the
     configured estimator gives advantages and returns over the whole batch.
  2. `ppo_epochs` passes over shuffled minibatches (`trainer/fit.py`, the loop SFT and the
     reward model share); each minibatch is one jitted step (gradient accumulation over
     `grad_accum` micro-batches inside it). A non-finite loss or gradient leaves
     parameters and optimizer state untouched and is counted.

Per-token arrays follow the Batch convention: index t describes token t, so model
outputs at t - 1 (which predict token t) are shifted right by one. The data is typed end
to end (`trainer/rl_batch.py`): the Batch as a pytree on device, `prepare`'s `Prepared`,
and a `TrainBatch` of both for the gradient steps.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_agents import compile_cache, estimators, kernels, sharding
from jaxrl_agents.config import check_estimator_options, check_groups
from jaxrl_agents.data import Batch, bucket
from jaxrl_agents.models import lora
from jaxrl_agents.models.transformer import lower_part
from jaxrl_agents.models.value import share_frozen_layers
from jaxrl_agents.trainer import ewc, optim
from jaxrl_agents.trainer.fit import key_orders, steps_per_epoch, train_all_epochs
from jaxrl_agents.trainer.kl_control import KLController
from jaxrl_agents.trainer.rl_batch import Prepared, TrainBatch, on_device


@dataclasses.dataclass(frozen=True)
class RLHyper:
    """The static hyper-parameters of an update (hashable: closed over by jit), read from
    the config (`from_config`); their defaults are configs/base.py's, the one place they
    are set (`defaults()` builds one from it, with overrides, e.g. for tests)."""

    estimator: str
    gamma: float
    lam: float
    gae_forced_tokens: str  # gae: "discount" | "pass_through" (no discount after forced tokens)
    token_gamma: float  # bilevel_gae: discount inside a turn
    token_lam: float  # bilevel_gae: lambda inside a turn
    score_gamma: float  # rloo / grpo: per-turn discount of the episode score
    clip_eps: float
    clip_eps_high: float | None
    dual_clip: float | None
    loss_agg: str
    loss_tokens: str  # the tokens policy terms count (kernels.decision_mask)
    value_clip: float | None
    value_coef: float
    entropy_coef: float
    grpo_std_normalize: bool
    normalize_advantages: bool
    bootstrap_truncated: bool  # a cut episode ends with V(last state), not 0
    kl_kind: str
    kl_where: str
    ewc_coef: float  # EWC penalty weight (0 = off; see trainer/ewc.py)
    ewc_decay: float  # weight of the earlier stages' Fisher at each consolidation
    logits_chunk: int  # positions whose logits are made at once (0: the whole sequence)
    temperature: float  # the policy is softmax(logits / temperature), as sampled
    frozen_layers: int  # the policy's first layers (and the embedding) that RL keeps fixed

    @property
    def uses_critic(self) -> bool:
        return estimators.ESTIMATORS[self.estimator].needs_critic

    @classmethod
    def defaults(cls, **overrides) -> RLHyper:
        """The base config's hyper-parameters (configs/base.py), with `overrides`."""
        from configs.base import get_config

        return dataclasses.replace(cls.from_config(get_config()), **overrides)

    @classmethod
    def from_config(cls, cfg) -> RLHyper:
        a = cfg.algo
        return cls(
            estimator=a.estimator,
            gamma=a.gamma,
            lam=a.lam,
            gae_forced_tokens=a.gae_forced_tokens,
            token_gamma=a.token_gamma,
            token_lam=a.token_lam,
            score_gamma=a.score_gamma,
            clip_eps=a.clip_eps,
            clip_eps_high=a.clip_eps_high or None,
            dual_clip=a.dual_clip or None,
            loss_agg=a.loss_agg,
            loss_tokens=a.loss_tokens,
            value_clip=a.value_clip or None,
            value_coef=a.value_coef,
            entropy_coef=a.entropy_coef,
            grpo_std_normalize=a.grpo_std_normalize,
            normalize_advantages=a.normalize_advantages,
            bootstrap_truncated=a.bootstrap_truncated,
            kl_kind=cfg.kl.kind,
            kl_where=cfg.kl.where,
            ewc_coef=cfg.curriculum.ewc_coef,
            ewc_decay=cfg.curriculum.ewc_decay,
            logits_chunk=cfg.rl.logits_chunk,
            # as SamplingParams.policy_temperature: 0 (greedy rollouts) means raw logits
            temperature=cfg.rollout.temperature or 1.0,
            frozen_layers=cfg.rl.frozen_layers,
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LearnerState:
    """Everything an update changes (a pytree).

    params: nnx.State of the ActorCritic; opt_state: optax state; ref_params: nnx.State
    of the frozen reference policy, or None with LoRA adapters (the reference is then the
    policy with its adapters off: no second copy); step: optimizer steps taken; skipped:
    steps skipped for a non-finite loss or gradient; master: float32 copy of the trainable
    parameters that the optimizer updates (rl.master_weights = float32, for bfloat16
    params), else None. ewc_anchor / ewc_fisher: with EWC on, the trainable parameters and
    the diagonal Fisher the penalty holds the policy to (the Fisher is 0 until the first
    consolidation), else None. The trainable parameters (`lora.split_trainable`) are all of
    `params`, or with LoRA the adapters and the value head only: the optimizer state,
    master copy and gradients cover them alone.
    """

    params: Any
    opt_state: Any
    ref_params: Any
    step: jax.Array
    skipped: jax.Array
    master: Any = None
    ewc_anchor: Any = None
    ewc_fisher: Any = None


def _token_logprobs(policy, hidden, batch: Batch, hp: RLHyper):
    """log-probs and entropies [B, T] of the batch's tokens from the policy's hidden states
    under softmax(logits / hp.temperature), the distribution the rollouts sampled from
    (the rollout's log-probs are taken the same way), the logits made `hp.logits_chunk`
    positions at a time (0: all at once). With `batch.loss_index` the output layer runs
    only at those positions (the action tokens) and the rest are 0."""
    ids, allowed = batch.input_ids, batch.allowed
    logits = policy.logits
    if hp.temperature != 1.0:
        logits = lambda h: policy.logits(h) / hp.temperature  # noqa: E731
    if batch.loss_index is not None:
        return kernels.loss_positions_logprobs_and_entropy(
            hidden, logits, ids, batch.loss_index, allowed, chunk=hp.logits_chunk)
    if hp.logits_chunk:
        return kernels.chunked_next_token_logprobs_and_entropy(
            hidden, logits, ids, allowed, chunk=hp.logits_chunk)
    return kernels.next_token_logprobs_and_entropy(logits(hidden), ids, allowed)


def policy_mask(batch: Batch, hp: RLHyper):
    """[B, T]: the tokens the policy loss, entropy, KL terms and their metrics count (and
    advantages are whitened over): the decisions, or every action token (`hp.loss_tokens`).
    The value loss always counts every action token: GAE reads the critic at all of them."""
    if hp.loss_tokens == "actions":
        return batch.action_mask
    return kernels.decision_mask(batch.action_mask, batch.allowed)


def _forward(model, batch: Batch, hp: RLHyper, lower_hidden=None):
    """Aligned per-token outputs: logp, entropy, values [B, T] and the value after the
    last real token [B] (for truncated episodes: the critic's value of the state the
    episode was cut in when its record ends with that observation, see `prepare`).
    lower_hidden: [B, T, D] the frozen layers' output (`Prepared.lower_hidden`), which the
    pass continues from, or None (the whole model)."""
    valid = batch.valid
    if lower_hidden is not None:  # the frozen layers' output, computed once (`prepare`)
        hidden, values = model.hidden_and_values_above(
            lower_hidden, hp.frozen_layers, batch.positions, valid)
    else:
        hidden, values = model.hidden_and_values(batch.input_ids, batch.positions, valid)
    logp, ent = _token_logprobs(model.policy, hidden, batch, hp)
    return logp, ent, *_aligned_values(values, valid)


def _aligned_values(values, valid):
    """The critic's outputs [B, T] -> (values aligned with the tokens they score [B, T]: the
    value read at token t - 1, the value after the last real token [B])."""
    last = jnp.maximum(valid.sum(axis=1) - 1, 0)
    last_value = jnp.take_along_axis(values, last[:, None], axis=1)[:, 0]
    return kernels.shift_right(values), last_value


def _ref_logprobs(ref_graphdef, ref_params, batch: Batch, hp: RLHyper, lower_hidden=None):
    """The reference policy's log-probs [B, T] of the batch's tokens (`lower_hidden` as in
    `_forward`)."""
    ref = nnx.merge(ref_graphdef, ref_params)
    if lower_hidden is not None:  # frozen layers: the reference's equal the policy's
        hidden = ref.upper_hidden(lower_hidden, batch.positions, batch.valid, hp.frozen_layers)
    else:
        hidden = ref.hidden_states(batch.input_ids, batch.positions, batch.valid)
    return _token_logprobs(ref, hidden, batch, hp)[0]


def _advantages(hp: RLHyper, rewards, values, mask, last_value, group_ids, decisions,
                whiten_mask):
    """Advantages and returns [B, T] of the configured estimator (`estimators.ESTIMATORS`);
    with a critic, whitened over `whiten_mask` (`hp.normalize_advantages`). `decisions`:
    [B, T] the action tokens that were decisions, or None (unconstrained decoding)."""
    kernel = estimators.kernel(hp.estimator)
    adv, ret = kernel(rewards, values, mask, last_value, group_ids, decisions, hp)
    if hp.normalize_advantages and hp.uses_critic:
        adv = kernels.masked_whiten(adv, whiten_mask)
    return adv, ret


def chunk_rows(rows: int, max_rows: int) -> int:
    """The largest divisor of `rows` that is at most `max_rows`."""
    return max(d for d in range(1, min(rows, max_rows) + 1) if rows % d == 0)


def map_row_chunks(fn, batch, rows_per_chunk: int):
    """`fn` over the rows of `batch` (a pytree of arrays [B, ...]) in chunks of
    `rows_per_chunk`, one chunk at a time (lax.map), outputs [B, ...] back in row order.

    Chunk i holds rows i, i + n, i + 2n, ... (n chunks), so each chunk is spread over the
    devices that hold the batch's rows, as the whole batch is.
    """
    rows = jax.tree.leaves(batch)[0].shape[0]
    n = rows // rows_per_chunk
    split = lambda x: x.reshape(rows_per_chunk, n, *x.shape[1:]).swapaxes(0, 1)  # (n, c, ...)
    merge = lambda y: y.swapaxes(0, 1).reshape(rows, *y.shape[2:])  # (B, ...)
    return jax.tree.map(merge, jax.lax.map(fn, jax.tree.map(split, batch)))


def cut_columns(v, full: int, length: int):
    """A row-major array's first `length` columns when it has the batch's `full` token
    columns ([B, T, ...]); anything else ([B], [B, K]) as it is."""
    return v[:, :length] if v.ndim >= 2 and v.shape[1] == full else v


def pad_columns(v, length: int, full: int):
    """`cut_columns` undone: an array of `length` token columns zero-padded to `full`."""
    if v.ndim < 2 or v.shape[1] != length or length == full:
        return v
    return jnp.pad(v, [(0, 0), (0, full - length)] + [(0, 0)] * (v.ndim - 2))


def _old_values_and_ref_logprobs(graphdef, ref_graphdef, params, ref_params, hp: RLHyper,
                                 rows: Batch):
    """Per row: old values [b, T], the value after the last real token [b], the
    reference log-probs [b, T] and, with frozen layers, their output [b, T, D] (else
    None), which both passes continue from and the gradient steps reuse: the rollout's
    (`rows.lower_hidden`) when it kept it, else computed here."""
    model = nnx.merge(graphdef, params)
    lower = None
    if not hp.frozen_layers:
        raw = model.values(rows.input_ids, rows.positions, rows.valid)
    else:
        lower = rows.lower_hidden
        if lower is None:
            lower = model.policy.lower_hidden(rows.input_ids, rows.positions, rows.valid,
                                              hp.frozen_layers)
        lower = lower.astype(model.policy.config.jnp_dtype)
        raw = model.values_above(lower, hp.frozen_layers, rows.positions, rows.valid)
    values, last_value = _aligned_values(raw, rows.valid)
    return values, last_value, _ref_logprobs(ref_graphdef, ref_params, rows, hp, lower), lower


def forward_passes(hp: RLHyper, graphdef, ref_graphdef, state: LearnerState, rows: Batch,
                   max_chunk_rows: int | None = None):
    """The critic's and the reference policy's passes over `rows` (on device, [B, T]):
    (old values [B, T], the value after the last real token [B], reference log-probs
    [B, T], the frozen layers' output [B, T, D] or None), `chunk_rows(B, max_chunk_rows)`
    rows at a time (None: all B at once), so only one chunk's logits are ever live."""
    ref_params = state.ref_params
    if ref_params is None:  # LoRA: the policy's own weights (ref_graphdef: adapters off)
        ref_params = nnx.state(nnx.merge(graphdef, state.params).policy)
    forward = functools.partial(
        _old_values_and_ref_logprobs, graphdef, ref_graphdef, state.params, ref_params, hp
    )
    n = rows.input_ids.shape[0]
    # The whole Batch is split into chunks; the forward passes read its token fields only.
    return map_row_chunks(forward, rows, chunk_rows(n, max_chunk_rows or n))


def prepare(
    hp: RLHyper,
    graphdef,
    ref_graphdef,
    state: LearnerState,
    batch: Batch,
    kl_coef,
    max_chunk_rows: int | None = None,
) -> tuple[Prepared, dict]:
    """Old values, reference log-probs, KL-shaped rewards, advantages and returns of
    `batch` (on device, [B, T]) -> (Prepared, metrics): `forward_passes`, then
    `prepare_from` (the advantages need the whole batch: groups, whitening)."""
    passes = forward_passes(hp, graphdef, ref_graphdef, state, batch, max_chunk_rows)
    return prepare_from(hp, batch, kl_coef, *passes)


def prepare_from(hp: RLHyper, batch: Batch, kl_coef, values, last_value, ref_logp,
                 lower) -> tuple[Prepared, dict]:
    """`prepare` after its forward passes (`forward_passes`' outputs for the whole batch):
    KL-shaped rewards, advantages and returns -> (Prepared, metrics)."""
    mask = batch.action_mask
    kl_tok = kernels.kl_per_token(batch.old_logprobs, ref_logp, hp.kl_kind) * mask
    rewards = batch.rewards
    if hp.kl_where == "reward":
        rewards = rewards - kl_coef * kl_tok
    # An episode cut by its step budget or the context is over for the agent: by default
    # its return is what it earned (a budget is part of the task; bootstrapping would
    # credit a take/put-back loop that runs out the budget with the critic's hopes).
    # Bootstrapped, it ends with V(the state it was cut in), read at the last token of the
    # final observation the driver appends (`EpisodeDriver(final_observation=True)`): the
    # position whose value the value loss trains as the start of a turn. A record that ends
    # at an action (no room for the observation) is not bootstrapped: the value after an
    # action's last token is never trained.
    last = jnp.maximum(batch.valid.sum(axis=1) - 1, 0)
    ends_in_observation = jnp.take_along_axis(mask, last[:, None], axis=1)[:, 0] == 0
    last_value = (last_value * batch.truncated * hp.bootstrap_truncated
                  * ends_in_observation.astype(last_value.dtype))
    decisions = policy_mask(batch, hp)
    # The action tokens that were decisions, whatever tokens the policy terms count: the
    # estimator's view of forced tokens (algo.gae_forced_tokens; None without constrained
    # decoding, every action token a decision) and the decision_share chart.
    decision_tokens = kernels.decision_mask(mask, batch.allowed)
    adv, ret = _advantages(hp, rewards, values, mask, last_value, batch.group_ids,
                           None if batch.allowed is None else decision_tokens, decisions)
    prepared = Prepared(advantages=adv, returns=ret, old_values=values, ref_logprobs=ref_logp,
                        lower_hidden=lower)
    return prepared, _prepare_metrics(batch, prepared, kl_tok, decisions, decision_tokens)


def _prepare_metrics(batch: Batch, prepared: Prepared, kl_tok, decisions,
                     decision_tokens) -> dict:
    """`prepare`'s metrics (scalars): the KL to the reference [B, T] `kl_tok` and the
    advantages over the `decisions` tokens, the batch's returns (before the KL penalty)
    over its real rows, the share of action tokens that were decisions
    (`decision_tokens`) and the old values over its action tokens."""
    mask = batch.action_mask
    episode_return = batch.rewards.sum(axis=1)  # [B]
    return {
        "kl/ref_kl": kernels.masked_mean(kl_tok, decisions),
        "charts/return_mean": kernels.masked_mean(episode_return, batch.row_valid),
        "charts/return_var": kernels.masked_var(episode_return, batch.row_valid),
        "charts/advantage_mean": kernels.masked_mean(prepared.advantages, decisions),
        "charts/decision_share": kernels.masked_mean(decision_tokens, mask),
        "charts/value_mean": kernels.masked_mean(prepared.old_values, mask),
    }


def episode_logprobs(graphdef, params, rows: Batch, hp: RLHyper):
    """Summed log-likelihood of each row's action tokens under the policy: [b]."""
    logp, _, _, _ = _forward(nnx.merge(graphdef, params), rows, hp)
    return (logp * rows.action_mask).sum(axis=1)


def loss_fn(hp: RLHyper, graphdef, params, mb: TrainBatch, kl_coef, policy_coef,
            ewc_state=None):
    """Scalar loss and its metrics on one micro-batch (arrays [b, T]); `ewc_state`:
    (anchor, fisher) of the EWC penalty, or None."""
    model = nnx.merge(graphdef, params)
    batch, prepared = mb.batch, mb.prepared
    logp, ent, values, _ = _forward(model, batch, hp, prepared.lower_hidden)
    mask, decisions = batch.action_mask, policy_mask(batch, hp)
    pg, pg_metrics = kernels.ppo_policy_loss(
        logp,
        batch.old_logprobs,
        prepared.advantages,
        decisions,
        clip_eps=hp.clip_eps,
        clip_eps_high=hp.clip_eps_high,
        dual_clip=hp.dual_clip,
        agg=hp.loss_agg,
    )
    entropy = kernels.aggregate(ent, decisions, hp.loss_agg)
    policy_loss = pg - hp.entropy_coef * entropy
    kl_value = kernels.aggregate(
        kernels.kl_per_token(logp, prepared.ref_logprobs, hp.kl_kind), decisions, hp.loss_agg
    )
    if hp.kl_where == "loss":
        policy_loss = policy_loss + kl_coef * kl_value
    loss = policy_coef * policy_loss
    metrics = {f"losses/{k}": v for k, v in pg_metrics.items()}
    if hp.uses_critic:
        vf, vf_metrics = kernels.value_loss(
            values, prepared.old_values, prepared.returns, mask, clip=hp.value_clip,
            agg=hp.loss_agg
        )
        loss = loss + hp.value_coef * vf
        metrics["losses/value"] = vf
        metrics.update({f"losses/{k}": v for k, v in vf_metrics.items()})
    if ewc_state is not None:
        ewc_loss = ewc.penalty(lora.trainable(params), *ewc_state)
        loss = loss + hp.ewc_coef * ewc_loss
        metrics["losses/ewc"] = ewc_loss
    metrics.update(
        {
            "losses/policy": pg,
            "losses/entropy": entropy,
            "losses/kl": kl_value,
            "losses/total": loss,
        }
    )
    return loss, metrics


def _tree_all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves))


def _cast_like(tree, like):
    """`tree` with every leaf cast to the dtype of the matching leaf of `like`."""
    return jax.tree.map(lambda x, y: x.astype(y.dtype), tree, like)


def apply_gradients(tx, grads, opt_state, params, master=None):
    """One optimizer step -> (params, master, opt_state).

    Without a master copy the optimizer updates `params` themselves. With one (float32
    copies of bfloat16 params) it updates the master copy and `params` become its cast, so
    steps smaller than a parameter's bfloat16 spacing still add up.
    """
    trainable = params if master is None else master
    updates, opt_state = tx.update(grads, opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    return _cast_like(trainable, params), (None if master is None else trainable), opt_state


def _micro_weights(hp: RLHyper, micro: TrainBatch) -> jax.Array:
    """[A] weights of the micro-batches' losses: their share of the minibatch's policy
    tokens (token-mean; `policy_mask`) or of its rows with policy tokens (seq-mean-*), so
    that the accumulated gradient is the gradient of the whole minibatch's policy loss."""
    mask = policy_mask(micro.batch, hp)  # (A, b, T)
    if hp.loss_agg == "token-mean":
        counts = mask.sum(axis=(1, 2))
    else:
        counts = (mask.sum(axis=2) > 0).sum(axis=1)
    counts = counts.astype(jnp.float32)
    return counts / jnp.maximum(counts.sum(), 1.0)


def train_step(hp, graphdef, tx, state: LearnerState, micro: TrainBatch, kl_coef,
               policy_coef):
    """One optimizer step over a minibatch split as micro-batches (arrays [A, b, T]).

    Gradients of the A micro-batches are summed with `_micro_weights`; with a master copy
    they are taken with respect to it (the forward pass runs on its cast). A non-finite
    loss or gradient skips the step (parameters and optimizer state unchanged, `skipped`
    incremented). Only the trainable parameters (with LoRA: adapters and value head) get
    gradients; the frozen rest passes through.
    """
    trainable, frozen = lora.split_trainable(state.params)  # frozen: None without LoRA
    start = trainable if state.master is None else state.master

    def loss_of(start, mb):
        params = lora.merge_trainable(_cast_like(start, trainable), frozen)
        ewc_state = None if state.ewc_fisher is None else (state.ewc_anchor, state.ewc_fisher)
        return loss_fn(hp, graphdef, params, mb, kl_coef, policy_coef, ewc_state)

    weights = _micro_weights(hp, micro)
    grads, metrics = optim.accumulate_gradients(
        jax.value_and_grad(loss_of, has_aux=True), start, micro, weights)
    # During the value warm-up (policy_coef 0) only the critic trains: a trunk shared with
    # the value head would otherwise move the policy through the value loss.
    grads = jax.tree.map(
        lambda g, owner: g * policy_coef.astype(g.dtype) if owner == "policy" else g,
        grads,
        optim.actor_critic_labels(grads),
    )
    grads = zero_frozen(grads, hp.frozen_layers)
    finite = _tree_all_finite(grads) & jnp.isfinite(metrics["losses/total"])
    new_trainable, new_master, new_opt = apply_gradients(
        tx, grads, state.opt_state, trainable, state.master
    )
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    metrics["losses/grad_norm"] = optax.tree.norm(grads)
    metrics["losses/skipped"] = 1.0 - finite.astype(jnp.float32)
    new_state = LearnerState(
        params=lora.merge_trainable(keep(new_trainable, trainable), frozen),
        opt_state=keep(new_opt, state.opt_state),
        ref_params=state.ref_params,
        step=state.step + 1,
        skipped=state.skipped + (1 - finite.astype(jnp.int32)),
        master=keep(new_master, state.master),
        ewc_anchor=state.ewc_anchor,
        ewc_fisher=state.ewc_fisher,
    )
    return new_state, metrics


def zero_frozen(grads, frozen_layers: int):
    """`grads` (an ActorCritic state) with the token embedding's and the first
    `frozen_layers` layers' gradients set to 0 (all of them as they are when 0).

    Adam then leaves those parameters exactly as they were (zero moments, zero steps), so
    their output stays the one `prepare` computed. The embedding is frozen with them: the
    lowest layers read it, and a tied output layer is the same table.
    """
    if not frozen_layers:
        return grads

    def zero(path, g):
        part = lower_part(path, frozen_layers)
        return g if part is None else g.at[part].set(0)

    return jax.tree_util.tree_map_with_path(zero, grads)


def check_frozen_layers(actor_critic, frozen_layers: int) -> None:
    """A clear error for an `rl.frozen_layers` this model cannot run."""
    if not frozen_layers:
        return
    layers = actor_critic.policy.config.num_layers
    if not 0 < frozen_layers < layers:
        raise ValueError(f"rl.frozen_layers={frozen_layers}: must be 0 (off) or below the "
                         f"model's {layers} layers")
    if lora.has_adapters(nnx.state(actor_critic)):
        raise ValueError("rl.frozen_layers and model.lora both choose what trains: set one")


def consolidate(hp: RLHyper, graphdef, state: LearnerState, batch: Batch) -> LearnerState:
    """EWC at the end of a stage: the Fisher of the policy on `batch` (the stage's episodes)
    joins the earlier ones (`hp.ewc_decay`) and the current parameters become the anchor
    (the trainable ones: with LoRA, adapters and value head)."""
    trainable, frozen = lora.split_trainable(state.params)
    logp = lambda t, rows: episode_logprobs(  # noqa: E731
        graphdef, lora.merge_trainable(t, frozen), rows, hp)
    fisher = ewc.diagonal_fisher(logp, trainable, batch)
    return dataclasses.replace(
        state,
        ewc_anchor=jax.tree.map(jnp.copy, trainable),
        ewc_fisher=ewc.merge(state.ewc_fisher, fisher, hp.ewc_decay),
    )


class RLLearner:
    """Owns the jitted `prepare` / `train_step` programs and the KL controller.

    `learner.update(state, batch, key) -> (state, metrics)` runs every PPO epoch and
    minibatch of one collected batch; metrics are fetched to the host once per update.

    With a `mesh`, the state lives on it (by the logical-axis rules) and each minibatch is
    split over its ('data', 'fsdp') axes. Multi-host: every process calls `update` with
    its own rows (same shapes on every process); they form one global batch.

    `prepare_rows` caps the rows of each forward chunk in `prepare` (None: a training
    micro-batch's rows, minibatch_size // grad_accum, whose forward pass the train step
    already holds in memory).

    With `length_buckets`, each minibatch is cut to the bucket of its own longest episode
    rather than the whole batch's (right padding: the cut columns are padding, so the
    step is the same; attention's cost is quadratic in T, so a minibatch of short
    episodes costs far less), and so is each chunk of `prepare`'s forward passes, whose
    rows are grouped by length. One program is compiled per bucket.
    """

    def __init__(
        self,
        actor_critic,
        hp: RLHyper,
        tx: optax.GradientTransformation,
        *,
        ppo_epochs: int = 1,
        minibatch_size: int = 16,
        grad_accum: int = 1,
        kl: KLController | None = None,
        value_warmup_updates: int = 0,
        mesh: jax.sharding.Mesh | None = None,
        master_weights: bool = False,
        prepare_rows: int | None = None,
        length_buckets: Sequence[int] | None = None,
    ):
        if minibatch_size % grad_accum:
            raise ValueError(
                f"rl.minibatch_size={minibatch_size} is not divisible by rl.grad_accum={grad_accum}"
            )
        check_frozen_layers(actor_critic, hp.frozen_layers)
        self.hp, self.tx = hp, tx
        self.ppo_epochs, self.minibatch_size, self.grad_accum = (
            ppo_epochs,
            minibatch_size,
            grad_accum,
        )
        self.kl = kl or KLController("fixed", 0.0)
        self.value_warmup_updates = value_warmup_updates
        self.mesh = mesh
        self.master_weights = master_weights  # keep a float32 copy for the optimizer
        self.prepare_rows = prepare_rows
        self.length_buckets = tuple(length_buckets) if length_buckets else None
        self.graphdef, _ = nnx.split(actor_critic)
        with lora.adapters_off(actor_critic.policy):  # the reference: no adapters
            self.ref_graphdef = nnx.graphdef(actor_critic.policy)
        self._prepare = jax.jit(
            functools.partial(prepare, hp, self.graphdef, self.ref_graphdef), static_argnums=3
        )
        # With length buckets, `prepare` in two parts: the forward passes per chunk of rows
        # cut to its length (one program per bucket), then the rest over the whole batch.
        self._forward_passes = jax.jit(
            functools.partial(forward_passes, hp, self.graphdef, self.ref_graphdef))
        self._prepare_from = jax.jit(functools.partial(prepare_from, hp))
        self._train_step = jax.jit(
            functools.partial(train_step, hp, self.graphdef, tx),
            donate_argnums=(0,),
            **self._step_shardings(actor_critic),
        )
        self._consolidate = jax.jit(functools.partial(consolidate, hp, self.graphdef))
        replicated = {} if mesh is None else {
            "out_shardings": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())}
        self._count_valid = jax.jit(lambda valid: valid.sum(axis=1), **replicated)
        self.updates = 0

    def _step_shardings(self, actor_critic) -> dict:
        """On a mesh, jit's out_shardings for train_step: the new state placed as
        `init_state` places it (left to XLA, the 8-bit moments' blocks would come back in
        another layout and the next step would compile again), metrics replicated."""
        if self.mesh is None:
            return {}
        graphdef, params = nnx.split(actor_critic)
        abstract = jax.eval_shape(lambda p: self._fresh_state(nnx.merge(graphdef, p)), params)
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        return {"out_shardings": (sharding.state_shardings(abstract, self.mesh), replicated)}

    def init_state(self, actor_critic) -> LearnerState:
        """Fresh optimizer state; the reference policy is a frozen copy of the policy now
        (with LoRA adapters: the same weights with the adapters off, no copy)."""
        state = self._fresh_state(actor_critic)
        # On a mesh: every leaf placed as the update leaves it (one compilation per shape).
        return state if self.mesh is None else sharding.shard_params(state, self.mesh)

    def _fresh_state(self, actor_critic) -> LearnerState:
        # A separate critic reads the policy's frozen layers: make its own copy of them
        # the policy's (SFT trained the policy alone).
        share_frozen_layers(actor_critic, self.hp.frozen_layers)
        # Copies: a separate critic starts as a clone whose arrays alias the policy's,
        # and donated buffers must be distinct.
        params = jax.tree.map(jnp.copy, nnx.state(actor_critic))
        trainable = lora.trainable(params)  # with LoRA: adapters and value head
        ref_params = None  # with LoRA: the policy with adapters off (see `prepare`)
        if not lora.has_adapters(params):
            ref_params = jax.tree.map(jnp.copy, nnx.state(actor_critic.policy))
        master = None
        if self.master_weights:
            # jnp.array copies: astype would hand back float32 leaves (LoRA adapters, the
            # value head) themselves, and the step donates params and master together
            master = jax.tree.map(lambda x: jnp.array(x, jnp.float32), trainable)
        anchor = fisher = None
        if self.hp.ewc_coef > 0:  # allocated from the start: one checkpoint layout per run
            anchor = jax.tree.map(jnp.copy, trainable)
            fisher = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), trainable)
        return LearnerState(
            params=params,
            opt_state=self.tx.init(trainable if master is None else master),
            ref_params=ref_params,
            step=jnp.zeros((), jnp.int32),
            skipped=jnp.zeros((), jnp.int32),
            master=master,
            ewc_anchor=anchor,
            ewc_fisher=fisher,
        )

    def _row_lengths(self, batch: Batch) -> np.ndarray | None:
        """Real tokens per row [B] on the host (every process gets all rows), or None
        when minibatches are not cut."""
        if self.length_buckets is None:
            return None
        return np.asarray(self._count_valid(batch.valid))

    def _minibatch_length(self, lengths: np.ndarray | None, idx: np.ndarray, full: int) -> int:
        """The padded length a minibatch of rows `idx` is cut to (at most `full`)."""
        if lengths is None:
            return full
        return min(bucket(max(int(lengths[idx].max()), 1), self.length_buckets), full)

    def _prepare_by_length(self, state: LearnerState, batch: Batch, kl_coef, chunk: int,
                           lengths: np.ndarray) -> tuple[Prepared, dict]:
        """`prepare` with its forward passes over chunks of `chunk` rows of like length,
        each cut to the bucket of its longest episode (`lengths`: real tokens per row [B]).

        The whole batch is padded to its longest episode: uncut, one episode past 2,560
        tokens runs every row at 3,072 (the real-model recipe's buckets). Outputs are padded
        back to the batch's length (zeros past each chunk's cut: padding, which every
        later use masks) and put back in row order.
        """
        full = batch.input_ids.shape[1]
        order = np.argsort(-lengths, kind="stable")  # longest first
        chunk = chunk_rows(len(order), chunk)

        def passes_of(idx):
            length = self._minibatch_length(lengths, idx, full)
            rows = jax.tree.map(lambda v: cut_columns(v[idx], full, length), batch)
            passes = self._forward_passes(state, rows)
            return jax.tree.map(lambda v: pad_columns(v, length, full), passes)

        parts = [passes_of(order[i:i + chunk]) for i in range(0, len(order), chunk)]
        inverse = np.argsort(order)
        passes = jax.tree.map(lambda *vs: jnp.concatenate(vs)[inverse], *parts)
        return self._prepare_from(batch, kl_coef, *passes)

    def _micro_batches(self, rows: TrainBatch, idx: np.ndarray, accum: int, length: int,
                       real: int | None = None) -> TrainBatch:
        """Rows `idx`, cut to `length` columns, as [accum, len(idx) // accum, ...], split
        over the mesh's batch axes; with `real`, rows after the first `real` get an all-zero
        action mask (they fill a short minibatch and add nothing to its losses)."""
        b = len(idx) // accum
        full = rows.batch.input_ids.shape[1]

        def take(v):
            v = cut_columns(v[idx], full, length)
            return v.reshape((accum, b) + v.shape[1:])

        micro = jax.tree.map(take, rows)
        if real is not None and real < len(idx):
            keep = jnp.asarray((np.arange(len(idx)) < real).reshape(accum, b, 1), jnp.float32)
            batch = dataclasses.replace(micro.batch, action_mask=micro.batch.action_mask * keep)
            micro = dataclasses.replace(micro, batch=batch)
        if self.mesh is None or b % sharding.batch_shards(self.mesh):
            return micro
        spec = jax.sharding.PartitionSpec(None, sharding.BATCH_AXES)
        return jax.device_put(micro, jax.sharding.NamedSharding(self.mesh, spec))

    def consolidate(self, state: LearnerState, batch: Batch) -> LearnerState:
        """EWC: anchors the penalty at the current parameters, with the Fisher of the
        policy on `batch` added (a stage's last episodes; see `consolidate`)."""
        if self.hp.ewc_coef <= 0:
            raise ValueError("EWC is off (curriculum.ewc_coef = 0): nothing to consolidate")
        state = self._consolidate(state, on_device(batch, self.mesh))
        return state if self.mesh is None else sharding.shard_params(state, self.mesh)

    def update(self, state: LearnerState, batch: Batch, key) -> tuple[LearnerState, dict]:
        batch = on_device(batch, self.mesh)
        kl_coef = jnp.float32(self.kl.value)
        rows = batch.input_ids.shape[0]  # global: every process's rows
        mb_size = min(self.minibatch_size, rows)
        accum = self.grad_accum if mb_size % self.grad_accum == 0 else 1
        prepare_rows = self.prepare_rows or mb_size // accum
        lengths, full = self._row_lengths(batch), batch.input_ids.shape[1]
        start, compiled = time.perf_counter(), compile_cache.compile_seconds()
        if lengths is None:
            prepared, prep_metrics = self._prepare(state, batch, kl_coef, prepare_rows)
        else:
            prepared, prep_metrics = self._prepare_by_length(
                state, batch, kl_coef, prepare_rows, lengths)
        jax.block_until_ready(prepared)
        prepare_s = time.perf_counter() - start
        # The rollout's frozen-layer output, if any, now lives in `prepared` alone.
        train_rows = TrainBatch(dataclasses.replace(batch, lower_hidden=None), prepared)
        policy_coef = jnp.float32(0.0 if self.updates < self.value_warmup_updates else 1.0)

        def minibatch(idx, real):  # rows idx[:real], cut to their length bucket
            length = self._minibatch_length(lengths, idx[:real], full)
            return self._micro_batches(train_rows, idx, accum, length, real)

        def step(state, micro):
            return self._train_step(state, micro, kl_coef, policy_coef)

        # Every row is used every epoch: a short last minibatch is topped up to the compiled
        # size with rows from the epoch's start, whose tokens are masked out.
        state, step_metrics = train_all_epochs(
            step, state, order=key_orders(rows, key), rows_per_step=mb_size, batch_of=minibatch,
            num_epochs=self.ppo_epochs, top_up=True)
        metrics = jax.device_get({**prep_metrics, **_mean_metrics(step_metrics)})
        metrics = {k: float(v) for k, v in metrics.items()}
        # Where the update's time goes: the old-values / reference pass, the gradient steps,
        # and the part of both that was compilation.
        metrics["perf/prepare_s"] = prepare_s
        metrics["perf/train_steps_s"] = time.perf_counter() - start - prepare_s
        metrics["perf/learner_compile_s"] = compile_cache.compile_seconds() - compiled
        if self.hp.frozen_layers:  # 1: the frozen layers' output came with the rollout
            metrics["perf/frozen_output_reused"] = float(batch.lower_hidden is not None)
        metrics["losses/skipped_total"] = float(state.skipped)
        num_tokens = int(jnp.sum(batch.action_mask))
        metrics["kl/coef"] = self.kl.value
        self.kl.update(metrics["kl/ref_kl"], num_tokens)
        self.updates += 1
        return state, metrics


def _mean_metrics(metrics: list[dict]) -> dict:
    """The update's metrics: each step's averaged over its steps, except `losses/skipped`
    (summed) and the approximate KL of the policy from the rollout policy. The first step
    measures it before any change (exactly 0), so `losses/approx_kl` is the mean over the
    later steps, and `losses/approx_kl_end` the last step's: the movement of the update.
    The critic's explained variance pools the steps' residual and return variances: a
    mean of per-step ratios would be swamped by a minibatch whose returns are all equal
    (all games lost: 1 - resid / 1e-8, thousands below zero)."""
    out = {k: jnp.mean(jnp.stack([m[k] for m in metrics])) for k in metrics[0]}
    if "losses/resid_var" in out:
        out["losses/explained_var"] = kernels.explained_variance(
            out.pop("losses/resid_var"), out.pop("losses/return_var"))
    out["losses/skipped"] = jnp.sum(jnp.stack([m["losses/skipped"] for m in metrics]))
    kl = jnp.stack([m["losses/approx_kl"] for m in metrics])
    out["losses/approx_kl"] = jnp.mean(kl[1:]) if len(metrics) > 1 else kl[0]
    out["losses/approx_kl_end"] = kl[-1]
    return out


def make_learner(
    cfg, actor_critic, *, total_updates: int, episodes_per_update: int, mesh=None
):
    """Builds the RLLearner and optimizer the config asks for (state on `mesh` if given)."""
    check_groups(cfg)  # RLOO / GRPO need rollout.group_size >= 2
    check_estimator_options(cfg)  # algo.gae_forced_tokens = pass_through needs "gae"
    hp = RLHyper.from_config(cfg)
    steps_per_update = cfg.rl.ppo_epochs * steps_per_epoch(
        episodes_per_update, min(cfg.rl.minibatch_size, episodes_per_update))

    def schedule(lr):
        return optim.lr_schedule(
            cfg.rl.lr_schedule,
            lr,
            total_steps=total_updates * steps_per_update,
            steps_per_decay=max(200 // max(episodes_per_update, 1), 1) * steps_per_update,
        )

    tx = optim.actor_critic_adam(
        schedule(cfg.rl.learning_rate),
        schedule(cfg.rl.critic_learning_rate),
        cfg.rl.max_grad_norm,
        state=cfg.rl.optimizer_state,
    )
    return RLLearner(
        actor_critic,
        hp,
        tx,
        ppo_epochs=cfg.rl.ppo_epochs,
        minibatch_size=cfg.rl.minibatch_size,
        grad_accum=cfg.rl.grad_accum,
        kl=KLController.from_config(cfg.kl),
        value_warmup_updates=cfg.rl.value_warmup_updates,
        master_weights=cfg.rl.master_weights == "float32",
        mesh=mesh,
        length_buckets=cfg.rollout.length_buckets,
    )
