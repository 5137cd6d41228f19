"""The main demo (`make demo`): TextWorld w2-o3-q4 on a laptop CPU.

Games are generated with TextWorld's own generator and cached; train and held-out games
come from disjoint splits. A byte-level BPE tokenizer is trained on the games' text, a
few-million-parameter decoder is trained from scratch: SFT on 50 golden trajectories,
then PPO with GAE and a critic head, 8 steps per episode, dense rewards.
"""

from configs.base import get_config as base_config


def get_config():
    c = base_config()
    c.name = "textworld_tiny"
    c.env.family = "textworld"
    c.env.name = "w2-o3-q4"
    c.env.num_train_tasks = 64
    c.env.num_eval_tasks = 100
    c.env.reward_density = "dense"  # every score change is rewarded
    c.env.max_steps = 8
    c.tokenizer.vocab_size = 1024
    c.model.vocab_size = 1024
    c.model.hidden_size = 128
    c.model.intermediate_size = 384
    c.model.num_layers = 4
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.head_dim = 32
    c.model.max_position_embeddings = 4096
    c.rollout.episodes_per_batch = 32
    c.rollout.max_action_tokens = 12
    c.rollout.max_context = 2048
    c.rollout.length_buckets = (768, 1024, 1536, 2048)
    c.rollout.num_env_workers = 2
    c.sft.num_trajectories = 50
    c.sft.learning_rate = 1e-3  # from scratch: far above the fine-tuning default
    c.sft.batch_size = 10
    c.sft.epochs = 30
    c.sft.eval_games = 100
    c.rl.learning_rate = 1e-4
    c.rl.episodes_per_epoch = 320
    c.rl.minibatch_size = 16
    c.rl.ppo_epochs = 2
    c.rl.eval_every = 0
    c.kl.coef = 0.01
    c.checkpoint.every = 5
    return c
