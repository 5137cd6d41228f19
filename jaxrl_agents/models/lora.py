"""LoRA adapters on the decoder's projections (`model.lora`).

An adapted projection computes y = x W^T + (alpha / r) * (x A^T) B^T, with W [out, in] the
frozen weight (Hugging Face orientation, as everywhere in `transformer.py`), A [r, in] and
B [out, r]. A starts random (PEFT's kaiming-uniform bound 1/sqrt(in)), B at zero, so a fresh
adapter leaves every logit exactly as the base model makes it.

    lora.attach(model, LoRAConfig(rank=8, alpha=16.0), rngs=nnx.Rngs(0))
    trainable, frozen = lora.split_trainable(nnx.state(actor_critic))
    with lora.adapters_off(model):             # the reference policy: same weights,
        ref_graphdef = nnx.graphdef(model)     # adapters skipped (no second copy)

Why our own small helper rather than `nnx.LoRA` or Google's `qwix`: our projections are
plain `nnx.Param` weights used in `jnp.einsum` (no `nnx.Linear` to wrap, which `nnx.LoRA`
and `nnx.LoRALinear` expect), and `qwix` (not a dependency) adds adapters by intercepting
einsums by module path at trace time, which would hide a second path through the model
and tie `hf_io` and the sharding rules to its naming. Here the adapter is one `Adapter`
module next to the weight it adapts (attribute `<weight>_lora`, e.g. `attn.q_proj_lora`),
applied by one line in the projection code: one model path for training, sampling and
the reference. Its parameters are `nnx.LoRAParam` (a subclass of `nnx.Param` in flax 0.12,
so `nnx.Param` filters select adapters too; `BASE` selects the weights without them).

Adapters are stored in float32 (they are small; bfloat16 would round small updates away)
and run in the activation dtype. Stacked layers (`scan_layers`) get stacked adapters: the
adapter's arrays take the weight's leading `layers` axis. Logical axes: A
(..., "lora_rank", in axis), B (..., out axis, "lora_rank"), the weight's own names for in
and out (`sharding.LOGICAL_AXIS_RULES` replicates `lora_rank`).

With adapters on, only they and the critic's value head train (`TRAINABLE`); the trunk's
base weights get no gradient and no optimizer state. `merged_params` folds the adapters
into the weights (W + (alpha / r) B A) for `hf_io.save`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_agents.config import LORA_TARGETS, check_lora

# Target name -> (submodule of a Block, weight attribute).
TARGET_WEIGHTS = {
    "q": ("attn", "q_proj"),
    "k": ("attn", "k_proj"),
    "v": ("attn", "v_proj"),
    "o": ("attn", "o_proj"),
    "gate": ("mlp", "gate_proj"),
    "up": ("mlp", "up_proj"),
    "down": ("mlp", "down_proj"),
}
SUFFIX = "_lora"  # the adapter of weight `q_proj` is the attribute `q_proj_lora`
RANK_AXIS = "lora_rank"


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """The `model.lora` section: rank (0 = off), alpha (scale alpha / rank), dropout (only
    0 is supported), targets (projections among q, k, v, o, gate, up, down)."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))
        check_lora(dataclasses.asdict(self))

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> LoRAConfig:
        """From the `model.lora` section (ConfigDict or dict; None or missing: off)."""
        if section is None:
            return cls()
        items = dict(section.items())
        check_lora(items)
        return cls(**items)


class Adapter(nnx.Module):
    """The low-rank update of one weight: delta(x) = scale * (x A^T) B^T.

    a [..., r, in], b [..., out, r] (`...`: the `layers` axis of stacked blocks).
    `enabled` is static (part of the graphdef): `adapters_off` turns it off.
    """

    def __init__(self, a: nnx.LoRAParam, b: nnx.LoRAParam, scale: float):
        self.a = a
        self.b = b
        self.scale = float(scale)
        self.enabled = True

    def __call__(self, x_bti):
        """[B, T, in] -> [B, T, out] in x's dtype."""
        dt = x_bti.dtype
        low = jnp.einsum("bti,ri->btr", x_bti, self.a[...].astype(dt))  # (B, T, r)
        return jnp.einsum("btr,or->bto", low * jnp.asarray(self.scale, dt),
                          self.b[...].astype(dt))


def add_delta(module: nnx.Module, name: str, x_bti, y_bto):
    """y plus the delta of the adapter on `module`'s weight `name`, when it has one that is
    enabled; else y unchanged."""
    adapter = getattr(module, name + SUFFIX, None)
    if adapter is None or not adapter.enabled:
        return y_bto
    return y_bto + adapter(x_bti).astype(y_bto.dtype)


