"""What a run writes for people to read: metrics.jsonl, TensorBoard, a progress bar,
config.json, eval.json and PNG learning curves (see DESIGN.md, "Outputs of a run").

    with RunLogger(run_dir, total=num_updates, resume_step=start) as log:
        log.save_config(cfg)
        for step in range(start + 1, num_updates + 1):
            log.log(step, {"charts/success": 0.4, "losses/kl": 0.01, ...})
        log.write_eval("rl", success_ci(successes))
        log.plot()

Metric names are grouped by prefix ("losses/pg", "charts/success", "perf/tokens_per_s");
a name without a prefix is shown under "charts/" in TensorBoard and in the plots, but
kept as given in metrics.jsonl. Only the main JAX process writes: with `is_main=False`
every method is a no-op, so all processes can call the same code.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.json"
CONFIG_FILE = "config.json"
PLOTS_DIR = "plots"
SUMMARY_FILE = "summary.json"  # written when a run finishes (trainer.loop.write_summary)
CHECKPOINT_DIR = "checkpoints"
TOKENIZER_DIR = "tokenizer"  # the tokenizer trained for the run
TRAJECTORIES_FILE = "trajectories.jsonl"  # reward.dump_trajectories
WALL_TIME = "wall_time"  # seconds since the epoch, on every metrics.jsonl row
DEFAULT_GROUP = "charts"

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


def _write_json_atomic(path: str, obj) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def success_ci(successes: Iterable, z: float = 1.959963984540054) -> dict:
    """Success rate with a Wilson score interval (95% by default).

    successes: one bool / 0-1 value per game. Returns
    {"mean", "n", "ci_low", "ci_high"}; with no games, mean is None and the interval [0, 1].
    """
    s = np.asarray(list(successes), np.float64).ravel()
    n = int(s.size)
    if n == 0:
        return {"mean": None, "n": 0, "ci_low": 0.0, "ci_high": 1.0}
    if not np.all((s == 0) | (s == 1)):
        raise ValueError("success_ci expects 0/1 (or bool) outcomes")
    p = float(s.mean())
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return {
        "mean": p,
        "n": n,
        "ci_low": max(0.0, min(p, centre - half)),  # min/max: rounding at k = 0 or n
        "ci_high": min(1.0, max(p, centre + half)),
    }


def clustered_success_ci(successes: Iterable, games: Iterable,
                         z: float = 1.959963984540054) -> dict:
    """Success rate of several episodes per game, with a 95% interval over games.

    Episodes of one game are not independent, so the interval is a normal one on the
    per-game success rates: mean +- z * sd(rates) / sqrt(number of games), clipped to
    [0, 1] (the Wilson interval of `success_ci` when every game was played once).
    successes: one 0/1 value per episode; games: the game of each episode, same length.
    Returns success_ci's keys, plus "games" (distinct games) and "samples_per_game" when
    games were played more than once.
    """
    s = np.asarray(list(successes), np.float64).ravel()
    labels = list(games)
    if len(labels) != s.size:
        raise ValueError(f"{s.size} outcomes but {len(labels)} game labels")
    per_game: dict = {}
    for label, won in zip(labels, s):
        per_game.setdefault(label, []).append(won)
    counts = {len(v) for v in per_game.values()}
    if len(counts) > 1:
        raise ValueError(f"games were played unequal numbers of times: {sorted(counts)}")
    if counts == {1} or not per_game:
        return success_ci(s, z)
    if not np.all((s == 0) | (s == 1)):
        raise ValueError("clustered_success_ci expects 0/1 (or bool) outcomes")
    rates = np.array([np.mean(v) for v in per_game.values()])
    p = float(rates.mean())
    half = z * float(rates.std(ddof=1)) / math.sqrt(rates.size) if rates.size > 1 else 1.0
    return {"mean": p, "n": int(s.size), "ci_low": max(0.0, p - half),
            "ci_high": min(1.0, p + half), "games": int(rates.size),
            "samples_per_game": counts.pop()}


# --- a run directory reused by a fresh run ---------------------------------------------

PREVIOUS_DIR = "previous"
# What a run writes into its directory (a sweep's train.log stays: the sweep owns it).
RUN_FILES = (METRICS_FILE, EVAL_FILE, CONFIG_FILE, PLOTS_DIR, SUMMARY_FILE, CHECKPOINT_DIR,
             TOKENIZER_DIR, TRAJECTORIES_FILE)


def set_aside_previous_run(run_dir: str) -> str | None:
    """Moves an earlier run's files out of the way of a fresh run in the same directory.

    Without this a second fresh run would append to the old metrics.jsonl and find the old
    checkpoints' steps already on disk. When run_dir holds a run (checkpoints or
    metrics.jsonl), its files and TensorBoard events move to run_dir/previous/<time>/;
    returns that folder, or None when there was nothing to move.
    """
    checkpoints = os.path.join(run_dir, CHECKPOINT_DIR)
    has_run = os.path.exists(os.path.join(run_dir, METRICS_FILE)) or (
        os.path.isdir(checkpoints) and os.listdir(checkpoints)
    )
    if not has_run:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = os.path.join(run_dir, PREVIOUS_DIR, stamp)
    n = 1
    while os.path.exists(target):
        target = os.path.join(run_dir, PREVIOUS_DIR, f"{stamp}-{n}")
        n += 1
    os.makedirs(target)
    for name in sorted(os.listdir(run_dir)):
        if name in RUN_FILES or name.startswith("events.out.tfevents."):
            os.rename(os.path.join(run_dir, name), os.path.join(target, name))
    return target


# --- metrics.jsonl ---------------------------------------------------------------------


def read_metrics(run_dir: str) -> list[dict]:
    """Rows of run_dir/metrics.jsonl in order (null stays None). A torn last line, as a
    kill during a write leaves, is skipped."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def truncate_metrics(run_dir: str, step: int) -> int:
    """Keeps only the metrics.jsonl rows with step <= `step`, and the eval.json
    "per_update" entries with update <= `step`. Call when resuming from checkpoint
    `step`, so the resumed run's files equal those of a run never interrupted.
    Returns the number of metric rows kept."""
    rows = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step]
    path = os.path.join(run_dir, METRICS_FILE)
    if os.path.exists(path):
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        os.replace(tmp, path)
    eval_path = os.path.join(run_dir, EVAL_FILE)
    if os.path.exists(eval_path):
        with open(eval_path) as f:
            evals = json.load(f)
        per_update = evals.get("per_update", {})
        evals["per_update"] = {k: v for k, v in per_update.items() if int(k) <= step}
        _write_json_atomic(eval_path, evals)
    return len(rows)


