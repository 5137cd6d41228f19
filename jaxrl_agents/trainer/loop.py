"""The outer loop: (pretraining, SFT) -> per update: collect -> learner update -> task schedule
-> evaluate -> checkpoint -> log.

    summary = train(cfg)            # a fresh run into <output_dir>/<name>/
    summary = train(cfg, resume=True)  # continue from its latest checkpoint

`Trainer` builds a run's pieces and only sequences them; each does one job:
`TaskSchedule` (task_schedule.py) plans the tasks and decides curriculum, budget and
action-space moves, `Collector` (collect.py) turns a plan into a packed batch, the
learner (rl.py) updates, `Evaluator` (evaluation.py) plays the held-out games, and the
supervised phases live in supervised.py. The schedule's decisions come back as typed events
that the loop carries out (EWC on a promotion, a rebuilt env pool on a new action stage).

Everything random in update u is derived from (seed, u): the tasks played, the sampling
key and the minibatch order. With the learner state, KL controller and reward statistics
restored from the checkpoint, a resumed run repeats exactly what an uninterrupted run does.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envs.action_space import ActionStaging
from jaxrl_agents import compile_cache, distributed, monitors, preflight
from jaxrl_agents import rewards as reward_lib
from jaxrl_agents.checkpoint import Checkpointer
from jaxrl_agents.logging import RunLogger
from jaxrl_agents.run_records import CHECKPOINT_DIR, run_dir_of, set_aside_previous_run
from jaxrl_agents.sharding import make_mesh
from jaxrl_agents.trainer import setup
from jaxrl_agents.trainer.collect import Collection, Collector
from jaxrl_agents.trainer.evaluation import Evaluator
from jaxrl_agents.trainer.rl import make_learner
from jaxrl_agents.trainer.supervised import run_pretrain, run_sft
from jaxrl_agents.trainer.task_schedule import ActionStageAdvanced, Promoted, TaskSchedule


def num_updates(cfg) -> int:
    episodes = cfg.rl.epochs * cfg.rl.episodes_per_epoch
    return max(episodes // cfg.rollout.episodes_per_batch, 0)


@dataclasses.dataclass
class Progress:
    """Loop counters saved with each checkpoint (JSON)."""

    update: int = 0  # RL updates done
    sft_done: bool = False  # the supervised phases (LM pretraining and / or SFT) are done
    groups_used: int = 0  # the driver's group-id counter


class Trainer:
    """Owns a run: builds its envs, models, drivers, schedule, collector, learner, evaluator,
    logger and checkpoints, and sequences them (`run`, one update: `rl_update`)."""

    def __init__(self, cfg, *, resume: bool = False):
        self.cfg = cfg
        self.run_dir = run_dir_of(cfg)
        self.resume = resume
        # Pretraining's and SFT's results, kept in checkpoints so that a run resumed after
        # them reports them too.
        self.supervised_summary: dict = {}
        os.makedirs(self.run_dir, exist_ok=True)
        self.layout = setup.EnvLayout(cfg)
        distributed.main_first(
            lambda: setup.pregenerate(self.layout, cfg.rollout.num_env_workers), "pregenerate"
        )
        staging = ActionStaging.from_config(cfg.action_space) if cfg.action_space.staging else None
        self.pool = setup.make_pool(cfg, self.layout, staging)
        self.schedule = TaskSchedule(cfg, self.layout, self.pool.tasks, staging)
        heads = self.layout.train_task_heads()
        self.tokenizer = distributed.main_first(
            lambda: setup.build_tokenizer(
                cfg, self.run_dir, lambda: setup.collect_env_text(self.pool, heads)
            ),
            "tokenizer",
        )
        self.pad_id = self.tokenizer.pad_token_id or 0
        vocab = setup.model_vocab_size(self.tokenizer)
        self.actor_critic = setup.build_actor_critic_from_config(cfg, vocab)
        policy = self.actor_critic.policy
        self.driver = setup.make_driver(cfg, policy, self.tokenizer, self.pool)
        self.eval_driver = (
            self.driver
            if cfg.rollout.group_size == 1
            else setup.make_driver(cfg, policy, self.tokenizer, self.pool, group_size=1)
        )
        self.evaluator = Evaluator(
            self.eval_driver, self.layout, self.schedule, cfg.rollout.episodes_per_batch
        )
        self.total_updates = num_updates(cfg)
        # Multi-host: the learner state lives on the mesh over every process's devices.
        self.mesh = make_mesh(cfg.mesh) if jax.process_count() > 1 else None
        self.learner = make_learner(
            cfg,
            self.actor_critic,
            total_updates=self.total_updates,
            episodes_per_update=cfg.rollout.episodes_per_batch,
            mesh=self.mesh,
        )
        self.collector = Collector(
            cfg, self.driver, pad_id=self.pad_id, mesh=self.mesh, run_dir=self.run_dir
        )
        self.state = None
        self.progress = Progress()
        self.monitor = monitors.Monitor.from_config(cfg.monitor)
        self.checkpointer = Checkpointer(
            os.path.join(self.run_dir, CHECKPOINT_DIR), keep=cfg.checkpoint.keep,
            always_keep=(0,),  # the policy after SFT (or the initial one without SFT)
        )
        self.key = jax.random.key(cfg.seed)
        self.logger = None

    # -- checkpoints

    def _save(self) -> None:
        staging = self.schedule.staging
        meta = {
            "progress": dataclasses.asdict(self.progress),
            "kl": self.learner.kl.state_dict(),
            "reward_stats": self.collector.reward_stats.to_dict(),
            "learner_updates": self.learner.updates,
            "monitor": self.monitor.state_dict(),
            "action_stage": staging.state_dict() if staging else None,
            "schedule": self.schedule.state_dict(),
            "supervised_summary": self.supervised_summary,
        }
        self.checkpointer.save(self.progress.update, {"learner": self.state}, meta)

    def _restore(self) -> bool:
        step = self.checkpointer.latest_step()
        if step is None:
            return False
        state, meta = self.checkpointer.restore(step, template={"learner": self.state})
        self.state = state["learner"]
        self.progress = Progress(**meta["progress"])
        self.learner.kl.load_state_dict(meta["kl"])
        self.learner.updates = int(meta["learner_updates"])
        self.collector.reward_stats = reward_lib.RunningMeanStd.from_dict(meta["reward_stats"])
        self.monitor.load_state_dict(meta.get("monitor", {}))
        staging = self.schedule.staging
        if staging and meta.get("action_stage"):
            staging.load_state_dict(meta["action_stage"])
            if staging.stage:
                self._rebuild_pool()
        self.schedule.load_state_dict(meta.get("schedule", {}))
        self.supervised_summary = meta.get("supervised_summary", {})
        self.driver.number_groups_from(self.progress.groups_used)
        self._sync_policy()
        return True

    # -- the pieces kept in step

    def advance_action_stage(self) -> bool:
        """Allows the next stage's verbs (action_space.staging) and rebuilds the env pool.
        False when nothing changed."""
        if self.schedule.advance_action_stage() is None:
            return False
        self._rebuild_pool()
        return True

    def _rebuild_pool(self) -> None:
        """A fresh env pool at the schedule's action stage, for both drivers."""
        self.pool.close()
        self.pool = setup.make_pool(self.cfg, self.layout, self.schedule.staging)
        self.driver.pool = self.eval_driver.pool = self.pool

    def _sync_policy(self) -> None:
        """Makes the modules the driver samples from hold the learner's parameters (a
        process-local copy: each process samples on its own)."""
        nnx.update(self.actor_critic, distributed.local_copy(self.state.params))

    def _agree_on_policy(self) -> None:
        """Every process takes process 0's policy parameters (after SFT, which each process
        runs alone), so the global learner state starts from one policy."""
        params = distributed.broadcast_from_main(nnx.state(self.actor_critic, nnx.Param))
        nnx.update(self.actor_critic, jax.tree.map(jnp.asarray, params))

    # -- stages

    def evaluate(self, stage: str, step: int | None = None, limit: int = 0, ids=None,
                 **sampling) -> dict:
        """`Evaluator.evaluate` with this run's logger."""
        return self.evaluator.evaluate(self.logger, stage, step, limit, ids, **sampling)

    def _supervised(self, resumed: bool) -> None:
        """The pretrained model's evaluation, then the language-model pretraining and SFT
        when configured (once: a run resumed after them skips them)."""
        cfg = self.cfg
        # Pretrained weights: eval.json base -> sft -> rl (rl.eval_base=False skips "base",
        # e.g. for a second arm whose base figure another run has on the same games).
        if cfg.model.hf_path and cfg.rl.eval_base and not resumed:
            self.supervised_summary["base"] = self.evaluate("base")
        supervised = cfg.sft.enabled or cfg.pretrain.episodes_per_task > 0
        if not supervised or self.progress.sft_done:
            return
        policy, heads = self.actor_critic.policy, self.layout.train_task_heads()
        # Pretraining runs whenever it is configured, with or without SFT after it.
        if cfg.pretrain.episodes_per_task:
            self.supervised_summary["pretrain"] = run_pretrain(
                cfg, policy, self.eval_driver, heads, self.key, self.logger, self.pad_id)
        if cfg.sft.enabled:
            self.supervised_summary["sft"] = run_sft(
                cfg, policy, self.eval_driver, heads, self.logger, self.pad_id, self.evaluate)
        self._agree_on_policy()
        # The reference policy is the policy after these phases; optimizer state starts
        # fresh.
        self.state = self.learner.init_state(self.actor_critic)
        self.progress.sft_done = True
        self._save()

    def rl_update(self, update: int) -> dict:
        """Update `update`: collect, learn, let the schedule decide and act on its events;
        returns the update's metrics."""
        start, compiled = time.perf_counter(), compile_cache.compile_seconds()
        key = jax.random.fold_in(self.key, update)
        plan = self.schedule.plan(update)
        collection = self.collector.collect(update, plan, jax.random.fold_in(key, 0))
        rollout_s = time.perf_counter() - start
        rollout_compile_s = compile_cache.compile_seconds() - compiled
        compile_cache.release_if_near_limit()
        self.state, metrics = self.learner.update(
            self.state, collection.batch, jax.random.fold_in(key, 1)
        )
        self._sync_policy()
        update_s = time.perf_counter() - start - rollout_s
        metrics.update(collection.metrics)
        feedback = self.schedule.observe(update, collection.trajectories)
        metrics.update(feedback.metrics)
        metrics.update(self.act_on(feedback.events, collection))
        metrics.update(update_charts(collection, rollout_s, update_s))
        metrics["perf/rollout_compile_s"] = rollout_compile_s
        metrics.update(self.monitor.report(collection.trajectories, metrics, self.logger.write,
                                           update + 1))
        return metrics

    def act_on(self, events, collection: Collection) -> dict:
        """Carries out the schedule's decisions; returns their metrics."""
        metrics = {}
        for event in events:
            if isinstance(event, Promoted) and self.cfg.curriculum.ewc_coef > 0:
                # EWC: the stage just left (this batch, these parameters) becomes the anchor.
                self.state = self.learner.consolidate(self.state, collection.batch)
                metrics["curriculum/ewc_consolidated"] = 1.0
            elif isinstance(event, ActionStageAdvanced):
                self._rebuild_pool()
                self.logger.write(f"Action space: stage {event.stage}, verbs "
                                  f"{list(event.verbs or ()) or 'all'}")
        return metrics

    def _due_evaluations(self, update: int) -> dict:
        """The held-out evaluations due after `update` (every `rl.eval_every` updates; the
        curriculum's stages); returns their success metrics."""
        metrics = {}
        if self.cfg.rl.eval_every and (update + 1) % self.cfg.rl.eval_every == 0:
            metrics["eval/success"] = self.evaluate("rl", step=update + 1)["mean"]
        for task, ids in self.schedule.due_evaluations(update):
            result = self.evaluate(f"stage:{task}", step=update + 1, ids=ids)
            metrics[f"curriculum/eval/{task.replace(':', '/')}"] = result["mean"]
        return metrics

    def run(self) -> dict:
        cfg = self.cfg
        self.state = self.learner.init_state(self.actor_critic)
        resumed = self.resume and self._restore()
        self.logger = RunLogger(
            self.run_dir,
            tensorboard=cfg.logging.tensorboard,
            jsonl=cfg.logging.jsonl,
            progress_bar=cfg.logging.progress_bar,
            total=self.total_updates,
            is_main=distributed.is_main_process(),
            resume_step=self.progress.update if resumed else None,
        )
        self.logger.save_config(cfg)
        self._supervised(resumed)
        summary = dict(self.supervised_summary)
        for update in range(self.progress.update, self.total_updates):
            metrics = self.rl_update(update)
            self.progress.update = update + 1
            self.progress.groups_used = self.driver.groups_used
            metrics.update(self._due_evaluations(update))
            self.logger.log(update + 1, metrics)
            if cfg.checkpoint.every and (update + 1) % cfg.checkpoint.every == 0:
                self._save()
        if self.total_updates:
            summary["rl"] = self.evaluate("rl")
            self._save()
        self.checkpointer.wait()
        if cfg.logging.plots:
            summary["plots"] = self.logger.plot()
        summary["run_dir"] = self.run_dir
        return summary

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()
        self.checkpointer.close()
        self.pool.close()


