"""Signs that an RL run is degenerating, computed per update (host side, NumPy).

RAGEN names three failure symptoms of multi-turn agent RL ("echo traps"): the policy's
entropy collapses, it keeps to a few actions (action-space coverage falls, actions repeat),
and the spread of returns collapses (every episode the same) or explodes. The monitors:

- action entropy: mean entropy per action token (the learner's "losses/entropy");
- admissible coverage: distinct admissible commands used / distinct commands offered,
  per task group (the envs report `admissible_commands`; the driver keeps them per state
  in `Trajectory.info["admissible"]`);
- repeated-action rate: share of actions repeating an earlier action of their episode;
- return variance: variance of episode returns over the batch;
- KL to the reference policy per action token (the learner's "kl/ref_kl").

`invalid_action_share` (no threshold) is reported with every update and evaluation: the
share of actions the env refused, which free-text decoding makes and constrained decoding
does not. `tampered_episodes` (no threshold) counts the episodes of a batch whose grading
run the coding env's grader flagged as tampered with (envs/grader.py; they earn 0): a
policy that learns to attack the grader shows up here before anywhere else.

`Monitor.check` turns them into metrics ("monitor/*") and warning lines. `novelty_bonus`
is the optional counter-measure: a small reward for an action new to its episode.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from jaxrl_agents.data.trajectory import Trajectory


def normalize_action(action: str) -> str:
    """Lower case, whitespace collapsed: 'Take  Apple ' and 'take apple' are one action."""
    return " ".join(str(action).lower().split())


def first_occurrences(actions: Sequence[str]) -> np.ndarray:
    """[N] bool: action k was not taken earlier in the same episode."""
    seen: set[str] = set()
    out = np.zeros(len(actions), bool)
    for k, action in enumerate(actions):
        a = normalize_action(action)
        out[k] = a not in seen
        seen.add(a)
    return out


def novelty_bonus(actions: Sequence[str], bonus: float) -> np.ndarray:
    """[N] float32 per-turn rewards: `bonus` on each action new to its episode, else 0."""
    return (first_occurrences(actions) * float(bonus)).astype(np.float32)


def add_novelty_bonus(trajectories: Sequence[Trajectory], bonus: float) -> None:
    """Adds `novelty_bonus` to every trajectory's per-turn rewards, in place (0 = off)."""
    if not bonus:
        return
    for t in trajectories:
        t.rewards[t.turn_ends] += novelty_bonus(t.info.get("actions", []), bonus)


def repeated_action_rate(trajectories: Sequence[Trajectory]) -> float:
    """Share of all actions that repeat an earlier action of their own episode (0..1)."""
    firsts = [first_occurrences(t.info.get("actions", [])) for t in trajectories]
    total = sum(len(f) for f in firsts)
    return float(sum(int((~f).sum()) for f in firsts) / total) if total else 0.0


def admissible_coverage(trajectories: Sequence[Trajectory]) -> float:
    """Mean over task groups of |admissible commands used| / |commands offered|.

    A command counts as used when an episode of the group took it in a state that offered
    it. NaN when no episode was offered any command (an env without admissible commands).
    """
    used: dict[int, set[str]] = {}
    offered: dict[int, set[str]] = {}
    for t in trajectories:
        states = t.info.get("admissible", [])
        for action, commands in zip(t.info.get("actions", []), states):
            commands = {normalize_action(c) for c in commands}
            offered.setdefault(t.group_id, set()).update(commands)
            if normalize_action(action) in commands:
                used.setdefault(t.group_id, set()).add(normalize_action(action))
    shares = [len(used.get(g, ())) / len(c) for g, c in offered.items() if c]
    return float(np.mean(shares)) if shares else float("nan")


def invalid_action_share(trajectories: Sequence[Trajectory]) -> float:
    """Share of all actions that their env refused as invalid (`info["invalid"]`: for the text
    games, a command not among the admissible ones); NaN when there was no action."""
    verdicts = [bool(v) for t in trajectories for v in t.info.get("invalid", [])]
    return float(np.mean(verdicts)) if verdicts else float("nan")


def tampered_episodes(trajectories: Sequence[Trajectory]) -> int:
    """How many episodes had a turn the env flagged `info["tampered"]` (kept per turn in
    `Trajectory.info["turn_info"]`, see rewards.TURN_INFO_KEYS)."""
    return sum(any(turn.get("tampered") for turn in t.info.get("turn_info", []))
               for t in trajectories)


