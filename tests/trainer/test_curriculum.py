"""Curriculum: promotion / demotion at exact thresholds and bounds, replay share, past-stage
evaluations, state round trips, and a toy run that promotes and resumes at its stage."""

import json

import numpy as np
import pytest

from configs.base import get_config
from jaxrl_agents.config import load_config
from jaxrl_agents.data import Trajectory
from jaxrl_agents.run_records import read_metrics
from jaxrl_agents.trainer.curriculum import DEMOTE, PROMOTE, Curriculum
from jaxrl_agents.trainer.loop import train
from jaxrl_agents.trainer.task_schedule import Promoted
from tests.trainer.helpers import toy_schedule

STAGES = ["w2-o3-q4", "w8-o3-q4", "w2-o12-q4", "w4-o6-q8"]


def curriculum(**kw):
    args = {"promote_above": 0.75, "demote_below": 0.4, "eval_every_epochs": 2}
    return Curriculum(STAGES, **{**args, **kw})


def feed(c, successes, first_epoch=0):
    """Observes one success per epoch; returns the moves made."""
    return [c.observe(first_epoch + k, s) for k, s in enumerate(successes)]


def test_promotion_and_demotion_sequence():
    c = curriculum()
    assert feed(c, [0.9, 0.8]) == [None, PROMOTE]
    assert c.stage == 1 and c.current == "w8-o3-q4"
    assert feed(c, [0.5, 0.6], 2) == [None, None]  # between the thresholds: stay
    assert feed(c, [0.8, 1.0, 0.9, 0.9], 4) == [None, PROMOTE, None, PROMOTE]
    assert c.stage == 3 and c.replay_stages() == STAGES[:3]
    assert feed(c, [0.1, 0.2], 8) == [None, DEMOTE]
    assert c.stage == 2
    assert c.changes == [[1, 0, 1], [5, 1, 2], [7, 2, 3], [9, 3, 2]]


def test_decisions_use_the_mean_since_the_last_decision_at_exact_thresholds():
    c = curriculum()
    assert feed(c, [0.5, 1.0]) == [None, None]  # mean 0.75 is not above 0.75
    assert feed(c, [0.5, 1.0 + 1e-9], 2) == [None, PROMOTE]  # just above it
    assert feed(c, [0.3, 0.5], 4) == [None, None]  # mean 0.4 is not under 0.4
    assert feed(c, [0.3, 0.5 - 1e-9], 6) == [None, DEMOTE]


def test_stages_never_go_below_the_first_nor_past_the_last():
    c = curriculum(eval_every_epochs=1)
    assert feed(c, [0.0, 0.0]) == [None, None] and c.stage == 0
    feed(c, [1.0] * 10, 2)
    assert c.stage == len(STAGES) - 1 and len(c.changes) == 3


def test_epochs_without_the_stage_played_do_not_count():
    c = curriculum()
    assert feed(c, [None, None]) == [None, None] and c.window == []
    # An epoch without data is not averaged in as 0 (0.45 would not promote).
    assert feed(c, [None, 0.9], 2) == [None, PROMOTE]


def test_all_stages_reached_are_evaluated_periodically():
    c = curriculum(eval_every_epochs=1, eval_past_every_epochs=3)
    assert c.stages_to_evaluate(0) == [] and c.stages_to_evaluate(2) == STAGES[:1]
    feed(c, [0.9, 0.9])
    assert c.stages_to_evaluate(5) == STAGES[:3] and c.stages_to_evaluate(6) == []
    assert curriculum(eval_past_every_epochs=0).stages_to_evaluate(9) == []


def test_state_round_trips_through_json():
    a = curriculum()
    feed(a, [0.9, 0.9, 0.95])  # promoted, and one success in the window
    b = curriculum()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert (b.stage, b.window, b.changes) == (1, [0.95], [[1, 0, 1]])
    successes = [0.1, 0.9, 0.95, 0.3, 0.2, 0.2, 0.9]
    assert feed(a, successes, 3) == feed(b, successes, 3)
    assert a.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="stage 7"):
        b.load_state_dict({"stage": 7, "window": [], "changes": []})


def test_invalid_settings_are_rejected():
    for kw in (
        {"promote_above": 0.3, "demote_below": 0.4},
        {"eval_every_epochs": 0},
        {"replay_share": 1.0},
        {"eval_past_every_epochs": -1},
    ):
        with pytest.raises(ValueError):
            curriculum(**kw)
    with pytest.raises(ValueError, match="empty"):
        Curriculum([])
    with pytest.raises(ValueError, match="repeats"):
        Curriculum(["a", "a"])


def test_from_config_reads_the_curriculum_section():
    cfg = get_config()
    c = Curriculum.from_config(cfg.curriculum)
    assert c.stages == ["w2-o3-q4"] and (c.replay_share, c.eval_past_every_epochs) == (0.1, 10)


CURRICULUM = (
    "curriculum.enabled=true",
    "curriculum.stages=('count-2', 'count-4', 'guess-8')",
    "curriculum.replay_share=0.1",
    "env.num_train_tasks=40",
    "env.num_eval_tasks=2",
    "rollout.episodes_per_batch=16",
)


