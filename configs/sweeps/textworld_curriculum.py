"""A curriculum from w2-o3-q4 vs training directly on w4-o6-q8 (the paper's claim 1), three
seeds each, six runs of configs/textworld_tiny.py (the demo's recipe).

Both arms are tested on the 100 held-out w4-o6-q8 games (`env.name`); `curriculum` also
plays the held-out w2-o3-q4 games, so its eval.json holds "sft:<task>" / "rl:<task>" per
stage and "sft" / "rl" over both; the report compares the arms on the w4-o6-q8 entries
(`report_task`).

- `direct` trains on w4-o6-q8 only: LM pretraining, SFT on 50 golden trajectories, then RL.
- `curriculum` plays the stages w2-o3-q4 then w4-o6-q8, promoted above 75% training
  success and demoted below 40% (the recipe's thresholds), decided after every RL epoch
  of 64 episodes, with 10% of each batch replaying the earlier stage. Its pretraining and
  golden trajectories come from both stages' training games (25 golden each).

Both arms get 12 RL updates of 32 episodes (`rl.epochs` x `rl.episodes_per_epoch`).
w4-o6-q8 quests take 8 moves, so episodes get 16 steps and up to 4096 tokens of context;
a minibatch of 16 episodes goes through the learner as 4 micro-batches of 4
(`jaxrl-plan` puts the training step's peak at ~6.3 GiB with that, against ~25 GiB
without); language-model pretraining and SFT are split the same way
(`pretrain.grad_accum`, `sft.grad_accum`; the plan's peak is then 7.7 GiB). One run is
several times the demo's cost (longer episodes, twice the steps): 77 min for the first
one on a 2-core CPU; one at a time:

jaxrl-sweep --sweep configs/sweeps/textworld_curriculum.py
"""

STAGES = ("w2-o3-q4", "w4-o6-q8")

LONG_EPISODES = {
    "env.name": "w4-o6-q8",
    "env.max_steps": 16,
    "rollout.max_context": 4096,
    "rollout.length_buckets": (512, 1024, 1536, 2048, 3072, 4096),
    "rl.grad_accum": 4,
    # Pretraining's 16 transcripts of up to 4096 tokens reached 18.4 GB resident in the
    # seed-0 runs (2026-12-04), made before commit 54b2075 added these two lines; the steps
    # are the same.
    "pretrain.grad_accum": 4,
    "sft.grad_accum": 2,
    "rl.episodes_per_epoch": 64,
    "rl.epochs": 6,
}

CURRICULUM = {
    "curriculum.enabled": True,
    "curriculum.stages": STAGES,
    "curriculum.eval_every_epochs": 1,
    "curriculum.eval_past_every_epochs": 0,
    # Held-out play after SFT takes the first sft.eval_games held-out games, the stages in
    # turn: 200 gives 100 of each, as the final evaluation (every held-out game) does.
    "sft.eval_games": 200,
}


def get_sweep():
    runs = []
    for seed in (0, 1, 2):
        runs.append({"name": f"direct,seed={seed}", "seed": seed})
        runs.append({"name": f"curriculum,seed={seed}", "seed": seed, **CURRICULUM})
    return {
        "name": "textworld_curriculum",
        "config": "configs/textworld_tiny.py",
        "overrides": LONG_EPISODES,
        "runs": runs,
        "report_task": "textworld:w4-o6-q8",  # the table and chart compare the arms there
    }
