"""Task mixing: which tasks (families, types, sizes) fill the slots of a batch.

A batch of `n` task slots is composed in parts, in order: a part with a share gets
`share x n` slots (rounded at random to a whole number with the right expectation) drawn
among its tasks by weight; the last part, share None, gets every slot left. A task never
gets more slots than it has training instances (its capacity); slots a part cannot fill
pass on to the next parts. With the core task first, curriculum replay next and the
mixture last:

    counts = compose_batch(rng, 16, [(0.25, {"toy:count-2": 1}),
                                     (None, {"toy:count-2": 1, "toy:guess-8": 3})], capacity)

The draws depend only on the generator, so a batch is a pure function of (seed, update).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np


def share_count(rng: np.random.Generator, share: float, num_slots: int) -> int:
    """floor(share x n) plus one with probability equal to the fraction left (mean share x n)."""
    exact = share * num_slots
    whole = int(np.floor(exact))
    return whole + int(rng.random() < exact - whole)


def draw_counts(
    rng: np.random.Generator,
    num_slots: int,
    weights: Mapping[str, float],
    capacity: Mapping[str, int],
) -> dict[str, int]:
    """Draws `num_slots` tasks one at a time, each with probability proportional to its
    weight among the tasks that still have capacity; stops early when none has."""
    counts = Counter()
    names = [t for t in weights if weights[t] > 0]
    for _ in range(num_slots):
        open_ = [t for t in names if counts[t] < capacity.get(t, 0)]
        if not open_:
            break
        p = np.array([weights[t] for t in open_], np.float64)
        counts[open_[rng.choice(len(open_), p=p / p.sum())]] += 1
    return dict(counts)


def compose_batch(
    rng: np.random.Generator,
    num_slots: int,
    parts: Sequence[tuple[float | None, Mapping[str, float]]],
    capacity: Mapping[str, int],
) -> dict[str, int]:
    """{task: slots} of one batch from `parts` = [(share or None, {task: weight})] (see the
    module docstring); the total is num_slots unless the capacities run out."""
    left = dict(capacity)
    counts = Counter()
    for share, weights in parts:
        free = num_slots - sum(counts.values())
        want = free if share is None else min(share_count(rng, share, num_slots), free)
        drawn = draw_counts(rng, want, weights, left)
        for task, k in drawn.items():
            counts[task] += k
            left[task] -= k
    return dict(counts)


class TaskMixer:
    """Sampling weights over tasks, with `core_share` of every batch kept for the core task.

    tasks: task names (any keys the caller uses). weights: one per task (None = equal).
    Tasks the step budget retired get no more mixture draws; the core share is never
    retired. `drawn` counts the slots each task got over the run (for logging the shares).
    """

    def __init__(
        self,
        tasks: Sequence[str],
        weights: Sequence[float] | None = None,
        *,
        core_share: float = 0.25,
    ):
        weights = [1.0] * len(tasks) if not weights else [float(w) for w in weights]
        if len(weights) != len(tasks):
            raise ValueError(f"mixing.weights has {len(weights)} values for {len(tasks)} tasks")
        if any(w < 0 for w in weights) or (tasks and sum(weights) <= 0):
            raise ValueError(f"mixing.weights {weights} must be >= 0 with a positive sum")
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"mixing.tasks {list(tasks)} repeats a task")
        if not 0.0 <= core_share <= 1.0:
            raise ValueError(f"mixing.core_share must lie in [0, 1], got {core_share}")
        self.weights = dict(zip(tasks, weights))
        self.core_share = float(core_share)
        self.drawn: dict[str, int] = {}

    def parts(
        self, core: str, middle: Sequence = (), retired: Sequence[str] = ()
    ) -> list[tuple[float | None, dict[str, float]]]:
        """The `compose_batch` parts: the core share, `middle` parts, then the mixture (the
        core task alone when every mixture task is retired)."""
        mixture = {t: w for t, w in self.weights.items() if t not in retired and w > 0}
        return [(self.core_share, {core: 1.0}), *middle, (None, mixture or {core: 1.0})]

    def record(self, counts: Mapping[str, int]) -> None:
        for task, k in counts.items():
            self.drawn[task] = self.drawn.get(task, 0) + int(k)

    def drawn_shares(self) -> dict[str, float]:
        total = sum(self.drawn.values())
        return {t: k / total for t, k in sorted(self.drawn.items())} if total else {}

    def state_dict(self) -> dict:
        return {"drawn": dict(self.drawn)}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = {k: int(v) for k, v in state["drawn"].items()}
