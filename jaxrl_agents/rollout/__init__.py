"""Rollouts: the KV-cache sampler and the multi-turn episode driver.

`generate(model, prompts, max_new_tokens, ...)` is the simple entry point; `Sampler` keeps
caches across calls; `EpisodeDriver(...).run(env_ids, key)` plays episodes and returns
`Trajectory` records; `render_gold_trajectory` / `run(..., forced_actions="gold")` render
SFT data exactly like RL episodes.
"""

from jaxrl_agents.rollout.episode import (
    EpisodeDriver,
    EpisodeRecord,
    grouped_specs,
    render_gold_trajectory,
)
from jaxrl_agents.rollout.render import DEFAULT_SYSTEM_PROMPT, TEMPLATES, Renderer
from jaxrl_agents.rollout.sampler import (
    DecodeState,
    GenerationResult,
    Sampler,
    SamplingParams,
    generate,
)

__all__ = ["DEFAULT_SYSTEM_PROMPT", "DecodeState", "EpisodeDriver", "EpisodeRecord",
           "GenerationResult", "Renderer", "Sampler", "SamplingParams", "TEMPLATES", "generate",
           "grouped_specs", "render_gold_trajectory"]