def _new_adapter(weight: nnx.Param, rank: int, scale: float, key) -> Adapter:
    """An adapter for `weight` [..., out, in]: A kaiming-uniform, B zeros, float32."""
    *lead, out_dim, in_dim = weight.shape
    axes = weight.get_metadata().get("out_sharding") or (None,) * weight.ndim
    *lead_axes, out_axis, in_axis = axes
    bound = 1.0 / in_dim**0.5
    a = jax.random.uniform(key, (*lead, rank, in_dim), jnp.float32, -bound, bound)
    b = jnp.zeros((*lead, out_dim, rank), jnp.float32)
    return Adapter(
        nnx.LoRAParam(a, out_sharding=(*lead_axes, RANK_AXIS, in_axis), eager_sharding=False),
        nnx.LoRAParam(b, out_sharding=(*lead_axes, out_axis, RANK_AXIS), eager_sharding=False),
        scale,
    )


def _blocks(model) -> list:
    """The model's decoder layers: the one stacked Block, or each Block."""
    return [model.blocks] if model.config.scan_layers else list(model.layers)


def attach(model, config: LoRAConfig, *, rngs: nnx.Rngs):
    """Adds an adapter to each target projection of every layer of `model` (a
    Transformer), in place; returns `model`. Nothing happens when `config.rank` is 0."""
    if not config.enabled:
        return model
    if has_adapters(nnx.state(model)):
        raise ValueError("the model already has LoRA adapters")
    for block in _blocks(model):
        for target in config.targets:
            part, name = TARGET_WEIGHTS[target]
            module = getattr(block, part)
            adapter = _new_adapter(getattr(module, name), config.rank, config.scale,
                                   rngs.params())
            setattr(module, name + SUFFIX, adapter)
    return model


def _adapters(module: nnx.Module) -> list[Adapter]:
    return [m for _, m in nnx.iter_modules(module) if isinstance(m, Adapter)]


@contextlib.contextmanager
def adapters_off(module: nnx.Module):
    """Within the block, every adapter of `module` is skipped (the base model). A graphdef
    taken inside keeps them off: `nnx.merge` of it with the same state is the reference."""
    adapters = [a for a in _adapters(module) if a.enabled]
    for a in adapters:
        a.enabled = False
    try:
        yield module
    finally:
        for a in adapters:
            a.enabled = True


# ----------------------------------------------------------------------------- states


def _is_value_head(path, _) -> bool:
    return len(path) >= 2 and tuple(str(k) for k in path[:2]) == ("critic", "head")


# With adapters: what trains (adapters, the critic's value head) and the rest.
TRAINABLE = nnx.Any(nnx.LoRAParam, _is_value_head)
BASE = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))  # parameters that are not adapters


def has_adapters(state) -> bool:
    """Whether an nnx.State (or Module) holds LoRA adapter parameters."""
    if isinstance(state, nnx.Module):
        state = nnx.state(state)
    leaves = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return any(isinstance(v, nnx.LoRAParam) for v in leaves)


def split_trainable(params):
    """(trainable, frozen) of an nnx.State: without adapters everything trains (frozen is
    None); with them, `TRAINABLE` against the rest."""
    if not has_adapters(params):
        return params, None
    return nnx.split_state(params, TRAINABLE, ...)


def trainable(params):
    """The trainable part of an nnx.State (all of it without adapters)."""
    return split_trainable(params)[0]


def merge_trainable(trainable_part, frozen):
    """The inverse of `split_trainable`."""
    return trainable_part if frozen is None else nnx.merge_state(trainable_part, frozen)


def num_trainable(params) -> int:
    """Trainable parameter count of an nnx.State (or ShapeDtypeStruct state)."""
    return sum(x.size for x in jax.tree.leaves(trainable(params)))


# ----------------------------------------------------------------------------- export


def merged_params(model) -> nnx.State:
    """The base parameters of `model` (adapters excluded) with every adapter folded into
    its weight: W + scale * B @ A ([out, in], per layer when stacked). Exactly the base
    weights where there is no adapter."""
    state = nnx.state(model, BASE)
    flat = dict(nnx.to_flat_state(state))
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
        if path[-1] != "a":
            continue
        adapter_path = path[:-1]
        weight_path = (*adapter_path[:-1], str(adapter_path[-1])[: -len(SUFFIX)])
        weight = flat[weight_path]
        adapter = _module_at(model, adapter_path)
        if not adapter.enabled:
            continue
        a = var[...].astype(jnp.float32)
        b = adapter.b[...].astype(jnp.float32)
        delta = adapter.scale * jnp.einsum("...or,...ri->...oi", b, a)
        merged = (weight[...].astype(jnp.float32) + delta).astype(weight[...].dtype)
        flat[weight_path] = weight.replace(merged)
    return nnx.from_flat_state(list(flat.items()))


def _module_at(model, path):
    node = model
    for key in path:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return node
