"""failures: held-out games sorted by how they ended, read from eval_episodes files."""

import json
import types

import pytest

from jaxrl_agents import failures as F
from jaxrl_agents.data import dump
from jaxrl_agents.rollout.episode import EpisodeRecord


def _game(task_id, actions, *, won=False, truncated=True, failed=False, invalid=None,
          rewards=None):
    """A Trajectory of `actions` as the episode driver records it, one turn per action."""
    record = EpisodeRecord()
    invalid = invalid or [False] * len(actions)
    rewards = rewards or [0.0] * len(actions)
    for action, refused, reward in zip(actions, invalid, rewards, strict=True):
        record.admissible.append(["c0", "c1"])
        record.add_prompt([1, 2])
        record.add_action([3], action)
        record.add_reward(reward, {"invalid": refused})
    return record.to_trajectory(won=won, truncated=truncated, failed=failed, task_id=task_id)


def _summaries(tmp_path, name, trajs):
    """The lines an evaluation writes for `trajs`, read back as the reading reads them."""
    path = str(tmp_path / "run" / "eval_episodes" / f"{name}.jsonl")
    dump.write_summaries(path, trajs, stage=name, step=None)
    return F.read_episodes(path)


GAMES = [  # one game of each cause, in CAUSES order, plus a second loop
    _game("g0", ["take key", "unlock box"], won=True, truncated=False, rewards=[0.5, 0.5]),
    _game("g1", ["look", "look"], failed=True),
    _game("g2", ["dance", "take key"], invalid=[True, False], rewards=[0.0, 0.25]),
    _game("g3", ["eat key"], truncated=False),
    # back and forth: the take is repeated two turns after its first time
    _game("g4", ["take shirt from safe", "insert shirt into safe", "Take  shirt from safe",
                 "insert shirt into safe"], rewards=[0.25, 0.0, 0.0, 0.0]),
    _game("g5", ["go east", "go east"]),
    _game("g6", ["go east", "go west", "take key"], rewards=[0.0, 0.0, 0.5]),
]


def test_each_game_gets_the_first_cause_that_applies(tmp_path):
    eps = _summaries(tmp_path, "rl", GAMES)
    assert [F.cause(e) for e in eps] == ["won", "env failure", "invalid action", "lost",
                                         "loop", "loop", "out of steps"]
    # A refused action explains a loss before the step budget does, and a crash before both.
    assert F.cause({"won": False, "failed": True, "invalid": [True], "truncated": True}) \
        == "env failure"


def test_first_repeat_gives_the_turn_and_the_period():
    assert F.first_repeat(["a", "b", "A ", "b"]) == (2, 2)  # compared as the monitor does
    assert F.first_repeat(["a", "a"]) == (1, 1)
    assert F.first_repeat(["a", "b", "c"]) is None
    assert F.first_repeat([]) is None


def test_reading_counts_causes_loops_and_how_far_lost_games_got(tmp_path):
    r = F.reading(_summaries(tmp_path, "rl", GAMES))
    assert r["games"] == 7
    assert r["causes"] == {"won": 1, "env failure": 1, "invalid action": 1, "lost": 1,
                           "loop": 2, "out of steps": 1}
    assert r["loop_period"] == {1: 1, 2: 1}
    assert r["loop_verb"] == {"take": 1, "go": 1}
    assert r["lost_return"] == {0.0: 3, 0.25: 2, 0.5: 1}  # the six games not won
    assert r["mean_lost_return"] == pytest.approx(1.0 / 6.0)
    # 16 actions; repeats: look (g1), take + insert (g4), go east (g5)
    assert r["repeat_rate"] == pytest.approx(4 / 16)
    assert r["invalid_rate"] == pytest.approx(1 / 16)
    assert r["mean_steps"] == pytest.approx(16 / 7)
    text = F.format_reading(r, "rl")
    assert text.splitlines()[0] == ("rl: 7 games: won 1, env failure 1, invalid action 1, "
                                    "lost 1, loop 2, out of steps 1")
    assert "1: 1, 2: 1" in text and "take 1, go 1" in text and "(mean 0.17)" in text


