"""Host-side reward shaping, applied to per-turn rewards before packing (pure NumPy).

- `density`: move intermediate reward in time (sparse / every_k / dense), total kept.
- `mix_rewards`: weighted sum of named reward components (`CODE_MIX`, `TEXT_MIX`).
- `scale_rewards`: multiply, divide by a running std of returns, clip.
- `RunningMeanStd`: the running statistics behind the normalisation; its state is a
  plain dict (`to_dict` / `from_dict`) that goes into the checkpoint's meta.
- `RewardRecipe` / `apply_recipe`: the `reward` config section applied to collected
  episodes: which reward source (verified / binary / learned, or a weighted blend) gives
  the outcome, then the optional component mix, per turn.

Per collected batch, the trainer does

    recipe = RewardRecipe.from_config(cfg.reward)     # once
    metrics = shape_collected(trajs, recipe, reward_model=..., dump_path=...)
    ...then scale_rewards (cfg.rl.reward_scale / reward_norm / reward_clip) per episode.

The source gives each turn an outcome reward:
- verified: the environment's own reward (game score, unit-test share);
- binary: 1 on the last turn of a won episode, 0 elsewhere;
- learned: a reward model's (jaxrl_agents.reward_model) per-turn rewards;
- weighted: sum_s w_s * source_s over `reward.source_weights`.
With `reward.mix` = code or text the outcome is the "env" component of `CODE_MIX` /
`TEXT_MIX` and the other components come from the turns' infos (`reward_components`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from jaxrl_agents.data import dump
from jaxrl_agents.data.trajectory import Trajectory

DENSITY_KINDS = ("sparse", "every_k", "dense")

# Reward recipes: component name -> weight. Weights of a recipe sum to 1.
CODE_MIX = {"env": 0.6, "tests": 0.3, "style": 0.1}  # code env: outcome, tests passed, lint
TEXT_MIX = {"env": 0.8, "progress": 0.2}  # text games: game score, quest progress
MIXES = {"none": None, "code": CODE_MIX, "text": TEXT_MIX}  # reward.mix -> recipe
SOURCES = ("verified", "binary", "learned")  # where the outcome reward comes from
SOURCE_KINDS = (*SOURCES, "weighted")  # reward.source: one source, or source_weights
# StepResult.info keys the episode driver keeps for every turn (Trajectory.info["turn_info"]);
# "tampered" (the code env's grader flag) feeds monitors.tampered_episodes.
TURN_INFO_KEYS = ("won", "pass_share", "style_score", "progress", "tampered")


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


# ----------------------------------------------------------------- per-turn reward recipes


def turn_rewards(traj: Trajectory) -> np.ndarray:
    """[N] float64: the reward on each turn's last action token (N = traj.num_turns)."""
    return np.asarray(traj.rewards, np.float64)[np.asarray(traj.turn_ends, np.int64)]


def put_turn_rewards(traj: Trajectory, per_turn) -> None:
    """Replaces traj.rewards by zeros with per_turn[k] on turn k's last action token."""
    per_turn = np.asarray(per_turn, np.float64).ravel()
    if per_turn.size != traj.num_turns:
        raise ValueError(f"{per_turn.size} turn rewards for {traj.num_turns} turns")
    _check_finite(per_turn, "turn rewards")
    rewards = np.zeros(len(traj.tokens), np.float32)
    rewards[np.asarray(traj.turn_ends, np.int64)] = per_turn
    traj.rewards = rewards


def binary_rewards(num_turns: int, won: bool) -> np.ndarray:
    """[N]: 1 on the last turn of a won episode, 0 elsewhere."""
    out = np.zeros(num_turns, np.float64)
    if num_turns:
        out[-1] = float(won)
    return out


