"""Sweeps: one base config, many runs that differ by a few overrides.

A sweep file (configs/sweeps/*.py) defines `get_sweep()` returning a plain dict:

    def get_sweep():
        return {
            "name": "toy_lr",                       # runs go to <output_dir>/toy_lr/<run>/
            "config": "configs/toy_tiny.py",        # the base config
            "overrides": {"rl.epochs": 2},          # optional: set in every run
            "grid": {"rl.learning_rate": [3e-4, 1e-3], "seed": [0, 1]},
            "report_task": "toy:count-2",           # optional: see below
        }

`grid` (dotted key -> list of values) expands to the cartesian product, in the order the
keys are written; `runs` (a list of override dicts) lists the runs one by one instead. A
run is named after its overrides (`rl.learning_rate=0.0003,seed=1`, made safe for a file
name) unless its dict gives a "name". Every run is checked with the project's own
loader (`load_config`) before anything starts, so an unknown key or a bad value stops the
whole sweep with a message naming it.

Locally, `run_sweep` launches `jaxrl-train` for each run (one at a time or N in
parallel), skips runs that finished (their summary.json exists), resumes unfinished runs
that have checkpoints, and keeps going when one fails; `summarize` / `format_table`
/ `plot_summary` report held-out success after SFT and after RL for every run;
`existing_results` reports the runs on disk without running anything (`--report`).
Runs evaluated on several tasks (a curriculum's stages) also hold per-task scores; with
`report_task` the table and chart compare the runs on that task's entries ("sft:<task>",
"rl:<task>"), falling back to a run's overall score where it played only that task.
`over_seeds` groups the runs into arms by name without their seed and gives each arm's
mean over seeds, RL's gain over SFT and two arms' difference, paired by seed, with t
intervals over the seeds (`jaxrl_agents/seed_stats.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from jaxrl_agents import stats as seed_stats
from jaxrl_agents.config import ConfigError, load_config, split_config_args
from jaxrl_agents.run_records import CHECKPOINT_DIR, EVAL_FILE, SUMMARY_FILE, write_json_atomic

SWEEP_KEYS = ("name", "config", "overrides", "grid", "runs", "report_task")
# Keys the sweep itself sets on every run; a sweep file may not override them.
RESERVED_KEYS = ("output_dir", "name")
MAX_NAME_LEN = 120  # longer derived run names are cut and given a hash suffix
PLOT_FILE = "success.png"  # the sweep's bar chart, beside its summary.json
LOG_FILE = "train.log"
STAGES = ("sft", "rl")  # the two held-out evaluations of a run: after SFT, after RL
TRAIN_MODULE = "jaxrl_agents.cli"  # `python -m jaxrl_agents.cli` is jaxrl-train


class SweepError(ConfigError):
    """A sweep file is malformed or one of its runs has a bad config; names the culprit."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep: its name and the overrides it adds to the base config."""

    name: str
    overrides: dict  # dotted key -> value; includes the sweep's common overrides


@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    config: str  # path of the base config file
    runs: tuple[Run, ...]
    report_task: str | None = None  # compare runs on this task's scores (see the docstring)


# --- pure: names, overrides, expansion ---------------------------------------------------


def format_value(value) -> str:
    """A value as the text `--config.key=TEXT` parses back to it (see config._parse_value)."""
    if isinstance(value, str):
        return value
    return repr(tuple(value) if isinstance(value, list) else value)


def _short_value(value) -> str:
    """A value as it reads in a run name; floats in their shortest exact form (1e-4, 0.5),
    sequences joined by '_'."""
    if isinstance(value, tuple | list):
        return "_".join(_short_value(v) for v in value)
    if not isinstance(value, float) or value != value or value in (float("inf"), float("-inf")):
        return format_value(value)
    digits = next(p for p in range(17) if float(f"{value:.{p}e}") == value)
    mantissa, exponent = f"{value:.{digits}e}".split("e")
    scientific = f"{mantissa}e{int(exponent)}"
    return min(repr(value), scientific, key=len)


def safe_name(text: str) -> str:
    """`text` with every run of characters unsafe in a file name replaced by one '_'."""
    safe = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", text).strip("_")
    if safe in ("", ".", ".."):
        raise SweepError(f"{text!r} does not give a usable file name")
    return safe


