"""LoRA adapters (models/lora.py): a fresh adapter changes nothing, only adapters (and the
value head) get gradients and optimizer state, the reference is the base model, the merged
export loads in transformers, checkpoints keep adapters, the planner counts them."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import transformers
from flax import nnx

from jaxrl_agents.config import ConfigError, load_config
from jaxrl_agents.models import ModelConfig, Transformer, build_actor_critic, hf_io, lora
from jaxrl_agents.models.transformer import default_positions
from tests.models.hf_helpers import padded_batch, torch_logits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(scan=False, **kw):
    return ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8, scan_layers=scan, **kw)


def _policy(scan=False, rank=4, targets=lora.LORA_TARGETS, seed=0):
    """(model with adapters, the same base model without)."""
    base = Transformer(_config(scan), rngs=nnx.Rngs(seed))
    model = Transformer(_config(scan), rngs=nnx.Rngs(seed))
    lora.attach(model, lora.LoRAConfig(rank=rank, alpha=8.0, targets=targets),
                rngs=nnx.Rngs(seed + 1))
    return model, base


def _randomize_adapters(model, seed=0, scale=0.3):
    """Gives every adapter (B included) random values, as training would."""
    state = nnx.state(model, nnx.LoRAParam)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [scale * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
    nnx.update(model, jax.tree.unflatten(treedef, leaves))


def _ids(batch=2, length=6, vocab=64, seed=0):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab)


def _names(state) -> set[str]:
    return {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(state)}


# ----------------------------------------------------------------------------- the model


@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scan"])
def test_fresh_adapters_leave_logits_unchanged(scan):
    model, base = _policy(scan)
    ids = _ids()
    np.testing.assert_array_equal(model(ids), base(ids))
    adapters = dict(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)))
    assert len(adapters) == 2 * 7 * (1 if scan else 2)  # a and b, 7 targets, per layer
    prefix = ("blocks",) if scan else ("layers", 0)
    a = adapters[(*prefix, "attn", "q_proj_lora", "a")]
    b = adapters[(*prefix, "attn", "q_proj_lora", "b")]
    lead = (2,) if scan else ()
    assert a.shape == (*lead, 4, 32) and b.shape == (*lead, 32, 4)  # [r, in], [out, r]
    assert float(jnp.abs(a[...]).max()) > 0 and float(jnp.abs(b[...]).max()) == 0
    axes = ("layers",) if scan else ()
    assert a.get_metadata()["out_sharding"] == (*axes, "lora_rank", "embed")
    assert b.get_metadata()["out_sharding"] == (*axes, "heads", "lora_rank")
    _randomize_adapters(model)
    assert float(jnp.abs(model(ids) - base(ids)).max()) > 1e-3
    with lora.adapters_off(model):
        np.testing.assert_array_equal(model(ids), base(ids))
    assert float(jnp.abs(model(ids) - base(ids)).max()) > 1e-3  # back on after the block


@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scan"])
def test_cached_decoding_applies_the_adapters(scan):
    """The sampler's path (prefill, then one decode step against the KV cache) gives the
    full forward's logits with trained adapters: one model path."""
    model, _ = _policy(scan)
    _randomize_adapters(model)
    ids = _ids(2, 6)
    full = model(ids)
    t = ids.shape[1]
    positions = jnp.broadcast_to(jnp.arange(t), ids.shape)
    cache = model.init_cache(2, 8)
    filled = jnp.arange(8)[None, :] < jnp.arange(1, t + 1)[:, None]  # (T, S): after token t
    logits, cache = model.forward_with_cache(ids[:, :-1], positions[:, :-1], cache, 0,
                                             jnp.broadcast_to(filled[t - 2], (2, 8)))
    np.testing.assert_allclose(logits, full[:, t - 2], rtol=1e-5, atol=1e-5)
    logits, _ = model.forward_with_cache(ids[:, -1:], positions[:, -1:], cache, t - 1,
                                         jnp.broadcast_to(filled[t - 1], (2, 8)))
    np.testing.assert_allclose(logits, full[:, t - 1], rtol=1e-5, atol=1e-5)


