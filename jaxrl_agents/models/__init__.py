"""The policy and critic models: a Flax NNX Qwen2 / Llama decoder and its I/O."""

from jaxrl_agents.models.config import ModelConfig
from jaxrl_agents.models.transformer import KVCache, Transformer, count_params

__all__ = ["KVCache", "ModelConfig", "Transformer", "count_params"]
