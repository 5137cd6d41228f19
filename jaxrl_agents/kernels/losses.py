"""Policy, value and entropy losses on action tokens; each returns (loss, metrics).

`mask` is 1 on action tokens. Losses are aggregated by `aggregate`:
  token-mean:          sum over all action tokens / their number
  seq-mean-token-sum:  mean over sequences of the per-sequence token sum
  seq-mean-token-mean: mean over sequences of the per-sequence token mean
Sequences with no action token (all padding) are left out of sequence means.
"""

import functools

import jax
import jax.numpy as jnp

from jaxrl_agents.kernels.stats import masked_mean

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def aggregate(per_token, mask, agg="token-mean"):
    """Reduces a [B, T] per-token loss to a scalar over masked-in tokens."""
    mask = mask.astype(per_token.dtype)
    if agg == "token-mean":
        return masked_mean(per_token, mask)
    seq_tokens = mask.sum(axis=1)
    seq_sum = (per_token * mask).sum(axis=1)
    if agg == "seq-mean-token-sum":
        per_seq = seq_sum
    elif agg == "seq-mean-token-mean":
        per_seq = seq_sum / jnp.maximum(seq_tokens, 1.0)
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}; choose from {AGGREGATIONS}")
    has_tokens = (seq_tokens > 0).astype(per_token.dtype)
    return masked_mean(per_seq, has_tokens)


LOSS_TOKENS = ("decisions", "actions")


def decision_mask(action_mask, allowed=None):
    """[B, T]: the action tokens that were a decision, i.e. not forced. A token is forced
    when constrained decoding allowed it exactly one id (`allowed` [B, T, K], -1 padded, as
    in `next_token_logprobs_and_entropy`): its log-prob is 0 under every policy, so it adds
    no gradient to a loss, only weight to a token mean. Without `allowed` every action
    token was drawn from the whole vocabulary and is a decision."""
    if allowed is None:
        return action_mask
    one_id = allowed[..., 0] >= 0
    if allowed.shape[-1] > 1:
        one_id = one_id & (allowed[..., 1] < 0)
    return action_mask * (~one_id).astype(action_mask.dtype)


def token_logprobs(logits, targets):
    """log softmax(logits)[targets]: [B, T, V], [B, T] int -> [B, T] (float32)."""
    logits = logits.astype(jnp.float32)
    # The target's logit minus the log-normaliser: no [B, T, V] log-softmax is kept, which
    # made forward + backward over a 49k vocabulary ~30% faster on CPU.
    target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return target - jax.nn.logsumexp(logits, axis=-1)


def shift_right(x_bt, fill=0.0):
    """[B, T, ...] -> [B, T, ...] with x[:, t] moved to t + 1 and `fill` at t = 0.

    Model outputs at position t describe token t + 1; shifting them right aligns them
    with the token they predict, the convention of every per-token array in a Batch.
    """
    pad = [(0, 0), (1, 0)] + [(0, 0)] * (x_bt.ndim - 2)
    return jnp.pad(x_bt[:, :-1], pad, constant_values=fill)


def next_targets(x_bt):
    """[B, T, ...] -> [B, T, ...] with x[:, t + 1] at t (the target position t predicts) and
    x[:, 0] wrapped to the last position (a target nothing uses).

    The next-token kernels shift the targets left instead of slicing the logits to T - 1
    positions: a slice of [B, T, V] logits is a copy of them, and its gradient a padded copy
    (0.4 GB each at 4 x 512 tokens and SmolLM2's 49k vocabulary). The last position's
    log-prob is computed and dropped by `shift_right`.
    """
    return jnp.roll(x_bt, -1, axis=1)


def next_token_logprobs(logits, input_ids):
    """log p(token t | tokens < t) for every t: [B, T, V], [B, T] -> [B, T]; 0 at t = 0."""
    return shift_right(token_logprobs(logits, next_targets(input_ids)))


_NOT_ALLOWED = -1e30  # finite, so an all-masked row has finite gradients


def allowed_logits(logits, ids):
    """The logits of each position's allowed ids: [B, T, V], [B, T, K] int32 (-1 pads the
    list) -> [B, T, K], a large negative value on padding."""
    return jnp.where(ids >= 0, jnp.take_along_axis(logits, jnp.maximum(ids, 0), axis=-1),
                     _NOT_ALLOWED)


