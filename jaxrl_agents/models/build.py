"""The policy from the `model` config section: a checkpoint when `hf_path` is set,
else a freshly initialised decoder of the configured sizes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flax import nnx

from jaxrl_agents.models import hf_io
from jaxrl_agents.models.config import ModelConfig
from jaxrl_agents.models.transformer import Transformer

# Fields that may differ from the checkpoint's config.json when loading one.
_RUNTIME_FIELDS = ("remat", "scan_layers")


def build_policy(cfg_model: Mapping[str, Any], *, seed: int = 0, mesh=None
                 ) -> tuple[Transformer, ModelConfig]:
    """(model, config) from a `model` section (ConfigDict or dict).

    With `hf_path` the sizes come from the checkpoint; dtype, remat and
    scan_layers still come from the section. With a mesh the parameters are
    placed on it.
    """
    hf_path = cfg_model.get("hf_path", "") or ""
    if hf_path:
        overrides = {k: cfg_model[k] for k in _RUNTIME_FIELDS if k in cfg_model}
        return hf_io.load(hf_path, dtype=cfg_model.get("dtype", "float32"), mesh=mesh,
                          **overrides)
    config = ModelConfig.from_config(cfg_model)
    model = Transformer(config, rngs=nnx.Rngs(params=seed))
    if mesh is not None:
        from jaxrl_agents.sharding import shard_params

        model = shard_params(model, mesh)
    return model, config
