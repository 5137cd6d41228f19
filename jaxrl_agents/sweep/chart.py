"""The sweep's bar chart (success.png beside its summary.json): held-out success after
SFT and after RL per run and, when arms have several seeds, per arm over its seeds; with
a bar of the pretrained model's zero-shot score ("base") before them when some run has
one (`report.table_stages`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from jaxrl_agents.sweep.report import STAGE_NAMES, has_score, reported_score, table_stages

PLOT_FILE = "success.png"  # the sweep's bar chart, beside its summary.json
_GROUP_WIDTH = 0.76  # the stages' bars of one run or arm side by side
_STAGE_COLORS = {"base": "#bbb", "sft": "#9ab", "rl": "#357"}


def _stage_bars(ax, labels: Sequence[str], score_of: Callable, stages: Sequence[str]) -> None:
    """Bars of `score_of(i, stage)` (mean, ci_low, ci_high; None to leave one out) at each
    of `stages` for each label, side by side, the interval as an error bar where there is
    one, and the values of "per_seed" as dots on the bar."""
    width = _GROUP_WIDTH / len(stages)
    for k, stage in enumerate(stages):
        offset = (k - (len(stages) - 1) / 2) * width
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
        ax.bar(xs, means, width, yerr=errs, capsize=3, color=_STAGE_COLORS[stage],
               label=STAGE_NAMES[stage])
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)


def plot_summary(summary: Mapping, path: str) -> str | None:
    """Bar chart of held-out success per run at each of `report.table_stages` (at base
    where some run has a base score, after SFT, after RL; on the sweep's `report_task`
    where set), 95% CIs over games as error bars; beside it, when an arm has two seeds or
    more (`over_seeds`), each arm's mean over seeds with its 95% t interval and one dot
    per seed. Written to `path` (PNG); None when no run has a score."""
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
    stages = table_stages(summary)
    ax = axes[0][0]
    _stage_bars(ax, [r["name"] for r in runs], lambda i, st: reported_score(runs[i], st, task),
                stages)
    ax.set_ylabel(f"held-out success{f' on {task}' if task else ''}", fontsize=9)
    ax.set_title(f"{summary['sweep']}: each run (95% CI over games)", fontsize=10)
    ax.legend(fontsize=8)
    if seeded:
        names = list(arms)
        ax = axes[0][1]
        _stage_bars(ax, names, lambda i, st: arms[names[i]].get(st), stages)
        ax.set_title("each arm over its seeds (95% t interval, dots: seeds)", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
