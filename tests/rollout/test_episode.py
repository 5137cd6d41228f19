"""The episode driver on the toy env and a real TextWorld game: token layout, rewards, flags,
log-probs against a fresh forward pass, and the chat template."""

import jax
import numpy as np
import pytest
from flax import nnx

import envs
from configs.base import get_config
from jaxrl_agents.data import ACTION, PROMPT, pack
from jaxrl_agents.models import ModelConfig, Transformer
from jaxrl_agents.models.tokenizer import train_tokenizer
from jaxrl_agents.rollout import (
    DEFAULT_SYSTEM_PROMPT,
    EpisodeDriver,
    Renderer,
    grouped_specs,
    render_gold_trajectory,
)

TOY = [{"family": "toy", "task": "count", "n": 3, "seed": 1},
       {"family": "toy", "task": "guess", "n": 8, "seed": 2},
       {"family": "toy", "task": "count", "n": 2, "seed": 3, "reward_density": "dense"},
       {"family": "toy", "task": "count", "n": 3, "seed": 4, "raise_on": "boom"}]
TEXTS = ["[Room] Counter\n[Items] last number: 5\n[Goal] say the numbers from 5 to 7\n"
         "[Feedback] Right, 5. Wrong: 3 does not come after 2. Higher than 4. Lower."] * 30


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(TEXTS + ["12 34 56 78 90"] * 10, 300,
                           str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def model(tokenizer):
    # Four embedding rows past the tokenizer (as the trainer pads the vocabulary).
    cfg = ModelConfig(vocab_size=len(tokenizer) + 4, hidden_size=32, intermediate_size=64,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
    return Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def pool():
    with envs.EnvPool(TOY + grouped_specs([TOY[0]], 2), num_workers=2) as p:
        yield p


def driver(model, tokenizer, pool, **kwargs):
    return EpisodeDriver(model, tokenizer, pool, **{"max_action_tokens": 6, **kwargs})


def segments(traj):
    """[(token type, start, end)] runs of equal token type."""
    types, runs, start = traj.token_type, [], 0
    for t in range(1, len(types) + 1):
        if t == len(types) or types[t] != types[start]:
            runs.append((int(types[start]), start, t))
            start = t
    return runs


def check_layout(traj, renderer, max_action_tokens=None):
    """Prompt and action runs alternate, starting with the prompt; a turn end is the last
    token of every action run; rewards sit on turn ends only."""
    runs = segments(traj)
    assert [r[0] for r in runs] == [PROMPT, ACTION] * (len(runs) // 2) + [PROMPT] * (len(runs) % 2)
    actions = [r for r in runs if r[0] == ACTION]
    assert traj.turn_ends == [end - 1 for _, _, end in actions]
    off_turn = np.ones(len(traj), bool)
    off_turn[traj.turn_ends] = False
    assert not traj.rewards[off_turn].any()
    assert not traj.logprobs[traj.token_type == PROMPT].any()
    if max_action_tokens:
        assert all(end - start <= max_action_tokens for _, start, end in actions)
    return actions


def play_direct(spec, actions):
    """Observations and rewards of a spec played in this process."""
    env = envs.make(spec)
    observations, rewards = [env.reset().observation], []
    for a in actions:
        result = env.step(a)
        observations.append(result.observation)
        rewards.append(result.reward)
    return observations, rewards, result


def chat_ids(tokenizer, messages):
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_gold_actions_on_toy_env_win_with_the_right_layout(model, tokenizer, pool):
    d = driver(model, tokenizer, pool)
    ids = [0, 1, 2]
    trajs = d.run(ids, forced_actions="gold")
    for env_id, traj in zip(ids, trajs):
        spec, gold = TOY[env_id], pool.tasks[env_id].gold_actions
        assert traj.won and not traj.truncated and not traj.failed
        assert traj.info["actions"] == gold and traj.num_turns == len(gold)
        actions = check_layout(traj, d.renderer)
        for (_, start, end), action in zip(actions, gold):
            assert list(traj.tokens[start:end]) == d.renderer.action_ids(action)
        observations, rewards, last = play_direct(spec, gold)
        assert last.won
        np.testing.assert_allclose(traj.rewards[traj.turn_ends], rewards)
        # The whole episode is the chat template of the same conversation (which ends with
        # the template's newline after the last <|im_end|>).
        messages = d.renderer.conversation(observations, gold)
        expected = chat_ids(tokenizer, messages)
        assert list(traj.tokens) == expected[:len(traj)]
        assert tokenizer.decode(expected[len(traj):]) == "\n"
        # SFT rendering from recorded texts is the same trajectory.
        gold_traj = render_gold_trajectory(d.renderer, observations, gold, rewards)
        np.testing.assert_array_equal(gold_traj.tokens, traj.tokens)
        np.testing.assert_array_equal(gold_traj.token_type, traj.token_type)
        np.testing.assert_array_equal(gold_traj.rewards, traj.rewards)
    batch = pack(trajs, length_buckets=(256, 512))
    assert batch.rewards.sum() == pytest.approx(sum(t.episode_return for t in trajs))


def test_random_forced_actions_pick_offered_commands_reproducibly(model, tokenizer, pool):
    d = driver(model, tokenizer, pool, max_steps=4)
    ids = [0, 2]
    first = d.run(ids, jax.random.key(3), forced_actions="random")
    again = d.run(ids, jax.random.key(3), forced_actions="random")
    other = d.run(ids, jax.random.key(4), forced_actions="random")
    for traj, same in zip(first, again):
        offered = traj.info["admissible"]
        actions = traj.info["actions"]
        assert actions and all(a in offered[k] for k, a in enumerate(actions))
        assert actions == same.info["actions"]
        np.testing.assert_array_equal(traj.tokens, same.tokens)
        check_layout(traj, d.renderer)
    assert [t.info["actions"] for t in first] != [t.info["actions"] for t in other]


def test_plain_template_renders_like_its_definition(model, tokenizer, pool):
    d = driver(model, tokenizer, pool, template="plain", system_prompt="Count.")
    traj = d.run([0], forced_actions="gold")[0]
    observations, _, _ = play_direct(TOY[0], pool.tasks[0].gold_actions)
    text = "Count.\n\n" + "".join(f"{o}\n> {a}\n" for o, a in
                                   zip(observations, pool.tasks[0].gold_actions))
    assert tokenizer.decode(traj.tokens) == text
    check_layout(traj, d.renderer)


def test_sampled_logprobs_equal_a_fresh_forward_pass(model, tokenizer, pool):
    # Common letters as stop strings: a random policy's actions then stop at various lengths
    # (holes in the KV cache), some are cut at max_action_tokens.
    d = driver(model, tokenizer, pool, temperature=1.0, max_context=512,
               stop_strings=("\n", "e", "a", "o", "1"))
    trajs = d.run([0, 1, 2], jax.random.key(0))
    length = 512
    ids = np.zeros((len(trajs), length), np.int32)
    mask = np.zeros((len(trajs), length), np.int32)
    for i, t in enumerate(trajs):
        ids[i, :len(t)], mask[i, :len(t)] = t.tokens, 1
    logp = jax.nn.log_softmax(jax.jit(model.__call__)(ids, attention_mask=mask), axis=-1)
    logp = np.asarray(logp)
    stops = set(d.sampler.stop_token_ids)
    for i, traj in enumerate(trajs):
        assert len(traj) <= 512 and traj.num_turns >= 1
        assert traj.tokens.max() < len(tokenizer)
        actions = check_layout(traj, d.renderer, max_action_tokens=6)
        positions = np.flatnonzero(traj.token_type == ACTION)
        expected = logp[i, positions - 1, traj.tokens[positions]]
        np.testing.assert_allclose(traj.logprobs[positions], expected, atol=1e-5)
        for _, start, end in actions:  # an action ends at a stop token or is cut
            assert traj.tokens[end - 1] in stops or end - start == 6
            assert not stops & set(traj.tokens[start:end - 1].tolist())
        assert traj.truncated != traj.won
        assert all(not set("\neao1") & set(a) for a in traj.info["actions"])
    lengths = [end - start for t in trajs for kind, start, end in segments(t) if kind == ACTION]
    assert min(lengths) < 6 and len(set(lengths)) > 2
    stats = d.last_stats
    assert stats["rollout/episodes"] == 3
    assert 0.0 <= stats["rollout/model_wait_frac"] <= 1.0
    assert 0.0 <= stats["rollout/env_wait_frac"] <= 1.0
    again = d.run([0, 1, 2], jax.random.key(0))
    assert [list(t.tokens) for t in again] == [list(t.tokens) for t in trajs]


def test_captured_hidden_states_are_the_first_layers_output_of_each_episode(model, tokenizer,
                                                                          pool):
    """`run(capture=1)`: every sampled episode keeps its first layer's output at each token,
    as a forward pass over the whole episode gives it; a record ending with tokens never
    fed (the final observation of a cut episode) keeps none, and neither does a run
    without capture."""
    options = dict(temperature=1.0, max_context=512, max_steps=2,
                   stop_strings=("\n", "e", "a", "o", "1"))
    d = driver(model, tokenizer, pool, **options)
    trajs = d.run([0, 1, 2], jax.random.key(4), capture=1)
    for traj in trajs:
        ids = traj.tokens[None]
        want = np.asarray(model.lower_hidden(ids, n=1))[0]
        assert traj.lower_hidden.shape == (len(traj), model.config.hidden_size)
        np.testing.assert_allclose(traj.lower_hidden, want, atol=1e-4)
    closing = driver(model, tokenizer, pool, final_observation=True, **options)
    trajs = closing.run([0, 1, 2], jax.random.key(4), capture=1)
    closed = [t.token_type[-1] == PROMPT for t in trajs]  # cut, ending with the observation
    assert any(closed)
    assert [t.lower_hidden is None for t in trajs] == closed
    assert all(t.lower_hidden is None for t in d.run([0, 1], jax.random.key(4)))


def test_context_overflow_ends_the_episode_as_truncated(model, tokenizer, pool):
    first = len(Renderer(tokenizer).first_chunk(pool.reset([0])[0].observation))
    d = driver(model, tokenizer, pool, temperature=1.0, max_context=first + 6 + 10)
    traj = d.run([0], jax.random.key(1))[0]
    assert traj.truncated and not traj.won and traj.info["end_reason"] == "context"
    assert traj.num_turns == 1 and len(traj) <= first + 6
    tiny = driver(model, tokenizer, pool, max_context=first)  # not even one action fits
    traj = tiny.run([0], forced_actions="gold")[0]
    assert traj.truncated and traj.num_turns == 0 and len(traj) == 0


def test_step_budget_and_env_failure_are_recorded(model, tokenizer, pool):
    d = driver(model, tokenizer, pool, max_steps=2)
    trajs = d.run([0, 3], forced_actions=[["1", "2", "3"], ["boom"]])
    budget, failed = trajs
    assert budget.truncated and budget.num_turns == 2
    assert budget.info["end_reason"] == "step_budget" and not budget.failed
    assert failed.failed and not failed.won and failed.num_turns == 1
    assert "raise_on" in failed.info["error"]


def test_a_cut_episode_ends_with_its_final_observation_when_asked(model, tokenizer, pool):
    """With final_observation, an episode cut by the step budget closes its record with
    the observation after its last action (prompt tokens, as the next turn would start);
    without, the record ends at the action."""
    actions = [["1", "2", "3"]]
    plain = driver(model, tokenizer, pool, max_steps=2).run([0], forced_actions=actions)[0]
    closed = driver(model, tokenizer, pool, max_steps=2,
                    final_observation=True).run([0], forced_actions=actions)[0]
    assert plain.truncated and closed.truncated and closed.num_turns == plain.num_turns == 2
    assert plain.token_type[-1] == ACTION and closed.token_type[-1] == PROMPT
    np.testing.assert_array_equal(closed.tokens[:len(plain)], plain.tokens)
    observations, _, _ = play_direct(TOY[0], actions[0][:2])
    renderer = Renderer(tokenizer)
    assert list(closed.tokens[len(plain):]) == renderer.next_chunk(observations[2],
                                                                   list(plain.tokens[-1:]))
    check_layout(closed, renderer)


def test_group_ids(model, tokenizer, pool):
    d = driver(model, tokenizer, pool, group_size=2)
    trajs = d.run([4, 5], forced_actions="gold")
    assert [t.group_id for t in trajs] == [0, 0] and trajs[0].task_id == trajs[1].task_id
    assert [t.group_id for t in d.run([4, 5], forced_actions="gold")] == [1, 1]
    assert d.groups_used == 2
    d.number_groups_from(7)  # as a resumed run or another process's share starts
    assert [t.group_id for t in d.run([4, 5], forced_actions="gold")] == [7, 7]
    assert d.groups_used == 8
    with pytest.raises(ValueError, match="different tasks"):
        d.run([0, 1], forced_actions="gold")
    with pytest.raises(ValueError, match="whole number of groups"):
        d.run([0], forced_actions="gold")


def test_from_config(model, tokenizer, pool):
    cfg = get_config()
    d = EpisodeDriver.from_config(model, tokenizer, pool, cfg)
    assert d.max_action_tokens == cfg.rollout.max_action_tokens
    assert d.max_context == cfg.rollout.max_context
    assert d.sampling.temperature == cfg.rollout.temperature
    assert d.renderer.template == cfg.tokenizer.chat_template
    assert d.group_size == cfg.rollout.group_size
    assert d.renderer.system_prompt == DEFAULT_SYSTEM_PROMPT  # tokenizer.system_prompt ""
    with cfg.unlocked():
        cfg.tokenizer.system_prompt = "Answer with one command."
    d = EpisodeDriver.from_config(model, tokenizer, pool, cfg)
    assert d.renderer.system_prompt == "Answer with one command."


def test_gold_actions_win_a_textworld_game(model, tokenizer, tmp_path):
    pytest.importorskip("textworld")
    spec = {"family": "textworld", "name": "w1-o2-q2", "seed": 0, "split": "train",
            "cache_dir": str(tmp_path)}
    with envs.EnvPool([spec], num_workers=1) as tw_pool:
        d = driver(model, tokenizer, tw_pool, max_context=4096)
        traj = d.run([0], forced_actions="gold")[0]
        gold = tw_pool.tasks[0].gold_actions
    assert traj.won and not traj.truncated and traj.info["actions"] == gold
    actions = check_layout(traj, d.renderer)
    assert len(actions) == len(gold) >= 2
    for (_, start, end), action in zip(actions, gold):
        assert list(traj.tokens[start:end]) == d.renderer.action_ids(action)
    observations, rewards, last = play_direct(spec, gold)
    assert last.won and rewards[-1] == 1.0
    np.testing.assert_allclose(traj.rewards[traj.turn_ends], rewards)
    expected = chat_ids(tokenizer, d.renderer.conversation(observations, gold))
    assert list(traj.tokens) == expected[:len(traj)]


def test_constrained_actions_are_always_offered_commands(model, tokenizer, pool):
    """With constrain_actions an untrained policy still only plays offered commands; the
    turn's commands are recorded, and a fresh forward pass restricted to the packed
    `allowed` ids gives the sampled log-probs back."""
    from jaxrl_agents import kernels

    # One action token allowed, but offered commands are never cut.
    d = driver(model, tokenizer, pool, temperature=1.0, max_action_tokens=1,
               constrain_actions=True, max_steps=5)
    trajs = d.run([0, 1, 2], jax.random.key(1))
    assert max(len(ids) for t in trajs for turn in t.info["choices"] for ids in turn) > 1
    for traj in trajs:
        offered, actions = traj.info["admissible"], traj.info["actions"]
        assert actions and all(a in offered[k] for k, a in enumerate(actions))
        assert len(traj.info["choices"]) == traj.num_turns
        check_layout(traj, d.renderer)
    batch = pack(trajs, length_buckets=(512,), choice_width=d.choice_width)
    logits = jax.jit(model.__call__)(batch.input_ids, attention_mask=batch.valid)
    logp, _ = kernels.next_token_logprobs_and_entropy(logits, batch.input_ids, batch.allowed)
    np.testing.assert_allclose(np.asarray(logp) * batch.action_mask, batch.old_logprobs,
                               atol=1e-5)
    gold = d.run([0], forced_actions="gold")[0]  # forced actions record the choices too
    assert len(gold.info["choices"]) == gold.num_turns and gold.won
