"""The memory planner behind `jaxrl-plan`: per-device bytes of a run, before it runs.

Nothing is counted by hand. The actor-critic, the learner state (policy, critic, frozen
reference policy, optimizer state) and the loss are the trainer's own constructions
(`build_actor_critic`, `rl.make_learner`, `RLLearner.init_state`, `rl.loss_fn`), traced
with `jax.eval_shape`; every array is placed with the one rules table of
`jaxrl_agents.sharding` on an `AbstractMesh` of the requested shape, and its per-device
size is `NamedSharding.shard_shape`. No device of that size, and no weights, are needed.
With LoRA adapters (`model.lora.rank` > 0) the same constructions give what LoRA costs:
the reference policy is the policy's own weights (no bytes), and gradients, optimizer
state and master copy cover the adapters and the value head only.

Activations of one training micro-batch are the residuals that `jax.vjp` of the loss keeps
for the backward pass (with the model's remat setting: under remat="full" only each
layer's inputs), evaluated at the micro-batch's rows per device. Only the part that grows
with the batch is counted (R(2b) - R(b)), so parameters the backward pass reads are not
counted twice. With remat, one layer's forward is recomputed at a time during the
backward pass: the residuals of one un-rematerialised layer are added for that.

The supervised phases before RL (the language-model pretraining, SFT) get a peak each
(`supervised_peak`): the actor-critic's parameters, the SFT optimizer's state, two sets of
gradients and the residuals of `sft.sft_loss` for one of their micro-batches, whose rows
are not split over devices.

`RLLearner.prepare` gets no row of its own: it runs forward passes only (no gradients,
no saved residuals) over one micro-batch's rows at a time, so it stays under the
training step's peak.

    mc = model_config(cfg)
    plan = make_plan(cfg, mc, abstract_mesh({"data": 1, "fsdp": 8, "tensor": 1}))
    print(format_plan(plan, DEVICES["v5e-8"]))
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh, AxisType

from jaxrl_agents import sharding
from jaxrl_agents.data import Batch
from jaxrl_agents.data.packing import bucket
from jaxrl_agents.models import ModelConfig, Transformer, build_actor_critic, gguf_import, lora
from jaxrl_agents.models.build import checkpoint_overrides
from jaxrl_agents.models.hf_io import read_config

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator kind: memory per device and devices in the slice (None: any)."""

    name: str
    bytes_per_device: int
    num_devices: int | None


DEVICES = {
    # A v4 chip has 2 TensorCores run as one megacore device: JAX sees 4 devices.
    "v4-8": Device("TPU v4-8 (4 chips, 32 GiB HBM each)", 32 * GIB, 4),
    "v5e-8": Device("TPU v5litepod-8 (8 chips, 16 GiB HBM each)", 16 * GIB, 8),
    "a100-80gb": Device("A100 80GB", 80 * GIB, None),
    "h100-80gb": Device("H100 80GB", 80 * GIB, None),
}

