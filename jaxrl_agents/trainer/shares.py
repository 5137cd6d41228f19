"""How a multi-host run splits an update's episodes over processes and joins them again.

Each process plays its share of the planned episodes (`plan_share`, whole groups, in
order), every process then holds every episode (`distributed.allgather_objects`) and
takes the same decisions from them, and each packs its share of the kept groups
(`pack_share`) in the shape every process uses, so the learner's global batch is the
single-process batch (plus padding rows when the shares are uneven).

Pure functions of (index, count); with one process each gives what the loop did without
it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from jaxrl_agents.data import Batch, Trajectory, bucket, loss_index_width, pack
from jaxrl_agents.distributed import process_slice
from jaxrl_agents.sharding import batch_shards
from jaxrl_agents.trainer.task_schedule import Plan


def _group_rows(num_items: int, group_size: int, index: int, count: int) -> slice:
    """Rows of process `index`'s share of the whole groups in `num_items` rows."""
    groups = num_items // group_size
    if groups < count:
        raise ValueError(
            f"{groups} groups of {group_size} episode(s) cannot give each of "
            f"{count} processes one; raise rollout.episodes_per_batch"
        )
    share = process_slice(groups, index, count)
    return slice(share.start * group_size, share.stop * group_size)


def plan_share(plan: Plan, group_size: int, index: int, count: int) -> tuple[Plan, int]:
    """(process `index`'s episodes of `plan`, the global index of its first group)."""
    rows = _group_rows(len(plan.env_ids), group_size, index, count)
    budgets = None if plan.max_steps is None else plan.max_steps[rows]
    return Plan(plan.env_ids[rows], budgets), rows.start // group_size


def pack_share(
    trajectories: Sequence[Trajectory],
    group_size: int,
    index: int,
    count: int,
    *,
    pad_id: int,
    length_buckets: Sequence[int],
    row_multiple: int = 1,
    choice_width: int | None = None,
) -> Batch:
    """Process `index`'s rows of the global batch of `trajectories` (the same list on
    every process; whole groups in order).

    Every process packs to one shape: T is the bucket of the longest episode of all, B
    the largest share rounded up to `row_multiple` (the process's batch shards). Padding
    rows get group ids distinct over processes.
    """
    rows = _group_rows(len(trajectories), group_size, index, count)
    groups = len(trajectories) // group_size
    largest = -(-groups // count) * group_size
    num_rows = -(-largest // row_multiple) * row_multiple
    length = bucket(max(len(t) for t in trajectories), length_buckets)
    batch = pack(trajectories[rows], pad_id=pad_id, length_buckets=(length,),
                 row_multiple=num_rows, choice_width=choice_width,
                 loss_width=loss_index_width(trajectories, length))
    batch.group_ids[batch.row_valid == 0] -= index * num_rows
    return batch


def local_batch_shards(mesh, count: int) -> int:
    """Shards of the batch dimension on one of `count` processes (its packed rows must be
    a multiple of this): the mesh's ('data', 'fsdp') size over the processes; 1 without a
    mesh."""
    if mesh is None:
        return 1
    return max(batch_shards(mesh) // count, 1)


_SUMMED = ("rollout/episodes", "rollout/turns", "rollout/action_tokens")


def merge_rollout_stats(stats: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Every process's `EpisodeDriver.last_stats` as one: counts add up, seconds are the
    slowest process's, fractions and means are weighted by episodes."""
    if len(stats) == 1:
        return dict(stats[0])
    episodes = np.array([s["rollout/episodes"] for s in stats], np.float64)
    merged = {}
    for key in stats[0]:
        values = np.array([s[key] for s in stats], np.float64)
        if key in _SUMMED:
            merged[key] = int(values.sum())
        elif key.endswith("_s"):
            merged[key] = float(values.max())
        else:
            merged[key] = float(np.average(values, weights=episodes))
    return merged
