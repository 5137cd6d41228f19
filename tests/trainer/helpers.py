"""Tiny models and batches for trainer tests."""

import numpy as np
from flax import nnx

from jaxrl_agents.data import ACTION, PROMPT, Trajectory, pack
from jaxrl_agents.models import ModelConfig, Transformer, build_actor_critic

VOCAB = 32


def tiny_policy(seed=0, vocab_size=VOCAB, num_layers=2):
    """A decoder of a few thousand parameters."""
    cfg = ModelConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_layers=num_layers,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    return Transformer(cfg, rngs=nnx.Rngs(seed))


def tiny_actor_critic(seed=0, critic="head"):
    policy = tiny_policy(seed)
    return build_actor_critic(policy, critic, rngs=nnx.Rngs(seed + 1))


def random_batch(seed=0, episodes=8, turns=3, group_size=2):
    """Multi-turn episodes with random tokens, sparse final rewards, grouped in pairs."""
    rng = np.random.default_rng(seed)
    trajs = []
    for e in range(episodes):
        tokens, types, ends = [], [], []
        for _ in range(turns):
            n_obs, n_act = rng.integers(2, 5), rng.integers(1, 4)
            tokens += rng.integers(1, VOCAB, n_obs + n_act).tolist()
            types += [PROMPT] * n_obs + [ACTION] * n_act
            ends.append(len(tokens) - 1)
        rewards = np.zeros(len(tokens), np.float32)
        won = bool(rng.random() < 0.5)
        rewards[ends[-1]] = float(won)
        logprobs = np.where(np.array(types) == ACTION, -np.log(VOCAB), 0.0)
        trajs.append(
            Trajectory(tokens, types, logprobs, rewards, ends, won=won, group_id=e // group_size)
        )
    return pack(trajs, length_buckets=(32, 64))


def toy_schedule(*overrides):
    """A TaskSchedule over the real layout of configs/toy_tiny.py with `overrides`
    ("a.b=value"), its TaskSpecs made in process (no pool): (schedule, layout)."""
    import envs
    from jaxrl_agents.config import load_config
    from jaxrl_agents.trainer.setup import EnvLayout
    from jaxrl_agents.trainer.task_schedule import TaskSchedule

    cfg = load_config("configs/toy_tiny.py", list(overrides))
    layout = EnvLayout(cfg)
    tasks = [envs.make(spec).task for spec in layout.specs]
    return TaskSchedule(cfg, layout, tasks), layout


def learning_metrics(metrics: dict) -> dict:
    """An update's metrics without its wall-clock timings (perf/...), which differ from
    run to run."""
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}
