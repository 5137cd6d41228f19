"""TextWorld env: generated games are won by their walkthrough, splits are disjoint, the same
seed gives the same game, any action string is answered, rewards follow the density."""

from __future__ import annotations

import hashlib
import os

import pytest

pytest.importorskip("textworld")

import envs  # noqa: E402
from envs import _textplay  # noqa: E402
from envs import textworld_env as tw  # noqa: E402
from jaxrl_agents import rewards as R  # noqa: E402

# 20 small train games across complexities (rooms, objects, quest length), and eval games
# with the same indices as some of them.
SIZES = [(1, 2, 1), (1, 2, 2), (2, 3, 2), (2, 3, 3), (2, 3, 4)]
TRAIN = [{"rooms": r, "objects": o, "quest_length": q, "seed": s}
         for (r, o, q) in SIZES for s in range(4)]
EVAL = [dict(TRAIN[i], split="eval") for i in (4, 8, 12, 16)]
GARBAGE = ["", "   ", "x" * 10_000, "héllo wörld 日本語 🎉", "a\x00b\x07c\x1b[31m", "\n\n\t",
           "quit", "restart", "look. quit", "save then restore", "undo", "script"]


@pytest.fixture(scope="session")
def tw_cache(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("tw_games"))
    paths = tw.generate_games(TRAIN + EVAL, num_workers=2, cache_dir=cache)
    assert all(os.path.isfile(p) for p in paths)
    return cache


def make(cache, **spec):
    return envs.make({"family": "textworld", "cache_dir": cache, **spec})


def fingerprint(env) -> str:
    first = env.reset().observation
    env.close()
    return hashlib.sha1((first + "|".join(env.task.gold_actions)).encode()).hexdigest()


def play(env, actions):
    results = [env.step(a) for a in actions]
    return results


def test_gold_actions_win_every_generated_game(tw_cache):
    for spec in TRAIN + EVAL:
        env = make(tw_cache, **spec)
        assert env.task.optimal_steps == len(env.task.gold_actions) > 0
        assert env.task.complexity == {k: spec[k] for k in ("rooms", "objects", "quest_length")}
        env.reset()
        results = play(env, env.task.gold_actions)
        assert results[-1].won and results[-1].done, spec
        assert not any(r.done for r in results[:-1])
        assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]
        assert results[-1].info["score"] == results[-1].info["max_score"]
        env.close()


def test_name_notation_and_task_spec(tw_cache):
    env = make(tw_cache, name="w2-o3-q4", seed=1)
    assert env.task.complexity == {"rooms": 2, "objects": 3, "quest_length": 4}
    assert env.task.name == "tw-w2-o3-q4-train-1"
    assert env.task.info["split"] == "train"
    assert os.path.isfile(env.task.info["game_file"])
    assert env.max_steps == 2 * env.task.optimal_steps
    assert tw.parse_name("W4-O6-Q8") == {"rooms": 4, "objects": 6, "quest_length": 8}


def test_splits_never_share_a_game(tw_cache):
    assert _textplay.split_seed("train", _textplay.SPLIT_STRIDE - 1) < \
        _textplay.split_seed("eval", 0)
    train = {fingerprint(make(tw_cache, **s)) for s in TRAIN}
    evals = {fingerprint(make(tw_cache, **s)) for s in EVAL}
    assert len(train) == len(TRAIN) and len(evals) == len(EVAL)
    assert not train & evals


def test_same_seed_same_game(tw_cache, tmp_path):
    spec = TRAIN[5]
    fresh = make(str(tmp_path), **spec)  # generated again, in another cache
    cached = make(tw_cache, **spec)
    assert fresh.task.gold_actions == cached.task.gold_actions
    assert fresh.reset().observation == cached.reset().observation
    fresh.close()
    cached.close()


