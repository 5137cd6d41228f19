"""Env spec dicts for the train and held-out task instances a config asks for.

Every family gets only the keys it understands; train and held-out instances come from
the families' own named splits, so they never share a task.
"""

from __future__ import annotations

import dataclasses
import re

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
SEED_STRIDE = 10_000  # task instances per run seed
MAX_RUN_SEED = 100  # the families' instance seeds stay below SEED_STRIDE * MAX_RUN_SEED
# Fields left out of a spec when zero: they mean "the family's default".
_ZERO_IS_DEFAULT = ("max_steps", "size")
_SIZE_SUFFIX = re.compile(r"^(.+)-(\d+)$")


@dataclasses.dataclass(frozen=True)
class TaskName:
    """One kind of task a run plays: a family, its task name and (toy, alfworld) a size."""

    family: str
    name: str
    size: int = 0  # 0 = the family's default

    @property
    def key(self) -> str:
        """The task's name in configs and logs: family:name[-size], e.g. toy:count-4."""
        return f"{self.family}:{self.name}" + (f"-{self.size}" if self.size else "")


def core_task(env_cfg) -> TaskName:
    """The task the `env` config section names."""
    sized = "size" in _FAMILY_FIELDS.get(env_cfg.family, {})
    return TaskName(env_cfg.family, env_cfg.name, int(env_cfg.size) if sized else 0)


def parse_task(text: str, env_cfg) -> TaskName:
    """A TaskName from "family:name" or "name" (of env.family). In the families with a size
    (toy, alfworld) a "-N" suffix sets it ("count-4"); without one, a task of env.family
    takes env.size."""
    family, _, name = text.rpartition(":")
    family = family or env_cfg.family
    if family not in _FAMILY_FIELDS:
        raise ValueError(f"task {text!r}: family {family!r}; known: {sorted(_FAMILY_FIELDS)}")
    if "size" not in _FAMILY_FIELDS[family]:
        return TaskName(family, name)
    match = _SIZE_SUFFIX.match(name)
    if match:
        return TaskName(family, match.group(1), int(match.group(2)))
    return TaskName(family, name, int(env_cfg.size) if family == env_cfg.family else 0)


def base_spec(env_cfg, task: TaskName | None = None, max_steps: int | None = None) -> dict:
    """The spec keys shared by every instance of `env_cfg` (no seed, no split); `task`
    replaces its family, name and size, `max_steps` its step budget."""
    task = task or core_task(env_cfg)
    family = task.family
    if family not in _FAMILY_FIELDS:
        raise ValueError(f"env.family {family!r}; known: {sorted(_FAMILY_FIELDS)}")
    values = {"name": task.name, "size": task.size}
    if max_steps is not None:
        values["max_steps"] = max_steps
    spec = {"family": family}
    for field, keys in _FAMILY_FIELDS[family].items():
        value = values[field] if field in values else env_cfg[field]
        if field in _ZERO_IS_DEFAULT and not value:
            continue
        for key in keys if isinstance(keys, tuple) else (keys,):
            spec[key] = value
    return spec


def task_specs(
    env_cfg,
    split: str,
    count: int,
    seed: int = 0,
    task: TaskName | None = None,
    max_steps: int | None = None,
) -> list[dict]:
    """`count` instance specs of `split` ("train" | "eval"), seeds seed * SEED_STRIDE + i
    (the families take instance seeds below 10**6, so run seeds 0..99 each get their own
    instances); `task` and `max_steps` as in `base_spec`."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}; allowed: {sorted(SPLITS)}")
    if count > SEED_STRIDE or not 0 <= seed < MAX_RUN_SEED:
        raise ValueError(f"task instances come from seeds seed * {SEED_STRIDE} + i: need "
                         f"0 <= seed < {MAX_RUN_SEED} (got {seed}) and at most "
                         f"{SEED_STRIDE} instances (got {count})")
    base = base_spec(env_cfg, task, max_steps)
    return [{**base, "seed": seed * SEED_STRIDE + i, "split": split} for i in range(count)]


def run_tasks(cfg) -> list[TaskName]:
    """Every task a run may play, without repeats: the curriculum stages (or the env
    section's task, the core task of mixing), then the mixture tasks when mixing is on."""
    if cfg.curriculum.enabled:
        names = [parse_task(s, cfg.env) for s in cfg.curriculum.stages]
    else:
        names = [core_task(cfg.env)]
    if cfg.mixing.enabled:
        names += [parse_task(t, cfg.env) for t in cfg.mixing.tasks]
    unique = {}
    for task in names:
        unique.setdefault(task.key, task)
    return list(unique.values())


def eval_only_tasks(cfg) -> list[TaskName]:
    """The tasks of `env.eval_tasks` the run does not train on (`run_tasks`), without repeats:
    only their held-out instances are built, so no training stage ever plays them."""
    trained = {task.key for task in run_tasks(cfg)}
    unique = {}
    for task in (parse_task(text, cfg.env) for text in cfg.env.eval_tasks):
        if task.key not in trained:
            unique.setdefault(task.key, task)
    return list(unique.values())
