"""SFT then RL vs pure SFT vs pure RL on the TextWorld demo (the paper's claim 4).

Pure SFT is the "after SFT" evaluation of the sft_rl runs. The rl_only runs skip SFT and
language-model pretraining (they start from random weights and the trained tokenizer, as
the three measured seeds did: before commit a5d1e11, 2026-12-04, the trainer ran
pretraining only before SFT) and get its 50 golden episodes' worth of extra RL episodes
(384 = 12 updates of 32 against 50 + 320), so both arms see at least as many episodes.

jaxrl-sweep --sweep configs/sweeps/textworld_sft_rl.py --parallel 2
"""


def get_sweep():
    runs = []
    for seed in (0, 1, 2):
        runs.append({"name": f"sft_rl,seed={seed}", "seed": seed})
        runs.append(
            {
                "name": f"rl_only,seed={seed}",
                "seed": seed,
                "sft.enabled": False,
                "pretrain.episodes_per_task": 0,
                "rl.episodes_per_epoch": 384,
            }
        )
    return {"name": "textworld_sft_rl", "config": "configs/textworld_tiny.py", "runs": runs}
