"""A sweep's report: the runs on disk summarized without running any, runs taken from an
earlier summary, per-task scores and the report task, and the arms over their seeds."""

import json

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
