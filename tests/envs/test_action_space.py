"""Staged verbs and compound actions (envs.action_space) on the toy env and a real TextWorld
game, through envs.make, an EnvPool and the episode driver."""

import pytest

import envs
from envs import action_space
from envs.action_space import ActionStaging, split_compound, verb_of

COUNT = {"family": "toy", "task": "count", "n": 3, "seed": 1, "reward_density": "dense"}


def test_verbs_and_compound_parsing():
    assert verb_of("  Take the Apple. ") == "take"
    assert verb_of("") == verb_of("...") == ""
    assert split_compound("open box ; take key;; go east", 2) == ["open box", "take key"]
    assert split_compound(" ; ", 3) == [" ; "]  # nothing to split: the env answers it


def test_toy_allowed_verbs_filter_offers_and_block_the_rest():
    plain = envs.make(COUNT)
    start = plain.task.info["start"]
    allowed = [str(start), str(start + 2)]
    env = envs.make({**COUNT, "allowed_verbs": allowed, "invalid_penalty": 0.5})
    first = env.reset()
    assert first.info["admissible_commands"] == allowed
    assert set(plain.reset().info["admissible_commands"]) > set(allowed)
    right = env.step(str(start))
    assert right.reward == pytest.approx(1 / 3) and not right.info["invalid"]
    blocked = env.step(str(start + 1))  # the right answer, but its "verb" is not allowed
    assert blocked.info["invalid"] and blocked.info["blocked_verb"] == str(start + 1)
    assert blocked.reward == -0.5  # the env's own invalid-action penalty
    assert blocked.info["steps"] == 2  # the step counted
    assert f"[Feedback] The verb '{start + 1}' is not available yet." in blocked.observation
    assert f"last number: {start}" in blocked.observation  # the game did not move
    assert "[Feedback]" in blocked.observation and not blocked.done


def test_toy_compound_actions_run_in_one_turn_with_summed_reward():
    env = envs.make({**COUNT, "compound_actions": 2})
    start = env.task.info["start"]
    env.reset()
    both = env.step(f"{start} ; {start + 1} ; {start + 2}")  # the third part is dropped
    assert both.info["compound_parts"] == 2 and both.info["steps"] == 2
    assert both.reward == pytest.approx(2 / 3) and not both.done
    last = env.step(f"{start + 2} ; {start + 3}")  # the episode ends after the first part
    assert last.won and last.done and last.info["compound_parts"] == 1
    assert last.reward == pytest.approx(1 / 3)


def test_staging_grows_by_at_most_growth_and_then_lifts():
    staging = ActionStaging(initial_verbs=action_space.KNOWN_VERBS[:10], growth=0.2)
    sizes = [len(staging.allowed_verbs)]
    while staging.allowed_verbs is not None:
        assert staging.advance()
        if staging.allowed_verbs is not None:
            sizes.append(len(staging.allowed_verbs))
    assert sizes[:4] == [10, 12, 14, 16]
    assert all(b - a <= max(1, int(0.2 * a)) for a, b in zip(sizes, sizes[1:]))
    assert sizes[-1] == len(action_space.KNOWN_VERBS)
    assert not staging.advance() and staging.apply({"family": "toy", "allowed_verbs": ["x"]}) == {
        "family": "toy"
    }
    small = ActionStaging(initial_verbs=["go", "take"], growth=0.2)
    small.advance()  # floor(0.4) = 0 -> one verb, so a stage always adds something
    assert small.allowed_verbs == ["go", "take", "open"]
    again = ActionStaging(initial_verbs=["go"])
    again.load_state_dict(small.state_dict())
    assert again.stage == 1 and again.apply({"a": 1}) == {"a": 1, "allowed_verbs": small.allowed}
    with pytest.raises(ValueError, match="growth"):
        ActionStaging(initial_verbs=["go"], growth=0.0)


def test_staging_from_config():
    from configs.base import get_config

    staging = ActionStaging.from_config(get_config().action_space)
    assert 10 <= len(staging.allowed_verbs) <= 20 and staging.growth == 0.2


