import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_agents.data import ACTION, PROMPT, Trajectory
from jaxrl_agents.trainer.fit import split_train_val
from jaxrl_agents.trainer.sft import SFTTrainer
from tests.trainer.helpers import tiny_policy


def _copy_task(seed, n=12):
    """Episodes where each action repeats the observation's token: learnable exactly."""
    rng = np.random.default_rng(seed)
    trajs = []
    for _ in range(n):
        tokens, types = [1], [PROMPT]
        for _ in range(4):
            x = int(rng.integers(3, 16))
            tokens += [2, x, x]
            types += [PROMPT, PROMPT, ACTION]
        trajs.append(
            Trajectory(
                tokens,
                types,
                np.zeros(len(tokens)),
                np.zeros(len(tokens)),
                [i for i, t in enumerate(types) if t == ACTION],
            )
        )
    return trajs


@pytest.mark.parametrize("optimizer_state", ["float32", "int8"])
def test_sft_loss_falls_and_validation_is_reported(optimizer_state):
    policy = tiny_policy(vocab_size=16)
    trainer = SFTTrainer(
        policy, learning_rate=3e-3, batch_size=4, epochs=8, val_fraction=0.25, length_buckets=(16,),
        optimizer_state=optimizer_state,
    )
    before = trainer.evaluate(nnx.state(policy), _copy_task(1))
    seen, steps = [], []
    history = trainer.fit(_copy_task(0, n=16), on_epoch=seen.append,
                          on_step=lambda: steps.append(len(seen)))
    after = trainer.evaluate(nnx.state(policy), _copy_task(1))
    assert len(history) == 8 and seen == history
    # 12 train rows in steps of 4, every step reported, each epoch's before its row
    assert trainer.num_steps(16) == 24 and steps == [e for e in range(8) for _ in range(3)]
    assert history[-1]["train_loss"] < 0.5 * history[0]["train_loss"]
    assert history[0]["num_val"] == 4 and "val_loss" in history[-1]
    assert after["sft/loss"] < 0.5 * before["sft/loss"]  # the policy module itself was updated


def test_empty_sft_is_an_error():
    trainer = SFTTrainer(
        tiny_policy(vocab_size=16, num_layers=1),
        learning_rate=1e-3,
        batch_size=2,
        epochs=1,
        val_fraction=0.2,
    )
    with pytest.raises(ValueError, match="golden"):
        trainer.fit([])


def _flip(traj: Trajectory) -> Trajectory:
    """The same episode with every action token x replaced by 18 - x."""
    tokens = np.where(traj.token_type == ACTION, 18 - traj.tokens, traj.tokens)
    return Trajectory(tokens, traj.token_type, traj.logprobs, traj.rewards, traj.turn_ends)


def test_keep_best_ends_on_the_epoch_of_lowest_validation_loss():
    """Validation episodes follow another rule (action = 18 - observation) than training
    (action = observation): fitting the training rule soon makes validation loss rise, so
    the last epoch is not the best one, and keep_best must return the best epoch's params."""
    n = 16
    _, val_idx = split_train_val(list(range(n)), 0.25, 0)
    data = [_flip(t) if i in val_idx else t for i, t in enumerate(_copy_task(0, n=n))]
    results = {}
    for keep_best in (False, True):
        policy = tiny_policy(vocab_size=20)
        trainer = SFTTrainer(policy, learning_rate=3e-3, batch_size=4, epochs=8,
                             val_fraction=0.25, keep_best=keep_best, length_buckets=(16,))
        history = trainer.fit(data, on_epoch=None)
        val = [data[i] for i in val_idx]
        results[keep_best] = (history, trainer.evaluate(nnx.state(policy), val)["sft/loss"])
    history, final_loss = results[True]
    best = min(row["val_loss"] for row in history)
    assert best < history[-1]["val_loss"]  # the case under test: the last epoch is worse
    assert final_loss == pytest.approx(best, rel=1e-5)
    assert results[False][1] == pytest.approx(history[-1]["val_loss"], rel=1e-5)


