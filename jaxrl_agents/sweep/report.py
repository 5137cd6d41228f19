"""What a sweep found: its summary.json (per run its result, overrides and held-out scores;
the arms over their seeds) and the tables `jaxrl-sweep` prints.

`summarize` reads each run's held-out scores (STAGES): "base" (the pretrained model
zero-shot, in runs that start from `model.hf_path`), "sft" (after SFT; absent with
`sft.enabled=False`) and "rl" (after RL); `with_earlier_runs` takes the runs missing here
from a summary made elsewhere (`--earlier`). Runs evaluated on several tasks (a
curriculum's stages) also hold per-task scores; with the sweep's `report_task` the tables
and chart compare the runs on that task's entries ("base:<task>", "sft:<task>",
"rl:<task>"), falling back to a run's overall score where it played only that task.
`over_seeds` groups the runs into arms by name without their seed and gives each arm's
mean over seeds, RL's gain over SFT and over the base model and two arms' difference,
paired by seed, with t intervals over the seeds (`jaxrl_agents/stats.py`). The base
columns are printed only when some run has a base score, so the tables of from-scratch
sweeps hold SFT and RL only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from jaxrl_agents import stats
from jaxrl_agents.run_records import EVAL_FILE, SUMMARY_FILE, write_json_atomic
from jaxrl_agents.sweep.expand import Sweep, SweepError
from jaxrl_agents.trainer.summary import SUMMARY_STAGES, paired_lines

STAGES = tuple(SUMMARY_STAGES)  # a run's held-out evaluations: ("base", "sft", "rl")
# How the tables and the chart name each stage's score.
STAGE_NAMES = {"base": "at base", "sft": "after SFT", "rl": "after RL"}


# --- summary.json -------------------------------------------------------------------------


def _read_json(path: str) -> dict:
    """The JSON object at `path`; {} when it is missing or unreadable (a run not there)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def has_score(row: Mapping) -> bool:
    """Whether a summary row holds a held-out score of some stage (base, SFT or RL)."""
    return any(row.get(stage) for stage in STAGES)


def reported_score(row: Mapping, stage: str, task: str | None) -> dict | None:
    """A summary row's score for `stage` ("base" / "sft" / "rl"): its "<stage>:<task>"
    entry when `task` is set and the run played several tasks, else its overall score."""
    return (task and row.get(f"{stage}:{task}")) or row.get(stage)


def run_scores(path: str) -> dict:
    """{"base": {...}, "sft": {...}, "rl": {...}}: held-out success (mean, ci_low,
    ci_high, n, per_game where kept) of a run at each of STAGES, from its eval.json, else
    its summary.json; a stage without one is left out. A run evaluated on several tasks
    also has eval.json's "<stage>:<task>" entries ("base:<task>", "sft:<task>", ...)."""
    evals = _read_json(os.path.join(path, EVAL_FILE))
    summary = _read_json(os.path.join(path, SUMMARY_FILE))
    found = {stage: evals.get(stage) or summary.get(stage) or {} for stage in STAGES}
    per_task = tuple(f"{stage}:" for stage in STAGES)
    found.update({k: v for k, v in evals.items() if k.startswith(per_task)})
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


# Gains within an arm, paired by seed: key in over_seeds -> (later stage, earlier stage).
GAINS = {"rl_gain": ("rl", "sft"), "rl_over_base": ("rl", "base")}


def over_seeds(summary: Mapping) -> dict:
    """The runs grouped into arms by name without their seed (`stats.split_seed`):
    {"arms": {arm: {stage: mean over seeds with a t interval and "per_seed"}},
     "rl_gain": {arm: RL minus SFT, paired by seed},
     "rl_over_base": {arm: RL minus the base model, paired by seed},
     "difference": {"first", "second", stage: second arm minus first, paired by seed}};
    an arm is left out of a gain whose two stages share no seed, and "difference" is
    there only when there are exactly two arms. Scores as in the table (on `report_task`
    where set)."""
    per_stage = _seed_scores(summary)
    names = dict.fromkeys(stats.split_seed(r["name"])[0] for r in summary["runs"])
    arms = [a for a in names if any(a in per_stage[s] for s in STAGES)]
    result = {"arms": {arm: _arm_means(per_stage, arm) for arm in arms}}
    for key, (later, earlier) in GAINS.items():
        result[key] = _gains(per_stage[later], per_stage[earlier], arms)
    if len(arms) == 2:
        result["difference"] = _arm_difference(per_stage, *arms)
    return result


