"""The real-model recipe (`make demo`, configs/textworld_smollm2.py) over seeds 0, 1, 2:
PPO from the pretrained model (the recipe as it is), and SFT on 50 golden trajectories
then PPO at the smaller RL learning rate that arm takes. Every run plays its 100 held-out
games at base (zero-shot) and after each of its stages, so the table reads base, SFT, PPO,
SFT + PPO. A PPO-only run took 1 h 40 min and an SFT + PPO run about 2.5 hours on a 2-core
CPU beside one or two other runs (6.8 and 10.3 GiB peak; docs/results.md).

jaxrl-sweep --sweep configs/sweeps/textworld_smollm2.py --parallel 2
"""


def get_sweep():
    runs = []
    for seed in (0, 1, 2):
        runs.append({"name": f"ppo_only,seed={seed}", "seed": seed})
        runs.append({"name": f"sft_ppo,seed={seed}", "seed": seed, "sft.enabled": True,
                     "rl.learning_rate": 1e-5})
    return {"name": "textworld_smollm2", "config": "configs/textworld_smollm2.py", "runs": runs}
