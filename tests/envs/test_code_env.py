"""The coding env: generated tasks, gold wins, real pass shares, commands, loading."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import envs
from envs import sandbox
from envs.code_env import USAGE, parse_pytest_summary, pytest_argv
from envs.code_tasks import SPLITS, TASK_FAMILIES, apply_patch, generate_task

SEEDS = range(4)


def make(**spec):
    return envs.make({"family": "code", **spec})


def play(env, actions):
    result = env.reset()
    for action in actions:
        result = env.step(action)
    return result


def test_there_are_five_families_over_several_libraries():
    assert len(TASK_FAMILIES) >= 5
    libraries = {generate_task(f, s)["library"] for f in TASK_FAMILIES for s in range(8)}
    assert len(libraries) >= 4


@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_gold_actions_win(family):
    for seed in SEEDS:  # 5 families x 4 seeds = 20 tasks
        env = make(task_family=family, seed=seed)
        result = play(env, env.task.gold_actions)
        assert result.done and result.won and result.reward == 1.0, (env.task.name,
                                                                      result.observation)
        assert all(result.info["tests"].values()) and not result.info["tampered"]
        env.close()


def test_same_seed_same_task_and_splits_disjoint():
    assert generate_task("off_by_one", 3) == generate_task("off_by_one", 3)
    assert generate_task("off_by_one", 3) != generate_task("off_by_one", 4)
    configs = {split: set() for split in SPLITS}
    for family in TASK_FAMILIES:
        for seed in range(15):
            for split in SPLITS:
                task = generate_task(family, seed, split)
                assert task["split"] == split
                configs[split].add(json.dumps([task["library"], task["module"],
                                               task["config"]], sort_keys=True))
    assert configs["train"] and configs["eval"]
    assert not configs["train"] & configs["eval"]


def test_gold_patch_and_gold_edits_agree():
    for family in TASK_FAMILIES:
        for seed in range(6):
            task = generate_task(family, seed)
            env = make(task_family=family, seed=seed)
            play(env, env.task.gold_actions[:-1])
            assert env.files == apply_patch(task["files"], task["patch"])
            assert task["FAIL_TO_PASS"] and task["PASS_TO_PASS"]
            env.close()


def test_submitting_at_once_fails_the_fail_to_pass_tests():
    env = make(task_family="wrong_default", seed=1)
    result = play(env, ["submit"])
    tests = result.info["tests"]
    assert result.done and not result.won and result.reward < 1.0
    assert not any(tests[t] for t in env.task.info["FAIL_TO_PASS"])
    assert all(tests[t] for t in env.task.info["PASS_TO_PASS"])
    assert result.reward == pytest.approx(sum(tests.values()) / len(tests))
    binary = make(task_family="wrong_default", seed=1, reward="binary")
    assert play(binary, ["submit"]).reward == 0.0


def _junit_share(files, tests, tmp_path):
    """The pass share measured independently: plain pytest + its junit XML report."""
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--junitxml=report.xml"], cwd=tmp_path, capture_output=True, timeout=120)
    passed = set()
    for case in ET.parse(tmp_path / "report.xml").iter("testcase"):
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            passed.add(f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}")
    return sum(t in passed for t in tests) / len(tests)


def test_reward_is_the_real_pass_share_when_partly_fixed(tmp_path):
    env = make(task_family="wrong_operator", seed=0)
    env.reset()
    for action in env.task.gold_actions[:-1]:
        env.step(action)
    module = env.instance["module"] + ".py"
    lines = env.files[module].splitlines()
    # break one other function: its tests now fail, the rest pass
    first_def = next(i for i, line in enumerate(lines, 1) if line.startswith("def "))
    env.step(f"edit {module} {first_def + 1}-{first_def}\n    raise RuntimeError('broken')")
    files = dict(env.files)
    result = env.step("submit")
    expected = _junit_share(files, env.tests, tmp_path)
    assert 0.0 < expected < 1.0
    assert result.reward == pytest.approx(expected) and not result.won


def test_run_tests_reports_without_reward_and_episode_goes_on():
    env = make(task_family="off_by_one", seed=2)
    env.reset()
    result = env.step("run_tests")
    assert result.reward == 0.0 and not result.done
    assert "task tests pass" in result.observation and "FAIL" in result.observation


@pytest.mark.parametrize("action", [
    "view", "view a b c", "edit", "edit README.md", "edit README.md x-y\nfoo",
    "edit README.md 9-2\nfoo", "edit README.md 1-999\nfoo", "search", "run_tests now",
    "submit please", "frobnicate the code", "view README.md 5-x",
])
def test_malformed_commands_get_usage(action):
    env = make(task_family="off_by_one", seed=0, invalid_penalty=0.1)
    env.reset()
    result = env.step(action)
    assert result.info["invalid"] and not result.done
    assert result.reward == pytest.approx(-0.1)
    feedback = result.observation.split("[Feedback]", 1)[1]
    assert "Commands" in feedback or "START-END" in feedback


@pytest.mark.parametrize("action", ["view ../../etc/passwd", "view /etc/passwd",
                                    "edit ../outside.py 1-1\nx", "view tests/../../x"])
def test_paths_leaving_the_repo_are_refused(action):
    env = make(task_family="off_by_one", seed=0)
    env.reset()
    result = env.step(action)
    assert result.info["invalid"] and "outside the repository" in result.observation


@pytest.mark.parametrize("action", ["", " ", "\n\n", "x" * 10_000, "ünïcödé 🐍 编辑 view",
                                    "\x00\x01\x02\x1b[31mred\x7f", "view \x00README.md",
                                    "edit README.md 1-1\n" + "🐍" * 9000, None, 42])
def test_garbage_actions_never_raise(action):
    env = make(task_family="broken_parsing", seed=0, max_steps=5)
    env.reset()
    result = env.step(action)
    assert isinstance(result.observation, str) and "[Feedback]" in result.observation
    assert not result.done


def test_view_search_edit_and_read_only_tests():
    env = make(task_family="missing_edge_case", seed=0)
    env.reset()
    module = env.instance["module"] + ".py"
    test_file = env.instance["test_files"][0]
    assert "1|" in env.step(f"view {module} 1-3").observation
    assert env.step(f"view {module} 900-910").info["invalid"]
    assert "[Room] repository" in env.step(f"view {module}").observation
    assert "tests/" in env.step("view tests").observation
    assert f"{module}:" in env.step("search def ").observation
    assert "read-only" in env.step(f"edit {test_file} 1-1\n").observation
    n = len(env.files[module].splitlines())
    env.step(f"edit {module} 1-0\n# inserted\n# twice")  # insertion before line 1
    assert env.files[module].splitlines()[:2] == ["# inserted", "# twice"]
    env.step(f"edit {module} 1-2")  # no body: delete
    assert len(env.files[module].splitlines()) == n
    env.step(f"edit {module} 1-1\n```python\n# fenced\n```")
    assert env.files[module].splitlines()[0] == "# fenced"


def test_max_steps_ends_and_grades_the_episode():
    env = make(task_family="off_by_one", seed=1, max_steps=2)
    env.reset()
    assert not env.step("view README.md").done
    result = env.step("view README.md")
    assert result.done and result.info["truncated"] and 0.0 < result.reward < 1.0
    assert env.step("submit").done  # after the end: feedback, no crash


def test_escapes_through_the_repo_code_fail_safely(tmp_path):
    """The model's code deletes the tests, writes outside and exits early: the tests come
    back for grading, nothing leaks out, and missing results count as failing."""
    env = make(task_family="off_by_one", seed=0)
    env.reset()
    module = env.instance["module"] + ".py"
    outside = tmp_path / "escape_x"
    blocked = sandbox.isolation_mode() == "full"  # the weaker modes do not block writes
    payload = ("import glob as _g, os as _os\n"
               "for _p in _g.glob('tests/*.py'):\n    _os.remove(_p)\n"
               f"try:\n    open({str(outside)!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
               "_os._exit(0)")
    env.step(f"edit {module} 1-0\n{payload}")
    result = env.step("run_tests")
    assert not result.done and not (blocked and outside.exists())
    assert result.observation.count("FAIL ") == len(env.tests)
    result = env.step("submit")
    assert result.done and result.reward == 0.0 and not (blocked and outside.exists())
    # a deletion never outlives its run: drop the payload, fix the bug, and every test is back
    env.reset()
    env.step(f"edit {module} 1-0\n{payload}")
    assert env.step("run_tests").observation.count("FAIL ") == len(env.tests)
    env.step(f"edit {module} 1-{len(payload.splitlines())}")
    assert env.files == env.instance["files"]
    result = play_from_here(env, env.task.gold_actions)
    assert result.won and result.reward == 1.0 and not (blocked and outside.exists())


def play_from_here(env, actions):
    for action in actions:
        result = env.step(action)
    return result


def _instance_dict(task):
    keep = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
            "test_cmd")
    inst = {k: task[k] for k in keep}
    inst["FAIL_TO_PASS"] = json.dumps(task["FAIL_TO_PASS"])  # SWE-bench stores JSON strings
    inst["PASS_TO_PASS"] = json.dumps(task["PASS_TO_PASS"])
    return inst


def test_instance_loads_from_a_json_file(tmp_path):
    task = generate_task("wrong_operator", 5)
    path = tmp_path / "instance.json"
    path.write_text(json.dumps({**_instance_dict(task), "files": task["files"]}))
    env = make(instance=str(path))
    assert env.task.name == task["instance_id"]
    assert env.task.gold_actions[-1] == "submit"
    result = play(env, env.task.gold_actions)
    assert result.won and result.reward == 1.0


def test_instance_loads_from_a_directory_with_a_test_patch(tmp_path):
    task = generate_task("broken_parsing", 2)
    test_path = task["test_files"][0]
    repo_files = {k: v for k, v in task["files"].items() if k != test_path}
    for rel, text in repo_files.items():
        (tmp_path / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "repo" / rel).write_text(text)
    from envs.code_tasks import make_patch

    inst = _instance_dict(task)
    inst["test_patch"] = make_patch({}, {test_path: task["files"][test_path]})
    (tmp_path / "instance.json").write_text(json.dumps(inst))
    env = make(instance=str(tmp_path))
    assert test_path in env.protected and env.instance["files"] == task["files"]
    assert not play(env, ["submit"]).won
    assert play(env, env.task.gold_actions).won


def test_bad_specs_are_clear_errors():
    with pytest.raises(envs.SpecError, match="task_family"):
        make(task_family="nope")
    with pytest.raises(envs.SpecError, match="unknown key"):
        make(task_family="off_by_one", colour="red")
    with pytest.raises(envs.SpecError, match="reward"):
        make(task_family="off_by_one", reward="dense")
    with pytest.raises(envs.SpecError, match="instance"):
        make(instance={"instance_id": "x"})
    with pytest.raises(envs.SpecError, match="max_steps"):
        make(task_family="off_by_one", max_steps="many")
    with pytest.raises(envs.SpecError, match="split"):
        make(task_family="off_by_one", split="test")


def test_summary_parser_reads_only_the_first_summary():
    out = ("....\n===== short test summary info =====\nPASSED t.py::a\n"
           "FAILED t.py::b - AssertionError: x - y\nSKIPPED [1] t.py:3: why\n"
           "XFAIL t.py::c\n===== 2 passed, 1 failed =====\n"
           "===== short test summary info =====\nPASSED t.py::b\n")
    assert parse_pytest_summary(out) == {"t.py::a": "PASSED", "t.py::b": "FAILED",
                                         "t.py::c": "XFAIL"}
    assert parse_pytest_summary("no summary at all") == {}


def test_pytest_argv_adds_the_report_flags():
    argv = pytest_argv("pytest -x tests/test_a.py")
    assert argv[:3] == [sys.executable, "-m", "pytest"] and "-rA" in argv
    assert "no:cacheprovider" in argv and argv[-1] == "tests/test_a.py"
    with pytest.raises(envs.SpecError):
        pytest_argv("make test")


def test_observation_uses_the_state_template():
    env = make(task_family="wrong_default", seed=0)
    obs = env.reset().observation
    lines = obs.split("\n")
    assert lines[0].startswith("[Room] repository ")
    assert lines[1].startswith("[Items] ") and "tests/" in lines[1]
    assert lines[2] == "[Goal] " + env.instance["problem_statement"]
    assert lines[3].startswith("[Feedback] ")
    raw = make(task_family="wrong_default", seed=0, obs_format="raw").reset().observation
    assert "[Room]" not in raw and env.instance["problem_statement"] in raw
    assert USAGE.splitlines()[0] in obs


def test_an_object_equal_to_everything_does_not_pass():
    env = make(task_family="wrong_operator", seed=3)
    env.reset()
    module = env.instance["module"] + ".py"
    n = len(env.files[module].splitlines())
    hack = ("class _Equal:\n    def __eq__(self, other):\n        return True\n\n\n"
            "def __getattr__(name):\n    return lambda *args, **kwargs: _Equal()")
    result = play_from_here(env, [f"edit {module} 1-{n}\n{hack}", "submit"])
    assert result.done and result.reward == 0.0
