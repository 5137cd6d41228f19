"""A SWE-style coding environment: fix a bug in a small Python repository.

The agent sees the repository's file list and the issue text, and acts with

    view FILE [START-END]      show numbered lines (a folder: list its files)
    search TEXT                find TEXT in every file
    edit FILE START-END        replace lines START..END by the lines that follow the command
      <new lines>              (no lines: delete them; END = START-1: insert before START)
    run_tests                  run the test suite, 0 reward
    submit                     run the test suite and end the episode

On `submit` (or when `max_steps` run out) the reward is the share of the task's
FAIL_TO_PASS + PASS_TO_PASS tests that pass, decided by `envs.grader` from runs inside
`envs.sandbox` ("binary": 1 only if all pass); `won` when all pass. A run the grader finds
tampered with (a canary test that must fail passed, pytest's report or the out-of-process
checks disagree, a pristine file changed, ...) earns 0 and sets `info["tampered"]`; see
docs/threat_model.md. That last step's info also holds the reward components
`pass_share` and `style_score` (ruff on the files the agent changed, see envs.code_lint).
The working copy is kept in memory: every test run materialises it in a fresh directory
of the episode's sandbox, with the pristine test and runner-config files (conftest.py,
pytest.ini, setup.cfg, pyproject.toml, ...) laid over it, so nothing the model's code
writes or deletes survives into the next run, and a test that is missing or broken
counts as failing. Those files are read-only to `edit`.

Spec keys: task_family, seed, split ("train"|"eval"), or instance (dict, JSON file or
directory, see envs.code_tasks); max_steps, reward ("share"|"binary"), invalid_penalty
(subtracted from the reward of an invalid command), obs_format ("template"|"raw"),
timeout_s (wall-clock seconds per test run), lint (score the patch's style, default true).
"""

from __future__ import annotations

import posixpath
import re

from envs.base import (
    OBS_FORMATS,
    SpecError,
    StepResult,
    TaskSpec,
    check_spec_keys,
    clean_action,
    render_state,
)
from envs.code_lint import lint_patch
from envs.code_tasks import TASK_FAMILIES, generate_task, load_instance
from envs.grader import Grade, Grader, parse_pytest_summary, pytest_argv
from envs.sandbox import Limits, Sandbox

__all__ = ["CodeEnv", "USAGE", "make_env", "parse_pytest_summary", "pytest_argv"]

SPEC_KEYS = frozenset({"task_family", "seed", "split", "instance", "max_steps", "reward",
                       "invalid_penalty", "obs_format", "timeout_s", "lint"})
REWARD_KINDS = ("share", "binary")
MAX_ACTION_CHARS = 16_000
MAX_FEEDBACK_CHARS = 4_000
VIEW_LINES = 120
MAX_SEARCH_HITS = 30
USAGE = """Commands (one per turn):
  view FILE [START-END]   show lines of a file (or list a folder)
  search TEXT             find TEXT in the repository
  edit FILE START-END     replace lines START..END with the lines after this one
  run_tests               run the tests (no reward)
  submit                  finish: the tests decide the reward"""


def make_env(spec: dict) -> CodeEnv:
    return CodeEnv(spec)


