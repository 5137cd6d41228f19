"""Reward shaping against straightforward loops, plus edge cases."""

import json
import math

import numpy as np
import pytest

from jaxrl_agents import rewards as R
from jaxrl_agents.data import ACTION, PROMPT, Trajectory, dump
from jaxrl_agents.rollout.episode import EpisodeRecord


def density_loop(rewards, kind, k):
    """Reference: walk the turns, bank reward, pay it out on release turns."""
    if kind == "dense":
        return list(rewards)
    period = len(rewards) if kind == "sparse" else k
    out, bank = [], 0.0
    for t, r in enumerate(rewards):
        bank += r
        if (t + 1) % period == 0 or t == len(rewards) - 1:
            out.append(bank)
            bank = 0.0
        else:
            out.append(0.0)
    return out


@pytest.mark.parametrize("kind", R.DENSITY_KINDS)
@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_density_matches_loop_and_keeps_total(kind, k):
    rng = np.random.default_rng(k)
    for n in [1, 2, 5, 6, 9]:
        rewards = rng.normal(size=n).tolist()
        got = R.density(rewards, kind, k)
        np.testing.assert_allclose(got, density_loop(rewards, kind, k), atol=1e-12)
        assert math.isclose(sum(got), sum(rewards), abs_tol=1e-12)
        assert len(got) == n


def test_density_shapes():
    assert R.density([1.0, 2.0, 3.0], "sparse") == [0.0, 0.0, 6.0]
    assert R.density([1.0, 2.0, 3.0, 4.0, 5.0], "every_k", 2) == [0.0, 3.0, 0.0, 7.0, 5.0]
    assert R.density([1.0, 2.0], "dense") == [1.0, 2.0]


def test_density_edge_cases():
    for kind in R.DENSITY_KINDS:
        assert R.density([], kind, 3) == []
    # k longer than the episode: everything at the end, like sparse.
    assert R.density([1.0, 0.5, 2.0], "every_k", 10) == R.density([1.0, 0.5, 2.0], "sparse")
    with pytest.raises(ValueError, match="finite"):
        R.density([1.0, float("nan")], "sparse")
    with pytest.raises(ValueError, match="unknown"):
        R.density([1.0], "bursty")
    with pytest.raises(ValueError, match="k >= 1"):
        R.density([1.0], "every_k", 0)


def test_running_mean_std_matches_numpy_any_batching():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=101)
    rms = R.RunningMeanStd()
    for chunk in np.array_split(data, [1, 4, 40, 41, 90]):
        rms.update(chunk)
    assert rms.count == data.size
    np.testing.assert_allclose(rms.mean, data.mean(), rtol=1e-12)
    np.testing.assert_allclose(rms.var, data.var(), rtol=1e-12)
    restored = R.RunningMeanStd.from_dict(rms.to_dict())
    assert restored.to_dict() == rms.to_dict()
    rms.update([])  # no-op
    assert rms.count == data.size
    with pytest.raises(ValueError, match="finite"):
        rms.update([1.0, float("inf")])
    with pytest.raises(KeyError, match="count"):
        R.RunningMeanStd.from_dict({"mean": 0.0, "var": 1.0})


