"""What a sweep found: its summary.json (per run its result, overrides and held-out scores;
the arms over their seeds) and the tables `jaxrl-sweep` prints.

`summarize` reads each run's scores after SFT and after RL; `with_earlier_runs` takes
the runs missing here from a summary made elsewhere (`--earlier`). Runs evaluated on
several tasks (a curriculum's stages) also hold per-task scores; with the sweep's
`report_task` the tables and chart compare the runs on that task's entries
("sft:<task>", "rl:<task>"), falling back to a run's overall score where it played only
that task. `over_seeds` groups the runs into arms by name without their seed and gives
each arm's mean over seeds, RL's gain over SFT and two arms' difference, paired by seed,
with t intervals over the seeds (`jaxrl_agents/stats.py`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from jaxrl_agents import stats
from jaxrl_agents.run_records import EVAL_FILE, SUMMARY_FILE, write_json_atomic
from jaxrl_agents.sweep.expand import Sweep, SweepError

STAGES = ("sft", "rl")  # the two held-out evaluations of a run: after SFT, after RL


# --- summary.json -------------------------------------------------------------------------


def _read_json(path: str) -> dict:
    """The JSON object at `path`; {} when it is missing or unreadable (a run not there)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def has_score(row: Mapping) -> bool:
    """Whether a summary row holds a held-out score after SFT or after RL."""
    return any(row.get(stage) for stage in STAGES)


def reported_score(row: Mapping, stage: str, task: str | None) -> dict | None:
    """A summary row's score for `stage` ("sft" / "rl"): its "<stage>:<task>" entry when
    `task` is set and the run played several tasks, else its overall score."""
    return (task and row.get(f"{stage}:{task}")) or row.get(stage)


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


def over_seeds(summary: Mapping) -> dict:
    """The runs grouped into arms by name without their seed (`stats.split_seed`):
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
        per_stage[stage] = stats.by_arm(scores)
    names = dict.fromkeys(stats.split_seed(r["name"])[0] for r in summary["runs"])
    arms = [a for a in names if any(a in per_stage[s] for s in STAGES)]
    result = {"arms": {}, "rl_gain": {}}
    for arm in arms:
        result["arms"][arm] = {
            stage: {**stats.t_interval(seeds.values()), "per_seed": seeds}
            for stage in STAGES
            if (seeds := per_stage[stage].get(arm))
        }
        gain = stats.paired_difference(per_stage["rl"].get(arm, {}),
                                            per_stage["sft"].get(arm, {}))
        if gain:
            result["rl_gain"][arm] = gain
    if len(arms) == 2:
        first, second = arms
        result["difference"] = {"first": first, "second": second}
        for stage in STAGES:
            diff = stats.paired_difference(per_stage[stage].get(second, {}),
                                                per_stage[stage].get(first, {}))
            if diff:
                result["difference"][stage] = diff
    return result


def write_summary(summary: Mapping, root: str) -> str:
    """Writes <root>/<sweep>/summary.json; returns its path."""
    path = os.path.join(root, summary["sweep"], SUMMARY_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, summary)
    return path


# --- the printed tables -------------------------------------------------------------------


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


def _score_text(score: dict | None) -> str:
    if not score:
        return "-"
    return f"{score['mean']:.3f} ({score['ci_low']:.3f}-{score['ci_high']:.3f}, n={score['n']})"


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


def _interval_text(result: dict | None, signed: bool = False) -> str:
    if not result:
        return "-"
    sign = "+" if signed else ""
    text = f"{result['mean']:{sign}.3f}"
    if result["ci_low"] is None:
        return f"{text} (1 seed)"
    return (f"{text} ({result['ci_low']:{sign}.3f} to {result['ci_high']:{sign}.3f}, "
            f"{result['seeds']} seeds)")


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Table rows as lines, each column padded to its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def paired_game_lines(summary: Mapping) -> list[str]:
    """Per run whose eval.json kept each game's outcome: RL minus SFT on the games both
    played, with McNemar's exact test (`stats.paired_games`)."""
    lines = []
    for row in summary["runs"]:
        sft, rl = row.get("sft") or {}, row.get("rl") or {}
        pair = stats.paired_games(sft.get("per_game") or {}, rl.get("per_game") or {})
        if pair:
            lines.append(f"{row['name']}: {stats.format_paired_games(pair, 'sft', 'rl')}")
    return lines
