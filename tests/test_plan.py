"""The memory planner against real allocations of small configs on CPU.

Parameter and optimizer bytes must equal the real arrays' nbytes exactly; per-device bytes
must equal the first addressable shard of each array on an 8-host-device mesh (checked in a
child process, as in test_sharding.py); the activation estimate must be within a factor of
2 of the temp bytes XLA's memory analysis reports for the compiled loss gradient.
"""

import json
import os

import jax
import pytest

from jaxrl_agents import plan
from jaxrl_agents.config import load_config
from tests.eight_devices import report_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHES = [(1, 8, 1), (2, 2, 2), (1, 4, 2)]
# Activations estimate vs compiled temp bytes: within this factor either way.
ACTIVATION_FACTOR = 2.0
TINY = {
    "model.vocab_size": 256,
    "model.hidden_size": 64,
    "model.intermediate_size": 128,
    "model.num_layers": 2,
    "model.num_heads": 4,
    "model.num_kv_heads": 2,
    "model.head_dim": 16,
    "rollout.episodes_per_batch": 8,
    "rollout.max_context": 128,
    "rollout.length_buckets": (64, 128),
    "rl.minibatch_size": 8,
}


def tiny_config(**extra):
    values = dict(TINY, **extra)
    return load_config(
        os.path.join(ROOT, "configs", "base.py"), [f"{k}={v}" for k, v in values.items()]
    )


def real_state(cfg):
    """The trainer's own learner state, built for real."""
    from jaxrl_agents.trainer.rl import make_learner
    from jaxrl_agents.trainer.setup import build_actor_critic_from_config

    actor_critic = build_actor_critic_from_config(cfg, cfg.model.vocab_size)
    learner = make_learner(cfg, actor_critic, total_updates=1, episodes_per_update=8)
    return learner.init_state(actor_critic)


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


# ----------------------------------------------------------------------------- one device


@pytest.mark.parametrize("critic", ["head", "separate"])
def test_parameter_and_optimizer_bytes_equal_the_real_arrays(critic):
    cfg = tiny_config(**{"model.critic": critic, "model.param_dtype": "bfloat16"})
    state = real_state(cfg)
    result = plan.make_plan(cfg, plan.model_config(cfg), plan.abstract_mesh({"data": 1}, 1))
    rows = result.rows
    assert rows["policy parameters"] + rows["critic parameters"] == nbytes(state.params)
    assert rows["reference policy"] == nbytes(state.ref_params)
    assert rows["optimizer state"] == nbytes(state.opt_state)
    assert rows["gradients (micro-batch)"] == nbytes(state.params)
    policy_bytes = nbytes(jax.tree.leaves(state.ref_params))
    if critic == "head":  # the value head only: D weights and a bias, float32
        assert rows["critic parameters"] == (cfg.model.hidden_size + 1) * 4
        assert rows["policy parameters"] == policy_bytes
    else:  # a second trunk
        assert rows["critic parameters"] == policy_bytes + (cfg.model.hidden_size + 1) * 4


def test_gradients_are_planned_in_the_master_copys_dtype():
    cfg = tiny_config(**{"model.param_dtype": "bfloat16", "rl.master_weights": "float32"})
    state = real_state(cfg)
    result = plan.make_plan(cfg, plan.model_config(cfg), plan.abstract_mesh({"data": 1}, 1))
    assert result.rows["gradients (micro-batch)"] == nbytes(state.master)
    assert result.rows["other learner state"] >= nbytes(state.master)
    assert nbytes(state.master) > 1.9 * nbytes(state.params)  # bf16 params (+ f32 value head)


def _compiled_temp_bytes(cfg, mc, rows, length) -> int:
    from jaxrl_agents.trainer import rl

    learner, state = plan.abstract_learner(cfg, mc)
    mb = plan.microbatch_spec(rows, length)

    def grad(params, mb):
        return jax.grad(lambda p: rl.loss_fn(learner.hp, learner.graphdef, p, mb, 0.1, 1.0)[0])(
            params
        )

    compiled = jax.jit(grad).lower(state.params, mb).compile()
    return compiled.memory_analysis().temp_size_in_bytes


