"""Which collected trajectories the learner trains on (host side, NumPy).

`filter_groups` is StarPO-S's trajectory filtering (RAGEN): samples of one task instance
form a group; a group whose episodes all earn the same return teaches a group-relative
estimator nothing, so only the share `keep` of groups with the largest spread of returns
is kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from jaxrl_agents.data.trajectory import Trajectory


def group_return_std(trajectories: Sequence[Trajectory]) -> dict[int, float]:
    """group_id -> population std of its episodes' returns (in order of first appearance)."""
    returns: dict[int, list[float]] = {}
    for t in trajectories:
        returns.setdefault(t.group_id, []).append(t.episode_return)
    return {g: float(np.std(r)) for g, r in returns.items()}


def filter_groups(trajectories: Sequence[Trajectory], keep: float) -> list[Trajectory]:
    """The trajectories of the ceil(keep * G) groups whose returns vary most.

    Args:
      trajectories: episodes; those sharing a `group_id` sampled one task instance.
      keep: share of the G groups kept, in (0, 1]; 1.0 keeps everything.
    Returns:
      the kept trajectories in their original order. Groups with equal std are ranked by
      first appearance, so the choice is deterministic and the count (hence the packed
      batch shape) depends only on G and `keep`.
    """
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"group filter keep must lie in (0, 1], got {keep!r}")
    if keep == 1.0 or not trajectories:
        return list(trajectories)
    stds = group_return_std(trajectories)
    groups = list(stds)
    order = np.argsort([-stds[g] for g in groups], kind="stable")
    kept = {groups[i] for i in order[: math.ceil(keep * len(groups))]}
    return [t for t in trajectories if t.group_id in kept]