def reward_components(env_rewards, turn_info: Sequence[Mapping]) -> dict[str, np.ndarray]:
    """The named reward components of one episode, each [N] float64 (one value per turn).

    env: the environment's reward of the turn.
    tests: info["pass_share"] on the turns that report it (the code env's grading turn).
    style: info["style_score"] likewise (ruff on the agent's patch, envs.code_lint).
    progress: the progress the turn gained, p_k - p_{k-1} with p_{-1} = 0 and p_k the
      turn's info["progress"] (0 at reset, 1 at the win), so an episode's progress rewards
      sum to its final progress. A turn that reports no progress keeps p_{k-1}, or has
      p_k = 1 when info["won"] (ALFWorld scores only the goal: its progress is 1 at the win).
    A component a turn does not report is 0 there.

    Args:
      env_rewards: [N] the turns' rewards.
      turn_info: [N] dicts (missing trailing turns count as empty).
    """
    env = np.asarray(env_rewards, np.float64).ravel()
    n = env.size
    infos = list(turn_info)[:n] + [{}] * max(0, n - len(turn_info))
    tests, style, progress = np.zeros(n), np.zeros(n), np.zeros(n)
    level = 0.0
    for k, info in enumerate(infos):
        tests[k] = info.get("pass_share", 0.0)
        style[k] = info.get("style_score", 0.0)
        now = info.get("progress", 1.0 if info.get("won") else level)
        progress[k], level = now - level, now
    out = {"env": env, "tests": tests, "style": style, "progress": progress}
    for name, values in out.items():
        _check_finite(values, f"reward component {name!r}")
    return out


def mixed_turn_rewards(components: Mapping[str, np.ndarray], weights: Mapping[str, float]):
    """[N]: `mix_rewards` of every turn's components; only the weighted ones are used."""
    unknown = sorted(set(weights) - set(components))
    if unknown:
        raise KeyError(f"reward mix names unknown component(s) {unknown}; "
                       f"known: {sorted(components)}")
    n = len(next(iter(components.values()))) if components else 0
    return np.array([mix_rewards({name: components[name][k] for name in weights}, weights)
                     for k in range(n)], np.float64)


def source_rewards(sources: Mapping[str, np.ndarray | None], weights: Mapping[str, float]):
    """[N]: sum_s weights[s] * sources[s] over the sources with a non-zero weight.

    A weighted source that is None (e.g. "learned" without a reward model) is an error.
    """
    unknown = sorted(set(weights) - set(SOURCES))
    if unknown:
        raise KeyError(f"unknown reward source(s) {unknown}; known: {list(SOURCES)}")
    total = None
    for name, weight in weights.items():
        if weight == 0:
            continue
        values = sources.get(name)
        if values is None:
            raise ValueError(f"reward source {name!r} has weight {weight} but no values "
                             "(a learned source needs reward.model_path)")
        part = float(weight) * np.asarray(values, np.float64)
        total = part if total is None else total + part
    if total is None:
        raise ValueError(f"reward source weights {dict(weights)} are all zero")
    return total


@dataclasses.dataclass(frozen=True)
class RewardRecipe:
    """What `apply_recipe` does: source weights for the outcome, then an optional mix.

    source_weights: {source: weight} over SOURCES (zero weights are dropped).
    mix: component weights (CODE_MIX / TEXT_MIX) or None for the outcome alone.
    """

    source_weights: Mapping[str, float]
    mix: Mapping[str, float] | None = None

    @classmethod
    def from_config(cls, reward_cfg) -> RewardRecipe:
        """From the `reward` config section (mix, source, source_weights)."""
        if reward_cfg.mix not in MIXES:
            raise ValueError(f"reward.mix {reward_cfg.mix!r}; allowed: {list(MIXES)}")
        if reward_cfg.source not in SOURCE_KINDS:
            raise ValueError(f"reward.source {reward_cfg.source!r}; allowed: {list(SOURCE_KINDS)}")
        if reward_cfg.source == "weighted":
            weights = {s: float(reward_cfg.source_weights[s]) for s in SOURCES}
        else:
            weights = {reward_cfg.source: 1.0}
        weights = {s: w for s, w in weights.items() if w != 0}
        if not weights:
            raise ValueError("reward.source_weights are all zero")
        return cls(weights, MIXES[reward_cfg.mix])

    @property
    def uses_learned(self) -> bool:
        return "learned" in self.source_weights