def test_template_has_four_fields_and_no_banner(tw_cache):
    env = make(tw_cache, **TRAIN[-1])
    first = env.reset()
    lines = first.observation.split("\n")
    assert [line.split(" ")[0] for line in lines] == ["[Room]", "[Items]", "[Goal]", "[Feedback]"]
    assert "$$" not in first.observation and "$$" not in first.info["raw"]
    assert lines[2] != "[Goal] " and lines[0] != "[Room] "
    step = env.step(env.task.gold_actions[0])
    assert step.observation.split("\n")[3] != "[Feedback] "
    assert ">" not in step.info["raw"]
    for key in ("admissible_commands", "score", "max_score", "won", "lost", "raw"):
        assert key in step.info
    raw = make(tw_cache, obs_format="raw", **TRAIN[-1])
    text = raw.reset().observation
    assert "[Room]" not in text and env.task.info["objective"] in text and "$$" not in text
    env.close()
    raw.close()


def test_garbage_actions_get_feedback_and_never_raise(tw_cache):
    env = make(tw_cache, max_steps=100, invalid_penalty=0.5, **TRAIN[-1])
    env.reset()
    for action in GARBAGE + [None, 12345]:
        result = env.step(action)
        assert not result.done and result.info["invalid"]
        assert result.reward == -0.5
        assert result.observation.split("\n")[3] != "[Feedback] "
    # the game still works after all of it
    results = play(env, env.task.gold_actions)
    assert results[-1].won
    env.close()


def test_dense_and_every_k_rewards_pay_progress(tw_cache):
    spec = TRAIN[-1]  # quest of 4 steps
    dense = make(tw_cache, reward_density="dense", **spec)
    dense.reset()
    rewards = [r.reward for r in play(dense, dense.task.gold_actions)]
    assert all(r >= 0 for r in rewards) and sum(rewards) == pytest.approx(1.0)
    every = make(tw_cache, reward_density="every_k", reward_k=3, **spec)
    every.reset()
    rewards_k = [r.reward for r in play(every, every.task.gold_actions)]
    paid = [i + 1 for i, r in enumerate(rewards_k) if r != 0]
    assert all(t % 3 == 0 or t == len(rewards_k) for t in paid)
    assert sum(rewards_k) == pytest.approx(1.0)
    assert rewards_k[2] == pytest.approx(sum(rewards[:3]))
    dense.close()
    every.close()


OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


def undoing(action: str, admissible: list[str]) -> str | None:
    """An admissible command that undoes `action` (go back, close, put back, ...)."""
    words = action.split()
    obj, _, holder = action.partition(" ")[2].partition(" from ")
    candidates = {
        "go": [f"go {OPPOSITE.get(words[-1], '')}"],
        "open": [f"close {action[5:]}"],
        "close": [f"open {action[6:]}"],
        "take": [f"insert {obj} into {holder}", f"put {obj} on {holder}", f"drop {obj}"],
        "unlock": [action.replace("unlock", "lock", 1)],
    }.get(words[0], [])
    return next((c for c in candidates if c in admissible), None)


def play_with_cycles(env, gold: list[str], cycles: int = 2):
    """Plays `gold`, undoing and redoing each undoable step `cycles` times right after
    it. Returns the results and how many steps were undone."""
    env.reset()
    results, undone = [], 0
    for action in gold:
        results.append(env.step(action))
        undo = None if results[-1].done else undoing(action,
                                                     results[-1].info["admissible_commands"])
        if undo is not None:
            undone += 1
            for command in [undo, action] * cycles:
                results.append(env.step(command))
                assert not results[-1].info["invalid"] and not results[-1].done, command
    return results, undone


