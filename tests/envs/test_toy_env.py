"""The toy family: gold actions win, the observation tells the best action, any string is safe."""

import re

import pytest

import envs
from envs.toy_env import ToyEnv, binary_search, parse_number

SIZES = {"count": [1, 3, 6], "guess": [1, 8, 100]}


def all_tasks():
    """24 tasks per split across both games and their sizes."""
    return [
        {"task": task, "n": n, "seed": seed}
        for task, sizes in SIZES.items()
        for n in sizes
        for seed in range(4)
    ]


def play(env, actions):
    return [env.step(action) for action in actions]


@pytest.mark.parametrize("split", ["train", "eval"])
def test_gold_actions_win_with_sparse_reward(split):
    for spec in all_tasks():
        env = envs.make({"family": "toy", "split": split, **spec})
        first = env.reset()
        assert not first.done and first.reward == 0.0
        results = play(env, env.task.gold_actions)
        assert len(results) == env.task.optimal_steps
        assert [r.done for r in results] == [False] * (len(results) - 1) + [True], spec
        assert results[-1].won and results[-1].reward == 1.0
        assert sum(r.reward for r in results) == 1.0


def test_dense_rewards_sum_to_one_on_a_win():
    for spec in all_tasks():
        env = ToyEnv({"reward_density": "dense", **spec})
        env.reset()
        results = play(env, env.task.gold_actions)
        assert results[-1].won
        assert sum(r.reward for r in results) == pytest.approx(1.0)
        if len(results) > 1:
            assert results[0].reward > 0.0  # progress is rewarded before the win


def read_best_action(observation: str) -> str:
    """A policy that sees only the observation text, as the model will."""
    if match := re.search(r"Say (\d+) first", observation):
        return match.group(1)
    if match := re.search(r"last number: (\d+)", observation, re.IGNORECASE):
        return str(int(match.group(1)) + 1)
    found = re.search(r"possible: (\d+) to (\d+)", observation, re.IGNORECASE)
    low, high = map(int, found.groups())
    return str((low + high) // 2)


@pytest.mark.parametrize("obs_format", ["template", "raw"])
def test_best_action_can_be_read_from_the_observation(obs_format):
    for spec in all_tasks():
        env = ToyEnv({"obs_format": obs_format, **spec})
        result, actions = env.reset(), []
        while not result.done:
            actions.append(read_best_action(result.observation))
            result = env.step(actions[-1])
        assert result.won and actions == env.task.gold_actions


def test_template_and_raw_observations():
    env = ToyEnv({"task": "guess", "n": 8})
    lines = env.reset().observation.splitlines()
    tags = [line.split("]")[0] + "]" for line in lines]
    assert tags == ["[Room]", "[Items]", "[Goal]", "[Feedback]"]
    assert lines[1] == "[Items] possible: 1 to 8"
    raw = ToyEnv({"task": "guess", "n": 8, "obs_format": "raw"}).reset()
    assert "[" not in raw.observation and "1 to 8" in raw.observation
    assert raw.info["raw"] == raw.observation


def test_feedback_on_wrong_guesses_narrows_the_range():
    env = ToyEnv({"task": "guess", "n": 10, "seed": 3})
    target = env.task.info["target"]
    env.reset()
    low = env.step(str(target - 1))
    assert f"Higher than {target - 1}" in low.observation and not low.done
    outside = env.step("0")
    assert "outside" in outside.observation and outside.reward == 0.0
    assert env.step(f"my guess is {target}!").won


def test_same_seed_same_task_and_seeds_differ():
    for spec in all_tasks():
        assert ToyEnv(spec).task == ToyEnv(spec).task
    starts = {ToyEnv({"task": "count", "seed": seed}).task.info["start"] for seed in range(20)}
    assert len(starts) > 5


def test_train_and_test_splits_never_share_a_task():
    for task, key in (("count", "start"), ("guess", "target")):
        def secrets(split, task=task, key=key):
            return {
                (n, ToyEnv({"task": task, "n": n, "seed": s, "split": split}).task.info[key])
                for n in (4, 9)
                for s in range(40)
            }

        train, test = secrets("train"), secrets("eval")
        assert train and test and not train & test
        train_name = ToyEnv({"task": task, "seed": 1, "split": "train"}).task.name
        assert train_name != ToyEnv({"task": task, "seed": 1, "split": "eval"}).task.name


def test_any_string_is_a_safe_action():
    env = ToyEnv({"task": "count", "n": 3, "invalid_penalty": 0.1, "max_steps": 50})
    env.reset()
    for action in ["", " ", "x" * 10_000, "ünïcödé ✓ 🤖", "\x00\x1b[31m\x07\r", "\n\t", None, 17.5]:
        result = env.step(action)
        assert isinstance(result.observation, str) and "[Feedback]" in result.observation
    huge = env.step("9" * 10_000)  # a number, but far too large: just wrong
    assert "Wrong" in huge.observation and huge.reward == 0.0


def test_invalid_penalty_and_out_of_steps():
    env = ToyEnv({"task": "count", "n": 2, "invalid_penalty": 0.25, "max_steps": 2})
    env.reset()
    first = env.step("hello")
    assert first.reward == -0.25 and first.info["invalid"]
    assert "Answer with a number" in first.observation
    second = env.step("0")
    assert second.done and not second.won and second.info["truncated"]
    assert "Out of steps" in second.observation
    after = env.step(env.task.gold_actions[0])
    assert after.done and not after.won and after.reward == 0.0


def test_reset_with_a_new_seed_rebuilds_the_task():
    env = ToyEnv({"task": "guess", "n": 50, "seed": 0})
    names = set()
    for seed in range(5):
        env.reset(seed)
        names.add(env.task.name)
        assert env.task == ToyEnv({"task": "guess", "n": 50, "seed": seed}).task
        assert play(env, env.task.gold_actions)[-1].won
    assert len(names) == 5


def test_admissible_commands_contain_the_best_action():
    for spec in all_tasks():
        env = ToyEnv(spec)
        result = env.reset()
        for action in env.task.gold_actions:
            assert action in result.info["admissible_commands"]
            result = env.step(action)


def test_helpers():
    assert parse_number("guess 12 or 13") == 12 and parse_number("none") is None
    assert parse_number("-3") == -3
    assert binary_search(11, 1, 16) == [8, 12, 10, 11]
    assert binary_search(1, 1, 1) == [1]


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"bogus": 1}, ["bogus", "valid keys"]),
        ({"task": "chess"}, ["task", "chess", "count", "guess"]),
        ({"n": 0}, ["'n'", "0"]),
        ({"n": "3"}, ["'n'", "'3'"]),
        ({"split": "dev"}, ["split", "dev", "train"]),
        ({"reward_density": "every_k"}, ["reward_density", "every_k", "sparse"]),
        ({"obs_format": "json"}, ["obs_format", "json", "template"]),
        ({"invalid_penalty": "high"}, ["invalid_penalty", "high"]),
    ],
)
def test_bad_specs_are_spec_errors(spec, words):
    with pytest.raises(envs.SpecError) as error:
        ToyEnv(spec)
    for word in words:
        assert word in str(error.value)


def test_raise_on_fault_injection_raises_directly():
    env = ToyEnv({"raise_on": "boom"})
    env.reset()
    with pytest.raises(RuntimeError, match="boom"):
        env.step(" boom ")
    assert not env.step("other").done