def _seed_scores(summary: Mapping) -> dict[str, dict[str, dict[int, float]]]:
    """{stage: {arm: {seed: the run's mean}}} over the summary's runs (on `report_task`
    where set)."""
    task = summary.get("report_task")
    per_stage = {}
    for stage in STAGES:
        scores = {}
        for row in summary["runs"]:
            score = reported_score(row, stage, task)
            if score:
                scores[row["name"]] = score["mean"]
        per_stage[stage] = stats.by_arm(scores)
    return per_stage


def _arm_means(per_stage: Mapping, arm: str) -> dict:
    """{stage: the arm's mean over its seeds, with a t interval and "per_seed"} for each
    stage the arm has."""
    return {
        stage: {**stats.t_interval(seeds.values()), "per_seed": seeds}
        for stage in STAGES
        if (seeds := per_stage[stage].get(arm))
    }


def _gains(later: Mapping, earlier: Mapping, arms: Sequence[str]) -> dict:
    """{arm: later stage minus earlier stage, paired by seed} for the arms with both."""
    gains = {}
    for arm in arms:
        gain = stats.paired_difference(later.get(arm, {}), earlier.get(arm, {}))
        if gain:
            gains[arm] = gain
    return gains


def _arm_difference(per_stage: Mapping, first: str, second: str) -> dict:
    """{"first", "second", stage: second arm minus first, paired by seed} for the stages
    where the two arms share a seed."""
    result = {"first": first, "second": second}
    for stage in STAGES:
        diff = stats.paired_difference(per_stage[stage].get(second, {}),
                                       per_stage[stage].get(first, {}))
        if diff:
            result[stage] = diff
    return result


def write_summary(summary: Mapping, root: str) -> str:
    """Writes <root>/<sweep>/summary.json; returns its path."""
    path = os.path.join(root, summary["sweep"], SUMMARY_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, summary)
    return path


# --- the printed tables -------------------------------------------------------------------


def table_stages(summary: Mapping) -> tuple[str, ...]:
    """The stages the per-run table and the chart show: SFT and RL, and the base model
    before them when some run has a base score (on `report_task` where set)."""
    task = summary.get("report_task")
    return _stages(any(reported_score(r, "base", task) for r in summary["runs"]))


def _stages(with_base: bool) -> tuple[str, ...]:
    """STAGES, without "base" unless `with_base`."""
    return STAGES if with_base else tuple(s for s in STAGES if s != "base")


def format_table(summary: Mapping) -> str:
    """One line per run: name, status, held-out success at each of `table_stages` (at
    base when some run has it, after SFT, after RL) with its 95% CI."""
    task = summary.get("report_task")
    on = f" on {task}" if task else ""
    stages = table_stages(summary)
    header = ("run", "status", *(f"success {STAGE_NAMES[s]}{on} (95% CI)" for s in stages))
    rows = [header]
    for r in summary["runs"]:
        status = r["status"] if r["status"] != "failed" else f"failed ({r['exit_code']})"
        scores = (_score_text(reported_score(r, stage, task)) for stage in stages)
        rows.append((r["name"], status, *scores))
    return "\n".join(_aligned(rows))


def _score_text(score: dict | None) -> str:
    if not score:
        return "-"
    return f"{score['mean']:.3f} ({score['ci_low']:.3f}-{score['ci_high']:.3f}, n={score['n']})"


def format_seed_table(seeds: Mapping) -> str:
    """Per arm: the mean over seeds at base (when some arm has it), after SFT and after
    RL, RL's paired gain over SFT and, with base, over the base model (each with a 95% t
    interval over seeds); then two arms' paired difference at each stage."""
    has_base = any("base" in stages for stages in seeds["arms"].values())
    stages = _stages(has_base)
    gains = {"rl_gain": "RL - SFT", "rl_over_base": "RL - base"}
    if not has_base:
        del gains["rl_over_base"]
    header = ("arm", *(f"{STAGE_NAMES[s]}, over seeds (95% t)" for s in stages),
              *(f"{name}, paired (95% t)" for name in gains.values()))
    rows = [header]
    for arm, means in seeds["arms"].items():
        rows.append((arm, *(_interval_text(means.get(s)) for s in stages),
                     *(_interval_text(seeds.get(key, {}).get(arm), signed=True)
                       for key in gains)))
    lines = _aligned(rows)
    diff = seeds.get("difference")
    if diff:
        for stage in STAGES:
            if stage in diff:
                lines.append(f"{diff['second']} - {diff['first']} {STAGE_NAMES[stage]}, "
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
    """Per run whose eval.json kept each game's outcome, one line for each pair of stages
    it holds (trainer/summary.py's PAIRED_STAGES: RL - SFT, RL - base, SFT - base): the
    later minus the earlier on the games both played, with McNemar's exact test
    (`stats.paired_games`), prefixed by the run's name."""
    return [f"{row['name']}: {line}" for row in summary["runs"] for line in paired_lines(row)]
