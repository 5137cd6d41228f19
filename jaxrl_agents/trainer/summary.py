"""A finished run's summary: its held-out results as text, and summary.json.

    write_summary(summary)          # <run_dir>/summary.json (without the plot paths)
    print(format_summary(summary))  # success per stage, paired comparisons, where the logs are
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from jaxrl_agents import failures, stats
from jaxrl_agents.run_records import SUMMARY_FILE

# The held-out evaluations of a run, in order, and how the summary names them.
SUMMARY_STAGES = {"base": "of the pretrained model", "sft": "after SFT", "rl": "after RL"}


def format_summary(summary: dict) -> str:
    """Human-readable end-of-run lines: held-out success of the pretrained model (when the
    run starts from one), after SFT and after RL."""
    lines = []
    run_dir = summary.get("run_dir", "")
    for stage, when in SUMMARY_STAGES.items():
        r = summary.get(stage)
        if r and r.get("mean") is not None:
            lines.append(
                f"held-out success {when}: {r['mean']:.3f} "
                f"(95% CI {r['ci_low']:.3f}-{r['ci_high']:.3f}, {r['n']} games)"
            )
            lines += ended_lines(run_dir, stage)
    lines += paired_lines(summary)
    lines.append(
        f"logs: {run_dir}/metrics.jsonl, TensorBoard in {run_dir}, "
        f"eval: {run_dir}/eval.json, plots: {run_dir}/plots/"
    )
    return "\n".join(lines)


def ended_lines(run_dir: str, stage: str) -> list[str]:
    """"  games ended: won 41, loop 58, ..." from the stage's eval_episodes file
    (`failures.reading`); nothing when the run has no such file."""
    path = failures.stage_path(run_dir, stage)
    if not run_dir or not os.path.exists(path):
        return []
    causes = failures.reading(failures.read_episodes(path))["causes"]
    parts = ", ".join(f"{c} {k}" for c, k in causes.items() if k)
    return [f"  games ended: {parts} (jaxrl-eval --run {run_dir} --read {stage})"]


# Pairs of stages compared game by game at the end of a run: (earlier, later).
PAIRED_STAGES = (("sft", "rl"), ("base", "rl"), ("base", "sft"))


def paired_lines(evals: Mapping) -> list[str]:
    """For each of PAIRED_STAGES that `evals` (a summary, or eval.json) holds with its
    games' outcomes: the later stage minus the earlier on the games both played, with
    McNemar's exact test (`stats.paired_games`)."""
    lines = []
    for first, second in PAIRED_STAGES:
        a, b = (evals.get(stage) or {} for stage in (first, second))
        pair = stats.paired_games(a.get("per_game") or {}, b.get("per_game") or {})
        if pair:
            lines.append(stats.format_paired_games(pair, first, second))
    return lines


def write_summary(summary: dict) -> None:
    path = os.path.join(summary["run_dir"], SUMMARY_FILE)
    with open(path, "w") as f:
        json.dump({k: v for k, v in summary.items() if k != "plots"}, f, indent=1, default=str)
