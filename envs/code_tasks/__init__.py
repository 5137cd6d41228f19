"""Coding tasks in the field layout of SWE-Gym / SWE-bench instances.

An instance is a plain dict:

    instance_id        unique name
    repo               where it comes from ("local/<library>" for generated tasks)
    problem_statement  the issue text shown to the agent
    files              {relative path: text} of the buggy repository (or `repo_path`, a dir)
    patch              the gold fix, a unified diff
    test_patch         (optional) a diff adding the tests, applied before the episode
    FAIL_TO_PASS       pytest node ids that fail before the fix and pass after it
    PASS_TO_PASS       node ids that pass before and after
    test_cmd           (optional) e.g. "pytest -q tests"; -rA and -p no:cacheprovider added
    test_files         (optional) files the agent may not change (default: test files,
                       runner configuration (conftest.py, pytest.ini, tox.ini, setup.cfg,
                       pyproject.toml, ...) and the files the tests live in)
    cases              (optional) the tests as data, {node id: {"module", "call", "args",
                       "returns" | "raises"}}: `module.call(*args)` returns the value whose
                       repr is "returns", or raises the built-in exception class named
                       "raises"; args is the repr of a tuple. With it the grader decides
                       outside the process that runs the code (envs/grader.py). Generated
                       tasks carry it; it must cover every FAIL_TO_PASS + PASS_TO_PASS id.

`generate_task(task_family, seed, split)` plants one bug of a family (TASK_FAMILIES) in
one of the small libraries (envs/code_tasks/libraries.py); `load_instance(obj)` reads a
dict, a JSON file or a directory holding `instance.json` (and `repo/`).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import random
import string
import types
from pathlib import Path

from envs.code_tasks.libraries import LIBRARIES, Library
from envs.code_tasks.patches import apply_patch, make_patch, patch_to_actions

TASK_FAMILIES = ("off_by_one", "wrong_operator", "missing_edge_case", "wrong_default",
                 "broken_parsing")
SPLITS = ("train", "eval")
EVAL_BUCKETS = 4  # one configuration in four is held out for the eval split
DEFAULT_TEST_CMD = "pytest -q tests"
PROTECTED_NAMES = ("conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg",
                   "pyproject.toml", "sitecustomize.py", "usercustomize.py")
MAX_FILE_BYTES = 200_000


# ----------------------------------------------------------------------- generation
def _render(lib: Library, consts: dict, mod: str, buggy_family: str | None) -> str:
    slots = {}
    for family, (slot, site) in lib.sites.items():
        slots[slot] = site.buggy if family == buggy_family else site.correct
    with_slots = string.Template(lib.source).safe_substitute(slots)
    return string.Template(with_slots).substitute({**consts, "mod": mod})


def _call(module: types.ModuleType, func: str, args: tuple):
    """('ok', value) or ('raises', exception class name)."""
    try:
        return ("ok", getattr(module, func)(*copy.deepcopy(args)))
    except Exception as exc:  # the generator's own, trusted code
        return ("raises", type(exc).__name__)


def _load_module(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    return module


# Results are compared as plain built-in values, so an object that claims to equal
# everything (a custom __eq__) cannot pass a test.
_CHECK_HELPER = '''

def plain(value):
    kind = type(value)
    if kind in (int, float, str, bool, type(None)):
        return value
    if kind in (list, tuple):
        return kind(plain(item) for item in value)
    if kind is dict:
        return {plain(k): plain(v) for k, v in value.items()}
    raise AssertionError(f"unexpected result type {kind.__name__}")


def check(got, want):
    assert plain(got) == want
'''


def _test_source(mod: str, tests: list[tuple[str, str, tuple, tuple]]) -> str:
    parts = [f'"""Tests for {mod}."""\n\nimport pytest\n\nimport {mod}\n{_CHECK_HELPER}']
    for name, func, args, (kind, value) in tests:
        call = f"{mod}.{func}({', '.join(repr(a) for a in args)})"
        if kind == "raises":
            body = f"    with pytest.raises({value}):\n        {call}"
        else:
            body = f"    check({call}, {value!r})"
        parts.append(f"\ndef {name}():\n{body}\n")
    return "\n".join(parts)


def _cases(mod: str, test_path: str, tests: list[tuple[str, str, tuple, tuple]]) -> dict:
    """The tests as data (the instance's `cases`): the same calls and expectations."""
    cases = {}
    for name, func, args, (kind, value) in tests:
        want = {"returns": repr(value)} if kind == "ok" else {"raises": value}
        cases[f"{test_path}::{name}"] = {"module": mod, "call": func,
                                         "args": repr(tuple(args)), **want}
    return cases


def _describe(outcome: tuple, verb: str) -> str:
    kind, value = outcome
    return f"raise{'s' if verb == 'does' else ''} {value}" if kind == "raises" else (
        f"return{'s' if verb == 'does' else ''} {value!r}")


def _config_bucket(lib: Library, mod: str, consts: dict) -> str:
    key = json.dumps([lib.key, mod, sorted(consts.items())])
    digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return "eval" if digest % EVAL_BUCKETS == 0 else "train"


def generate_task(task_family: str, seed: int, split: str = "train") -> dict:
    """A SWE-style instance dict with one planted bug; same arguments, same task.

    The split is decided by the task's configuration (library, module name, constants):
    one in EVAL_BUCKETS configurations belongs to "eval", so the splits never share one.
    """
    if task_family not in TASK_FAMILIES:
        raise ValueError(f"unknown task_family {task_family!r}; valid: {list(TASK_FAMILIES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {list(SPLITS)}")
    for attempt in range(1000):
        rng = random.Random(f"code/{task_family}/{int(seed)}/{attempt}")
        lib = LIBRARIES[rng.choice(sorted(LIBRARIES))]
        mod = rng.choice(lib.module_names)
        consts = lib.consts(rng)
        if _config_bucket(lib, mod, consts) != split:
            continue
        task = _build(lib, mod, consts, task_family, rng)
        if task is not None:
            task.update(split=split, seed=int(seed), instance_id=(
                f"local__{lib.key}-{task_family}-{split}-{int(seed)}"))
            return task
    raise RuntimeError(f"no {split} task found for {task_family} seed {seed}")


def _build(lib: Library, mod: str, consts: dict, family: str, rng: random.Random) -> dict | None:
    fixed_src, buggy_src = (_render(lib, consts, mod, f) for f in (None, family))
    fixed, buggy = _load_module(fixed_src, mod), _load_module(buggy_src, mod)
    tests, fail, keep, first_failure = [], [], [], None
    counts: dict[str, int] = {}
    test_path = f"tests/test_{mod}.py"
    for func, args in lib.cases(rng, consts):
        counts[func] = counts.get(func, 0) + 1
        name = f"test_{func}_{counts[func]}"
        want, got = _call(fixed, func, args), _call(buggy, func, args)
        tests.append((name, func, args, want))
        node = f"{test_path}::{name}"
        if want == got:
            keep.append(node)
        else:
            fail.append(node)
            first_failure = first_failure or (func, args, want, got)
    if not fail:
        return None
    func, args, want, got = first_failure
    hint = string.Template(lib.sites[family][1].hint).substitute({**consts, "mod": mod})
    call = f"{mod}.{func}({', '.join(repr(a) for a in args)})"
    statement = (f"{hint} For example, `{call}` {_describe(got, 'does')}, but it should "
                 f"{_describe(want, 'should')}. Fix the library; the tests are read-only.")
    readme = f"# {mod}\n\n{fixed_src.splitlines()[0].strip(chr(34))}\n\nRun the tests: pytest\n"
    common = {"README.md": readme, "pytest.ini": "[pytest]\ntestpaths = tests\n",
              test_path: _test_source(mod, tests)}
    buggy_files = {**common, f"{mod}.py": buggy_src}
    fixed_files = {**common, f"{mod}.py": fixed_src}
    return {
        "repo": f"local/{lib.key}",
        "base_commit": "",
        "problem_statement": statement,
        "files": buggy_files,
        "patch": make_patch(buggy_files, fixed_files),
        "test_patch": "",
        "FAIL_TO_PASS": fail,
        "PASS_TO_PASS": keep,
        "test_cmd": DEFAULT_TEST_CMD,
        "test_files": [test_path, "pytest.ini"],
        "cases": _cases(mod, test_path, tests),
        "task_family": family,
        "library": lib.key,
        "module": mod,
        "config": {k: consts[k] for k in sorted(consts)},
        "gold_actions": patch_to_actions(make_patch(buggy_files, fixed_files, context=0))
        + ["submit"],
    }


# -------------------------------------------------------------------------- loading
def _id_list(value, key: str) -> list[str]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"instance key {key!r} must be a list of pytest node ids, got {value!r}")
    return list(value)


