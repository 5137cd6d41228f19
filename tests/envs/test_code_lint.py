"""Style scores of patches from a real ruff run, and the code env's reward components."""

import pytest

import envs
from envs.code_lint import STRICTNESS, changed_python_files, lint_patch, style_score
from envs.sandbox import Sandbox
from jaxrl_agents import rewards as R
from jaxrl_agents.rollout.episode import EpisodeRecord

# A fix of off_by_one seed 0 (cart.py line 29) with the same behaviour, badly styled:
# two statements on a line (E702), an unused import (F401), trailing blanks (W291).
GOLD_LINE = "    start = (number - 1) * size"
UGLY_LINE = "    import os; start = (number-1)*size   "


def play(edit_line):
    env = envs.make({"family": "code", "task_family": "off_by_one", "seed": 0})
    gold = env.task.gold_actions
    assert gold[0] == f"edit cart.py 29-29\n{GOLD_LINE}" and gold[1] == "submit"
    record = EpisodeRecord()
    env.reset()
    results = []
    for action in (f"edit cart.py 29-29\n{edit_line}", "submit"):
        record.add_action([1], action)
        results.append(env.step(action))
        record.add_reward(results[-1].reward, results[-1].info)
    env.close()
    return results[-1], record.to_trajectory(won=results[-1].won)


def test_gold_patch_gets_test_and_style_components():
    result, traj = play(GOLD_LINE)
    info = result.info
    assert result.won and info["pass_share"] == 1.0
    assert info["style_score"] == 1.0 and info["lint_violations"] == 0
    assert info["lint_files"] == ["cart.py"] and info["lint_lines"] > 20
    # The components reach the trajectory and the CODE_MIX reward of the submit turn.
    assert traj.info["turn_info"] == [{}, {"pass_share": 1.0, "style_score": 1.0,
                                           "tampered": False}]
    R.apply_recipe([traj], R.RewardRecipe({"verified": 1.0}, R.CODE_MIX))
    assert R.turn_rewards(traj).tolist() == pytest.approx([0.0, 1.0])


def test_badly_styled_patch_scores_lower_with_the_same_tests():
    good, _ = play(GOLD_LINE)
    ugly, traj = play(UGLY_LINE)
    assert ugly.won and ugly.info["pass_share"] == 1.0  # the behaviour is right ...
    assert ugly.info["lint_violations"] == 3  # ... the style is not (E702, F401, W291)
    lines = ugly.info["lint_lines"]
    assert ugly.info["style_score"] == pytest.approx(1 - STRICTNESS * 3 / lines)
    assert 0 < ugly.info["style_score"] < good.info["style_score"]
    R.apply_recipe([traj], R.RewardRecipe({"verified": 1.0}, R.CODE_MIX))
    assert R.turn_rewards(traj)[-1] == pytest.approx(0.6 + 0.3 + 0.1 * ugly.info["style_score"])


def test_lint_counts_only_new_violations_of_changed_python_files():
    before = {"a.py": "import os\n\nx = 1\n", "b.py": "y = 2\n", "notes.md": "hi  \n"}
    after = {"a.py": "import os\n\nx = 1\nz = 3 \n", "b.py": "y = 2\n", "notes.md": "x\n"}
    assert changed_python_files(before, after) == ["a.py"]
    with Sandbox() as sandbox:
        got = lint_patch(before, after, sandbox)
        # a.py had one violation (F401) and now has two (F401, W291): one is new.
        assert got["lint_violations"] == 1 and got["lint_lines"] == 3
        assert got["style_score"] == pytest.approx(style_score(1, 3)) == 0.0
        assert lint_patch(before, before, sandbox)["style_score"] == 1.0
        fixed = lint_patch(before, {**before, "a.py": "x = 1\n"}, sandbox)
        assert fixed["style_score"] == 1.0 and fixed["lint_violations"] == 0
    assert style_score(0, 0) == 1.0 and style_score(1, 20) == pytest.approx(0.75)


def test_lint_can_be_switched_off():
    env = envs.make({"family": "code", "task_family": "off_by_one", "seed": 0, "lint": False})
    env.reset()
    info = env.step("submit").info
    env.close()
    assert "pass_share" in info and "style_score" not in info
    with pytest.raises(envs.SpecError, match="lint"):
        envs.make({"family": "code", "task_family": "off_by_one", "seed": 0, "lint": "yes"})
