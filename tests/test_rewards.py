"""Reward shaping against straightforward loops, plus edge cases."""

import math

import numpy as np
import pytest

from jaxrl_agents import rewards as R


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
