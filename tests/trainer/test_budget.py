"""Step budgets: +-25% moves at exact thresholds, bounds, mastery, state; budgets per episode."""

import json

import pytest
from flax import nnx

from configs.base import get_config
from envs import EnvPool
from jaxrl_agents.models import ModelConfig, Transformer
from jaxrl_agents.models.tokenizer import train_tokenizer
from jaxrl_agents.rollout import EpisodeDriver
from jaxrl_agents.trainer.budget import StepBudget, steps_for


def budget(**kw):
    return StepBudget(**{"adjust_every_epochs": 2, **kw})


def check(b, epoch_pairs):
    """Feeds (wins, episodes) of task "a" epoch after epoch; returns the last events."""
    events = {}
    for epoch, result in epoch_pairs:
        events = b.observe(epoch, {"a": result})
    return events


def test_budget_starts_at_start_factor_times_optimal_steps():
    b = budget()
    assert b.factor("never seen") == 2.0
    assert [b.steps("a", k) for k in (1, 3, 4, 7)] == [2, 6, 8, 14]
    assert b.eval_steps(5) == 10


def test_steps_round_up_and_are_at_least_one():
    assert steps_for(2.5, 4) == 10  # exact products are not pushed up by float error
    assert steps_for(1.875, 4) == 8  # 7.5 -> 8
    assert steps_for(1.1, 10) == 11  # 11.000000000000002 -> 11
    assert steps_for(1.0, 0) == 1


def test_moves_are_plus_and_minus_adjust_only_at_adjustment_epochs():
    b = budget()
    assert b.observe(0, {"a": (0, 10)}) == {}  # epoch 0 is no adjustment epoch (every 2)
    assert b.factor("a") == 2.0
    assert b.observe(1, {"a": (1, 10)}) == {"a": "grow"}  # 1/20 < 0.3
    assert b.factor("a") == pytest.approx(2.0 * 1.25)
    check(b, [(2, (9, 10)), (3, (10, 10))])  # 19/20 > 0.7
    assert b.factor("a") == pytest.approx(2.0 * 1.25 * 0.75)
    assert check(b, [(4, (5, 10)), (5, (5, 10))]) == {"a": "keep"}
    assert b.factor("a") == pytest.approx(2.0 * 1.25 * 0.75)


def test_thresholds_are_strict():
    b = budget(grow_below=0.25, shrink_above=0.75)
    assert check(b, [(0, (1, 2)), (1, (0, 2))]) == {"a": "keep"}  # success 0.25 exactly
    assert check(b, [(2, (3, 4)), (3, (0, 0))]) == {"a": "keep"}  # 0.75 exactly
    assert b.factor("a") == 2.0
    assert check(b, [(4, (3, 4)), (5, (1, 1))]) == {"a": "shrink"}  # 0.8


def test_factor_stays_within_its_bounds():
    b = budget(min_factor=1.0, max_factor=3.0)
    for epoch in range(1, 20, 2):
        b.observe(epoch, {"a": (0, 4)})
    assert b.factor("a") == 3.0
    for epoch in range(21, 60, 2):
        b.observe(epoch, {"a": (4, 4)})
    assert b.factor("a") == 1.0 and b.steps("a", 3) == 3


def test_a_task_not_played_keeps_its_budget_and_streak():
    b = budget(retire_after=2)
    check(b, [(1, (9, 10))])
    assert b.streaks["a"] == 1
    assert b.observe(3, {"b": (0, 1)}) == {"b": "grow"}
    assert b.factor("a") == pytest.approx(1.5) and b.streaks["a"] == 1
    assert check(b, [(5, (9, 10))]) == {"a": "shrink+retire"}


def test_retire_after_a_streak_of_mastered_checks():
    b = budget(retire_above=0.8, retire_after=3, on_mastered="retire")
    check(b, [(1, (9, 10)), (3, (9, 10))])
    check(b, [(5, (8, 10))])  # 0.8 is not above 0.8: the streak starts again
    assert not b.is_retired("a")
    check(b, [(7, (9, 10)), (9, (10, 10))])
    assert not b.is_retired("a")
    assert check(b, [(11, (9, 10))]) == {"a": "shrink+retire"}
    assert b.is_retired("a") and b.retired == ["a"]


def test_harder_drops_to_min_factor_then_retires():
    b = budget(retire_after=2, on_mastered="harder", min_factor=0.5)
    assert check(b, [(1, (1, 1)), (3, (1, 1))]) == {"a": "shrink+harder"}
    assert b.factor("a") == 0.5 and not b.is_retired("a")
    assert check(b, [(5, (1, 1)), (7, (1, 1))]) == {"a": "shrink+retire"}
    assert b.is_retired("a")


def test_on_mastered_none_never_retires():
    b = budget(retire_after=1, on_mastered="none")
    check(b, [(epoch, (1, 1)) for epoch in range(1, 40, 2)])
    assert b.retired == [] and b.factor("a") == b.min_factor


def test_state_round_trips_through_json_mid_window():
    a = budget(retire_after=2)
    a.observe(1, {"a": (0, 3), "b": (3, 3)})
    a.observe(2, {"a": (2, 3)})
    b = budget(retire_after=2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict()
    for epoch in range(3, 12):
        result = {"a": (epoch % 3, 3), "b": (3, 3)}
        assert a.observe(epoch, result) == b.observe(epoch, result)
    assert b.state_dict() == a.state_dict() and a.is_retired("b")


def test_invalid_settings_are_rejected():
    for kw in (
        {"start_factor": 0.5, "min_factor": 1.0},
        {"adjust": 1.0},
        {"grow_below": 0.8, "shrink_above": 0.7},
        {"on_mastered": "easier"},
        {"retire_after": 0},
    ):
        with pytest.raises(ValueError):
            StepBudget(**kw)


def test_from_config_reads_the_budget_section():
    cfg = get_config()
    b = StepBudget.from_config(cfg.budget)
    assert (b.start_factor, b.adjust, b.adjust_every_epochs) == (2.0, 0.25, 10)
    assert (b.retire_above, b.retire_after, b.on_mastered) == (0.8, 3, "retire")


def test_the_driver_ends_each_episode_at_its_own_budget(tmp_path):
    """Wrong answers never end a toy count game; each episode stops at its budget."""
    tokenizer = train_tokenizer(["Say 12 first.", "0 1 2 3 4 5 6 7 8 9"] * 20, 300, tmp_path)
    model_cfg = ModelConfig(
        vocab_size=len(tokenizer) + 4,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    model = Transformer(model_cfg, rngs=nnx.Rngs(0))
    specs = [{"family": "toy", "task": "count", "n": 3, "seed": i} for i in range(4)]
    with EnvPool(specs, num_workers=1) as pool:
        driver = EpisodeDriver(model, tokenizer, pool, max_steps=5, max_context=8192)
        wrong = [["0"] * 20] * 4
        trajs = driver.run(range(4), forced_actions=wrong, max_steps=[1, 3, None, 6])
    assert [t.info["steps"] for t in trajs] == [1, 3, 5, 6]
    # The env's own budget (2 x 3 + 2 = 8) is above them all: the driver ended every one.
    assert all(t.truncated and t.info["end_reason"] == "step_budget" for t in trajs)
    assert [t.num_turns for t in trajs] == [1, 3, 5, 6]
