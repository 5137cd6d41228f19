"""The simplified recipe at full size: Qwen2.5-1.5B-Instruct on TextWorld w2-o3-q4.

SFT on 50 golden trajectories, then PPO (token-level GAE, critic head) for 1000 episodes at
lr 3e-6, decayed 10% every 200 episodes; episodes of at most 8 steps; medium reward density
(intermediate reward released every k steps). Weights and tokenizer come from the Hugging Face
hub id below (or a local copy of it: --config.model.hf_path=DIR --config.tokenizer.path=DIR).
Sized for a TPU slice with FSDP over all chips: check with
`jaxrl-plan --config configs/qwen2_5_1_5b_textworld.py --device v5e-8`.
"""

from configs.base import get_config as base_config

HF_PATH = "Qwen/Qwen2.5-1.5B-Instruct"


def get_config():
    c = base_config()
    c.name = "qwen2_5_1_5b_textworld"
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
    c.env.name = "w2-o3-q4"
    c.env.reward_density = "every_k"  # medium density
    c.env.max_steps = 8
    c.rollout.episodes_per_batch = 32
    c.rollout.max_context = 2048
    c.rollout.length_buckets = (512, 1024, 1536, 2048)
    c.sft.num_trajectories = 50
    c.sft.grad_accum = 8  # 2-row micro-batches: SFT's batch is not split over chips
    c.rl.learning_rate = 3e-6
    c.rl.lr_schedule = "step_decay"  # x0.9 every 200 episodes
    c.rl.episodes_per_epoch = 1000
    c.rl.logits_chunk = 512  # 152k-token vocabulary: never all [rows, T, V] logits at once
    c.rl.epochs = 1
    c.rl.eval_every = 8  # every 256 episodes
    return c
