"""From a sweep file to its runs: the spec checked and expanded, each run named and
given the arguments jaxrl-train will get, every run's config loaded once to check it.

`grid` (dotted key -> list of values) expands to the cartesian product, in the order the
keys are written; `runs` (a list of override dicts) lists the runs one by one instead. A
run is named after its overrides (`rl.learning_rate=0.0003,seed=1`, made safe for a file
name) unless its dict gives a "name". Every run is checked with the project's own
loader (`load_config`) before anything starts, so an unknown key or a bad value stops the
whole sweep with a message naming it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import os
import re
from collections.abc import Mapping, Sequence

from jaxrl_agents.config import ConfigError, load_config, split_config_args
from jaxrl_agents.run_records import SUMMARY_FILE

SWEEP_KEYS = ("name", "config", "overrides", "grid", "runs", "report_task")
# Keys the sweep itself sets on every run; a sweep file may not override them.
RESERVED_KEYS = ("output_dir", "name")
MAX_NAME_LEN = 120  # longer derived run names are cut and given a hash suffix


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
    report_task: str | None = None  # compare runs on this task's scores (see report.py)


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
    """<root>/<sweep>/<run>: where jaxrl-train writes the run (see `train_args`)."""
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
