"""The metrics logger of a run: metrics.jsonl, TensorBoard, a progress bar, config.json,
eval.json and the evaluated games, eval_episodes/ (the files and their names are
`run_records.py`; the PNG curves `plots.py`; success intervals such as `success_ci` are `stats.py`).

    with RunLogger(run_dir, total=num_updates, resume_step=start) as log:
        log.save_config(cfg)
        for step in range(start + 1, num_updates + 1):
            log.log(step, {"charts/success": 0.4, "losses/kl": 0.01, ...})
        log.write_eval("rl", success_ci(successes))
        log.plot()

Metric names are grouped by prefix (`run_records.metric_group`). Only the main JAX
process writes: with `is_main=False` every method is a no-op, so all processes can call
the same code.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import time
from collections.abc import Mapping, Sequence

import numpy as np

from jaxrl_agents.data.dump import write_summaries
from jaxrl_agents.plots import plot_metrics
from jaxrl_agents.run_records import (
    CONFIG_FILE,
    EVAL_EPISODES_DIR,
    EVAL_FILE,
    METRICS_FILE,
    WALL_TIME,
    metric_group,
    truncate_metrics,
    write_json_atomic,
)

# Progress-bar postfix: short label -> the metric it shows. A metric matches when its
# name equals the target or ends with "/" + target (so "success" finds "charts/success").
DEFAULT_POSTFIX = {
    "succ": "success",
    "ret": "return_mean",
    "kl": "kl",
    "ent": "entropy",
    "tok/s": "tokens_per_s",
}


# --- values --------------------------------------------------------------------------


def to_json_value(value, key: str = "?"):
    """A metric value as plain JSON: int, float, str, bool or None (for NaN / inf).

    Accepts Python and NumPy scalars, 0-d or one-element NumPy / JAX arrays.
    Raises TypeError naming `key` for anything else (e.g. a [B] array).
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # numpy or jax array
        arr = np.asarray(value)
        if arr.size != 1:
            raise TypeError(f"metric {key!r} must be a scalar; got an array of shape {arr.shape}")
        return to_json_value(arr.reshape(()).item(), key)
    raise TypeError(f"metric {key!r} has unsupported type {type(value).__name__}")


