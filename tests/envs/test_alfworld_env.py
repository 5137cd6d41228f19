"""ALFWorld env on problems generated offline: gold actions win every task type, splits are
disjoint, the same seed gives the same problem, any action is answered, game_file loads."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("alfworld")

import envs  # noqa: E402
from envs import alfworld_env as af  # noqa: E402
from envs import alfworld_gen as gen  # noqa: E402
from jaxrl_agents import rewards as R  # noqa: E402

SIZES = [(3, 2), (5, 4), (8, 6), (12, 8)]  # (objects, receptacles)
TRAIN = [{"task_type": t, "objects": o, "receptacles": r, "seed": i}
         for i, t in enumerate(gen.TASK_TYPES) for (o, r) in SIZES]
EVAL = [dict(TRAIN[i], split="eval") for i in (1, 6, 11, 16, 21)]
GARBAGE = ["", "   ", "x" * 10_000, "héllo wörld 日本語 🎉", "a\x00b\x07c\x1b[31m", "\n\n\t",
           "go to", "take everything", "look. quit"]


@pytest.fixture(scope="session")
def af_cache(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("alfworld_games"))
    paths = af.generate_games(TRAIN + EVAL, num_workers=2, cache_dir=cache)
    assert all(os.path.isfile(p) for p in paths)
    return cache


def make(cache, **spec):
    return envs.make({"family": "alfworld", "cache_dir": cache, **spec})


def test_gold_actions_win_every_generated_task(af_cache):
    for spec in TRAIN + EVAL:
        env = make(af_cache, **spec)
        task = env.task
        assert task.complexity["task_type"] == spec["task_type"]
        assert task.complexity["objects"] == spec["objects"]
        assert task.complexity["receptacles"] >= min(spec["receptacles"], 3)
        assert task.info["gold_source"] == "planner"
        assert task.optimal_steps == len(task.gold_actions) > 0
        env.reset()
        results = [env.step(a) for a in task.gold_actions]
        assert results[-1].won and results[-1].done, spec
        assert not any(r.done for r in results[:-1])
        assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]
        assert all(not r.info["invalid"] for r in results)
        env.close()


def undoing(action: str, admissible: list[str]) -> str | None:
    """An admissible command that undoes `action` (put back what was taken, close what was
    opened)."""
    verb, _, rest = action.partition(" ")
    obj, _, holder = rest.partition(" from ")
    candidates = {"take": [f"move {obj} to {holder}"], "open": [f"close {rest}"]}.get(verb, [])
    return next((c for c in candidates if c in admissible), None)


def test_undone_and_redone_steps_are_paid_once(af_cache):
    """Putting back what was taken and taking it again (twice, after every undoable gold
    step) earns no more than the gold actions alone, in the env's reward and in the
    trainer's reward components (TEXT_MIX), for every task type."""
    undone = 0
    for spec in TRAIN[::len(SIZES)]:  # one problem of each task type
        env = make(af_cache, max_steps=200, **spec)
        env.reset()
        once = [env.step(a) for a in env.task.gold_actions]
        env.reset()
        cyclic = []
        for action in env.task.gold_actions:
            cyclic.append(env.step(action))
            undo = None if cyclic[-1].done else undoing(
                action, cyclic[-1].info["admissible_commands"])
            undone += undo is not None
            for command in [undo, action] * 2 if undo else []:
                cyclic.append(env.step(command))
                assert not cyclic[-1].info["invalid"] and not cyclic[-1].done, command
        assert once[-1].won and cyclic[-1].won, spec
        total = sum(r.reward for r in cyclic)
        assert total <= sum(r.reward for r in once) and total == 1.0
        parts = R.reward_components([r.reward for r in cyclic], [r.info for r in cyclic])
        mixed = R.mixed_turn_rewards(parts, R.TEXT_MIX)
        assert parts["progress"].sum() == 1.0 and mixed.sum() == pytest.approx(1.0)
        env.close()
    assert undone >= len(gen.TASK_TYPES)  # every problem offered a step to undo


def test_handcoded_expert_gold(tmp_path):
    env = make(str(tmp_path), task_type="pick_heat_then_place_in_recep", objects=4,
               receptacles=4, seed=2, expert="handcoded")
    assert env.task.info["gold_source"] == "handcoded"
    assert env.task.optimal_steps <= len(env.task.gold_actions)
    env.reset()
    assert [env.step(a) for a in env.task.gold_actions][-1].won
    env.close()


def test_splits_never_share_a_problem(af_cache):
    def problem(spec):
        with open(make(af_cache, **spec).game_file) as f:
            return f.read()

    train = {problem(s) for s in TRAIN}
    evals = {problem(s) for s in EVAL}
    assert len(train) == len(TRAIN) and len(evals) == len(EVAL)
    assert not train & evals


