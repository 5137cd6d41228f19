"""Running a sweep's runs locally, or saying how to run them elsewhere.

`run_sweep` launches `jaxrl-train` for each run (one at a time or N in parallel), skips
runs that finished (their summary.json exists), resumes unfinished runs that have
checkpoints, and keeps going when one fails. `existing_results` reports the runs on disk
without running anything (`--report`); `command_lines` and `plan_lines` print what would
run (`--print-commands`, `--dry-run`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from jaxrl_agents.run_records import CHECKPOINT_DIR, SUMMARY_FILE
from jaxrl_agents.sweep.expand import Run, Sweep, run_dir, train_args

LOG_FILE = "train.log"
TRAIN_MODULE = "jaxrl_agents.cli"  # `python -m jaxrl_agents.cli` is jaxrl-train


def is_finished(path: str) -> bool:
    """True when the run at `path` wrote its summary.json, which it does last."""
    return os.path.isfile(os.path.join(path, SUMMARY_FILE))


def has_checkpoint(path: str) -> bool:
    """True when run_dir/checkpoints holds a complete step (a directory named by digits)."""
    ckpt = os.path.join(path, CHECKPOINT_DIR)
    return os.path.isdir(ckpt) and any(p.isdigit() for p in os.listdir(ckpt))


def planned_action(path: str) -> str:
    """What a local sweep does with a run directory: skip (it finished), resume (it has
    checkpoints) or start."""
    if is_finished(path):
        return "skip"
    return "resume" if has_checkpoint(path) else "start"


def run_logged(cmd: Sequence[str], log_path: str) -> int:
    """Runs `cmd` with stdout and stderr appended to `log_path`; returns its exit code."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode


def run_sweep(
    sweep: Sweep,
    root: str,
    *,
    parallel: int = 1,
    train_cmd: Sequence[str] = (sys.executable, "-m", TRAIN_MODULE),
    echo: Callable[[str], None] = print,
) -> list[dict]:
    """Runs every unfinished run; returns one result dict per run, in sweep order.

    A result holds name, run_dir, log, action (skip / start / resume), status (skipped /
    done / failed), exit_code and seconds. A failed run does not stop the others.
    """
    total = len(sweep.runs)

    def one(index: int, run: Run) -> dict:
        path = run_dir(root, sweep, run)
        action = planned_action(path)
        result = {"name": run.name, "run_dir": path, "log": os.path.join(path, LOG_FILE)}
        result.update(action=action, exit_code=None, seconds=0.0)
        tag = f"[{index + 1}/{total}] {run.name}"
        if action == "skip":
            echo(f"{tag}: finished before, skipped")
            return {**result, "status": "skipped"}
        cmd = [*train_cmd, *train_args(sweep, run, root)]
        if action == "resume":
            cmd.append("--resume")
        echo(f"{tag}: {'resuming' if action == 'resume' else 'starting'} (log {result['log']})")
        start = time.monotonic()
        code = run_logged(cmd, result["log"])
        result.update(exit_code=code, seconds=round(time.monotonic() - start, 1))
        if code == 0 and is_finished(path):
            echo(f"{tag}: done in {result['seconds']:.0f}s")
            return {**result, "status": "done"}
        why = f"exit code {code}" if code else "no summary.json written"
        echo(f"{tag}: FAILED ({why}); log: {result['log']}")
        return {**result, "status": "failed"}

    pool = ThreadPoolExecutor(max_workers=max(int(parallel), 1))
    try:
        futures = [pool.submit(one, i, run) for i, run in enumerate(sweep.runs)]
        return [f.result() for f in futures]
    finally:  # on Ctrl-C, start no further runs
        pool.shutdown(wait=True, cancel_futures=True)


def existing_results(sweep: Sweep, root: str) -> list[dict]:
    """Result dicts (as `run_sweep` returns) for the runs already on disk, running none:
    status "done" for a finished run, "unfinished" for one with only checkpoints, and
    "missing" otherwise. For sweeps run elsewhere (e.g. from --print-commands)."""
    results = []
    for run in sweep.runs:
        path = run_dir(root, sweep, run)
        status = {"skip": "done", "resume": "unfinished", "start": "missing"}[planned_action(path)]
        results.append({"name": run.name, "run_dir": path, "log": os.path.join(path, LOG_FILE),
                        "action": "report", "status": status, "exit_code": None, "seconds": 0.0})
    return results


def command_lines(sweep: Sweep, root: str, program: str = "jaxrl-train") -> list[str]:
    """One shell line per run, for launching the sweep elsewhere (e.g. a cluster)."""
    return [shlex.join([program, *train_args(sweep, run, root)]) for run in sweep.runs]


def plan_lines(sweep: Sweep, root: str) -> list[str]:
    """What a local run would do, one line per run: `start|resume|skip  RUN_DIR`."""
    return [
        f"{planned_action(run_dir(root, sweep, run)):<6}  {run_dir(root, sweep, run)}"
        for run in sweep.runs
    ]
