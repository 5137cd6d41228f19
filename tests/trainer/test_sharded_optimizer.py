"""The learner's own optimizer (actor_critic_adam: optax.multi_transform over policy and
critic, float32 or int8 moments) placed on 8 host CPU devices.

XLA_FLAGS must be set before JAX starts, so the checks run in a child process (this file
run as a script, as in tests/test_sharding.py); the pytest tests read its report.
"""

import json
import os

import pytest

from tests.eight_devices import report_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATES = ["float32", "int8"]
MESH = (2, 2, 2)  # (data, fsdp, tensor)
INT8_MESHES = [(2, 2, 2), (1, 8, 1)]


@pytest.fixture(scope="module")
def report():
    return report_of(__file__)


@pytest.mark.parametrize("state", STATES)
def test_shard_optimizer_state_places_the_multi_transform_state(report, state):
    result = report[state]["shard_optimizer_state"]
    assert result["error"] is None, result["error"]
    assert result["arrays"] > 0 and result["all_on_mesh"]
    if state == "float32":  # every moment split like its parameter
        assert result["moments"] == 2 * result["params"]
        assert result["moments_like_params"] == result["moments"]


@pytest.mark.parametrize("state", STATES)
def test_learner_on_the_mesh_matches_one_device(report, state):
    result = report[state]["learner"]
    assert result["error"] is None, result["error"]
    step = result["step_size"]
    assert step > 0
    # Summation order differs across devices. Adam's step g / (|g| + eps) amplifies that
    # noise where |g| ~ eps, and an int8 code can round the other way: a few entries differ
    # by a little, the rest agree.
    assert result["params_diff"] <= 0.05 * step, result
    assert result["share_off"] <= 2e-3, result
    # the state comes back placed as it went in: one compiled step
    assert result["same_shardings_after"] and result["train_step_compiles"] == 1


def test_separate_critic_over_frozen_layers_on_the_mesh_matches_one_device(report):
    """rl.frozen_layers with model.critic="separate" (both trunks continue the policy's
    frozen output) and `prepare` by length, over data x fsdp x tensor."""
    result = report["frozen_separate"]
    assert result["error"] is None, result["error"]
    assert result["step_size"] > 0 and result["frozen_kept"], result
    assert result["params_diff"] <= 0.05 * result["step_size"], result
    assert result["share_off"] <= 2e-3, result
    # placed as it went in; minibatches cut to their length: at most one program a bucket
    assert result["same_shardings_after"] and result["train_step_compiles"] <= 2


@pytest.mark.parametrize("mesh", INT8_MESHES, ids=str)
def test_int8_moments_are_split_over_data_and_fsdp(report, mesh):
    result = report["int8_bytes"][str(list(mesh))]
    assert result["error"] is None, result["error"]
    # every leaf by the rule: its blocks split n = data * fsdp ways where n divides them
    assert result["per_device"] == result["expected_per_device"], result
    share = result["per_device"] / result["global"]
    n = mesh[0] * mesh[1]
    assert share < 1.5 / n, share  # only a few one-block leaves (norms, biases) replicated


# ----------------------------------------------------------------------------- child


def _model(critic: str = "head", layers: int = 1):
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_agents.models import ModelConfig, Transformer, build_actor_critic

    # Sizes whose 8-bit Adam block counts (size / 256) are multiples of 8.
    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=256,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        scan_layers=layers > 1,
    )
    ac = build_actor_critic(Transformer(cfg, rngs=nnx.Rngs(0)), critic, rngs=nnx.Rngs(1))
    if critic == "separate":  # a zero head sends no gradient into its trunk in a first step
        ac.critic.head.weight[...] = jnp.full(ac.critic.head.weight.shape, 0.1)
    return ac


def _tx(state):
    import optax

    from jaxrl_agents.trainer.optim import actor_critic_adam

    lr = optax.constant_schedule(1e-3)
    return actor_critic_adam(lr, lr, max_grad_norm=1.0, state=state)


def _attempt(fn, *args, **kwargs):
    """fn(*args, **kwargs) -> dict, or {"error": ...} with the exception's text."""
    try:
        return {"error": None, **fn(*args, **kwargs)}
    except Exception as err:  # reported to the parent, which shows it
        return {"error": f"{type(err).__name__}: {err}"}


def _shard_optimizer_state(ac, state, mesh):
    import jax
    from flax import nnx

    from jaxrl_agents import sharding

    params = sharding.shard_params(nnx.state(ac), mesh)
    placed = sharding.shard_optimizer_state(_tx(state).init(nnx.state(ac)), mesh)
    arrays = jax.tree.leaves(placed)
    param_vars = {path: var for path, var in nnx.to_flat_state(params)}
    moments = like = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(
        placed, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]:
        if not isinstance(leaf, nnx.Variable) or not hasattr(leaf.get_raw_value(), "shape"):
            continue
        # a moment's path ends with its parameter's path
        names = tuple(getattr(k, "key", getattr(k, "name", k)) for k in path)
        param = next(v for p, v in param_vars.items() if names[-len(p) :] == p)
        moments += 1
        like += leaf[...].sharding.is_equivalent_to(param[...].sharding, param.ndim)
    return {
        "arrays": len(arrays),
        "all_on_mesh": all(x.sharding.mesh == mesh for x in arrays),
        "params": len(param_vars),
        "moments": moments,
        "moments_like_params": like,
    }


