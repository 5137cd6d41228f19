"""Which tasks an update plays, with which step budgets and which verbs: the curriculum, step
budgets, task mixing and action-space staging put together for the outer loop.

    schedule = TaskSchedule(cfg, layout, pool.tasks, staging)
    plan = schedule.plan(update)                        # env ids + a step budget per episode
    trajs = driver.run(plan.env_ids, key, max_steps=plan.max_steps)
    feedback = schedule.observe(update, trajs)          # success per task; epoch decisions
    for event in feedback.events: ...                   # Promoted, Demoted, ActionStageAdvanced
    for key, ids in schedule.due_evaluations(update): ...

The schedule decides and reports; it acts on nothing outside itself. Its decisions reach
the loop as typed events (EWC consolidates on `Promoted`, the env pool is rebuilt on
`ActionStageAdvanced`), its figures as metrics.

A batch has `episodes_per_batch / group_size` task slots. With neither the curriculum nor
mixing on, they are drawn uniformly over the train tasks without repeats (as the loop
always did). Otherwise they are composed (`mixing.compose_batch`) from, in order: the core
share (mixing on) for the core task (the current curriculum stage, else the env section's
task), the replay share spread over earlier curriculum stages, and the rest (the mixture by
weight with mixing on, else the core task). Draws depend only on
(seed, update) and the checkpointed state, so a resumed run repeats an uninterrupted one.

An epoch is `rl.episodes_per_epoch / rollout.episodes_per_batch` updates. At the end of
each, the curriculum sees the current stage's success and the step budget each task's
(episodes that failed from env faults do not count). With action-space staging on
(`action_space.staging`), every `action_space.advance_every_epochs` epochs the training
success over them decides whether the next stage's verbs are allowed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from envs.action_space import ActionStaging
from jaxrl_agents.trainer.budget import StepBudget
from jaxrl_agents.trainer.curriculum import PROMOTE, Curriculum
from jaxrl_agents.trainer.mixing import TaskMixer, compose_batch
from jaxrl_agents.trainer.tasks import core_task, parse_task


@dataclasses.dataclass
class Plan:
    """The episodes of one update: pool env ids and their step budgets (None: the envs')."""

    env_ids: list[int]
    max_steps: list[int | None] | None = None


@dataclasses.dataclass(frozen=True)
class Promoted:
    """The curriculum moved up to stage `stage` (index into its stages), task `task`."""

    stage: int
    task: str


@dataclasses.dataclass(frozen=True)
class Demoted:
    """The curriculum moved back to stage `stage`, task `task`."""

    stage: int
    task: str


@dataclasses.dataclass(frozen=True)
class ActionStageAdvanced:
    """Action-space staging moved to stage `stage`: the envs must be rebuilt to offer
    `verbs` (None: every verb)."""

    stage: int
    verbs: tuple[str, ...] | None


Event = Promoted | Demoted | ActionStageAdvanced


@dataclasses.dataclass
class Feedback:
    """What the schedule made of an update: figures to log, decisions to act on (in the
    order taken: curriculum first, then action staging)."""

    metrics: dict[str, float]
    events: list[Event]


class TaskSchedule:
    """Plans each update's tasks from the curriculum, mixture and step budgets of `cfg`.

    layout: the run's `setup.EnvLayout`. tasks: the pool's TaskSpecs (optimal steps per id).
    staging: the `ActionStaging` the pool was built with (None: every verb, always).
    """

    def __init__(self, cfg, layout, tasks, staging: ActionStaging | None = None):
        self.layout = layout
        self.seed = cfg.seed
        self.num_slots = max(cfg.rollout.episodes_per_batch // layout.group_size, 1)
        self.updates_per_epoch = max(cfg.rl.episodes_per_epoch // cfg.rollout.episodes_per_batch, 1)
        self.optimal_steps = [int(t.optimal_steps) for t in tasks]
        self.env_max_steps = cfg.budget.env_max_steps
        self.curriculum = None
        if cfg.curriculum.enabled:
            stages = [parse_task(s, cfg.env).key for s in cfg.curriculum.stages]
            self.curriculum = Curriculum.from_config(cfg.curriculum, stages)
        self.budget = StepBudget.from_config(cfg.budget) if cfg.budget.enabled else None
        self.mixer = None
        if cfg.mixing.enabled:
            names = [parse_task(t, cfg.env).key for t in cfg.mixing.tasks]
            self.mixer = TaskMixer(names, cfg.mixing.weights, core_share=cfg.mixing.core_share)
        self.env_task = core_task(cfg.env).key
        # Train tasks [0, first_rl_task) gave SFT its gold runs; with rl.exclude_sft_tasks
        # RL plays only the others (config.check_rl_tasks: one task, SFT on).
        self.first_rl_task = cfg.sft.num_trajectories if cfg.rl.exclude_sft_tasks else 0
        self.epoch_tally: dict[str, list[int]] = {}  # task -> [wins, episodes] this epoch
        self.staging = staging
        self.staging_period = self.updates_per_epoch * cfg.action_space.advance_every_epochs
        self.advance_above = cfg.action_space.advance_above

    @property
    def main_task(self) -> str:
        """The core task: the current curriculum stage, or the env section's task."""
        return self.curriculum.current if self.curriculum else self.env_task

    # -- planning

    def plan(self, update: int) -> Plan:
        rng = np.random.default_rng([self.seed, update])
        if self.curriculum is None and self.mixer is None:
            num_rl = self.layout.num_train - self.first_rl_task
            tasks = self.first_rl_task + rng.choice(
                num_rl, size=min(self.num_slots, num_rl), replace=False)
        else:
            tasks = self._compose(rng)
        env_ids = self.layout.train_ids(tasks)
        if self.budget is None:
            return Plan(env_ids)
        return Plan(env_ids, [self._budget_of(i) for i in env_ids])

    def _compose(self, rng) -> list[int]:
        groups = self.layout.groups
        capacity = {key: len(group.train_tasks) for key, group in groups.items()}
        counts = compose_batch(rng, self.num_slots, self._parts(), capacity)
        tasks = []
        for key, group in groups.items():
            if counts.get(key):
                local = rng.choice(len(group.train_tasks), size=counts[key], replace=False)
                tasks += [group.train_tasks[i] for i in local]
        return tasks

    def _parts(self) -> list:
        replay = []
        if self.curriculum is not None and self.curriculum.stage > 0:
            earlier = {key: 1.0 for key in self.curriculum.replay_stages()}
            replay = [(self.curriculum.replay_share, earlier)]
        if self.mixer is None:
            return [*replay, (None, {self.main_task: 1.0})]
        retired = self.budget.retired if self.budget is not None else ()
        return self.mixer.parts(self.main_task, replay, retired)

    def _budget_of(self, env_id: int, evaluation: bool = False) -> int | None:
        optimal = self.optimal_steps[env_id]
        if optimal <= 0:  # no gold solution known: the env's own limit
            return None
        if evaluation:
            steps = self.budget.eval_steps(optimal)
        else:
            steps = self.budget.steps(self.layout.group_of(env_id), optimal)
        return min(steps, self.env_max_steps)

    def eval_max_steps(self, env_ids) -> list[int | None] | None:
        """Held-out step budgets: fixed at `budget.start_factor` x optimal while budgets are
        on (comparable over the run), else None (the envs' own)."""
        if self.budget is None:
            return None
        return [self._budget_of(i, evaluation=True) for i in env_ids]

    # -- feedback

    def observe(self, update: int, trajectories) -> Feedback:
        """Records an update's episodes; at an epoch's end lets the curriculum and the step
        budget decide, at a staging period's end the action staging. Returns the metrics
        (empty with every lever off) and the decisions taken."""
        events: list[Event] = []
        metrics = self._observe_tasks(update, trajectories, events)
        if self.staging is not None:
            metrics.update(self._stage_actions(update, trajectories, events))
        return Feedback(metrics, events)

    def _observe_tasks(self, update: int, trajectories, events: list) -> dict[str, float]:
        tally = self._tally(trajectories)
        for key, (wins, episodes) in tally.items():
            total = self.epoch_tally.setdefault(key, [0, 0])
            total[0] += wins
            total[1] += episodes
        if self.mixer is not None:
            played = {}
            for t in trajectories:
                key = self.layout.group_of(t.info["env_id"])
                played[key] = played.get(key, 0) + 1
            self.mixer.record(played)
        metrics = {}
        if (update + 1) % self.updates_per_epoch == 0:
            metrics.update(self._end_epoch(update // self.updates_per_epoch, events))
        if self.curriculum is None and self.mixer is None and self.budget is None:
            return metrics
        for key, (wins, episodes) in tally.items():
            metrics[f"tasks/{_metric_name(key)}/success"] = wins / episodes
        if self.curriculum is not None:
            metrics["curriculum/stage"] = self.curriculum.stage
        if self.budget is not None:
            for key, group in self.layout.groups.items():
                if group.train_tasks:  # tasks only evaluated have no training budget
                    metrics[f"budget/{_metric_name(key)}/factor"] = self.budget.factor(key)
            metrics["budget/retired"] = len(self.budget.retired)
        if self.mixer is not None:
            for key, share in self.mixer.drawn_shares().items():
                metrics[f"mixing/{_metric_name(key)}/share"] = share
        return metrics

    def _tally(self, trajectories) -> dict[str, list[int]]:
        tally = {}
        for t in trajectories:
            if t.failed:
                continue
            counts = tally.setdefault(self.layout.group_of(t.info["env_id"]), [0, 0])
            counts[0] += int(t.won)
            counts[1] += 1
        return tally

    def _end_epoch(self, epoch: int, events: list) -> dict[str, float]:
        metrics = {}
        if self.curriculum is not None:
            wins, episodes = self.epoch_tally.get(self.curriculum.current, (0, 0))
            move = self.curriculum.observe(epoch, wins / episodes if episodes else None)
            if move is not None:
                moved = Promoted if move == PROMOTE else Demoted
                events.append(moved(self.curriculum.stage, self.curriculum.current))
                metrics["curriculum/move"] = 1.0 if move == PROMOTE else -1.0
        if self.budget is not None:
            self.budget.observe(epoch, {k: tuple(v) for k, v in self.epoch_tally.items()})
        self.epoch_tally = {}
        return metrics

    def _stage_actions(self, update: int, trajectories, events: list) -> dict[str, float]:
        """Tallies the update's training episodes (env faults aside) and, every
        `staging_period` updates, moves to the next stage's verbs when their success
        exceeded `advance_above`."""
        played = [t for t in trajectories if not t.failed]
        self.staging.record(sum(bool(t.won) for t in played), len(played))
        if (update + 1) % self.staging_period == 0 and self.staging.decide(self.advance_above):
            events.append(self._action_stage())
        verbs = self.staging.allowed_verbs
        return {"action_space/stage": self.staging.stage,
                "action_space/verbs": len(verbs) if verbs is not None else -1}

    def advance_action_stage(self) -> ActionStageAdvanced | None:
        """Allows the next stage's verbs now, off the epoch clock; None when nothing
        changed (staging off, or every verb allowed already)."""
        if self.staging is None or not self.staging.advance():
            return None
        return self._action_stage()

    def _action_stage(self) -> ActionStageAdvanced:
        verbs = self.staging.allowed_verbs
        return ActionStageAdvanced(self.staging.stage, None if verbs is None else tuple(verbs))

    def due_evaluations(self, update: int) -> list[tuple[str, list[int]]]:
        """(stage, held-out env ids) of every curriculum stage to evaluate after `update`."""
        if self.curriculum is None or (update + 1) % self.updates_per_epoch:
            return []
        stages = self.curriculum.stages_to_evaluate(update // self.updates_per_epoch)
        return [(key, list(self.layout.groups[key].eval_ids)) for key in stages]

    # -- checkpoints

    def state_dict(self) -> dict:
        state = {"epoch_tally": {k: list(v) for k, v in self.epoch_tally.items()}}
        for name in ("curriculum", "budget", "mixer"):
            part = getattr(self, name)
            if part is not None:
                state[name] = part.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restores `state_dict()`; parts missing from it (an older checkpoint) start fresh."""
        self.epoch_tally = {
            k: [int(v[0]), int(v[1])] for k, v in state.get("epoch_tally", {}).items()
        }
        for name in ("curriculum", "budget", "mixer"):
            part = getattr(self, name)
            if part is not None and name in state:
                part.load_state_dict(state[name])


def _metric_name(key: str) -> str:
    """toy:count-4 -> toy/count-4 (metric names group by prefix)."""
    return key.replace(":", "/")