def return_variance(trajectories: Sequence[Trajectory]) -> float:
    """Population variance of the episodes' returns (0 for fewer than two)."""
    returns = [t.episode_return for t in trajectories]
    return float(np.var(returns)) if len(returns) > 1 else 0.0


@dataclasses.dataclass
class Monitor:
    """Thresholds of the `monitor` config section, and the first entropy seen (its state).

    entropy_collapse: warn when action entropy falls under this share of its first value.
    coverage_min / repeat_max: warn under / over these.
    return_var_min / return_var_max: warn when the return variance leaves this range.
    kl_max: warn when the KL to the reference policy passes this.
    enabled: False makes `report` a no-op.
    """

    entropy_collapse: float = 0.1
    coverage_min: float = 0.05
    repeat_max: float = 0.5
    return_var_min: float = 1.0
    return_var_max: float = 10.0
    kl_max: float = 0.5
    enabled: bool = True
    first_entropy: float | None = None

    @classmethod
    def from_config(cls, monitor_cfg) -> Monitor:
        skip = ("enabled", "first_entropy")
        fields = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
        values = {name: float(monitor_cfg[name]) for name in fields}
        return cls(**values, enabled=bool(monitor_cfg.enabled))

    def measure(self, trajectories: Sequence[Trajectory], metrics: Mapping) -> dict:
        """The monitored values ("monitor/<name>"; NaN where the input lacks one)."""
        return {
            "monitor/entropy": float(metrics.get("losses/entropy", math.nan)),
            "monitor/admissible_coverage": admissible_coverage(trajectories),
            "monitor/repeat_rate": repeated_action_rate(trajectories),
            "monitor/return_var": return_variance(trajectories),
            "monitor/kl": float(metrics.get("kl/ref_kl", math.nan)),
        }

    def warnings(self, values: Mapping) -> list[str]:
        """One line per threshold crossed (NaN values never warn)."""
        out = []
        entropy = values["monitor/entropy"]
        if self.first_entropy is None and math.isfinite(entropy):
            self.first_entropy = entropy
        if self.first_entropy and entropy < self.entropy_collapse * self.first_entropy:
            out.append(
                f"entropy collapse: action entropy {entropy:.4g} < {self.entropy_collapse:g} x "
                f"its first value {self.first_entropy:.4g}"
            )
        coverage = values["monitor/admissible_coverage"]
        if coverage < self.coverage_min:
            out.append(
                f"action-space collapse: {coverage:.3f} of the admissible commands used "
                f"(< {self.coverage_min:g})"
            )
        repeat = values["monitor/repeat_rate"]
        if repeat > self.repeat_max:
            out.append(
                f"repetition: {repeat:.3f} of actions repeat an earlier one of their episode "
                f"(> {self.repeat_max:g})"
            )
        var = values["monitor/return_var"]
        if not self.return_var_min <= var <= self.return_var_max:
            kind = "collapse" if var < self.return_var_min else "explosion"
            out.append(
                f"return-variance {kind}: {var:.4g} outside "
                f"[{self.return_var_min:g}, {self.return_var_max:g}]"
            )
        kl = values["monitor/kl"]
        if kl > self.kl_max:
            out.append(f"KL drift: {kl:.4g} per action token > {self.kl_max:g}")
        return out

    def check(self, trajectories: Sequence[Trajectory], metrics: Mapping) -> tuple[dict, list]:
        """(metrics to log, warning lines): the values, "monitor/warnings" (their count) and,
        when there are any, "monitor/warning_text" (the lines joined; metrics.jsonl only)."""
        values = self.measure(trajectories, metrics)
        lines = self.warnings(values)
        values["monitor/warnings"] = len(lines)
        if lines:
            values["monitor/warning_text"] = "; ".join(lines)
        return values, lines

    def report(self, trajectories, metrics: Mapping, write=print, step=None) -> dict:
        """`check`, with every warning line passed to `write` (e.g. RunLogger.write); {} when
        the monitor is disabled."""
        if not self.enabled:
            return {}
        values, lines = self.check(trajectories, metrics)
        where = "" if step is None else f" (update {step})"
        for line in lines:
            write(f"monitor warning{where}: {line}")
        return values

    def state_dict(self) -> dict:
        return {"first_entropy": self.first_entropy}

    def load_state_dict(self, state: Mapping) -> None:
        self.first_entropy = state.get("first_entropy")
