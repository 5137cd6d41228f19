"""Statistics of held-out success (NumPy and SciPy on the host; the masked reductions
of the jitted kernels are `kernels/stats.py`).

- One run: success over its games with a Wilson interval (`success_ci`), or with an
  interval over games when each game was played several times (`clustered_success_ci`).
- Over seeds: a sweep's runs grouped into arms (`split_seed`, `by_arm`), an arm's mean
  over its seeds with a t interval (`t_interval`), and the paired difference of two arms
  seed by seed (`paired_difference`). The seed picks the games and the initialisation,
  so the spread between seeds is the one a claim has to beat; two arms' runs of the same
  seed share their games and their starting weights, which is why they are paired.
- Two evaluations game by game: the games only one of them won, with McNemar's exact
  test (`paired_games`, `mcnemar_exact`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import numpy as np

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


# --- one run: success over its games ----------------------------------------------------


def success_ci(successes: Iterable, z: float = Z95) -> dict:
    """Success rate with a Wilson score interval (95% by default).

    successes: one bool / 0-1 value per game. Returns
    {"mean", "n", "ci_low", "ci_high"}; with no games, mean is None and the interval [0, 1].
    """
    s = np.asarray(list(successes), np.float64).ravel()
    n = int(s.size)
    if n == 0:
        return {"mean": None, "n": 0, "ci_low": 0.0, "ci_high": 1.0}
    if not np.all((s == 0) | (s == 1)):
        raise ValueError("success_ci expects 0/1 (or bool) outcomes")
    p = float(s.mean())
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return {
        "mean": p,
        "n": n,
        "ci_low": max(0.0, min(p, centre - half)),  # min/max: rounding at k = 0 or n
        "ci_high": min(1.0, max(p, centre + half)),
    }


def clustered_success_ci(successes: Iterable, games: Iterable, z: float = Z95) -> dict:
    """Success rate of several episodes per game, with a 95% interval over games.

    Episodes of one game are not independent, so the interval is a normal one on the
    per-game success rates: mean +- z * sd(rates) / sqrt(number of games), clipped to
    [0, 1] (the Wilson interval of `success_ci` when every game was played once).
    successes: one 0/1 value per episode; games: the game of each episode, same length.
    Returns success_ci's keys, plus "games" (distinct games) and "samples_per_game" when
    games were played more than once.
    """
    s = np.asarray(list(successes), np.float64).ravel()
    labels = list(games)
    if len(labels) != s.size:
        raise ValueError(f"{s.size} outcomes but {len(labels)} game labels")
    per_game: dict = {}
    for label, won in zip(labels, s):
        per_game.setdefault(label, []).append(won)
    counts = {len(v) for v in per_game.values()}
    if len(counts) > 1:
        raise ValueError(f"games were played unequal numbers of times: {sorted(counts)}")
    if counts == {1} or not per_game:
        return success_ci(s, z)
    if not np.all((s == 0) | (s == 1)):
        raise ValueError("clustered_success_ci expects 0/1 (or bool) outcomes")
    rates = np.array([np.mean(v) for v in per_game.values()])
    p = float(rates.mean())
    half = z * float(rates.std(ddof=1)) / math.sqrt(rates.size) if rates.size > 1 else 1.0
    return {"mean": p, "n": int(s.size), "ci_low": max(0.0, p - half),
            "ci_high": min(1.0, p + half), "games": int(rates.size),
            "samples_per_game": counts.pop()}


# --- over seeds: arms, t intervals, paired differences -----------------------------------

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
    from scipy import stats as scipy_stats  # here: SciPy takes a second to import

    x = np.asarray(list(values), np.float64).ravel()
    if x.size == 0:
        raise ValueError("t_interval needs at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return {"mean": mean, "seeds": 1, "ci_low": None, "ci_high": None}
    quantile = float(scipy_stats.t.ppf(0.5 + confidence / 2, x.size - 1))
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


# --- two evaluations game by game -------------------------------------------------------


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: the chance, if either policy were as likely as the
    other to win a game they disagree on, of a split of the `only_a + only_b` discordant
    games at least as uneven as the one seen (a binomial test at 1/2). 1.0 with none."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def paired_games(a: Mapping[str, float], b: Mapping[str, float]) -> dict | None:
    """Two evaluations compared on the games both played ({game id: success}, e.g. the
    "per_game" of two eval.json stages): "games" in common, "mean_a", "mean_b",
    "difference" (b - a). With one 0/1 outcome per game also "only_a" / "only_b" (games
    only that one won) and McNemar's exact "p"; with success rates (several samples per
    game) a t interval over the games' differences instead. None when no game is shared."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    x = np.array([a[g] for g in common], np.float64)
    y = np.array([b[g] for g in common], np.float64)
    out = {"games": len(common), "mean_a": float(x.mean()), "mean_b": float(y.mean()),
           "difference": float((y - x).mean())}
    if np.isin(x, (0.0, 1.0)).all() and np.isin(y, (0.0, 1.0)).all():
        only_a, only_b = int(((x == 1) & (y == 0)).sum()), int(((x == 0) & (y == 1)).sum())
        out.update(only_a=only_a, only_b=only_b, p=mcnemar_exact(only_a, only_b))
    else:
        t = t_interval(y - x, bounds=(-1.0, 1.0))
        out.update(ci_low=t["ci_low"], ci_high=t["ci_high"], p=None)
    return out


def format_paired_games(result: Mapping, name_a: str, name_b: str) -> str:
    """One line: "<b> - <a> on the same N games: +0.050 (won only <b>: 9, only <a>: 4;
    McNemar p = 0.267)"."""
    head = f"{name_b} - {name_a} on the same {result['games']} games: {result['difference']:+.3f}"
    if result.get("only_a") is not None:
        return (f"{head} (won only {name_b}: {result['only_b']}, only {name_a}: "
                f"{result['only_a']}; McNemar p = {result['p']:.3g})")
    if result.get("ci_low") is None:
        return head
    return f"{head} (95% t over games {result['ci_low']:+.3f} to {result['ci_high']:+.3f})"
