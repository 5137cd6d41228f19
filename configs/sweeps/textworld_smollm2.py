"""The real-model recipe (`make demo`, configs/textworld_smollm2.py) over seeds 0, 1, 2:
SFT then PPO, and PPO from the pretrained model without SFT. Every run plays its 100
held-out games at base (zero-shot) and after each of its stages, so the table reads base,
SFT, PPO, SFT + PPO. A run takes about 1.5 hours on a 2-core CPU at about 11 GiB resident;
two ran in parallel on a 24 GiB machine (11.0 GiB peak each, 2026-12-05).

jaxrl-sweep --sweep configs/sweeps/textworld_smollm2.py --parallel 2
"""


def get_sweep():
    runs = []
    for seed in (0, 1, 2):
        runs.append({"name": f"sft_ppo,seed={seed}", "seed": seed})
        runs.append({"name": f"ppo_only,seed={seed}", "seed": seed, "sft.enabled": False})
    return {"name": "textworld_smollm2", "config": "configs/textworld_smollm2.py", "runs": runs}
