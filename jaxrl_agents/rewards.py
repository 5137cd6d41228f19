"""Host-side reward shaping, applied to per-turn rewards before packing (pure NumPy).

- `density`: move intermediate reward in time (sparse / every_k / dense), total kept.
- `mix_rewards`: weighted sum of named reward components (`CODE_MIX`, `TEXT_MIX`).
- `scale_rewards`: multiply, divide by a running std of returns, clip.
- `RunningMeanStd`: the running statistics behind the normalisation; its state is a
  plain dict (`to_dict` / `from_dict`) that goes into the checkpoint's meta.

Typical use in the trainer, per collected batch:

    per_turn = [density(ep_rewards, cfg.env.reward_density, cfg.env.reward_k) for ...]
    if cfg.rl.reward_norm:
        normalizer.update(episode_returns(per_turn, gamma=cfg.algo.gamma))
    per_turn = [scale_rewards(r, scale=..., clip=..., normalizer=normalizer) for ...]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

DENSITY_KINDS = ("sparse", "every_k", "dense")

# Reward recipes: component name -> weight. Weights of a recipe sum to 1.
CODE_MIX = {"env": 0.6, "tests": 0.3, "style": 0.1}  # code env: outcome, tests passed, lint
TEXT_MIX = {"env": 0.8, "progress": 0.2}  # text games: game score, quest progress


def _check_finite(values: np.ndarray, what: str) -> None:
    """Raises ValueError naming `what` and the first bad index if any value is NaN/inf."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{what} must be finite; entry {i} is {values.flat[i]!r} "
            f"({bad.size} non-finite of {values.size})"
        )


class RunningMeanStd:
    """Running mean and variance of a stream of scalars (Chan et al. parallel update).

    `update(x)` merges a whole batch at once, so the result equals the mean/variance of
    everything seen so far (population variance), independent of how it was batched.
    """

    def __init__(self, mean: float = 0.0, var: float = 1.0, count: float = 0.0):
        self.mean = float(mean)
        self.var = float(var)  # population variance; 1.0 until data arrives
        self.count = float(count)

    def update(self, x) -> None:
        """Merges the values of `x` (any shape; flattened) into the statistics."""
        x = np.asarray(x, np.float64).ravel()
        if x.size == 0:
            return
        _check_finite(x, "RunningMeanStd.update input")
        self.update_from_moments(float(x.mean()), float(x.var()), x.size)

    def update_from_moments(self, batch_mean: float, batch_var: float, batch_count: int):
        """Merges a batch given by its mean, population variance and size."""
        if batch_count <= 0:
            return
        if self.count == 0:
            self.mean, self.var, self.count = batch_mean, batch_var, float(batch_count)
            return
        total = self.count + batch_count
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * batch_count
        m2 += delta * delta * self.count * batch_count / total
        self.mean += delta * batch_count / total
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def to_dict(self) -> dict:
        """JSON-serialisable state, for the checkpoint's meta."""
        return {"mean": self.mean, "var": self.var, "count": self.count}

    @classmethod
    def from_dict(cls, state: Mapping) -> RunningMeanStd:
        missing = {"mean", "var", "count"} - set(state)
        if missing:
            raise KeyError(f"RunningMeanStd state lacks {sorted(missing)}; got {sorted(state)}")
        return cls(state["mean"], state["var"], state["count"])

    def __repr__(self) -> str:
        return f"RunningMeanStd(mean={self.mean:.4g}, var={self.var:.4g}, count={self.count:g})"


def episode_returns(rewards_per_episode: Sequence[Sequence[float]], gamma: float = 1.0):
    """Discounted return from the first turn of every episode: [N] float64.

    G = sum_t gamma^t r_t. This is what `RunningMeanStd` tracks for reward normalisation.
    """
    out = np.zeros(len(rewards_per_episode), np.float64)
    for i, rewards in enumerate(rewards_per_episode):
        r = np.asarray(rewards, np.float64)
        _check_finite(r, f"rewards of episode {i}")
        out[i] = float(np.sum(r * gamma ** np.arange(r.size)))
    return out


def scale_rewards(
    rewards,
    *,
    scale: float = 1.0,
    clip: float = 0.0,
    normalizer: RunningMeanStd | None = None,
    eps: float = 1e-8,
) -> np.ndarray:
    """r' = clip(r * scale / std, -clip, clip), elementwise; same shape, float32.

    Args:
      rewards: any shape (a per-turn list, or [B, T] token rewards).
      scale: multiplier applied first (cfg.rl.reward_scale).
      clip: clip to [-clip, clip] when > 0 (cfg.rl.reward_clip); 0 = off.
      normalizer: running statistics of returns (already updated by the caller); rewards
        are divided by its std (not mean-centred, so the sign of a reward is kept).
        Ignored until it has seen at least two values.
      eps: floor on the std.
    """
    r = np.asarray(rewards, np.float64)
    _check_finite(r, "rewards")
    if clip < 0:
        raise ValueError(f"clip must be >= 0 (0 = off); got {clip}")
    r = r * scale
    if normalizer is not None and normalizer.count >= 2:
        r = r / max(normalizer.std, eps)
    if clip > 0:
        r = np.clip(r, -clip, clip)
    return r.astype(np.float32)


def mix_rewards(components: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """sum_name weights[name] * components[name].

    Every component must have a weight and every weight a component; otherwise a
    KeyError names the unknown or missing component. Values must be finite.
    """
    unknown = sorted(set(components) - set(weights))
    if unknown:
        raise KeyError(
            f"unknown reward component(s) {unknown}; the weights know {sorted(weights)}"
        )
    missing = sorted(set(weights) - set(components))
    if missing:
        raise KeyError(f"reward component(s) {missing} missing; got {sorted(components)}")
    total = 0.0
    for name, weight in weights.items():
        value = float(components[name])
        if not math.isfinite(value) or not math.isfinite(float(weight)):
            raise ValueError(f"reward component {name!r}: value {value} weight {weight}")
        total += float(weight) * value
    return total


def density(rewards_per_turn: Sequence[float], kind: str, k: int = 1) -> list[float]:
    """Re-times one episode's per-turn rewards; the total is preserved.

    - "dense": unchanged.
    - "sparse": every turn gets 0 except the last, which gets the episode's total.
    - "every_k": reward accumulates and is paid on turns k, 2k, ... (1-based) and on the
      last turn; other turns get 0. k >= the episode length behaves like "sparse".

    Args:
      rewards_per_turn: [N] one float per turn (N may be 0).
      kind: one of DENSITY_KINDS.
      k: release period for "every_k" (>= 1).
    Returns: [N] list of floats.
    """
    if kind not in DENSITY_KINDS:
        raise ValueError(f"reward density kind {kind!r} unknown; choose from {DENSITY_KINDS}")
    r = np.asarray(rewards_per_turn, np.float64).ravel()
    _check_finite(r, "rewards_per_turn")
    n = r.size
    if kind == "dense" or n == 0:
        return r.tolist()
    if kind == "sparse":
        period = n
    else:
        if int(k) != k or k < 1:
            raise ValueError(f"every_k reward density needs an integer k >= 1; got {k!r}")
        period = int(k)
    out = np.zeros(n, np.float64)
    release = np.arange(period - 1, n, period)  # turns k-1, 2k-1, ... (0-based)
    if release.size == 0 or release[-1] != n - 1:
        release = np.append(release, n - 1)
    starts = np.concatenate([[0], release[:-1] + 1])
    sums = np.add.reduceat(r, starts)  # reward earned in each (start, release] window
    out[release] = sums
    return out.tolist()
