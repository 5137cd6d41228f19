"""The environment contract shared by every family (host side; never imports JAX).

An environment is a plain Python object with a `task` (`TaskSpec`), `reset()` and
`step(action)`, both answering a `StepResult`. Observations are rendered in one state
template across families so that a policy sees the same layout everywhere:

    [Room] Kitchen
    [Items] knife (counter), apple (table)
    [Goal] make an apple pie
    [Feedback] You take the apple.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

OBS_FORMATS = ("template", "raw")
# Text games also offer "compact": the template plus an [Actions] line listing the admissible
# commands, the goal shown on the first turn only and the room by name (its description
# arrives as feedback), so an episode costs a fraction of the tokens; "compact_goal" is
# the same with the goal on every turn (a small model need not look far back for it).
COMPACT_FORMATS = ("compact", "compact_goal")
TEXT_OBS_FORMATS = OBS_FORMATS + COMPACT_FORMATS


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What a task is, independent of any episode played on it.

    family: env family name ("textworld", "alfworld", "code", ...).
    name: unique, stable name of the task instance (same seed, same name).
    complexity: family-specific knobs, e.g. {"rooms": 2, "objects": 3, "quest_length": 4}.
    optimal_steps: number of actions of the gold solution.
    gold_actions: action strings that win the task when played from reset.
    info: anything else family-specific (paths, split, ...); plain data only.
    """

    family: str
    name: str
    complexity: dict = dataclasses.field(default_factory=dict)
    optimal_steps: int = 0
    gold_actions: list = dataclasses.field(default_factory=list)
    info: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class StepResult:
    """One answer of an environment.

    observation: text shown to the agent (state template or raw text).
    reward: scalar reward of this step (already shaped by the env's reward density).
    done: the episode is over (won, lost, or out of steps).
    won: the task was solved.
    info: plain-data extras (admissible_commands, score, raw text, truncated, ...).
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    won: bool = False
    info: dict = dataclasses.field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    task: TaskSpec

    def reset(self, seed: int | None = None) -> StepResult: ...

    def step(self, action: str) -> StepResult: ...


def render_state(
    room: str = "",
    items: str | list[str] = "",
    goal: str = "",
    feedback: str = "",
    actions: list[str] | None = None,
) -> str:
    """The shared state template. Empty fields are kept so the layout never changes;
    `actions` (admissible commands), when given, adds an `[Actions] a | b | c` line."""
    if isinstance(items, list | tuple):
        items = ", ".join(items)
    lines = [
        f"[Room] {room.strip()}",
        f"[Items] {items.strip()}",
        f"[Goal] {goal.strip()}",
        f"[Feedback] {feedback.strip()}",
    ]
    if actions is not None:
        lines.append(f"[Actions] {' | '.join(a.strip() for a in actions)}")
    return "\n".join(lines)


MAX_ACTION_CHARS = 2000


def clean_action(action: Any, max_chars: int = MAX_ACTION_CHARS) -> str:
    """Turns any model output into a printable, bounded string; never raises.

    Control characters (but newline and tab) are dropped, the text is cut at `max_chars`.
    """
    if not isinstance(action, str):
        action = "" if action is None else str(action)
    action = action[:max_chars]
    return "".join(ch for ch in action if ch in "\n\t" or ch.isprintable())


class SpecError(ValueError):
    """A spec dict names an unknown family or key, or a value of the wrong kind."""


def check_spec_keys(spec: Mapping, allowed: set[str] | frozenset[str], family: str) -> None:
    """Raises SpecError naming every unknown key and listing the valid ones."""
    unknown = sorted(set(spec) - set(allowed) - {"family"})
    if unknown:
        raise SpecError(
            f"unknown key(s) {unknown} for env family {family!r}; valid keys: {sorted(allowed)}"
        )


# family name -> factory(spec_dict) -> Env. Families register lazily (see envs/__init__.py)
# so importing `envs` does not import TextWorld or ALFWorld.
EnvFactory = Callable[[dict], Env]