def test_targets_choose_the_projections():
    model, _ = _policy(targets=("q", "v", "down"))
    names = {p[-2] for p, _ in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}
    assert names == {"q_proj_lora", "v_proj_lora", "down_proj_lora"}
    assert lora.num_trainable(nnx.state(model)) == 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4
                                                        + 4 * 48 + 32 * 4)


@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scan"])
def test_sharding_rules_place_adapters_like_their_weights(scan):
    """The rank axis is replicated; in and out follow the adapted weight's own axes."""
    from jax.sharding import PartitionSpec as P

    from jaxrl_agents import plan, sharding

    model, _ = _policy(scan)
    mesh = plan.abstract_mesh({"data": 1, "fsdp": 2, "tensor": 2}, 4)
    lead = (None,) if scan else ()
    specs = {p[-2:]: sharding.logical_to_spec(v.get_metadata()["out_sharding"], mesh, v.shape)
             for p, v in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}
    assert specs[("q_proj_lora", "a")] == P(*lead, None, "fsdp")  # [r, D]
    assert specs[("q_proj_lora", "b")] == P(*lead, "tensor", None)  # [N*H, r]
    assert specs[("down_proj_lora", "a")] == P(*lead, None, "tensor")  # [r, F]
    assert specs[("down_proj_lora", "b")] == P(*lead, "fsdp", None)  # [D, r]


def test_config_errors_name_the_bad_key():
    with pytest.raises(ConfigError, match=r"model\.lora\.dropout.*only 0\.0"):
        lora.LoRAConfig(rank=4, dropout=0.1)
    with pytest.raises(ConfigError, match=r"model\.lora\.targets.*\['qq'\]"):
        lora.LoRAConfig(rank=4, targets=("q", "qq"))
    with pytest.raises(ConfigError, match=r"model\.lora\.rank"):
        lora.LoRAConfig(rank=-1)
    with pytest.raises(ConfigError, match=r"model\.lora\.alpha"):
        lora.LoRAConfig(rank=4, alpha=0.0)
    with pytest.raises(ConfigError, match=r"model\.lora\.bias"):
        lora.LoRAConfig.from_config({"rank": 4, "bias": True})
    base = os.path.join(ROOT, "configs", "base.py")
    with pytest.raises(ConfigError, match=r"model\.lora\.dropout"):
        load_config(base, ["model.lora.dropout=0.05"])
    with pytest.raises(ConfigError, match=r"model\.lora\.targets.*'mlp'"):
        load_config(base, ["model.lora.targets=('q', 'mlp')"])
    cfg = load_config(base, ["model.lora.rank=8", "model.lora.targets=('q', 'v')"])
    adapters = lora.LoRAConfig.from_config(cfg.model.lora)
    assert adapters.enabled and adapters.targets == ("q", "v") and adapters.scale == 2.0
    assert not lora.LoRAConfig.from_config(load_config(base).model.lora).enabled


# ----------------------------------------------------------------------------- training


def _learner(critic="head", scan=False, **kw):
    from jaxrl_agents.trainer.rl import RLHyper, RLLearner

    model, base = _policy(scan)
    ac = build_actor_critic(model, critic, rngs=nnx.Rngs(3))
    hp = RLHyper.defaults(estimator="gae", kl_where="loss")
    learner = RLLearner(ac, hp, optax.adam(1e-2), ppo_epochs=1, minibatch_size=8, **kw)
    return learner, learner.init_state(ac), ac, base


def _batch(seed=0):
    from tests.trainer.helpers import random_batch

    return random_batch(seed)