def test_transitions_match_games_by_task_id(tmp_path):
    before = _summaries(tmp_path, "sft", GAMES[:5])
    after = _summaries(tmp_path, "rl", [
        _game("g4", ["take shirt from safe", "drop shirt"], won=True, truncated=False),
        _game("g3", ["take key"], won=True, truncated=False),
        _game("g0", ["go east", "go east"]),
        _game("g1", ["look"], failed=True),
        _game("g9", ["look"]),  # not played before: left out
    ])
    t = F.transitions(before, after)
    assert t == {"changed": {("loop", "won"): 1, ("lost", "won"): 1, ("won", "loop"): 1},
                 "same": 1}
    assert F.format_transitions(t, "sft", "rl") == (
        "sft -> rl: loop -> won: 1; lost -> won: 1; won -> loop: 1 (1 games ended the same way)")
    assert "every one of 2 games" in F.format_transitions({"changed": {}, "same": 2}, "a", "b")


def test_unreadable_files_name_the_path_and_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="no evaluation episodes at .*rl.jsonl"):
        F.read_stage(str(tmp_path), "rl")
    bad = tmp_path / "eval_episodes" / "rl.jsonl"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"task_id": "a", "won": True}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"rl.jsonl:2 is not a JSON line"):
        F.read_stage(str(tmp_path), "rl")
    assert F.stage_path("r", "rl", 5).endswith("eval_episodes/rl-update5.jsonl")


def test_jaxrl_eval_read_prints_stages_and_changes_without_playing(tmp_path, capsys):
    from jaxrl_agents.cli import _print_readings

    _summaries(tmp_path, "sft", GAMES[:5])
    _summaries(tmp_path, "rl", [_game("g4", ["drop shirt"], won=True, truncated=False)])
    cfg = types.SimpleNamespace(output_dir=str(tmp_path), name="run")
    assert _print_readings(cfg, ["sft", "rl"]) == 0
    out = capsys.readouterr().out
    assert "sft: 5 games: won 1, env failure 1, invalid action 1, lost 1, loop 1" in out
    assert "rl: 1 games: won 1" in out
    assert "sft -> rl: loop -> won: 1 (0 games ended the same way)" in out
    assert _print_readings(cfg, ["base"]) == 2
    assert "no evaluation episodes at" in capsys.readouterr().err
    assert _print_readings(cfg, ["a", "b", "c"]) == 2


def test_run_summary_says_how_each_stages_games_ended(tmp_path):
    from jaxrl_agents.trainer.summary import format_summary

    _summaries(tmp_path, "rl", GAMES[:5])
    run_dir = str(tmp_path / "run")
    result = {"mean": 0.2, "ci_low": 0.0, "ci_high": 0.6, "n": 5}
    lines = format_summary({"sft": result, "rl": result, "run_dir": run_dir}).splitlines()
    at = lines.index("held-out success after RL: 0.200 (95% CI 0.000-0.600, 5 games)")
    assert lines[at + 1] == ("  games ended: won 1, env failure 1, invalid action 1, lost 1, "
                             f"loop 1 (jaxrl-eval --run {run_dir} --read rl)")
    assert not any("games ended" in line for line in lines[:at])  # no sft.jsonl: no line


def test_jaxrl_eval_read_from_a_run_directory_imports_no_jax(tmp_path):
    """`jaxrl-eval --run DIR --read STAGE` reads config.json and the episodes file only."""
    import os
    import subprocess
    import sys

    _summaries(tmp_path, "sft", GAMES[:5])
    (tmp_path / "run" / "config.json").write_text(json.dumps({"name": "run", "seed": 3}))
    code = ("import sys; from jaxrl_agents.cli import eval_main; "
            f"rc = eval_main(['--run', {str(tmp_path / 'run')!r}, '--read', 'sft']); "
            "print('jax imported:', 'jax' in sys.modules); sys.exit(rc)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root)
    assert done.returncode == 0, done.stderr
    assert "sft: 5 games: won 1" in done.stdout
    assert "jax imported: False" in done.stdout