def test_pool_and_driver_record_the_staged_offers(tmp_path):
    from flax import nnx

    from jaxrl_agents.models import ModelConfig, Transformer
    from jaxrl_agents.models.tokenizer import train_tokenizer
    from jaxrl_agents.rollout import EpisodeDriver

    start = envs.make(COUNT).task.info["start"]
    allowed = [str(start), str(start + 1), str(start + 2)]
    tok = train_tokenizer(["[Room] Counter [Feedback] 12 34 56 78 90"] * 20, 280, str(tmp_path))
    cfg = ModelConfig(vocab_size=len(tok) + 4, hidden_size=16, intermediate_size=32,
                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)  # fmt: skip
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    with envs.EnvPool([{**COUNT, "allowed_verbs": allowed}], num_workers=1) as pool:
        driver = EpisodeDriver(model, tok, pool, max_action_tokens=4)
        (traj,) = driver.run(
            [0], forced_actions=[[str(start), "99", str(start + 1), str(start + 2)]]
        )
    assert traj.won and traj.info["actions"][1] == "99"
    offers = traj.info["admissible"]
    assert len(offers) == 4 and all(set(o) <= set(allowed) for o in offers)
    assert offers[0] == allowed


# ----------------------------------------------------------------------------- TextWorld


@pytest.fixture(scope="module")
def tw_spec(tmp_path_factory):
    pytest.importorskip("textworld")
    from envs import textworld_env

    cache = str(tmp_path_factory.mktemp("tw_staging"))
    spec = {"rooms": 1, "objects": 3, "quest_length": 3, "seed": 2}
    textworld_env.generate_games([spec], cache_dir=cache)
    return {"family": "textworld", "cache_dir": cache, **spec}


def test_textworld_staged_verbs(tw_spec):
    plain = envs.make(tw_spec)
    gold = plain.task.gold_actions
    offered = plain.reset().info["admissible_commands"]
    allowed = sorted({verb_of(a) for a in gold} | {"look"})
    env = envs.make({**tw_spec, "allowed_verbs": allowed, "invalid_penalty": 0.1})
    first = env.reset()
    assert all(verb_of(c) in allowed for c in first.info["admissible_commands"])
    assert set(first.info["admissible_commands"]) <= set(offered)
    blocked = env.step("inventory")  # a real command of the game, with a verb not allowed
    assert "inventory" in offered and "inventory" not in allowed
    assert blocked.info["invalid"] and blocked.reward == pytest.approx(-0.1)
    assert "[Feedback] The verb 'inventory' is not available yet." in blocked.observation
    assert not blocked.done
    results = [env.step(a) for a in gold]  # the walkthrough's verbs are allowed: it wins
    assert results[-1].won and results[-1].reward == pytest.approx(1.0)
    for garbage in ("", "xyzzy plugh", "quit", "take ; ; ;"):
        env.reset()
        assert not env.step(garbage).done  # answered, never raises
    env.close()
    plain.close()


def test_textworld_compound_gold_in_one_turn(tw_spec):
    env = envs.make({**tw_spec, "compound_actions": 8})
    env.reset()
    gold = env.task.gold_actions
    result = env.step(" ; ".join(gold))
    assert result.won and result.done and result.reward == pytest.approx(1.0)
    assert result.info["compound_parts"] == len(gold)
    env.close()


@pytest.mark.skipif(
    "compact" not in getattr(envs.base, "TEXT_OBS_FORMATS", ()), reason="no [Actions] line"
)
def test_textworld_actions_line_is_filtered(tw_spec):
    env = envs.make({**tw_spec, "obs_format": "compact", "allowed_verbs": ["go", "take"]})
    first = env.reset()
    (line,) = [ln for ln in first.observation.splitlines() if ln.startswith("[Actions]")]
    shown = [c for c in line[len("[Actions] ") :].split(" | ") if c]
    assert shown == first.info["admissible_commands"]
    assert all(verb_of(c) in ("go", "take") for c in shown)
    env.close()


def test_staging_advances_only_after_a_period_above_the_threshold():
    staging = ActionStaging(initial_verbs=["go", "take"], growth=0.5)
    staging.record(3, 4)
    assert not staging.decide(0.75)  # 0.75 is not above 0.75
    assert staging.stage == 0 and (staging.wins, staging.episodes) == (0, 0)
    assert not staging.decide(0.0)  # a period without episodes never advances
    staging.record(2, 4)
    staging.record(4, 4)  # 6 of 8 over the period
    restored = ActionStaging(initial_verbs=["go", "take"], growth=0.5)
    restored.load_state_dict(staging.state_dict())  # the tally survives a checkpoint
    assert restored.decide(0.7) and restored.stage == 1
    assert restored.allowed_verbs == ["go", "take", "open"]
