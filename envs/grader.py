"""Grading the coding env's test runs so that the code under test cannot choose the verdict.

The code under test runs inside the process that runs the tests, so everything that
process writes (stdout, exit status, any file, pytest's own report objects) is under its
control. The grader therefore decides from what that code cannot forge, and treats
inconsistencies as tampering (docs/threat_model.md has the full argument):

1. Out-of-process checks, where the task states its tests as data (`cases`: generated
   tasks, or instances that carry them). A separate run (envs/_grade_oracle.py, without
   the test files) makes each call and reports only what came back; the parent, which
   never imports the repository's code, compares with the expected values it alone holds.
   Forging that report can only claim a function returned something, which is no more
   than writing a function that returns it.
2. The pytest run, with pristine test and runner-config files laid over the working copy,
   a plugin loaded before any repository code (envs/_grade_plugin.py) that records
   outcomes to a randomly named file tagged with a fresh nonce, and two canaries with
   fresh random names added to a test file at grading only: one must fail (it asserts a
   value no correct code returns; a blanket "everything passes" patch or a function that
   reads the expected value from its caller makes it pass), one must pass.
3. Parent-side checks after the run: the pristine files are unchanged, no start-up hook or
   runner-config file appeared, the records are complete and consistent, pytest's printed
   summary and exit status agree with them, and (1) and (2) agree test by test.

A test counts as passed only when every verdict available says so. Any inconsistency
flags the run as tampered: all its tests count as failed.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import posixpath
import re
import secrets
import shlex
import shutil
import stat
import sys
from pathlib import Path

from envs.base import SpecError

PASSING = ("PASSED", "XFAIL")
# Files that configure the runner or run at interpreter start-up: laid over from the
# pristine repository for every run, never editable, and never to appear during a run.
RUNNER_NAMES = ("conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg",
                "pyproject.toml", "sitecustomize.py", "usercustomize.py")
MAX_RECORD_BYTES = 4 << 20
MAX_LITERAL_CHARS = 100_000
MAX_WALK = 20_000
MAX_FEEDBACK_CHARS = 4_000
_PLUGIN_SOURCE = Path(__file__).with_name("_grade_plugin.py")
_ORACLE_SOURCE = Path(__file__).with_name("_grade_oracle.py")


@dataclasses.dataclass
class Grade:
    """The verdict of one test run: {node id: passed}, the text shown to the agent, and
    whether (and why) the run was flagged as tampered with."""

    tests: dict[str, bool]
    report: str
    tampered: bool = False
    reasons: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(self.tests.values())

    @property
    def total(self) -> int:
        return len(self.tests)


# ------------------------------------------------------------------- pytest commands
_SUMMARY_RE = re.compile(r"^=+ short test summary info =+$")
_OUTCOME_RE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(.+)$")


def parse_pytest_summary(output: str) -> dict[str, str]:
    """{node id: outcome} from the `-rA` short test summary of a pytest run.

    Only the first summary block is read (up to the closing `=== ... ===` line). The
    grader never takes outcomes from it: it compares what it claims with the records.
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


def runner_files(files) -> set[str]:
    """The paths among `files` that configure pytest or run at interpreter start-up."""
    return {p for p in files if posixpath.basename(p) in RUNNER_NAMES or p.endswith(".pth")}


# ------------------------------------------------------------ reading the run directory
def read_private_file(path: str, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The first `limit` bytes of a regular file the sandboxed code could have replaced:
    never follows a link, never blocks on a FIFO; b"" when it is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def run_traces(workdir: str, laid_over: dict[str, str]) -> list[str]:
    """What a run changed that no honest code changes: the pristine files laid over the
    working copy, and runner-config or start-up hook files that were not there before."""
    found = []
    for rel, text in sorted(laid_over.items()):
        if read_private_file(os.path.join(workdir, rel)) != text.encode("utf-8"):
            found.append(f"{rel} was changed or removed during the run")
    seen = 0
    for dirpath, dirnames, filenames in os.walk(workdir):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), workdir).replace(os.sep, "/")
            if rel not in laid_over and (name in RUNNER_NAMES or name.endswith(".pth")):
                found.append(f"{rel} was created during the run")
        seen += len(filenames) + len(dirnames)
        if seen > MAX_WALK:
            break
    return found


