"""The one configuration loader every command uses.

    cfg = load_config("configs/textworld_tiny.py", ["--config.rl.learning_rate=1e-5"])

A config file is a Python file with `get_config()` returning an ml_collections
ConfigDict (normally `configs.base.get_config()` with a few fields changed). Overrides
are `a.b=value` (a leading `--config.` is accepted); the value is parsed to the type the
field already has. An unknown key, a value of the wrong type, a value outside a field's
allowed choices or a missing file raises ConfigError naming the key.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Sequence

import ml_collections

from jaxrl_agents.estimators import ESTIMATORS, GROUP_ESTIMATORS

# Fields whose value must be one of a fixed set. The single place these are listed.
CHOICES: dict[str, tuple] = {
    "model.dtype": ("float32", "bfloat16"),
    "model.param_dtype": ("float32", "bfloat16"),
    "model.remat": ("none", "full", "dots"),
    "model.critic": ("head", "detached", "separate"),
    "tokenizer.chat_template": ("chat", "plain"),
    "env.family": ("textworld", "alfworld", "code", "toy"),
    "env.reward_density": ("sparse", "every_k", "dense"),
    "env.obs_format": ("template", "compact", "compact_goal", "raw"),
    "algo.estimator": tuple(ESTIMATORS),
    "algo.gae_forced_tokens": ("discount", "pass_through"),
    "algo.loss_agg": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"),
    "algo.loss_tokens": ("decisions", "actions"),
    "rollout.greedy_by": ("command", "token"),
    "kl.kind": ("k1", "k2", "k3"),
    "kl.where": ("reward", "loss"),
    "kl.controller": ("fixed", "adaptive", "warmup"),
    "rl.lr_schedule": ("constant", "linear", "step_decay"),
    "rl.optimizer_state": ("float32", "int8"),
    "sft.optimizer_state": ("float32", "int8"),
    "rl.master_weights": ("none", "float32"),
    "reward.source": ("verified", "binary", "learned", "weighted"),
    "reward.mix": ("none", "code", "text"),
    "budget.on_mastered": ("harder", "retire", "none"),
}

_PREFIX = "--config."


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key."""


