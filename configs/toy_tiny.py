"""A minute-scale run on the toy counting game: the trainer's end-to-end smoke test."""

from configs.base import get_config as base_config


def get_config():
    c = base_config()
    c.name = "toy_tiny"
    c.env.family = "toy"
    c.env.name = "count"  # say the next number, n turns
    c.env.size = 3
    c.env.num_train_tasks = 32
    c.env.num_eval_tasks = 32
    c.env.reward_density = "dense"
    c.tokenizer.vocab_size = 800
    c.model.hidden_size = 64
    c.model.intermediate_size = 128
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.num_kv_heads = 1
    c.model.head_dim = 32
    c.model.max_position_embeddings = 512
    c.rollout.episodes_per_batch = 16
    c.rollout.max_action_tokens = 4
    c.rollout.max_context = 512
    c.rollout.length_buckets = (256, 512)
    c.rollout.num_env_workers = 1
    c.sft.num_trajectories = 32
    c.sft.learning_rate = 3e-3
    c.sft.batch_size = 8
    c.sft.epochs = 15
    c.rl.learning_rate = 1e-3
    c.rl.critic_learning_rate = 1e-3
    c.rl.episodes_per_epoch = 64
    c.rl.minibatch_size = 8
    c.rl.ppo_epochs = 2
    c.rl.eval_every = 0
    c.checkpoint.every = 2
    c.kl.coef = 0.01
    return c
