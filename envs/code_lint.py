"""The style score of an agent's patch: ruff on the files it changed, before and after.

    lint_patch(pristine_files, patched_files, sandbox) -> {"style_score": 0.83, ...}

Only the Python files the patch changed are linted (test files are read-only in the code
env), once as they were and once as they are, in one ruff run inside the episode's
sandbox. The score counts the violations the patch added:

    new   = max(0, violations after - violations before)   (fixing old ones earns nothing)
    lines = non-blank lines of the changed files after the patch
    style_score = max(0, 1 - STRICTNESS * new / max(lines, 1))

so with STRICTNESS = 5 one new violation per 5 lines scores 0, and a patch that adds none
(or changes no Python file) scores 1. Rules: pyflakes (F) and pycodestyle errors and
warnings (E, W) at line length 100, with `--isolated` so that no configuration file in
the task's repository can change them. A lint that fails (timeout, crash) gives no score,
only `lint_error`.
"""

from __future__ import annotations

import json
import os
import sys

from envs.sandbox import Sandbox

STRICTNESS = 5.0
RULES = "E,W,F"
LINE_LENGTH = 100
TIMEOUT_S = 30.0
_BEFORE, _AFTER = "before", "after"
# ruff's thread pool must fit the sandbox's process limit (threads count against it).
_ONE_THREAD = (
    "import os, sys; os.environ['RAYON_NUM_THREADS'] = '1'; os.execv(sys.argv[1], sys.argv[1:])"
)


def ruff_argv() -> list[str]:
    """The sandboxed command line: ruff on the current directory, JSON report, exit 0."""
    from ruff import find_ruff_bin  # the ruff wheel's own locator of its binary

    return [
        sys.executable,
        "-c",
        _ONE_THREAD,
        os.fspath(find_ruff_bin()),
        "check",
        "--isolated",
        "--no-cache",
        "--exit-zero",
        "--output-format",
        "json",
        "--select",
        RULES,
        "--line-length",
        str(LINE_LENGTH),
        ".",
    ]


def changed_python_files(pristine: dict[str, str], patched: dict[str, str]) -> list[str]:
    """Sorted paths of .py files whose text differs (or that are new) after the patch."""
    return sorted(p for p, text in patched.items() if p.endswith(".py") and pristine.get(p) != text)


def style_score(new_violations: int, lines: int) -> float:
    """max(0, 1 - STRICTNESS * new_violations / max(lines, 1))."""
    return max(0.0, 1.0 - STRICTNESS * new_violations / max(lines, 1))


def lint_patch(
    pristine: dict[str, str],
    patched: dict[str, str],
    sandbox: Sandbox,
    timeout_s: float = TIMEOUT_S,
) -> dict:
    """{style_score, lint_violations (new ones), lint_lines, lint_files} or {lint_error}."""
    paths = changed_python_files(pristine, patched)
    lines = sum(1 for p in paths for line in patched[p].splitlines() if line.strip())
    if not paths:
        return {"style_score": 1.0, "lint_violations": 0, "lint_lines": 0, "lint_files": []}
    files = {f"{_AFTER}/{p}": patched[p] for p in paths}
    files.update({f"{_BEFORE}/{p}": pristine[p] for p in paths if p in pristine})
    workdir = sandbox.fresh_dir(files, name="lint")
    result = sandbox.run(ruff_argv(), cwd=workdir, wall_seconds=timeout_s)
    if result.timed_out or result.returncode != 0:
        why = "timed out" if result.timed_out else (result.error or result.output[-300:])
        return {"lint_error": f"ruff failed: {why}"}
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        return {"lint_error": f"ruff printed no JSON: {result.stdout[:300]!r}"}
    counts = {_BEFORE: 0, _AFTER: 0}
    for entry in report:
        side = os.path.relpath(entry["filename"], workdir).split(os.sep)[0]
        counts[side] = counts.get(side, 0) + 1
    new = max(0, counts[_AFTER] - counts[_BEFORE])
    return {
        "style_score": style_score(new, lines),
        "lint_violations": new,
        "lint_lines": lines,
        "lint_files": paths,
    }