def target_logprobs_and_entropy(logits, targets, allowed=None):
    """log p(target) and the entropy of the distribution each target was drawn from:
    logits [B, n, V] predicting targets [B, n] -> ([B, n], [B, n]) float32; `allowed`
    [B, n, K] as in `next_token_logprobs_and_entropy` (already aligned with targets)."""
    logits = logits.astype(jnp.float32)
    # log p = logit - lse and H = lse - sum(p * logit): one [B, n, V] softmax, no
    # log-softmax array beside it.
    lse = jax.nn.logsumexp(logits, axis=-1)  # (B, n)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    logp = target_logit - lse
    ent = lse - jnp.sum(jnp.exp(logits - lse[..., None]) * logits, axis=-1)
    if allowed is not None:
        ok = allowed >= 0
        picked = allowed_logits(logits, allowed)
        logp_k = jax.nn.log_softmax(picked, axis=-1)  # (B, n, K)
        constrained = ok.any(axis=-1)
        logp = jnp.where(constrained, target_logit - jax.nn.logsumexp(picked, axis=-1), logp)
        ent_k = -jnp.sum(jnp.where(ok, jnp.exp(logp_k) * logp_k, 0.0), axis=-1)
        ent = jnp.where(constrained, ent_k, ent)
    return logp, ent


def next_token_logprobs_and_entropy(logits, input_ids, allowed=None):
    """log p(token t | tokens < t) and the entropy of the distribution token t was drawn from,
    both aligned with the tokens: [B, T, V], [B, T] -> ([B, T], [B, T]), 0 at t = 0.

    allowed: optional [B, T, K] int32, the distinct ids token t was restricted to when it
    was sampled (constrained decoding; -1 pads the list). Where a list holds no id, token t
    was drawn from the whole vocabulary. Restricted tokens get log-probs and entropies of
    the softmax over their allowed ids only, exactly the distribution the sampler drew from.
    """
    logp, ent = target_logprobs_and_entropy(
        logits, next_targets(input_ids), None if allowed is None else next_targets(allowed)
    )
    return shift_right(logp), shift_right(ent)