def read_repo_dir(path: str | Path) -> dict[str, str]:
    """{relative path: text} of the text files under `path` (.git and caches skipped)."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"repo_path {str(root)!r} is not a directory")
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", "__pycache__", ".tox")
                             and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if full.is_symlink() or full.stat().st_size > MAX_FILE_BYTES:
                continue
            try:
                files[full.relative_to(root).as_posix()] = full.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
    return files


def _is_test_file(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    return (name in PROTECTED_NAMES or name.endswith(".pth") or name.startswith("test_")
            or name.endswith("_test.py") or any(p in ("tests", "test", "testing")
                                                for p in parts[:-1]))


def _check_cases(cases, tests: list[str]) -> dict:
    """The instance's `cases`, checked: one well-formed case per listed test."""
    if not isinstance(cases, dict) or set(cases) != set(tests):
        raise ValueError("instance key 'cases' must map exactly the FAIL_TO_PASS and "
                         "PASS_TO_PASS node ids to cases")
    for node, case in cases.items():
        fields = {"module", "call", "args"}
        if not (isinstance(case, dict) and fields <= set(case)
                and len(set(case) & {"returns", "raises"}) == 1):
            raise ValueError(f"case {node!r} needs module, call, args and one of "
                             f"returns / raises, got {case!r}")
        try:
            args, _ = ast.literal_eval(case["args"]), ast.literal_eval(case.get("returns", "0"))
        except (ValueError, SyntaxError) as exc:
            raise ValueError(f"case {node!r}: args / returns must be Python literals") from exc
        if not isinstance(args, tuple):
            raise ValueError(f"case {node!r}: args must be the repr of a tuple")
    return dict(cases)


