"""Trajectory-group filtering (StarPO-S): the groups with the largest return spread stay."""

import numpy as np
import pytest

from jaxrl_agents.data import ACTION, PROMPT, Trajectory
from jaxrl_agents.data.selection import filter_groups, group_return_std


def traj(group_id, ret):
    return Trajectory([1, 2], [PROMPT, ACTION], [0.0, -1.0], [0.0, ret], [1], group_id=group_id)


def batch():
    returns = {0: [1, 1, 1], 1: [0, 1, 0], 2: [0, 5, 10], 3: [2, 2, 3]}
    return [traj(g, r) for g, rs in returns.items() for r in rs]


def test_group_std():
    stds = group_return_std(batch())
    assert list(stds) == [0, 1, 2, 3]
    np.testing.assert_allclose(list(stds.values()), [np.std(r) for r in
                               ([1, 1, 1], [0, 1, 0], [0, 5, 10], [2, 2, 3])])  # fmt: skip


@pytest.mark.parametrize("keep, groups", [(1.0, [0, 1, 2, 3]), (0.5, [1, 2]), (0.25, [2]),
                                          (0.6, [1, 2, 3]), (0.01, [2])])  # fmt: skip
def test_keeps_the_most_varied_groups_in_order(keep, groups):
    trajs = batch()
    kept = filter_groups(trajs, keep)
    assert sorted({t.group_id for t in kept}) == groups
    assert len(kept) == 3 * len(groups)
    assert kept == [t for t in trajs if t.group_id in groups]  # original order


def test_ties_break_by_first_appearance_and_bad_keep():
    trajs = [traj(g, r) for g in (7, 3, 5) for r in (0.0, 1.0)]  # equal stds
    assert {t.group_id for t in filter_groups(trajs, 0.5)} == {7, 3}
    assert filter_groups([], 0.5) == []
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="keep"):
            filter_groups(trajs, bad)
