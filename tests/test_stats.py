"""Statistics of held-out success: Wilson and clustered intervals of one run, arms from
run names, t intervals and paired differences over seeds, McNemar's exact test of two
evaluations game by game (the sweep report's table over seeds is tests/sweep/)."""

import math

import numpy as np
import pytest

from jaxrl_agents import stats


def test_success_ci_wilson_known_values():
    got = stats.success_ci([1] * 8 + [0] * 2)
    assert got["n"] == 10 and got["mean"] == 0.8
    assert got["ci_low"] == pytest.approx(0.4902, abs=1e-4)
    assert got["ci_high"] == pytest.approx(0.9433, abs=1e-4)
    # Formula check against a direct evaluation for many (k, n).
    z = 1.959963984540054
    for n in (1, 7, 100):
        for k in (0, n // 3, n):
            p = k / n
            c = (p + z * z / (2 * n)) / (1 + z * z / n)
            h = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
            r = stats.success_ci([True] * k + [False] * (n - k))
            assert r["ci_low"] == pytest.approx(max(0.0, c - h), abs=1e-12)
            assert r["ci_high"] == pytest.approx(min(1.0, c + h), abs=1e-12)
            assert r["ci_low"] <= r["mean"] <= r["ci_high"]
    assert stats.success_ci([]) == {"mean": None, "n": 0, "ci_low": 0.0, "ci_high": 1.0}
    with pytest.raises(ValueError):
        stats.success_ci([0.5])


def test_clustered_success_ci_is_an_interval_over_games():
    rng = np.random.default_rng(0)
    games = np.repeat(np.arange(40), 3)  # 40 games, 3 episodes each, shuffled below
    won = rng.random(120) < np.repeat(rng.random(40), 3)
    order = rng.permutation(120)
    got = stats.clustered_success_ci(won[order], games[order])
    rates = won.reshape(40, 3).mean(axis=1)
    half = 1.959963984540054 * rates.std(ddof=1) / math.sqrt(40)
    assert got["mean"] == pytest.approx(won.mean())
    assert got["ci_low"] == pytest.approx(max(0.0, rates.mean() - half))
    assert got["ci_high"] == pytest.approx(min(1.0, rates.mean() + half))
    assert (got["n"], got["games"], got["samples_per_game"]) == (120, 40, 3)
    # One episode per game: exactly the Wilson interval of success_ci.
    once = [True, False, True, True, False]
    assert stats.clustered_success_ci(once, "abcde") == stats.success_ci(once)
    with pytest.raises(ValueError, match="unequal"):
        stats.clustered_success_ci([True, False, True], ["a", "a", "b"])
    with pytest.raises(ValueError, match="labels"):
        stats.clustered_success_ci([True, False], ["a"])


@pytest.mark.parametrize(
    "name, want",
    [
        ("direct,seed=2", ("direct", 2)),
        ("env.reward_density=dense,seed=10", ("env.reward_density=dense", 10)),
        ("seed=1,rl.learning_rate=1e-4", ("rl.learning_rate=1e-4", 1)),
        ("a,seed=3,b", ("a,b", 3)),
        ("seed=1", ("all", 1)),
        ("myseed=1", ("myseed=1", None)),
        ("direct", ("direct", None)),
    ],
)
def test_split_seed(name, want):
    assert stats.split_seed(name) == want


def test_t_interval_matches_a_hand_computed_one():
    rng = np.random.default_rng(0)
    for k in (2, 3, 5):
        x = rng.uniform(0.3, 0.7, size=k)
        # Student t quantiles at 0.975 for 1, 2 and 4 degrees of freedom.
        t = {2: 12.706204736, 3: 4.302652730, 5: 2.776445105}[k]
        half = t * x.std(ddof=1) / np.sqrt(k)
        got = stats.t_interval(x, bounds=(-10, 10))
        assert got["seeds"] == k
        np.testing.assert_allclose([got["mean"], got["ci_low"], got["ci_high"]],
                                   [x.mean(), x.mean() - half, x.mean() + half], rtol=1e-8)
    clipped = stats.t_interval([0.0, 0.9])
    assert clipped["ci_low"] == 0.0 and clipped["ci_high"] == 1.0
    assert stats.t_interval([0.4]) == {"mean": 0.4, "seeds": 1, "ci_low": None,
                                       "ci_high": None}
    with pytest.raises(ValueError):
        stats.t_interval([])


def test_arms_and_paired_differences():
    arms = stats.by_arm({"a,seed=0": 0.5, "b,seed=0": 0.7, "a,seed=1": 0.4,
                         "b,seed=1": 0.5, "b,seed=2": 0.9})  # fmt: skip
    assert arms == {"a": {0: 0.5, 1: 0.4}, "b": {0: 0.7, 1: 0.5, 2: 0.9}}
    diff = stats.paired_difference(arms["b"], arms["a"])
    assert diff["seeds"] == 2 and diff["per_seed"] == pytest.approx({0: 0.2, 1: 0.1})
    assert diff["mean"] == pytest.approx(0.15)
    # differences 0.2 and 0.1: standard error 0.05, t(1 df) 12.706
    assert diff["ci_low"] == pytest.approx(0.15 - 12.706204736 * 0.05)
    assert diff["ci_high"] == pytest.approx(0.15 + 12.706204736 * 0.05)
    assert stats.paired_difference({0: 0.1}, {1: 0.2}) is None
    with pytest.raises(ValueError, match="seed 0"):
        stats.by_arm({"a,seed=0": 0.1, "seed=0,a": 0.2})


@pytest.mark.parametrize("only_a,only_b", [(0, 0), (3, 0), (9, 4), (4, 9), (2, 15), (30, 31)])
def test_mcnemar_exact_is_scipys_two_sided_binomial_test_at_one_half(only_a, only_b):
    from scipy import stats as scipy_stats

    from jaxrl_agents.stats import mcnemar_exact

    expected = 1.0 if only_a + only_b == 0 else scipy_stats.binomtest(
        only_a, only_a + only_b, 0.5).pvalue
    assert mcnemar_exact(only_a, only_b) == pytest.approx(expected, rel=1e-12)


def test_paired_games_counts_the_games_each_stage_alone_won():
    from jaxrl_agents.stats import format_paired_games, paired_games

    # 10 games both played (g9, g10 are one-sided and left out): 2 won by both, 1 only
    # before, 5 only after
    before = {f"g{i}": float(i in (0, 1, 2)) for i in range(10)} | {"g10": 1.0}
    after = {f"g{i}": float(i in (0, 1, 3, 4, 5, 6, 7)) for i in range(10)} | {"g11": 0.0}
    pair = paired_games(before, after)
    assert pair["games"] == 10 and pair["only_a"] == 1 and pair["only_b"] == 5
    assert pair["difference"] == pytest.approx(0.4)
    assert pair["p"] == pytest.approx(0.21875)  # 2 * P(Bin(6, 1/2) <= 1) = 2 * 7/64
    line = format_paired_games(pair, "sft", "rl")
    assert "rl - sft on the same 10 games: +0.400" in line and "p = 0.219" in line
    assert paired_games({"a": 1.0}, {"b": 1.0}) is None
    rates = paired_games({"a": 0.5, "b": 0.25, "c": 0.0}, {"a": 0.75, "b": 0.5, "c": 0.5})
    assert rates["p"] is None and rates["ci_low"] is not None
    assert rates["difference"] == pytest.approx(1.0 / 3.0)


def test_run_summary_and_jaxrl_eval_compare_stages_game_by_game(tmp_path, capsys):
    import json
    import types

    from jaxrl_agents.cli import _print_comparison
    from jaxrl_agents.trainer.summary import format_summary

    sft = {"mean": 0.25, "ci_low": 0.1, "ci_high": 0.5, "n": 4,
           "per_game": {"0": 1.0, "1": 0.0, "2": 0.0, "3": 0.0}}
    rl = {**sft, "mean": 0.75, "per_game": {"0": 1.0, "1": 1.0, "2": 1.0, "3": 0.0}}
    text = format_summary({"sft": sft, "rl": rl, "run_dir": "r"})
    assert "rl - sft on the same 4 games: +0.500 (won only rl: 2, only sft: 0; McNemar p = 0.5)" \
        in text
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval.json").write_text(json.dumps({"sft": sft}))
    cfg = types.SimpleNamespace(output_dir=str(tmp_path), name="run")
    assert _print_comparison(cfg, types.SimpleNamespace(compare="sft"), rl) == 0
    assert "this evaluation - sft on the same 4 games: +0.500" in capsys.readouterr().out
    assert _print_comparison(cfg, types.SimpleNamespace(compare="base"), rl) == 2
    assert "no such stage" in capsys.readouterr().err


def test_jaxrl_eval_pair_compares_stages_of_two_runs_without_jax(tmp_path):
    """`jaxrl-eval --pair A:stage B:stage`: two runs' recorded stages on the games both
    played (each with its interval, then B - A and McNemar's test), in a process that
    imports no JAX; a missing stage or file is named, exit status 2."""
    import json
    import subprocess
    import sys

    games = {f"tw-eval-{k}": float(k < 6) for k in range(10)}  # A wins games 0-5
    later = {**games, "tw-eval-6": 1.0, "tw-eval-7": 1.0, "tw-eval-0": 0.0, "only-b": 1.0}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "eval.json").write_text(json.dumps(
        {"sft": {"mean": 0.6, "ci_low": 0.31, "ci_high": 0.83, "n": 10, "per_game": games}}))
    (tmp_path / "b.json").write_text(json.dumps({"rl": {"per_game": later}}))

    def run(*refs):
        code = ("import sys; from jaxrl_agents.cli import eval_main; "
                f"rc = eval_main(['--pair', *{list(refs)!r}]); "
                "print('jax' in sys.modules); sys.exit(rc)")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=tmp_path)

    done = run("a:sft", "b.json:rl")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "a:sft: 0.600 (95% CI 0.310-0.830, 10 games)"
    assert lines[1] == "b.json:rl: 0.727 (95% CI 0.434-0.903, 11 games)"  # Wilson, 8 of 11
    assert lines[2] == ("b.json:rl - a:sft on the same 10 games: +0.100 (won only b.json:rl: 2, "
                        "only a:sft: 1; McNemar p = 1)")
    assert lines[3] == "False"  # no JAX imported
    missing = run("a:rl", "b.json:rl")
    assert missing.returncode == 2 and "has no stage 'rl'; its stages: ['sft']" in missing.stderr
    assert "no such file" in run("nowhere:sft", "a:sft").stderr
    assert "is not RUN_DIR:STAGE" in run("a", "b.json:rl").stderr
