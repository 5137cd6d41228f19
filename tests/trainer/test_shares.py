"""Splitting an update's episodes over processes and packing each process's rows
(jaxrl_agents/trainer/shares.py), checked against packing everything in one process."""

import numpy as np
import pytest

from jaxrl_agents.data import ACTION, PROMPT, Trajectory, pack
from jaxrl_agents.trainer.shares import merge_rollout_stats, pack_share, plan_share
from jaxrl_agents.trainer.task_schedule import Plan


def _episodes(num_groups, group_size, seed=0):
    """Episodes of random lengths, `group_size` per group, group ids 10, 11, ..."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(num_groups * group_size):
        n_prompt, n_action = rng.integers(2, 20), rng.integers(1, 6)
        types = [PROMPT] * n_prompt + [ACTION] * n_action
        rewards = np.zeros(len(types), np.float32)
        rewards[-1] = rng.normal()
        out.append(
            Trajectory(
                tokens=rng.integers(1, 50, len(types)),
                token_type=types,
                logprobs=np.where(np.array(types) == ACTION, -1.5, 0.0),
                rewards=rewards,
                turn_ends=[len(types) - 1],
                won=bool(rng.random() < 0.5),
                truncated=bool(rng.random() < 0.3),
                group_id=10 + k // group_size,
            )
        )
    return out


@pytest.mark.parametrize("groups,group_size,count", [(4, 1, 2), (5, 2, 2), (7, 3, 3), (3, 2, 3)])
def test_plan_shares_tile_the_plan_by_whole_groups(groups, group_size, count):
    ids = list(range(100, 100 + groups * group_size))
    plan = Plan(ids, [i % 7 for i in ids])
    shares = [plan_share(plan, group_size, i, count) for i in range(count)]
    assert [i for share, _ in shares for i in share.env_ids] == ids
    assert [b for share, _ in shares for b in share.max_steps] == plan.max_steps
    firsts = [first for _, first in shares]
    sizes = [len(share.env_ids) for share, _ in shares]
    assert all(size % group_size == 0 for size in sizes) and max(sizes) - min(sizes) <= group_size
    assert firsts == [sum(sizes[:i]) // group_size for i in range(count)]
    assert plan_share(Plan(ids), group_size, 0, count)[0].max_steps is None


def test_one_process_gets_the_whole_plan_and_too_few_groups_are_an_error():
    plan = Plan([3, 4, 5, 6], [2, 2, 3, 3])
    assert plan_share(plan, 2, 0, 1) == (plan, 0)
    with pytest.raises(ValueError, match="2 groups of 2 episode"):
        plan_share(plan, 2, 0, 3)


@pytest.mark.parametrize(
    "groups,group_size,count,row_multiple", [(4, 1, 2, 1), (5, 2, 2, 1), (7, 1, 3, 2), (3, 2, 2, 4)]
)
def test_process_rows_form_the_single_process_batch(groups, group_size, count, row_multiple):
    trajs = _episodes(groups, group_size)
    buckets = (16, 32)
    whole = pack(trajs, pad_id=7, length_buckets=buckets)
    parts = [
        pack_share(
            trajs, group_size, i, count, pad_id=7, length_buckets=buckets, row_multiple=row_multiple
        )
        for i in range(count)
    ]
    assert len({p.input_ids.shape for p in parts}) == 1  # one shape on every process
    assert parts[0].input_ids.shape[1] == whole.input_ids.shape[1]
    assert parts[0].input_ids.shape[0] % row_multiple == 0
    for name, value in whole.as_dict().items():
        real = np.concatenate([getattr(p, name)[p.row_valid == 1] for p in parts])
        np.testing.assert_array_equal(real, value, err_msg=name)
    pad_groups = np.concatenate([p.group_ids[p.row_valid == 0] for p in parts])
    assert (pad_groups < 0).all() and len(set(pad_groups.tolist())) == len(pad_groups)
    for p in parts:
        assert not p.valid[p.row_valid == 0].any()


def test_one_process_packs_exactly_what_pack_does():
    trajs = _episodes(3, 2, seed=1)
    want = pack(trajs, pad_id=0, length_buckets=(8, 16, 32))
    got = pack_share(trajs, 2, 0, 1, pad_id=0, length_buckets=(8, 16, 32))
    for name, value in want.as_dict().items():
        np.testing.assert_array_equal(getattr(got, name), value, err_msg=name)


def test_rollout_stats_merge_counts_seconds_and_fractions():
    a = {
        "rollout/episodes": 3,
        "rollout/turns": 9,
        "rollout/won_frac": 1 / 3,
        "rollout/mean_return": 2.0,
        "rollout/wall_s": 5.0,
        "rollout/env_wait_frac": 0.2,
    }
    b = {
        "rollout/episodes": 1,
        "rollout/turns": 2,
        "rollout/won_frac": 1.0,
        "rollout/mean_return": -2.0,
        "rollout/wall_s": 7.0,
        "rollout/env_wait_frac": 0.6,
    }
    merged = merge_rollout_stats([a, b])
    assert merged["rollout/episodes"] == 4 and merged["rollout/turns"] == 11
    assert merged["rollout/won_frac"] == pytest.approx(0.5)  # 2 wins of 4
    assert merged["rollout/mean_return"] == pytest.approx(1.0)  # (3 * 2 - 2) / 4
    assert merged["rollout/wall_s"] == 7.0
    assert merged["rollout/env_wait_frac"] == pytest.approx(0.3)
    assert merge_rollout_stats([a]) == a
