"""The outer loop: (SFT) -> collect episodes -> update -> evaluate -> checkpoint -> log.

    summary = train(cfg)            # a fresh run into <output_dir>/<name>/
    summary = train(cfg, resume=True)  # continue from its latest checkpoint

Everything random in update u is derived from (seed, u): the tasks played, the sampling
key and the minibatch order. With the learner state, KL controller and reward statistics
restored from the checkpoint, a resumed run repeats exactly what an uninterrupted run does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envs.action_space import ActionStaging
from jaxrl_agents import compile_cache, distributed, monitors, preflight, reward_model
from jaxrl_agents import rewards as reward_lib
from jaxrl_agents import stats as seed_stats
from jaxrl_agents.checkpoint import Checkpointer
from jaxrl_agents.data.selection import filter_groups
from jaxrl_agents.logging import RunLogger
from jaxrl_agents.run_records import (
    CHECKPOINT_DIR,
    SUMMARY_FILE,
    TRAJECTORIES_FILE,
    set_aside_previous_run,
)
from jaxrl_agents.sharding import make_mesh
from jaxrl_agents.stats import clustered_success_ci
from jaxrl_agents.trainer import setup, shares
from jaxrl_agents.trainer.rl import make_learner
from jaxrl_agents.trainer.sft import SFTTrainer
from jaxrl_agents.trainer.task_schedule import TaskSchedule


def run_dir_of(cfg) -> str:
    return os.path.join(cfg.output_dir, cfg.name)


def num_updates(cfg) -> int:
    episodes = cfg.rl.epochs * cfg.rl.episodes_per_epoch
    return max(episodes // cfg.rollout.episodes_per_batch, 0)


@dataclasses.dataclass
class Progress:
    """Loop counters saved with each checkpoint (JSON)."""

    update: int = 0  # RL updates done
    sft_done: bool = False  # the supervised phases (LM warm-up and / or SFT) are done
    groups_used: int = 0  # the driver's group-id counter


class Trainer:
    """Owns a run: its envs, models, driver, learner, logger and checkpoints."""

    def __init__(self, cfg, *, resume: bool = False):
        self.cfg = cfg
        self.run_dir = run_dir_of(cfg)
        self.resume = resume
        # The warm-up's and SFT's results, kept in checkpoints so that a run resumed after
        # them reports them too.
        self.supervised_summary: dict = {}
        os.makedirs(self.run_dir, exist_ok=True)
        self.layout = setup.EnvLayout(cfg)
        distributed.main_first(
            lambda: setup.pregenerate(self.layout, cfg.rollout.num_env_workers), "pregenerate"
        )
        self.staging = (
            ActionStaging.from_config(cfg.action_space) if cfg.action_space.staging else None
        )
        self.pool = setup.make_pool(cfg, self.layout, self.staging)
        self.schedule = TaskSchedule(cfg, self.layout, self.pool.tasks)
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
        self.state = None
        self.progress = Progress()
        self.reward_stats = reward_lib.RunningMeanStd()
        self.monitor = monitors.Monitor.from_config(cfg.monitor)
        self.reward_recipe = reward_lib.RewardRecipe.from_config(cfg.reward)
        self.reward_model = reward_model.from_config(cfg.reward, self.reward_recipe)
        self.reward_metrics = {}
        self.rollout_stats = {}
        self.checkpointer = Checkpointer(
            os.path.join(self.run_dir, CHECKPOINT_DIR), keep=cfg.checkpoint.keep,
            always_keep=(0,),  # the policy after SFT (or the initial one without SFT)
        )
        self.key = jax.random.key(cfg.seed)
        self.logger = None

    # -- checkpoints

    def _save(self) -> None:
        meta = {
            "progress": dataclasses.asdict(self.progress),
            "kl": self.learner.kl.state_dict(),
            "reward_stats": self.reward_stats.to_dict(),
            "learner_updates": self.learner.updates,
            "monitor": self.monitor.state_dict(),
            "action_stage": self.staging.state_dict() if self.staging else None,
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
        self.reward_stats = reward_lib.RunningMeanStd.from_dict(meta["reward_stats"])
        self.monitor.load_state_dict(meta.get("monitor", {}))
        if self.staging and meta.get("action_stage"):
            self.staging.load_state_dict(meta["action_stage"])
            if self.staging.stage:
                self._rebuild_pool()
        self.schedule.load_state_dict(meta.get("schedule", {}))
        self.supervised_summary = meta.get("supervised_summary", {})
        self.driver._groups_used = self.progress.groups_used
        self._sync_policy()
        return True

    def advance_action_stage(self) -> bool:
        """Allows the next stage's verbs (action_space.staging) and rebuilds the env pool.
        False when nothing changed."""
        if self.staging is None or not self.staging.advance():
            return False
        self._rebuild_pool()
        return True

    def stage_actions(self, update: int, trajs) -> dict:
        """Action-space staging after update `update`: tallies its training episodes and,
        every `action_space.advance_every_epochs` epochs, moves to the next stage's verbs
        when success over them exceeded `action_space.advance_above`."""
        played = [t for t in trajs if not t.failed]
        self.staging.record(sum(bool(t.won) for t in played), len(played))
        period = self.schedule.updates_per_epoch * self.cfg.action_space.advance_every_epochs
        if (update + 1) % period == 0 and self.staging.decide(self.cfg.action_space.advance_above):
            self._rebuild_pool()
            self.logger.write(f"Action space: stage {self.staging.stage}, verbs "
                              f"{self.staging.allowed_verbs or 'all'}")
        verbs = self.staging.allowed_verbs
        return {"action_space/stage": self.staging.stage,
                "action_space/verbs": len(verbs) if verbs is not None else -1}

    def _rebuild_pool(self) -> None:
        self.pool.close()
        self.pool = setup.make_pool(self.cfg, self.layout, self.staging)
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

    def evaluate(self, stage: str, step: int | None = None, limit: int = 0, ids=None, *,
                 temperature: float = 0.0, samples: int = 1, seed: int = 0) -> dict:
        """Greedy play on the held-out tasks (`ids`, default every one; the first `limit`, or
        all when 0); success with a 95% Wilson interval. When the games cover several tasks,
        each task's share is also written to eval.json as stage "<stage>:<task>".

        temperature > 0: sampled play instead, each game `samples` times (keys from `seed`);
        the interval is then over games (`clustered_success_ci`).
        Multi-host: each process plays its share and every process gets every result."""
        check_eval_sampling(temperature, samples)
        ids = self.layout.eval_ids if ids is None else ids
        ids = ids[:limit] if limit else ids
        mine = ids[distributed.process_slice(len(ids))]
        chunk = even_chunk(len(mine), self.cfg.rollout.episodes_per_batch)
        key = jax.random.key(seed)
        local = []
        with self.logger.phase(f"eval {stage}", len(mine) * samples, "game") as advance:
            for i in range(0, len(mine), chunk):
                part = mine[i : i + chunk]
                budgets = self.schedule.eval_max_steps(part)
                if temperature == 0:
                    local += self.eval_driver.run(part, greedy=True, max_steps=budgets)
                    advance(len(part))
                    continue
                for k in range(samples):
                    sub = jax.random.fold_in(jax.random.fold_in(key, i), k)
                    local += self.eval_driver.run(part, sub, max_steps=budgets,
                                                  temperature=temperature)
                    advance(len(part))
        trajs = [t for part in distributed.allgather_objects(local) for t in part]
        result = held_out_result(trajs)
        parts = self.layout.split_by_task(trajs)
        per_task = {}
        if len(parts) > 1:  # one figure per task, counted as the whole is
            per_task = {task: held_out_result(part) for task, part in parts.items()}
            result["by_task"] = {task: r["mean"] for task, r in sorted(per_task.items())}
        self.logger.write_eval(stage, result, step=step)
        for task, task_result in per_task.items():
            self.logger.write_eval(f"{stage}:{task}", task_result, step=step)
        return result

    def run_pretrain(self) -> dict:
        """Language modelling (every token) on transcripts of random admissible commands
        played on the train tasks: a from-scratch model learns the text and the format
        before SFT. No gold action is used."""
        cfg = self.cfg
        heads = self.layout.train_task_heads()
        trajs = []
        rounds = cfg.pretrain.episodes_per_task
        with self.logger.phase("warm-up transcripts", rounds * len(heads), "game") as advance:
            for r in range(rounds):
                key = jax.random.fold_in(jax.random.fold_in(self.key, r), 2)
                trajs += self.eval_driver.run(heads, key, forced_actions="random")
                advance(len(heads))
        self.logger.write(f"Pretraining on {len(trajs)} random-play transcripts")
        trainer = SFTTrainer(
            self.actor_critic.policy, learning_rate=cfg.pretrain.learning_rate,
            batch_size=cfg.pretrain.batch_size, epochs=cfg.pretrain.epochs, val_fraction=0.1,
            seed=cfg.seed, keep_best=False, target="all", max_grad_norm=cfg.rl.max_grad_norm,
            pad_id=self.pad_id, length_buckets=cfg.rollout.length_buckets,
            grad_accum=cfg.pretrain.grad_accum)

        with self.logger.phase("warm-up", cfg.pretrain.epochs, "epoch") as advance:

            def on_epoch(row):
                self.logger.log(0, {f"pretrain/{k}": v for k, v in row.items()})
                self.logger.write(f"  pretrain epoch {row['epoch']}: train "
                                  f"{row['train_loss']:.4f} val "
                                  f"{row.get('val_loss', float('nan')):.4f}")
                advance()

            history = trainer.fit(trajs, on_epoch=on_epoch)
        return {"history": history, "transcripts": len(trajs)}

    def run_sft(self) -> dict:
        cfg = self.cfg
        heads = self.layout.train_task_heads()[: cfg.sft.num_trajectories]
        gold = [t for t in self.eval_driver.run(heads, forced_actions="gold") if t.won]
        self.logger.write(f"SFT on {len(gold)} golden trajectories (of {len(heads)} tasks)")
        trainer = SFTTrainer.from_config(cfg, self.actor_critic.policy, pad_id=self.pad_id)

        every = cfg.sft.eval_every_epochs

        def on_epoch(row):
            line = (f"  SFT epoch {row['epoch']}: train {row['train_loss']:.4f} "
                    f"val {row.get('val_loss', float('nan')):.4f}")
            if every and cfg.sft.eval_games and row["epoch"] % every == 0:
                early = self.evaluate("sft_epoch", step=row["epoch"], limit=cfg.sft.eval_games)
                row["eval_success"] = early["mean"]
                line += f" held-out success {early['mean']:.3f} ({early['n']} games)"
            self.logger.log(0, {f"sft/{k}": v for k, v in row.items()})
            self.logger.write(line)
            advance()

        with self.logger.phase("SFT", cfg.sft.epochs, "epoch") as advance:
            history = trainer.fit(gold, on_epoch=on_epoch)
        result = self.evaluate("sft", limit=cfg.sft.eval_games) if cfg.sft.eval_games else {}
        result["history"] = history
        return result

    def collect(self, update: int):
        """Episodes of update `update` (every process's, in plan order) and this process's
        rows of their packed batch (see `shares`)."""
        cfg = self.cfg
        index, count, g = jax.process_index(), jax.process_count(), self.layout.group_size
        plan = self.schedule.plan(update)
        mine, first_group = shares.plan_share(plan, g, index, count)
        key = jax.random.fold_in(jax.random.fold_in(self.key, update), 0)
        if count > 1:
            key = jax.random.fold_in(key, index)  # processes sample different episodes
        # Group ids unique over processes (their counters differ: evaluations share it).
        groups_before = distributed.agree_max([self.driver._groups_used])[0]
        self.driver._groups_used = groups_before + first_group
        local = self.driver.run(mine.env_ids, key, max_steps=mine.max_steps)
        self.driver._groups_used = groups_before + len(plan.env_ids) // g
        everyone = distributed.allgather_objects((local, self.driver.last_stats))
        trajs = [t for part, _ in everyone for t in part]
        self.rollout_stats = shares.merge_rollout_stats([stats for _, stats in everyone])
        dump = (
            cfg.reward.dump_trajectories
            and distributed.is_main_process()
            and os.path.join(self.run_dir, TRAJECTORIES_FILE)
        )
        self.reward_metrics = reward_lib.shape_collected(
            trajs, self.reward_recipe, reward_model=self.reward_model, dump_path=dump, update=update
        )
        monitors.add_novelty_bonus(trajs, cfg.algo.diversity_bonus)
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
        kept = filter_groups(trajs, cfg.algo.group_filter_keep)  # all: 1.0 (StarPO-S)
        batch = shares.pack_share(
            kept,
            g,
            index,
            count,
            pad_id=self.pad_id,
            length_buckets=cfg.rollout.length_buckets,
            row_multiple=shares.local_batch_shards(self.mesh, count),
            choice_width=cfg.rollout.choice_width if cfg.rollout.constrain_actions else None,
        )
        return trajs, batch

    def rl_update(self, update: int) -> dict:
        start = time.perf_counter()
        trajs, batch = self.collect(update)
        rollout_s = time.perf_counter() - start
        stats = dict(self.rollout_stats)
        key = jax.random.fold_in(jax.random.fold_in(self.key, update), 1)
        compile_cache.release_if_near_limit()
        self.state, metrics = self.learner.update(self.state, batch, key)
        self._sync_policy()
        update_s = time.perf_counter() - start - rollout_s
        metrics.update(stats)
        metrics.update(self.reward_metrics)
        metrics.update(self.schedule.observe(update, trajs))
        if self.staging is not None:
            metrics.update(self.stage_actions(update, trajs))
        if metrics.get("curriculum/move") == 1.0 and self.cfg.curriculum.ewc_coef > 0:
            # EWC: the stage just left (this batch, these parameters) becomes the anchor.
            self.state = self.learner.consolidate(self.state, batch)
            metrics["curriculum/ewc_consolidated"] = 1.0
        tokens = distributed.allgather_rows(np.array([batch.valid.sum()])).sum()  # all rows
        metrics.update(
            {
                "charts/success": setup.success_rate(trajs),
                "charts/action_coverage": setup.action_coverage(trajs),
                "charts/invalid_action_share": monitors.invalid_action_share(trajs),
                "charts/tampered_episodes": monitors.tampered_episodes(trajs),
                "perf/tokens_per_s": float(tokens) / (rollout_s + update_s),
                "perf/rollout_s": rollout_s,
                "perf/update_s": update_s,
            }
        )
        metrics.update(self.monitor.report(trajs, metrics, self.logger.write, update + 1))
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
        if cfg.model.hf_path and not resumed:  # pretrained weights: eval.json base -> sft -> rl
            self.supervised_summary["base"] = self.evaluate("base")
        supervised = cfg.sft.enabled or cfg.pretrain.episodes_per_task > 0
        if supervised and not self.progress.sft_done:
            # The warm-up runs whenever it is configured, with or without SFT after it.
            if cfg.pretrain.episodes_per_task:
                self.supervised_summary["pretrain"] = self.run_pretrain()
            if cfg.sft.enabled:
                self.supervised_summary["sft"] = self.run_sft()
            self._agree_on_policy()
            # The reference policy is the policy after these phases; optimizer state starts
            # fresh.
            self.state = self.learner.init_state(self.actor_critic)
            self.progress.sft_done = True
            self._save()
        summary = dict(self.supervised_summary)
        for update in range(self.progress.update, self.total_updates):
            metrics = self.rl_update(update)
            self.progress.update = update + 1
            self.progress.groups_used = self.driver._groups_used
            if cfg.rl.eval_every and (update + 1) % cfg.rl.eval_every == 0:
                result = self.evaluate("rl", step=update + 1)
                metrics["eval/success"] = result["mean"]
            for task, ids in self.schedule.due_evaluations(update):
                result = self.evaluate(f"stage:{task}", step=update + 1, ids=ids)
                metrics[f"curriculum/eval/{task.replace(':', '/')}"] = result["mean"]
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
    # evaluations on the same games can be compared game by game (`seed_stats.paired_games`).
    # Keyed by the task's name: unique and stable across runs and hosts (an env id is not).
    per_game: dict = {}
    for game, t in zip(games, trajectories):
        per_game.setdefault(str(t.task_id or game), []).append(float(t.won))
    result["per_game"] = {game: float(np.mean(won)) for game, won in per_game.items()}
    result["return_mean"] = float(np.mean([t.episode_return for t in trajectories]))
    result["failed"] = int(sum(t.failed for t in trajectories))
    result["invalid_action_share"] = monitors.invalid_action_share(trajectories)
    return result


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
    `Trainer.evaluate`). With `base`, or when the run has no checkpoint yet, that of the
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
            is_main=distributed.is_main_process(),
        )
        stage = ("base" if base else "eval") + ("" if temperature == 0 else f"_T{temperature:g}")
        return trainer.evaluate(stage, temperature=temperature, samples=samples, seed=seed)
    finally:
        trainer.close()


# The held-out evaluations of a run, in order, and how the summary names them.
SUMMARY_STAGES = {"base": "of the pretrained model", "sft": "after SFT", "rl": "after RL"}


def format_summary(summary: dict) -> str:
    """Human-readable end-of-run lines: held-out success of the pretrained model (when the
    run starts from one), after SFT and after RL."""
    lines = []
    for stage, when in SUMMARY_STAGES.items():
        r = summary.get(stage)
        if r and r.get("mean") is not None:
            lines.append(
                f"held-out success {when}: {r['mean']:.3f} "
                f"(95% CI {r['ci_low']:.3f}-{r['ci_high']:.3f}, {r['n']} games)"
            )
    lines += paired_lines(summary)
    run_dir = summary.get("run_dir", "")
    lines.append(
        f"logs: {run_dir}/metrics.jsonl, TensorBoard in {run_dir}, "
        f"eval: {run_dir}/eval.json, plots: {run_dir}/plots/"
    )
    return "\n".join(lines)


# Pairs of stages compared game by game at the end of a run: (earlier, later).
PAIRED_STAGES = (("sft", "rl"), ("base", "rl"), ("base", "sft"))


def paired_lines(evals: Mapping) -> list[str]:
    """For each of PAIRED_STAGES that `evals` (a summary, or eval.json) holds with its
    games' outcomes: the later stage minus the earlier on the games both played, with
    McNemar's exact test (`seed_stats.paired_games`)."""
    lines = []
    for first, second in PAIRED_STAGES:
        a, b = (evals.get(stage) or {} for stage in (first, second))
        pair = seed_stats.paired_games(a.get("per_game") or {}, b.get("per_game") or {})
        if pair:
            lines.append(seed_stats.format_paired_games(pair, first, second))
    return lines


def write_summary(summary: dict) -> None:
    path = os.path.join(summary["run_dir"], SUMMARY_FILE)
    with open(path, "w") as f:
        json.dump({k: v for k, v in summary.items() if k != "plots"}, f, indent=1, default=str)