def json_lines(data: bytes, key: str, value: str) -> tuple[list[dict], int]:
    """(the records carrying key == value, how many lines were anything else)."""
    records, foreign = [], 0
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and record.get(key) == value:
            records.append(record)
        else:
            foreign += 1
    return records, foreign


# ------------------------------------------------------------------ pytest's records
@dataclasses.dataclass
class PytestRecords:
    """What the grader's plugin recorded (envs/_grade_plugin.py), and what is wrong with it."""

    ended: bool = False
    exitstatus: int | None = None
    collected: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def parse(cls, data: bytes, nonce: str) -> PytestRecords:
        records, foreign = json_lines(data, "nonce", nonce)
        out = cls()
        if foreign:
            out.problems.append(f"{foreign} line(s) of the results file were not the grader's")
        kinds = [r.get("kind") for r in records]
        for kind in ("collected", "integrity", "end"):
            if kinds.count(kind) > 1:
                out.problems.append(f"the results file holds {kinds.count(kind)} {kind!r} records")
        if "end" in kinds and kinds.index("end") != len(kinds) - 1:
            out.problems.append("records follow the end record")
        for record in records:
            out._take(record)
        return out

    def _take(self, record: dict) -> None:
        kind = record.get("kind")
        if kind == "collected":
            self.collected = [str(n) for n in record.get("nodes", [])]
            self.errors = [str(n) for n in record.get("errors", [])]
        elif kind == "outcome":
            node = str(record.get("node"))
            if node in self.outcomes or node not in self.collected:
                self.problems.append(f"an outcome for {node} that pytest did not collect once")
            self.outcomes[node] = str(record.get("outcome"))
        elif kind == "integrity":
            self.problems += [f"pytest's {name} was replaced" for name in record.get("patched", [])]
            self.problems += [f"plugin {p} from the repository was registered"
                              for p in record.get("foreign", [])]
        elif kind == "end":
            self.ended, self.exitstatus = True, record.get("exitstatus")
        else:
            self.problems.append(f"a record of unknown kind {kind!r}")

    def passed(self, node: str) -> bool:
        return self.ended and self.outcomes.get(node) in PASSING

    def find(self, name: str) -> str | None:
        """The collected node id of test function `name` (ids depend on the rootdir)."""
        return next((n for n in self.collected if n.split("::")[-1] == name), None)


# ----------------------------------------------------------------------- canaries
@dataclasses.dataclass
class Canaries:
    """Two tests with fresh random names appended to `path` at grading only."""

    path: str
    must_fail: str
    must_pass: str
    source: str


def make_canaries(files: dict[str, str], tests: list[str], cases: dict | None) -> Canaries | None:
    """Canaries for the first test file holding a task test. The must-fail canary makes a
    real call and asserts a random string, written like the file's own tests: with `cases`
    from a case, else as a copy of one of the file's tests with one expected value
    replaced (`mutant_test`). A blanket "everything passes" patch, or a function that
    reads its caller's expected value, makes it pass."""
    path = next((t.split("::")[0] for t in tests if t.split("::")[0] in files), None)
    if path is None or not path.endswith(".py"):
        return None
    text = files[path]
    fresh = lambda stem: next(n for n in (f"test_{stem}_{secrets.randbelow(9000) + 1000}"
                                          for _ in range(100)) if n not in text)
    sentinel = secrets.token_hex(6)
    case = next((cases[t] for t in tests if cases and t.startswith(path + "::")
                 and "returns" in cases[t]), None)
    if case is not None:
        must_fail = fresh(case["call"])
        args = ", ".join(repr(a) for a in ast.literal_eval(case["args"]))
        call = f"{case['module']}.{case['call']}({args})"
        fail_source = (f"def {must_fail}():\n    check({call}, {sentinel!r})\n"
                       if "\ndef check(" in text else
                       f"def {must_fail}():\n    import {case['module']}\n"
                       f"    assert {call} == {sentinel!r}\n")
    else:
        must_fail = fresh(secrets.token_hex(3))
        fail_source = mutant_test(text, must_fail, sentinel) or (
            f"def {must_fail}():\n    assert {sentinel!r} == {secrets.token_hex(6)!r}\n")
    must_pass = fresh(secrets.token_hex(3))
    token = secrets.token_hex(4)
    source = f"\n\n{fail_source}\n\ndef {must_pass}():\n    assert {token!r} == {token!r}\n"
    return Canaries(path, must_fail, must_pass, source)


