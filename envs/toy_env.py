"""A small multi-turn game family ("toy") for tests of the pool, the rollout driver and the trainer.

The games are easy on purpose: actions are single numbers, an episode lasts a handful of
turns, and the best action can be read off the observation, so a tiny model can learn them by
RL in minutes on a CPU. Two tasks:

- `count`: say the numbers from `start` to `start + n - 1`, one per turn. The observation shows
  the last number said, so the best action is that number plus one.
- `guess`: a hidden integer in [1, n]; each guess answers "higher" or "lower". The observation
  shows the range still possible, so the best action is its midpoint (binary search); the gold
  actions are that search.

Spec keys (all optional):

- `task` ("count"): "count" or "guess".
- `n` (3 for count, 8 for guess): how many numbers to say / the size of the range.
- `seed` (0): picks `start` (count) or the hidden number (guess).
- `split` ("train"): "train" or "eval". Train uses odd starts / targets and eval even ones, so
  the two splits never share a task (except guess with n=1, whose only target is 1).
- `max_steps` (2 x optimal + 2): the step budget; running out ends the episode
  (`info["truncated"]`).
- `obs_format` ("template"): "template" (the shared state template) or "raw" (plain sentences).
- `reward_density` ("sparse"): "sparse" gives 1 at the win; "dense" gives progress rewards that
  sum to 1 on a win (count: 1/n per right number; guess: the share of the range ruled out).
- `invalid_penalty` (0.0): subtracted from the reward of an action with no number in it.

Fault injection, ONLY for tests of the worker pool (never set them in training specs):
`sleep_s` (sleep that long in every reset and step), `hang_on` (step sleeps forever when the
stripped action equals this string), `crash_on` (step kills its own process with SIGKILL),
`raise_on` (step raises RuntimeError). Played in the test process, `crash_on` kills the test.

Any string is a valid action: the first integer in it is the answer ("5", "guess 5", "I say 5.");
text with no integer gets feedback and the optional penalty. `reset(seed)` with a new seed
rebuilds the task from it (so `task` changes).
"""

from __future__ import annotations

import os
import random
import re
import signal
import time

from envs.base import OBS_FORMATS, SpecError, StepResult, TaskSpec, clean_action, render_state

TASKS = ("count", "guess")
SPLITS = ("train", "eval")
REWARD_DENSITIES = ("sparse", "dense")
DEFAULT_N = {"count": 3, "guess": 8}
MAX_N = 10**6
MAX_ADMISSIBLE = 20
ALLOWED_KEYS = frozenset(
    {
        "task",
        "n",
        "seed",
        "split",
        "max_steps",
        "obs_format",
        "reward_density",
        "invalid_penalty",
        "sleep_s",
        "hang_on",
        "crash_on",
        "raise_on",
    }
)
_INT_RE = re.compile(r"[-+]?\d{1,30}")


def make_env(spec: dict) -> ToyEnv:
    """Factory registered as family "toy" (`spec` without the "family" key)."""
    return ToyEnv(spec)


def _choose(rng: random.Random, low: int, high: int, parity: int) -> int:
    """A random integer in [low, high] of `parity` (0 even, 1 odd); `low` when none has it."""
    first = low if low % 2 == parity else low + 1
    return rng.choice(range(first, high + 1, 2)) if first <= high else low


def binary_search(target: int, low: int, high: int) -> list[int]:
    """The guesses of midpoint search for `target` in [low, high], ending with the target."""
    guesses = []
    while True:
        mid = (low + high) // 2
        guesses.append(mid)
        if mid == target:
            return guesses
        if mid < target:
            low = mid + 1
        else:
            high = mid - 1


def parse_number(action: str) -> int | None:
    """The first integer written in `action`, or None."""
    match = _INT_RE.search(action)
    return int(match.group()) if match else None