def test_same_seed_same_problem(af_cache, tmp_path):
    assert gen.generate_problem("pick_two_obj_and_place", 6, 5, seed=7) == \
        gen.generate_problem("pick_two_obj_and_place", 6, 5, seed=7)
    assert gen.generate_problem("pick_two_obj_and_place", 6, 5, seed=7) != \
        gen.generate_problem("pick_two_obj_and_place", 6, 5, seed=8)
    spec = TRAIN[9]
    fresh, cached = make(str(tmp_path), **spec), make(af_cache, **spec)
    assert fresh.task.gold_actions == cached.task.gold_actions
    assert fresh.reset().observation == cached.reset().observation
    fresh.close()
    cached.close()


def test_template_fields_and_raw_text(af_cache):
    env = make(af_cache, **TRAIN[0])
    first = env.reset()
    lines = first.observation.split("\n")
    assert [line.split(" ")[0] for line in lines] == ["[Room]", "[Items]", "[Goal]", "[Feedback]"]
    assert lines[0] == "[Room] " + af.START_ROOM
    assert lines[2].startswith("[Goal] put") and "you see" in lines[3]
    after = env.step(env.task.gold_actions[0])
    assert after.observation.split("\n")[0] != "[Room] " + af.START_ROOM
    for key in ("admissible_commands", "score", "won", "raw"):
        assert key in after.info
    raw = make(af_cache, obs_format="raw", **TRAIN[0])
    text = raw.reset().observation
    assert "Your task is to:" in text and "[Room]" not in text
    env.close()
    raw.close()


def test_garbage_actions_get_feedback_and_never_raise(af_cache):
    env = make(af_cache, invalid_penalty=0.25, step_penalty=0.01, **TRAIN[3])
    env.reset()
    for action in GARBAGE + [None, 3.5]:
        result = env.step(action)
        assert not result.done and result.info["invalid"]
        assert result.reward == pytest.approx(-0.26)
        assert result.observation.endswith("[Feedback] Nothing happens.")
    results = [env.step(a) for a in env.task.gold_actions]
    assert results[-1].won and results[-1].reward == pytest.approx(0.99)
    env.close()


def test_step_budget_and_argv_kept(af_cache):
    argv = list(sys.argv)
    env = make(af_cache, max_steps=3, **TRAIN[1])
    env.reset()
    results = [env.step("look") for _ in range(3)]
    assert results[-1].done and results[-1].info["truncated"] and not results[-1].won
    assert env.step("look").done
    assert sys.argv == argv
    env.close()


def test_game_file_loads_a_game_directory(af_cache):
    generated = make(af_cache, **TRAIN[5])
    game_dir = os.path.dirname(generated.game_file)
    for path in (game_dir, generated.game_file):
        env = make(None, game_file=path)
        assert env.task.gold_actions == generated.task.gold_actions
        assert env.task.complexity["task_type"] == TRAIN[5]["task_type"]
        assert env.reset().observation == generated.reset().observation
        assert [env.step(a) for a in env.task.gold_actions][-1].won
        env.close()
    generated.close()


def test_real_game_files_lists_game_dirs(af_cache, monkeypatch):
    found = af.real_game_files(af_cache)
    assert len(found) >= len(TRAIN) and all(p.endswith(af.GAME_FILE) for p in found)
    monkeypatch.setenv("ALFWORLD_DATA", af_cache)
    relative = os.path.relpath(found[0], af_cache)
    env = make(None, game_file=relative)  # relative paths are read under $ALFWORLD_DATA
    assert env.game_file == found[0]


def test_expert_plan_in_info(af_cache):
    env = make(af_cache, expert_plan=True, **TRAIN[0])
    first = env.reset()
    assert first.info["expert_plan"] and first.info["expert_plan"][0] in first.info[
        "admissible_commands"]
    env.close()


def test_bad_specs_are_spec_errors(tmp_path):
    with pytest.raises(envs.SpecError, match="recepacles"):
        envs.make({"family": "alfworld", "recepacles": 3})
    with pytest.raises(envs.SpecError, match="task_type"):
        envs.make({"family": "alfworld", "task_type": "pick_and_eat"})
    with pytest.raises(envs.SpecError, match="objects"):
        envs.make({"family": "alfworld", "objects": 13})
    with pytest.raises(envs.SpecError, match="task_type"):
        envs.make({"family": "alfworld", "game_file": "x", "task_type": "pick_and_place_simple"})
    with pytest.raises(envs.SpecError, match="not found"):
        envs.make({"family": "alfworld", "game_file": str(tmp_path / "nothing")})


def test_memoised_template_parse_gives_identical_text(af_cache, monkeypatch):
    from envs import _pddl_memo

    def transcript():
        env = make(af_cache, obs_format="raw", **TRAIN[22])
        first = env.reset()
        out = [(first.observation, first.info["admissible_commands"])]
        for action in ["look", "inventory", "help"] + env.task.gold_actions:
            result = env.step(action)
            out.append((result.observation, result.info["admissible_commands"]))
        env.close()
        return out

    monkeypatch.setenv(af.MEMO_ENV_VAR, "0")
    plain = transcript()
    assert not _pddl_memo.is_enabled()
    monkeypatch.setenv(af.MEMO_ENV_VAR, "1")
    assert transcript() == plain
    assert _pddl_memo.is_enabled()