@pytest.mark.parametrize("density", ["dense", "every_k", "sparse"])
def test_undone_and_redone_progress_is_paid_once(tw_cache, density):
    """Undoing a step and redoing it (twice, after every undoable step of the quest)
    earns nothing more than playing the quest once: in the env's shaped reward and in the
    trainer's progress component (TEXT_MIX)."""
    undone_total = 0
    for spec in TRAIN[-4:]:  # quests of 4 steps
        env = make(tw_cache, reward_density=density, reward_k=3, max_steps=200, **spec)
        env.reset()
        once = play(env, env.task.gold_actions)
        cyclic, undone = play_with_cycles(env, env.task.gold_actions)
        undone_total += undone
        assert once[-1].won and cyclic[-1].won and cyclic[-1].done
        total = sum(r.reward for r in cyclic)
        assert total <= sum(r.reward for r in once) + 1e-9
        assert total == pytest.approx(1.0)
        if density == "dense" and undone:  # undos were charged what their redos paid
            assert sum(r.reward for r in cyclic if r.reward < 0) < 0
        parts = R.reward_components([r.reward for r in cyclic], [r.info for r in cyclic])
        assert parts["progress"].sum() == pytest.approx(1.0)
        env.close()
    assert undone_total >= 4  # the games did offer steps to undo


def test_step_penalty_and_step_budget(tw_cache):
    spec = TRAIN[-1]
    env = make(tw_cache, step_penalty=0.01, **spec)
    env.reset()
    rewards = [r.reward for r in play(env, env.task.gold_actions)]
    assert rewards == pytest.approx([-0.01] * (len(rewards) - 1) + [0.99])
    short = make(tw_cache, max_steps=2, **spec)
    short.reset()
    first, second = play(short, ["look", "look"])
    assert not first.done and second.done and not second.won and second.info["truncated"]
    after = short.step("look")  # stepping a finished episode answers, never raises
    assert after.done and after.reward == 0.0
    env.close()
    short.close()


def test_bad_specs_are_spec_errors():
    with pytest.raises(envs.SpecError, match="quest_lenght"):
        envs.make({"family": "textworld", "quest_lenght": 3})
    with pytest.raises(envs.SpecError, match="w2-o3"):
        envs.make({"family": "textworld", "name": "w2-o3"})
    with pytest.raises(envs.SpecError, match="reward_density"):
        envs.make({"family": "textworld", "reward_density": "often"})
    with pytest.raises(envs.SpecError, match="split"):
        envs.make({"family": "textworld", "split": "test"})
    with pytest.raises(envs.SpecError, match="disagrees"):
        envs.make({"family": "textworld", "name": "w2-o3-q4", "rooms": 3})


def test_to_command_is_one_bounded_ascii_line():
    assert _textplay.to_command("  Take  the\nAPPLE.\x00 ") == "take the apple"
    assert len(_textplay.to_command("go " * 10_000)) <= _textplay.MAX_COMMAND_CHARS
    assert _textplay.to_command("日本語") == ""


def test_compact_format_lists_actions_and_shows_the_goal_once(tw_cache):
    env = make(tw_cache, obs_format="compact", **TRAIN[-1])
    first = env.reset()
    lines = first.observation.split("\n")
    assert [line.split(" ")[0] for line in lines] == [
        "[Room]", "[Items]", "[Goal]", "[Feedback]", "[Actions]"]
    assert ":" not in lines[0] and len(lines[2]) > len("[Goal] ")  # room name; the goal
    assert lines[3] != "[Feedback] "  # the room's description arrives as feedback
    for action in env.task.gold_actions:
        offered = first.observation.split("\n")[4][len("[Actions] "):].split(" | ")
        assert action.lower() in [a.lower() for a in offered]
        assert offered == sorted(offered)
        first = env.step(action)
        assert first.observation.split("\n")[2] == "[Goal] "  # shown on the first turn only
    assert first.won
    env.close()


def test_compact_goal_format_shows_the_goal_on_every_turn(tw_cache):
    env = make(tw_cache, obs_format="compact_goal", **TRAIN[-1])
    result = env.reset()
    goal = result.observation.split("\n")[2]
    assert len(goal) > len("[Goal] ")
    for action in env.task.gold_actions:
        result = env.step(action)
        assert result.observation.split("\n")[2] == goal
    assert result.won
    env.close()
