"""Episodes with their labels as JSON lines: what a run dumps for reward-model training.

    append_jsonl("runs/a/trajectories.jsonl", trajs, update=3)   # reward.dump_trajectories
    trajs = read_jsonl("runs/a/trajectories.jsonl")
    y = labels(trajs, "won")                                      # [B] in [0, 1]

`write_summaries` writes the held-out games' episodes as people read them (actions, rewards,
how each ended; no tokens): a run's eval_episodes/<stage>.jsonl.

One object per episode (`append_jsonl`): task_id, group_id, update (and any other extra
field), tokens, token_type, turn_ends, turn_rewards (the environment's reward of each
turn), turn_info (the reward-component infos, see rewards.TURN_INFO_KEYS), won, truncated, failed,
pass_share (the label of that name) and return. A resumed run appends again the updates
after its last checkpoint: `update` tells the copies apart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from jaxrl_agents import monitors
from jaxrl_agents.data.trajectory import Trajectory
from jaxrl_agents.run_records import write_jsonl_atomic

LABELS = ("won", "pass_share")


def episode_label(traj: Trajectory, kind: str) -> float:
    """The label of one episode in [0, 1]: won, or the last reported test pass share
    (episodes that never ran the tests count as won / not won)."""
    if kind not in LABELS:
        raise ValueError(f"reward model label {kind!r}; allowed: {list(LABELS)}")
    if kind == "pass_share":
        shares = [d["pass_share"] for d in traj.info.get("turn_info", []) if "pass_share" in d]
        if shares:
            return float(shares[-1])
    return float(traj.won)


def labels(trajs: Sequence[Trajectory], kind: str = "won") -> np.ndarray:
    """[B] float32 labels of `trajs` (see episode_label)."""
    return np.array([episode_label(t, kind) for t in trajs], np.float32)


def trajectory_record(traj: Trajectory) -> dict:
    """One episode as plain JSON: what a reward model trains on, plus its labels."""
    turn_ends = np.asarray(traj.turn_ends, np.int64)
    return {
        "task_id": traj.task_id,
        "group_id": int(traj.group_id),
        "tokens": traj.tokens.tolist(),
        "token_type": traj.token_type.tolist(),
        "turn_ends": turn_ends.tolist(),
        "turn_rewards": traj.rewards[turn_ends].astype(float).tolist(),
        "turn_info": [dict(d) for d in traj.info.get("turn_info", [])],
        "won": bool(traj.won),
        "truncated": bool(traj.truncated),
        "failed": bool(traj.failed),
        "pass_share": episode_label(traj, "pass_share"),
        "return": float(traj.episode_return),
    }


def episode_summary(traj: Trajectory) -> dict:
    """One episode as a person reads it, without its tokens: the game, the outcome, how it
    ended, and each turn's action, reward and number of commands offered, with whether the
    action repeated an earlier one of the episode or was refused as invalid."""
    actions = list(traj.info.get("actions", []))
    turn_ends = np.asarray(traj.turn_ends, np.int64)
    offered = traj.info.get("admissible", [])
    invalid = traj.info.get("invalid", [])
    # The repetition monitor's own test (normalised actions), so these flags add up to its
    # repeat_rate.
    repeated = (~monitors.first_occurrences(actions)).tolist()
    return {
        "task_id": traj.task_id,
        "won": bool(traj.won),
        "return": float(traj.episode_return),
        "steps": len(actions),
        "end_reason": traj.info.get("end_reason", ""),
        "truncated": bool(traj.truncated),
        "failed": bool(traj.failed),
        "actions": actions,
        "turn_rewards": traj.rewards[turn_ends].astype(float).tolist(),
        "offered": [len(c) for c in offered],
        "repeated": repeated,
        "invalid": [bool(v) for v in invalid],
    }


def write_summaries(path: str, trajs: Sequence[Trajectory], **extra) -> None:
    """`path` holds one JSON line per episode (`episode_summary` plus `extra`), replacing
    what it held (`run_records.write_jsonl_atomic`)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_jsonl_atomic(path, ({**episode_summary(traj), **extra} for traj in trajs))


def append_jsonl(path: str, trajs: Sequence[Trajectory], **extra) -> None:
    """Appends one JSON line per episode (trajectory_record plus `extra`, e.g. update=3)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        for traj in trajs:
            f.write(json.dumps({**trajectory_record(traj), **extra}) + "\n")


def from_record(record: dict) -> Trajectory:
    """The Trajectory of a `trajectory_record` (log-probs are not kept: zeros)."""
    n = len(record["tokens"])
    rewards = np.zeros(n, np.float32)
    rewards[np.asarray(record["turn_ends"], np.int64)] = record["turn_rewards"]
    return Trajectory(
        tokens=record["tokens"],
        token_type=record["token_type"],
        logprobs=np.zeros(n, np.float32),
        rewards=rewards,
        turn_ends=record["turn_ends"],
        won=record["won"],
        truncated=record.get("truncated", False),
        failed=record.get("failed", False),
        task_id=record.get("task_id", ""),
        group_id=record.get("group_id", 0),
        info={"turn_info": record.get("turn_info", [])},
    )


def read_jsonl(path: str) -> list[Trajectory]:
    """Every episode of a trajectories.jsonl file, in order."""
    with open(path) as f:
        return [from_record(json.loads(line)) for line in f if line.strip()]