def test_scale_rewards_matches_loop():
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(3, 5)) * 4
    rms = R.RunningMeanStd()
    rms.update(rng.normal(0, 3, size=50))
    got = R.scale_rewards(rewards, scale=0.5, clip=1.0, normalizer=rms)
    want = np.empty_like(rewards)
    for i in range(3):
        for j in range(5):
            x = rewards[i, j] * 0.5 / rms.std
            want[i, j] = min(max(x, -1.0), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.dtype == np.float32 and got.shape == (3, 5)
    # No normaliser, no clip: just the scale; empty input stays empty.
    np.testing.assert_allclose(R.scale_rewards(rewards, scale=2.0), rewards * 2, rtol=1e-6)
    assert R.scale_rewards([], scale=2.0).shape == (0,)
    # A normaliser that has seen < 2 values is ignored.
    fresh = R.RunningMeanStd()
    fresh.update([5.0])
    np.testing.assert_allclose(R.scale_rewards([1.0], normalizer=fresh), [1.0])
    with pytest.raises(ValueError, match="finite"):
        R.scale_rewards([0.0, float("nan")])


def test_episode_returns():
    eps = [[1.0, 0.0, 2.0], [], [3.0]]
    got = R.episode_returns(eps, gamma=0.5)
    np.testing.assert_allclose(got, [1.0 + 2.0 * 0.25, 0.0, 3.0])


def test_mix_rewards():
    comps = {"env": 1.0, "tests": 0.5, "style": 0.0}
    assert math.isclose(R.mix_rewards(comps, R.CODE_MIX), 0.6 + 0.15)
    want = sum(R.TEXT_MIX[n] * v for n, v in {"env": 0.5, "progress": 1.0}.items())
    assert math.isclose(R.mix_rewards({"env": 0.5, "progress": 1.0}, R.TEXT_MIX), want)
    for recipe in (R.CODE_MIX, R.TEXT_MIX):
        assert math.isclose(sum(recipe.values()), 1.0)
    with pytest.raises(KeyError, match="'lint'"):
        R.mix_rewards({"env": 1.0, "lint": 1.0}, R.TEXT_MIX)
    with pytest.raises(KeyError, match="progress"):
        R.mix_rewards({"env": 1.0}, R.TEXT_MIX)
    with pytest.raises(ValueError, match="env"):
        R.mix_rewards({"env": float("nan"), "progress": 0.0}, R.TEXT_MIX)


# ----------------------------------------------------------------- per-turn reward recipes


def episode(turn_rewards, turn_info=(), won=False, action_tokens=2, prompt_tokens=3):
    """A trajectory of len(turn_rewards) turns; returns it and its turn-end indices."""
    tokens, types, ends = [], [], []
    for _ in turn_rewards:
        tokens += [5] * prompt_tokens + [6] * action_tokens
        types += [PROMPT] * prompt_tokens + [ACTION] * action_tokens
        ends.append(len(tokens) - 1)
    rewards = np.zeros(len(tokens))
    rewards[ends] = turn_rewards
    traj = Trajectory(tokens=tokens, token_type=types, logprobs=np.zeros(len(tokens)),
                      rewards=rewards, turn_ends=ends, won=won,
                      info={"turn_info": [dict(d) for d in turn_info]})
    return traj, ends


def test_reward_components_by_hand():
    infos = [{"progress": 0.25}, {}, {"progress": 0.0}, {"progress": 0.75},
             {"won": True, "pass_share": 0.5, "style_score": 0.9}]
    got = R.reward_components([0.0, 0.1, 0.0, -0.2, 1.0], infos)
    np.testing.assert_allclose(got["env"], [0.0, 0.1, 0.0, -0.2, 1.0])
    # progress levels 0.25, 0.25 (not reported: kept), 0, 0.75, 1 (won) -> gains:
    np.testing.assert_allclose(got["progress"], [0.25, 0.0, -0.25, 0.75, 0.25])
    np.testing.assert_allclose(got["tests"], [0, 0, 0, 0, 0.5])
    np.testing.assert_allclose(got["style"], [0, 0, 0, 0, 0.9])
    # Fewer infos than turns: the missing turns report nothing.
    short = R.reward_components([1.0, 2.0], [{"progress": 0.5}])
    np.testing.assert_allclose(short["progress"], [0.5, 0.0])
    assert R.reward_components([], [])["env"].shape == (0,)
    with pytest.raises(ValueError, match="progress"):
        R.reward_components([0.0], [{"progress": float("nan")}])


def test_code_mix_per_turn_by_hand():
    # view, edit, submit: the submit turn carries the pass share and the style score.
    traj, ends = episode([0.0, 0.0, 0.8], [{}, {}, {"pass_share": 0.8, "style_score": 0.5}])
    recipe = R.RewardRecipe({"verified": 1.0}, R.CODE_MIX)
    R.apply_recipe([traj], recipe)
    want = np.zeros(len(traj))
    want[ends[2]] = 0.6 * 0.8 + 0.3 * 0.8 + 0.1 * 0.5
    np.testing.assert_allclose(traj.rewards, want, rtol=1e-6)


def test_text_mix_per_turn_by_hand():
    infos = [{"progress": 0.5}, {"progress": 0.25}, {"progress": 1.0, "won": True}]
    traj, ends = episode([0.0, 0.0, 1.0], infos, won=True)
    metrics = R.apply_recipe([traj], R.RewardRecipe({"verified": 1.0}, R.TEXT_MIX))
    want = [0.8 * 0.0 + 0.2 * 0.5, 0.8 * 0.0 + 0.2 * -0.25, 0.8 * 1.0 + 0.2 * 0.75]
    np.testing.assert_allclose(traj.rewards[ends], want, rtol=1e-6)
    assert traj.rewards.sum() == pytest.approx(0.8 + 0.2)  # progress gains sum to 1
    assert metrics["reward/verified"] == pytest.approx(1.0)
    assert metrics["reward/progress"] == pytest.approx(1.0)
    others = np.delete(traj.rewards, ends)
    assert not others.any()


def test_binary_and_weighted_sources():
    np.testing.assert_allclose(R.binary_rewards(3, True), [0, 0, 1])
    np.testing.assert_allclose(R.binary_rewards(2, False), [0, 0])
    assert R.binary_rewards(0, True).shape == (0,)
    # A won episode whose env paid dense rewards: binary keeps only the win at the end.
    traj, ends = episode([0.25, 0.25, 0.5], won=True)
    R.apply_recipe([traj], R.RewardRecipe({"binary": 1.0}))
    np.testing.assert_allclose(traj.rewards[ends], [0, 0, 1])
    lost, ends = episode([0.25, 0.5], won=False)
    R.apply_recipe([lost], R.RewardRecipe({"binary": 1.0}))
    assert not lost.rewards.any()
    # weighted: 0.5 verified + 0.2 binary + 0.3 learned, per turn.
    traj, ends = episode([0.25, 0.25, 0.5], won=True)
    learned = np.array([0.1, 0.2, 0.3])
    R.apply_recipe([traj], R.RewardRecipe({"verified": 0.5, "binary": 0.2, "learned": 0.3}),
                   [learned])
    want = 0.5 * np.array([0.25, 0.25, 0.5]) + 0.2 * np.array([0, 0, 1]) + 0.3 * learned
    np.testing.assert_allclose(traj.rewards[ends], want, rtol=1e-6)


def test_recipe_from_config_and_errors():
    from configs.base import get_config
    from jaxrl_agents.config import apply_override

    cfg = get_config()
    assert R.RewardRecipe.from_config(cfg.reward) == R.RewardRecipe({"verified": 1.0}, None)
    apply_override(cfg, "reward.source=weighted")
    apply_override(cfg, "reward.mix=code")
    recipe = R.RewardRecipe.from_config(cfg.reward)
    assert recipe.source_weights == {"verified": 0.5, "learned": 0.5}  # binary: weight 0
    assert recipe.mix == R.CODE_MIX and recipe.uses_learned
    apply_override(cfg, "reward.source=binary")
    assert not R.RewardRecipe.from_config(cfg.reward).uses_learned
    traj, _ = episode([1.0])
    with pytest.raises(ValueError, match="learned"):
        R.apply_recipe([traj], R.RewardRecipe({"learned": 1.0}))
    with pytest.raises(ValueError, match="no reward model"):
        R.shape_collected([traj], R.RewardRecipe({"learned": 1.0}))
    with pytest.raises(KeyError, match="oracle"):
        R.source_rewards({"verified": np.ones(1)}, {"oracle": 1.0})
    with pytest.raises(KeyError, match="lint"):
        R.mixed_turn_rewards(R.reward_components([1.0], [{}]), {"env": 0.5, "lint": 0.5})
    with pytest.raises(ValueError, match="2 turn rewards for 1 turns"):
        R.put_turn_rewards(traj, [1.0, 2.0])


def test_disagreement_by_hand():
    scores = [0.9, 0.2, 0.6, 0.4, 0.5]
    won = [True, True, False, False, True]
    # (s > 0.5) = T, F, T, F, F vs won T, T, F, F, T -> disagree on 2nd, 3rd and 5th.
    assert R.disagreement(scores, won) == pytest.approx(3 / 5)
    assert math.isnan(R.disagreement([], []))
    trajs = [episode([0.0, 1.0], won=w)[0] for w in won]
    learned = [np.array([s / 2, s / 2]) for s in scores]  # per-turn rewards sum to the score
    metrics = R.apply_recipe(trajs, R.RewardRecipe({"learned": 1.0}), learned)
    assert metrics["reward/disagreement"] == pytest.approx(3 / 5)
    assert metrics["reward/learned"] == pytest.approx(np.mean(scores))


def test_dump_round_trip(tmp_path):
    path = str(tmp_path / "run" / "trajectories.jsonl")
    a, _ = episode([0.0, 0.7], [{}, {"pass_share": 0.7, "style_score": 1.0}], won=False)
    b, _ = episode([1.0], [{"won": True, "progress": 1.0}], won=True)
    recipe = R.RewardRecipe({"verified": 1.0})
    R.shape_collected([a], recipe, dump_path=path, update=0)
    R.shape_collected([b], recipe, dump_path=path, update=1)
    back = dump.read_jsonl(path)
    assert len(back) == 2
    for orig, copy in zip([a, b], back):
        np.testing.assert_array_equal(copy.tokens, orig.tokens)
        np.testing.assert_array_equal(copy.token_type, orig.token_type)
        np.testing.assert_allclose(copy.rewards, orig.rewards)
        assert copy.turn_ends == orig.turn_ends and copy.won == orig.won
        assert copy.info["turn_info"] == orig.info["turn_info"]
    np.testing.assert_allclose(dump.labels(back, "won"), [0.0, 1.0])
    np.testing.assert_allclose(dump.labels(back, "pass_share"), [0.7, 1.0])  # b: won
    with open(path) as f:
        assert [json.loads(line)["update"] for line in f] == [0, 1]


def test_episode_summary_reads_as_the_game_went(tmp_path):
    """eval_episodes/<stage>.jsonl lines: each turn's action, reward, offered count and
    whether it repeated an earlier action or was refused; no tokens."""
    record = EpisodeRecord()
    for action, reward, offered, invalid in (("go east", 0.0, 3, False),
                                             ("go west", 0.0, 3, False),
                                             ("go east", 0.5, 2, False),
                                             ("dance", 0.0, 2, True)):
        record.admissible.append([f"c{i}" for i in range(offered)])
        record.add_prompt([1, 2])
        record.add_action([3, 4], action)
        record.add_reward(reward, {"invalid": invalid})
    traj = record.to_trajectory(won=False, truncated=True, task_id="game-7",
                                info={"end_reason": "step_budget"})
    got = dump.episode_summary(traj)
    assert got == {
        "task_id": "game-7", "won": False, "return": 0.5, "steps": 4,
        "end_reason": "step_budget", "truncated": True, "failed": False,
        "actions": ["go east", "go west", "go east", "dance"],
        "turn_rewards": [0.0, 0.0, 0.5, 0.0], "offered": [3, 3, 2, 2],
        "repeated": [False, False, True, False], "invalid": [False, False, False, True],
    }
    path = str(tmp_path / "eval_episodes" / "rl.jsonl")
    dump.write_summaries(path, [traj, traj], stage="rl", step=None)
    dump.write_summaries(path, [traj], stage="rl", step=None)  # replaces, not appends
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    assert lines == [{**got, "stage": "rl", "step": None}]


def test_episode_record_keeps_reward_infos_per_turn():
    record = EpisodeRecord()
    record.add_prompt([1, 2])
    record.add_action([3], "look")
    record.add_reward(0.0, {"progress": 0.5, "admissible_commands": ["look"], "won": False})
    record.add_prompt([4])
    record.add_action([5, 6], "submit")
    record.add_reward(1.0, {"pass_share": 1.0, "style_score": 0.8, "tests": {"t": True}})
    traj = record.to_trajectory(won=True)
    assert traj.info["turn_info"] == [{"progress": 0.5, "won": False},
                                     {"pass_share": 1.0, "style_score": 0.8}]
