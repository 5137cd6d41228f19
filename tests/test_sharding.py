"""Sharding on 8 host CPU devices: same logits and gradients as one device.

XLA_FLAGS must be set before JAX starts, so the checks run in a child process
(this file run as a script); the pytest tests only launch it and read its report.
"""

import json
import os

import pytest

from tests.eight_devices import report_of

MESHES = [(8, 1, 1), (2, 2, 2), (1, 4, 2)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def report():
    return report_of(__file__)


def test_mesh_from_config_and_rules(report):
    assert report["devices"] == 8
    assert report["mesh_rest"] == [2, 1, 4]
    assert "needs 16 devices" in report["mesh_error"]
    assert report["uneven_spec"] == [None, "fsdp"]  # one kv head: not split over tensor


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_same_logits_and_gradients_as_one_device(report, mesh):
    result = report["meshes"][str(list(mesh))]
    assert result["logits_diff"] <= 1e-5
    assert result["grads_diff"] <= 1e-5
    assert result["grad_sharding_ok"]


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_parameters_really_sharded(report, mesh):
    result = report["meshes"][str(list(mesh))]
    _, fsdp, tensor = mesh
    q_rows, q_cols = result["q_proj_full_shape"]  # [N*H, D]: ('heads', 'embed')
    assert result["q_proj_shard_shape"] == [q_rows // tensor, q_cols // fsdp]
    vocab, embed = result["embed_full_shape"]
    assert result["embed_shard_shape"] == [vocab // tensor, embed // fsdp]
    assert result["batch_shard_rows"] == 8 // (mesh[0] * mesh[1])
    assert result["adam_mu_matches_param"]


def test_scan_model_and_loading_onto_mesh(report):
    assert report["scan_222"]["grads_diff"] <= 1e-5
    assert report["scan_222"]["stacked_spec"] == [None, "tensor", "fsdp"]
    assert report["load_222"]["logits_diff"] <= 1e-5
    assert report["load_222"]["q_proj_shard_shape"] == [16, 16]


# ----------------------------------------------------------------------------- child


def _child():
    import tempfile

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from jaxrl_agents import sharding
    from jaxrl_agents.models import ModelConfig, Transformer, hf_io

    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, tie_embeddings=False)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, cfg.vocab_size, size=(8, 6)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    mask[5, :3] = 0

    def loss_fn(model, ids, mask):
        logp = jax.nn.log_softmax(model(ids, attention_mask=mask))
        picked = jnp.take_along_axis(logp, jnp.roll(ids, -1, 1)[..., None], -1)[..., 0]
        return -(picked * mask).sum() / mask.sum()

    def run(model, batch, mesh=None):
        """(logits, grads) of one jitted step; on a mesh, grads come back like the params."""
        graphdef, state = nnx.split(model)

        def step(state, ids, mask):
            logits = nnx.merge(graphdef, state)(ids, attention_mask=mask)
            grads = jax.grad(lambda s: loss_fn(nnx.merge(graphdef, s), ids, mask))(state)
            return logits, grads

        kwargs = {}
        if mesh is not None:
            kwargs["out_shardings"] = (sharding.batch_sharding(mesh, 3),
                                       sharding.state_shardings(state, mesh))
        return jax.jit(step, **kwargs)(state, *batch)

    def max_diff(a, b):
        return max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a),
                                                               jax.tree.leaves(b)))

    ref_model = Transformer(cfg, rngs=nnx.Rngs(0))
    ref_logits, ref_grads = run(ref_model, (ids, mask))
    out = {"devices": jax.device_count(), "meshes": {}}
    out["mesh_rest"] = list(sharding.mesh_shape({"data": 2, "fsdp": 1, "tensor": -1}, 8))
    try:
        sharding.make_mesh({"data": 4, "fsdp": 2, "tensor": 2})
    except ValueError as err:
        out["mesh_error"] = str(err)
    mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    out["uneven_spec"] = list(sharding.logical_to_spec(("kv_heads", "embed"), mesh, (1, 32)))

    for shape in MESHES:
        mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, shape)))
        model = sharding.shard_params(nnx.clone(ref_model), mesh)
        batch = sharding.shard_batch((ids, mask), mesh)
        logits, grads = run(model, batch, mesh)
        q = model.layers[0].attn.q_proj[...]
        emb = model.embed_tokens[...]
        opt = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
        opt = sharding.shard_optimizer_state(opt, mesh)
        mu = opt.opt_state[0].mu["layers"][0]["attn"]["q_proj"][...]
        grad_q = grads["layers"][0]["attn"]["q_proj"][...]
        out["meshes"][str(list(shape))] = {
            "logits_diff": float(jnp.abs(logits - ref_logits).max()),
            "grads_diff": max_diff(grads, ref_grads),
            "grad_sharding_ok": grad_q.sharding.is_equivalent_to(q.sharding, 2),
            "q_proj_full_shape": list(q.shape),
            "q_proj_shard_shape": list(q.addressable_shards[0].data.shape),
            "embed_full_shape": list(emb.shape),
            "embed_shard_shape": list(emb.addressable_shards[0].data.shape),
            "batch_shard_rows": batch[0].addressable_shards[0].data.shape[0],
            "adam_mu_matches_param": mu.sharding.is_equivalent_to(q.sharding, 2),
        }

    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    with tempfile.TemporaryDirectory() as tmp:
        hf_io.save(ref_model, cfg, tmp)
        scan_model, _ = hf_io.load(tmp, scan_layers=True, mesh=mesh)
        loaded, _ = hf_io.load(tmp, mesh=mesh)
    batch = sharding.shard_batch((ids, mask), mesh)
    _, scan_grads = run(scan_model, batch, mesh)
    as_module = nnx.merge(nnx.graphdef(scan_model), scan_grads)
    ref_module = nnx.merge(nnx.graphdef(ref_model), ref_grads)
    scan_named, ref_named = hf_io.export_tensors(as_module), hf_io.export_tensors(ref_module)
    out["scan_222"] = {
        "grads_diff": max(float(jnp.abs(scan_named[k] - ref_named[k]).max()) for k in ref_named),
        "stacked_spec": list(scan_model.blocks.attn.q_proj[...].sharding.spec),
    }
    loaded_logits, _ = run(loaded, batch, mesh)
    out["load_222"] = {
        "logits_diff": float(jnp.abs(loaded_logits - ref_logits).max()),
        "q_proj_shard_shape": list(
            loaded.layers[0].attn.q_proj[...].addressable_shards[0].data.shape),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    _child()


def test_batch_shards_is_the_product_of_the_batch_axes():
    import types

    from jaxrl_agents.sharding import batch_shards

    assert batch_shards(types.SimpleNamespace(shape={"data": 2, "fsdp": 4, "tensor": 8})) == 8
