"""Runs that start from pretrained weights (model.hf_path): held-out stage "base" before any
training, written by jaxrl-train and by jaxrl-eval without a checkpoint."""

import json
import math

import pytest

from jaxrl_agents import cli
from jaxrl_agents.config import load_config
from jaxrl_agents.trainer.loop import train
from tests.models.hf_helpers import make_hf_model

SMOLLM2 = "configs/textworld_smollm2.py"


def _toy_overrides(out, name, **extra):
    values = {"output_dir": str(out), "name": name, "env.size": 2, "env.num_train_tasks": 4,
              "env.num_eval_tasks": 4, "rollout.episodes_per_batch": 4,
              "rl.episodes_per_epoch": 4, "rl.minibatch_size": 4, "rl.ppo_epochs": 1,
              "sft.num_trajectories": 4, "sft.epochs": 1, "sft.batch_size": 4,
              "checkpoint.every": 0, "logging.progress_bar": False,
              "logging.tensorboard": False, "logging.plots": False, **extra}
    return [f"--config.{k}={v}" for k, v in values.items()]


def test_train_from_a_checkpoint_records_base_then_sft_then_rl(tmp_path):
    """A toy run from a tiny Hugging Face checkpoint: eval.json reads base -> sft -> rl,
    the summary reports base, and `jaxrl-eval --base` replays the same base figure."""
    make_hf_model("llama", vocab=800, hidden=32, layers=1).save_pretrained(tmp_path / "ckpt")
    overrides = _toy_overrides(tmp_path, "pre", **{"model.hf_path": tmp_path / "ckpt"})
    summary = train(load_config("configs/toy_tiny.py", overrides))
    evals = json.loads((tmp_path / "pre" / "eval.json").read_text())
    assert [k for k in evals if k != "per_update"] == ["base", "sft", "rl"]
    assert evals["base"]["n"] == 4 and summary["base"] == evals["base"]
    assert evals["base"]["invalid_action_share"] is not None
    assert cli.eval_main(["--run", str(tmp_path / "pre"), "--base"]) == 0
    again = json.loads((tmp_path / "pre" / "eval.json").read_text())["base"]
    assert again == evals["base"]  # greedy play of the same weights on the same games
    assert cli.eval_main(["--run", str(tmp_path / "pre"), "--base", "--step", "0"]) == 2


def test_base_evaluation_can_be_skipped(tmp_path):
    """rl.eval_base=False: a run from pretrained weights goes straight to SFT; eval.json
    reads sft -> rl."""
    make_hf_model("llama", vocab=800, hidden=32, layers=1).save_pretrained(tmp_path / "ckpt")
    overrides = _toy_overrides(tmp_path, "nobase", **{"model.hf_path": tmp_path / "ckpt",
                                                      "rl.eval_base": False})
    summary = train(load_config("configs/toy_tiny.py", overrides))
    evals = json.loads((tmp_path / "nobase" / "eval.json").read_text())
    assert [k for k in evals if k != "per_update"] == ["sft", "rl"]
    assert "base" not in summary


def test_eval_without_checkpoint_or_pretrained_weights_says_so(tmp_path, capsys):
    assert cli.eval_main(["--config", "configs/toy_tiny.py",
                          *_toy_overrides(tmp_path, "none")]) == 2
    assert "no pretrained weights (model.hf_path)" in capsys.readouterr().err


@pytest.mark.slow
def test_zero_shot_smollm2_on_held_out_games(tmp_path, capsys):
    """jaxrl-eval on the SmolLM2 config with no run yet plays the real pretrained weights
    (offline, the preset) on two held-out games: greedy with constrained decoding as stage
    "base" (no invalid action possible), then free text sampled as "base_T1" with the share
    of invalid actions reported."""
    small = _smollm2_overrides(tmp_path)
    assert cli.eval_main(["--config", SMOLLM2, *small]) == 0
    assert cli.eval_main(["--config", SMOLLM2, *small, "--temperature", "1",
                          "--config.rollout.constrain_actions=False"]) == 0
    evals = json.loads((tmp_path / "textworld_smollm2" / "eval.json").read_text())
    greedy, free = evals["base"], evals["base_T1"]
    assert greedy["n"] == free["n"] == 2 and greedy["failed"] == free["failed"] == 0
    assert greedy["invalid_action_share"] == 0.0
    assert 0.0 <= free["invalid_action_share"] <= 1.0
    assert "invalid actions:" in capsys.readouterr().out


def _smollm2_overrides(out):
    """Two held-out games (and two train games, built but not played) of at most 3 steps."""
    values = {"output_dir": str(out), "env.num_eval_tasks": 2, "env.num_train_tasks": 2,
              "env.max_steps": 3, "rollout.episodes_per_batch": 2}
    return [f"--config.{k}={v}" for k, v in values.items()]


@pytest.mark.slow
def test_smollm2_recipe_runs_one_rl_update_on_real_games(tmp_path):
    """The real-model recipe's RL end to end on the real weights, at the smallest size: base
    on two held-out games, one PPO update of two episodes with the recipe's frozen lower
    layers, then the held-out games again (SFT off: with 2-step episodes no golden
    trajectory fits). Checks the machinery (stages recorded, finite losses, the update's
    time split), not a gain."""
    values = {"output_dir": str(tmp_path), "env.num_eval_tasks": 2, "env.num_train_tasks": 2,
              "env.max_steps": 2, "rollout.episodes_per_batch": 2, "sft.enabled": False,
              "rl.episodes_per_epoch": 2, "rl.minibatch_size": 2, "rl.grad_accum": 1,
              "rl.ppo_epochs": 1, "rl.value_warmup_updates": 0, "checkpoint.every": 0,
              "logging.progress_bar": False, "logging.tensorboard": False,
              "logging.plots": False}
    cfg = load_config(SMOLLM2, [f"--config.{k}={v}" for k, v in values.items()])
    assert cfg.rl.frozen_layers == 24
    train(cfg)
    run = tmp_path / "textworld_smollm2"
    evals = json.loads((run / "eval.json").read_text())
    assert [k for k in evals if k != "per_update"] == ["base", "rl"]
    assert all(evals[k]["n"] == 2 and evals[k]["failed"] == 0 for k in ("base", "rl"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    update = [r for r in rows if "losses/total" in r]
    assert len(update) == 1
    for key in ("losses/total", "losses/policy", "losses/value", "losses/approx_kl",
                "perf/prepare_s", "perf/train_steps_s"):
        assert math.isfinite(update[0][key]), key
    # the rollout kept the frozen layers' output, so `prepare` did not run them again
    assert update[0]["perf/frozen_output_reused"] == 1.0
