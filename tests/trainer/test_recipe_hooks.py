"""The collector's group filter and novelty bonus, the monitors and the schedule's action
stages acted on by the loop, in one tiny in-process toy run (one RL update)."""

import numpy as np
import pytest

from jaxrl_agents.config import load_config
from jaxrl_agents.logging import RunLogger
from jaxrl_agents.trainer import setup
from jaxrl_agents.trainer.loop import Trainer
from jaxrl_agents.trainer.task_schedule import ActionStageAdvanced


@pytest.mark.slow
def test_one_update_with_filter_bonus_monitors_and_stage_hook(tmp_path):
    cfg = load_config(
        "configs/toy_tiny.py",
        [
            f"output_dir={tmp_path}",
            "name=hooks",
            "env.size=2",
            "env.num_train_tasks=4",
            "env.num_eval_tasks=2",
            "rollout.episodes_per_batch=8",
            "rollout.group_size=2",
            "algo.group_filter_keep=0.5",
            "algo.diversity_bonus=0.1",
            "rl.minibatch_size=2",
            "rl.ppo_epochs=1",
            "sft.enabled=false",
            "action_space.staging=true",
            "monitor.kl_max=-1.0",
        ],  # fmt: skip
    )
    trainer = Trainer(cfg)
    try:
        trainer.state = trainer.learner.init_state(trainer.actor_critic)
        lines = []
        trainer.logger = RunLogger(trainer.run_dir, tensorboard=False, progress_bar=False)
        trainer.logger.write = lines.append
        collection = trainer.collector.collect(0, trainer.schedule.plan(0), trainer.key)
        trajs, batch = collection.trajectories, collection.batch
        assert len(trajs) == 8 and int(batch.row_valid.sum()) == 4  # 2 of 4 groups kept
        for t in trajs:  # the bonus: 0.1 on every action new to its episode (+ env reward)
            firsts = [a not in t.info["actions"][:k] for k, a in enumerate(t.info["actions"])]
            assert t.rewards[t.turn_ends].sum() >= 0.1 * sum(firsts) - 1e-6
        metrics = trainer.rl_update(1)
        assert metrics["monitor/warnings"] >= 1 and "KL drift" in metrics["monitor/warning_text"]
        assert any("KL drift" in line for line in lines)
        assert np.isfinite(metrics["monitor/repeat_rate"])
        assert 0 <= metrics["monitor/admissible_coverage"] <= 1  # toy envs offer commands
        assert metrics["action_space/stage"] == 0  # one update: no period ended yet
        old_pool = trainer.pool
        # The period so far holds update 1's 8 episodes; with 40 more won it is above 0.75.
        staging = trainer.schedule.staging
        staging.record(40, 40)
        period = trainer.schedule.updates_per_epoch * cfg.action_space.advance_every_epochs
        feedback = trainer.schedule.observe(period - 1, [])
        assert feedback.metrics["action_space/stage"] == 1
        assert feedback.events == [ActionStageAdvanced(1, tuple(staging.allowed_verbs))]
        trainer.act_on(feedback.events, None)  # as rl_update does with the schedule's events
        assert trainer.pool is not old_pool and trainer.driver.pool is trainer.pool
        assert any("Action space: stage 1" in line for line in lines)
        assert trainer.advance_action_stage() and staging.stage == 2
        assert len(trainer.pool.reset([0])) == 1
    finally:
        trainer.close()


def test_action_space_keys_reach_only_verb_families():
    from envs.action_space import ActionStaging

    cfg = load_config("configs/base.py", ["action_space.compound_actions=3"])
    staging = ActionStaging(initial_verbs=["go", "take"])
    tw = setup.action_space_spec(cfg, {"family": "textworld", "seed": 1}, staging)
    assert tw == {"family": "textworld", "seed": 1, "allowed_verbs": ["go", "take"],
                  "compound_actions": 3}  # fmt: skip
    toy = {"family": "toy", "seed": 1}
    assert setup.action_space_spec(cfg, toy, staging) == toy