def update_charts(collection: Collection, rollout_s: float, update_s: float) -> dict:
    """An update's charts/* (its episodes) and perf/* (its timings; tokens of every
    process's rows) metrics."""
    trajs = collection.trajectories
    tokens = distributed.allgather_rows(np.array([collection.batch.valid.sum()])).sum()
    return {
        "charts/success": setup.success_rate(trajs),
        "charts/action_coverage": setup.action_coverage(trajs),
        "charts/invalid_action_share": monitors.invalid_action_share(trajs),
        "charts/tampered_episodes": monitors.tampered_episodes(trajs),
        "perf/tokens": int(tokens),
        "perf/tokens_per_s": float(tokens) / (rollout_s + update_s),
        "perf/rollout_s": rollout_s,
        "perf/update_s": update_s,
    }


def train(cfg, *, resume: bool = False) -> dict:
    """A run from scratch (an earlier run's files in its directory move to previous/), or
    with `resume` a continuation from its latest checkpoint. A run whose planned memory
    peak is clearly over the machine's stops first (`preflight.check_memory`)."""
    preflight.check_memory(cfg)
    if not resume:
        run_dir = run_dir_of(cfg)
        moved = distributed.main_first(lambda: set_aside_previous_run(run_dir), "run_dir")
        if moved:
            print(f"{run_dir} held an earlier run; its files were moved to {moved}")
    trainer = Trainer(cfg, resume=resume)
    try:
        return trainer.run()
    finally:
        trainer.close()