def run_name(overrides: Mapping) -> str:
    """A readable, file-safe name from overrides: `rl.learning_rate=1e-4,seed=1`.

    Names longer than MAX_NAME_LEN are cut and end in a hash of the full name, so two
    different long names stay different.
    """
    name = safe_name(",".join(f"{k}={_short_value(v)}" for k, v in overrides.items()))
    if len(name) > MAX_NAME_LEN:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME_LEN - 9]}-{digest}"
    return name


def expand_grid(grid: Mapping[str, Sequence]) -> list[dict]:
    """The cartesian product of a grid, keys in their written order, last key fastest.

    {"a": [1, 2], "b": ["x", "y"]} -> [{a: 1, b: x}, {a: 1, b: y}, {a: 2, b: x}, {a: 2, b: y}]
    """
    for key, values in grid.items():
        if isinstance(values, str) or not isinstance(values, Sequence) or not values:
            raise SweepError(f"grid key {key!r} needs a non-empty list of values; got {values!r}")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*grid.values())]


def _check_keys(where: str, overrides: Mapping, allowed_reserved: Sequence[str] = ()) -> None:
    for key in overrides:
        if not isinstance(key, str) or not key:
            raise SweepError(f"{where}: config keys are dotted strings; got {key!r}")
        if key in RESERVED_KEYS and key not in allowed_reserved:
            raise SweepError(f"{where}: {key!r} is set by the sweep itself; remove it")