def test_replay_share_of_every_batch_comes_from_earlier_stages():
    schedule, layout = toy_schedule(*CURRICULUM)
    assert list(layout.groups) == ["toy:count-2", "toy:count-4", "toy:guess-8"]
    first = {layout.group_of(i) for u in range(50) for i in schedule.plan(u).env_ids}
    assert first == {"toy:count-2"}  # stage 0: nothing earlier to replay
    schedule.curriculum.stage = 2
    counts = {key: 0 for key in layout.groups}
    batches = 500
    for update in range(batches):
        plan = schedule.plan(update)
        assert len(plan.env_ids) == 16
        for i in plan.env_ids:
            counts[layout.group_of(i)] += 1
    slots = 16 * batches
    replay = counts["toy:count-2"] + counts["toy:count-4"]
    assert abs(replay / slots - 0.1) < 4 * np.sqrt(0.1 * 0.9 / slots)
    half = replay / 2  # earlier stages share the replay evenly
    assert abs(counts["toy:count-2"] - half) < 4 * np.sqrt(replay * 0.25)


def episode(env_id, won, failed=False):
    return Trajectory([1], [1], [0.0], [0.0], [0], won=won, failed=failed, info={"env_id": env_id})


def test_schedule_feeds_the_stage_success_to_the_curriculum_once_per_epoch():
    schedule, layout = toy_schedule(
        *CURRICULUM, "rl.episodes_per_epoch=32", "curriculum.eval_every_epochs=1"
    )
    assert schedule.updates_per_epoch == 2
    stage0 = layout.groups["toy:count-2"].train_tasks
    later = layout.groups["toy:count-4"].train_tasks
    wins = [episode(i, True) for i in stage0[:4]] + [episode(later[0], False)]
    faults = [episode(i, False, failed=True) for i in stage0[:8]]
    feedback = schedule.observe(0, wins + faults)  # env faults count for nothing
    assert feedback.metrics["tasks/toy/count-2/success"] == 1.0 and feedback.events == []
    assert schedule.curriculum.stage == 0
    feedback = schedule.observe(1, [episode(stage0[0], False)])  # epoch 0 ends: 4 of 5
    metrics = feedback.metrics
    assert metrics["curriculum/move"] == 1.0 and metrics["curriculum/stage"] == 1
    assert feedback.events == [Promoted(stage=1, task="toy:count-4")]
    assert schedule.due_evaluations(1) == []
    state = json.loads(json.dumps(schedule.state_dict()))
    again, _ = toy_schedule(*CURRICULUM, "rl.episodes_per_epoch=32")
    again.load_state_dict(state)
    assert again.curriculum.stage == 1 and again.plan(7) == schedule.plan(7)


RUN = (
    "name=curriculum",
    "env.num_train_tasks=4",
    "env.num_eval_tasks=2",
    "model.num_layers=1",
    "rollout.group_size=2",
    "rollout.episodes_per_batch=8",
    "rollout.length_buckets=(256,)",
    "rollout.max_context=256",
    "rl.episodes_per_epoch=8",
    "rl.minibatch_size=8",
    "rl.ppo_epochs=1",
    "sft.num_trajectories=8",
    "sft.epochs=12",
    "sft.batch_size=4",
    "sft.eval_games=0",
    "checkpoint.every=1",
    "logging.progress_bar=false",
    "logging.tensorboard=false",
    "logging.plots=false",
    "curriculum.enabled=true",
    # guess-1 (always say 1) is learnt by SFT; count-2 is not, in so few steps.
    "curriculum.stages=('guess-1', 'count-2')",
    "curriculum.eval_every_epochs=1",
    "curriculum.promote_above=0.25",
    "curriculum.demote_below=0.0",
    "curriculum.replay_share=0.25",
    "curriculum.eval_past_every_epochs=2",
    "curriculum.ewc_coef=1.0",
)


@pytest.mark.slow
def test_a_toy_run_promotes_and_resumes_at_its_stage(tmp_path):
    config = ("configs/toy_tiny.py", f"output_dir={tmp_path}", *RUN)
    train(load_config(config[0], [*config[1:], "rl.epochs=2"]))
    rows = {r["step"]: r for r in read_metrics(str(tmp_path / "curriculum")) if r["step"]}
    assert rows[1]["tasks/toy/guess-1/success"] > 0.25
    assert rows[1]["curriculum/move"] == 1.0 and rows[1]["curriculum/stage"] == 1
    assert "tasks/toy/count-2/success" not in rows[1]  # update 1 played stage 0 only
    assert "tasks/toy/count-2/success" in rows[2]
    assert {"curriculum/eval/toy/guess-1", "curriculum/eval/toy/count-2"} <= set(rows[2])
    # EWC: the promotion anchored the penalty at the parameters after update 1 (one
    # optimizer step per update here, so update 2's step starts at the anchor).
    assert rows[1]["curriculum/ewc_consolidated"] == 1.0
    assert rows[1]["losses/ewc"] == 0.0 and rows[2]["losses/ewc"] == 0.0
    # Resumed from the checkpoint of update 2, update 3 plays stage 1 (a fresh curriculum
    # would play stage 0 only).
    train(load_config(config[0], [*config[1:], "rl.epochs=3"]), resume=True)
    rows = {r["step"]: r for r in read_metrics(str(tmp_path / "curriculum")) if r["step"]}
    assert rows[3]["curriculum/stage"] == 1 and "tasks/toy/count-2/success" in rows[3]
    assert "curriculum/move" not in rows[3]
    # Update 3 pays for update 2's step: the anchor and the Fisher came back with the
    # checkpoint (a fresh, all-zero Fisher would give 0).
    assert rows[3]["losses/ewc"] > 0.0