def test_target_all_models_every_token_and_bad_target_is_an_error():
    """target="all" (language-model pretraining) learns the observation tokens too: in the copy
    task the prompt tokens 1 and 2 are fixed, so only an every-token loss gets them right."""
    policy = tiny_policy(vocab_size=16)
    trainer = SFTTrainer(policy, learning_rate=3e-3, batch_size=4, epochs=6, val_fraction=0.25,
                         target="all", length_buckets=(16,))
    history = trainer.fit(_copy_task(0, n=16))
    # Half the tokens (the observed x) are random: the loss cannot halve, but it falls.
    assert history[-1]["train_loss"] < 0.85 * history[0]["train_loss"]
    actions_only = SFTTrainer(policy, learning_rate=3e-3, batch_size=4, epochs=1,
                              val_fraction=0.25, length_buckets=(16,))
    data = _copy_task(1)
    all_loss = trainer.evaluate(nnx.state(policy), data)["sft/loss"]
    action_loss = actions_only.evaluate(nnx.state(policy), data)["sft/loss"]
    assert all_loss != pytest.approx(action_loss)
    with pytest.raises(ValueError, match="target"):
        SFTTrainer(policy, learning_rate=1e-3, batch_size=4, epochs=1, val_fraction=0.2,
                   target="prompts")


def test_token_accuracy_of_a_constrained_token_is_the_argmax_among_its_allowed_ids():
    import jax.numpy as jnp

    from jaxrl_agents.trainer.sft import sft_loss

    policy = tiny_policy(vocab_size=16)
    graphdef, params = nnx.split(policy)
    ids = jnp.array([[1, 2, 3]], jnp.int32)
    logits = np.asarray(policy(ids))[0, 1]  # predicts token 2 (the action)
    ranked = [int(i) for i in np.argsort(-logits)]
    batch = {"input_ids": ids, "positions": jnp.arange(3)[None], "valid": jnp.ones((1, 3)),
             "action_mask": jnp.array([[0.0, 0.0, 1.0]])}
    for action, allowed, expected in ((ranked[1], ranked[1:3], 1.0),  # best allowed id
                                      (ranked[2], ranked[1:3], 0.0),  # allowed, not best
                                      (ranked[0], [], 1.0)):  # unconstrained: plain argmax
        batch["input_ids"] = ids.at[0, 2].set(action)
        row = np.full((1, 3, 4), -1, np.int32)
        row[0, 2, : len(allowed)] = allowed
        batch["allowed"] = jnp.asarray(row)
        _, metrics = sft_loss(graphdef, params, batch)
        assert float(metrics["sft/token_accuracy"]) == expected, (action, allowed)


def _uneven_copy_task(seed, n):
    """`_copy_task` episodes with 1 to 4 turns each, so rows count different tokens."""
    rng = np.random.default_rng(seed)
    trajs = []
    for traj in _copy_task(seed, n):
        keep = 1 + 3 * int(rng.integers(1, 5))  # the first token and whole turns
        types = list(traj.token_type[:keep])
        trajs.append(Trajectory(list(traj.tokens[:keep]), types, np.zeros(keep), np.zeros(keep),
                                [i for i, t in enumerate(types) if t == ACTION]))
    return trajs


@pytest.mark.parametrize("target", ["actions", "all"])
def test_gradient_accumulation_takes_the_same_steps(target):
    """Micro-batches of 2 rows (the batch of 5 padded to 6) give the parameters, losses and
    accuracies of whole batches: each micro-batch is weighted by its share of the tokens."""
    trajs = _uneven_copy_task(0, n=11)
    results = []
    for accum in (1, 3):
        policy = tiny_policy(vocab_size=16)
        trainer = SFTTrainer(policy, learning_rate=3e-3, batch_size=5, epochs=2,
                             val_fraction=0.0, target=target, length_buckets=(16,),
                             grad_accum=accum)
        history = trainer.fit(trajs)
        results.append((nnx.state(policy), history))
    (whole, whole_history), (accumulated, accumulated_history) = results
    # Adam moves a parameter by up to ~lr = 3e-3 a step; a wrongly weighted micro-batch
    # shows at that scale, float rounding (amplified by Adam on tiny gradients) at ~1e-5.
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(accumulated)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=5e-5)
    for a, b in zip(whole_history, accumulated_history):
        np.testing.assert_allclose(a["train_loss"], b["train_loss"], rtol=1e-5)
    with pytest.raises(ValueError, match="grad_accum"):
        SFTTrainer(tiny_policy(vocab_size=16), learning_rate=1e-3, batch_size=4, epochs=1,
                   val_fraction=0.0, grad_accum=0)