# --------------------------------------------------------------------------- env
class CodeEnv:
    def __init__(self, spec: dict):
        check_spec_keys(spec, SPEC_KEYS, "code")
        self.reward_kind = spec.get("reward", "share")
        self.obs_format = spec.get("obs_format", "template")
        for key, value, valid in (("reward", self.reward_kind, REWARD_KINDS),
                                  ("obs_format", self.obs_format, OBS_FORMATS)):
            if value not in valid:
                raise SpecError(f"code env: {key}={value!r}; valid: {list(valid)}")
        self.invalid_penalty = abs(_number(spec, "invalid_penalty", 0.0, float))
        self.instance = self._instance(spec)
        gold = list(self.instance.get("gold_actions", []))
        self.max_steps = _number(spec, "max_steps", max(30, 3 * len(gold)), int)
        self.limits = Limits(wall_seconds=_number(spec, "timeout_s", 60.0, float))
        self.lint = spec.get("lint", True)
        if not isinstance(self.lint, bool):
            raise SpecError(f"code env: lint={self.lint!r} must be true or false")
        self.grader = Grader(self.instance)
        self.tests = self.grader.tests
        self.protected = self.grader.protected
        self.task = TaskSpec(
            family="code", name=self.instance["instance_id"],
            complexity={"task_family": self.instance.get("task_family", "instance"),
                        "library": self.instance.get("library", self.instance.get("repo", "")),
                        "files": len(self.instance["files"]), "tests": len(self.tests)},
            optimal_steps=len(gold), gold_actions=gold,
            info={k: self.instance.get(k) for k in ("instance_id", "repo", "split", "seed",
                                                     "FAIL_TO_PASS", "PASS_TO_PASS")},
        )
        self.sandbox: Sandbox | None = None
        self.files: dict[str, str] = {}
        self.done = True

    @staticmethod
    def _instance(spec: dict) -> dict:
        if "instance" in spec:
            try:
                return load_instance(spec["instance"])
            except (ValueError, OSError) as exc:
                raise SpecError(f"code env: bad instance: {exc}") from exc
        family = spec.get("task_family")
        if family not in TASK_FAMILIES:
            raise SpecError(f"code env: task_family={family!r}; valid: {list(TASK_FAMILIES)} "
                            "(or give an 'instance')")
        try:
            return generate_task(family, int(spec.get("seed", 0)), spec.get("split", "train"))
        except ValueError as exc:
            raise SpecError(f"code env: {exc}") from exc

    # -------------------------------------------------------------- protocol
    def reset(self, seed: int | None = None) -> StepResult:
        """Starts an episode on a fresh copy of the repository (the task is fixed by the
        spec; `seed` is accepted for the protocol and ignored)."""
        self.close()
        self.sandbox = Sandbox(self.limits)
        self.files = dict(self.instance["files"])
        self.steps, self.done, self.current_file, self.test_runs = 0, False, "", 0
        intro = (f"You are in the repository {self.instance['instance_id']}. Fix the issue so "
                 f"the tests pass.\n{USAGE}")
        return StepResult(self._observe(intro, reset=True), info={"command": "reset"})

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(self._observe("The episode is over; call reset()."), done=True,
                              info={"command": "none", "invalid": True})
        text = clean_action(action, MAX_ACTION_CHARS)
        self.steps += 1
        try:
            verb, feedback, invalid, grade = self._dispatch(text)
        except Exception as exc:  # a bug here must not end training: report and go on
            verb, feedback, invalid, grade = "error", f"internal error: {exc!r}", True, None
        reward, won = (-self.invalid_penalty if invalid and self.invalid_penalty else 0.0), False
        truncated = grade is None and self.steps >= self.max_steps
        if truncated:
            grade = self._grade()
            feedback += f"\nOut of steps ({self.max_steps}). Final tests:\n{grade.report}"
        info = {"command": verb, "invalid": invalid, "truncated": truncated}
        if grade is not None:
            self.done = True
            won = grade.passed == grade.total > 0
            reward += self._outcome_reward(grade, won)
            info.update(self._grade_info(grade))
        return StepResult(self._observe(feedback), reward=reward, done=self.done, won=won,
                          info=info)

    def close(self) -> None:
        if getattr(self, "sandbox", None) is not None:
            self.sandbox.close()
            self.sandbox = None

    def __del__(self):
        self.close()

    # ------------------------------------------------------------ commands
    def _dispatch(self, text: str) -> tuple[str, str, bool, dict | None]:
        """(verb, feedback, invalid, grade or None for a command that does not end)."""
        head, _, body = text.partition("\n")
        words = head.split()
        verb = words[0].lower() if words else ""
        has_body = "\n" in text
        if verb == "view" and len(words) in (2, 3) and not body.strip():
            return (verb, *self._view(words[1], words[2] if len(words) == 3 else None), None)
        if verb == "search" and len(words) >= 2 and not body.strip():
            return verb, self._search(head.strip()[len(words[0]):].strip()), False, None
        if verb == "edit" and len(words) == 3:
            return (verb, *self._edit(words[1], words[2], body if has_body else None), None)
        if verb in ("run_tests", "submit") and len(words) == 1 and not body.strip():
            if verb == "run_tests":
                return verb, self._run_tests().report, False, None
            grade = self._grade()
            return verb, f"Submitted. {grade.report}", False, grade
        known = verb in ("view", "search", "edit", "run_tests", "submit")
        problem = f"Malformed {verb} command." if known else (
            f"Unknown command {verb[:40]!r}." if verb else "Empty command.")
        return verb if known else "invalid", f"{problem}\n{USAGE}", True, None

    def _resolve(self, raw: str) -> tuple[str | None, str]:
        """(normalised repo path, '') or (None, why it was refused)."""
        path = raw.strip().strip("'\"`")
        norm = posixpath.normpath(path) if path else ""
        if path.startswith("/") or norm == ".." or norm.startswith("../") or "\\" in path:
            return None, f"Refused: {raw[:80]!r} is outside the repository."
        return ("" if norm == "." else norm), ""

    def _view(self, raw: str, span: str | None) -> tuple[str, bool]:
        path, why = self._resolve(raw)
        if path is None:
            return why, True
        if path not in self.files:
            inside = sorted(p for p in self.files if p.startswith(path + "/") or not path)
            if inside and span is None:
                return f"{path or '.'}/ holds:\n" + "\n".join(inside), False
            return f"No file {path!r}. Files: {', '.join(sorted(self.files))}", True
        lines = self.files[path].splitlines()
        if span is None:
            start, end = 1, min(len(lines), VIEW_LINES)
        else:
            parsed = _parse_span(span)
            if parsed is None:
                return f"Bad line range {span[:40]!r}; write START-END, e.g. 1-20.\n{USAGE}", True
            start, end = max(1, parsed[0]), min(len(lines), parsed[1])
            if start > end:
                return f"{path} has {len(lines)} lines; lines {span[:40]} show nothing.", True
        self.current_file = path
        shown = _numbered(lines, start, end)
        more = f"\n... {len(lines) - end} more lines" if end < len(lines) else ""
        return f"{path} (lines {start}-{end} of {len(lines)}):\n{shown}{more}", False

    def _search(self, needle: str) -> str:
        hits = [f"{path}:{i}: {line.strip()}" for path in sorted(self.files)
                for i, line in enumerate(self.files[path].splitlines(), 1) if needle in line]
        if not hits:
            return f"No match for {needle[:80]!r}."
        cut = f"\n... {len(hits) - MAX_SEARCH_HITS} more" if len(hits) > MAX_SEARCH_HITS else ""
        return f"{len(hits)} match(es):\n" + "\n".join(hits[:MAX_SEARCH_HITS]) + cut

    def _edit(self, raw: str, span: str, body: str | None) -> tuple[str, bool]:
        path, why = self._resolve(raw)
        if path is None:
            return why, True
        if path not in self.files:
            return f"No file {path!r} (edit changes existing files only).", True
        if path in self.protected:
            return f"{path} is a test or test-config file and is read-only.", True
        parsed = _parse_span(span)
        lines = self.files[path].splitlines()
        if parsed is None or not (1 <= parsed[0] <= len(lines) + 1
                                  and parsed[0] - 1 <= parsed[1] <= len(lines)):
            return (f"Bad line range {span[:40]!r} for {path} ({len(lines)} lines): use "
                    f"START-END with 1 <= START <= END + 1 and END <= {len(lines)}."), True
        new = _body_lines(body)
        start, end = parsed
        lines[start - 1:end] = new
        self.files[path] = "\n".join(lines) + "\n" if lines else ""
        self.current_file = path
        lo, hi = max(1, start - 2), min(len(lines), start + len(new) + 1)
        return (f"Edited {path}: lines {start}-{end} replaced by {len(new)} line(s). Now:\n"
                f"{_numbered(lines, lo, hi)}"), False

    # --------------------------------------------------------------- tests
    def _run_tests(self) -> Grade:
        """A feedback run (`run_tests`): pytest on the working copy, no reward."""
        self.test_runs += 1
        return self.grader.run_tests(self.sandbox, self.files)

    def _grade(self) -> Grade:
        """The grading run of `submit` (or of running out of steps), see envs.grader."""
        self.test_runs += 1
        return self.grader.grade(self.sandbox, self.files)

    def _outcome_reward(self, grade: Grade, won: bool) -> float:
        if grade.tampered:
            return 0.0
        return float(won) if self.reward_kind == "binary" else grade.passed / max(1, grade.total)

    def _grade_info(self, grade: Grade) -> dict:
        """The grading step's info: test verdicts, reward components, the tamper flag.
        A tampered run's components are 0, so no reward recipe pays any part of it."""
        info = {"tests": grade.tests, "passed": grade.passed, "total": grade.total,
                "pass_share": grade.passed / max(1, grade.total), "tampered": grade.tampered}
        if grade.tampered:
            info.update(pass_share=0.0, tamper_reasons=list(grade.reasons))
            if self.lint:
                info["style_score"] = 0.0
        elif self.lint:
            info.update(lint_patch(self.instance["files"], self.files, self.sandbox))
        return info

    # --------------------------------------------------------- observation
    def _observe(self, feedback: str, reset: bool = False) -> str:
        if len(feedback) > MAX_FEEDBACK_CHARS:
            feedback = feedback[:MAX_FEEDBACK_CHARS] + "\n... [feedback cut]"
        goal = self.instance["problem_statement"]
        if self.obs_format == "raw":
            return f"{goal}\n\n{feedback}" if reset else feedback
        room = f"repository {self.instance['instance_id']}"
        if getattr(self, "current_file", ""):
            room += f", file {self.current_file}"
        return render_state(room=room, items=sorted(self.files or self.instance["files"]),
                            goal=goal, feedback=feedback)


def _number(spec: dict, key: str, default, kind):
    """spec[key] as a positive-or-zero int/float, or a SpecError naming the key."""
    value = spec.get(key, default)
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = -1
    if number < 0 or isinstance(value, bool):
        raise SpecError(f"code env: {key}={value!r} must be a non-negative {kind.__name__}")
    return number


def _parse_span(span: str) -> tuple[int, int] | None:
    match = re.fullmatch(r"(\d{1,7})(?:\s*[-:,]\s*(\d{1,7}))?", span.strip())
    if not match:
        return None
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) is not None else start
    return start, end


def _body_lines(body: str | None) -> list[str]:
    """The new lines of an edit: none without a body; one trailing newline ignored; a
    Markdown code fence around the lines is dropped."""
    if body is None:
        return []
    if body.endswith("\n"):
        body = body[:-1]
    lines = body.split("\n")
    if len(lines) >= 2 and lines[0].strip().startswith("```") and lines[-1].strip() == "```":
        lines = lines[1:-1]
    return lines


def _numbered(lines: list[str], start: int, end: int) -> str:
    return "\n".join(f"{i:5d}| {lines[i - 1]}" for i in range(start, end + 1))
