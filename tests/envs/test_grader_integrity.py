"""Tampering with the coding env's grader, tried as an agent would (docs/threat_model.md).

Every attempt puts code into the library module (the only thing an agent can change that
the tests run) of one task whose unfixed code earns 0.8 (8 of 10 tests pass), then
submits. Each must earn no more than the unfixed code; where it tampers with the run,
the run is flagged (`info["tampered"]`) and earns 0.
"""

from __future__ import annotations

import json
import os

import pytest

import envs
from envs import grader, sandbox
from envs.code_tasks import TASK_FAMILIES, generate_task

FAMILY, SEED = "off_by_one", 0
TASK = generate_task(FAMILY, SEED)
MODULE = TASK["module"]
NODES = TASK["FAIL_TO_PASS"] + TASK["PASS_TO_PASS"]
MODE = sandbox.isolation_mode()

# The runner patch of several attempts: every report pytest makes says "passed".
REPORTS_PASS = """
import _pytest.reports as _reports

_make = _reports.TestReport.from_item_and_call.__func__


def _passed(cls, item, call):
    report = _make(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report


_reports.TestReport.from_item_and_call = classmethod(_passed)
"""

# Lets the code print to the real stdout while pytest captures output.
UNCAPTURE = """
import gc as _gc
import os as _os
import sys as _sys

from _pytest.config import Config as _Config

_config = next(o for o in _gc.get_objects() if isinstance(o, _Config))
_config.pluginmanager.getplugin("capturemanager").suspend_global_capture(in_=True)
"""

FAKE_SUMMARY = UNCAPTURE + f"""
print("=" * 30 + " short test summary info " + "=" * 30)
for _node in {NODES!r}:
    print("PASSED", _node)
print("=" * 30 + " {len(NODES)} passed in 0.01s " + "=" * 30, flush=True)
_os._exit(0)
"""

HELPER_PATCH = """
import sys as _sys
import threading as _threading
import time as _time


def _neuter_check():
    for _ in range(5000):
        for _module in list(_sys.modules.values()):
            if getattr(_module, "__name__", "").startswith("test_") and hasattr(_module, "check"):
                _module.check = lambda got, want: None
                return
        _time.sleep(0.001)


_threading.Thread(target=_neuter_check, daemon=True).start()
"""

CONFTEST_REEXEC = UNCAPTURE + """
if not _os.environ.get("ATTACK_DONE"):
    with open("conftest.py", "w") as _f:
        _f.write('''
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome, report.longrepr = "passed", None
''')
    _os.environ["ATTACK_DONE"] = "1"
    _os.execv(_sys.executable, [_sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider",
                                "tests"])
"""

STARTUP_HOOKS = UNCAPTURE + f"""
import site as _site

_hook = {REPORTS_PASS!r}
if not _os.environ.get("ATTACK_DONE"):
    for _dir in [".", _site.getusersitepackages(), *_sys.path]:
        for _name, _text in (("sitecustomize.py", _hook), ("usercustomize.py", _hook),
                             ("zz_attack.pth", "import sitecustomize\\n")):
            try:
                _os.makedirs(_dir or ".", exist_ok=True)
                with open(_os.path.join(_dir or ".", _name), "w") as _f:
                    _f.write(_text)
            except OSError:
                pass
    _env = dict(_os.environ, ATTACK_DONE="1", PYTHONPATH=_os.getcwd())
    _env.pop("PYTHONNOUSERSITE", None)
    _argv = [a for a in _sys.argv[1:] if not a.startswith("_jaxrl")]
    _os.execve(_sys.executable, [_sys.executable, "-m", "pytest", *_argv], _env)
"""

# The module is replaced by one whose every function reads the expected value off its
# caller's source line (`check(call, expected)`) or raises what `pytest.raises` waits for.
STACK_READER = """
import ast as _ast
import builtins as _builtins
import inspect as _inspect
import linecache as _linecache


def _expected(frame):
    line = _linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    if line.startswith("check("):
        return _ast.literal_eval(_ast.parse(line).body[0].value.args[1])
    above = _linecache.getline(frame.f_code.co_filename, frame.f_lineno - 1).strip()
    if above.startswith("with pytest.raises("):
        raise getattr(_builtins, above[len("with pytest.raises("):-2])("as expected")
    return None


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return lambda *args, **kwargs: _expected(_inspect.currentframe().f_back)
"""

