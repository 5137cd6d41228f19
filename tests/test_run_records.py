"""The run directory: an earlier run's files set aside for a fresh run."""

import os

from jaxrl_agents.logging import RunLogger
from jaxrl_agents.run_records import read_metrics, set_aside_previous_run


def test_a_fresh_run_sets_an_earlier_runs_files_aside(tmp_path):
    run = tmp_path / "run"
    assert set_aside_previous_run(str(run)) is None  # no directory yet
    run.mkdir()
    (run / "train.log").write_text("the sweep's log\n")
    assert set_aside_previous_run(str(run)) is None  # no run in it yet
    with RunLogger(str(run), total=1, progress_bar=False) as log:
        log.log(1, {"loss": 1.0})
        log.write_eval("rl", {"mean": 0.5})
    (run / "checkpoints" / "1").mkdir(parents=True)
    before = sorted(os.listdir(run))

    moved = set_aside_previous_run(str(run))

    assert moved is not None and os.path.dirname(moved) == str(run / "previous")
    assert sorted(os.listdir(run)) == ["previous", "train.log"]  # the sweep's log stays
    assert sorted(os.listdir(moved)) == [n for n in before if n != "train.log"]
    assert read_metrics(moved)[0]["loss"] == 1.0  # nothing lost
    with RunLogger(str(run), total=1, progress_bar=False) as log:
        log.log(1, {"loss": 2.0})
    assert [r["loss"] for r in read_metrics(str(run))] == [2.0]
