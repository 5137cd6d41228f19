"""One update's training data: play the planned episodes, shape their rewards, pack a batch.

    collector = Collector(cfg, driver, pad_id=pad_id, mesh=mesh, run_dir=run_dir)
    collection = collector.collect(update, schedule.plan(update), key)
    state, metrics = learner.update(state, collection.batch, key)

Multi-host: each process plays its share of the plan (`shares.plan_share`), every process
then holds every episode and takes the same reward and filtering decisions on them, and
each packs its rows of the global batch (`shares.pack_share`). With one process this is
the plain loop.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from jaxrl_agents import distributed, monitors, reward_model
from jaxrl_agents import rewards as reward_lib
from jaxrl_agents.data import Batch, Trajectory
from jaxrl_agents.data.selection import filter_groups
from jaxrl_agents.run_records import TRAJECTORIES_FILE
from jaxrl_agents.trainer import shares
from jaxrl_agents.trainer.task_schedule import Plan


@dataclasses.dataclass
class Collection:
    """One update's episodes and this process's rows of their packed batch."""

    trajectories: list[Trajectory]  # every process's episodes, in plan order (rewards scaled)
    batch: Batch  # this process's rows [B, T] of the kept groups, in the shape all processes use
    metrics: dict[str, float]  # rollout/* (merged over processes), then reward/* metrics


class Collector:
    """Plays, shapes and packs each update's episodes with `driver` (the training one).

    Holds the running return statistics of `rl.reward_norm` (checkpointed by the loop as
    `reward_stats`), the reward recipe and the optional reward model (`reward` section).
    mesh: the learner's mesh (multi-host), whose batch shards set the packed row multiple.
    run_dir: where `reward.dump_trajectories` writes the shaped episodes.
    """

    def __init__(self, cfg, driver, *, pad_id: int, mesh=None, run_dir: str = ""):
        self.cfg = cfg
        self.driver = driver
        self.pad_id = pad_id
        self.mesh = mesh
        self.run_dir = run_dir
        self.reward_stats = reward_lib.RunningMeanStd()
        self.reward_recipe = reward_lib.RewardRecipe.from_config(cfg.reward)
        self.reward_model = reward_model.from_config(cfg.reward, self.reward_recipe)

    def collect(self, update: int, plan: Plan, key) -> Collection:
        """The episodes of `plan` (update `update`), sampled with `key` (this process's
        episodes with a key of their own), shaped and packed."""
        local = self._play_share(plan, key)
        everyone = distributed.allgather_objects((local, self.driver.last_stats))
        trajs = [t for part, _ in everyone for t in part]
        metrics = shares.merge_rollout_stats([stats for _, stats in everyone])
        metrics.update(self._shape_rewards(trajs, update))
        return Collection(trajs, self._pack(trajs), metrics)

    def _play_share(self, plan: Plan, key) -> list[Trajectory]:
        """This process's whole groups of `plan`, numbered as in the single-process run."""
        index, count, g = jax.process_index(), jax.process_count(), self.driver.group_size
        mine, first_group = shares.plan_share(plan, g, index, count)
        if count > 1:
            key = jax.random.fold_in(key, index)  # processes sample different episodes
        # Group ids unique over processes: their counters differ (evaluations share them),
        # so all start from the largest, each at its own first group.
        groups_before = distributed.agree_max([self.driver.groups_used])[0]
        self.driver.number_groups_from(groups_before + first_group)
        local = self.driver.run(mine.env_ids, key, max_steps=mine.max_steps,
                                capture=self._capture_layers(count))
        self.driver.number_groups_from(groups_before + len(plan.env_ids) // g)
        return local

    def _capture_layers(self, processes: int) -> int:
        """The layers whose output the rollout keeps for the learner: its frozen layers
        (`rl.frozen_layers`), which it then need not run again. With several processes
        none: every process gathers every episode, and the hidden states would travel
        too."""
        return int(self.cfg.rl.frozen_layers) if processes == 1 else 0

    def _shape_rewards(self, trajs: list[Trajectory], update: int) -> dict[str, float]:
        """Reward recipe (and model), novelty bonus, then scale / clip / normalise, in place.
        Returns the recipe's metrics."""
        cfg = self.cfg
        dump = (
            cfg.reward.dump_trajectories
            and distributed.is_main_process()
            and os.path.join(self.run_dir, TRAJECTORIES_FILE)
        )
        metrics = reward_lib.shape_collected(
            trajs, self.reward_recipe, reward_model=self.reward_model, dump_path=dump, update=update
        )
        monitors.add_novelty_bonus(trajs, cfg.algo.diversity_bonus)
        # The normaliser scales by the statistics of earlier updates' returns; this
        # update's join them only after (the returns before scaling).
        returns = np.array([t.episode_return for t in trajs], np.float64)
        for t in trajs:
            t.rewards = reward_lib.scale_rewards(
                t.rewards,
                scale=cfg.rl.reward_scale,
                clip=cfg.rl.reward_clip,
                normalizer=self.reward_stats if cfg.rl.reward_norm else None,
            )
        if cfg.rl.reward_norm:
            self.reward_stats.update(returns)
        return metrics

    def _pack(self, trajs: list[Trajectory]) -> Batch:
        """This process's rows of the kept groups (all with keep 1.0, StarPO-S below)."""
        cfg = self.cfg
        index, count = jax.process_index(), jax.process_count()
        kept = filter_groups(trajs, cfg.algo.group_filter_keep)
        return shares.pack_share(
            kept,
            self.driver.group_size,
            index,
            count,
            pad_id=self.pad_id,
            length_buckets=cfg.rollout.length_buckets,
            row_multiple=shares.local_batch_shards(self.mesh, count),
            choice_width=cfg.rollout.choice_width if cfg.rollout.constrain_actions else None,
        )