EXIT_EARLY = "import os\nos._exit(0)"

EXIT_STATUS = REPORTS_PASS + """
import atexit as _atexit
import os as _os

_atexit.register(lambda: _os._exit(0))
"""

# Forges pass verdicts for the tests it knows (their ids are in the task's test file) and
# leaves every other test, canaries included, alone.
KNOWN_ONLY = f"""
import _pytest.reports as _reports

_make = _reports.TestReport.from_item_and_call.__func__
_KNOWN = set({NODES!r})


def _passed_if_known(cls, item, call):
    report = _make(cls, item, call)
    if item.nodeid in _KNOWN:
        report.outcome, report.longrepr = "passed", None
    return report


_reports.TestReport.from_item_and_call = classmethod(_passed_if_known)
"""

# Finds the grader's recorder in memory and rewrites the outcomes of the tests it knows as
# they are recorded: nothing of pytest is replaced, the canaries run honestly, and the
# printed summary and exit status stay pytest's own.
RECORDER_FORGER = f"""
import gc as _gc

_KNOWN = set({NODES!r})


class _Forged(dict):
    def __setitem__(self, node, outcome):
        super().__setitem__(node, "PASSED" if node in _KNOWN else outcome)


for _obj in _gc.get_objects():
    if type(_obj).__name__ == "_Recorder" and isinstance(getattr(_obj, "outcomes", None), dict):
        _obj.outcomes = _Forged()
"""

# Writes the out-of-process checks' results itself, with the right answers (an agent can
# read them in the visible tests), when imported outside pytest; under pytest it is the
# unfixed code.
ANSWERS = {i: TASK["cases"][node] for i, node in enumerate(NODES)}
ORACLE_FORGER = f"""
import json as _json
import os as _os
import sys as _sys

if "_pytest" not in _sys.modules:
    _setup = _json.load(open(_sys.argv[1]))
    _answers = {ANSWERS!r}
    with open(_setup["results"], "w") as _f:
        for _case in _setup["cases"]:
            _want = _answers[_case["id"]]
            _record = ({{"returns": _want["returns"]}} if "returns" in _want
                       else {{"raises": [_want["raises"], "Exception", "BaseException"]}})
            _f.write(_json.dumps({{"tag": _setup["tag"], "id": _case["id"], **_record}}) + "\\n")
        _f.write(_json.dumps({{"tag": _setup["tag"], "end": len(_setup["cases"])}}) + "\\n")
    _os._exit(0)
"""

SLEEP = "import time\ntime.sleep(60)"

# Signals to whatever it can reach: the parent of pytest, every process it may signal,
# its own process group, and the process that runs this test file (in the modes whose uid
# drop keeps it out of reach; if it got through, this test process would die).
KILLER = f"""
import os as _os
import signal as _signal

for _target in (_os.getppid(), -1, 0, 1, {os.getpid() if MODE in ("full", "uid") else -1}):
    try:
        _os.kill(_target, _signal.SIGKILL)
    except OSError:
        pass
"""

# name: (payload, replaces the whole module, flagged, extra spec keys)
ATTEMPTS = {
    "runner patched at import": (REPORTS_PASS, False, True, {}),
    "test helper patched from a thread": (HELPER_PATCH, False, True, {}),
    "fake summary, then exit 0": (FAKE_SUMMARY, False, True, {}),
    "exit 0 at import": (EXIT_EARLY, False, True, {}),
    "exit status forced to 0 at exit": (EXIT_STATUS, False, True, {}),
    "conftest.py written, pytest re-run": (CONFTEST_REEXEC, False, True, {}),
    "start-up hooks written, pytest re-run": (STARTUP_HOOKS, False, True, {}),
    "expected values read off the caller": (STACK_READER, True, True, {}),
    "verdicts forged for known tests only": (KNOWN_ONLY, False, True, {}),
    "grader's recorder rewritten in memory": (RECORDER_FORGER, False, True, {}),
    "out-of-process results forged": (ORACLE_FORGER, False, True, {}),
    "sleep past the timeout": (SLEEP, False, False, {"timeout_s": 3}),
    "signals to everything reachable": (KILLER, False, False, {}),
}