def load_config_file(path: str) -> ml_collections.ConfigDict:
    """Imports `path` and returns its `get_config()`, locked."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path!r}")
    # Experiment files import `configs.base`: make the folder holding `configs/` importable.
    root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    if root not in sys.path:
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location(f"_jaxrl_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except AttributeError as e:  # a locked ConfigDict refuses a misspelt field
        raise ConfigError(f"{path}: {e}") from e
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} has no get_config() function")
    cfg = module.get_config()
    if not isinstance(cfg, ml_collections.ConfigDict):
        raise ConfigError(f"{path}: get_config() returned {type(cfg).__name__}, not a ConfigDict")
    cfg.lock()
    return cfg


def _parse_value(key: str, text: str, current):
    """Parses `text` into the type of `current` (the field's present value)."""
    if isinstance(current, bool):
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigError(f"config key {key!r} is a bool; got {text!r} (use true/false)")
    if isinstance(current, str):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if current is None:
            return text
        raise ConfigError(
            f"config key {key!r} expects {type(current).__name__}; cannot parse {text!r}"
        ) from None
    if current is None:
        return value
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(current, tuple | list) and isinstance(value, tuple | list):
        return type(current)(value)
    if type(value) is not type(current):
        raise ConfigError(
            f"config key {key!r} expects {type(current).__name__}; "
            f"got {text!r} ({type(value).__name__})"
        )
    return value


def apply_override(cfg: ml_collections.ConfigDict, override: str) -> None:
    """Applies one `a.b=value` (or `--config.a.b=value`) override in place."""
    text = override[len(_PREFIX) :] if override.startswith(_PREFIX) else override
    if "=" not in text:
        raise ConfigError(f"override {override!r} is not of the form key=value")
    key, value_text = text.split("=", 1)
    *parents, leaf = key.split(".")
    node = cfg
    for depth, part in enumerate(parents):
        child = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
        if not isinstance(child, ml_collections.ConfigDict):
            where = ".".join(parents[: depth + 1])
            raise ConfigError(f"unknown config section {where!r}; valid: {sorted(node.keys())}")
        node = child
    if leaf not in node:
        raise ConfigError(f"unknown config key {key!r}; valid keys here: {sorted(node.keys())}")
    if isinstance(node[leaf], ml_collections.ConfigDict):
        raise ConfigError(f"config key {key!r} is a section; set one of {sorted(node[leaf])}")
    with node.unlocked():
        node[leaf] = _parse_value(key, value_text, node[leaf])


# Numeric keys with a range: (keys, test, what the error says the value must do).
BOUNDS = (
    (("rollout.episodes_per_batch", "rollout.max_action_tokens", "rl.minibatch_size",
      "action_space.advance_every_epochs", "rl.grad_accum", "sft.grad_accum",
      "pretrain.grad_accum"), lambda v: v > 0, "must be positive"),
    (("rl.logits_chunk",), lambda v: v >= 0, "must be >= 0"),
    (("rl.frozen_layers",), lambda v: v >= 0, "must be >= 0 (0: every layer trains)"),
    # The envs subtract these: a negative one would pay reward for every step or bad action.
    (("env.step_penalty", "env.invalid_penalty"), lambda v: v >= 0,
     "is a cost the envs subtract and must be >= 0"),
    (("algo.gamma", "algo.lam", "sft.val_fraction", "action_space.advance_above"),
     lambda v: 0.0 <= v <= 1.0, "must lie in [0, 1]"),
)


def validate(cfg: ml_collections.ConfigDict) -> None:
    """Checks the fields with fixed choices and the numeric ranges of BOUNDS."""
    for key, allowed in CHOICES.items():
        value = _get(cfg, key)
        if value is not _MISSING and value not in allowed:
            raise ConfigError(f"config key {key!r} is {value!r}; allowed: {list(allowed)}")
    for keys, holds, rule in BOUNDS:
        for key in keys:
            value = _get(cfg, key)
            if value is not _MISSING and not holds(value):
                raise ConfigError(f"config key {key!r} {rule}, got {value!r}")
    check_task_names(cfg, "env.eval_tasks")
    check_groups(cfg)
    check_estimator_options(cfg)
    check_rl_tasks(cfg)
    lora = _get(cfg, "model.lora")
    if lora is not _MISSING:
        check_lora(lora)


def check_task_names(cfg: ml_collections.ConfigDict, key: str) -> None:
    """Every entry of the tuple at `key` is a task name: "family:name" with a known family,
    or "name" (a task of env.family)."""
    tasks = _get(cfg, key)
    if tasks is _MISSING:
        return
    families = CHOICES["env.family"]
    for task in tasks:
        family, _, name = task.rpartition(":") if isinstance(task, str) else ("", "", "")
        if not name or (family and family not in families):
            raise ConfigError(
                f'config key {key!r}: {task!r} is not a task name; use "name" (of env.family) '
                f'or "family:name" with a family in {list(families)}'
            )


# model.lora: the projections an adapter may go on (attention q/k/v/o, MLP gate/up/down).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
_LORA_KEYS = ("rank", "alpha", "dropout", "targets")


def check_lora(section, key: str = "model.lora") -> None:
    """The LoRA section (ConfigDict or dict): rank an int >= 0 (0 = off), alpha > 0,
    dropout 0 (the only value supported), targets a non-empty tuple of distinct names
    from LORA_TARGETS. Raises ConfigError naming the key and the allowed values."""
    unknown = sorted(set(section.keys()) - set(_LORA_KEYS))
    if unknown:
        raise ConfigError(f"unknown config key(s) {[f'{key}.{k}' for k in unknown]}; "
                          f"valid keys: {list(_LORA_KEYS)}")
    rank = section.get("rank", 0)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ConfigError(f"config key '{key}.rank' must be an int >= 0 (0 = off), got {rank!r}")
    alpha = section.get("alpha", 16.0)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
        raise ConfigError(f"config key '{key}.alpha' must be a number > 0, got {alpha!r}")
    dropout = section.get("dropout", 0.0)
    if dropout != 0:
        raise ConfigError(f"config key '{key}.dropout' is {dropout!r}; only 0.0 is supported "
                          "(adapter dropout is not implemented)")
    targets = section.get("targets", LORA_TARGETS)
    if isinstance(targets, str) or not isinstance(targets, tuple | list) or not targets:
        raise ConfigError(f"config key '{key}.targets' must be a non-empty tuple of names from "
                          f"{list(LORA_TARGETS)}, got {targets!r}")
    bad = [t for t in targets if t not in LORA_TARGETS]
    if bad or len(set(targets)) != len(targets):
        what = f"unknown target(s) {bad}" if bad else "a target listed twice"
        raise ConfigError(f"config key '{key}.targets' = {tuple(targets)!r} has {what}; "
                          f"allowed: {list(LORA_TARGETS)}")


def check_groups(cfg: ml_collections.ConfigDict) -> None:
    """Settings that need groups of several samples per task instance.

    RLOO and GRPO with rollout.group_size = 1 give every episode advantage 0 (nothing to
    compare with), and trajectory-group filtering ranks groups by their reward spread.
    """
    group_size = _get(cfg, "rollout.group_size")
    if group_size is _MISSING:
        return
    estimator = _get(cfg, "algo.estimator")
    if estimator in GROUP_ESTIMATORS and group_size < 2:
        raise ConfigError(
            f"algo.estimator={estimator!r} compares the samples of one task instance and needs "
            f"rollout.group_size >= 2, got rollout.group_size={group_size} (set e.g. "
            "--config.rollout.group_size=4, or use estimator 'reinforce_pp' or 'gae')"
        )
    keep = _get(cfg, "algo.group_filter_keep")
    if keep is _MISSING:
        return
    if not 0.0 < keep <= 1.0:
        raise ConfigError(f"config key 'algo.group_filter_keep' must lie in (0, 1], got {keep!r}")
    if keep < 1.0 and group_size < 2:
        raise ConfigError(
            f"algo.group_filter_keep={keep} ranks groups by their reward spread and needs "
            f"rollout.group_size >= 2, got rollout.group_size={group_size}"
        )


def check_estimator_options(cfg: ml_collections.ConfigDict) -> None:
    """Settings read by one estimator only: algo.gae_forced_tokens = "pass_through" needs
    the token-level estimator "gae" (turn_gae and bilevel_gae would silently ignore it)."""
    forced = _get(cfg, "algo.gae_forced_tokens")
    estimator = _get(cfg, "algo.estimator")
    if forced == "pass_through" and estimator != "gae":
        raise ConfigError(
            f"config key 'algo.gae_forced_tokens' = 'pass_through' applies to the token-level "
            f"estimator 'gae' only, got algo.estimator={estimator!r} (set "
            "--config.algo.gae_forced_tokens=discount, or use estimator 'gae')"
        )


def check_rl_tasks(cfg: ml_collections.ConfigDict) -> None:
    """rl.exclude_sft_tasks leaves RL the train tasks after SFT's first sft.num_trajectories:
    it needs SFT on, one task (no curriculum or mixing) and some tasks left over."""
    if _get(cfg, "rl.exclude_sft_tasks") is not True:
        return
    if _get(cfg, "sft.enabled") is not True:
        raise ConfigError("config key 'rl.exclude_sft_tasks' = True keeps RL off the tasks SFT "
                          "trained on, but sft.enabled is False")
    for key in ("curriculum.enabled", "mixing.enabled"):
        if _get(cfg, key) is True:
            raise ConfigError(f"config key 'rl.exclude_sft_tasks' = True works on one task only; "
                              f"got {key}=True")
    num_train, num_sft = _get(cfg, "env.num_train_tasks"), _get(cfg, "sft.num_trajectories")
    if num_train is not _MISSING and num_sft is not _MISSING and num_train <= num_sft:
        raise ConfigError(
            f"config key 'rl.exclude_sft_tasks' = True leaves RL no task: env.num_train_tasks "
            f"({num_train}) must exceed sft.num_trajectories ({num_sft})")


_MISSING = object()


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def load_config(path: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Loads a config file, applies `overrides` in order, validates and locks it."""
    cfg = load_config_file(path)
    for override in overrides:
        apply_override(cfg, override)
    validate(cfg)
    return cfg


def split_config_args(argv: Sequence[str]) -> tuple[str | None, list[str], list[str]]:
    """Splits a command line into (config path, config overrides, other arguments).

    Accepts `--config PATH`, `--config=PATH`, `--config.a.b=v` and `--config.a.b v`.
    """
    path, overrides, rest = None, [], []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--config":
            if i + 1 >= len(args):
                raise ConfigError("--config needs a path")
            path, i = args[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg.startswith(_PREFIX):
            if "=" in arg:
                overrides.append(arg)
            elif i + 1 < len(args):
                overrides.append(f"{arg}={args[i + 1]}")
                i += 1
            else:
                raise ConfigError(f"override {arg!r} has no value")
        else:
            rest.append(arg)
        i += 1
    return path, overrides, rest
