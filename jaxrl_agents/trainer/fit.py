"""The loop every fitter shares: epochs of shuffled minibatches, one jitted step each.

    for epoch, state, metrics in train_epochs(step, state, order=..., rows_per_step=...,
                                              batch_of=..., num_epochs=...):
        ...  # the end of an epoch: validation, history, progress (metrics: its steps')

The RL learner (trainer/rl.py: PPO epochs over a collected batch), SFT (trainer/sft.py)
and the reward model (reward_model.py) run it. What differs between them is passed in:

- the order of the rows in each epoch: `seeded_orders` (one NumPy generator, drawn epoch
  after epoch: SFT and the reward model) or `key_orders` (a JAX key folded with the
  epoch: RL);
- the last minibatch of an epoch: short, or topped up to the full size with the epoch's
  first rows (`top_up`: RL, one compiled size; the caller masks the extra rows out);
- how rows become a step's batch, `batch_of(rows, real)`, and the step itself,
  `step(state, batch) -> (state, metrics)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

Order = Callable[[int], np.ndarray]  # epoch -> a permutation of the rows
Step = Callable[[Any, Any], tuple[Any, dict]]  # (state, batch) -> (state, metrics)


def seeded_orders(rows: int, seed: int) -> Order:
    """Permutations of range(rows) drawn from one NumPy generator seeded with `seed`, one
    per call: call it once per epoch, in epoch order."""
    rng = np.random.default_rng(seed)
    return lambda epoch: rng.permutation(rows)


def key_orders(rows: int, key) -> Order:
    """The permutation of range(rows) of an epoch: from `key` folded with the epoch."""
    return lambda epoch: np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), rows))


def minibatches(order: np.ndarray, size: int, *, top_up: bool = False
                ) -> Iterator[tuple[np.ndarray, int]]:
    """(rows, real) for consecutive runs of `size` rows of `order`: `real` of them are the
    run's own. The last run may be short; with `top_up` it is filled to `size` (at most
    len(order)) with the first rows of `order`, which then appear twice in the epoch."""
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        real = len(rows)
        if top_up:
            rows = np.concatenate([rows, order[: size - real]])
        yield rows, real


def steps_per_epoch(rows: int, rows_per_step: int) -> int:
    """The minibatches of an epoch over `rows` rows (the last one may be short)."""
    return -(-rows // rows_per_step)


def train_epochs(
    step: Step,
    state,
    *,
    order: Order,
    rows_per_step: int,
    batch_of: Callable[[np.ndarray, int], Any],
    num_epochs: int,
    top_up: bool = False,
    fetch_metrics: bool = False,
    on_step: Callable[[], None] | None = None,
) -> Iterator[tuple[int, Any, list[dict]]]:
    """Runs `num_epochs` passes of `step` over minibatches of `rows_per_step` rows taken in
    the epoch's `order` (`minibatches`; `batch_of(rows, real)` builds each step's batch)
    and yields (epoch, state, metrics) after each: the state so far and the outputs of
    the epoch's steps. With `fetch_metrics` each step's metrics are fetched to the host
    before the next batch is built (the host waits for every step: batches built on the
    host do not pile up on the device); else they stay on the device. `on_step()` runs
    after each step (a progress bar)."""
    for epoch in range(num_epochs):
        metrics = []
        for rows, real in minibatches(order(epoch), rows_per_step, top_up=top_up):
            state, m = step(state, batch_of(rows, real))
            metrics.append(jax.device_get(m) if fetch_metrics else m)
            if on_step is not None:
                on_step()
        yield epoch, state, metrics


def train_all_epochs(step: Step, state, **kwargs) -> tuple[Any, list[dict]]:
    """`train_epochs` (same arguments) run to the end: the final state and the metrics of
    every step, in order."""
    metrics = []
    for _, after, epoch_metrics in train_epochs(step, state, **kwargs):
        state = after
        metrics += epoch_metrics
    return state, metrics


def history_row(epoch: int, metrics: Sequence[dict], loss: str, *, num_train: int,
                num_val: int) -> dict:
    """A supervised fit's history row for `epoch` (counted from 1 in the row): the mean of
    its steps' `loss` and the sizes of the split."""
    return {
        "epoch": epoch + 1,
        "train_loss": float(np.mean([float(m[loss]) for m in metrics])),
        "num_train": num_train,
        "num_val": num_val,
    }


def split_train_val(items: Sequence, val_fraction: float, seed: int) -> tuple[list, list]:
    """Shuffles and holds out round(n * val_fraction) items (at least 1 when n >= 2)."""
    order = np.random.default_rng(seed).permutation(len(items))
    n_val = int(round(len(items) * val_fraction))
    if val_fraction > 0 and len(items) >= 2:
        n_val = min(max(n_val, 1), len(items) - 1)
    val = [items[i] for i in order[:n_val]]
    train = [items[i] for i in order[n_val:]]
    return train, val