def make(**spec):
    return envs.make({"family": "code", "task_family": FAMILY, "seed": SEED, "lint": False,
                      **spec})


def submit_with(payload: str, replace: bool = False, env=None, **spec):
    """Puts `payload` at the top of the library module (or in its place), then submits."""
    env = env or make(**spec)
    env.reset()
    module = MODULE + ".py"
    span = f"1-{len(env.files[module].splitlines())}" if replace else "1-0"
    assert not env.step(f"edit {module} {span}\n{payload}").info["invalid"]
    result = env.step("submit")
    env.close()
    return result


@pytest.fixture(scope="module")
def unfixed_reward():
    env = make()
    env.reset()
    result = env.step("submit")
    env.close()
    assert not result.info["tampered"] and 0 < result.reward < 1
    return result.reward


@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_tampering_earns_no_more_than_the_unfixed_code(name, unfixed_reward):
    payload, replace, flagged, spec = ATTEMPTS[name]
    result = submit_with(payload, replace, **spec)
    reasons = result.info.get("tamper_reasons")
    assert result.done and not result.won
    assert result.reward <= unfixed_reward, (name, reasons, result.observation[-1500:])
    assert result.info["tampered"] is flagged, (name, reasons, result.observation[-1500:])
    if flagged:
        assert result.reward == 0.0 and result.info["pass_share"] == 0.0
        assert "tampered" in result.observation


def test_runner_config_files_are_read_only():
    env = make()
    env.reset()
    result = env.step("edit pytest.ini 1-2\n[pytest]\naddopts = -p " + MODULE)
    assert result.info["invalid"] and "read-only" in result.observation
    env.close()


def _without_cases(**extra_files):
    """The same task as an instance without `cases`: pytest's records alone decide."""
    inst = {k: v for k, v in TASK.items() if k not in ("cases", "test_files")}
    inst["files"] = {**TASK["files"], **extra_files}
    return inst


def test_config_files_of_an_instance_are_read_only_and_laid_over():
    files = {"setup.cfg": "[metadata]\nname = cart\n", "pyproject.toml": "[project]\n"}
    env = envs.make({"family": "code", "instance": _without_cases(**files), "lint": False})
    env.reset()
    for path in files:
        result = env.step(f"edit {path} 1-1\n[tool:pytest]\naddopts = -p {MODULE}")
        assert result.info["invalid"] and "read-only" in result.observation
    assert {"setup.cfg", "pyproject.toml", "pytest.ini"} <= env.protected
    env.close()


PYTEST_ONLY_OPEN = ("grader's recorder rewritten in memory", "out-of-process results forged")


@pytest.mark.parametrize("name", [n for n, a in ATTEMPTS.items()
                                  if a[2] and n not in PYTEST_ONLY_OPEN])
def test_instances_without_cases_flag_the_generic_attempts(name):
    payload, replace, _, spec = ATTEMPTS[name]
    env = envs.make({"family": "code", "instance": _without_cases(), "lint": False, **spec})
    result = submit_with(payload, replace, env=env)
    assert result.info["tampered"] and result.reward == 0.0, result.info.get("tamper_reasons")


@pytest.mark.parametrize(("test_cmd", "passing"), [
    (f"pytest -q {NODES[0]} {NODES[-1]} {NODES[1]}", 1),  # two failing tests, one passing
    ("pytest -q -k line_total tests", 2),
])
def test_test_commands_that_select_tests_keep_honest_runs_unflagged(test_cmd, passing):
    """Node ids in the command: the canaries are named on the command line too; a keyword
    selection (which could drop them): graded without canaries."""
    inst = {**_without_cases(), "test_cmd": test_cmd}
    env = envs.make({"family": "code", "instance": inst, "lint": False})
    env.reset()
    honest = env.step("submit")
    assert not honest.info["tampered"] and honest.info["passed"] == passing, honest.info
    assert honest.reward == pytest.approx(passing / len(NODES))  # unselected tests fail
    attacked = submit_with(REPORTS_PASS, env=env)
    assert attacked.info["tampered"] and attacked.reward == 0.0
    env.close()


