"""ALFWorld: training on a mix of the six task types vs on one type, tested on each type
(the paper's claim 5); three seeds each, six runs of configs/alfworld_tiny.py.

`single` trains on pick_and_place_simple only; `mix` draws every batch from the six types
with equal weights (no core share) and has 11 training games per type (66 in all against
single's 64), so both arms get about as many distinct training games, LM pretraining
transcripts and golden trajectories (50; mix: 8-9 per type) and the same 320 RL episodes.
Both play the 50 held-out games of every type after SFT and after RL (`env.eval_tasks`):
eval.json holds "sft:<task>" / "rl:<task>" per type, and "sft" / "rl" over all 300 games.
The tokenizer is trained on each run's training games, so single's has seen one type's text.

One run needs about 12 GB, so the runs go one after the other:

jaxrl-sweep --sweep configs/sweeps/alfworld_mix.py
"""

from envs.alfworld_tasks import TASK_TYPES

MIX = {
    "mixing.enabled": True,
    "mixing.tasks": TASK_TYPES,
    "mixing.core_share": 0.0,
    "env.num_train_tasks": 11,
}


def get_sweep():
    runs = []
    for seed in (0, 1, 2):
        runs.append({"name": f"single,seed={seed}", "seed": seed})
        runs.append({"name": f"mix,seed={seed}", "seed": seed, **MIX})
    return {
        "name": "alfworld_mix",
        "config": "configs/alfworld_tiny.py",
        "overrides": {"env.eval_tasks": TASK_TYPES},
        "runs": runs,
    }
