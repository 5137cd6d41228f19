"""Scores over seeds: a sweep's runs grouped into arms, an arm's mean over its seeds with
a t interval, and the paired difference of two arms seed by seed.

A run's held-out interval (`logging.success_ci`) is over the games of that one run. Over
seeds the unit is the run: the seed picks the games and the initialisation, so the
spread between seeds is the one a claim has to beat. Two arms' runs of the same seed
share their games and their starting weights, which is why they are compared in pairs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np

SEED_PART = re.compile(r"(?:^|,)seed=(-?\d+)(?=,|$)")


def split_seed(run_name: str) -> tuple[str, int | None]:
    """("direct", 2) for "direct,seed=2"; (name, None) for a name without a seed part.
    A name that is only a seed ("seed=1") is arm "all"."""
    found = SEED_PART.search(run_name)
    if not found:
        return run_name, None
    arm = (run_name[: found.start()] + run_name[found.end() :]).strip(",")
    return arm or "all", int(found.group(1))


def t_interval(values, confidence: float = 0.95, bounds=(0.0, 1.0)) -> dict:
    """Mean of `values` (one per seed) with a Student-t interval over them, clipped to
    `bounds`: {"mean", "seeds", "ci_low", "ci_high"}; the interval is None below two
    values. With three seeds the half-width is 4.30 standard errors."""
    from scipy import stats

    x = np.asarray(list(values), np.float64).ravel()
    if x.size == 0:
        raise ValueError("t_interval needs at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return {"mean": mean, "seeds": 1, "ci_low": None, "ci_high": None}
    quantile = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1))
    half = quantile * float(x.std(ddof=1)) / math.sqrt(x.size)
    low, high = bounds
    return {"mean": mean, "seeds": int(x.size), "ci_low": max(low, mean - half),
            "ci_high": min(high, mean + half)}


def by_arm(scores: Mapping[str, float]) -> dict[str, dict[int, float]]:
    """{run name: score} -> {arm: {seed: score}}, arms in first-seen order. Runs without a
    seed part count as seed 0 of their own arm; two runs of one arm and seed are refused."""
    arms: dict[str, dict[int, float]] = {}
    for name, score in scores.items():
        arm, seed = split_seed(name)
        seeds = arms.setdefault(arm, {})
        seed = 0 if seed is None else seed
        if seed in seeds:
            raise ValueError(f"two runs of arm {arm!r} at seed {seed}")
        seeds[seed] = score
    return arms


def paired_difference(a: Mapping[int, float], b: Mapping[int, float],
                      confidence: float = 0.95) -> dict | None:
    """Mean over the seeds both arms ran of a[seed] - b[seed], with a t interval (bounds
    -1..1), and "per_seed": {seed: difference}. None when they share no seed."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    diffs = {seed: a[seed] - b[seed] for seed in common}
    return {**t_interval(diffs.values(), confidence, bounds=(-1.0, 1.0)), "per_seed": diffs}
