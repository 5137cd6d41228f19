"""Trajectories -> one padded `Batch` with bucketed shapes (few compiled programs)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxrl_agents.data.choices import allowed_array
from jaxrl_agents.data.trajectory import ACTION, Batch, Trajectory


def bucket(n: int, buckets: Sequence[int], multiple: int = 1) -> int:
    """The smallest bucket >= n (past the largest: the next multiple of the largest), then
    rounded up to a multiple of `multiple` (e.g. the data-parallel size of a mesh)."""
    chosen = next((size for size in sorted(buckets) if size >= n), None)
    if chosen is None:
        top = max(buckets)
        chosen = -(-n // top) * top
    return -(-chosen // multiple) * multiple


def pack(
    trajectories: Sequence[Trajectory],
    *,
    pad_id: int = 0,
    length_buckets: Sequence[int] = (128, 256, 512, 1024, 2048, 4096),
    row_multiple: int = 1,
    max_length: int | None = None,
    choice_width: int | None = None,
    loss_width: int | None = None,
) -> Batch:
    """Pads trajectories (right padding) into a fixed-shape Batch.

    Args:
      trajectories: episodes, in order (row i is trajectory i).
      pad_id: token id written on padding.
      length_buckets: T is rounded up to one of these.
      row_multiple: B is rounded up to a multiple of this (e.g. the data-parallel size);
        extra rows are all padding with row_valid = 0.
      max_length: a trajectory longer than this is an error (never silently cut).
      choice_width: when given, the batch carries `allowed` [B, T, choice_width], the ids
        each action token was restricted to by constrained decoding (`data.choices`).
      loss_width: the width A of `loss_index` (each row's action-token positions); default:
        the bucket of these trajectories' largest count (`loss_index_width`).

    The batch carries `lower_hidden` when every trajectory has it.
    """
    if not trajectories:
        raise ValueError("pack() needs at least one trajectory")
    longest = max(len(t) for t in trajectories)
    if max_length is not None and longest > max_length:
        raise ValueError(f"a trajectory has {longest} tokens, more than max_length={max_length}")
    length = bucket(longest, length_buckets)
    rows = -(-len(trajectories) // row_multiple) * row_multiple
    out = {
        "input_ids": np.full((rows, length), pad_id, np.int32),
        "positions": np.zeros((rows, length), np.int32),
        "valid": np.zeros((rows, length), np.int32),
        "action_mask": np.zeros((rows, length), np.float32),
        "old_logprobs": np.zeros((rows, length), np.float32),
        "rewards": np.zeros((rows, length), np.float32),
        "group_ids": np.full((rows,), -1, np.int32),
        "won": np.zeros((rows,), np.float32),
        "truncated": np.zeros((rows,), np.float32),
        "row_valid": np.zeros((rows,), np.float32),
    }
    for i, traj in enumerate(trajectories):
        n = len(traj)
        out["input_ids"][i, :n] = traj.tokens
        out["positions"][i, :n] = np.arange(n)
        out["valid"][i, :n] = 1
        is_action = traj.token_type == ACTION
        out["action_mask"][i, :n] = is_action
        out["old_logprobs"][i, :n] = np.where(is_action, traj.logprobs, 0.0)
        out["rewards"][i, :n] = traj.rewards
        out["group_ids"][i] = traj.group_id
        out["won"][i] = traj.won
        out["truncated"][i] = traj.truncated
        out["row_valid"][i] = 1.0
    if choice_width is not None:
        out["allowed"] = np.full((rows, length, int(choice_width)), -1, np.int32)
        for i, traj in enumerate(trajectories):
            out["allowed"][i] = allowed_array(traj, length, int(choice_width))
    if loss_width is None:
        loss_width = loss_index_width(trajectories, length)
    out["loss_index"] = loss_index(out["action_mask"], loss_width)
    if all(t.lower_hidden is not None for t in trajectories):
        out["lower_hidden"] = lower_hidden_array(trajectories, rows, length)
    # Padding rows get distinct negative group ids so they never join a real group.
    pad_rows = np.arange(len(trajectories), rows)
    out["group_ids"][pad_rows] = -1 - pad_rows
    return Batch(**out)


def lower_hidden_array(trajectories: Sequence[Trajectory], rows: int, length: int):
    """[rows, length, D] float32: each trajectory's `lower_hidden` in its row, 0 elsewhere."""
    width = trajectories[0].lower_hidden.shape[1]
    out = np.zeros((rows, length, width), np.float32)
    for i, traj in enumerate(trajectories):
        out[i, :len(traj)] = traj.lower_hidden
    return out


# Widths of `Batch.loss_index`: the action tokens of the row that has the most.
LOSS_INDEX_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def loss_index_width(trajectories: Sequence[Trajectory], length: int) -> int:
    """A of `loss_index` for these trajectories packed to length T: the bucket of the
    largest number of action tokens in one of them, at most T."""
    most = max((t.num_action_tokens for t in trajectories), default=1)
    return min(bucket(max(most, 1), LOSS_INDEX_BUCKETS), length)


def loss_index(action_mask_bt: np.ndarray, width: int) -> np.ndarray:
    """[B, width] int32: each row's positions with action_mask set, in order, 0 padded."""
    rows = action_mask_bt.shape[0]
    out = np.zeros((rows, width), np.int32)
    for i in range(rows):
        where = np.flatnonzero(action_mask_bt[i] > 0)
        out[i, :len(where)] = where
    return out