def episode_turn_rewards(traj: Trajectory, recipe: RewardRecipe, learned=None) -> np.ndarray:
    """[N]: one episode's per-turn rewards under `recipe`; learned: [N] or None."""
    verified = turn_rewards(traj)
    outcome = source_rewards(
        {"verified": verified, "binary": binary_rewards(traj.num_turns, traj.won),
         "learned": learned},
        recipe.source_weights,
    )
    if recipe.mix is None:
        return outcome
    components = reward_components(verified, traj.info.get("turn_info", []))
    components["env"] = outcome
    return mixed_turn_rewards(components, recipe.mix)


def disagreement(learned_scores, won) -> float:
    """Share of episodes where (learned score > 0.5) != won; nan for no episodes."""
    scores = np.asarray(learned_scores, np.float64).ravel()
    won = np.asarray(won, bool).ravel()
    if scores.size != won.size:
        raise ValueError(f"{scores.size} learned scores for {won.size} episodes")
    return float(np.mean((scores > 0.5) != won)) if scores.size else float("nan")


def apply_recipe(trajs: Sequence[Trajectory], recipe: RewardRecipe, learned=None) -> dict:
    """Sets every trajectory's per-turn rewards by `recipe`, in place; returns metrics.

    Args:
      trajs: collected episodes (their rewards are the environments' own).
      recipe: see RewardRecipe.
      learned: one [N_i] array of learned per-turn rewards per episode (their sum is the
        episode's learned score), or None.
    Returns {"reward/verified": mean verified return, "reward/<component>": mean episode sum
      of each mixed component, "reward/learned", "reward/disagreement" with a learned
      source}, all over the episodes.
    """
    if learned is not None and len(learned) != len(trajs):
        raise ValueError(f"{len(learned)} learned reward rows for {len(trajs)} episodes")
    totals: dict[str, list[float]] = {"reward/verified": []}
    for i, traj in enumerate(trajs):
        totals["reward/verified"].append(float(turn_rewards(traj).sum()))
        if recipe.mix is not None:
            parts = reward_components(turn_rewards(traj), traj.info.get("turn_info", []))
            for name in recipe.mix:
                if name != "env":
                    totals.setdefault(f"reward/{name}", []).append(float(parts[name].sum()))
        put_turn_rewards(traj, episode_turn_rewards(
            traj, recipe, None if learned is None else learned[i]))
    metrics = {k: float(np.mean(v)) if v else float("nan") for k, v in totals.items()}
    if learned is not None:
        scores = [float(np.sum(row)) for row in learned]
        metrics["reward/learned"] = float(np.mean(scores)) if scores else float("nan")
        metrics["reward/disagreement"] = disagreement(scores, [t.won for t in trajs])
    return metrics


def shape_collected(trajs: Sequence[Trajectory], recipe: RewardRecipe, *, reward_model=None,
                    dump_path: str | None = None, **dump_extra) -> dict:
    """The trainer's reward step for one collected batch, before scaling and packing.

    Appends the episodes with their labels to `dump_path` (when given; data.dump, with
    `dump_extra` fields such as update=3), scores them with `reward_model` (when the recipe
    uses a learned source; anything with `turn_rewards(trajs) -> [N_i] arrays`, e.g.
    reward_model.RewardModel), then `apply_recipe`. Returns apply_recipe's metrics.
    """
    if dump_path:
        dump.append_jsonl(dump_path, trajs, **dump_extra)
    learned = None
    if recipe.uses_learned:
        if reward_model is None:
            raise ValueError("the reward recipe uses a learned source but has no reward model")
        learned = reward_model.turn_rewards(trajs)
    return apply_recipe(trajs, recipe, learned)
