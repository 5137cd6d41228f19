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


def test_the_chart_adds_base_bars_when_a_run_has_a_base_score(tmp_path):
    """A gray bar of the base model before SFT's and RL's, in both panels, only where some
    run has a base score; an arm without SFT has no SFT bar."""
    from PIL import Image

    runs = [{"name": f"{arm},seed={seed}", "base": score(0.2), "rl": score(0.5),
             **({"sft": score(0.4)} if arm == "sft" else {})}
            for arm in ("sft", "no_sft") for seed in (0, 1)]  # fmt: skip
    base_gray = (0xBB, 0xBB, 0xBB)
    grays = {}
    for label, rows in (("base", runs), ("scratch", [{**r, "base": None} for r in runs])):
        summary = {"sweep": "s", "runs": rows}
        summary["over_seeds"] = report.over_seeds(summary)
        path = chart.plot_summary(summary, str(tmp_path / f"{label}.png"))
        colors = Image.open(path).convert("RGB").getcolors(maxcolors=1 << 24)
        grays[label] = sum(n for n, color in colors if color == base_gray)
    assert grays["base"] > 5000 and grays["scratch"] < 500  # edges antialiased to it
