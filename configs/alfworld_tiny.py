"""ALFWorld at CPU scale: the demo's recipe (configs/textworld_tiny.py: tokenizer, 1M-parameter
decoder, LM pretraining, SFT on 50 golden trajectories, 10 PPO updates of 32 episodes,
constrained decoding over the offered commands) on generated ALFWorld games of one task type.

Games are generated offline (envs/alfworld_gen.py, cached) with 3 objects and 3 receptacles:
gold runs of 3-10 steps (pick_and_place_simple 4-5; pick_two_obj_and_place 8-10). Every
episode gets 2x its own game's optimal steps: the step-budget lever pinned at a factor of 2
(ALFWorld's own limit is 50 steps). ALFWorld rewards only the win (sparse).

`env.eval_tasks` adds task types that are only tested on; configs/sweeps/alfworld_mix.py
trains on one type or on a mix of all six and tests on each (eval.json: "rl:<task>").
"""

from configs.textworld_tiny import get_config as textworld_tiny


def use_alfworld_games(c):
    """Points config `c` at this recipe's ALFWorld games (also configs/alfworld_smollm2.py)."""
    c.env.family = "alfworld"
    c.env.name = "pick_and_place_simple"  # one of the six ALFWorld task types
    c.env.size = 3  # objects and receptacles per game
    c.env.reward_density = "sparse"  # what ALFWorld gives: 1 on the winning step
    c.env.max_steps = 0  # the budget below decides
    c.budget.enabled = True  # each episode gets 2x its game's optimal steps (pinned):
    c.budget.min_factor = 2.0
    c.budget.max_factor = 2.0
    c.budget.on_mastered = "none"
    c.budget.env_max_steps = 20  # 2x the longest gold run; also caps random-play transcripts
    return c


def get_config():
    c = use_alfworld_games(textworld_tiny())
    c.name = "alfworld_tiny"
    c.env.num_eval_tasks = 50  # per task type
    c.sft.eval_games = 300  # every held-out game of up to six task types
    # Measured: gold runs take 340-1040 tokens; random play at 2x budgets reaches 2048.
    c.rollout.max_context = 2048
    c.rollout.length_buckets = (512, 768, 1024, 1536, 2048)
    return c