def test_instances_without_cases_stay_open_to_a_targeted_forger():
    """The known limit of pytest-only grading (docs/threat_model.md, "What remains
    possible"): code that rewrites the grader's records in memory for the tests it knows is
    paid. If this starts failing, the limit was closed: update the document."""
    env = envs.make({"family": "code", "instance": _without_cases(), "lint": False})
    result = submit_with(RECORDER_FORGER, env=env)
    assert result.reward == 1.0 and not result.info["tampered"]


@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_honest_runs_are_never_flagged(family):
    """Unfixed, fixed and half-broken code of every family: no flag, and the two verdicts
    (pytest's records, the out-of-process checks) agree."""
    env = envs.make({"family": "code", "task_family": family, "seed": 1, "lint": False})
    env.reset()
    unfixed = env.step("submit")
    assert not unfixed.info["tampered"] and unfixed.reward < 1.0, unfixed.info
    env.reset()
    for action in env.task.gold_actions:
        fixed = env.step(action)
    assert fixed.won and fixed.reward == 1.0 and not fixed.info["tampered"]
    env.reset()
    module = env.instance["module"] + ".py"
    env.step(f"edit {module} 1-0\nimport sys\nprint('chatty', file=sys.stderr)\nraise ValueError")
    broken = env.step("submit")
    assert not broken.info["tampered"] and broken.reward == 0.0
    env.close()


# ------------------------------------------------------------------ grader pieces
def test_records_that_are_not_the_graders_are_problems():
    nonce = "n" * 32
    line = lambda **r: json.dumps({"nonce": nonce, **r})
    good = [line(kind="collected", nodes=["t.py::a"], errors=[]),
            line(kind="outcome", node="t.py::a", outcome="PASSED"),
            line(kind="integrity", patched=[], foreign=[]), line(kind="end", exitstatus=0)]
    records = grader.PytestRecords.parse("\n".join(good).encode(), nonce)
    assert records.ended and records.passed("t.py::a") and not records.problems
    for extra in ("hello", line(kind="outcome", node="t.py::a", outcome="PASSED"),
                  json.dumps({"nonce": "x", "kind": "end"}), line(kind="end", exitstatus=0),
                  line(kind="outcome", node="t.py::b", outcome="PASSED")):
        assert grader.PytestRecords.parse("\n".join([*good[:3], extra, good[3]]).encode(),
                                          nonce).problems, extra


def test_out_of_process_results_are_compared_by_the_parent():
    case = {"module": "m", "call": "f", "args": "(1,)", "returns": "(1, [2.5, 'x'])"}
    assert grader.case_passes(case, {"returns": "(1, [2.5, 'x'])"})
    for got in ("[1, [2.5, 'x']]", "(1, [2.5, 'y'])", "{1, 2}", "b'x'", "nan", "(" * 500,
                None, 7):
        assert not grader.case_passes(case, {"returns": got}), got
    raises = {"module": "m", "call": "f", "args": "()", "raises": "LookupError"}
    assert grader.case_passes(raises, {"raises": ["KeyError", "LookupError", "Exception"]})
    assert not grader.case_passes(raises, {"raises": ["ValueError"]})
    assert not grader.case_passes(raises, {"returns": "None"})
    tag, nodes = "t" * 32, ["a", "b"]
    cases = {"a": case, "b": raises}
    lines = [json.dumps({"tag": tag, "id": 0, "returns": "(1, [2.5, 'x'])"}),
             json.dumps({"tag": tag, "id": 1, "raises": ["LookupError"]}),
             json.dumps({"tag": tag, "end": 2})]
    run = grader.parse_oracle("\n".join(lines).encode(), tag, nodes, cases, 0)
    assert run.passed == {"a": True, "b": True} and run.ended and not run.problems
    assert grader.parse_oracle("\n".join(lines[:2]).encode(), tag, nodes, cases, 0).problems
    assert grader.parse_oracle("\n".join([lines[0], *lines]).encode(), tag, nodes, cases,
                               0).problems
    timed_out = grader.parse_oracle(lines[0].encode(), tag, nodes, cases, None)
    assert timed_out.passed == {"a": True, "b": False} and not timed_out.problems