def _learner(ac, state, mesh, batch, frozen_layers: int = 0, length_buckets=None):
    import jax
    import numpy as np

    from jaxrl_agents.models.transformer import lower_part
    from jaxrl_agents.trainer.rl import RLHyper, RLLearner

    def flat(params):
        return np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(params)])

    def frozen(params):  # the parameters `lower_hidden(.., frozen_layers)` reads
        parts = [(np.asarray(x), lower_part(path, frozen_layers))
                 for path, x in jax.tree_util.tree_flatten_with_path(params)[0]]
        kept = [x[part].ravel() for x, part in parts if part is not None]
        return np.concatenate(kept) if kept else np.zeros(0)

    def shardings(tree):
        return [x.sharding for x in jax.tree.leaves(tree)]

    def two_updates(mesh):
        """Parameters before and after two updates (the second reads quantised moments;
        prepare runs in chunks of 4 rows, or of 2 rows of like length with length buckets,
        each split over data x fsdp)."""
        hp = RLHyper.defaults(frozen_layers=frozen_layers)
        learner = RLLearner(ac, hp, _tx(state), minibatch_size=8, mesh=mesh,
                            prepare_rows=2 if length_buckets else 4,
                            length_buckets=length_buckets)
        state_ = learner.init_state(ac)
        before, placed = flat(state_.params), shardings(state_)
        frozen_before = frozen(state_.params)
        for i in range(2):
            state_, _ = learner.update(state_, batch, jax.random.key(i))
        same = all(
            a.is_equivalent_to(b, x.ndim)
            for a, b, x in zip(placed, shardings(state_), jax.tree.leaves(state_))
        )
        frozen_kept = bool(np.array_equal(frozen(state_.params), frozen_before))
        return (before, flat(state_.params), same, learner._train_step._cache_size(),
                frozen_kept)

    before, ref, _, _, _ = two_updates(None)
    _, got, same, compiles, frozen_kept = two_updates(mesh)
    step, diff = float(np.abs(ref - before).max()), np.abs(ref - got)
    return {
        "step_size": step,
        "params_diff": float(diff.max()),
        "share_off": float(np.mean(diff > 1e-2 * step)),
        "same_shardings_after": same,
        "train_step_compiles": compiles,
        "frozen_kept": frozen_kept,
    }


def _int8_bytes(ac, mesh_shape):
    """Bytes of the learner's int8 optimizer state: on the first device, all devices
    together, and what splitting each moment's blocks data * fsdp ways should give."""
    import jax

    from jaxrl_agents import sharding
    from jaxrl_agents.trainer.optim8bit import LogBlocks, SignedBlocks
    from jaxrl_agents.trainer.rl import RLHyper, RLLearner

    mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)))
    opt_state = RLLearner(ac, RLHyper.defaults(), _tx("int8"), mesh=mesh).init_state(ac).opt_state
    n = mesh_shape[0] * mesh_shape[1]
    expected = 0
    for node in jax.tree.leaves(
        opt_state, is_leaf=lambda x: isinstance(x, SignedBlocks | LogBlocks)
    ):
        if isinstance(node, SignedBlocks | LogBlocks):
            split = node.codes.shape[0] % n == 0
            expected += sum(x.nbytes // (n if split else 1) for x in node)
        else:
            expected += node.nbytes
    return {
        "per_device": sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(opt_state)),
        "global": sum(x.nbytes for x in jax.tree.leaves(opt_state)),
        "expected_per_device": expected,
    }


def _child():
    from jaxrl_agents import sharding
    from tests.trainer.helpers import random_batch

    mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, MESH)))
    ac, batch = _model(), random_batch(0)
    out = {}
    for state in STATES:
        out[state] = {
            "shard_optimizer_state": _attempt(_shard_optimizer_state, ac, state, mesh),
            "learner": _attempt(_learner, ac, state, mesh, batch),
        }
    out["int8_bytes"] = {str(list(m)): _attempt(_int8_bytes, ac, m) for m in INT8_MESHES}
    # A separate critic over one frozen layer of two, `prepare` cut by length.
    out["frozen_separate"] = _attempt(_learner, _model("separate", layers=2), "float32", mesh,
                                      batch, frozen_layers=1, length_buckets=(16, 32))
    print(json.dumps(out))


if __name__ == "__main__":
    _child()
