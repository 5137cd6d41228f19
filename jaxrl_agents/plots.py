"""A run's learning curves as PNG files: one per metric group, drawn from metrics.jsonl
(a sweep's bar chart of its runs is `sweep/chart.py`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from jaxrl_agents.run_records import PLOTS_DIR, WALL_TIME, metric_group, read_metrics


def plot_metrics(run_dir: str, keys: Sequence[str] | None = None) -> list[str]:
    """Draws learning curves from run_dir/metrics.jsonl into run_dir/plots/<group>.png.

    One PNG per metric group, one panel per metric in a grid; missing and null (NaN)
    points are skipped. `keys` limits the metrics drawn. Returns the PNG paths.
    """
    # Imported here, with the file backend: a run without plots never loads matplotlib.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(read_metrics(run_dir), keys)
    groups: dict[str, list[str]] = {}
    for name in series:
        groups.setdefault(metric_group(name)[0], []).append(name)

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


def _series(rows: Sequence[dict], keys: Sequence[str] | None) -> dict[str, tuple[list, list]]:
    """metric -> (steps, values) of its numeric points; strings, flags and nulls left out."""
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
    return series
