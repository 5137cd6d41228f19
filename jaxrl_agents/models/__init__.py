"""The policy and critic models: a Flax NNX Qwen2 / Qwen3 / Llama decoder and its I/O."""

from jaxrl_agents.models.build import build_policy
from jaxrl_agents.models.config import ModelConfig, RopeScaling
from jaxrl_agents.models.transformer import KVCache, Transformer, count_params
from jaxrl_agents.models.value import ActorCritic, Critic, ValueHead, build_actor_critic

__all__ = ["ActorCritic", "Critic", "KVCache", "ModelConfig", "RopeScaling", "Transformer",
           "ValueHead", "build_actor_critic", "build_policy", "count_params"]
