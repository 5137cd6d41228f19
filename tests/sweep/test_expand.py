"""Sweep expansion: grid order and run names, run lists, overrides as jaxrl-train parses
them, malformed sweep files and bad keys refused before anything runs, and the runs of the
repository's own sweep files."""

import os

import pytest

from jaxrl_agents.cli import sweep_main
from jaxrl_agents.config import load_config, split_config_args
from jaxrl_agents.sweep import expand
from jaxrl_agents.sweep.expand import SweepError, build_sweep, run_name
from tests.sweep.helpers import TOY, write_sweep


def test_grid_expands_to_the_cartesian_product_in_written_order():
    sweep = build_sweep(
        {
            "name": "s",
            "config": TOY,
            "overrides": {"rl.epochs": 2},
            "grid": {"rl.learning_rate": [1e-4, 3e-4], "seed": [0, 1, 2]},
        }
    )
    want = [(lr, seed) for lr in (1e-4, 3e-4) for seed in (0, 1, 2)]
    assert [(r.overrides["rl.learning_rate"], r.overrides["seed"]) for r in sweep.runs] == want
    assert all(r.overrides["rl.epochs"] == 2 for r in sweep.runs)
    assert [r.name for r in sweep.runs] == [
        f"rl.learning_rate={lr},seed={seed}" for lr in ("1e-4", "3e-4") for seed in (0, 1, 2)
    ]
    assert (sweep.name, sweep.config) == ("s", TOY)


def test_run_names_are_readable_file_safe_and_distinct():
    assert run_name({"rl.learning_rate": 1e-4, "seed": 1}) == "rl.learning_rate=1e-4,seed=1"
    assert run_name({"kl.coef": 0.05, "model.qkv_bias": True}) == "kl.coef=0.05,model.qkv_bias=True"
    assert run_name({"rollout.length_buckets": (256, 512)}) == "rollout.length_buckets=256_512"
    assert run_name({"env.name": "a/b c"}) == "env.name=a_b_c"
    long_a = run_name({"model.hf_path": "x" * 200 + "a"})
    long_b = run_name({"model.hf_path": "x" * 200 + "b"})
    assert long_a != long_b
    assert len(long_a) == len(long_b) == expand.MAX_NAME_LEN
    for name in (long_a, "rl.learning_rate=1e-4,seed=1"):
        assert "/" not in name and expand.safe_name(name) == name


def test_a_run_list_takes_given_names_or_derives_them():
    sweep = build_sweep(
        {
            "name": "s",
            "config": TOY,
            "runs": [{"name": "low", "rl.learning_rate": 1e-5}, {"rl.learning_rate": 1e-3}],
        }
    )
    assert [r.name for r in sweep.runs] == ["low", "rl.learning_rate=1e-3"]
    assert [r.overrides for r in sweep.runs] == [
        {"rl.learning_rate": 1e-5},
        {"rl.learning_rate": 1e-3},
    ]


def test_overrides_become_the_values_jaxrl_train_parses(tmp_path):
    sweep = build_sweep(
        {
            "name": "s",
            "config": TOY,
            "runs": [
                {
                    "rl.learning_rate": 1.2345678901234e-4,
                    "rollout.length_buckets": (128, 512),
                    "env.reward_density": "sparse",
                    "model.tie_embeddings": False,
                    "seed": 7,
                }
            ],
        }
    )
    (run,) = sweep.runs
    path, overrides, rest = split_config_args(expand.train_args(sweep, run, str(tmp_path)))
    cfg = load_config(path, overrides)
    assert rest == []
    assert cfg.rl.learning_rate == 1.2345678901234e-4
    assert cfg.rollout.length_buckets == (128, 512)
    assert cfg.env.reward_density == "sparse" and cfg.model.tie_embeddings is False
    assert cfg.seed == 7 and cfg.name == run.name
    assert cfg.output_dir == os.path.join(str(tmp_path), "s")


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"config": TOY, "grid": {"seed": [0]}}, "'name'"),
        ({"name": "s", "grid": {"seed": [0]}}, "'config'"),
        ({"name": "s", "config": TOY}, "exactly one of"),
        ({"name": "s", "config": TOY, "grid": {"seed": [0]}, "runs": [{}]}, "exactly one of"),
        ({"name": "s", "config": TOY, "grid": {"seed": []}}, "'seed'"),
        ({"name": "s", "config": TOY, "grid": {"env.name": "count"}}, "'env.name'"),
        ({"name": "s", "config": TOY, "grid": {"output_dir": ["a"]}}, "'output_dir'"),
        ({"name": "s", "config": TOY, "grid": {"name": ["a", "b"]}}, "'name'"),
        ({"name": "s", "config": TOY, "runs": [{"seed": 0}, {"seed": 0}]}, "'seed=0'"),
        ({"name": "s", "config": TOY, "runs": [{"name": "a/b", "seed": 0}]}, "'a/b'"),
        ({"name": "s", "config": TOY, "runs": [{"seed": 0}], "gird": {}}, "'gird'"),
        ({"name": "a b", "config": TOY, "grid": {"seed": [0]}}, "'a b'"),
        ({"name": "s", "config": TOY, "runs": [{"name": "summary.json"}]}, "summary file"),
        ({"name": "s", "config": TOY, "overrides": [1], "grid": {"seed": [0]}}, "'overrides'"),
    ],
)
def test_malformed_sweeps_are_rejected(spec, message):
    with pytest.raises(SweepError, match=message):
        build_sweep(spec)


# --- validation (nothing runs) -----------------------------------------------------------


