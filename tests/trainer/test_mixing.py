"""Task mixing: frequencies match weights, core share, capacities, determinism, state."""

import json
from collections import Counter

import numpy as np
import pytest

from jaxrl_agents.trainer.mixing import TaskMixer, compose_batch, draw_counts, share_count
from tests.trainer.helpers import toy_schedule

BIG = 10**9


def within_binomial(count, trials, p, sigmas=4.0):
    return abs(count - trials * p) <= sigmas * np.sqrt(trials * p * (1 - p))


def test_share_count_rounds_at_random_to_the_right_mean():
    rng = np.random.default_rng(0)
    draws = [share_count(rng, 0.1, 16) for _ in range(20000)]
    assert set(draws) == {1, 2}  # 1.6 slots: floor or floor + 1
    assert within_binomial(draws.count(2), 20000, 0.6)
    assert share_count(rng, 0.25, 16) == 4 and share_count(rng, 0.0, 16) == 0


def test_draw_frequencies_match_the_weights():
    rng = np.random.default_rng(1)
    weights = {"a": 1.0, "b": 2.0, "c": 5.0, "never": 0.0}
    counts = draw_counts(rng, 8000, weights, dict.fromkeys(weights, BIG))
    assert "never" not in counts and sum(counts.values()) == 8000
    for task, w in weights.items():
        if w:
            assert within_binomial(counts[task], 8000, w / 8.0), (task, counts)


def test_capacity_is_never_exceeded_and_leftover_slots_pass_on():
    rng = np.random.default_rng(2)
    capacity = {"core": 2, "a": 3, "b": 100}
    for _ in range(200):
        counts = compose_batch(rng, 10, [(0.5, {"core": 1}), (None, {"a": 1, "b": 1})], capacity)
        assert counts["core"] == 2  # wanted 5, has 2: the other 3 go to the mixture
        assert counts.get("a", 0) <= 3 and sum(counts.values()) == 10
    small = compose_batch(rng, 10, [(None, {"a": 1})], capacity)
    assert small == {"a": 3}  # capacities run out: a smaller batch


def test_core_share_is_always_given_and_the_rest_follows_the_weights():
    rng = np.random.default_rng(3)
    mixer = TaskMixer(["a", "b"], [1.0, 3.0], core_share=0.25)
    totals, batches = Counter(), 3000
    for _ in range(batches):
        counts = compose_batch(
            rng, 10, mixer.parts("core"), dict.fromkeys("ab", BIG) | {"core": BIG}
        )
        assert counts["core"] in (2, 3) and sum(counts.values()) == 10
        totals.update(counts)
    slots = 10 * batches
    assert within_binomial(totals["core"], slots, 0.25)
    rest = slots - totals["core"]
    assert within_binomial(totals["b"], rest, 0.75)


def test_retired_tasks_leave_the_mixture_but_never_the_core_share():
    mixer = TaskMixer(["a", "b", "core"], core_share=0.5)
    parts = mixer.parts("core", retired=["a", "core"])
    assert parts == [(0.5, {"core": 1.0}), (None, {"b": 1.0})]
    assert mixer.parts("core", retired=["a", "b", "core"])[-1] == (None, {"core": 1.0})
    middle = (0.1, {"stage0": 1.0})
    assert mixer.parts("core", [middle])[1] == middle


def test_mixer_settings_are_checked():
    with pytest.raises(ValueError, match="2 values for 3 tasks"):
        TaskMixer(["a", "b", "c"], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive sum"):
        TaskMixer(["a"], [0.0])
    with pytest.raises(ValueError, match="repeats"):
        TaskMixer(["a", "a"])
    with pytest.raises(ValueError, match="core_share"):
        TaskMixer(["a"], core_share=1.5)


def test_mixer_state_round_trips():
    a = TaskMixer(["x", "y"])
    a.record({"x": 3, "y": 1})
    b = TaskMixer(["x", "y"])
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.drawn_shares() == {"x": 0.75, "y": 0.25}


MIX = (
    "mixing.enabled=true",
    "mixing.tasks=('count-2', 'guess-8', 'toy:guess-4')",
    "mixing.weights=(1.0, 3.0, 0.0)",
    "mixing.core_share=0.25",
    "env.name=count",
    "env.size=3",
    "env.num_train_tasks=40",
    "env.num_eval_tasks=2",
    "rollout.episodes_per_batch=16",
)


def test_schedule_builds_every_task_and_mixes_them_by_weight():
    schedule, layout = toy_schedule(*MIX)
    assert list(layout.groups) == ["toy:count-3", "toy:count-2", "toy:guess-8", "toy:guess-4"]
    totals = Counter()
    for update in range(300):
        plan = schedule.plan(update)
        assert len(plan.env_ids) == 16 and len(set(plan.env_ids)) == 16
        totals.update(layout.group_of(i) for i in plan.env_ids)
    slots = 16 * 300
    assert totals["toy:count-3"] == slots // 4  # core share: exactly 4 of 16 every time
    assert totals["toy:guess-4"] == 0  # weight 0
    assert within_binomial(totals["toy:guess-8"], slots * 3 // 4, 0.75)


def test_schedule_plans_depend_only_on_seed_update_and_state():
    first, _ = toy_schedule(*MIX)
    second, _ = toy_schedule(*MIX)
    forward = [first.plan(u).env_ids for u in range(6)]
    backward = [second.plan(u).env_ids for u in reversed(range(6))][::-1]
    assert forward == backward
    assert len({tuple(ids) for ids in forward}) == 6  # every update draws anew


def test_plain_runs_draw_exactly_as_before():
    """With every lever off, the tasks of an update are the loop's historic uniform draw."""
    schedule, layout = toy_schedule("env.num_train_tasks=32", "rollout.episodes_per_batch=16")
    assert list(layout.groups) == ["toy:count-3"]
    for update in range(5):
        rng = np.random.default_rng([0, update])
        tasks = rng.choice(32, size=16, replace=False)
        assert schedule.plan(update).env_ids == layout.train_ids(tasks)
        assert schedule.plan(update).max_steps is None


def test_rl_can_keep_off_the_tasks_sft_trained_on():
    """rl.exclude_sft_tasks: RL draws only train tasks past SFT's first sft.num_trajectories,
    every one of them in time; off, the draw covers the tasks SFT saw too."""
    common = ("env.num_train_tasks=32", "sft.num_trajectories=20",
              "rollout.episodes_per_batch=8")
    apart, layout = toy_schedule(*common, "rl.exclude_sft_tasks=true")
    drawn = {i for u in range(40) for i in apart.plan(u).env_ids}
    assert drawn == set(layout.train_ids(range(20, 32)))
    assert all(len(apart.plan(u).env_ids) == 8 for u in range(5))
    shared, _ = toy_schedule(*common)
    assert {i for u in range(40) for i in shared.plan(u).env_ids} == set(range(32))


def test_retired_mixture_tasks_are_no_longer_drawn():
    schedule, layout = toy_schedule(*MIX, "budget.enabled=true")
    schedule.budget.retired = ["toy:guess-8"]
    keys = {layout.group_of(i) for u in range(50) for i in schedule.plan(u).env_ids}
    assert keys == {"toy:count-3", "toy:count-2"}