def mutant_test(text: str, name: str, sentinel: str) -> str | None:
    """A copy of the first plain test function of `text` (top level, no decorators, no
    arguments) named `name`, whose first `assert X == <literal>` or `helper(X, <literal>)`
    statement (directly in its body) expects `sentinel` instead; None if there is none."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test")
                and not fn.decorator_list and not fn.args.args):
            continue
        for stmt in fn.body:
            target = _expected_literal(stmt)
            if target is not None:
                target[0][target[1]] = ast.Constant(sentinel)
                fn.name = name
                return ast.unparse(fn) + "\n"
    return None


def _expected_literal(stmt) -> tuple[list, int] | None:
    """(the list holding the expected literal of `stmt`, its index), if it has one."""
    if (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare)
            and len(stmt.test.ops) == 1 and isinstance(stmt.test.ops[0], ast.Eq)
            and _is_literal(stmt.test.comparators[0])):
        return stmt.test.comparators, 0
    if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and len(stmt.value.args) == 2 and _is_literal(stmt.value.args[1])):
        return stmt.value.args, 1
    return None


def _is_literal(node) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return False
    return True


def canary_problems(records: PytestRecords, canaries: Canaries, returncode) -> list[str]:
    """Why the canaries show tampering (they are checked only when pytest ended)."""
    if not records.ended:
        return []
    problems = []
    for name, want in ((canaries.must_fail, "FAILED"), (canaries.must_pass, "PASSED")):
        node = records.find(name)
        if node is None:
            if not records.errors:
                problems.append(f"a canary test ({want.lower()} expected) was not collected")
        elif records.outcomes.get(node) != want:
            problems.append(f"a canary test that must be {want} was "
                            f"{records.outcomes.get(node, 'not run')}")
    if records.find(canaries.must_fail) is not None and returncode == 0:
        problems.append("pytest exited 0 although a must-fail canary ran")
    return problems


def hide_canaries(text: str, names) -> str:
    """`text` without the canaries' failure sections and summary lines."""
    out, skipping = [], False
    header = re.compile(r"^_{3,} .* _{3,}$")
    for line in text.splitlines():
        if header.match(line) or line.startswith("="):
            skipping = any(name in line for name in names)
        if not skipping and not any(name in line for name in names):
            out.append(line)
    return "\n".join(out)


# -------------------------------------------------------------- out-of-process checks
def case_passes(case: dict, record: dict) -> bool:
    """Whether what the call did (`record`, from the oracle run) is what the case wants."""
    if "raises" in case:
        names = record.get("raises")
        return isinstance(names, list) and case["raises"] in names
    got = record.get("returns")
    if not isinstance(got, str) or len(got) > MAX_LITERAL_CHARS:
        return False
    try:
        value = ast.literal_eval(got)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return _is_plain(value) and value == ast.literal_eval(case["returns"])


def _is_plain(value) -> bool:
    kind = type(value)
    if kind in (int, float, str, bool, type(None)):
        return True
    if kind in (list, tuple):
        return all(_is_plain(v) for v in value)
    if kind is dict:
        return all(_is_plain(k) and _is_plain(v) for k, v in value.items())
    return False


@dataclasses.dataclass
class OracleRun:
    """{node: passed} of the out-of-process checks, and what is wrong with the run."""

    passed: dict[str, bool]
    ended: bool
    problems: list[str]