def chunked_next_token_logprobs_and_entropy(hidden, unembed, input_ids, allowed=None, *,
                                            chunk: int):
    """`next_token_logprobs_and_entropy(unembed(hidden), input_ids, allowed)` with the
    logits made `chunk` positions at a time and made again in the backward pass, so at
    most [B, chunk, V] of them exist at once instead of [B, T, V] (a 150k vocabulary at
    T = 4096 is 2.5 GB per row in float32).

    hidden [B, T, D]; unembed: [B, c, D] -> [B, c, V] logits (e.g. `Transformer.logits`).
    """
    b, t = input_ids.shape
    n = t - 1
    steps = -(-n // chunk)
    extra = steps * chunk - n
    hidden = jnp.pad(hidden[:, :-1], ((0, 0), (0, extra), (0, 0)))
    targets = jnp.pad(input_ids[:, 1:], ((0, 0), (0, extra)))
    if allowed is not None:
        allowed = jnp.pad(allowed[:, 1:], ((0, 0), (0, extra), (0, 0)), constant_values=-1)

    @jax.checkpoint
    def one_chunk(part):
        h, y, a = part
        return target_logprobs_and_entropy(unembed(h), y, a)

    split = lambda x: x.reshape(b, steps, chunk, *x.shape[2:]).swapaxes(0, 1)
    parts = (split(hidden), split(targets), None if allowed is None else split(allowed))
    logp, ent = jax.lax.map(one_chunk, parts)  # (steps, B, chunk) each
    merge = lambda y: jnp.pad(y.swapaxes(0, 1).reshape(b, -1)[:, :n], ((0, 0), (1, 0)))
    return merge(logp), merge(ent)


def loss_positions_logprobs_and_entropy(hidden, unembed, input_ids, index, allowed=None, *,
                                        chunk: int = 0):
    """`next_token_logprobs_and_entropy(unembed(hidden), input_ids, allowed)` at the positions
    in `index` only, 0 elsewhere: the output layer runs on [B, A, D] instead of [B, T, D].

    hidden [B, T, D]; unembed: [..., D] -> [..., V] logits; input_ids [B, T]; index [B, A]
    int32, the positions t >= 1 whose token's log-prob enters a loss (e.g. action tokens),
    0 on padding (position 0 is never predicted); allowed [B, T, K] as there. With `chunk`,
    the logits are made `chunk` of the A positions at a time and made again in the backward
    pass, as in `chunked_next_token_logprobs_and_entropy`.
    Returns ([B, T], [B, T]) float32.
    """
    b, a = index.shape
    h = jnp.take_along_axis(hidden, jnp.maximum(index - 1, 0)[..., None], axis=1)  # (B, A, D)
    targets = jnp.take_along_axis(input_ids, index, axis=1)  # (B, A)
    picked = None if allowed is None else jnp.take_along_axis(allowed, index[..., None], axis=1)
    if chunk and chunk < a:
        steps = -(-a // chunk)
        pad = lambda x, value=0: jnp.pad(  # noqa: E731
            x, [(0, 0), (0, steps * chunk - a)] + [(0, 0)] * (x.ndim - 2), constant_values=value)
        split = lambda x: x.reshape(b, steps, chunk, *x.shape[2:]).swapaxes(0, 1)  # noqa: E731

        @jax.checkpoint
        def one_chunk(part):
            hc, yc, kc = part
            return target_logprobs_and_entropy(unembed(hc), yc, kc)

        parts = (split(pad(h)), split(pad(targets)),
                 None if picked is None else split(pad(picked, -1)))
        logp, ent = jax.lax.map(one_chunk, parts)  # (steps, B, chunk) each
        logp, ent = (y.swapaxes(0, 1).reshape(b, -1)[:, :a] for y in (logp, ent))
    else:
        logp, ent = target_logprobs_and_entropy(unembed(h), targets, picked)
    rows = jnp.arange(b)[:, None]
    real = index > 0

    def scatter(x_ba):
        return jnp.zeros(input_ids.shape, jnp.float32).at[rows, index].add(
            jnp.where(real, x_ba, 0.0))

    return scatter(logp), scatter(ent)


@functools.partial(jax.jit, static_argnames=("agg",))
def ppo_policy_loss(
    logp,
    old_logp,
    adv,
    mask,
    *,
    clip_eps,
    clip_eps_high=None,
    dual_clip=None,
    agg="token-mean",
):
    """PPO-clip surrogate on action tokens.

        ratio = exp(logp - old_logp)
        L     = max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps_high))
        dual clip (A < 0 only): L = min(L, -A * dual_clip)

    Args:
      logp, old_logp, adv, mask: [B, T].
      clip_eps: lower clip range; clip_eps_high: upper range (None = clip_eps).
      dual_clip: constant c > 1 of dual-clip PPO (None = off).
    Returns:
      (loss scalar, metrics: clip_frac, dual_clip_frac, approx_kl, ratio_mean, ratio_max).
    """
    mask = mask.astype(logp.dtype)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = (logp - old_logp) * mask
    ratio = jnp.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + high)
    per_token = jnp.maximum(unclipped, clipped)
    metrics = {"clip_frac": masked_mean((clipped > unclipped).astype(logp.dtype), mask)}
    if dual_clip is not None:
        capped = jnp.minimum(per_token, -adv * dual_clip)
        dual_active = (adv < 0) & (capped < per_token)
        per_token = jnp.where(adv < 0, capped, per_token)
        metrics["dual_clip_frac"] = masked_mean(dual_active.astype(logp.dtype), mask)
    metrics["approx_kl"] = masked_mean(ratio - 1.0 - log_ratio, mask)  # k3 of new vs old
    metrics["ratio_mean"] = masked_mean(ratio, mask)
    metrics["ratio_max"] = jnp.max(jnp.where(mask > 0, ratio, 0.0))
    return aggregate(per_token, mask, agg), metrics


@functools.partial(jax.jit, static_argnames=("clip", "agg"))
def value_loss(values, old_values, returns, mask, *, clip, agg="token-mean"):
    """Clipped value loss: 0.5 * max((V - R)^2, (V_clip - R)^2).

        V_clip = old_V + clip(V - old_V, -clip, clip);   clip=None (or 0) turns clipping off.

    Args: values, old_values, returns, mask: [B, T].
    Returns: (loss, metrics: value_clip_frac, value_mean, explained_var, and its parts
    resid_var and return_var, which an update pools over its steps: a minibatch whose
    returns are all equal has no variance to explain).
    """
    mask = mask.astype(values.dtype)
    err = jnp.square(values - returns)
    if clip:
        v_clip = old_values + jnp.clip(values - old_values, -clip, clip)
        err_clip = jnp.square(v_clip - returns)
        per_token = 0.5 * jnp.maximum(err, err_clip)
        clip_frac = masked_mean((err_clip > err).astype(values.dtype), mask)
    else:
        per_token = 0.5 * err
        clip_frac = jnp.zeros((), values.dtype)
    resid_var = masked_mean(
        jnp.square(returns - values - masked_mean(returns - values, mask)), mask
    )
    ret_var = masked_mean(jnp.square(returns - masked_mean(returns, mask)), mask)
    metrics = {
        "value_clip_frac": clip_frac,
        "value_mean": masked_mean(values, mask),
        "explained_var": explained_variance(resid_var, ret_var),
        "resid_var": resid_var,
        "return_var": ret_var,
    }
    return aggregate(per_token, mask, agg), metrics


def explained_variance(resid_var, return_var):
    """1 - Var(R - V) / Var(R); the variances may be pooled over minibatches first."""
    return 1.0 - resid_var / jnp.maximum(return_var, 1e-8)


def token_entropy(logits):
    """Entropy of the softmax at every position: [B, T, V] -> [B, T] (float32)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


@functools.partial(jax.jit, static_argnames=("agg",))
def entropy(logits, mask, agg="token-mean"):
    """Mean policy entropy over action tokens: ([B, T, V], [B, T]) -> (scalar, metrics).

    The caller subtracts coef * entropy from its loss to reward exploration.
    """
    ent = aggregate(token_entropy(logits), mask, agg)
    return ent, {"entropy": ent}
