import ml_collections
import pytest

from configs import base
from jaxrl_agents.config import (
    CHOICES,
    ConfigError,
    apply_override,
    load_config,
    split_config_args,
    validate,
)

BASE = "configs/base.py"


def test_base_defaults_from_the_recipe():
    cfg = load_config(BASE)
    assert cfg.algo.estimator == "gae"
    assert cfg.algo.gamma == 0.99 and cfg.algo.lam == 0.95
    assert cfg.kl.coef == 0.1 and cfg.algo.clip_eps == 0.2
    assert (cfg.sft.learning_rate, cfg.sft.batch_size, cfg.sft.epochs) == (5e-6, 16, 3)
    assert cfg.sft.val_fraction == 0.2
    assert cfg.rl.learning_rate == 1e-6 and cfg.rl.episodes_per_epoch == 500
    assert cfg.curriculum.promote_above == 0.75 and cfg.curriculum.demote_below == 0.40


def test_every_base_key_has_a_comment():
    lines = open(BASE).read().splitlines()
    assigns = [ln for ln in lines if ln.strip().startswith("c.") and " = " in ln]
    missing = [
        ln for ln in assigns if "#" not in ln and "ConfigDict()" not in ln and "lock" not in ln
    ]
    assert not missing, missing


def test_overrides_are_typed():
    cfg = load_config(
        BASE,
        [
            "--config.rl.learning_rate=3e-4",
            "rl.ppo_epochs=4",
            "--config.algo.grpo_std_normalize=false",
            "--config.rollout.stop_strings=('\\n', '.')",
            "--config.env.name=w4-o6-q8",
            "--config.rl.learning_rate=1",  # int accepted for a float field
        ],
    )
    assert cfg.rl.learning_rate == 1.0 and isinstance(cfg.rl.learning_rate, float)
    assert cfg.rl.ppo_epochs == 4
    assert cfg.algo.grpo_std_normalize is False
    assert cfg.rollout.stop_strings == ("\n", ".")
    assert cfg.env.name == "w4-o6-q8"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("--config.rl.learnin_rate=1e-3", "rl.learnin_rate"),
        ("--config.nosection.x=1", "nosection"),
        ("--config.rl.ppo_epochs=two", "rl.ppo_epochs"),
        ("--config.rl.ppo_epochs=1.5", "rl.ppo_epochs"),
        ("--config.sft.enabled=maybe", "sft.enabled"),
        ("--config.rl=3", "rl"),
        ("--config.rl.ppo_epochs", "key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, needle):
    cfg = load_config(BASE)
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        apply_override(cfg, override)


def test_choices_are_checked():
    with pytest.raises(ConfigError, match="algo.estimator.*allowed"):
        load_config(BASE, ["--config.algo.estimator=ppo2"])
    with pytest.raises(ConfigError, match="algo.gamma"):
        load_config(BASE, ["--config.algo.gamma=1.5"])
    for bad, needle in (("rl.logits_chunk=-1", "rl.logits_chunk"),
                        ("action_space.advance_above=2.0", "action_space.advance_above"),
                        ("action_space.advance_every_epochs=0", "advance_every_epochs"),
                        # a negative cost would pay reward for every step: never unearned
                        ("env.step_penalty=-0.05", "env.step_penalty.*cost"),
                        ("env.invalid_penalty=-1", "env.invalid_penalty")):
        with pytest.raises(ConfigError, match=needle):
            load_config(BASE, [bad])
    cfg = base.get_config()
    for key in CHOICES:
        section, leaf = key.split(".")
        assert leaf in cfg[section], f"CHOICES names {key!r}, which base.py lacks"
    validate(cfg)


def test_eval_tasks_must_be_task_names():
    cfg = load_config(BASE, ["--config.env.eval_tasks=('toy:guess', 'w4-o6-q8')"])
    assert cfg.env.eval_tasks == ("toy:guess", "w4-o6-q8")
    for bad in ("('chess:mate',)", "('toy:',)", "(3,)"):
        with pytest.raises(ConfigError, match=r"env\.eval_tasks.*not a task name"):
            load_config(BASE, [f"--config.env.eval_tasks={bad}"])


def test_missing_file_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.py"))
    (tmp_path / "noget.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="get_config"):
        load_config(str(tmp_path / "noget.py"))
    (tmp_path / "typo.py").write_text(
        "from configs.base import get_config as base\n"
        "def get_config():\n"
        "    c = base()\n"
        "    c.rl.learnng_rate = 1.0\n"
        "    return c\n"
    )
    with pytest.raises((ConfigError, AttributeError), match="learnng_rate"):
        load_config(str(tmp_path / "typo.py"))


def test_experiment_file_overrides_base(tmp_path):
    (tmp_path / "exp.py").write_text(
        "from configs.base import get_config as base\n"
        "def get_config():\n"
        "    c = base()\n"
        "    c.rl.ppo_epochs = 7\n"
        "    return c\n"
    )
    cfg = load_config(str(tmp_path / "exp.py"), ["--config.rl.minibatch_size=8"])
    assert cfg.rl.ppo_epochs == 7 and cfg.rl.minibatch_size == 8
    assert isinstance(cfg, ml_collections.ConfigDict)


def test_split_config_args():
    path, overrides, rest = split_config_args(
        ["--config", "a.py", "--config.rl.lr_schedule", "linear", "--config.seed=3", "--resume"]
    )
    assert path == "a.py"
    assert overrides == ["--config.rl.lr_schedule=linear", "--config.seed=3"]
    assert rest == ["--resume"]
    assert split_config_args(["--config=b.py"])[0] == "b.py"


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_group_estimators_need_a_group_size_above_one(estimator):
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        load_config(BASE, [f"algo.estimator={estimator}"])
    cfg = load_config(BASE, [f"algo.estimator={estimator}", "rollout.group_size=4"])
    assert cfg.rollout.group_size == 4


def test_group_filter_needs_groups_and_a_share():
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        load_config(BASE, ["algo.group_filter_keep=0.5"])
    with pytest.raises(ConfigError, match="group_filter_keep"):
        load_config(BASE, ["algo.group_filter_keep=0.0", "rollout.group_size=2"])
    load_config(BASE, ["algo.group_filter_keep=0.5", "rollout.group_size=2"])


@pytest.mark.parametrize("estimator", ["turn_gae", "bilevel_gae", "reinforce_pp"])
def test_gae_forced_tokens_pass_through_needs_token_level_gae(estimator):
    assert load_config(BASE).algo.gae_forced_tokens == "discount"
    cfg = load_config(BASE, ["algo.gae_forced_tokens=pass_through"])
    assert (cfg.algo.estimator, cfg.algo.gae_forced_tokens) == ("gae", "pass_through")
    load_config(BASE, [f"algo.estimator={estimator}"])  # with the default: fine
    with pytest.raises(ConfigError, match=r"algo\.gae_forced_tokens.*'gae' only.*" + estimator):
        load_config(BASE, [f"algo.estimator={estimator}", "algo.gae_forced_tokens=pass_through"])
    with pytest.raises(ConfigError, match=r"algo\.gae_forced_tokens.*allowed"):
        load_config(BASE, ["algo.gae_forced_tokens=skip"])


@pytest.mark.parametrize("overrides, needle", [
    (["sft.enabled=false"], "sft.enabled is False"),
    (["curriculum.enabled=true"], "curriculum.enabled=True"),
    (["env.num_train_tasks=50", "sft.num_trajectories=50"], "must exceed sft.num_trajectories"),
])
def test_rl_apart_from_sft_tasks_needs_sft_one_task_and_tasks_left(overrides, needle):
    with pytest.raises(ConfigError, match="rl.exclude_sft_tasks") as err:
        load_config(BASE, ["rl.exclude_sft_tasks=true", *overrides])
    assert needle in str(err.value)
    validate(load_config(BASE, ["rl.exclude_sft_tasks=true", "env.num_train_tasks=80"]))


def test_loading_a_config_does_not_import_jax():
    """Config validation reads the estimator table without importing JAX."""
    import subprocess
    import sys

    code = ("import sys; from jaxrl_agents.config import load_config; "
            f"load_config({BASE!r}, ['algo.estimator=rloo', 'rollout.group_size=2']); "
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_smollm2_config_loads_and_validates():
    """configs/textworld_smollm2.py: the SmolLM2 preset in its own chat template with a system
    prompt on the command format, scanned layers, held-out games of the eval split,
    constrained decoding (the free-text arm: one override), PPO with GAE and a value head."""
    path = "configs/textworld_smollm2.py"
    cfg = load_config(path)
    validate(cfg)
    assert cfg.model.hf_path == cfg.tokenizer.path == "smollm2-135m-instruct"
    assert cfg.model.scan_layers and cfg.tokenizer.chat_template == "chat"
    prompt = cfg.tokenizer.system_prompt
    assert "one command" in prompt and "[Actions]" in prompt and "go north" in prompt
    assert (cfg.env.family, cfg.env.name, cfg.env.obs_format) == ("textworld", "w2-o3-q4",
                                                                  "compact_goal")
    assert cfg.env.num_eval_tasks > 0 and cfg.rollout.constrain_actions
    assert (cfg.algo.estimator, cfg.model.critic) == ("gae", "head")
    assert 1e-6 <= cfg.rl.learning_rate <= 1e-4 and 0 < cfg.kl.coef <= 0.05
    free = load_config(path, ["--config.rollout.constrain_actions=False"])
    assert not free.rollout.constrain_actions
    base = load_config(BASE)
    assert base.tokenizer.system_prompt == ""  # the driver's default prompt


def test_alfworld_smollm2_config_is_the_demo_recipe_on_alfworld():
    """configs/alfworld_smollm2.py: `make demo`'s recipe (model, prompt, decoding, PPO) with
    only the environment changed: ALFWorld pick_and_place_simple, sparse rewards, budgets of
    2x each game's optimal steps."""
    demo = load_config("configs/textworld_smollm2.py")
    cfg = load_config("configs/alfworld_smollm2.py")
    validate(cfg)
    assert (cfg.env.family, cfg.env.name, cfg.env.reward_density) == (
        "alfworld", "pick_and_place_simple", "sparse")
    assert cfg.budget.enabled and cfg.budget.min_factor == cfg.budget.max_factor == 2.0
    for section in ("model", "tokenizer", "rollout", "algo", "rl", "kl", "sft"):
        assert getattr(cfg, section).to_dict() == getattr(demo, section).to_dict(), section
