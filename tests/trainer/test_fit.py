"""The fit loop SFT, the reward model and the RL learner share (trainer/fit.py)."""

import jax
import numpy as np

from jaxrl_agents.trainer.fit import (
    history_row,
    key_orders,
    minibatches,
    seeded_orders,
    split_train_val,
    steps_per_epoch,
    train_all_epochs,
    train_epochs,
)


def test_minibatches_leave_the_last_short_or_top_it_up_from_the_start():
    order = np.array([4, 0, 3, 1, 2])
    short = [(list(rows), real) for rows, real in minibatches(order, 2)]
    assert short == [([4, 0], 2), ([3, 1], 2), ([2], 1)]
    topped = [(list(rows), real) for rows, real in minibatches(order, 2, top_up=True)]
    assert topped == [([4, 0], 2), ([3, 1], 2), ([2, 4], 1)]
    assert len(short) == steps_per_epoch(5, 2) == 3


def test_orders_are_permutations_from_their_seed_or_key():
    numpy_orders, again = seeded_orders(6, seed=3), seeded_orders(6, seed=3)
    first, second = numpy_orders(0), numpy_orders(1)
    assert sorted(first) == list(range(6)) and not np.array_equal(first, second)
    np.testing.assert_array_equal(again(0), first)  # one generator, drawn epoch after epoch
    rng = np.random.default_rng(3)
    np.testing.assert_array_equal(first, rng.permutation(6))
    np.testing.assert_array_equal(second, rng.permutation(6))
    key = jax.random.key(1)
    np.testing.assert_array_equal(
        key_orders(6, key)(2), jax.random.permutation(jax.random.fold_in(key, 2), 6))


def test_train_epochs_steps_every_minibatch_and_yields_each_epoch():
    seen = []

    def step(total, batch):  # state: the sum of the rows seen
        seen.append(batch)
        return total + sum(batch), {"rows": len(batch)}

    data = [10, 20, 30]
    epochs = list(train_epochs(step, 0, order=lambda epoch: np.array([2, 0, 1]),
                               rows_per_step=2, num_epochs=2,
                               batch_of=lambda rows, real: [data[i] for i in rows[:real]]))
    assert [(e, s, [m["rows"] for m in ms]) for e, s, ms in epochs] == [
        (0, 60, [2, 1]), (1, 120, [2, 1])]
    assert seen == [[30, 10], [20]] * 2
    state, metrics = train_all_epochs(step, 0, order=lambda epoch: np.array([2, 0, 1]),
                                      rows_per_step=2, num_epochs=2, top_up=True,
                                      batch_of=lambda rows, real: [data[i] for i in rows])
    assert state == 2 * (60 + 30) and len(metrics) == 4  # row 2 (30) twice an epoch


def test_history_row_averages_the_loss_of_the_epoch():
    row = history_row(0, [{"loss": np.float32(1.0)}, {"loss": np.float32(2.0)}], "loss",
                      num_train=4, num_val=1)
    assert row == {"epoch": 1, "train_loss": 1.5, "num_train": 4, "num_val": 1}


def test_split_train_val_is_disjoint_and_deterministic():
    items = list(range(10))
    train, val = split_train_val(items, 0.2, seed=3)
    assert len(val) == 2 and sorted(train + val) == items
    assert split_train_val(items, 0.2, seed=3) == (train, val)
    assert split_train_val([1], 0.2, 0) == ([1], [])
