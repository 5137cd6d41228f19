"""Helpers shared by the TextWorld and ALFWorld envs: spec values, actions, reward shaping.

Pure functions only (no game engine imports), so they are cheap to test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from envs.base import (
    COMPACT_FORMATS,
    TEXT_OBS_FORMATS,
    SpecError,
    StepResult,
    clean_action,
    render_state,
)

SPLITS = ("train", "eval")
# A game's seed is SPLIT_OFFSET[split] + index, with 0 <= index < SPLIT_STRIDE, so the
# two splits draw from disjoint seed ranges and never share a game.
SPLIT_STRIDE = 1_000_000
SPLIT_OFFSET = {"train": 0, "eval": SPLIT_STRIDE}
REWARD_DENSITIES = ("sparse", "every_k", "dense")
MAX_COMMAND_CHARS = 190  # Jericho cuts Z-machine input at 198 bytes


def split_seed(split: str, index: int) -> int:
    """The generator seed of game `index` of a named split."""
    if split not in SPLIT_OFFSET:
        raise SpecError(f"split must be one of {list(SPLITS)}, got {split!r}")
    if not isinstance(index, int) or not 0 <= index < SPLIT_STRIDE:
        raise SpecError(f"seed must be an int in [0, {SPLIT_STRIDE}), got {index!r}")
    return SPLIT_OFFSET[split] + index


def get_int(spec: Mapping, key: str, default, lo: int | None = None) -> int | None:
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"spec key {key!r} must be an int, got {value!r}")
    if lo is not None and value < lo:
        raise SpecError(f"spec key {key!r} must be >= {lo}, got {value}")
    return value


def get_float(spec: Mapping, key: str, default: float) -> float:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"spec key {key!r} must be a number, got {value!r}")
    return float(value)


def get_choice(spec: Mapping, key: str, default: str, choices) -> str:
    value = spec.get(key, default)
    if value not in choices:
        raise SpecError(f"spec key {key!r} must be one of {list(choices)}, got {value!r}")
    return value


def get_obs_format(spec: Mapping) -> str:
    return get_choice(spec, "obs_format", "template", TEXT_OBS_FORMATS)


def render_text_state(obs_format: str, *, first: bool, room: str, items, goal: str,
                      feedback: str, actions: list[str]) -> str:
    """A text game's observation in the "template" or a compact format (see envs.base).

    compact: `room` should be the room's name only; the goal is shown when `first` only
    ("compact") or on every turn ("compact_goal").
    """
    if obs_format not in COMPACT_FORMATS:
        return render_state(room=room, items=items, goal=goal, feedback=feedback)
    show_goal = first or obs_format == "compact_goal"
    return render_state(room=room, items=items, goal=goal if show_goal else "",
                        feedback=feedback, actions=sorted(actions))


def to_command(action) -> str:
    """Any model output -> one game command: printable ASCII, one line, lower case, bounded.

    Newlines, punctuation and non-ASCII characters become spaces (parsers would read '.' or
    a newline as a second command; NUL bytes crash the Z-machine).
    """
    text = clean_action(action, max_chars=4 * MAX_COMMAND_CHARS)
    text = re.sub(r"[^a-zA-Z0-9'\- ]+", " ", text)
    return " ".join(text.split())[:MAX_COMMAND_CHARS].strip().lower()


def one_line(text: str) -> str:
    """Collapses whitespace so a field of the state template stays on one line."""
    return " ".join((text or "").split())


class RewardShaper:
    """Turns per-step progress into the reward of the configured density.

    sparse: 1.0 on the winning step, else 0.
    dense: the progress gained by the step (progress is 0 at reset and 1 at the win, so the
        rewards of an episode sum to its final progress).
    every_k: dense rewards accumulated and paid every `k` steps and at the episode's end.
    Every step then pays `-step_penalty`, and an invalid action `-invalid_penalty` more.
    Progress lost by undoing a step is charged (a negative delta, never clipped), so the
    progress rewards of an episode telescope to its final progress: a step undone and
    redone is paid once, however often it is cycled (tests: test_undone_and_redone_*).
    """

    def __init__(self, density: str = "sparse", k: int = 1, step_penalty: float = 0.0,
                 invalid_penalty: float = 0.0):
        if density not in REWARD_DENSITIES:
            raise SpecError(f"reward_density must be one of {list(REWARD_DENSITIES)}, "
                            f"got {density!r}")
        self.density, self.k = density, max(1, int(k))
        self.step_penalty, self.invalid_penalty = step_penalty, invalid_penalty
        self.reset()

    def reset(self) -> None:
        self.pending = 0.0
        self.steps = 0

    def __call__(self, progress_delta: float, won: bool, done: bool, invalid: bool) -> float:
        self.steps += 1
        if self.density == "sparse":
            reward = 1.0 if won else 0.0
        elif self.density == "dense":
            reward = progress_delta
        else:
            self.pending += progress_delta
            reward = 0.0
            if done or self.steps % self.k == 0:
                reward, self.pending = self.pending, 0.0
        reward -= self.step_penalty
        if invalid:
            reward -= self.invalid_penalty
        return float(reward)


def after_episode(last: StepResult) -> StepResult:
    """The answer to a step taken after the episode ended: the last observation again,
    no reward, still done."""
    return StepResult(last.observation, 0.0, True, last.won,
                      dict(last.info, note="episode is over; call reset()"))
