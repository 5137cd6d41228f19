"""A sweep's report: the runs on disk summarized without running any, runs taken from an
earlier summary, per-task scores and the report task, and the arms over their seeds."""

import json
import re

import pytest

from jaxrl_agents.cli import sweep_main
from jaxrl_agents.sweep import report
from jaxrl_agents.sweep.expand import SweepError, build_sweep
from tests.sweep.helpers import TOY, score, write_sweep


def test_report_summarizes_the_runs_on_disk_and_runs_none(tmp_path, capsys):
    spec = {"name": "s", "config": TOY, "runs": [{"name": n} for n in ("a", "b", "c")]}
    path = write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    score = {"mean": 0.6, "ci_low": 0.5, "ci_high": 0.7, "n": 100}
    (out / "s" / "a").mkdir(parents=True)
    (out / "s" / "a" / "eval.json").write_text(json.dumps({"sft": score, "rl": score}))
    (out / "s" / "a" / "summary.json").write_text("{}")
    (out / "s" / "b" / "checkpoints" / "3").mkdir(parents=True)
    assert sweep_main(["--sweep", path, "--output-dir", str(out), "--report"]) == 0
    printed = capsys.readouterr().out
    rows = {r["name"]: r for r in json.loads((out / "s" / "summary.json").read_text())["runs"]}
    assert {n: r["status"] for n, r in rows.items()} == {
        "a": "done", "b": "unfinished", "c": "missing"}
    assert rows["a"]["rl"] == score and "rl" not in rows["b"]
    assert not (out / "s" / "c").exists()  # nothing was started
    assert "0.600 (0.500-0.700, n=100)" in printed
    assert (out / "s" / "success.png").read_bytes()[:4] == b"\x89PNG"


def test_a_report_takes_runs_missing_here_from_an_earlier_summary(tmp_path, capsys):
    """Runs made on other machines come from --earlier; a run with a score here keeps its
    own, and a summary of another sweep is refused before anything is written."""
    spec = {"name": "s", "config": TOY, "runs": [{"name": n} for n in ("a", "b", "c")]}
    path = write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    (out / "s" / "a").mkdir(parents=True)
    (out / "s" / "a" / "eval.json").write_text(json.dumps({"sft": score(0.6), "rl": score(0.7)}))
    (out / "s" / "a" / "summary.json").write_text("{}")
    old = {"sweep": "s", "runs": [
        {"name": "a", "status": "done", "sft": score(0.1), "rl": score(0.1)},
        {"name": "b", "status": "done", "sft": score(0.4), "rl": score(0.5)},
        {"name": "gone", "status": "done", "sft": score(0.9)}]}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(old))
    args = ["--sweep", path, "--output-dir", str(out), "--report"]
    assert sweep_main([*args, "--earlier", str(tmp_path / "old.json")]) == 0
    summary = json.loads((out / "s" / "summary.json").read_text())
    rows = {r["name"]: r for r in summary["runs"]}
    assert list(rows) == ["a", "b", "c"]
    assert summary["over_seeds"]["arms"]["b"]["rl"]["mean"] == 0.5  # earlier rows count
    assert rows["a"]["status"] == "done" and rows["a"]["rl"] == score(0.7)
    assert rows["b"]["status"] == "earlier" and rows["b"]["rl"] == score(0.5)
    assert rows["c"]["status"] == "missing" and "rl" not in rows["c"]
    assert "0.500 (0.400-0.600, n=100)" in capsys.readouterr().out

    (tmp_path / "other.json").write_text(json.dumps({**old, "sweep": "t"}))
    (out / "s" / "summary.json").unlink()
    assert sweep_main([*args, "--earlier", str(tmp_path / "other.json")]) == 2
    assert "not 's'" in capsys.readouterr().err
    assert sweep_main([*args, "--earlier", str(tmp_path / "none.json")]) == 2
    assert not (out / "s" / "summary.json").exists()


