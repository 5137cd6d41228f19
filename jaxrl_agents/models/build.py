"""The policy from the `model` config section: a checkpoint when `hf_path` is set,
else a freshly initialised decoder of the configured sizes; with `model.lora.rank` > 0,
LoRA adapters on top (models/lora.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx

from jaxrl_agents.models import hf_io, lora
from jaxrl_agents.models.config import ModelConfig
from jaxrl_agents.models.transformer import Transformer

# Fields of the section that apply to a checkpoint too (its config.json gives the sizes).
CHECKPOINT_FIELDS = ("dtype", "param_dtype", "remat", "scan_layers")


def checkpoint_overrides(cfg_model: Mapping[str, Any]) -> dict[str, Any]:
    """The section's CHECKPOINT_FIELDS as ModelConfig overrides of a checkpoint's
    config.json (dtype float32 and param_dtype = dtype where the section has none)."""
    overrides = {k: cfg_model[k] for k in CHECKPOINT_FIELDS if k in cfg_model}
    overrides.setdefault("dtype", "float32")
    overrides.setdefault("param_dtype", overrides["dtype"])
    return overrides


def build_policy(cfg_model: Mapping[str, Any], *, seed: int = 0, mesh=None
                 ) -> tuple[Transformer, ModelConfig]:
    """(model, config) from a `model` section (ConfigDict or dict).

    With `hf_path` the sizes come from the checkpoint; dtype, param_dtype, remat
    and scan_layers still come from the section (`checkpoint_overrides`). With a
    mesh the parameters are placed on it. The `lora` section adds adapters (A drawn
    from `seed`, B zero: the model's outputs are unchanged until they train).
    """
    hf_path = cfg_model.get("hf_path", "") or ""
    adapters = lora.LoRAConfig.from_config(cfg_model.get("lora"))
    if hf_path:
        model, config = hf_io.load(hf_path, mesh=mesh, **checkpoint_overrides(cfg_model))
    else:
        config = ModelConfig.from_config(cfg_model)
        model = Transformer(config, rngs=nnx.Rngs(params=seed))
    adapter_key = jax.random.fold_in(jax.random.key(seed), 0x10A)  # apart from the weights'
    lora.attach(model, adapters, rngs=nnx.Rngs(params=adapter_key))
    if mesh is not None and (adapters.enabled or not hf_path):  # hf_io.load placed the rest
        from jaxrl_agents.sharding import shard_params

        model = shard_params(model, mesh)
    return model, config
