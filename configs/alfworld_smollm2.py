"""The main demo's recipe on a second task: SmolLM2-135M-Instruct on generated ALFWorld games
of one task type (pick_and_place_simple), from the pretrained weights; run with its SFT arm
(below: the sparse reward gives PPO alone nothing to follow at zero-shot success 0).

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

from configs.alfworld_tiny import use_alfworld_games
from configs.textworld_smollm2 import get_config as textworld_smollm2


def get_config():
    c = use_alfworld_games(textworld_smollm2())
    c.name = "alfworld_smollm2"
    c.env.num_eval_tasks = 100  # held-out games of the same type (eval split)
    return c