@pytest.mark.parametrize("critic", ["head", "separate"])
def test_gradients_and_optimizer_state_cover_adapters_and_value_head_only(critic):
    from jaxrl_agents.trainer import rl
    from jaxrl_agents.trainer.rl_batch import TrainBatch, on_device

    learner, state, _, _ = _learner(critic)
    assert state.ref_params is None  # no second copy of the model
    trainable, frozen = lora.split_trainable(state.params)
    head = {n for n in _names(trainable) if n.startswith("critic/head/")}
    assert head == {"critic/head/weight", "critic/head/bias"}
    assert all("_lora/" in n for n in _names(trainable) - head)
    assert not any("_lora/" in n for n in _names(frozen))
    # optimizer moments: one per trainable leaf (Adam: mu and nu), none for base weights
    moments = optax.tree_utils.tree_get_all_with_path(state.opt_state, "mu")
    assert [len(jax.tree.leaves(v)) for _, v in moments] == [len(jax.tree.leaves(trainable))]

    arrays = on_device(_batch())
    prepared, _ = learner._prepare(state, arrays, jnp.float32(0.0), None)
    # advantages 1: a policy gradient that is not 0
    prepared = dataclasses.replace(prepared, advantages=jnp.ones_like(prepared.advantages))
    mb = TrainBatch(arrays, prepared)

    def loss(t):
        params = lora.merge_trainable(t, frozen)
        return rl.loss_fn(learner.hp, learner.graphdef, params, mb, 0.0, 1.0)[0]

    grads = dict(nnx.to_flat_state(jax.grad(loss)(trainable)))
    # A separate critic's trunk gets no gradient while the value head is still zero.
    policy = [p for p in grads if critic != "separate" or p[:2] != ("critic", "trunk")]
    b_grads = [float(jnp.abs(grads[p][...]).max()) for p in policy if p[-1] == "b"]
    assert len(b_grads) == 2 * 7 and min(b_grads) > 0  # B's, from 0: A's grads are 0 now
    assert float(jnp.abs(grads[("critic", "head", "weight")][...]).max()) > 0

    before = jax.tree.map(np.array, state.params)
    for i in range(3):
        state, metrics = learner.update(state, _batch(i), jax.random.key(i))
        assert metrics["losses/skipped"] == 0
    after = jax.tree.map(np.asarray, state.params)
    moved = {jax.tree_util.keystr(p) for (p, b), a in zip(
        jax.tree_util.tree_flatten_with_path(before)[0], jax.tree.leaves(after))
        if not np.array_equal(b, a)}
    assert moved and all("_lora" in m or "'head'" in m for m in moved), moved
    assert any("'a'" in m for m in moved) and any("'b'" in m for m in moved)


def test_reference_logprobs_are_the_base_models():
    from jaxrl_agents.trainer import rl
    from jaxrl_agents.trainer.rl_batch import on_device

    learner, state, _, base = _learner()
    for i in range(3):  # the adapters move away from zero
        state, _ = learner.update(state, _batch(i), jax.random.key(i))
    arrays = on_device(_batch(7))
    prepared, _ = learner._prepare(state, arrays, jnp.float32(0.0), None)
    graphdef, params = nnx.split(base)
    expected = rl._ref_logprobs(graphdef, params, arrays, learner.hp)
    # equal up to float32 rounding (prepare is one jitted program, this is eager)
    np.testing.assert_allclose(prepared.ref_logprobs, expected, rtol=1e-6, atol=1e-6)
    policy_logp = rl.episode_logprobs(learner.graphdef, state.params, arrays, learner.hp)
    base_logp = (expected * arrays.action_mask).sum(axis=1)
    assert float(jnp.abs(policy_logp - base_logp).max()) > 1e-4  # the adapters do act


# ----------------------------------------------------------------------------- export


def _train_adapters(model, steps=5):
    """A few Adam steps of a toy loss (next-token cross-entropy on random ids) on the
    adapters only; returns the loss before and after."""
    graphdef, params = nnx.split(model)
    trainable, frozen = lora.split_trainable(params)
    ids = _ids(4, 8, model.config.vocab_size, seed=3)
    tx = optax.adam(3e-2)

    def loss(t):
        logits = nnx.merge(graphdef, lora.merge_trainable(t, frozen))(ids)
        logp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()

    @jax.jit
    def step(trainable, opt_state):
        value, grads = jax.value_and_grad(loss)(trainable)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, value

    opt_state = tx.init(trainable)
    values = []
    for _ in range(steps):
        trainable, opt_state, value = step(trainable, opt_state)
        values.append(float(value))
    nnx.update(model, trainable)
    return values[0], values[-1]