@pytest.mark.parametrize(
    "grid, key",
    [
        ({"seed": [0], "rl.learnin_rate": [1e-4, 1e-3]}, "rl.learnin_rate"),
        ({"rl.epochs": ["two"]}, "rl.epochs"),
        ({"env.reward_density": ["dense", "often"]}, "env.reward_density"),
    ],
)
def test_bad_grid_keys_stop_the_sweep_before_anything_runs(tmp_path, capsys, grid, key):
    path = write_sweep(tmp_path, {"name": "bad", "config": TOY, "grid": grid})
    out = tmp_path / "out"
    assert sweep_main(["--sweep", path, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert key in err and err.startswith("jaxrl-sweep: ")
    assert not out.exists()


def _run_configs(path, tmp_path):
    """(run, its loaded config) for every run of the repo sweep at `path`, after the
    sweep's own validation, built from the exact arguments `jaxrl-train` would get."""
    sweep = expand.load_sweep(path)
    expand.validate(sweep, str(tmp_path))
    for run in sweep.runs:
        _, overrides, _ = split_config_args(expand.train_args(sweep, run, str(tmp_path)))
        yield run, load_config(sweep.config, overrides)


def test_the_alfworld_mix_sweep_tests_both_arms_on_every_type(tmp_path):
    """Single type vs a mix of the six, three seeds each; every run's layout holds the 50
    held-out games of all six types, and trains on one type or on all six."""
    from jaxrl_agents.trainer.setup import EnvLayout

    arms = {}
    for run, cfg in _run_configs("configs/sweeps/alfworld_mix.py", tmp_path):
        layout = EnvLayout(cfg)
        assert len(layout.groups) == 6, run.name
        assert all(len(g.eval_ids) == 50 for g in layout.groups.values()), run.name
        trained = sorted(k for k, g in layout.groups.items() if g.train_tasks)
        arms.setdefault(run.name.split(",")[0], []).append((cfg.seed, trained, layout.num_train))
    single, mix = arms.pop("single"), arms.pop("mix")
    assert not arms and [s[0] for s in single] == [s[0] for s in mix] == [0, 1, 2]
    assert all(t == ["alfworld:pick_and_place_simple-3"] and n == 64 for _, t, n in single)
    assert all(len(t) == 6 and n == 66 for _, t, n in mix)


def test_the_complexity_sweep_trains_and_tests_each_config_alone(tmp_path):
    """Claim 2: w2-o12-q4 (objects) and w8-o3-q4 (rooms), three seeds each; every run
    trains and is tested on its own config's 100 held-out games."""
    from jaxrl_agents.trainer.setup import EnvLayout

    seeds = {}
    for run, cfg in _run_configs("configs/sweeps/textworld_complexity.py", tmp_path):
        groups = EnvLayout(cfg).groups
        assert list(groups) == [f"textworld:{cfg.env.name}"], run.name
        assert len(groups[f"textworld:{cfg.env.name}"].eval_ids) == 100, run.name
        seeds.setdefault(cfg.env.name, []).append(cfg.seed)
    assert seeds == {"w2-o12-q4": [0, 1, 2], "w8-o3-q4": [0, 1, 2]}


def test_the_curriculum_sweep_tests_both_arms_on_w4_o6_q8(tmp_path):
    """Claim 1: direct training on w4-o6-q8 vs a curriculum from w2-o3-q4, three seeds each;
    both arms hold the 100 held-out w4-o6-q8 games, fit 16-step episodes in the context and
    split each minibatch into micro-batches."""
    from jaxrl_agents.trainer.setup import EnvLayout

    arms = {}
    for run, cfg in _run_configs("configs/sweeps/textworld_curriculum.py", tmp_path):
        groups = EnvLayout(cfg).groups
        target = "textworld:w4-o6-q8"
        assert target in groups and len(groups[target].eval_ids) == 100, run.name
        assert cfg.env.max_steps == 16 and cfg.rollout.max_context == 4096, run.name
        assert max(cfg.rollout.length_buckets) == cfg.rollout.max_context, run.name
        assert cfg.rl.minibatch_size // cfg.rl.grad_accum == 4, run.name
        assert cfg.rl.epochs * cfg.rl.episodes_per_epoch // cfg.rollout.episodes_per_batch == 12
        arms.setdefault(run.name.split(",")[0], []).append((cfg.seed, sorted(groups)))
    direct, curriculum = arms.pop("direct"), arms.pop("curriculum")
    assert not arms and [d[0] for d in direct] == [c[0] for c in curriculum] == [0, 1, 2]
    assert all(g == ["textworld:w4-o6-q8"] for _, g in direct)
    assert all(g == ["textworld:w2-o3-q4", "textworld:w4-o6-q8"] for _, g in curriculum)


def test_the_real_model_sweep_has_both_arms_on_three_seeds(tmp_path):
    """configs/sweeps/textworld_smollm2.py: PPO alone (the recipe, RL learning rate 5e-5)
    and SFT + PPO (RL learning rate 1e-5) on SmolLM2, seeds 0-2, each run on the recipe's
    100 held-out games."""
    from jaxrl_agents.trainer.setup import EnvLayout

    arms = {}
    for run, cfg in _run_configs("configs/sweeps/textworld_smollm2.py", tmp_path):
        assert cfg.model.hf_path == "smollm2-135m-instruct", run.name
        assert len(EnvLayout(cfg).groups["textworld:w2-o3-q4"].eval_ids) == 100, run.name
        arms.setdefault(run.name.split(",")[0], []).append(
            (cfg.seed, cfg.sft.enabled, cfg.rl.learning_rate))
    assert arms == {"sft_ppo": [(0, True, 1e-5), (1, True, 1e-5), (2, True, 1e-5)],
                    "ppo_only": [(0, False, 5e-5), (1, False, 5e-5), (2, False, 5e-5)]}
