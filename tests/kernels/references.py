"""Straightforward NumPy loops the kernels are checked against, and random test batches."""

import numpy as np


def random_batch(seed, batch=6, length=40, *, all_padding_row=True, one_token_row=True):
    """Rewards, values, action mask and last values shaped like packed multi-turn episodes.

    Rows alternate observation runs (mask 0) and action runs (mask 1), then padding.
    Row 0 is all padding and row 1 holds a single action token, when asked for.
    """
    rng = np.random.default_rng(seed)
    mask = np.zeros((batch, length), np.float32)
    for b in range(batch):
        t, end = 0, rng.integers(length // 2, length + 1)
        while t < end:
            t += rng.integers(1, 6)  # observation
            run = rng.integers(1, 5)  # action
            mask[b, t : min(t + run, end)] = 1.0
            t += run
    if all_padding_row:
        mask[0] = 0.0
    if one_token_row:
        mask[1] = 0.0
        mask[1, 3] = 1.0
    rewards = rng.normal(size=(batch, length)).astype(np.float32)
    values = rng.normal(size=(batch, length)).astype(np.float32)
    last_value = rng.normal(size=(batch,)).astype(np.float32)
    return rewards, values, mask, last_value


def gae(rewards, values, mask, gamma, lam, last_value=None):
    adv = np.zeros_like(values)
    for b in range(values.shape[0]):
        next_v = 0.0 if last_value is None else last_value[b]
        next_adv = 0.0
        for t in reversed(np.flatnonzero(mask[b])):
            delta = rewards[b, t] + gamma * next_v - values[b, t]
            next_adv = delta + gamma * lam * next_adv
            adv[b, t] = next_adv
            next_v = values[b, t]
    return adv, (adv + values) * mask


def turns(mask_row):
    """List of (start, end) inclusive index pairs of the action runs of one row."""
    out, start = [], None
    for t, m in enumerate(mask_row):
        if m and start is None:
            start = t
        if not m and start is not None:
            out.append((start, t - 1))
            start = None
    if start is not None:
        out.append((start, len(mask_row) - 1))
    return out


def turn_gae(rewards, values, mask, gamma, lam, last_value=None):
    adv = np.zeros_like(values)
    ret = np.zeros_like(values)
    for b in range(values.shape[0]):
        next_v = 0.0 if last_value is None else last_value[b]
        next_adv = 0.0
        for start, end in reversed(turns(mask[b])):
            v = values[b, start]
            r = rewards[b, start : end + 1].sum()
            next_adv = r + gamma * next_v - v + gamma * lam * next_adv
            adv[b, start : end + 1] = next_adv
            ret[b, start : end + 1] = next_adv + v
            next_v = v
    return adv, ret


def bilevel_gae(rewards, values, mask, gamma, lam, last_value=None, token_gamma=1.0,
                token_lam=1.0):
    adv = np.zeros_like(values)
    for b in range(values.shape[0]):
        next_u = 0.0 if last_value is None else last_value[b]
        next_adv = 0.0
        for start, end in reversed(turns(mask[b])):
            u = values[b, end]
            r = rewards[b, start : end + 1].sum()
            next_adv = r + gamma * next_u - u + gamma * lam * next_adv
            next_u = u
            a = adv[b, end] = next_adv
            for t in range(end - 1, start - 1, -1):
                a = token_gamma * values[b, t + 1] - values[b, t] + token_gamma * token_lam * a
                adv[b, t] = a
    return adv, (adv + values) * mask


def episode_scores(rewards, mask, gamma=1.0):
    out = np.zeros(rewards.shape[0], np.float64)
    for b in range(rewards.shape[0]):
        for k, (start, end) in enumerate(turns(mask[b])):
            out[b] += gamma**k * rewards[b, start : end + 1].sum()
    return out


def rloo(scores, group_ids):
    out = np.zeros_like(scores)
    for i in range(len(scores)):
        others = [scores[j] for j in range(len(scores)) if group_ids[j] == group_ids[i] and j != i]
        out[i] = scores[i] - np.mean(others) if others else 0.0
    return out


def grpo(scores, group_ids, std_normalize=True, eps=1e-6):
    out = np.zeros_like(scores)
    for i in range(len(scores)):
        group = np.array([scores[j] for j in range(len(scores)) if group_ids[j] == group_ids[i]])
        if len(group) < 2:
            continue
        out[i] = scores[i] - group.mean()
        if std_normalize:
            out[i] /= group.std(ddof=1) + eps
    return out


def reinforce_pp(rewards, mask, gamma, eps=1e-8):
    ret = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        g = 0.0
        for t in reversed(np.flatnonzero(mask[b])):
            g = rewards[b, t] + gamma * g
            ret[b, t] = g
    vals = ret[mask > 0]
    adv = (ret - vals.mean()) / np.sqrt(vals.var() + eps) * mask if vals.size else ret * 0
    return adv, ret


def aggregate(per_token, mask, agg):
    rows = [b for b in range(mask.shape[0]) if mask[b].sum() > 0]
    if agg == "token-mean":
        return (per_token * mask).sum() / max(mask.sum(), 1.0)
    if not rows:
        return 0.0
    if agg == "seq-mean-token-sum":
        return np.mean([(per_token[b] * mask[b]).sum() for b in rows])
    return np.mean([(per_token[b] * mask[b]).sum() / mask[b].sum() for b in rows])


def ppo_per_token(logp, old_logp, adv, clip_eps, clip_high=None, dual_clip=None):
    high = clip_eps if clip_high is None else clip_high
    out = np.zeros_like(logp)
    for idx in np.ndindex(logp.shape):
        ratio = np.exp(logp[idx] - old_logp[idx])
        a = adv[idx]
        loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_eps), 1 + high))
        if dual_clip is not None and a < 0:
            loss = min(loss, -a * dual_clip)
        out[idx] = loss
    return out


def value_per_token(values, old_values, returns, clip):
    out = np.zeros_like(values)
    for idx in np.ndindex(values.shape):
        v, old, r = values[idx], old_values[idx], returns[idx]
        err = (v - r) ** 2
        if clip:
            v_clip = old + min(max(v - old, -clip), clip)
            err = max(err, (v_clip - r) ** 2)
        out[idx] = 0.5 * err
    return out


def entropy_per_token(logits):
    out = np.zeros(logits.shape[:-1], np.float64)
    for idx in np.ndindex(out.shape):
        z = logits[idx].astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        out[idx] = -(p * np.log(p)).sum()
    return out


def kl_per_token(logp, ref_logp, kind):
    d = logp.astype(np.float64) - ref_logp
    return {"k1": d, "k2": 0.5 * d**2, "k3": np.exp(-d) - 1 + d}[kind]
