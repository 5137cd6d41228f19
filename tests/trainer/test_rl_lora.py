"""Training with LoRA adapters (`model.lora.rank` > 0): the learner built from a config
lowers its loss with only the adapters and the value head moving; SFT moves adapters only."""

import os

import jax
import numpy as np
from flax import nnx

from jaxrl_agents.config import load_config
from jaxrl_agents.models import lora
from tests.trainer.helpers import random_batch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = (
    "model.vocab_size=32", "model.hidden_size=32", "model.intermediate_size=64",
    "model.num_layers=2", "model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=16",
    "rollout.episodes_per_batch=8", "rl.minibatch_size=8", "rl.learning_rate=1e-2",
    "rl.critic_learning_rate=1e-2", "model.lora.rank=4", "model.lora.alpha=8.0",
)


def _moved(before, after) -> set[str]:
    flat = lambda tree: {jax.tree_util.keystr(p): np.array(v) for p, v in
                         jax.tree_util.tree_flatten_with_path(tree)[0]}
    b, a = flat(before), flat(after)
    return {name for name in b if not np.array_equal(b[name], a[name])}


def test_rl_with_lora_lowers_its_loss_moving_only_adapters_and_value_head():
    from jaxrl_agents.trainer.rl import make_learner
    from jaxrl_agents.trainer.setup import build_actor_critic_from_config

    cfg = load_config(os.path.join(ROOT, "configs", "base.py"), list(TINY))
    actor_critic = build_actor_critic_from_config(cfg, cfg.model.vocab_size)
    assert lora.has_adapters(actor_critic.policy)
    learner = make_learner(cfg, actor_critic, total_updates=8, episodes_per_update=8)
    state = learner.init_state(actor_critic)
    assert state.ref_params is None
    before = jax.tree.map(np.array, state.params)
    batch, key = random_batch(0), jax.random.key(0)
    losses = []
    for i in range(6):
        state, metrics = learner.update(state, batch, jax.random.fold_in(key, i))
        losses.append(metrics["losses/total"])
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    moved = _moved(before, state.params)
    assert any("_lora']" in m for m in moved) and any("['head']" in m for m in moved)
    assert all("_lora']" in m or "['head']" in m for m in moved), moved


def test_sft_with_lora_trains_only_the_adapters():
    from jaxrl_agents.trainer.sft import SFTTrainer
    from tests.trainer.helpers import tiny_policy
    from tests.trainer.test_sft import _copy_task

    policy = tiny_policy(vocab_size=16)
    lora.attach(policy, lora.LoRAConfig(rank=4, alpha=16.0), rngs=nnx.Rngs(1))
    before = jax.tree.map(np.array, nnx.state(policy))
    trainer = SFTTrainer(policy, learning_rate=1e-2, batch_size=4, epochs=6, val_fraction=0.0,
                         length_buckets=(16,))
    history = trainer.fit(_copy_task(0, n=16))
    # a near-random frozen base: the adapters alone lower the loss slowly but steadily
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.03, history
    moved = _moved(before, nnx.state(policy))
    assert moved and all("_lora']" in m for m in moved), moved


def test_master_copy_and_ewc_cover_the_trainable_part_only():
    """bfloat16 weights with float32 adapters: the master copy, the EWC anchor and Fisher
    hold adapters and value head only, and a step donates no buffer twice."""
    import optax

    from jaxrl_agents.models import Transformer, build_actor_critic
    from jaxrl_agents.trainer.rl import RLHyper, RLLearner
    from tests.trainer.helpers import tiny_policy

    config = tiny_policy().config.replace(param_dtype="bfloat16", dtype="bfloat16")
    policy = Transformer(config, rngs=nnx.Rngs(0))
    lora.attach(policy, lora.LoRAConfig(rank=4), rngs=nnx.Rngs(1))
    ac = build_actor_critic(policy, "head", rngs=nnx.Rngs(2))
    learner = RLLearner(ac, RLHyper.defaults(estimator="gae", ewc_coef=1.0), optax.adam(1e-2),
                        minibatch_size=8, master_weights=True)
    state = learner.init_state(ac)
    trainable = lora.trainable(state.params)
    for tree in (state.master, state.ewc_anchor, state.ewc_fisher):
        assert jax.tree.structure(tree) == jax.tree.structure(trainable)
    state, metrics = learner.update(state, random_batch(0), jax.random.key(0))
    state = learner.consolidate(state, random_batch(1))
    assert max(float(np.abs(x).max()) for x in jax.tree.leaves(state.ewc_fisher)) > 0
    state, metrics = learner.update(state, random_batch(2), jax.random.key(1))
    assert metrics["losses/skipped"] == 0 and np.isfinite(metrics["losses/total"])