def test_a_report_keeps_the_per_task_scores(tmp_path):
    score = {"mean": 0.5, "ci_low": 0.3, "ci_high": 0.7, "n": 20, "by_task": {}}
    kept = {k: score[k] for k in ("mean", "ci_low", "ci_high", "n")}
    evals = {"sft": score, "rl": score, "rl:toy:count-2": score, "sft:toy:guess-2": score,
             "sft_epoch": score, "stage:toy:count-2": score, "per_update": {}}  # fmt: skip
    (tmp_path / "eval.json").write_text(json.dumps(evals))
    scores = report.run_scores(str(tmp_path))
    assert scores == dict.fromkeys(("sft", "rl", "rl:toy:count-2", "sft:toy:guess-2"), kept)


def test_a_report_task_compares_runs_on_that_task(tmp_path, capsys):
    """With report_task, a run that played several tasks is shown by that task's entry and
    a run that played only that task by its overall score."""
    spec = {"name": "s", "config": TOY, "runs": [{"name": "one"}, {"name": "two"}],
            "report_task": "toy:count-4"}  # fmt: skip
    path = write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    evals = {"one": {"sft": score(0.2), "rl": score(0.3)},
             "two": {"sft": score(0.5), "rl": score(0.6), "sft:toy:count-2": score(0.8),
                     "sft:toy:count-4": score(0.25), "rl:toy:count-4": score(0.35)}}  # fmt: skip
    for name, e in evals.items():
        (out / "s" / name).mkdir(parents=True)
        (out / "s" / name / "eval.json").write_text(json.dumps(e))
        (out / "s" / name / "summary.json").write_text("{}")
    assert sweep_main(["--sweep", path, "--output-dir", str(out), "--report"]) == 0
    printed = capsys.readouterr().out
    assert "after RL on toy:count-4" in printed
    rows = [line for line in printed.splitlines() if line.startswith(("one", "two"))]
    lines = {}
    for line in rows:  # the per-run table comes first, then the table over seeds
        lines.setdefault(line.split()[0], line)
    assert "0.300 (0.200-0.400" in lines["one"] and "0.350 (0.250-0.450" in lines["two"]
    assert "0.600" not in lines["two"]
    summary = json.loads((out / "s" / "summary.json").read_text())
    assert summary["report_task"] == "toy:count-4"
    assert (out / "s" / "success.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SweepError, match="report_task"):
        build_sweep({**spec, "report_task": 3})


def test_a_sweep_summary_over_seeds():
    """Two arms of three seeds; the second arm's SFT is missing at seed 2, and the
    report task picks the per-task entries of the run that played two tasks."""
    runs = [
        {"name": "direct,seed=0", "sft": score(0.40), "rl": score(0.42)},
        {"name": "curriculum,seed=0", "sft": score(0.9), "rl": score(0.9),
         "sft:t:hard": score(0.44), "rl:t:hard": score(0.43)},
        {"name": "direct,seed=1", "sft": score(0.37), "rl": score(0.40)},
        {"name": "curriculum,seed=1", "sft": score(0.36), "rl": score(0.37)},
        {"name": "direct,seed=2", "sft": score(0.50), "rl": score(0.55)},
        {"name": "curriculum,seed=2", "rl": score(0.60)},
    ]  # fmt: skip
    seeds = report.over_seeds({"runs": runs, "report_task": "t:hard"})
    direct, curriculum = seeds["arms"]["direct"], seeds["arms"]["curriculum"]
    assert direct["rl"]["mean"] == pytest.approx((0.42 + 0.40 + 0.55) / 3)
    assert direct["rl"]["seeds"] == 3 and curriculum["sft"]["seeds"] == 2
    assert curriculum["sft"]["per_seed"] == {0: 0.44, 1: 0.36}
    assert seeds["rl_gain"]["curriculum"]["per_seed"] == pytest.approx({0: -0.01, 1: 0.01})
    diff = seeds["difference"]
    assert (diff["first"], diff["second"]) == ("direct", "curriculum")
    assert diff["rl"]["per_seed"] == pytest.approx({0: 0.01, 1: -0.03, 2: 0.05})
    assert diff["sft"]["seeds"] == 2
    table = report.format_seed_table(seeds)
    assert "curriculum - direct after RL, paired by seed: +0.010" in table
    assert table.splitlines()[1].startswith("direct ")

    three = report.over_seeds({"runs": [{"name": f"{a},seed=0", "rl": score(0.5)}
                                           for a in "abc"]})  # fmt: skip
    assert "difference" not in three and list(three["arms"]) == ["a", "b", "c"]
    assert "(1 seed)" in report.format_seed_table(three)


def _games(*outcomes):
    """{game id: 0/1 outcome} as eval.json's "per_game" holds it."""
    return {f"g{i}": float(won) for i, won in enumerate(outcomes)}


# A real-model sweep over seeds 0-2: arm "sft.enabled=True" holds base, SFT and RL;
# arm "sft.enabled=False" (no SFT) base and RL only. The base model is the same in both.
BASE = {0: 0.10, 1: 0.12, 2: 0.08}
PRETRAINED = {
    "sft.enabled=True": {"base": BASE, "sft": {0: 0.30, 1: 0.35, 2: 0.28},
                         "rl": {0: 0.40, 1: 0.38, 2: 0.45}},
    "sft.enabled=False": {"base": BASE, "rl": {0: 0.20, 1: 0.15, 2: 0.22}},
}  # fmt: skip


def _cells(line):
    """A printed table line's cells (columns are two spaces or more apart)."""
    return re.split(r" {2,}", line)


def _pretrained_runs():
    """Summary rows of PRETRAINED; the seed-0 runs also kept each game's outcome."""
    runs = []
    for seed in (0, 1, 2):
        for arm, stages in PRETRAINED.items():
            runs.append({"name": f"{arm},seed={seed}", "status": "done",
                         **{stage: score(means[seed]) for stage, means in stages.items()}})
    per_game = {"base": _games(0, 0, 1, 0), "sft": _games(1, 0, 1, 0), "rl": _games(1, 1, 1, 0)}
    for row in runs[:2]:
        for stage in PRETRAINED[row["name"].split(",")[0]]:
            row[stage] = {**row[stage], "per_game": per_game[stage]}
    return runs


def test_a_pretrained_sweep_reports_the_base_model():
    """Base scores get their own columns; RL's gain over base is paired by seed in both
    arms, its gain over SFT only in the arm with SFT; each run's per-game lines hold
    every pair of stages it has."""
    summary = {"sweep": "s", "runs": _pretrained_runs()}
    table = report.format_table(summary).splitlines()
    assert _cells(table[0])[2:4] == ["success at base (95% CI)", "success after SFT (95% CI)"]
    no_sft = next(line for line in table if line.startswith("sft.enabled=False,seed=1"))
    assert no_sft.split()[2:5] == ["0.120", "(0.020-0.220,", "n=100)"] and " - " in no_sft

    seeds = report.over_seeds(summary)
    with_sft, without = seeds["arms"]["sft.enabled=True"], seeds["arms"]["sft.enabled=False"]
    assert with_sft["base"]["mean"] == pytest.approx(0.10) and "sft" not in without
    # RL - base by seed: 0.30, 0.26, 0.37 with SFT; 0.10, 0.03, 0.14 without.
    gain = seeds["rl_over_base"]["sft.enabled=True"]
    assert gain["per_seed"] == pytest.approx({0: 0.30, 1: 0.26, 2: 0.37})
    assert gain["mean"] == pytest.approx(0.31) and gain["seeds"] == 3
    gain = seeds["rl_over_base"]["sft.enabled=False"]
    assert gain["per_seed"] == pytest.approx({0: 0.10, 1: 0.03, 2: 0.14})
    assert gain["mean"] == pytest.approx(0.09)
    # RL - SFT by seed: 0.10, 0.03, 0.17, in the arm with SFT only.
    assert list(seeds["rl_gain"]) == ["sft.enabled=True"]
    assert seeds["rl_gain"]["sft.enabled=True"]["mean"] == pytest.approx(0.10)
    assert seeds["difference"]["base"]["mean"] == pytest.approx(0.0)
    assert "sft" not in seeds["difference"]

    seed_table = report.format_seed_table(seeds).splitlines()
    assert _cells(seed_table[0])[1:] == [
        "at base, over seeds (95% t)", "after SFT, over seeds (95% t)",
        "after RL, over seeds (95% t)", "RL - SFT, paired (95% t)",
        "RL - base, paired (95% t)"]  # fmt: skip
    assert seed_table[1].startswith("sft.enabled=True ") and "+0.310 (" in seed_table[1]
    # Without SFT: no SFT mean or RL - SFT; intervals mean +- 4.303 * sd / sqrt(3), e.g.
    # RL - base 0.09 +- 4.303 * 0.0557 / 1.732.
    assert _cells(seed_table[2])[1:] == [
        "0.100 (0.050 to 0.150, 3 seeds)", "-", "0.190 (0.100 to 0.280, 3 seeds)", "-",
        "+0.090 (-0.048 to +0.228, 3 seeds)"]  # fmt: skip
    assert seed_table[3:] == [
        "sft.enabled=False - sft.enabled=True at base, paired by seed: "
        "+0.000 (+0.000 to +0.000, 3 seeds)",
        "sft.enabled=False - sft.enabled=True after RL, paired by seed: "
        "-0.220 (-0.263 to -0.177, 3 seeds)"]  # fmt: skip

    lines = report.paired_game_lines(summary)
    assert lines == [
        "sft.enabled=True,seed=0: rl - sft on the same 4 games: +0.250 "
        "(won only rl: 1, only sft: 0; McNemar p = 1)",
        "sft.enabled=True,seed=0: rl - base on the same 4 games: +0.500 "
        "(won only rl: 2, only base: 0; McNemar p = 0.5)",
        "sft.enabled=True,seed=0: sft - base on the same 4 games: +0.250 "
        "(won only sft: 1, only base: 0; McNemar p = 1)",
        "sft.enabled=False,seed=0: rl - base on the same 4 games: +0.500 "
        "(won only rl: 2, only base: 0; McNemar p = 0.5)",
    ]


def test_a_from_scratch_sweep_prints_no_base_column():
    """Runs with SFT and RL scores only: the tables are exactly as before the base stage."""
    runs = [{"name": f"a,seed={seed}", "status": "done", "sft": score(0.3), "rl": score(0.5)}
            for seed in (0, 1)]  # fmt: skip
    summary = {"sweep": "s", "runs": runs}
    assert report.format_table(summary).splitlines() == [
        "run       status  success after SFT (95% CI)  success after RL (95% CI)",
        "a,seed=0  done    0.300 (0.200-0.400, n=100)  0.500 (0.400-0.600, n=100)",
        "a,seed=1  done    0.300 (0.200-0.400, n=100)  0.500 (0.400-0.600, n=100)"]
    seeds = report.over_seeds(summary)
    assert seeds["rl_over_base"] == {} and "base" not in seeds["arms"]["a"]
    assert report.format_seed_table(seeds).splitlines() == [
        "arm  after SFT, over seeds (95% t)    after RL, over seeds (95% t)     "
        "RL - SFT, paired (95% t)",
        "a    0.300 (0.300 to 0.300, 2 seeds)  0.500 (0.500 to 0.500, 2 seeds)  "
        "+0.200 (+0.200 to +0.200, 2 seeds)"]  # fmt: skip


def test_a_report_reads_base_scores_from_disk_and_earlier_summaries(tmp_path, capsys):
    """eval.json's "base" and "base:<task>" are read like SFT's and RL's; a run with only
    a base score counts as scored, so it is not taken from an earlier summary."""
    evals = {"base": {**score(0.1), "per_game": _games(0, 1)}, "rl": score(0.4),
             "base:toy:count-2": score(0.2), "base_T0.7": score(0.9)}  # fmt: skip
    (tmp_path / "eval.json").write_text(json.dumps(evals))
    scores = report.run_scores(str(tmp_path))
    assert sorted(scores) == ["base", "base:toy:count-2", "rl"]
    assert scores["base"]["per_game"] == _games(0, 1)

    summary = {"runs": [{"name": "a", "status": "unfinished", "base": score(0.1)},
                        {"name": "b", "status": "missing"}]}  # fmt: skip
    earlier = {"runs": [{"name": n, "status": "done", "base": score(0.3)} for n in "ab"]}
    rows = report.with_earlier_runs(summary, earlier)["runs"]
    assert [r["status"] for r in rows] == ["unfinished", "earlier"]
    assert rows[1]["base"] == score(0.3)