def evaluate_checkpoint(cfg, step: int | None = None, *, temperature: float = 0.0,
                        samples: int = 1, seed: int = 0, base: bool = False) -> dict:
    """Held-out success of a run's checkpoint (latest by default), written as "eval"
    (greedy) or "eval_T<temperature>" (sampled `samples` times per game; see
    `Evaluator.evaluate`); a checkpoint named by `step` as "eval-step<step>" (and
    "eval-step<step>_T<temperature>"), so evaluating several checkpoints keeps each one's
    figures and episodes. With `base`, or when the run has no checkpoint yet, that of the
    pretrained weights (`model.hf_path`) instead, written as "base" / "base_T<temperature>".
    Raises FileNotFoundError when there is neither a checkpoint nor pretrained weights,
    and preflight.MemoryCheckError when its planned peak is over the machine's memory."""
    preflight.check_memory(cfg, phases=preflight.eval_phases(cfg, step, base))
    trainer = Trainer(cfg)
    try:
        base = base or (step is None and trainer.checkpointer.latest_step() is None)
        if base and not cfg.model.hf_path:
            raise FileNotFoundError(f"no checkpoint in {trainer.checkpointer.directory}, and "
                                    "no pretrained weights (model.hf_path) to evaluate")
        if not base:  # (for base, the policy modules hold the pretrained weights already)
            trainer.state = trainer.learner.init_state(trainer.actor_critic)
            restored, _ = trainer.checkpointer.restore(
                step, template={"learner": {"params": trainer.state.params}}, partial=True
            )
            params = restored["learner"]["params"]
            trainer.state = dataclasses.replace(trainer.state, params=params)
            trainer._sync_policy()
        trainer.logger = RunLogger(
            trainer.run_dir,
            tensorboard=False,
            jsonl=False,
            progress_bar=False,
            phase_bars=True,  # the evaluation's own bar: games played so far
            is_main=distributed.is_main_process(),
        )
        stage = "base" if base else ("eval" if step is None else f"eval-step{int(step)}")
        stage += "" if temperature == 0 else f"_T{temperature:g}"
        return trainer.evaluate(stage, temperature=temperature, samples=samples, seed=seed)
    finally:
        trainer.close()
