"""The learned reward model: it learns a token-level property, saves and loads exactly,
scores turn ends, and its disagreement with the verified outcome is measured right."""

import numpy as np
import pytest
from flax import nnx

from jaxrl_agents import reward_model as RM
from jaxrl_agents import rewards as R
from jaxrl_agents.data import ACTION, PROMPT, Trajectory
from jaxrl_agents.models import ModelConfig

MARK = 3  # an episode is "won" when one of its actions holds this token
CONFIG = ModelConfig(
    vocab_size=32,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
)
SIZES = {"batch_size": 32, "length_buckets": (32,)}


def synthetic(n, seed):
    """Toy episodes: a 4-token prompt, then 2-3 turns of 3 observation and 2 action tokens
    (ids 8..31); in half of them one action token is MARK, and those are won."""
    rng = np.random.default_rng(seed)
    trajs = []
    for _ in range(n):
        tokens, types, ends = list(rng.integers(8, 32, 4)), [PROMPT] * 4, []
        won = bool(rng.random() < 0.5)
        turns = int(rng.integers(2, 4))
        marked = int(rng.integers(turns))
        for k in range(turns):
            action = list(rng.integers(8, 32, 2))
            if won and k == marked:
                action[int(rng.integers(2))] = MARK
            tokens += list(rng.integers(8, 32, 3)) + action
            types += [PROMPT] * 3 + [ACTION] * 2
            ends.append(len(tokens) - 1)
        n_tok = len(tokens)
        trajs.append(
            Trajectory(
                tokens=tokens,
                token_type=types,
                logprobs=np.zeros(n_tok),
                rewards=np.zeros(n_tok),
                turn_ends=ends,
                won=won,
            )
        )
    return trajs


@pytest.fixture(scope="module")
def trained():
    trajs = synthetic(320, seed=0)
    model = RM.RewardModel.create(CONFIG, "episode", seed=0, **SIZES)
    history = model.fit(
        trajs, RM.labels(trajs, "won"), epochs=8, learning_rate=1e-2, val_fraction=0.25, seed=0
    )
    return model, history


def test_learns_a_token_level_property(trained):
    model, history = trained
    assert history[0]["num_val"] == 80 and history[0]["num_train"] == 240
    assert history[-1]["val_accuracy"] >= 0.9
    assert history[-1]["val_loss"] < 0.5 * history[0]["val_loss"]
    fresh = synthetic(100, seed=1)  # never seen
    scores = model.episode_scores(fresh)
    assert np.mean((scores > 0.5) == np.array([t.won for t in fresh])) >= 0.9


def test_save_load_round_trip(trained, tmp_path):
    model, history = trained
    path = str(tmp_path / "rm")
    model.save(path)
    back = RM.RewardModel.load(path, **SIZES)
    assert back.mode == "episode" and back.config == CONFIG
    assert back.meta["history"] == history
    trajs = synthetic(40, seed=2)
    np.testing.assert_array_equal(back.episode_scores(trajs), model.episode_scores(trajs))
    with pytest.raises(FileExistsError):
        model.save(path)
    with pytest.raises(FileNotFoundError):
        RM.RewardModel.load(str(tmp_path / "nothing"))


def test_turn_scores_sit_at_turn_ends(trained):
    model, _ = trained
    per_turn = RM.RewardModel(model.critic, CONFIG, "turn", **SIZES)
    trajs = synthetic(5, seed=3)
    scores = per_turn.turn_scores(trajs)
    rewards = per_turn.turn_rewards(trajs)
    for traj, s, r in zip(trajs, scores, rewards):
        # One unpadded forward pass of the same network, read at the turn ends.
        logits = np.asarray(model.critic(traj.tokens[None]))[0]
        np.testing.assert_allclose(s, 1 / (1 + np.exp(-logits[traj.turn_ends])), rtol=1e-5)
        assert s.shape == (traj.num_turns,) and len(set(np.round(s, 6))) > 1
        np.testing.assert_allclose(r, np.diff(s, prepend=0.0))  # differences ...
        assert r.sum() == pytest.approx(s[-1])  # ... that sum to the final score
    # Episode mode: the final score on the last turn only.
    for traj, r in zip(trajs, model.turn_rewards(trajs)):
        assert r[:-1].tolist() == [0.0] * (traj.num_turns - 1)
    np.testing.assert_allclose(
        [r[-1] for r in model.turn_rewards(trajs)], model.episode_scores(trajs)
    )


def test_disagreement_with_the_verified_outcome(trained):
    model, _ = trained
    trajs = synthetic(30, seed=4)
    scores = model.episode_scores(trajs)
    before = (scores > 0.5) != np.array([t.won for t in trajs])
    assert before.mean() <= 0.1  # the model is right on almost all
    for t in trajs[:6]:  # flip some verified outcomes
        t.won = not t.won
    metrics = R.shape_collected(trajs, R.RewardRecipe({"learned": 1.0}), reward_model=model)
    after = (scores > 0.5) != np.array([t.won for t in trajs])
    assert metrics["reward/disagreement"] == pytest.approx(after.mean())
    np.testing.assert_array_equal(after[:6], ~before[:6])
    np.testing.assert_array_equal(after[6:], before[6:])
    # The learned source put each episode's score on its last turn.
    np.testing.assert_allclose([t.episode_return for t in trajs], scores, rtol=1e-5)


def test_from_config_and_bad_inputs(trained, tmp_path):
    from configs.base import get_config

    cfg = get_config()
    assert RM.from_config(cfg.reward, R.RewardRecipe.from_config(cfg.reward)) is None
    with cfg.unlocked():
        cfg.reward.source = "learned"
    with pytest.raises(ValueError, match="model_path"):
        RM.from_config(cfg.reward, R.RewardRecipe.from_config(cfg.reward))
    model, _ = trained
    trajs = synthetic(4, seed=5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        model.fit(trajs, [0.0, 1.0, 2.0, 0.0], epochs=1)
    big = Trajectory(
        tokens=[40, 41],
        token_type=[PROMPT, ACTION],
        logprobs=np.zeros(2),
        rewards=np.zeros(2),
        turn_ends=[1],
    )
    with pytest.raises(ValueError, match="vocabulary"):
        model.turn_scores([big])
    assert isinstance(model.critic, nnx.Module)