class ToyEnv:
    """The "toy" family; see the module docstring for the rules and the spec keys."""

    def __init__(self, spec: dict):
        self.spec = self._validated(spec)
        self.task = self._make_task(self.spec["seed"])
        self._start_episode()

    @staticmethod
    def _validated(spec: dict) -> dict:
        unknown = sorted(set(spec) - ALLOWED_KEYS)
        if unknown:
            raise SpecError(
                f"unknown key(s) {unknown} for env family 'toy'; valid keys: {sorted(ALLOWED_KEYS)}"
            )
        spec = dict(spec)
        choices = {
            "task": TASKS,
            "split": SPLITS,
            "obs_format": OBS_FORMATS,
            "reward_density": REWARD_DENSITIES,
        }
        spec.setdefault("task", "count")
        spec.setdefault("split", "train")
        spec.setdefault("obs_format", "template")
        spec.setdefault("reward_density", "sparse")
        for key, allowed in choices.items():
            if spec[key] not in allowed:
                raise SpecError(f"toy spec key {key!r} is {spec[key]!r}; one of {list(allowed)}")
        spec.setdefault("n", DEFAULT_N[spec["task"]])
        spec.setdefault("seed", 0)
        for key, low in (("n", 1), ("seed", 0), ("max_steps", 1)):
            value = spec.get(key)
            if value is not None and (not isinstance(value, int) or not low <= value <= MAX_N):
                raise SpecError(f"toy spec key {key!r} is {value!r}; an int in [{low}, {MAX_N}]")
        for key in ("invalid_penalty", "sleep_s"):
            if not isinstance(spec.get(key, 0.0), int | float):
                raise SpecError(f"toy spec key {key!r} is {spec[key]!r}; a number")
        return spec

    def _make_task(self, seed: int) -> TaskSpec:
        task, n, split = self.spec["task"], self.spec["n"], self.spec["split"]
        rng = random.Random(f"toy-{task}-{n}-{split}-{seed}")
        parity = 1 if split == "train" else 0
        if task == "count":
            start = _choose(rng, 1, 40, parity)
            gold = [str(start + i) for i in range(n)]
            secret = {"start": start}
        else:
            target = _choose(rng, 1, n, parity)
            gold = [str(g) for g in binary_search(target, 1, n)]
            secret = {"target": target}
        optimal = len(gold)
        max_steps = self.spec.get("max_steps") or 2 * optimal + 2
        return TaskSpec(
            family="toy",
            name=f"toy-{task}-n{n}-{split}-s{seed}",
            complexity={"task": task, "n": n},
            optimal_steps=optimal,
            gold_actions=gold,
            info={"split": split, "seed": seed, "max_steps": max_steps, **secret},
        )

    # -- episode state ------------------------------------------------------------------------

    def _start_episode(self) -> None:
        self.steps = 0
        self.done = False
        self.won = False
        self.said = 0  # count: numbers said right so far
        self.low, self.high = 1, self.spec["n"]  # guess: the range still possible

    def _remaining(self) -> int:
        return max(self.high - self.low + 1, 0)

    def _expected(self) -> int:
        return self.task.info["start"] + self.said

    def reset(self, seed: int | None = None) -> StepResult:
        self._maybe_sleep()
        if seed is not None and seed != self.task.info["seed"]:
            self.task = self._make_task(seed)
        self._start_episode()
        if self.spec["task"] == "count":
            feedback = f"Say {self.task.info['start']} first."
        else:
            feedback = "Make a guess."
        return self._result(0.0, feedback, invalid=False)

    def step(self, action: str) -> StepResult:
        action = clean_action(action)
        self._inject_faults(action)
        self._maybe_sleep()
        if self.done:
            return self._result(0.0, "The episode is over; reset to play again.", invalid=False)
        self.steps += 1
        number = parse_number(action)
        if number is None:
            reward = -float(self.spec.get("invalid_penalty", 0.0))
            feedback = "Answer with a number."
        elif self.spec["task"] == "count":
            reward, feedback = self._count(number)
        else:
            reward, feedback = self._guess(number)
        if not self.done and self.steps >= self.task.info["max_steps"]:
            self.done = True
            feedback += " Out of steps."
        return self._result(reward, feedback, invalid=number is None)

    def _count(self, number: int) -> tuple[float, str]:
        n = self.spec["n"]
        if number != self._expected():
            last = self._expected() - 1
            return 0.0, f"Wrong: {number} does not come after {last}."
        self.said += 1
        reward = 1.0 / n if self.spec["reward_density"] == "dense" else 0.0
        if self.said == n:
            self.done = self.won = True
            reward = reward if self.spec["reward_density"] == "dense" else 1.0
            return reward, f"Right, {number}. You counted to the end!"
        return reward, f"Right, {number}."

    def _guess(self, number: int) -> tuple[float, str]:
        n, target = self.spec["n"], self.task.info["target"]
        before = self._remaining()
        if number == target:
            self.done = self.won = True
            self.low, self.high = target, target - 1  # nothing left to rule out
            feedback = f"Correct, it is {number}!"
        elif not self.low <= number <= self.high:
            feedback = f"{number} is outside {self.low} to {self.high}."
        elif number < target:
            self.low = number + 1
            feedback = f"Higher than {number}."
        else:
            self.high = number - 1
            feedback = f"Lower than {number}."
        if self.spec["reward_density"] == "dense":
            return (before - self._remaining()) / n, feedback
        return (1.0 if self.won else 0.0), feedback

    # -- rendering ----------------------------------------------------------------------------

    def _state(self) -> tuple[str, str, str]:
        """(room, items, goal) of the current state."""
        if self.spec["task"] == "count":
            start = self.task.info["start"]
            last = str(self._expected() - 1) if self.said else "none yet"
            goal = f"say the numbers from {start} to {start + self.spec['n'] - 1}, one per turn"
            return "Counter", f"last number: {last}", goal
        if self.won:
            items = f"found: {self.task.info['target']}"
        else:
            items = f"possible: {self.low} to {self.high}"
        return "Guessing", items, f"find the hidden number between 1 and {self.spec['n']}"

    def _admissible(self) -> list[str]:
        """A few plausible answers (a window around the best one), for random-policy tests."""
        if self.spec["task"] == "count":
            center = self._expected()
            return [str(v) for v in range(max(center - 2, 0), center + 3)]
        low, high = self.low, max(self.high, self.low)
        first = max(low, (low + high) // 2 - MAX_ADMISSIBLE // 2)
        return [str(v) for v in range(first, min(high, first + MAX_ADMISSIBLE - 1) + 1)]

    def _result(self, reward: float, feedback: str, invalid: bool) -> StepResult:
        room, items, goal = self._state()
        raw = f"{goal[0].upper()}{goal[1:]}. {items[0].upper()}{items[1:]}. {feedback}"
        template = render_state(room=room, items=items, goal=goal, feedback=feedback)
        info = {
            "admissible_commands": self._admissible(),
            "steps": self.steps,
            "invalid": invalid,
            "truncated": self.done and not self.won,
            "raw": raw,
        }
        observation = template if self.spec["obs_format"] == "template" else raw
        return StepResult(observation, float(reward), self.done, self.won, info)

    # -- fault injection (pool tests only) ----------------------------------------------------

    def _maybe_sleep(self) -> None:
        if self.spec.get("sleep_s"):
            time.sleep(float(self.spec["sleep_s"]))

    def _inject_faults(self, action: str) -> None:
        action = action.strip()
        if self.spec.get("hang_on") is not None and action == self.spec["hang_on"]:
            while True:
                time.sleep(3600)
        if self.spec.get("crash_on") is not None and action == self.spec["crash_on"]:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.spec.get("raise_on") is not None and action == self.spec["raise_on"]:
            raise RuntimeError(f"toy env raise_on={action!r} (fault injection)")
