"""The sweep's bar chart."""

from jaxrl_agents.sweep import chart, report
from tests.sweep.helpers import score


def test_the_chart_adds_a_panel_over_seeds_when_an_arm_has_two(tmp_path):
    from PIL import Image

    runs = [{"name": f"{arm},seed={seed}", "sft": score(0.3 + 0.1 * seed), "rl": score(0.5)}
            for arm in ("a", "b") for seed in (0, 1)]  # fmt: skip
    first_seeds = [r for r in runs if r["name"].endswith("seed=0")]
    widths = {}
    for label, rows in (("plain", runs), ("one seed", first_seeds), ("two seeds", runs)):
        summary = {"sweep": "s", "runs": rows}
        if label != "plain":
            summary["over_seeds"] = report.over_seeds(summary)
        path = chart.plot_summary(summary, str(tmp_path / f"{label}.png"))
        widths[label] = Image.open(path).size[0]
    assert widths["two seeds"] > widths["plain"] + 300  # the panel of the two arms
    assert widths["one seed"] < widths["plain"]  # one seed an arm: no second panel
