"""Env spec dicts for the train and held-out task instances a config asks for.

Every family gets only the keys it understands; train and held-out instances come from
the families' own named splits, so they never share a task.
"""

from __future__ import annotations

# Which `env.*` config fields each family takes, and under which spec key.
_FAMILY_FIELDS = {
    "textworld": {
        "name": "name",
        "reward_density": "reward_density",
        "reward_k": "reward_k",
        "step_penalty": "step_penalty",
        "invalid_penalty": "invalid_penalty",
        "max_steps": "max_steps",
        "obs_format": "obs_format",
    },
    "alfworld": {
        "name": "task_type",
        "size": ("objects", "receptacles"),
        "step_penalty": "step_penalty",
        "invalid_penalty": "invalid_penalty",
        "max_steps": "max_steps",
        "obs_format": "obs_format",
    },
    "code": {
        "name": "task_family",
        "max_steps": "max_steps",
        "invalid_penalty": "invalid_penalty",
        "obs_format": "obs_format",
    },
    "toy": {
        "name": "task",
        "size": "n",
        "reward_density": "reward_density",
        "invalid_penalty": "invalid_penalty",
        "max_steps": "max_steps",
        "obs_format": "obs_format",
    },
}
SPLITS = ("train", "eval")
# Fields left out of a spec when zero: they mean "the family's default".
_ZERO_IS_DEFAULT = ("max_steps", "size")


def base_spec(env_cfg) -> dict:
    """The spec keys shared by every instance of `env_cfg` (no seed, no split)."""
    family = env_cfg.family
    if family not in _FAMILY_FIELDS:
        raise ValueError(f"env.family {family!r}; known: {sorted(_FAMILY_FIELDS)}")
    spec = {"family": family}
    for field, keys in _FAMILY_FIELDS[family].items():
        value = env_cfg[field]
        if field in _ZERO_IS_DEFAULT and not value:
            continue
        for key in keys if isinstance(keys, tuple) else (keys,):
            spec[key] = value
    return spec


def task_specs(env_cfg, split: str, count: int, seed: int = 0) -> list[dict]:
    """`count` instance specs of `split` ("train" | "eval"), seeds seed*10**6 + i."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}; allowed: {sorted(SPLITS)}")
    base = base_spec(env_cfg)
    return [{**base, "seed": seed * 10**6 + i, "split": split} for i in range(count)]
