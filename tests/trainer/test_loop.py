"""End-to-end runs of the trainer on the toy family, most in subprocesses (small enough for CI)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jaxrl_agents.config import ConfigError, load_config
from jaxrl_agents.run_records import read_metrics
from jaxrl_agents.trainer.evaluation import even_chunk
from jaxrl_agents.trainer.loop import train

TIMING_KEYS = ("wall_time", "perf/", "rollout/wall_s", "rollout/model_s", "_frac")


def _overrides(out, name, **extra):
    values = {
        "output_dir": str(out),
        "name": name,
        "env.size": 2,
        "env.num_train_tasks": 4,
        "env.num_eval_tasks": 4,
        "rollout.episodes_per_batch": 4,
        "rl.episodes_per_epoch": 20,
        "rl.minibatch_size": 4,
        "rl.ppo_epochs": 1,
        "sft.num_trajectories": 4,
        "sft.epochs": 3,
        "sft.batch_size": 4,
        "checkpoint.every": 1,
        "logging.progress_bar": False,
        "logging.tensorboard": False,
        "logging.plots": False,
    }
    values.update(extra)
    return [f"--config.{k}={v}" for k, v in values.items()]


def _train_cmd(out, name, *extra_args, **extra):
    return [
        sys.executable,
        "-m",
        "jaxrl_agents.cli",
        "--config",
        "configs/toy_tiny.py",
        *_overrides(out, name, **extra),
        *extra_args,
    ]


def _comparable(rows):
    return [{k: v for k, v in row.items() if not any(t in k for t in TIMING_KEYS)} for row in rows]


@pytest.mark.slow
def test_run_writes_its_outputs_and_sft_loss_falls(tmp_path):
    cmd = _train_cmd(tmp_path, "full", **{"logging.plots": True, "sft.epochs": 6})
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "full"
    assert "held-out success after SFT" in done.stdout
    assert "held-out success after RL" in done.stdout
    assert f"(jaxrl-eval --run {run} --read rl)" in done.stdout  # how the games ended
    for name in ("config.json", "metrics.jsonl", "eval.json", "summary.json"):
        assert (run / name).exists(), name
    assert list((run / "plots").glob("*.png"))
    evals = json.loads((run / "eval.json").read_text())
    assert evals["sft"]["n"] == 4 and evals["rl"]["n"] == 4
    sft = [r for r in read_metrics(str(run)) if "sft/train_loss" in r]
    assert len(sft) == 6 and sft[-1]["sft/train_loss"] < sft[0]["sft/train_loss"]
    rl = [r for r in read_metrics(str(run)) if "charts/success" in r]
    assert [r["step"] for r in rl] == [1, 2, 3, 4, 5]
    for key in (
        "charts/return_mean",
        "charts/return_var",
        "kl/ref_kl",
        "losses/entropy",
        "charts/action_coverage",
        "charts/tampered_episodes",
        "perf/tokens_per_s",
    ):
        assert key in rl[-1], key
    last = rl[-1]  # the update's token count, and its rate over the update's wall time
    assert last["perf/tokens"] > 0 and last["perf/tokens_per_s"] == pytest.approx(
        last["perf/tokens"] / (last["perf/rollout_s"] + last["perf/update_s"]))
    # The rollout's compiling is a share of its time; the first sampled rollout compiles.
    assert all(0 <= r["perf/rollout_compile_s"] <= r["perf/rollout_s"] for r in rl)
    assert rl[0]["perf/rollout_compile_s"] > 0


def test_pretraining_runs_without_sft(tmp_path):
    """pretrain.episodes_per_task > 0 with SFT off: language-model pretraining still runs
    (as jaxrl-plan assumes), and its policy is checkpointed at step 0 before RL."""
    overrides = _overrides(tmp_path, "pretrain", **{"sft.enabled": False,
                                                    "pretrain.episodes_per_task": 1,
                                                    "pretrain.epochs": 1,
                                                    "rl.episodes_per_epoch": 4})  # fmt: skip
    summary = train(load_config("configs/toy_tiny.py", overrides))
    rows = read_metrics(str(tmp_path / "pretrain"))
    assert any("pretrain/train_loss" in r for r in rows)
    assert "pretrain" in summary and "sft" not in summary
    assert (tmp_path / "pretrain" / "checkpoints" / "0").is_dir()
    # The held-out games of the final evaluation, one line each, as eval.json counts them.
    with open(tmp_path / "pretrain" / "eval_episodes" / "rl.jsonl") as f:
        games = [json.loads(line) for line in f]
    per_game = summary["rl"]["per_game"]
    assert sorted(g["task_id"] for g in games) == sorted(per_game)
    assert all(float(g["won"]) == per_game[g["task_id"]] for g in games)
    assert all(len(g["actions"]) == g["steps"] == len(g["turn_rewards"]) >= 1 for g in games)


@pytest.mark.slow
def test_sigkill_and_resume_gives_the_same_metrics(tmp_path):
    def cmd(name, *args):  # with pretraining on: both supervised phases precede the kill
        return _train_cmd(tmp_path, name, *args,
                          **{"pretrain.episodes_per_task": 1, "pretrain.epochs": 1})

    straight = subprocess.run(cmd("straight"), capture_output=True, text=True, timeout=1800)
    assert straight.returncode == 0, straight.stderr[-3000:]

    ckpt = tmp_path / "killed" / "checkpoints"
    proc = subprocess.Popen(
        cmd("killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and proc.poll() is None:
            steps = [int(p) for p in os.listdir(ckpt) if p.isdigit()] if ckpt.exists() else []
            if steps and max(steps) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    resumed = subprocess.run(
        cmd("killed", "--resume"), capture_output=True, text=True, timeout=1800
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = _comparable(read_metrics(str(tmp_path / "straight")))
    got = _comparable(read_metrics(str(tmp_path / "killed")))
    assert got == want
    a = json.loads((tmp_path / "straight" / "eval.json").read_text())
    b = json.loads((tmp_path / "killed" / "eval.json").read_text())
    assert a["rl"]["mean"] == b["rl"]["mean"] and a["sft"]["mean"] == b["sft"]["mean"]
    # The resumed run's summary.json still reports the phases run before the kill.
    a, b = (json.loads((tmp_path / run / "summary.json").read_text())
            for run in ("straight", "killed"))
    assert b["sft"] == a["sft"] and b["pretrain"] == a["pretrain"]


@pytest.mark.slow
def test_each_task_gets_its_own_held_out_entry(tmp_path):
    """A run on count with guess listed in env.eval_tasks: after SFT and after RL, eval.json
    has one entry per task besides the one over all held-out games."""
    overrides = _overrides(tmp_path, "per_task", **{"env.eval_tasks": "('guess',)",
                           "env.num_eval_tasks": 3, "rl.episodes_per_epoch": 4,
                           "sft.epochs": 1, "checkpoint.every": 0})  # fmt: skip
    summary = train(load_config("configs/toy_tiny.py", overrides))
    evals = json.loads((tmp_path / "per_task" / "eval.json").read_text())
    tasks = ("toy:count-2", "toy:guess-2")
    for stage in ("sft", "rl"):
        parts = [evals[f"{stage}:{task}"] for task in tasks]
        assert [part["n"] for part in parts] == [3, 3], stage
        wins = sum(round(part["mean"] * part["n"]) for part in parts)
        assert wins == round(evals[stage]["mean"] * evals[stage]["n"]) and evals[stage]["n"] == 6
        assert evals[stage]["by_task"] == {task: part["mean"] for task, part in zip(tasks, parts)}
    assert summary["rl"] == evals["rl"]


@pytest.mark.slow
def test_jaxrl_eval_plays_greedy_or_sampled(tmp_path, capsys):
    """jaxrl-eval on a finished run: greedy play reproduces the run's own figure after RL;
    sampled play (3 per game) is written as eval_T1 with an interval over games and is
    reproducible from its seed; bad flags exit 2."""
    from jaxrl_agents import cli

    overrides = _overrides(tmp_path, "ev", **{"rl.episodes_per_epoch": 8, "sft.epochs": 1,
                                             "checkpoint.every": 0})
    train(load_config("configs/toy_tiny.py", overrides))
    run = str(tmp_path / "ev")
    assert cli.eval_main(["--run", run]) == 0
    evals = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert evals["eval"]["mean"] == evals["rl"]["mean"] and evals["eval"]["n"] == 4
    # A checkpoint named by --step is its own stage: an earlier evaluation is kept.
    last = max(int(p.name) for p in (tmp_path / "ev" / "checkpoints").iterdir()
               if p.name.isdigit())
    assert cli.eval_main(["--run", run, "--step", str(last)]) == 0
    evals = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert evals[f"eval-step{last}"]["per_game"] == evals["eval"]["per_game"]
    assert (tmp_path / "ev" / "eval_episodes" / f"eval-step{last}.jsonl").exists()
    assert (tmp_path / "ev" / "eval_episodes" / "eval.jsonl").exists()
    sampled = []
    for _ in range(2):
        assert cli.eval_main(["--run", run, "--temperature", "1", "--samples", "3"]) == 0
        sampled.append(json.loads((tmp_path / "ev" / "eval.json").read_text())["eval_T1"])
    assert sampled[0] == sampled[1]
    got = sampled[0]
    assert (got["n"], got["games"], got["samples_per_game"]) == (12, 4, 3)
    assert 0.0 <= got["ci_low"] <= got["mean"] <= got["ci_high"] <= 1.0
    out = capsys.readouterr().out
    assert "sampled at temperature 1, 3 per game" in out and "4 games, 12 episodes" in out
    assert cli.eval_main(["--run", run, "--samples", "2"]) == 2
    assert cli.eval_main(["--run", run, "--temperature", "-1"]) == 2


def test_bad_configs_are_rejected_with_the_key_named():
    with pytest.raises(ConfigError, match="algo.estimator"):
        load_config("configs/toy_tiny.py", ["--config.algo.estimator=ppo"])
    with pytest.raises(ConfigError, match="rl.minibatch_size"):
        load_config("configs/toy_tiny.py", ["--config.rl.minibatch_size=0"])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxrl_agents.cli",
            "--config",
            "configs/toy_tiny.py",
            "--config.rl.learnin_rate=1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and "rl.learnin_rate" in done.stderr


def test_every_experiment_config_loads():
    for name in sorted(os.listdir("configs")):
        if name.endswith(".py") and name != "__init__.py":
            load_config(os.path.join("configs", name))


@pytest.mark.slow
def test_rl_success_rises_on_a_toy_task(tmp_path):
    """PPO from scratch (no SFT) on four toy count tasks with one step each, actions
    constrained to the five offered numbers: a random policy wins 1 in 5; 30 updates of 16
    episodes (4 per task) more than double that. Measured: seeds 0 and 1 went from 0.33 over
    the first three updates to 0.65 and 0.80 over the last five."""
    cmd = _train_cmd(
        tmp_path, "rise",
        **{"env.size": 1, "env.max_steps": 1, "env.num_train_tasks": 4,
           "env.num_eval_tasks": 4, "sft.enabled": False, "rollout.constrain_actions": True,
           "rollout.episodes_per_batch": 16, "rollout.group_size": 4,
           "rl.episodes_per_epoch": 480, "rl.minibatch_size": 8, "rl.ppo_epochs": 2,
           "checkpoint.every": 0},
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    success = [r["charts/success"] for r in read_metrics(str(tmp_path / "rise"))
               if "charts/success" in r]
    assert len(success) == 30
    first, last = sum(success[:3]) / 3, sum(success[-5:]) / 5
    assert first < 0.45, success
    assert last >= first + 0.25, success


@pytest.mark.parametrize("n", [1, 4, 31, 32, 33, 100, 200])
def test_evaluation_batches_are_even(n):
    """Held-out games go in the fewest batches of at most 32 (episodes_per_batch), the last
    short of the others by less than the number of batches (100 games: 4 x 25, not
    3 x 32 + 4), so it falls in the same batch bucket and compiles no programs of its own."""
    size = even_chunk(n, 32)
    sizes = [min(size, n - start) for start in range(0, n, size)]
    assert size <= 32 and len(sizes) == -(-n // 32) and sum(sizes) == n
    assert size - sizes[-1] < len(sizes)