@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scan"])
@pytest.mark.parametrize("arch,tie", [("qwen2", True), ("llama", False)])
def test_merged_export_loads_in_transformers_with_equal_logits(
        hf_checkpoint, tmp_path, arch, tie, scan):
    path, torch_base = hf_checkpoint(arch, tie=tie)
    model, config = hf_io.load(path, scan_layers=scan)
    lora.attach(model, lora.LoRAConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(0))
    first, last = _train_adapters(model)
    assert last < first
    base_tensors = hf_io.export_tensors(hf_io.load(path, scan_layers=scan)[0])
    exported = hf_io.export_tensors(model)
    assert set(exported) == set(base_tensors)  # a plain checkpoint: no adapter tensors
    out = hf_io.save(model, config, str(tmp_path / "merged"))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids, mask = padded_batch(config.vocab_size, seed=2)
    positions = default_positions(mask)
    ours = np.asarray(model(ids, positions, mask))
    theirs = torch_logits(reloaded, ids, mask, positions)
    real = mask.astype(bool)
    assert float(np.abs(ours[real] - theirs[real]).max()) <= 1e-4
    base = torch_logits(torch_base, ids, mask, positions)
    assert float(np.abs(base[real] - theirs[real]).max()) > 1e-3  # the adapters are in it


# ----------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_keeps_adapters(tmp_path):
    from jaxrl_agents.checkpoint import Checkpointer

    learner, state, ac, _ = _learner()
    state, _ = learner.update(state, _batch(0), jax.random.key(0))
    with Checkpointer(str(tmp_path / "ckpt"), async_save=False) as ckpt:
        ckpt.save(1, {"learner": state})
    _, fresh, _, _ = _learner()  # same structure, adapters and optimizer state at init
    with Checkpointer(str(tmp_path / "ckpt")) as ckpt:
        restored, _ = ckpt.restore(template={"learner": fresh})
    restored = restored["learner"]
    adapters = nnx.filter_state(state.params, nnx.LoRAParam)
    assert float(max(jnp.abs(x).max() for x in jax.tree.leaves(adapters))) > 0
    for want, got in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(want), np.asarray(got))
    assert restored.ref_params is None
    # the resumed learner goes on from there
    restored, metrics = learner.update(restored, _batch(1), jax.random.key(1))
    assert metrics["losses/skipped"] == 0


# ----------------------------------------------------------------------------- plan


def test_plan_counts_adapters_and_their_optimizer_state_only():
    from jaxrl_agents import plan
    from tests.test_plan import nbytes, real_state, tiny_config

    cfg = tiny_config(**{"model.lora.rank": 4, "model.lora.targets": ("q", "v", "down")})
    state = real_state(cfg)
    trainable = lora.trainable(state.params)
    result = plan.make_plan(cfg, plan.model_config(cfg), plan.abstract_mesh({"data": 1}, 1))
    rows, info = result.rows, result.info
    assert rows["policy parameters"] + rows["critic parameters"] == nbytes(state.params)
    assert rows["reference policy"] == 0 and state.ref_params is None
    assert rows["optimizer state"] == nbytes(state.opt_state)
    assert rows["gradients (micro-batch)"] == nbytes(trainable)
    d, layers = cfg.model.hidden_size, cfg.model.num_layers
    q = 4 * d + cfg.model.num_heads * cfg.model.head_dim * 4
    v = 4 * d + cfg.model.num_kv_heads * cfg.model.head_dim * 4
    down = 4 * cfg.model.intermediate_size + d * 4
    assert info["lora_params"] == layers * (q + v + down)
    assert info["trainable_params"] == info["lora_params"] + d + 1  # + the value head
    assert rows["optimizer state"] < nbytes(state.params) / 5
    text = plan.format_plan(result, "cpu", 16 * plan.GIB)
    assert f"LoRA: {info['lora_params']:,} adapter parameters" in text
    full = plan.make_plan(tiny_config(), plan.model_config(tiny_config()),
                          plan.abstract_mesh({"data": 1}, 1))
    assert full.rows["optimizer state"] > 5 * rows["optimizer state"]
    assert "LoRA" not in plan.format_plan(full, "cpu", 16 * plan.GIB)