def build_sweep(spec: Mapping) -> Sweep:
    """Checks a `get_sweep()` dict and expands it into named runs (pure; no config loaded)."""
    if not isinstance(spec, Mapping):
        raise SweepError(f"get_sweep() must return a dict; got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(SWEEP_KEYS))
    if unknown:
        raise SweepError(f"unknown sweep key(s) {unknown}; valid: {list(SWEEP_KEYS)}")
    for key in ("name", "config"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise SweepError(f"sweep key {key!r} must be a non-empty string")
    report_task = spec.get("report_task")
    if report_task is not None and (not isinstance(report_task, str) or not report_task):
        raise SweepError(f"sweep key 'report_task' must be a task name; got {report_task!r}")
    if safe_name(spec["name"]) != spec["name"]:
        raise SweepError(f"sweep name {spec['name']!r} is not file-safe; use [A-Za-z0-9._=,+-]")
    if ("grid" in spec) == ("runs" in spec):
        raise SweepError("a sweep needs exactly one of 'grid' (dict of lists) or 'runs' (list)")
    common = spec.get("overrides", {})
    if not isinstance(common, Mapping):
        raise SweepError("sweep 'overrides' must be a dict: dotted key -> value")
    _check_keys("sweep overrides", common)
    if "grid" in spec:
        if not isinstance(spec["grid"], Mapping) or not spec["grid"]:
            raise SweepError("sweep 'grid' must be a non-empty dict: dotted key -> list of values")
        _check_keys("sweep grid", spec["grid"])
        entries = expand_grid(spec["grid"])
    else:
        entries = spec["runs"]
        if isinstance(entries, str | Mapping) or not isinstance(entries, Sequence) or not entries:
            raise SweepError("sweep 'runs' must be a non-empty list of override dicts")
    runs, seen = [], set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise SweepError(f"sweep run {i} must be a dict of overrides; got {entry!r}")
        _check_keys(f"sweep run {i}", entry, allowed_reserved=("name",))
        own = {k: v for k, v in entry.items() if k != "name"}
        if "name" in entry:
            name = entry["name"]
            if not isinstance(name, str) or safe_name(name) != name:
                raise SweepError(f"sweep run {i}: name {name!r} is not file-safe")
        else:
            name = run_name(own) if own else f"run{i}"
        if name == SUMMARY_FILE:
            raise SweepError(f"sweep run {i}: {name!r} is the sweep's own summary file")
        if name in seen:
            raise SweepError(f"two runs are named {name!r}; give the runs distinct 'name's")
        seen.add(name)
        runs.append(Run(name=name, overrides={**common, **own}))
    return Sweep(name=spec["name"], config=spec["config"], runs=tuple(runs),
                 report_task=report_task)


def run_dir(root: str, sweep: Sweep, run: Run) -> str:
    return os.path.join(root, sweep.name, run.name)


def train_args(sweep: Sweep, run: Run, root: str) -> list[str]:
    """jaxrl-train's arguments for one run (without the program name)."""
    args = ["--config", sweep.config]
    args += [f"--config.{k}={format_value(v)}" for k, v in run.overrides.items()]
    args += [f"--config.output_dir={os.path.join(root, sweep.name)}", f"--config.name={run.name}"]
    return args


# --- loading and validating --------------------------------------------------------------


def load_sweep(path: str) -> Sweep:
    """Imports a sweep file and expands its `get_sweep()`."""
    if not os.path.isfile(path):
        raise SweepError(f"sweep file not found: {path!r}")
    spec = importlib.util.spec_from_file_location(f"_jaxrl_sweep_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_sweep"):
        raise SweepError(f"sweep file {path!r} has no get_sweep() function")
    try:
        return build_sweep(module.get_sweep())
    except SweepError as err:
        raise SweepError(f"{path}: {err}") from None


def validate(sweep: Sweep, root: str) -> None:
    """Loads every run's config exactly as jaxrl-train will; the first error is raised
    as a SweepError naming the run and the key."""
    for run in sweep.runs:
        _, overrides, _ = split_config_args(train_args(sweep, run, root))
        try:
            load_config(sweep.config, overrides)
        except ConfigError as err:
            raise SweepError(f"sweep {sweep.name!r}, run {run.name!r}: {err}") from None


def default_root(sweep: Sweep) -> str:
    """The base config's output_dir (a sweep may not override it)."""
    return load_config(sweep.config).output_dir


# --- running ---------------------------------------------------------------------------------


def is_finished(path: str) -> bool:
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


def launch(cmd: Sequence[str], log_path: str) -> int:
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
        code = launch(cmd, result["log"])
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


# --- reporting -------------------------------------------------------------------------------


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def has_score(row: Mapping) -> bool:
    """Whether a summary row holds a held-out score after SFT or after RL."""
    return any(row.get(stage) for stage in STAGES)


def run_scores(path: str) -> dict:
    """{"sft": {...}, "rl": {...}}: held-out success (mean, ci_low, ci_high, n) of a run,
    from its eval.json, else its summary.json; a stage without one is left out. A run
    evaluated on several tasks also has eval.json's "sft:<task>" and "rl:<task>"."""
    evals = _read_json(os.path.join(path, EVAL_FILE))
    summary = _read_json(os.path.join(path, SUMMARY_FILE))
    found = {stage: evals.get(stage) or summary.get(stage) or {} for stage in STAGES}
    found.update({k: v for k, v in evals.items() if k.startswith(("sft:", "rl:"))})
    return {
        stage: {k: result.get(k) for k in ("mean", "ci_low", "ci_high", "n", "per_game")
                if k != "per_game" or result.get(k)}
        for stage, result in found.items()
        if result.get("mean") is not None
    }


def paired_game_lines(summary: Mapping) -> list[str]:
    """Per run whose eval.json kept each game's outcome: RL minus SFT on the games both
    played, with McNemar's exact test (`seed_stats.paired_games`)."""
    lines = []
    for row in summary["runs"]:
        sft, rl = row.get("sft") or {}, row.get("rl") or {}
        pair = seed_stats.paired_games(sft.get("per_game") or {}, rl.get("per_game") or {})
        if pair:
            lines.append(f"{row['name']}: {seed_stats.format_paired_games(pair, 'sft', 'rl')}")
    return lines


def summarize(sweep: Sweep, results: Sequence[dict]) -> dict:
    """The sweep's summary.json: the sweep, and per run its result, overrides and scores."""
    by_name = {run.name: run for run in sweep.runs}
    rows = [
        {**r, "overrides": by_name[r["name"]].overrides, **run_scores(r["run_dir"])}
        for r in results
    ]
    return {"sweep": sweep.name, "config": sweep.config, "report_task": sweep.report_task,
            "runs": rows}


def load_earlier(path: str, sweep: Sweep) -> dict:
    """Another summary.json of `sweep` (e.g. one kept in the repository from runs made on
    other machines); a SweepError if it cannot be read or is of another sweep."""
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, ValueError) as err:
        raise SweepError(f"cannot read the earlier summary {path}: {err}") from None
    if not isinstance(earlier, dict) or earlier.get("sweep") != sweep.name:
        found = earlier.get("sweep") if isinstance(earlier, dict) else None
        raise SweepError(f"{path} is a summary of sweep {found!r}, not {sweep.name!r}")
    return earlier


def with_earlier_runs(summary: Mapping, earlier: Mapping) -> dict:
    """`summary` with each run that has no score here (no run directory, or an unfinished
    one) taken from `earlier` (see `load_earlier`) when it has one there, marked status
    "earlier". Runs the sweep no longer lists are not taken."""
    kept = {r["name"]: r for r in earlier.get("runs", ()) if has_score(r)}
    rows = []
    for row in summary["runs"]:
        if not has_score(row) and row["name"] in kept:
            row = {**kept[row["name"]], "status": "earlier"}
        rows.append(row)
    return {**summary, "runs": rows}


def reported_score(row: Mapping, stage: str, task: str | None) -> dict | None:
    """A summary row's score for `stage` ("sft" / "rl"): its "<stage>:<task>" entry when
    `task` is set and the run played several tasks, else its overall score."""
    return (task and row.get(f"{stage}:{task}")) or row.get(stage)


def over_seeds(summary: Mapping) -> dict:
    """The runs grouped into arms by name without their seed (`seed_stats.split_seed`):
    {"arms": {arm: {stage: mean over seeds with a t interval and "per_seed"}},
     "rl_gain": {arm: RL minus SFT, paired by seed},
     "difference": {"first", "second", stage: second arm minus first, paired by seed}};
    "difference" only when there are exactly two arms. Scores as in the table (on
    `report_task` where set)."""
    task = summary.get("report_task")
    per_stage = {}
    for stage in STAGES:
        scores = {}
        for row in summary["runs"]:
            score = reported_score(row, stage, task)
            if score:
                scores[row["name"]] = score["mean"]
        per_stage[stage] = seed_stats.by_arm(scores)
    names = dict.fromkeys(seed_stats.split_seed(r["name"])[0] for r in summary["runs"])
    arms = [a for a in names if any(a in per_stage[s] for s in STAGES)]
    result = {"arms": {}, "rl_gain": {}}
    for arm in arms:
        result["arms"][arm] = {
            stage: {**seed_stats.t_interval(seeds.values()), "per_seed": seeds}
            for stage in STAGES
            if (seeds := per_stage[stage].get(arm))
        }
        gain = seed_stats.paired_difference(per_stage["rl"].get(arm, {}),
                                            per_stage["sft"].get(arm, {}))
        if gain:
            result["rl_gain"][arm] = gain
    if len(arms) == 2:
        first, second = arms
        result["difference"] = {"first": first, "second": second}
        for stage in STAGES:
            diff = seed_stats.paired_difference(per_stage[stage].get(second, {}),
                                                per_stage[stage].get(first, {}))
            if diff:
                result["difference"][stage] = diff
    return result


def _interval_text(result: dict | None, signed: bool = False) -> str:
    if not result:
        return "-"
    sign = "+" if signed else ""
    text = f"{result['mean']:{sign}.3f}"
    if result["ci_low"] is None:
        return f"{text} (1 seed)"
    return (f"{text} ({result['ci_low']:{sign}.3f} to {result['ci_high']:{sign}.3f}, "
            f"{result['seeds']} seeds)")


def format_seed_table(seeds: Mapping) -> str:
    """Per arm: the mean over seeds after SFT and after RL, RL's paired gain over SFT
    (each with a 95% t interval over seeds), then two arms' paired difference."""
    header = ("arm", "after SFT, over seeds (95% t)", "after RL, over seeds (95% t)",
              "RL - SFT, paired (95% t)")
    rows = [header]
    for arm, stages in seeds["arms"].items():
        rows.append((arm, _interval_text(stages.get("sft")), _interval_text(stages.get("rl")),
                     _interval_text(seeds["rl_gain"].get(arm), signed=True)))
    lines = _aligned(rows)
    diff = seeds.get("difference")
    if diff:
        for stage in STAGES:
            if stage in diff:
                lines.append(f"{diff['second']} - {diff['first']} after {stage.upper()}, "
                             f"paired by seed: {_interval_text(diff[stage], signed=True)}")
    return "\n".join(lines)


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Table rows as lines, each column padded to its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _score_text(score: dict | None) -> str:
    if not score:
        return "-"
    return f"{score['mean']:.3f} ({score['ci_low']:.3f}-{score['ci_high']:.3f}, n={score['n']})"


def format_table(summary: Mapping) -> str:
    """One line per run: name, status, held-out success after SFT and after RL (95% CI)."""
    task = summary.get("report_task")
    on = f" on {task}" if task else ""
    header = ("run", "status", f"success after SFT{on} (95% CI)", f"success after RL{on} (95% CI)")
    rows = [header]
    for r in summary["runs"]:
        status = r["status"] if r["status"] != "failed" else f"failed ({r['exit_code']})"
        rows.append((r["name"], status, _score_text(reported_score(r, "sft", task)),
                     _score_text(reported_score(r, "rl", task))))
    return "\n".join(_aligned(rows))


_BAR_WIDTH = 0.38
_STAGE_BARS = ((-_BAR_WIDTH / 2, "sft", "#9ab"), (_BAR_WIDTH / 2, "rl", "#357"))


def _stage_bars(ax, labels: Sequence[str], score_of: Callable) -> None:
    """Bars of `score_of(i, stage)` (mean, ci_low, ci_high; None to leave one out) after
    SFT and after RL for each label, the interval as an error bar where there is one,
    and the values of "per_seed" as dots on the bar."""
    for offset, stage, color in _STAGE_BARS:
        xs, means, errs = [], [], [[], []]
        for i in range(len(labels)):
            score = score_of(i, stage)
            if not score:
                continue
            xs.append(i + offset)
            means.append(score["mean"])
            has_ci = score.get("ci_low") is not None
            errs[0].append(score["mean"] - score["ci_low"] if has_ci else 0.0)
            errs[1].append(score["ci_high"] - score["mean"] if has_ci else 0.0)
            seeds = list(score.get("per_seed", {}).values())
            ax.plot([i + offset] * len(seeds), seeds, "o", color="#222", markersize=3, zorder=3)
        ax.bar(xs, means, _BAR_WIDTH, yerr=errs, capsize=3, color=color,
               label=f"after {stage.upper()}")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)