def test_results_files_are_read_without_following_links_or_blocking(tmp_path):
    (tmp_path / "real").write_text("data")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    assert grader.read_private_file(str(tmp_path / "real")) == b"data"
    assert grader.read_private_file(str(tmp_path / "link")) == b""
    assert grader.read_private_file(str(tmp_path / "fifo")) == b""
    assert grader.read_private_file(str(tmp_path / "missing")) == b""


def test_run_traces_name_changed_and_created_runner_files(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("changed")
    (tmp_path / "tests" / "conftest.py").write_text("")
    (tmp_path / "x.pth").write_text("")
    (tmp_path / "lib.py").write_text("")
    found = grader.run_traces(str(tmp_path), {"tests/test_a.py": "pristine",
                                              "pytest.ini": "[pytest]\n"})
    assert sorted(found) == ["pytest.ini was changed or removed during the run",
                             "tests/conftest.py was created during the run",
                             "tests/test_a.py was changed or removed during the run",
                             "x.pth was created during the run"]


def test_canaries_look_like_the_files_tests_and_are_hidden_from_the_report():
    canaries = grader.make_canaries(TASK["files"], NODES, TASK["cases"])
    test_file = TASK["files"][canaries.path]
    assert canaries.path == NODES[0].split("::")[0]
    assert canaries.must_fail not in test_file and canaries.must_pass not in test_file
    assert f"check({MODULE}." in canaries.source
    other = grader.make_canaries(TASK["files"], NODES, TASK["cases"])
    assert other.must_fail != canaries.must_fail or other.source != canaries.source
    mutant = grader.make_canaries(TASK["files"], NODES, None)  # a copy of the first test
    assert f"check({MODULE}.line_total(6.91, 1), '" in mutant.source
    assert grader.mutant_test("def test_a():\n    x = f()\n    assert x == [1]\n", "test_b",
                              "s") == "def test_b():\n    x = f()\n    assert x == 's'\n"
    assert grader.mutant_test("def test_a():\n    try:\n        assert f() == 1\n"
                              "    except AssertionError:\n        pass\n", "b", "s") is None
    generic = grader.make_canaries({"tests/test_x.py": "def test_x(y):\n    assert y == 1\n"},
                                   ["tests/test_x.py::test_x"], None)
    assert "assert" in generic.source and "(y)" not in generic.source
    text = (f"___ test_page_1 ___\nE  boom\n___ {canaries.must_fail} ___\nE  canary\n"
            f"=== short test summary info ===\nFAILED t.py::{canaries.must_fail} - x\n"
            "FAILED t.py::test_page_1 - y")
    shown = grader.hide_canaries(text, [canaries.must_fail])
    assert canaries.must_fail not in shown and "canary" not in shown
    assert "test_page_1" in shown and "boom" in shown


def test_instance_cases_are_checked_when_loaded():
    inst = {k: TASK[k] for k in ("instance_id", "problem_statement", "FAIL_TO_PASS",
                                 "PASS_TO_PASS", "files")}
    env = envs.make({"family": "code", "instance": {**inst, "cases": TASK["cases"]}})
    assert env.grader.cases == TASK["cases"]
    for bad in ({}, {NODES[0]: TASK["cases"][NODES[0]]},
                {**TASK["cases"], NODES[0]: {"module": MODULE, "call": "page", "args": "[1]",
                                             "returns": "1"}},
                {**TASK["cases"], NODES[0]: {"module": MODULE, "call": "page", "args": "()"}}):
        with pytest.raises(envs.SpecError, match="case"):
            envs.make({"family": "code", "instance": {**inst, "cases": bad}})

