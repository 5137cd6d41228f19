"""The standard pipeline at full size: Qwen2.5-7B-Instruct on a TextWorld curriculum.

SFT (lr 5e-6, batch 16, 3 epochs) on golden trajectories, then PPO with token-level GAE
(gamma 0.99, lambda 0.95), lr 1e-6 and a KL penalty of 0.1 against the SFT policy, 500
episodes per epoch. The curriculum decides every 5 epochs: promote above 75% success,
demote below 40%, through w2-o3-q4 -> w8-o3-q4 (more rooms) -> w2-o12-q4 (more objects)
-> w4-o6-q8 (longer quests). Sized for a TPU slice with FSDP over all chips: check with
`jaxrl-plan --config configs/qwen2_5_7b_textworld.py --device v4-8`.
"""

from configs.base import get_config as base_config

HF_PATH = "Qwen/Qwen2.5-7B-Instruct"


def get_config():
    c = base_config()
    c.name = "qwen2_5_7b_textworld"
    c.model.hf_path = HF_PATH
    c.tokenizer.path = HF_PATH
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "bfloat16"
    c.model.remat = "full"  # keep only each layer's input for the backward pass
    c.model.scan_layers = True  # one compiled layer; remat is honoured per scanned layer
    c.mesh.data = 1
    c.mesh.fsdp = -1  # parameters, optimizer state and batch over every chip
    c.mesh.tensor = 1
    c.env.family = "textworld"
    c.env.name = "w2-o3-q4"  # the first curriculum stage
    c.rollout.episodes_per_batch = 32
    c.rollout.max_context = 4096  # later stages have longer quests
    c.rollout.length_buckets = (1024, 2048, 3072, 4096)
    c.sft.learning_rate = 5e-6
    c.sft.batch_size = 16
    c.sft.epochs = 3
    c.sft.grad_accum = 16  # one row a micro-batch: SFT's batch is not split over chips
    c.sft.optimizer_state = "int8"  # float32 moments alone take 7.1 GiB a v5e chip
    c.algo.estimator = "gae"
    c.algo.gamma = 0.99
    c.algo.lam = 0.95
    c.kl.coef = 0.1
    c.rl.learning_rate = 1e-6
    c.rl.episodes_per_epoch = 500
    c.rl.epochs = 20  # four curriculum decisions
    c.rl.minibatch_size = 16
    c.rl.logits_chunk = 512  # 152k-token vocabulary: never all [rows, T, V] logits at once
    c.rl.grad_accum = 2  # 8-row micro-batches: one 4096-token row per chip on v5e-8
    c.curriculum.enabled = True
    c.curriculum.stages = ("w2-o3-q4", "w8-o3-q4", "w2-o12-q4", "w4-o6-q8")
    c.curriculum.promote_above = 0.75
    c.curriculum.demote_below = 0.40
    c.curriculum.eval_every_epochs = 5
    return c