def plot_summary(summary: Mapping, path: str) -> str | None:
    """Bar chart of held-out success after SFT and after RL per run (on the sweep's
    `report_task` where set), 95% CIs over games as error bars; beside it, when an arm
    has two seeds or more (`over_seeds`), each arm's mean over seeds with its 95% t
    interval and one dot per seed. Written to `path` (PNG); None when no run has a score."""
    task = summary.get("report_task")
    runs = [r for r in summary["runs"] if has_score(r)]
    if not runs:
        return None
    arms = summary.get("over_seeds", {}).get("arms", {})
    seeded = any(score["seeds"] > 1 for stages in arms.values() for score in stages.values())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = [1.6 * len(runs) + 1.5] + ([1.6 * len(arms) + 1.5] if seeded else [])
    fig, axes = plt.subplots(1, len(widths), figsize=(max(4.0, sum(widths)), 3.6),
                             width_ratios=widths, squeeze=False)
    ax = axes[0][0]
    _stage_bars(ax, [r["name"] for r in runs], lambda i, st: reported_score(runs[i], st, task))
    ax.set_ylabel(f"held-out success{f' on {task}' if task else ''}", fontsize=9)
    ax.set_title(f"{summary['sweep']}: each run (95% CI over games)", fontsize=10)
    ax.legend(fontsize=8)
    if seeded:
        names = list(arms)
        ax = axes[0][1]
        _stage_bars(ax, names, lambda i, st: arms[names[i]].get(st))
        ax.set_title("each arm over its seeds (95% t interval, dots: seeds)", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_summary(summary: Mapping, root: str) -> str:
    """Writes <root>/<sweep>/summary.json; returns its path."""
    path = os.path.join(root, summary["sweep"], SUMMARY_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, summary)
    return path


def command_lines(sweep: Sweep, root: str, program: str = "jaxrl-train") -> list[str]:
    """One shell line per run, for launching the sweep elsewhere (e.g. a cluster)."""
    return [shlex.join([program, *train_args(sweep, run, root)]) for run in sweep.runs]


def plan_lines(sweep: Sweep, root: str) -> list[str]:
    """What a local run would do, one line per run: `start|resume|skip  RUN_DIR`."""
    return [
        f"{planned_action(run_dir(root, sweep, run)):<6}  {run_dir(root, sweep, run)}"
        for run in sweep.runs
    ]