# --- plots -----------------------------------------------------------------------------


def _group_of(name: str) -> tuple[str, str]:
    """("losses", "pg") for "losses/pg"; ("charts", "success") for "success"."""
    if "/" in name:
        group, short = name.split("/", 1)
        return group, short
    return DEFAULT_GROUP, name


def plot_metrics(run_dir: str, keys: Sequence[str] | None = None) -> list[str]:
    """Draws learning curves from run_dir/metrics.jsonl into run_dir/plots/<group>.png.

    One PNG per metric group, one panel per metric in a grid; missing and null (NaN)
    points are skipped. `keys` limits the metrics drawn. Returns the PNG paths.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    series: dict[str, tuple[list, list]] = {}
    for row in rows:
        for name, value in row.items():
            if name in ("step", WALL_TIME) or (keys is not None and name not in keys):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            xs, ys = series.setdefault(name, ([], []))
            xs.append(row["step"])
            ys.append(value)
    groups: dict[str, list[str]] = {}
    for name in series:
        groups.setdefault(_group_of(name)[0], []).append(name)

    out_dir = os.path.join(run_dir, PLOTS_DIR)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for group, names in sorted(groups.items()):
        cols = min(3, len(names))
        nrows = -(-len(names) // cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.2 * nrows), squeeze=False)
        for ax, name in zip(axes.flat, sorted(names)):
            xs, ys = series[name]
            ax.plot(xs, ys, marker="." if len(xs) < 50 else None, linewidth=1.2)
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("update")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(names) :]:
            ax.axis("off")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{group.replace('/', '_')}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


# --- the logger ------------------------------------------------------------------------


class RunLogger:
    """Writes one run's logs. A context manager; `close()` flushes everything.

    Args:
      run_dir: the run directory (created).
      tensorboard / jsonl / progress_bar: turn each output on or off (cfg.logging.*).
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
            group, short = _group_of(key)
            self._tb.add_scalar(f"{group}/{short}", float(value), step, walltime=row[WALL_TIME])

    def _update_bar(self, row: dict) -> None:
        shown = {}
        for label, target in self.postfix.items():
            for key, value in row.items():
                if key == target or key.endswith("/" + target):
                    shown[label] = "nan" if value is None else _short(value)
                    break
        self._bar.n = row["step"]
        self._bar.set_postfix(shown, refresh=True)

    def save_config(self, cfg) -> None:
        """Writes run_dir/config.json from a ConfigDict (or a plain dict)."""
        if not self.is_main:
            return
        data = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
        _write_json_atomic(os.path.join(self.run_dir, CONFIG_FILE), _config_json(data))

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
        _write_json_atomic(path, evals)

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
        updates (warm-up, SFT, an evaluation): yields `advance(n=1)`. Without the updates'
        bar (progress_bar off, or not the main process) `advance` does nothing."""
        if self._bar is None:
            yield lambda n=1: None
            return
        from tqdm.auto import tqdm

        # A phase moves a few times a minute: every move is drawn (mininterval 0).
        bar = tqdm(total=total, desc=name, unit=unit, position=1, leave=False,
                   dynamic_ncols=True, mininterval=0)
        try:
            yield bar.update
        finally:
            bar.close()

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
