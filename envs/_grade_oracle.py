"""The grader's out-of-process checks (see envs/grader.py): `python -I THIS SETUP.json`.

Each check is a call `module.function(*args)`. This script makes the calls and reports
what came back, one JSON line per call tagged with the run's tag: `returns` (the repr of
the result as plain built-in values) or `raises` (the built-in exception classes the
raised exception is an instance of). It never sees the expected values: the parent
compares them, so the code under test can only choose what its functions return, never
the verdict. The setup file is deleted once read.

Run with `-I`, so the working directory is not on sys.path at start-up (no start-up hook
can come from it); it is put first on sys.path here, as `python -m pytest` does, after the
modules this script needs are imported.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import sys


def plain(value):
    """`value` as built-in values only (the generated tests' `plain` helper): an object of
    any other type, such as one claiming to equal everything, is refused."""
    kind = type(value)
    if kind in (int, float, str, bool, type(None)):
        return value
    if kind in (list, tuple):
        return kind(plain(item) for item in value)
    if kind is dict:
        return {plain(k): plain(v) for k, v in value.items()}
    raise TypeError(f"unexpected result type {kind.__name__}")


def run_call(module, case: dict) -> dict:
    """{"returns": repr} or {"raises": [built-in class names]} or {"error": why}."""
    try:
        args = ast.literal_eval(case["args"])
        value = getattr(module, case["call"])(*args)
    except BaseException as exc:  # SystemExit too: it must not end the run early
        return {"raises": [c.__name__ for c in type(exc).__mro__
                           if getattr(c, "__module__", "") == "builtins"]}
    try:
        return {"returns": repr(plain(value))}
    except BaseException as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def load(name: str, modules: dict):
    """The imported module, or the exception its import raised (kept: imported once)."""
    if name not in modules:
        try:
            modules[name] = importlib.import_module(name)
        except BaseException as exc:  # SystemExit too
            modules[name] = exc
    return modules[name]


def main(setup_path: str) -> None:
    with open(setup_path, encoding="utf-8") as f:
        setup = json.load(f)
    os.remove(setup_path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
    fd = os.open(setup["results"], flags, 0o600)
    tag = setup["tag"]
    sys.path.insert(0, os.getcwd())
    modules: dict[str, object] = {}
    for case in setup["cases"]:
        module = load(case["module"], modules)
        if isinstance(module, BaseException):
            record = {"error": f"import {case['module']}: {type(module).__name__}: {module}"[:200]}
        else:
            record = run_call(module, case)
        os.write(fd, (json.dumps({"tag": tag, "id": case["id"], **record}) + "\n").encode())
    os.write(fd, (json.dumps({"tag": tag, "end": len(setup["cases"])}) + "\n").encode())


if __name__ == "__main__":
    main(sys.argv[1])
