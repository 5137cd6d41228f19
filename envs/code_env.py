"""A SWE-style coding environment: fix a bug in a small Python repository.

The agent sees the repository's file list and the issue text, and acts with

    view FILE [START-END]      show numbered lines (a folder: list its files)
    search TEXT                find TEXT in every file
    edit FILE START-END        replace lines START..END by the lines that follow the command
      <new lines>              (no lines: delete them; END = START-1: insert before START)
    run_tests                  run the test suite, 0 reward
    submit                     run the test suite and end the episode

On `submit` (or when `max_steps` run out) the reward is the share of the task's
FAIL_TO_PASS + PASS_TO_PASS tests that pass, computed by running pytest on the edited
copy inside `envs.sandbox` ("binary": 1 only if all pass); `won` when all pass. That
last step's info also holds the reward components `pass_share` and `style_score` (ruff
on the files the agent changed, see envs.code_lint). The working copy is kept in
memory: every test run materialises it in a fresh directory of the episode's sandbox,
with the pristine test files (and conftest/pytest.ini) laid over it, so nothing the
model's code writes or deletes survives into the grading run, and a test that is missing
or broken counts as failing.

Spec keys: task_family, seed, split ("train"|"eval"), or instance (dict, JSON file or
directory, see envs.code_tasks); max_steps, reward ("share"|"binary"), invalid_penalty
(subtracted from the reward of an invalid command), obs_format ("template"|"raw"),
timeout_s (wall-clock seconds per test run), lint (score the patch's style, default true).
"""

from __future__ import annotations

import posixpath
import re
import shlex
import sys

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
from envs.sandbox import Limits, Sandbox

SPEC_KEYS = frozenset({"task_family", "seed", "split", "instance", "max_steps", "reward",
                       "invalid_penalty", "obs_format", "timeout_s", "lint"})
REWARD_KINDS = ("share", "binary")
MAX_ACTION_CHARS = 16_000
MAX_FEEDBACK_CHARS = 4_000
VIEW_LINES = 120
MAX_SEARCH_HITS = 30
PASSING = ("PASSED", "XFAIL")
USAGE = """Commands (one per turn):
  view FILE [START-END]   show lines of a file (or list a folder)
  search TEXT             find TEXT in the repository
  edit FILE START-END     replace lines START..END with the lines after this one
  run_tests               run the tests (no reward)
  submit                  finish: the tests decide the reward"""


def make_env(spec: dict) -> CodeEnv:
    return CodeEnv(spec)


# ------------------------------------------------------------------ test outcomes
_SUMMARY_RE = re.compile(r"^=+ short test summary info =+$")
_OUTCOME_RE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(.+)$")


def parse_pytest_summary(output: str) -> dict[str, str]:
    """{node id: outcome} from the `-rA` short test summary of a pytest run.

    Only the first summary block is read (up to the closing `=== ... ===` line), so
    text printed after pytest finished cannot add outcomes.
    """
    outcomes: dict[str, str] = {}
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if _SUMMARY_RE.match(line.strip())), None)
    if start is None:
        return outcomes
    for line in lines[start + 1:]:
        if line.startswith("="):
            break
        match = _OUTCOME_RE.match(line.strip())
        if match and not match.group(2).startswith("["):
            node = match.group(2).split(" - ")[0].strip()
            outcomes.setdefault(node, match.group(1))
    return outcomes


def pytest_argv(test_cmd: str | list) -> list[str]:
    """The interpreter command line for an instance's pytest command."""
    argv = shlex.split(test_cmd) if isinstance(test_cmd, str) else list(test_cmd)
    if argv[:1] in (["pytest"], ["py.test"]):
        argv = [sys.executable, "-m", "pytest", *argv[1:]]
    elif argv[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
        argv = [sys.executable, *argv[1:]]
    else:
        raise SpecError(f"test_cmd {test_cmd!r} is not a pytest command ('pytest ...')")
    extra = [a for a in ("-rA", "--tb=short") if a not in argv]
    if "no:cacheprovider" not in argv:
        extra += ["-p", "no:cacheprovider"]
    return argv[:3] + extra + argv[3:]


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
        self.argv = pytest_argv(self.instance["test_cmd"])
        self.tests = self.instance["FAIL_TO_PASS"] + self.instance["PASS_TO_PASS"]
        self.protected = set(self.instance.get("test_files", []))
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
            grade = self._run_tests()
            feedback += f"\nOut of steps ({self.max_steps}). Final tests:\n{grade['report']}"
        info = {"command": verb, "invalid": invalid, "truncated": truncated}
        if grade is not None:
            self.done = True
            won = grade["passed"] == grade["total"] and grade["total"] > 0
            share = grade["passed"] / max(1, grade["total"])
            reward += float(won) if self.reward_kind == "binary" else share
            info.update(tests=grade["tests"], passed=grade["passed"], total=grade["total"],
                        pass_share=share)
            if self.lint:
                info.update(lint_patch(self.instance["files"], self.files, self.sandbox))
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
            grade = self._run_tests()
            if verb == "run_tests":
                return verb, grade["report"], False, None
            return verb, f"Submitted. {grade['report']}", False, grade
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
    def _run_tests(self) -> dict:
        """Runs the suite on the working copy with the pristine test files laid over it."""
        self.test_runs += 1
        pristine = self.instance["files"]
        files = {**self.files, **{p: pristine[p] for p in self.protected if p in pristine}}
        workdir = self.sandbox.fresh_dir(files, name="work")
        result = self.sandbox.run(self.argv, cwd=workdir)
        outcomes = parse_pytest_summary(result.stdout)
        passed = {t: outcomes.get(t) in PASSING for t in self.tests}
        n_pass = sum(passed.values())
        status = "timed out" if result.timed_out else (result.error or f"exit {result.returncode}")
        lines = [f"{n_pass}/{len(passed)} task tests pass (pytest: {status})."]
        lines += [f"  FAIL {t}" for t, ok in passed.items() if not ok]
        report = "\n".join(lines)
        room = MAX_FEEDBACK_CHARS - len(report) - 40
        if room > 200 and n_pass < len(passed):
            report += "\n--- pytest output ---\n" + _failure_text(result)[:room]
        return {"tests": passed, "passed": n_pass, "total": len(passed), "report": report}

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


def _failure_text(result) -> str:
    """The part of a pytest run worth showing: up to the passes / summary sections."""
    text = result.output
    for marker in ("= PASSES =", "= short test summary info ="):
        cut = text.find(marker)
        if cut > 0:
            text = text[:text.rfind("\n", 0, cut) + 1]
    return text.strip()


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
