"""The main demo's recipe on a second task: SmolLM2-135M-Instruct on generated ALFWorld games
of one task type (pick_and_place_simple), PPO from the pretrained weights.

Everything but the environment is `configs/textworld_smollm2.py` (`make demo`): the chat
template and system prompt, constrained decoding over the offered commands, 12 PPO updates of
8 episodes, the value head, the top 6 layers trained. The games are those of
`configs/alfworld_tiny.py`: generated offline (envs/alfworld_gen.py, cached) with 3 objects
and 3 receptacles, gold runs of 4-5 steps, each episode given 2x its game's optimal steps.
ALFWorld rewards only the win (sparse rewards, where the TextWorld demo has dense ones).

    jaxrl-eval  --config configs/alfworld_smollm2.py     # zero-shot: eval.json stage "base"
    jaxrl-train --config configs/alfworld_smollm2.py --config.sft.enabled=True \
        --config.rl.learning_rate=1e-5                    # base -> SFT -> PPO

Measured at seed 0 (docs/results.md, "A second task"): zero-shot 0.00 on 100 held-out games,
so PPO from the pretrained weights alone gets no reward to follow under the sparse reward
(its first 8 episodes won none); SFT on 50 golden trajectories reaches 0.26, PPO after it
0.29.
"""

from configs.textworld_smollm2 import get_config as textworld_smollm2


def get_config():
    c = textworld_smollm2()
    c.name = "alfworld_smollm2"
    c.env.family = "alfworld"
    c.env.name = "pick_and_place_simple"  # one of the six ALFWorld task types
    c.env.size = 3  # objects and receptacles per game
    c.env.num_eval_tasks = 100  # held-out games of the same type (eval split)
    c.env.reward_density = "sparse"  # what ALFWorld gives: 1 on the winning step
    c.env.max_steps = 0  # the budget below decides
    c.budget.enabled = True  # each episode gets 2x its game's optimal steps (pinned)
    c.budget.min_factor = 2.0
    c.budget.max_factor = 2.0
    c.budget.on_mastered = "none"
    c.budget.env_max_steps = 20  # a backstop; pick_and_place_simple's budgets are 8-10
    return c