# XLA on CPU honours remat per layer only under scan (unrolled checkpointed layers
# are scheduled like plain ones), so remat cases run with scan_layers.
@pytest.mark.parametrize(
    "remat,scan", [("none", False), ("full", True), ("dots", True)], ids=["none", "full", "dots"]
)
def test_activation_estimate_close_to_compiled_temp_bytes(remat, scan):
    cfg = tiny_config(**{"model.remat": remat, "model.scan_layers": scan, "model.num_layers": 3})
    mc = plan.model_config(cfg)
    rows, length = 4, 128
    est = plan.activation_bytes(cfg, mc, rows, length)
    if remat == "none":
        assert est["recompute"] == 0
    else:
        assert est["recompute"] > 0
    temp = _compiled_temp_bytes(cfg, mc, rows, length)
    total = est["saved"] + est["recompute"]
    print(f"remat={remat}: estimate {total} bytes, compiled temp {temp} ({total / temp:.2f}x)")
    assert temp / ACTIVATION_FACTOR <= total <= temp * ACTIVATION_FACTOR, (est, temp)


@pytest.mark.parametrize("target", ["actions", "all"])
def test_sft_activation_estimate_close_to_compiled_temp_bytes(target):
    """The supervised phases' activations against what XLA allocates for the SFT gradient."""
    from jaxrl_agents.trainer.sft import sft_loss

    mc = plan.model_config(tiny_config(**{"model.num_layers": 3}))
    rows, length = 4, 128
    est = plan._growing_residuals(
        lambda m, r: plan.sft_residual_bytes(m, r, length, target), mc, rows)
    graphdef, params = plan._abstract_policy(mc)
    grad = jax.grad(lambda p, b: sft_loss(graphdef, p, b, target)[0])
    temp = jax.jit(grad).lower(params, plan.sft_batch_spec(rows, length)).compile()
    temp = temp.memory_analysis().temp_size_in_bytes
    total = est["saved"] + est["recompute"]
    print(f"SFT target={target}: estimate {total} bytes, compiled temp {temp}")
    assert temp / ACTIVATION_FACTOR <= total <= temp * ACTIVATION_FACTOR, (est, temp)


def test_supervised_phases_get_a_peak_that_grad_accum_lowers():
    """The pretraining and SFT rows follow the config: present when the phase runs, their
    activations split by grad_accum, and the plan's peak covers them."""
    base = {"pretrain.episodes_per_task": 2, "pretrain.batch_size": 8, "sft.batch_size": 8,
            "rollout.max_context": 512}
    mesh = plan.abstract_mesh({"data": 1}, 1)
    cfg = tiny_config(**base)
    whole = plan.make_plan(cfg, plan.model_config(cfg), mesh)
    assert set(whole.supervised_peaks) == {"language-model pretraining", "SFT"}
    assert whole.peak >= max(whole.supervised_peaks.values())
    cfg = tiny_config(**base, **{"pretrain.grad_accum": 4, "sft.enabled": False})
    split = plan.make_plan(cfg, plan.model_config(cfg), mesh)
    assert set(split.supervised_peaks) == {"language-model pretraining"}
    fixed = whole.rows["policy parameters"]  # a lower bound of what does not shrink
    assert (split.supervised_peaks["language-model pretraining"] - fixed
            < 0.5 * (whole.supervised_peaks["language-model pretraining"] - fixed))


def test_remat_shrinks_saved_activations_and_rows_scale_them():
    base = {"model.scan_layers": True, "model.num_layers": 4}
    none = plan.activation_bytes(tiny_config(**base), plan.model_config(tiny_config(**base)), 2, 64)
    cfg = tiny_config(**base, **{"model.remat": "full"})
    full = plan.activation_bytes(cfg, plan.model_config(cfg), 2, 64)
    assert full["saved"] < none["saved"] / 2
    double = plan.activation_bytes(cfg, plan.model_config(cfg), 4, 64)
    assert double["saved"] == 2 * full["saved"]


