"""Launching a sweep: printed commands (also from the console script), the dry run, and a
real local sweep of two tiny toy runs (plus one that fails) that a second invocation
skips or resumes."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from jaxrl_agents.cli import sweep_main
from jaxrl_agents.config import load_config, split_config_args
from jaxrl_agents.sweep import expand
from jaxrl_agents.sweep.expand import run_name
from tests.sweep.helpers import TOY, write_sweep

# The toy config made as small as tests/trainer/test_loop.py makes it, one RL update.
TINY = {
    "env.size": 2,
    "env.num_train_tasks": 4,
    "env.num_eval_tasks": 4,
    "rollout.episodes_per_batch": 4,
    "rl.episodes_per_epoch": 4,
    "rl.epochs": 1,
    "rl.minibatch_size": 4,
    "rl.ppo_epochs": 1,
    "sft.num_trajectories": 4,
    "sft.epochs": 1,
    "sft.batch_size": 4,
    "logging.progress_bar": False,
    "logging.tensorboard": False,
    "logging.plots": False,
}


# --- printed commands (nothing runs) -----------------------------------------------------


def test_print_commands_gives_one_train_line_per_run(tmp_path, capsys):
    spec = {"name": "lr", "config": TOY, "grid": {"rl.learning_rate": [1e-4, 1e-3]}}
    path = write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    assert sweep_main(["--sweep", path, "--output-dir", str(out), "--print-commands"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line, lr in zip(lines, (1e-4, 1e-3)):
        argv = shlex.split(line)
        assert argv[0] == "jaxrl-train"
        config_path, overrides, rest = split_config_args(argv[1:])
        cfg = load_config(config_path, overrides)
        assert rest == [] and cfg.rl.learning_rate == lr
        assert cfg.output_dir == str(out / "lr")
        assert cfg.name == run_name({"rl.learning_rate": lr})
    assert not out.exists()


def test_the_console_script_prints_the_repo_sweeps(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "jaxrl-sweep")
    for name, runs in (("toy_lr", 2), ("textworld_density", 6)):
        done = subprocess.run(
            [script, "--sweep", f"configs/sweeps/{name}.py", "--print-commands"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == runs and len(set(lines)) == runs
        assert all(f"--config.output_dir=runs/{name} " in line for line in lines)
    density = expand.load_sweep("configs/sweeps/textworld_density.py")
    assert {(r.overrides["env.reward_density"], r.overrides["seed"]) for r in density.runs} == {
        ("sparse", 0),
        ("sparse", 1),
        ("sparse", 2),
        ("dense", 0),
        ("dense", 1),
        ("dense", 2),
    }


def test_dry_run_tells_what_each_run_would_do(tmp_path, capsys):
    spec = {"name": "s", "config": TOY, "runs": [{"name": n} for n in ("a", "b", "c")]}
    path = write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    (out / "s" / "a").mkdir(parents=True)
    (out / "s" / "a" / "summary.json").write_text("{}")
    (out / "s" / "b" / "checkpoints" / "3").mkdir(parents=True)
    (out / "s" / "c" / "checkpoints" / "3.orbax-checkpoint-tmp-1").mkdir(parents=True)
    assert sweep_main(["--sweep", path, "--output-dir", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["skip", "resume", "start"]
    assert [line.split()[1] for line in lines] == [str(out / "s" / n) for n in "abc"]


# --- a real local sweep ------------------------------------------------------------------


@pytest.mark.slow
def test_local_sweep_runs_reports_and_skips_or_resumes_on_restart(tmp_path, capsys):
    spec = {
        "name": "tiny",
        "config": TOY,
        "overrides": TINY,
        "runs": [
            {"name": "broken", "env.name": "no_such_game"},  # fails inside jaxrl-train
            {"rl.learning_rate": 1e-3},
            {"rl.learning_rate": 3e-4},
        ],
    }
    path = write_sweep(tmp_path, spec)
    out = tmp_path / "out"
    good = ["rl.learning_rate=1e-3", "rl.learning_rate=3e-4"]

    assert sweep_main(["--sweep", path, "--output-dir", str(out)]) == 1
    first = capsys.readouterr()
    for name in good:
        run = out / "tiny" / name
        assert (run / "summary.json").exists() and (run / "eval.json").exists()
        assert json.loads((run / "config.json").read_text())["rl"]["learning_rate"] == float(
            name.split("=")[1]
        )
    broken_log = out / "tiny" / "broken" / "train.log"
    assert "no_such_game" in broken_log.read_text()
    assert f"run broken failed (exit code 1); log: {broken_log}" in first.err

    summary = json.loads((out / "tiny" / "summary.json").read_text())
    assert (out / "tiny" / "success.png").exists()
    rows = {r["name"]: r for r in summary["runs"]}
    assert [r["name"] for r in summary["runs"]] == ["broken", *good]
    assert rows["broken"]["status"] == "failed" and rows["broken"]["exit_code"] == 1
    assert "sft" not in rows["broken"] and "rl" not in rows["broken"]
    for name in good:
        evals = json.loads((out / "tiny" / name / "eval.json").read_text())
        assert rows[name]["status"] == "done" and rows[name]["exit_code"] == 0
        for stage in ("sft", "rl"):
            assert rows[name][stage] == {
                k: evals[stage][k] for k in ("mean", "ci_low", "ci_high", "n", "per_game")
            }
            assert rows[name][stage]["n"] == 4 and len(rows[name][stage]["per_game"]) == 4
        # each run's RL and SFT compared on the same games, with McNemar's test
        assert any(line.startswith(f"{name}: rl - sft on the same 4 games:")
                   and "McNemar p = " in line for line in first.out.splitlines())
    table = first.out.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("run "))
    assert "success after SFT (95% CI)" in table[header]
    assert "success after RL (95% CI)" in table[header]
    body = [line.split() for line in table[header + 1 : header + 4]]
    assert [row[0] for row in body] == ["broken", *good]
    assert body[0][1:] == ["failed", "(1)", "-", "-"]
    for row, name in zip(body[1:], good):
        sft, rl = rows[name]["sft"], rows[name]["rl"]
        assert row[1] == "done"
        assert row[2:4] == [f"{sft['mean']:.3f}", f"({sft['ci_low']:.3f}-{sft['ci_high']:.3f},"]
        assert row[5:7] == [f"{rl['mean']:.3f}", f"({rl['ci_low']:.3f}-{rl['ci_high']:.3f},"]

    # Restart: a finished run is skipped; one whose summary is gone resumes from its
    # checkpoints (no SFT again); the broken one is tried again.
    skipped, resumed = (out / "tiny" / name for name in good)
    skipped_log = (skipped / "train.log").read_text()
    (resumed / "summary.json").unlink()
    sft_rows = (resumed / "metrics.jsonl").read_text().count("sft/train_loss")
    assert sweep_main(["--sweep", path, "--output-dir", str(out)]) == 1
    second = capsys.readouterr()
    assert f"{good[0]}: finished before, skipped" in second.out
    assert (skipped / "train.log").read_text() == skipped_log
    resume_log = (resumed / "train.log").read_text().split("\n$ ")[-1]
    assert resume_log.split("\n")[0].endswith("--resume")
    assert (resumed / "summary.json").exists()
    assert (resumed / "metrics.jsonl").read_text().count("sft/train_loss") == sft_rows
    statuses = [
        r["status"] for r in json.loads((out / "tiny" / "summary.json").read_text())["runs"]
    ]
    assert statuses == ["failed", "skipped", "done"]