def load_instance(obj) -> dict:
    """Normalises an instance given as a dict, a JSON file path or a directory path."""
    base_dir = None
    if isinstance(obj, str | os.PathLike):
        path = Path(obj)
        if path.is_dir():
            base_dir, path = path, path / "instance.json"
        if not path.is_file():
            raise ValueError(f"instance path {str(path)!r} does not exist")
        base_dir = base_dir or path.parent
        obj = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]
    if not isinstance(obj, dict):
        raise ValueError(f"an instance is a dict (or a JSON file holding one), got {type(obj)}")
    missing = [k for k in ("instance_id", "problem_statement", "FAIL_TO_PASS") if k not in obj]
    if missing:
        raise ValueError(f"instance is missing key(s) {missing}")
    inst = dict(obj)
    inst["FAIL_TO_PASS"] = _id_list(obj["FAIL_TO_PASS"], "FAIL_TO_PASS")
    inst["PASS_TO_PASS"] = _id_list(obj.get("PASS_TO_PASS", []), "PASS_TO_PASS")
    if "files" in obj:
        files = dict(obj["files"])
    elif "repo_path" in obj or (base_dir and (base_dir / "repo").is_dir()):
        repo = Path(obj.get("repo_path", "repo"))
        files = read_repo_dir(repo if repo.is_absolute() or base_dir is None else base_dir / repo)
    else:
        raise ValueError(f"instance {obj['instance_id']!r} has neither 'files' nor 'repo_path'")
    if obj.get("test_patch"):
        files = apply_patch(files, obj["test_patch"])
    inst["files"] = files
    if "cases" in obj:
        inst["cases"] = _check_cases(obj["cases"], inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"])
    inst.setdefault("patch", "")
    inst.setdefault("test_cmd", DEFAULT_TEST_CMD)
    if "test_files" not in inst:
        from envs.code_tasks.patches import parse_patch

        touched = {fp.new_path for fp in parse_patch(obj.get("test_patch") or "") if fp.new_path}
        listed = {node.split("::")[0] for node in inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"]}
        inst["test_files"] = sorted(p for p in files if _is_test_file(p) or p in touched
                                    or p in listed)
    if "gold_actions" not in inst:
        try:
            inst["gold_actions"] = patch_to_actions(inst["patch"]) + ["submit"] if (
                inst["patch"]) else []
        except ValueError:
            inst["gold_actions"] = []
    return inst


__all__ = ["TASK_FAMILIES", "SPLITS", "generate_task", "load_instance", "read_repo_dir",
           "apply_patch", "make_patch", "patch_to_actions"]