def _to_json_tree(obj, key: str = "?"):
    """Recursively converts dicts / lists / tuples of scalars to JSON-ready values."""
    if isinstance(obj, Mapping):
        return {str(k): _to_json_tree(v, f"{key}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_json_tree(v, f"{key}[{i}]") for i, v in enumerate(obj)]
    if hasattr(obj, "shape") and np.asarray(obj).size != 1:
        return [_to_json_tree(v, key) for v in np.asarray(obj).tolist()]
    return to_json_value(obj, key)


def eval_episodes_name(stage: str, step: int | None = None) -> str:
    """The file name of an evaluation's episodes: "rl.jsonl", "rl-update20.jsonl",
    "stage_w2-o3-q4.jsonl" (characters other than letters, digits, "-", "_" and "."
    become "_")."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in stage)
    return f"{name}.jsonl" if step is None else f"{name}-update{int(step)}.jsonl"


# --- the logger ------------------------------------------------------------------------


class RunLogger:
    """Writes one run's logs. A context manager; `close()` flushes everything.

    Args:
      run_dir: the run directory (created).
      tensorboard / jsonl / progress_bar: turn each output on or off (cfg.logging.*).
      phase_bars: show `phase` bars even without the updates' bar (a command that runs
        phases only, e.g. `jaxrl-eval`'s evaluation).
      total: number of updates, for the progress bar.
      is_main: False on non-zero JAX processes: nothing is written or shown.
      resume_step: when resuming from checkpoint `resume_step`, metrics.jsonl and
        eval.json are truncated to it (`truncate_metrics`) and TensorBoard is told to
        drop events after it (purge_step).
      postfix: progress-bar label -> metric name (see DEFAULT_POSTFIX).
    """

    def __init__(
        self,
        run_dir: str,
        *,
        tensorboard: bool = True,
        jsonl: bool = True,
        progress_bar: bool = True,
        phase_bars: bool = False,
        total: int | None = None,
        is_main: bool = True,
        resume_step: int | None = None,
        postfix: Mapping[str, str] | None = None,
    ):
        self.run_dir = run_dir
        self.is_main = is_main
        self.postfix = dict(DEFAULT_POSTFIX if postfix is None else postfix)
        self._jsonl = None
        self._tb = None
        self._bar = None
        self._phase_bars = bool(phase_bars)
        if not is_main:
            return
        os.makedirs(run_dir, exist_ok=True)
        if resume_step is not None:
            truncate_metrics(run_dir, resume_step)
        if jsonl:
            self._jsonl = open(os.path.join(run_dir, METRICS_FILE), "a")
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._tb = SummaryWriter(logdir=run_dir, purge_step=purge, flush_secs=30)
        if progress_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, initial=resume_step or 0, unit="upd", dynamic_ncols=True
            )

    # context manager
    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log(self, step: int, metrics: Mapping) -> dict:
        """Records the metrics of update `step`; returns the JSON row written."""
        if not self.is_main:
            return {}
        row = {"step": int(step), WALL_TIME: round(time.time(), 3)}
        for key, value in metrics.items():
            if key in row:
                raise KeyError(f"metric name {key!r} is reserved")
            row[key] = to_json_value(value, key)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            self._write_tensorboard(row)
        if self._bar is not None:
            self._update_bar(row)
        return row

    def _write_tensorboard(self, row: dict) -> None:
        step = row["step"]
        for key, value in row.items():
            # Strings, flags and non-finite values (null) stay in metrics.jsonl only.
            if key in ("step", WALL_TIME) or value is None or isinstance(value, (bool, str)):
                continue
            group, short = metric_group(key)
            self._tb.add_scalar(f"{group}/{short}", float(value), step, walltime=row[WALL_TIME])

    def _update_bar(self, row: dict) -> None:
        shown = {}
        for label, target in self.postfix.items():
            for key, value in row.items():
                if key == target or key.endswith("/" + target):
                    shown[label] = "nan" if value is None else _short(value)
                    break
        # update(), not n = step: tqdm then times the updates themselves (its rate and ETA).
        # Only forward: tqdm's update(0) (SFT's rows are written at update 0, inside its
        # phase) restarts the interval a later unpause() skips, so the phase would count.
        if row["step"] > self._bar.n:
            self._bar.update(row["step"] - self._bar.n)
        self._bar.set_postfix(shown, refresh=True)

    def save_config(self, cfg) -> None:
        """Writes run_dir/config.json from a ConfigDict (or a plain dict)."""
        if not self.is_main:
            return
        data = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
        write_json_atomic(os.path.join(self.run_dir, CONFIG_FILE), _config_json(data))

    def write_eval(self, stage: str, result: Mapping, *, step: int | None = None) -> None:
        """Merges an evaluation into run_dir/eval.json.

        eval.json is {"sft": {...}, "rl": {...}, "per_update": {"<step>": {stage: ...}}}:
        `stage` holds the latest result of that stage, and with `step` given the result
        is also kept under per_update[step][stage].
        """
        if not self.is_main:
            return
        path = os.path.join(self.run_dir, EVAL_FILE)
        evals = {"per_update": {}}
        if os.path.exists(path):
            with open(path) as f:
                evals = json.load(f)
        clean = _to_json_tree(dict(result), stage)
        evals[stage] = clean
        if step is not None:
            evals.setdefault("per_update", {}).setdefault(str(int(step)), {})[stage] = clean
        write_json_atomic(path, evals)

    def write_eval_episodes(self, stage: str, trajectories, *, step: int | None = None
                            ) -> str | None:
        """Writes an evaluation's episodes, one JSON line per game as people read it
        (`data.dump.episode_summary`: actions, rewards, how it ended), to
        run_dir/eval_episodes/<stage>.jsonl (<stage>-update<step>.jsonl with `step`),
        replacing an earlier evaluation of the same stage and step. Returns the path."""
        if not self.is_main:
            return None
        path = os.path.join(self.run_dir, EVAL_EPISODES_DIR, eval_episodes_name(stage, step))
        write_summaries(path, trajectories, stage=stage, step=step)
        return path

    def plot(self, keys: Sequence[str] | None = None) -> list[str]:
        """PNG learning curves in run_dir/plots/ (see `plot_metrics`)."""
        if not self.is_main:
            return []
        if self._jsonl is not None:
            self._jsonl.flush()
        return plot_metrics(self.run_dir, keys)

    @contextlib.contextmanager
    def phase(self, name: str, total: int, unit: str):
        """A second progress bar, under the updates' one, for work before or between
        updates (pretraining, SFT, an evaluation): yields `advance(n=1)`. Without the updates'
        bar (progress_bar off, or not the main process) `advance` does nothing, unless
        `phase_bars` asked for the phase's bar alone (main process only)."""
        alone = self._bar is None
        if not self.is_main or (alone and not self._phase_bars):
            yield lambda n=1: None
            return
        from tqdm.auto import tqdm

        # A phase moves a few times a minute: every move is drawn (mininterval 0).
        bar = tqdm(total=total, desc=name, unit=unit, position=0 if alone else 1,
                   leave=alone, dynamic_ncols=True, mininterval=0)
        try:
            yield bar.update
        finally:
            bar.close()
            if not alone:
                # The phase's time is not the updates': without this, the updates' rate and
                # ETA count a 13-minute evaluation before the first update as its time.
                self._bar.unpause()

    def write(self, text: str) -> None:
        """Prints a line without breaking the progress bar."""
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.3g}"
    return str(value)


def _config_json(obj):
    """ConfigDict.to_dict() output as JSON: tuples become lists, unknown objects strings."""
    if isinstance(obj, Mapping):
        return {str(k): _config_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_config_json(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    try:
        return to_json_value(obj)
    except TypeError:
        return str(obj)
