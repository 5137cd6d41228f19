"""Held-out evaluation: play the evaluation tasks, report success with a 95% interval.

    evaluator = Evaluator(eval_driver, layout, schedule, episodes_per_batch=32)
    result = evaluator.evaluate(logger, "rl", step=100)   # greedy, every held-out game
    result["mean"], result["ci_low"], result["ci_high"], result["per_game"]
"""

from __future__ import annotations

import jax
import numpy as np

from jaxrl_agents import distributed, monitors
from jaxrl_agents.stats import clustered_success_ci


class Evaluator:
    """Plays held-out games with `driver` (group size 1) in even batches of at most
    `episodes_per_batch`, at the step budgets `schedule.eval_max_steps` gives."""

    def __init__(self, driver, layout, schedule, episodes_per_batch: int):
        self.driver = driver
        self.layout = layout
        self.schedule = schedule
        self.episodes_per_batch = episodes_per_batch

    def evaluate(self, logger, stage: str, step: int | None = None, limit: int = 0, ids=None,
                 *, temperature: float = 0.0, samples: int = 1, seed: int = 0) -> dict:
        """Greedy play on the held-out tasks (`ids`, default every one; the first `limit`, or
        all when 0); success with a 95% Wilson interval, written to eval.json by `logger`
        as `stage`, and every game's episode to eval_episodes/<stage>.jsonl. When the games
        cover several tasks, each task's share is also written as stage "<stage>:<task>".

        temperature > 0: sampled play instead, each game `samples` times (keys from `seed`);
        the interval is then over games (`clustered_success_ci`).
        Multi-host: each process plays its share and every process gets every result."""
        check_eval_sampling(temperature, samples)
        ids = self.layout.eval_ids if ids is None else ids
        ids = ids[:limit] if limit else ids
        mine = ids[distributed.process_slice(len(ids))]
        with logger.phase(f"eval {stage}", len(mine) * samples, "game") as advance:
            local = self._play(mine, temperature, samples, jax.random.key(seed), advance)
        trajs = [t for part in distributed.allgather_objects(local) for t in part]
        result = held_out_result(trajs)
        parts = self.layout.split_by_task(trajs)
        per_task = {}
        if len(parts) > 1:  # one figure per task, counted as the whole is
            per_task = {task: held_out_result(part) for task, part in parts.items()}
            result["by_task"] = {task: r["mean"] for task, r in sorted(per_task.items())}
        logger.write_eval(stage, result, step=step)
        logger.write_eval_episodes(stage, trajs, step=step)
        for task, task_result in per_task.items():
            logger.write_eval(f"{stage}:{task}", task_result, step=step)
        return result

    def _play(self, env_ids, temperature: float, samples: int, key, advance) -> list:
        """Every game of `env_ids` once (greedy) or `samples` times (sampled), in order;
        `advance(n)` after each batch of n games."""
        chunk = even_chunk(len(env_ids), self.episodes_per_batch)
        trajs = []
        for i in range(0, len(env_ids), chunk):
            part = env_ids[i : i + chunk]
            budgets = self.schedule.eval_max_steps(part)
            if temperature == 0:
                trajs += self.driver.run(part, greedy=True, max_steps=budgets)
                advance(len(part))
                continue
            for k in range(samples):
                sub = jax.random.fold_in(jax.random.fold_in(key, i), k)
                trajs += self.driver.run(part, sub, max_steps=budgets, temperature=temperature)
                advance(len(part))
        return trajs


def even_chunk(n: int, most: int) -> int:
    """The size of the fewest equal chunks of at most `most` that cover n items: 100 games
    at 32 a batch go as 4 x 25, not 3 x 32 + 4, so the last batch compiles no programs of
    its own (each batch size is one more set of compiled sampler programs)."""
    most = max(int(most), 1)
    chunks = max(-(-n // most), 1)
    return max(-(-n // chunks), 1)


def check_eval_sampling(temperature: float, samples: int) -> None:
    """Raises ValueError unless (temperature, samples) is a valid evaluation: temperature
    0 (greedy, one play per game) or above 0 with samples >= 1."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if samples < 1 or (samples > 1 and temperature == 0):
        raise ValueError(f"samples must be >= 1, and above 1 only with a temperature above 0 "
                         f"(greedy play is deterministic); got {samples}")


def held_out_result(trajectories) -> dict:
    """Success (mean, 95% interval, n), mean return, env failures and the share of actions
    the env refused as invalid (`monitors.invalid_action_share`) of some evaluation
    episodes: a Wilson interval when each game was played once, else one over games
    (the env each episode ran in)."""
    games = [t.info.get("env_id", i) for i, t in enumerate(trajectories)]
    result = clustered_success_ci([t.won for t in trajectories], games)
    # Each game's outcome (its success rate when sampled several times), so that two
    # evaluations on the same games can be compared game by game (`stats.paired_games`).
    # Keyed by the task's name: unique and stable across runs and hosts (an env id is not).
    per_game: dict = {}
    for game, t in zip(games, trajectories):
        per_game.setdefault(str(t.task_id or game), []).append(float(t.won))
    result["per_game"] = {game: float(np.mean(won)) for game, won in per_game.items()}
    result["return_mean"] = float(np.mean([t.episode_return for t in trajectories]))
    result["failed"] = int(sum(t.failed for t in trajectories))
    result["invalid_action_share"] = monitors.invalid_action_share(trajectories)
    return result
