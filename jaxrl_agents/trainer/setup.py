"""Building what a run needs from its config: env specs, pool, tokenizer, models, driver."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import os

import numpy as np
from flax import nnx

import envs
from jaxrl_agents.models import build_actor_critic, build_policy
from jaxrl_agents.models.tokenizer import load_tokenizer, train_tokenizer
from jaxrl_agents.rollout import DEFAULT_SYSTEM_PROMPT, EpisodeDriver, grouped_specs
from jaxrl_agents.run_records import TOKENIZER_DIR
from jaxrl_agents.trainer.tasks import eval_only_tasks, run_tasks, task_specs

# Families whose games are generated files worth making in parallel before the pool starts.
_GENERATORS = {"textworld": "envs.textworld_env", "alfworld": "envs.alfworld_env"}


@dataclasses.dataclass(frozen=True)
class TaskGroup:
    """The pool's instances of one task (`tasks.TaskName.key`): global train task indices
    and held-out env ids."""

    key: str
    train_tasks: range
    eval_ids: range


class EnvLayout:
    """Which pool env ids hold which tasks.

    Every task the run may play (`tasks.run_tasks`: curriculum stages, mixture tasks; one
    task by default) gets `env.num_train_tasks` train and `env.num_eval_tasks` held-out
    instances, built once; the tasks only evaluated (`tasks.eval_only_tasks`) follow with
    held-out instances only. Train tasks are numbered over all tasks, task after task; train
    task k occupies ids [k * g, (k + 1) * g) (g = group size, every copy plays the same
    task); the held-out instances follow, one id each. While step budgets are on, the envs'
    own limit is `budget.env_max_steps` (the driver ends episodes at their budget).
    """

    def __init__(self, cfg):
        self.group_size = cfg.rollout.group_size
        max_steps = cfg.budget.env_max_steps if cfg.budget.enabled else None
        env = cfg.env
        tasks = run_tasks(cfg)
        first_eval = len(tasks) * env.num_train_tasks * self.group_size
        self.train_specs, self.eval_specs, self.groups = [], [], {}
        for task in tasks + eval_only_tasks(cfg):
            num_train = env.num_train_tasks if task in tasks else 0
            train = task_specs(env, "train", num_train, cfg.seed, task, max_steps)
            held_out = task_specs(env, "eval", env.num_eval_tasks, cfg.seed, task, max_steps)
            n_train, n_eval = len(self.train_specs), first_eval + len(self.eval_specs)
            self.groups[task.key] = TaskGroup(
                task.key,
                train_tasks=range(n_train, n_train + len(train)),
                eval_ids=range(n_eval, n_eval + len(held_out)),
            )
            self.train_specs += train
            self.eval_specs += held_out
        self.specs = grouped_specs(self.train_specs, self.group_size) + self.eval_specs

    @property
    def num_train(self) -> int:
        return len(self.train_specs)

    def train_ids(self, task_indices) -> list[int]:
        g = self.group_size
        return [k * g + j for k in task_indices for j in range(g)]

    def train_task_heads(self) -> list[int]:
        """One env id per train task (the first copy), taking the tasks in turn."""
        g = self.group_size
        return [k * g for k in _interleave(group.train_tasks for group in self.groups.values())]

    @property
    def eval_ids(self) -> list[int]:
        """Every held-out env id, taking the tasks in turn (any prefix covers them evenly)."""
        return _interleave(group.eval_ids for group in self.groups.values())

    def group_of(self, env_id: int) -> str:
        """The task key of a train or held-out env id."""
        train_task = env_id // self.group_size if env_id < self.num_train * self.group_size else -1
        for group in self.groups.values():
            if train_task in group.train_tasks or env_id in group.eval_ids:
                return group.key
        raise ValueError(f"env id {env_id} is outside the layout")

    def split_by_task(self, trajectories) -> dict[str, list]:
        """{task key: its trajectories} in layout order, for the tasks present."""
        parts = {key: [] for key in self.groups}
        for t in trajectories:
            parts[self.group_of(t.info["env_id"])].append(t)
        return {key: part for key, part in parts.items() if part}


def _interleave(sequences) -> list[int]:
    """[a0, b0, c0, a1, b1, ...]: the items of each sequence in turn."""
    out = []
    for column in itertools.zip_longest(*sequences):
        out += [x for x in column if x is not None]
    return out


def pregenerate(layout: EnvLayout, num_workers: int) -> None:
    """Generates (or finds cached) every game file in parallel, before the pool starts."""
    specs = layout.train_specs + layout.eval_specs
    for family, module_name in _GENERATORS.items():
        mine = [s for s in specs if s["family"] == family]
        if mine:
            importlib.import_module(module_name).generate_games(mine, num_workers=num_workers)


def make_pool(cfg, layout: EnvLayout, staging=None) -> envs.EnvPool:
    """The pool of `layout.specs`; text games get the `action_space` keys (the verbs of
    `staging`, an `envs.action_space.ActionStaging`, and compound actions)."""
    specs = [action_space_spec(cfg, spec, staging) for spec in layout.specs]
    return envs.EnvPool(specs, cfg.rollout.num_env_workers, timeout_s=cfg.rollout.env_timeout_s)


# Families whose commands start with a verb (staging and compound actions apply).
_VERB_FAMILIES = ("textworld", "alfworld")


def action_space_spec(cfg, spec: dict, staging=None) -> dict:
    """`spec` with `allowed_verbs` (from `staging`) and `compound_actions` when they apply."""
    if spec["family"] not in _VERB_FAMILIES:
        return spec
    spec = staging.apply(spec) if staging is not None else dict(spec)
    if cfg.action_space.compound_actions >= 2:
        spec["compound_actions"] = cfg.action_space.compound_actions
    return spec


def collect_env_text(pool, env_ids, max_steps: int = 50) -> list[str]:
    """Plays the gold actions in `env_ids` and returns every observation and action text
    (the corpus a demo tokenizer is trained on)."""
    texts = [DEFAULT_SYSTEM_PROMPT]
    results = pool.reset(env_ids)
    gold = [pool.tasks[i].gold_actions for i in env_ids]
    texts += [r.observation for r in results]
    for step in range(max_steps):
        live = [(i, g[step]) for i, g, r in zip(env_ids, gold, results) if step < len(g)]
        if not live:
            break
        ids, actions = zip(*live)
        texts += list(actions)
        results_now = pool.step(list(ids), list(actions))
        texts += [r.observation for r in results_now]
        for r in results_now:
            texts += list(r.info.get("admissible_commands", []) or [])
    return texts


def build_tokenizer(cfg, run_dir: str, text_fn):
    """Loads `tokenizer.path`, or trains one on `text_fn()` into run_dir/tokenizer."""
    if cfg.tokenizer.path:
        return load_tokenizer(cfg.tokenizer.path)
    path = os.path.join(run_dir, TOKENIZER_DIR)
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return load_tokenizer(path)
    return train_tokenizer(text_fn(), cfg.tokenizer.vocab_size, path)


def build_actor_critic_from_config(cfg, vocab_size: int, mesh=None):
    """The policy of `models.build_policy` (from `model.hf_path`, or the config's fields
    with the tokenizer's `vocab_size`) wrapped with its critic."""
    section = dict(cfg.model.items(), vocab_size=vocab_size)
    policy, _ = build_policy(section, seed=cfg.seed, mesh=mesh)
    return build_actor_critic(policy, cfg.model.critic, rngs=nnx.Rngs(cfg.seed + 1))


def model_vocab_size(tokenizer, multiple: int = 8) -> int:
    """len(tokenizer) rounded up (padding rows are never sampled: they are never targets)."""
    return int(-(-len(tokenizer) // multiple) * multiple)


def make_driver(cfg, policy, tokenizer, pool, *, group_size: int | None = None):
    overrides = {} if group_size is None else {"group_size": group_size}
    return EpisodeDriver.from_config(policy, tokenizer, pool, cfg, **overrides)


def action_coverage(trajectories) -> float:
    """Distinct action strings over actions taken in the batch (0..1): a collapse monitor.

    See `jaxrl_agents.monitors` for coverage of the admissible commands and repetition
    within an episode."""
    actions = [a.strip().lower() for t in trajectories for a in t.info.get("actions", [])]
    return len(set(actions)) / max(len(actions), 1)


def success_rate(trajectories) -> float:
    return float(np.mean([t.won for t in trajectories])) if trajectories else 0.0
