"""A run's directory and the records in it: the file names, JSON written atomically,
metrics.jsonl read back or cut at a resumed step, and an earlier run's files set aside
for a fresh one (docs/design.md, "Outputs of a run").

Who writes what: `logging.RunLogger` writes metrics.jsonl, TensorBoard events,
config.json, eval.json and eval_episodes/; `plots.plot_metrics` the PNG curves; the
trainer summary.json, checkpoints, the tokenizer and trajectories; a sweep its train.log
beside them.

Metric names are grouped by prefix ("losses/pg", "charts/success", "perf/tokens_per_s");
a name without a prefix belongs to "charts/" (`metric_group`) in TensorBoard and in the
plots, but is kept as given in metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import time

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.json"
CONFIG_FILE = "config.json"
PLOTS_DIR = "plots"
SUMMARY_FILE = "summary.json"  # written when a run finishes (trainer.summary.write_summary)
CHECKPOINT_DIR = "checkpoints"
TOKENIZER_DIR = "tokenizer"  # the tokenizer trained for the run
TRAJECTORIES_FILE = "trajectories.jsonl"  # reward.dump_trajectories
EVAL_EPISODES_DIR = "eval_episodes"  # each held-out evaluation's games, <stage>.jsonl
WALL_TIME = "wall_time"  # seconds since the epoch, on every metrics.jsonl row
DEFAULT_GROUP = "charts"

PREVIOUS_DIR = "previous"
# What a run writes into its directory (a sweep's train.log stays: the sweep owns it).
RUN_FILES = (METRICS_FILE, EVAL_FILE, CONFIG_FILE, PLOTS_DIR, SUMMARY_FILE, CHECKPOINT_DIR,
             TOKENIZER_DIR, TRAJECTORIES_FILE, EVAL_EPISODES_DIR)


def run_dir_of(cfg) -> str:
    """A run's directory: `output_dir/name` of its config."""
    return os.path.join(cfg.output_dir, cfg.name)


def metric_group(name: str) -> tuple[str, str]:
    """("losses", "pg") for "losses/pg"; ("charts", "success") for "success"."""
    if "/" in name:
        group, short = name.split("/", 1)
        return group, short
    return DEFAULT_GROUP, name


def write_json_atomic(path: str, obj) -> None:
    """Writes `obj` as indented JSON to `path` through a temporary file and a rename, so a
    kill during the write leaves the old file whole, never a torn one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def write_jsonl_atomic(path: str, rows) -> None:
    """Writes `rows` (dicts) to `path` as JSON lines, through a temporary file and a rename
    like `write_json_atomic`."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


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
        write_jsonl_atomic(path, rows)
    eval_path = os.path.join(run_dir, EVAL_FILE)
    if os.path.exists(eval_path):
        with open(eval_path) as f:
            evals = json.load(f)
        per_update = evals.get("per_update", {})
        evals["per_update"] = {k: v for k, v in per_update.items() if int(k) <= step}
        write_json_atomic(eval_path, evals)
    return len(rows)


# --- a run directory reused by a fresh run ---------------------------------------------


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
