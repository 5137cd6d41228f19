"""Step budgets per task, adapted to the task's success rate.

A task's budget is `factor x optimal_steps` of the instance played (rounded up). Every task
starts at `start_factor`; every `adjust_every_epochs` epochs, a task that succeeded less than
`grow_below` of its episodes since the last adjustment gets `adjust` more (x1.25), one above
`shrink_above` gets `adjust` less (x0.75), within [min_factor, max_factor]. A task above
`retire_above` at `retire_after` adjustments in a row is mastered: `on_mastered` "harder"
drops its budget to `min_factor` (a mastered task already there is retired), "retire" takes it
out of the task mixture, "none" does nothing.

State is a plain dict so it checkpoints as JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

ON_MASTERED = ("harder", "retire", "none")


class StepBudget:
    """Per-task step budgets (see the module docstring)."""

    def __init__(
        self,
        *,
        start_factor: float = 2.0,
        adjust: float = 0.25,
        adjust_every_epochs: int = 10,
        grow_below: float = 0.3,
        shrink_above: float = 0.7,
        min_factor: float = 1.0,
        max_factor: float = 6.0,
        retire_above: float = 0.8,
        retire_after: int = 3,
        on_mastered: str = "retire",
    ):
        if not 0.0 < min_factor <= start_factor <= max_factor:
            raise ValueError(
                f"budget factors need 0 < min_factor ({min_factor}) <= start_factor "
                f"({start_factor}) <= max_factor ({max_factor})"
            )
        if not 0.0 < adjust < 1.0:
            raise ValueError(f"budget.adjust must lie in (0, 1), got {adjust}")
        if adjust_every_epochs < 1:
            raise ValueError(f"budget.adjust_every_epochs must be >= 1, got {adjust_every_epochs}")
        if not 0.0 <= grow_below <= shrink_above <= 1.0:
            raise ValueError(
                f"budget thresholds need 0 <= grow_below ({grow_below}) <= "
                f"shrink_above ({shrink_above}) <= 1"
            )
        if retire_after < 1:
            raise ValueError(f"budget.retire_after must be >= 1, got {retire_after}")
        if on_mastered not in ON_MASTERED:
            raise ValueError(f"budget.on_mastered {on_mastered!r}; allowed: {list(ON_MASTERED)}")
        self.start_factor = float(start_factor)
        self.adjust = float(adjust)
        self.adjust_every_epochs = int(adjust_every_epochs)
        self.grow_below = float(grow_below)
        self.shrink_above = float(shrink_above)
        self.min_factor = float(min_factor)
        self.max_factor = float(max_factor)
        self.retire_above = float(retire_above)
        self.retire_after = int(retire_after)
        self.on_mastered = on_mastered
        self.factors: dict[str, float] = {}  # tasks whose budget has moved
        self.window: dict[str, list[int]] = {}  # task -> [wins, episodes] since the last check
        self.streaks: dict[str, int] = {}  # task -> checks in a row above retire_above
        self.retired: list[str] = []

    @classmethod
    def from_config(cls, budget_cfg) -> StepBudget:
        b = budget_cfg
        return cls(
            start_factor=b.start_factor,
            adjust=b.adjust,
            adjust_every_epochs=b.adjust_every_epochs,
            grow_below=b.grow_below,
            shrink_above=b.shrink_above,
            min_factor=b.min_factor,
            max_factor=b.max_factor,
            retire_above=b.retire_above,
            retire_after=b.retire_after,
            on_mastered=b.on_mastered,
        )

    def factor(self, task: str) -> float:
        return self.factors.get(task, self.start_factor)

    def steps(self, task: str, optimal_steps: int) -> int:
        """The budget of one episode of `task` on an instance of `optimal_steps`."""
        return steps_for(self.factor(task), optimal_steps)

    def eval_steps(self, optimal_steps: int) -> int:
        """The fixed budget of held-out evaluation (start_factor), comparable over a run."""
        return steps_for(self.start_factor, optimal_steps)

    def is_retired(self, task: str) -> bool:
        return task in self.retired

    def observe(self, epoch: int, results: Mapping[str, tuple[int, int]]) -> dict[str, str]:
        """Adds `epoch`'s (wins, episodes) per task; at an adjustment epoch moves the budgets.

        Returns {task: what happened} for the tasks checked ("grow", "shrink", "keep",
        optionally followed by "+harder" / "+retire"); {} between adjustments.
        """
        for task, (wins, episodes) in results.items():
            tally = self.window.setdefault(task, [0, 0])
            tally[0] += int(wins)
            tally[1] += int(episodes)
        if (epoch + 1) % self.adjust_every_epochs:
            return {}
        events = {}
        for task, (wins, episodes) in sorted(self.window.items()):
            if episodes:
                events[task] = self._check(task, wins / episodes)
        self.window = {}
        return events

    def _check(self, task: str, success: float) -> str:
        factor = self.factor(task)
        if success < self.grow_below:
            event, factor = "grow", factor * (1.0 + self.adjust)
        elif success > self.shrink_above:
            event, factor = "shrink", factor * (1.0 - self.adjust)
        else:
            event = "keep"
        self.factors[task] = min(max(factor, self.min_factor), self.max_factor)
        streak = self.streaks.get(task, 0) + 1 if success > self.retire_above else 0
        self.streaks[task] = streak
        if streak >= self.retire_after and self.on_mastered != "none":
            self.streaks[task] = 0
            event += self._master(task)
        return event

    def _master(self, task: str) -> str:
        if self.on_mastered == "harder" and self.factors[task] > self.min_factor:
            self.factors[task] = self.min_factor
            return "+harder"
        if task not in self.retired:
            self.retired.append(task)
        return "+retire"

    def state_dict(self) -> dict:
        return {
            "factors": dict(self.factors),
            "window": {k: list(v) for k, v in self.window.items()},
            "streaks": dict(self.streaks),
            "retired": list(self.retired),
        }

    def load_state_dict(self, state: dict) -> None:
        self.factors = {k: float(v) for k, v in state["factors"].items()}
        self.window = {k: [int(v[0]), int(v[1])] for k, v in state["window"].items()}
        self.streaks = {k: int(v) for k, v in state["streaks"].items()}
        self.retired = list(state["retired"])


def steps_for(factor: float, optimal_steps: int) -> int:
    """ceil(factor x optimal_steps), at least 1 (rounded first: 2.5 x 4 is 10, not 11)."""
    return max(1, math.ceil(round(factor * optimal_steps, 6)))
