"""Task instance specs: every run seed gets its own instances, and every family builds them."""

import pytest

import envs
from configs.base import get_config
from jaxrl_agents.trainer.tasks import MAX_RUN_SEED, SEED_STRIDE, task_specs


@pytest.mark.parametrize("seed", [0, 1, MAX_RUN_SEED - 1])
def test_run_seeds_get_disjoint_instances_that_the_env_accepts(seed):
    cfg = get_config()
    cfg.env.family, cfg.env.name, cfg.env.size = "toy", "count", 2
    train = task_specs(cfg.env, "train", 3, seed)
    assert [s["seed"] for s in train] == [seed * SEED_STRIDE + i for i in range(3)]
    for spec in train:
        envs.make(spec).reset()  # the family accepts the instance seed
    other = task_specs(cfg.env, "train", 3, (seed + 1) % MAX_RUN_SEED)
    assert not {s["seed"] for s in train} & {s["seed"] for s in other}


def test_out_of_range_run_seed_or_count_is_a_clear_error():
    cfg = get_config()
    with pytest.raises(ValueError, match="seed"):
        task_specs(cfg.env, "train", 3, MAX_RUN_SEED)
    with pytest.raises(ValueError, match="instances"):
        task_specs(cfg.env, "train", SEED_STRIDE + 1, 0)
