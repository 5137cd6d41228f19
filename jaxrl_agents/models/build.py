"""The policy from the `model` config section: a checkpoint when `hf_path` is set,
else a freshly initialised decoder of the configured sizes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flax import nnx

from jaxrl_agents.models import hf_io
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
    mesh the parameters are placed on it.
    """
    hf_path = cfg_model.get("hf_path", "") or ""
    if hf_path:
        return hf_io.load(hf_path, mesh=mesh, **checkpoint_overrides(cfg_model))
    config = ModelConfig.from_config(cfg_model)
    model = Transformer(config, rngs=nnx.Rngs(params=seed))
    if mesh is not None:
        from jaxrl_agents.sharding import shard_params

        model = shard_params(model, mesh)
    return model, config