# Published architectures (config.json of the Hugging Face repos), for planning without
# downloading anything. Values are transformers.Qwen2Config arguments.
_QWEN25 = dict(
    hidden_act="silu",
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    max_position_embeddings=32768,
    bos_token_id=151643,
    eos_token_id=151645,
)
PRESETS = {
    "qwen2.5-1.5b": dict(
        _QWEN25,
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        _QWEN25,
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}
PRESET_ALIASES = {
    "qwen/qwen2.5-1.5b": "qwen2.5-1.5b",
    "qwen/qwen2.5-1.5b-instruct": "qwen2.5-1.5b",
    "qwen/qwen2.5-7b": "qwen2.5-7b",
    "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
}


# ----------------------------------------------------------------------------- inputs


def preset_name(name: str) -> str | None:
    key = name.strip().lower()
    key = PRESET_ALIASES.get(key, key)
    return key if key in PRESETS else None


def hf_config_dict(source: str) -> dict:
    """A config.json dict from a preset name (or its hub id), a checkpoint directory or a
    config.json file. Hub ids outside the presets are not downloaded: pass a file."""
    name = preset_name(source)
    if name is not None:
        import transformers

        return transformers.Qwen2Config(**PRESETS[name]).to_dict()
    path = os.path.join(source, "config.json") if os.path.isdir(source) else source
    if not os.path.isfile(path):
        raise ValueError(
            f"model config {source!r} is not a preset {sorted(PRESETS)}, a "
            "checkpoint directory or a config.json file"
        )
    with open(path) as f:
        return json.load(f)


def model_config(cfg, source: str | None = None) -> ModelConfig:
    """The ModelConfig the trainer would build for `cfg`.

    With `source` (or `model.hf_path`) the sizes come from that architecture and, as when
    a checkpoint is loaded (`models.build_policy`), dtype, param_dtype, remat and
    scan_layers come from the config section. Otherwise the section's own sizes.
    """
    source = source or cfg.model.hf_path
    if not source:
        return ModelConfig.from_config(cfg.model)
    runtime = checkpoint_overrides(cfg.model)
    if gguf_import.is_gguf_source(source):  # converted once, then read from the cache
        return read_config(gguf_import.resolve(source), **runtime)
    if preset_name(source) is None and os.path.isdir(source):
        return read_config(source, **runtime)
    return ModelConfig.from_hf(hf_config_dict(source), **runtime)


def parse_mesh(text: str) -> dict[str, int]:
    """ "data=1,fsdp=8,tensor=1" -> {"data": 1, "fsdp": 8, "tensor": 1}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"--mesh part {part!r} is not axis=size")
        out[key.strip()] = int(value)
    return out


def abstract_mesh(mesh_cfg: Mapping[str, int], num_devices: int) -> AbstractMesh:
    """An AbstractMesh with the project's axes, sized like `sharding.make_mesh` would."""
    shape = sharding.mesh_shape(mesh_cfg, num_devices)
    return AbstractMesh(
        shape, sharding.MESH_AXES, axis_types=(AxisType.Auto,) * len(sharding.MESH_AXES)
    )


# ----------------------------------------------------------------------------- bytes


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


def tree_bytes(tree) -> int:
    """Bytes of every array (or ShapeDtypeStruct) in a pytree, all devices together."""
    return sum(_nbytes(x.shape, x.dtype) for x in jax.tree.leaves(tree))


def per_device_bytes(tree, mesh) -> int:
    """Bytes one device holds of a state pytree placed by `sharding.shard_params` (or
    `shard_optimizer_state`): every array by `sharding.state_shardings`, the same rules."""
    shardings = jax.tree.leaves(sharding.state_shardings(tree, mesh))
    return sum(
        _nbytes(shard.shard_shape(x.shape), x.dtype)
        for x, shard in zip(jax.tree.leaves(tree), shardings, strict=True)
    )


def split_by_owner(params, critic_kind: str) -> tuple:
    """ActorCritic parameters -> (policy part, critic-only part).

    nnx.state lists a trunk shared with the value head under `critic/trunk`; it is the
    policy's. A separate critic owns everything under `critic`.
    """

    def critic_only(path) -> bool:
        return path[0] == "critic" and (critic_kind == "separate" or path[1] == "head")

    flat = list(nnx.to_flat_state(params))
    policy = [(p, v) for p, v in flat if not critic_only(p)]
    critic = [(p, v) for p, v in flat if critic_only(p)]
    return nnx.from_flat_state(policy), nnx.from_flat_state(critic)


# ----------------------------------------------------------------------------- the model


def abstract_learner(cfg, mc: ModelConfig):
    """(learner, abstract LearnerState) from the trainer's own constructors, traced only.

    With rl.frozen_layers the plan stays that of every layer training (the residuals are
    measured on models of one and two layers, below any frozen count): an upper bound,
    since a frozen run keeps residuals for the layers above only."""
    from jaxrl_agents.trainer.loop import num_updates
    from jaxrl_agents.trainer.rl import make_learner

    cfg = copy.deepcopy(cfg)
    cfg.rl.frozen_layers = 0

    def build():
        policy = Transformer(mc, rngs=nnx.Rngs(cfg.seed))
        lora.attach(policy, lora_config(cfg), rngs=nnx.Rngs(cfg.seed))
        return build_actor_critic(policy, cfg.model.critic, rngs=nnx.Rngs(cfg.seed + 1))

    actor_critic = nnx.eval_shape(build)
    learner = make_learner(
        cfg,
        actor_critic,
        total_updates=max(num_updates(cfg), 1),
        episodes_per_update=cfg.rollout.episodes_per_batch,
    )
    graphdef, state = nnx.split(actor_critic)
    learner_state = jax.eval_shape(lambda s: learner.init_state(nnx.merge(graphdef, s)), state)
    return learner, learner_state


def microbatch_spec(rows: int, length: int):
    """ShapeDtypeStructs of one micro-batch as `RLLearner.update` hands it to the loss: a
    `TrainBatch`, the Batch fields plus what `prepare` adds (no frozen layers' output)."""
    from jaxrl_agents.trainer.rl_batch import Prepared, TrainBatch

    bt = lambda dtype: jax.ShapeDtypeStruct((rows, length), dtype)  # noqa: E731
    per_row = lambda dtype: jax.ShapeDtypeStruct((rows,), dtype)  # noqa: E731
    f32, i32 = jnp.float32, jnp.int32
    batch = Batch(input_ids=bt(i32), positions=bt(i32), valid=bt(i32), action_mask=bt(f32),
                  old_logprobs=bt(f32), rewards=bt(f32), group_ids=per_row(i32),
                  won=per_row(f32), truncated=per_row(f32), row_valid=per_row(f32))
    prepared = Prepared(advantages=bt(f32), returns=bt(f32), old_values=bt(f32),
                        ref_logprobs=bt(f32))
    return TrainBatch(batch, prepared)


def residual_bytes(cfg, mc: ModelConfig, rows: int, length: int) -> int:
    """Bytes of the residuals `jax.vjp` of the RL loss keeps for `rows` x `length` tokens."""
    from jaxrl_agents.trainer import rl

    learner, state = abstract_learner(cfg, mc)
    mb = microbatch_spec(rows, length)

    def pullback(params, mb):
        trainable, frozen = lora.split_trainable(params)  # as rl.train_step differentiates

        def loss(t):
            p = lora.merge_trainable(t, frozen)
            return rl.loss_fn(learner.hp, learner.graphdef, p, mb, 0.1, 1.0)[0]

        return jax.vjp(loss, trainable)[1]

    return tree_bytes(jax.eval_shape(pullback, state.params, mb))


def activation_bytes(cfg, mc: ModelConfig, rows: int, length: int) -> dict[str, int]:
    """Activations of one RL micro-batch on one device: {"saved": ..., "recompute": ...}.

    saved: residuals that grow with the batch, R(2b) - R(b). recompute (remat only): the
    residuals of one layer without remat, the working set while the backward pass
    recomputes a layer (difference between a 2-layer and a 1-layer model).
    """
    return _growing_residuals(lambda m, r: residual_bytes(cfg, m, r, length), mc, rows)


def _growing_residuals(residuals, mc: ModelConfig, rows: int) -> dict[str, int]:
    """`activation_bytes` for a loss whose residual bytes are residuals(model_config, rows)."""

    def batch_part(model_cfg):
        return residuals(model_cfg, 2 * rows) - residuals(model_cfg, rows)

    out = {"saved": batch_part(mc), "recompute": 0}
    if mc.remat != "none":
        plain = mc.replace(remat="none")
        out["recompute"] = batch_part(plain.replace(num_layers=2)) - batch_part(
            plain.replace(num_layers=1)
        )
    return out


def sft_batch_spec(rows: int, length: int, choice_width: int | None = None) -> dict:
    """ShapeDtypeStructs of the Batch fields `sft.sft_loss` reads."""
    bt, i32 = (rows, length), jnp.int32
    spec = {name: jax.ShapeDtypeStruct(bt, i32) for name in ("input_ids", "positions", "valid")}
    spec["action_mask"] = jax.ShapeDtypeStruct(bt, jnp.float32)
    if choice_width:
        spec["allowed"] = jax.ShapeDtypeStruct((*bt, choice_width), i32)
    return spec


def _abstract_policy(mc: ModelConfig, seed: int = 0, adapters: lora.LoRAConfig | None = None):
    """(graphdef, abstract state) of the policy, with LoRA `adapters` when given."""

    def build():
        policy = Transformer(mc, rngs=nnx.Rngs(seed))
        return lora.attach(policy, adapters or lora.LoRAConfig(), rngs=nnx.Rngs(seed))

    return nnx.split(nnx.eval_shape(build))


def lora_config(cfg) -> lora.LoRAConfig:
    """The run's LoRA adapters (`model.lora`; rank 0: none)."""
    return lora.LoRAConfig.from_config(cfg.model.get("lora"))


def sft_residual_bytes(mc: ModelConfig, rows: int, length: int, target: str,
                       choice_width: int | None = None,
                       adapters: lora.LoRAConfig | None = None) -> int:
    """Bytes of the residuals `jax.vjp` of the SFT loss keeps for `rows` x `length` tokens
    (gradients with respect to the trainable parameters: with LoRA, the adapters)."""
    from jaxrl_agents.trainer.sft import sft_loss

    graphdef, params = _abstract_policy(mc, adapters=adapters)

    def pullback(params, batch):
        trainable, frozen = lora.split_trainable(params)
        loss = lambda t: sft_loss(graphdef, lora.merge_trainable(t, frozen), batch,  # noqa: E731
                                  target)[0]
        return jax.vjp(loss, trainable)[1]

    return tree_bytes(jax.eval_shape(pullback, params, sft_batch_spec(rows, length,
                                                                      choice_width)))


def supervised_phases(cfg) -> list[tuple[str, int, int, str, int | None]]:
    """The supervised phases before RL: (name, micro-batch rows, tokens per row, SFT
    target, choice width), as `supervised.run_pretrain` and `run_sft` set up their
    `SFTTrainer`s (one micro-batch is batch_size / grad_accum rows, rounded up)."""
    length = bucket(cfg.rollout.max_context, cfg.rollout.length_buckets)
    width = cfg.rollout.choice_width if cfg.rollout.constrain_actions else None
    phases = []
    if cfg.pretrain.episodes_per_task > 0:
        rows = -(-cfg.pretrain.batch_size // cfg.pretrain.grad_accum)
        phases.append(("language-model pretraining", rows, length, "all", None))
    if cfg.sft.enabled:
        rows = -(-cfg.sft.batch_size // cfg.sft.grad_accum)
        phases.append(("SFT", rows, length, "actions", width))
    return phases


def supervised_terms(cfg, mc: ModelConfig, mesh, resident: int) -> dict[str, dict[str, int]]:
    """Per-device terms of each supervised phase's peak: what stays resident (`resident`:
    the actor-critic's parameters), the SFT optimizer's state, the accumulated and one
    micro-batch's gradients, and one micro-batch's activations (its rows are not split
    over devices: `SFTTrainer` feeds whole batches)."""
    from jaxrl_agents.trainer import optim

    adapters = lora_config(cfg)
    _, params = _abstract_policy(mc, adapters=adapters)
    params = lora.trainable(params)  # with LoRA: gradients and Adam moments of adapters only
    grads = per_device_bytes(params, mesh)
    terms = {}
    for name, rows, length, target, width in supervised_phases(cfg):
        state = cfg.sft.optimizer_state if target == "actions" else "float32"
        opt_state = jax.eval_shape(optim.adam(lambda step: 0.0, state=state).init, params)
        act = _growing_residuals(
            lambda m, r, length=length, target=target, width=width: sft_residual_bytes(
                m, r, length, target, width, adapters), mc, rows)
        terms[name] = {
            "policy and critic parameters": resident,
            "optimizer state": per_device_bytes(opt_state, mesh),
            "gradients (micro-batch)": grads,
            "gradients (accumulated)": grads,
            "activations (saved for backward)": act["saved"],
            "activations (one layer recomputed)": act["recompute"],
        }
    return terms


def supervised_peak(cfg, mc: ModelConfig, mesh, resident: int) -> dict[str, int]:
    """Per-device peak of each supervised phase: the sum of its `supervised_terms`."""
    return {name: sum(t.values()) for name, t in supervised_terms(cfg, mc, mesh, resident).items()}


def kv_cache_spec(
    cfg, mc: ModelConfig, mesh
) -> tuple[tuple[int, ...], jax.typing.DTypeLike, jax.sharding.NamedSharding]:
    """Shape, dtype and sharding of the values buffer of the KV cache (all layers; the
    keys hold as many bytes) at the largest rollout: `rollout.episodes_per_batch` rows
    (batch bucket) x `rollout.max_context` (cache bucket), as `Sampler.new_state` /
    `_place_cache` make it."""
    from jaxrl_agents.models.transformer import VALUE_AXES
    from jaxrl_agents.rollout import sampler

    multiple = sharding.batch_shards(mesh)
    batch = bucket(cfg.rollout.episodes_per_batch, sampler.BATCH_BUCKETS, multiple)
    slots = bucket(cfg.rollout.max_context, sampler.CACHE_BUCKETS)
    shape = (mc.num_layers, batch, mc.num_kv_heads, slots, mc.head_dim)
    return shape, mc.jnp_dtype, sharding.logical_to_sharding(VALUE_AXES, mesh, shape)


def prefill_scratch_bytes(cfg, mc: ModelConfig, mesh) -> int:
    """Per device: the scratch memory of one prefill + decode call at the largest rollout,
    besides the weights and the KV cache. A prefill writes at most `sampler.MAX_PREFILL`
    tokens (P; longer chunks go in pieces) and keeps only the last position's logits, so
    this is bounded by the shapes: the chunk's activations [B, P, D] and MLP [B, P, F]
    (a few of each), one layer's attention scores and probabilities [B, N, P, S] (float32),
    and a few [B, V] float32 rows (logits, log-softmax, the sampling filters)."""
    from jaxrl_agents.rollout import sampler

    data = sharding.batch_shards(mesh)
    tensor = mesh.shape["tensor"]
    batch = bucket(cfg.rollout.episodes_per_batch, sampler.BATCH_BUCKETS, data)
    rows = batch // data
    slots = bucket(cfg.rollout.max_context, sampler.CACHE_BUCKETS)
    chunk = min(sampler.MAX_PREFILL, bucket(cfg.rollout.max_context, sampler.PREFILL_BUCKETS))
    act = jnp.dtype(mc.jnp_dtype).itemsize
    heads = -(-mc.num_heads // tensor)
    activations = rows * chunk * (4 * mc.hidden_size + 3 * -(-mc.intermediate_size // tensor))
    scores = 3 * rows * heads * chunk * slots * 4
    logits = 6 * rows * mc.vocab_size * 4
    return activations * act + scores + logits


# ----------------------------------------------------------------------------- the plan


@dataclasses.dataclass
class Plan:
    """Per-device bytes of each part (`rows`), the phases' peaks, the sizes used, and the
    terms each phase's peak adds up (`phases`: "training step", "rollout", "evaluation" (of
    pretrained weights: no learner state) and the supervised phases of `supervised_phases`,
    {phase: {term: bytes}})."""

    rows: dict[str, int]
    train_peak: int
    rollout_peak: int
    info: dict
    supervised_peaks: dict[str, int] = dataclasses.field(default_factory=dict)
    phases: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def peak(self) -> int:
        return max(self.train_peak, self.rollout_peak, *self.supervised_peaks.values())


def train_shape(cfg, mesh) -> tuple[int, int, int]:
    """(micro-batch rows, rows per device, tokens per row) of one training step."""
    minibatch = min(cfg.rl.minibatch_size, cfg.rollout.episodes_per_batch)
    accum = cfg.rl.grad_accum if minibatch % cfg.rl.grad_accum == 0 else 1
    micro = minibatch // accum
    per_device = -(-micro // sharding.batch_shards(mesh))
    length = bucket(cfg.rollout.max_context, cfg.rollout.length_buckets)
    return micro, per_device, length


def make_plan(cfg, mc: ModelConfig, mesh) -> Plan:
    _, state = abstract_learner(cfg, mc)
    policy, critic = split_by_owner(state.params, cfg.model.critic)
    rows = {
        "policy parameters": per_device_bytes(policy, mesh),
        "critic parameters": per_device_bytes(critic, mesh),
        "reference policy": per_device_bytes(state.ref_params, mesh),
        "optimizer state": per_device_bytes(state.opt_state, mesh),
    }
    counted = ("params", "opt_state", "ref_params")
    others = {
        f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.name not in counted
    }
    rows["other learner state"] = per_device_bytes(others, mesh)  # e.g. master weights
    resident = list(rows)
    supervised = supervised_terms(cfg, mc, mesh,
                                  rows["policy parameters"] + rows["critic parameters"])
    # The update is a scan over micro-batches: the accumulated gradients (carry) and one
    # micro-batch's gradients are both live when they are added. They are taken with
    # respect to the trainable parameters (with LoRA: adapters and value head), or their
    # float32 master copy when there is one.
    trainable = lora.trainable(state.params)
    grads = per_device_bytes(trainable if state.master is None else state.master, mesh)
    rows["gradients (micro-batch)"] = grads
    rows["gradients (accumulated)"] = grads
    micro, per_device, length = train_shape(cfg, mesh)
    act = activation_bytes(cfg, mc, per_device, length)
    rows["activations (saved for backward)"] = act["saved"]
    rows["activations (one layer recomputed)"] = act["recompute"]
    training = list(rows)
    shape, dtype, kv_sharding = kv_cache_spec(cfg, mc, mesh)
    kv = 2 * _nbytes(kv_sharding.shard_shape(shape), dtype)
    rows["KV cache (rollout)"] = kv
    # `_compact` (not donated) holds the old and the new cache at once.
    rows["KV cache copy while compacting"] = kv
    rows["rollout scratch (one prefill)"] = prefill_scratch_bytes(cfg, mc, mesh)
    rollout = resident + list(rows)[len(training):]
    # Playing pretrained weights (jaxrl-eval without a checkpoint) builds no learner state.
    evaluation = ["policy parameters", "critic parameters", *rollout[len(resident):]]
    phases = {
        "training step": {name: rows[name] for name in training},
        "rollout": {name: rows[name] for name in rollout},
        "evaluation": {name: rows[name] for name in evaluation},
        **supervised,
    }
    train_peak = sum(phases["training step"].values())
    rollout_peak = sum(phases["rollout"].values())
    info = {
        "model": mc,
        "mesh": dict(mesh.shape),
        "num_params": sum(x.size for x in jax.tree.leaves(policy)),
        "critic_params": sum(x.size for x in jax.tree.leaves(critic)),
        "trainable_params": sum(x.size for x in jax.tree.leaves(trainable)),
        "lora_params": sum(
            x.size for x in jax.tree.leaves(nnx.filter_state(state.params, nnx.LoRAParam))),
        "micro_batch": micro,
        "rows_per_device": per_device,
        "tokens_per_row": length,
        "kv_cache_shape": (2,) + shape,
        "global_bytes": {
            "parameters": tree_bytes(state.params),
            "optimizer state": tree_bytes(state.opt_state),
            "reference policy": tree_bytes(state.ref_params),
        },
    }
    supervised_peaks = {name: sum(terms.values()) for name, terms in supervised.items()}
    return Plan(rows, train_peak, rollout_peak, info, supervised_peaks, phases)


def verdict(plan: Plan, device_bytes: int, headroom: float = 0.1) -> tuple[bool, str]:
    """(fits, sentence): the peak must stay under (1 - headroom) of device memory."""
    usable = device_bytes * (1.0 - headroom)
    if plan.peak <= usable:
        return True, (
            f"FITS: peak {plan.peak / GIB:.2f} GiB of {device_bytes / GIB:.2f} GiB "
            f"({100 * plan.peak / device_bytes:.0f}%; {(usable - plan.peak) / GIB:.2f}"
            f" GiB left under the {100 * headroom:.0f}% headroom)"
        )
    return False, (
        f"DOES NOT FIT: peak {plan.peak / GIB:.2f} GiB of "
        f"{device_bytes / GIB:.2f} GiB ({100 * plan.peak / device_bytes:.0f}%; "
        f"{(plan.peak - usable) / GIB:.2f} GiB over with {100 * headroom:.0f}% "
        "headroom)"
    )


def format_plan(plan: Plan, device_name: str, device_bytes: int, headroom: float = 0.1) -> str:
    info, mc = plan.info, plan.info["model"]
    mesh = ", ".join(f"{k}={v}" for k, v in info["mesh"].items())
    lines = [
        f"model: {info['num_params'] / 1e9:.3f}B parameters (+{info['critic_params']:,} critic),"
        f" D={mc.hidden_size} L={mc.num_layers} N={mc.num_heads} K={mc.num_kv_heads} "
        f"F={mc.intermediate_size} V={mc.vocab_size}, params {mc.param_dtype}, "
        f"compute {mc.dtype}, remat={mc.remat}",
        *([f"LoRA: {info['lora_params']:,} adapter parameters (counted in the model's); "
           f"{info['trainable_params']:,} trainable with the value head: the only ones "
           "with gradients and optimizer state"] if info.get("lora_params") else []),
        f"mesh: {mesh}; device: {device_name}",
        f"train micro-batch: {info['micro_batch']} rows x {info['tokens_per_row']} tokens "
        f"({info['rows_per_device']} rows per device); KV cache [k/v, L, B, K, S, H] = "
        f"{list(info['kv_cache_shape'])}",
        "",
        f"{'per device':<38}{'GiB':>10}",
    ]
    lines += [f"  {name:<36}{value / GIB:>10.3f}" for name, value in plan.rows.items()]
    lines += [
        f"{'peak, training step':<38}{plan.train_peak / GIB:>10.3f}",
        f"{'peak, rollout':<38}{plan.rollout_peak / GIB:>10.3f}",
        *(f"{'peak, ' + name:<38}{peak / GIB:>10.3f}"
          for name, peak in plan.supervised_peaks.items()),
        "",
        verdict(plan, device_bytes, headroom)[1],
    ]
    if info["micro_batch"] % (info["mesh"]["data"] * info["mesh"]["fsdp"]):
        lines.append(
            f"warning: {info['micro_batch']} micro-batch rows do not divide over "
            "data x fsdp; shard_batch refuses such a batch"
        )
    return "\n".join(lines)
