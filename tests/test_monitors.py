"""Monitors on hand-made trajectories: every value computed by hand, every warning fired."""

import math

import numpy as np
import pytest

from jaxrl_agents import monitors
from jaxrl_agents.data import ACTION, PROMPT, Trajectory


def episode(actions, admissible=None, returns=0.0, group_id=0):
    """One token per observation and per action; the return on the last action."""
    types = [PROMPT, ACTION] * len(actions)
    rewards = np.zeros(len(types), np.float32)
    if actions:
        rewards[-1] = returns
    info = {"actions": list(actions)}
    if admissible is not None:
        info["admissible"] = admissible
    ends = list(range(1, len(types), 2))
    return Trajectory(np.arange(len(types)), types, np.zeros(len(types)), rewards, ends,
                      group_id=group_id, info=info)  # fmt: skip


def test_first_occurrences_and_novelty_bonus():
    actions = ["go north", "Go  North", "take apple", "go north", "open door"]
    np.testing.assert_array_equal(
        monitors.first_occurrences(actions), [True, False, True, False, True]
    )
    np.testing.assert_allclose(monitors.novelty_bonus(actions, 0.1), [0.1, 0, 0.1, 0, 0.1])


def test_repeated_action_rate_counts_within_episodes_only():
    trajs = [episode(["a", "a", "b"]), episode(["a", "b", "c", "c"]), episode([])]
    # episode 1 repeats once, episode 2 once (its "a" is new to it): 2 of 7 actions
    assert monitors.repeated_action_rate(trajs) == pytest.approx(2 / 7)
    assert monitors.repeated_action_rate([]) == 0.0


def test_admissible_coverage_per_group():
    offers = [["go north", "take apple", "open door", "look"]] * 3
    trajs = [
        # group 0: uses "go north" twice and "look"; "dance" is not admissible
        episode(["go north", "go north", "dance"], offers, group_id=0),
        episode(["look"], offers[:1], group_id=0),
        # group 1: offered 2 commands, uses both
        episode(["a", "b"], [["a", "b"], ["a", "b"]], group_id=1),
    ]
    assert monitors.admissible_coverage(trajs) == pytest.approx(np.mean([2 / 4, 2 / 2]))
    # an action is used only in a state that offered it
    late = episode(["b", "a"], [["a"], ["a"]], group_id=2)
    assert monitors.admissible_coverage([late]) == pytest.approx(1.0)
    assert math.isnan(monitors.admissible_coverage([episode(["x"], [[]])]))
    assert math.isnan(monitors.admissible_coverage([episode(["x"])]))


def test_tampered_episodes_counts_flagged_episodes():
    trajs = [episode(["edit", "submit"]) for _ in range(4)]
    trajs[0].info["turn_info"] = [{}, {"pass_share": 0.0, "tampered": True}]
    trajs[1].info["turn_info"] = [{}, {"pass_share": 1.0, "tampered": False}]
    trajs[2].info["turn_info"] = [{"tampered": True}, {"tampered": True}]
    assert monitors.tampered_episodes(trajs) == 2
    assert monitors.tampered_episodes([]) == 0


def test_return_variance():
    trajs = [episode(["a"], returns=r) for r in (0.0, 2.0, 4.0)]
    assert monitors.return_variance(trajs) == pytest.approx(np.var([0, 2, 4]))
    assert monitors.return_variance(trajs[:1]) == 0.0


def test_healthy_run_gives_no_warning():
    mon = monitors.Monitor()
    offers = [["a", "b", "c"]] * 2
    trajs = [episode(["a", "b"], offers, returns=r) for r in (0.0, 3.0, 6.0, 0.0)]
    values, lines = mon.check(trajs, {"losses/entropy": 2.0, "kl/ref_kl": 0.01})
    assert lines == [] and values["monitor/warnings"] == 0
    assert "monitor/warning_text" not in values
    assert values["monitor/entropy"] == 2.0 and values["monitor/kl"] == 0.01
    assert values["monitor/repeat_rate"] == 0.0


def test_each_failure_symptom_warns():
    mon = monitors.Monitor(entropy_collapse=0.1, coverage_min=0.5, repeat_max=0.3,
                           return_var_min=1.0, return_var_max=10.0, kl_max=0.2)  # fmt: skip
    mon.check([], {"losses/entropy": 3.0})  # first entropy: 3.0
    offers = [["a", "b", "c", "d"]] * 4
    same = [episode(["a", "a", "a", "a"], offers, returns=1.0) for _ in range(4)]
    values, lines = mon.check(same, {"losses/entropy": 0.2, "kl/ref_kl": 0.5})
    text = " | ".join(lines)
    for needle in ("entropy collapse", "action-space collapse", "repetition",
                   "return-variance collapse", "KL drift"):  # fmt: skip
        assert needle in text, (needle, text)
    assert values["monitor/warnings"] == 5 == len(lines)
    assert values["monitor/warning_text"] == "; ".join(lines)
    wild = [episode(["a"], returns=r) for r in (-10.0, 10.0)]
    _, lines = mon.check(wild, {"losses/entropy": 3.0})
    assert lines == ["return-variance explosion: 100 outside [1, 10]"]


def test_from_config_and_state():
    from configs.base import get_config

    mon = monitors.Monitor.from_config(get_config().monitor)
    assert (mon.return_var_min, mon.return_var_max) == (1.0, 10.0)
    mon.check([], {"losses/entropy": 1.5})
    again = monitors.Monitor.from_config(get_config().monitor)
    again.load_state_dict(mon.state_dict())
    assert again.first_entropy == 1.5


def test_add_novelty_bonus_puts_it_on_turn_ends():
    trajs = [episode(["a", "b", "a"], returns=1.0)]
    monitors.add_novelty_bonus(trajs, 0.1)
    np.testing.assert_allclose(trajs[0].rewards, [0, 0.1, 0, 0.1, 0, 1.0])
    monitors.add_novelty_bonus(trajs, 0.0)  # off
    assert trajs[0].episode_return == pytest.approx(1.2)


def test_report_writes_lines_and_can_be_off():
    lines = []
    mon = monitors.Monitor(kl_max=0.1)
    values = mon.report([episode(["a"])], {"kl/ref_kl": 0.3}, write=lines.append, step=7)
    assert values["monitor/warnings"] == len(lines) == 2  # KL, return variance 0
    assert all(line.startswith("monitor warning (update 7): ") for line in lines)
    assert monitors.Monitor(enabled=False).report([], {"kl/ref_kl": 9.0}, lines.append) == {}