def test_fit_verdict_flips_as_device_memory_shrinks():
    cfg = tiny_config()
    result = plan.make_plan(cfg, plan.model_config(cfg), plan.abstract_mesh({"data": 1}, 1))
    threshold = result.peak / 0.9  # 10% headroom
    assert plan.verdict(result, int(threshold) + 1, 0.1)[0]
    assert not plan.verdict(result, int(threshold) - 1, 0.1)[0]
    assert plan.verdict(result, 10 * result.peak, 0.1)[1].startswith("FITS")
    assert plan.verdict(result, result.peak // 2, 0.1)[1].startswith("DOES NOT FIT")


def test_cli_prints_the_table_and_verdict(capsys):
    from jaxrl_agents.cli import plan_main

    args = ["--config", os.path.join(ROOT, "configs", "base.py")]
    args += [f"--config.{k}={v}" for k, v in TINY.items()]
    assert plan_main(args + ["--mesh", "data=1,fsdp=2,tensor=1", "--device", str(2**40)]) == 0
    out = capsys.readouterr().out
    assert "optimizer state" in out and "FITS" in out and "fsdp=2" in out
    assert plan_main(args + ["--mesh", "data=1,fsdp=2,tensor=1", "--device", "1000"]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert plan_main(args + ["--device", "tpu-9000"]) == 2


# Published parameter counts (embedding included; tied for 1.5B, untied for 7B).
@pytest.mark.parametrize(
    "name,count", [("Qwen/Qwen2.5-1.5B-Instruct", 1_543_714_304), ("qwen2.5-7b", 7_615_616_512)]
)
def test_presets_have_the_published_sizes(name, count):
    from flax import nnx

    from jaxrl_agents.models import Transformer

    cfg = tiny_config(
        **{"model.hf_path": name, "model.dtype": "bfloat16", "model.param_dtype": "bfloat16"}
    )
    mc = plan.model_config(cfg)
    assert mc.param_dtype == "bfloat16" and mc.qkv_bias
    model = nnx.eval_shape(lambda: Transformer(mc, rngs=nnx.Rngs(0)))
    assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == count


def test_model_config_from_a_config_json(tmp_path):
    hf = plan.hf_config_dict("qwen2.5-1.5b")
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = tiny_config(**{"model.hf_path": str(tmp_path), "model.remat": "full"})
    mc = plan.model_config(cfg)
    assert (mc.hidden_size, mc.num_layers, mc.num_kv_heads, mc.remat) == (1536, 28, 2, "full")
    with pytest.raises(ValueError, match="preset"):
        plan.hf_config_dict("no/such-model")


# ----------------------------------------------------------------------------- 8 devices


@pytest.fixture(scope="module")
def report():
    return report_of(__file__)


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_per_device_bytes_equal_the_first_shard(report, mesh):
    result = report[str(list(mesh))]
    for part in ("params", "ref_params", "opt_state", "int8_opt_state"):
        assert result[part]["planned"] == result[part]["measured"], part
    assert result["int8_opt_state"]["planned"] < result["int8_opt_state"]["global"]  # split
    assert result["kv"]["planned"] == result["kv"]["measured"]
    assert result["params"]["planned"] < result["params"]["global"]  # really sharded


def _child():
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_agents import sharding
    from jaxrl_agents.models import Transformer
    from jaxrl_agents.rollout.sampler import Sampler

    def first_shard_bytes(tree):
        return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))

    cfg = tiny_config(**{"model.critic": "separate", "model.num_heads": 8, "model.head_dim": 8})
    mc = plan.model_config(cfg)
    state = real_state(cfg)
    int8_cfg = tiny_config(
        **{"model.num_heads": 8, "model.head_dim": 8, "rl.optimizer_state": "int8"}
    )
    int8_opt = real_state(int8_cfg).opt_state
    int8_abstract = plan.abstract_learner(int8_cfg, plan.model_config(int8_cfg))[1].opt_state
    out = {}
    for shape in MESHES:
        mesh_cfg = dict(zip(sharding.MESH_AXES, shape))
        mesh = sharding.make_mesh(mesh_cfg)
        abstract = plan.abstract_mesh(mesh_cfg, 8)
        params = sharding.shard_params(jax.tree.map(jnp.copy, state.params), mesh)
        ref = sharding.shard_params(jax.tree.map(jnp.copy, state.ref_params), mesh)
        opt = sharding.shard_optimizer_state(state.opt_state, mesh)
        opt8 = sharding.shard_optimizer_state(int8_opt, mesh)
        result = plan.make_plan(cfg, mc, abstract)
        rows = result.rows
        # The sampler's own cache at the plan's largest size.
        sampler = Sampler(sharding.shard_params(Transformer(mc, rngs=nnx.Rngs(0)), mesh), mesh=mesh)
        kv_shape = result.info["kv_cache_shape"]
        decode = sampler.new_state(sampler.batch_size(cfg.rollout.episodes_per_batch), kv_shape[4])
        out[str(list(shape))] = {
            "params": {
                "planned": rows["policy parameters"] + rows["critic parameters"],
                "measured": first_shard_bytes(params),
                "global": nbytes(params),
            },
            "ref_params": {"planned": rows["reference policy"], "measured": first_shard_bytes(ref)},
            "opt_state": {"planned": rows["optimizer state"], "measured": first_shard_bytes(opt)},
            "int8_opt_state": {
                "planned": plan.per_device_bytes(int8_abstract, abstract),
                "measured": first_shard_bytes(opt8),
                "global": nbytes(int8_opt),
            },
            "kv": {
                "planned": rows["KV cache (rollout)"],
                "measured": first_shard_bytes(decode.cache),
            },
        }
    print(json.dumps(out))


if __name__ == "__main__":
    _child()
