"""The full-size recipe configs run end to end, with the model swapped for a tiny random one.

Everything else comes from the recipe file (algorithm, schedules, KL, reward density,
curriculum keys, remat / scan / bf16, mesh); only sizes shrink: no checkpoint download
(hf_path = ""), a tokenizer trained on the games, a few tasks, one SFT epoch, two RL updates.
The CPU-scale ALFWorld config runs the same way.
"""

import json
import os

import pytest

from jaxrl_agents.config import load_config
from jaxrl_agents.run_records import read_metrics
from jaxrl_agents.trainer.loop import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = ["qwen2_5_1_5b_textworld.py", "qwen2_5_7b_textworld.py"]


def tiny_overrides(out) -> list[str]:
    values = {
        "output_dir": str(out),
        "model.hf_path": "",
        "tokenizer.path": "",
        "tokenizer.vocab_size": 1024,
        "model.vocab_size": 1024,
        "model.hidden_size": 32,
        "model.intermediate_size": 64,
        "model.num_layers": 2,
        "model.num_heads": 2,
        "model.num_kv_heads": 1,
        "model.head_dim": 16,
        "env.num_train_tasks": 2,
        "env.num_eval_tasks": 1,
        "rollout.episodes_per_batch": 2,
        "rollout.max_action_tokens": 8,
        "rollout.max_context": 1024,
        "rollout.length_buckets": (1024,),
        "rollout.num_env_workers": 1,
        "sft.num_trajectories": 2,
        "sft.batch_size": 2,
        "sft.epochs": 1,
        "sft.eval_games": 0,
        "rl.epochs": 1,
        "rl.episodes_per_epoch": 4,  # two updates of two episodes
        "rl.minibatch_size": 2,
        "rl.ppo_epochs": 1,
        "rl.eval_every": 0,
        "checkpoint.every": 0,
        "logging.progress_bar": False,
        "logging.tensorboard": False,
        "logging.plots": False,
    }
    return [f"{k}={v}" for k, v in values.items()]


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_two_updates_with_a_tiny_model(tmp_path, recipe):
    path = os.path.join(ROOT, "configs", recipe)
    full = load_config(path)
    assert full.model.hf_path.startswith("Qwen/Qwen2.5-")
    assert full.tokenizer.path == full.model.hf_path
    cfg = load_config(path, tiny_overrides(tmp_path))
    assert (cfg.model.dtype, cfg.model.remat) == ("bfloat16", "full")
    summary = train(cfg)
    rows = [r for r in read_metrics(summary["run_dir"]) if "charts/success" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["losses/skipped"] == 0 for r in rows)
    assert summary["rl"]["n"] >= 1  # held-out play after RL (per stage with a curriculum)


def test_recipe_hyperparameters():
    small = load_config(os.path.join(ROOT, "configs", RECIPES[0]))
    assert small.env.name == "w2-o3-q4" and small.env.reward_density == "every_k"
    assert small.env.max_steps == 8 and small.sft.num_trajectories == 50
    assert small.rl.episodes_per_epoch * small.rl.epochs == 1000
    assert (small.rl.learning_rate, small.rl.lr_schedule) == (3e-6, "step_decay")
    big = load_config(os.path.join(ROOT, "configs", RECIPES[1]))
    assert (big.sft.learning_rate, big.sft.batch_size, big.sft.epochs) == (5e-6, 16, 3)
    assert (big.rl.learning_rate, big.kl.coef, big.algo.lam, big.algo.gamma) == (
        1e-6,
        0.1,
        0.95,
        0.99,
    )
    assert big.rl.episodes_per_epoch == 500 and big.curriculum.enabled
    assert big.curriculum.stages == ("w2-o3-q4", "w8-o3-q4", "w2-o12-q4", "w4-o6-q8")
    assert (big.curriculum.promote_above, big.curriculum.demote_below) == (0.75, 0.40)
    assert big.curriculum.eval_every_epochs == 5


@pytest.mark.slow
def test_alfworld_tiny_runs_and_is_tested_on_every_listed_type(tmp_path, monkeypatch):
    """configs/alfworld_tiny.py at tiny sizes, trained on pick_and_place_simple and tested
    on look_at_obj_in_light too: one held-out entry per type, step budgets pinned at 2x."""
    monkeypatch.setenv("JAXRL_CACHE", str(tmp_path / "games"))  # generated games go there
    extra = ["name=alfworld", "env.eval_tasks=('look_at_obj_in_light',)",
             "pretrain.episodes_per_task=1"]  # fmt: skip
    cfg = load_config(os.path.join(ROOT, "configs", "alfworld_tiny.py"),
                      tiny_overrides(tmp_path) + extra)  # fmt: skip
    summary = train(cfg)
    evals = json.loads((tmp_path / "alfworld" / "eval.json").read_text())
    for task in ("pick_and_place_simple", "look_at_obj_in_light"):
        assert evals[f"rl:alfworld:{task}-3"]["n"] == 1, sorted(evals)
    assert summary["rl"]["n"] == 2
    rows = [r for r in read_metrics(summary["run_dir"]) if "charts/success" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["budget/alfworld/pick_and_place_simple-3/factor"] == 2.0
    assert "budget/alfworld/look_at_obj_in_light-3/factor" not in rows[-1]  # never trained on