def parse_oracle(data: bytes, tag: str, nodes: list[str], cases: dict,
                 returncode) -> OracleRun:
    records, foreign = json_lines(data, "tag", tag)
    problems = [f"{foreign} line(s) of the check results were not the grader's"] if foreign else []
    by_id: dict[int, dict] = {}
    ended = False
    for record in records:
        if ended:
            problems.append("check results follow the end record")
        if "end" in record:
            ended = True
            continue
        i = record.get("id")
        if not isinstance(i, int) or not 0 <= i < len(nodes) or i in by_id:
            problems.append(f"a check result for id {i!r} that was asked for not once")
            continue
        by_id[i] = record
    if ended and len(by_id) < len(nodes):
        problems.append(f"the checks ended with {len(nodes) - len(by_id)} result(s) missing")
    if not ended and returncode == 0:
        problems.append("the checks exited 0 before their end record")
    passed = {node: i in by_id and case_passes(cases[node], by_id[i])
              for i, node in enumerate(nodes)}
    return OracleRun(passed, ended, problems)


# -------------------------------------------------------------------------- grader
class Grader:
    """Runs an instance's tests on a working copy inside a sandbox (envs/sandbox.py).

    instance: the normalised instance (envs.code_tasks.load_instance / generate_task);
    its optional `cases` ({node id: {"module", "call", "args", "returns" | "raises"}})
    enable the out-of-process checks.
    """

    def __init__(self, instance: dict):
        self.argv = pytest_argv(instance["test_cmd"])
        self.tests = list(instance["FAIL_TO_PASS"]) + list(instance["PASS_TO_PASS"])
        self.pristine = instance["files"]
        self.protected = set(instance.get("test_files", [])) | runner_files(self.pristine)
        self.cases = instance.get("cases") or None

    def run_tests(self, sandbox, files: dict[str, str]) -> Grade:
        """A feedback run: pytest's recorded outcomes, no canaries, no out-of-process checks."""
        result, records, _ = self._pytest(sandbox, files, None)
        passed = {t: records.passed(t) for t in self.tests}
        return Grade(passed, self._report(passed, result, ()))

    def grade(self, sandbox, files: dict[str, str]) -> Grade:
        """The verdict that decides the reward (see the module docstring)."""
        canaries = None if _deselects(self.argv) else make_canaries(
            self._laid_over(files), self.tests, self.cases)
        oracle = self._oracle(sandbox, files) if self.cases else None
        result, records, reasons = self._pytest(sandbox, files, canaries)
        passed = {t: records.passed(t) for t in self.tests}
        claims = parse_pytest_summary(result.stdout)
        reasons += [f"pytest's output claims {t} {claims[t]} against its records"
                    for t in self.tests if claims.get(t) in PASSING and not passed[t]]
        if canaries is not None:
            reasons += canary_problems(records, canaries, result.returncode)
        if oracle is not None:
            reasons += oracle.problems
            if oracle.ended and records.ended:
                reasons += [f"pytest and the out-of-process check disagree on {t}"
                            for t in self.tests if passed[t] != oracle.passed[t]]
            passed = {t: passed[t] and oracle.passed[t] for t in self.tests}
        if reasons:
            passed = dict.fromkeys(self.tests, False)
        names = (canaries.must_fail, canaries.must_pass) if canaries else ()
        report = self._report(passed, result, names)
        if reasons:
            report = "The grading run was tampered with; every test counts as failed.\n" + report
        return Grade(passed, report, tampered=bool(reasons), reasons=reasons)

    # ------------------------------------------------------------------------ runs
    def _laid_over(self, files: dict[str, str]) -> dict[str, str]:
        return {**files, **{p: self.pristine[p] for p in self.protected if p in self.pristine}}

    def _pytest(self, sandbox, files, canaries: Canaries | None):
        """(RunResult, PytestRecords, tamper reasons) of one pytest run with the plugin."""
        nonce, module = secrets.token_hex(16), f"_jaxrl_grade_{secrets.token_hex(6)}"
        results = f".{secrets.token_hex(8)}.jsonl"
        run_files = self._laid_over(files)
        if canaries is not None:
            run_files[canaries.path] = run_files[canaries.path].rstrip("\n") + canaries.source
        checked = {p: run_files[p] for p in self.protected if p in run_files}
        if canaries is not None:
            checked[canaries.path] = run_files[canaries.path]
        setup = {"nonce": nonce, "results": results,
                 "allowed": sorted(self.protected | {f"{module}.py"})}
        run_files[f"{module}.py"] = _PLUGIN_SOURCE.read_text(encoding="utf-8")
        run_files[f"{module}.json"] = json.dumps(setup)
        argv = [*self.argv[:3], "-p", module, "--continue-on-collection-errors", *self.argv[3:]]
        if canaries is not None and any("::" in a for a in self.argv[3:]):  # node ids given
            argv += [f"{canaries.path}::{name}" for name in (canaries.must_fail,
                                                             canaries.must_pass)]
        workdir = sandbox.fresh_dir(run_files, name="grade")
        try:
            result = sandbox.run(argv, cwd=workdir)
            records = PytestRecords.parse(read_private_file(os.path.join(workdir, results)), nonce)
            reasons = run_traces(workdir, checked) + records.problems
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if not records.ended and result.returncode == 0:
            reasons.append("pytest exited 0 before the grader's end record")
        if records.ended and result.returncode == 0 != records.exitstatus:
            reasons.append(f"pytest exited 0, not with the status it recorded "
                           f"({records.exitstatus})")
        return result, records, reasons

    def _oracle(self, sandbox, files) -> OracleRun:
        """The out-of-process checks, in a directory without the test files."""
        tag, module = secrets.token_hex(16), f"_jaxrl_oracle_{secrets.token_hex(6)}"
        results = f".{secrets.token_hex(8)}.jsonl"
        calls = [{"id": i, **{k: self.cases[t][k] for k in ("module", "call", "args")}}
                 for i, t in enumerate(self.tests)]
        run_files = {p: text for p, text in files.items() if p not in self.protected}
        run_files[f"{module}.py"] = _ORACLE_SOURCE.read_text(encoding="utf-8")
        run_files[f"{module}.json"] = json.dumps({"tag": tag, "results": results,
                                                  "cases": calls})
        workdir = sandbox.fresh_dir(run_files, name="oracle")
        try:
            result = sandbox.run([sys.executable, "-I", f"{module}.py", f"{module}.json"],
                                 cwd=workdir)
            data = read_private_file(os.path.join(workdir, results))
            traces = run_traces(workdir, {})
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        run = parse_oracle(data, tag, self.tests, self.cases, result.returncode)
        run.problems += traces
        return run

    # ---------------------------------------------------------------------- report
    def _report(self, passed: dict[str, bool], result, hidden) -> str:
        n_pass = sum(passed.values())
        status = "timed out" if result.timed_out else (result.error or f"exit {result.returncode}")
        lines = [f"{n_pass}/{len(passed)} task tests pass (pytest: {status})."]
        lines += [f"  FAIL {t}" for t, ok in passed.items() if not ok]
        report = "\n".join(lines)
        room = MAX_FEEDBACK_CHARS - len(report) - 40
        if room > 200 and n_pass < len(passed):
            shown = hide_canaries(failure_text(result), hidden)
            report += "\n--- pytest output ---\n" + shown[:room]
        return report


def _deselects(argv: list[str]) -> bool:
    """Whether the test command selects tests by keyword or marker (`-k`, `-m`), which
    could leave the canaries out: such instances are graded without canaries."""
    return any(a in ("-k", "-m") or (a[:2] in ("-k", "-m") and not a.startswith("--"))
               for a in argv[3:])


def failure_text(result) -> str:
    """The part of a pytest run worth showing: up to the passes / summary sections."""
    text = result.output
    for marker in ("= PASSES =", "= short test summary info ="):
        cut = text.find(marker)
        if cut > 0:
            text = text[:text.rfind("\n", 0, cut) + 1]
    return text.strip()
