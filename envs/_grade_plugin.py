"""The grader's pytest plugin (see envs/grader.py), copied into each grading run under a
random module name and loaded with `-p` before any of the repository's code is imported.

It records what pytest itself observed (the collected node ids, one outcome per node, the
collection errors) and two integrity facts: which of pytest's reporting functions were
replaced after start-up, and which registered plugins come from the repository's own
(non-pristine) files. At session end it appends JSON lines tagged with the run's nonce to a
results file named by the parent, then a closing "end" record.

This is evidence, not proof: code running in this process can read the nonce from memory
and write forged lines. The parent therefore never trusts these records alone where the
task allows better (the out-of-process checks of envs/_grade_oracle.py), and treats any
inconsistency (a passing must-fail canary, duplicate records, exit 0 before the end record)
as tampering. The setup file (nonce, results path) and this file are deleted at import, so
neither stays on disk for the repository's code to read.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys

# Functions whose replacement changes what pytest reports; none is patched by honest code.
WATCHED = (
    ("_pytest.reports", "TestReport", "from_item_and_call"),
    ("_pytest.reports", "BaseReport", "passed"),
    ("_pytest.reports", "BaseReport", "failed"),
    ("_pytest.runner", None, "call_and_report"),
    ("_pytest.runner", None, "call_runtest_hook"),
    ("_pytest.runner", None, "runtestprotocol"),
    ("_pytest.runner", None, "pytest_runtest_makereport"),
    ("_pytest.runner", "CallInfo", "from_call"),
    ("_pytest.python", "Function", "runtest"),
    ("_pytest.python", None, "pytest_pyfunc_call"),
    ("_pytest.terminal", "TerminalReporter", "pytest_runtest_logreport"),
    ("_pytest.terminal", "TerminalReporter", "short_test_summary"),
    ("pytest", None, "raises"),
)


def _watched_value(module: str, owner: str | None, name: str):
    """The raw attribute (descriptor included), or None when it is missing."""
    try:
        obj = importlib.import_module(module)
        if owner is not None:
            obj = getattr(obj, owner)
        return inspect.getattr_static(obj, name)
    except (ImportError, AttributeError):
        return None


def _read_setup() -> dict:
    """Reads and deletes `<this module>.json`, then deletes this file too."""
    base = os.path.splitext(os.path.abspath(__file__))[0]
    with open(base + ".json", encoding="utf-8") as f:
        setup = json.load(f)
    for path in (base + ".json", base + ".py"):
        os.remove(path)
    return setup


class _Recorder:
    def __init__(self, setup: dict):
        self.nonce = setup["nonce"]
        self.allowed = set(setup["allowed"])
        self.root = os.getcwd()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
        self.fd = os.open(setup["results"], flags, 0o600)
        self.originals = {spec: _watched_value(*spec) for spec in WATCHED}
        self.collected: list[str] = []
        self.collect_errors: list[str] = []
        self.outcomes: dict[str, str] = {}

    def write(self, kind: str, **fields) -> None:
        line = json.dumps({"nonce": self.nonce, "kind": kind, **fields}) + "\n"
        os.write(self.fd, line.encode())

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.collect_errors.append(report.nodeid)

    def pytest_collection_finish(self, session) -> None:
        self.collected = [item.nodeid for item in session.items]

    def pytest_runtest_logreport(self, report) -> None:
        """One outcome per node, named as in pytest's `-rA` summary."""
        xfail = hasattr(report, "wasxfail")
        if report.when == "setup" and report.outcome != "passed":
            outcome = "ERROR" if report.outcome == "failed" else ("XFAIL" if xfail else "SKIPPED")
        elif report.when == "call":
            outcome = {"passed": "XPASS" if xfail else "PASSED", "failed": "FAILED",
                       "skipped": "XFAIL" if xfail else "SKIPPED"}[report.outcome]
        elif report.when == "teardown" and report.outcome == "failed":
            outcome = "ERROR"
        else:
            return
        if report.when == "teardown" or report.nodeid not in self.outcomes:
            self.outcomes[report.nodeid] = outcome

    def _patched(self) -> list[str]:
        return [".".join(p for p in spec if p) for spec in WATCHED
                if _watched_value(*spec) is not self.originals[spec]]

    def _foreign_plugins(self, config) -> list[str]:
        """Registered plugins defined in files of the run directory that are not pristine."""
        out = []
        for name, plugin in config.pluginmanager.list_name_plugin():
            module = plugin if inspect.ismodule(plugin) else sys.modules.get(
                getattr(type(plugin), "__module__", ""))
            path = getattr(module, "__file__", None)
            if not path:
                continue
            rel = os.path.relpath(os.path.realpath(path), self.root)
            if not rel.startswith("..") and rel not in self.allowed:
                out.append(f"{name} ({rel})")
        return out

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        self.write("collected", nodes=self.collected, errors=self.collect_errors)
        for node, outcome in self.outcomes.items():
            self.write("outcome", node=node, outcome=outcome)
        self.write("integrity", patched=self._patched(),
                   foreign=self._foreign_plugins(session.config))
        self.write("end", exitstatus=int(exitstatus))


_RECORDER = _Recorder(_read_setup())


def pytest_configure(config) -> None:
    config.pluginmanager.register(_RECORDER, "jaxrl-grade-recorder")
