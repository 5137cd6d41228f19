"""Task instance specs: every run seed gets its own instances, and every family builds them."""

import pytest

import envs
from configs.base import get_config
from jaxrl_agents.trainer.tasks import MAX_RUN_SEED, SEED_STRIDE, task_specs
from tests.trainer.helpers import toy_schedule


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


def test_eval_only_tasks_get_held_out_games_and_are_never_trained_on():
    schedule, layout = toy_schedule(
        "env.eval_tasks=('guess', 'toy:count-2', 'count')",  # count-3 is the run's own task
        "env.num_train_tasks=6",
        "env.num_eval_tasks=3",
        "rollout.episodes_per_batch=4",
    )
    assert list(layout.groups) == ["toy:count-3", "toy:guess-3", "toy:count-2"]
    count, guess, count2 = layout.groups.values()
    assert len(count.train_tasks) == 6 and not guess.train_tasks and not count2.train_tasks
    assert [len(g.eval_ids) for g in (count, guess, count2)] == [3, 3, 3]
    assert layout.num_train == 6  # the SFT, pretraining and tokenizer games: count-3's only
    assert {layout.group_of(i) for i in layout.train_task_heads()} == {"toy:count-3"}
    played = {layout.group_of(i) for u in range(30) for i in schedule.plan(u).env_ids}
    assert played == {"toy:count-3"}
    held_out = [layout.specs[i] for i in layout.eval_ids]
    assert {(s["task"], s["n"], s["split"]) for s in held_out} == {
        ("count", 3, "eval"),
        ("guess", 3, "eval"),
        ("count", 2, "eval"),
    }


def test_a_trained_task_listed_for_evaluation_keeps_its_training_games():
    _, layout = toy_schedule(
        "mixing.enabled=true", "mixing.tasks=('guess',)", "env.eval_tasks=('guess',)",
        "env.num_train_tasks=4", "env.num_eval_tasks=2",
    )  # fmt: skip
    assert list(layout.groups) == ["toy:count-3", "toy:guess-3"]
    assert [len(g.train_tasks) for g in layout.groups.values()] == [4, 4]
