"""Every default of jaxrl-agents, each with a comment. Experiment files import
`get_config()` and change only what differs; the returned ConfigDict is locked, so a
misspelt key is an error rather than a silent new field."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "run"  # run name: outputs go to <output_dir>/<name>/
    c.output_dir = "runs"  # parent folder of run directories
    c.seed = 0  # master seed: model init, sampling, env seeds, data order
    # the planned peak (jaxrl-plan) against a device's memory (CPU: the host's available)
    c.memory_check = True  # stop at start when it is over 1.1x; False: start anyway

    # --- model: the policy (Qwen2 / Llama family decoder) -----------------------------
    c.model = ml_collections.ConfigDict()
    # A .gguf file (or a dir with one) and a GGUF preset such as "smollm2-135m-instruct"
    # are converted once into a cached HF checkpoint (jaxrl_agents/models/gguf_import.py).
    c.model.hf_path = ""  # HF checkpoint dir, hub id or GGUF; "" builds from the fields below
    c.model.vocab_size = 512  # tokens in the vocabulary
    c.model.hidden_size = 128  # width of the residual stream (D)
    c.model.intermediate_size = 384  # SwiGLU hidden width
    c.model.num_layers = 4  # decoder blocks
    c.model.num_heads = 4  # query heads
    c.model.num_kv_heads = 2  # key/value heads (GQA; 1 = multi-query)
    c.model.head_dim = 32  # width of one attention head
    c.model.rope_theta = 10000.0  # RoPE base frequency
    c.model.rms_norm_eps = 1e-6  # RMSNorm epsilon
    c.model.tie_embeddings = True  # output projection shares the token embedding
    c.model.qkv_bias = False  # bias on q/k/v projections (True for Qwen2)
    c.model.max_position_embeddings = 2048  # longest position the model is used at
    c.model.dtype = "float32"  # compute dtype: float32 | bfloat16
    c.model.param_dtype = "float32"  # parameter storage dtype: float32 | bfloat16
    c.model.remat = "none"  # per-layer rematerialisation: none | full | dots
    c.model.scan_layers = False  # scan over layers (compile time independent of depth)
    c.model.critic = "head"  # value: head (policy trunk) | detached (no grad to trunk) | separate
    # LoRA: with rank > 0 only the adapters (and the value head) train; the base weights stay
    # frozen, the KL reference is the base with adapters off, exports merge them in.
    c.model.lora = ml_collections.ConfigDict()
    c.model.lora.rank = 0  # adapter rank r; 0 = off (every weight trains)
    c.model.lora.alpha = 16.0  # an adapter adds (alpha / rank) * B @ A to its weight
    c.model.lora.dropout = 0.0  # dropout on the adapters' input: only 0.0 is supported
    c.model.lora.targets = ("q", "k", "v", "o", "gate", "up", "down")  # adapted projections

    # --- mesh: device layout; -1 means "all remaining devices" ---------------------------
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # pure data parallelism
    c.mesh.fsdp = 1  # parameters and optimizer state sharded, batch split too
    c.mesh.tensor = 1  # attention heads and MLP width sharded

    # --- distributed: multi-host runs, one JAX process per host (jax.distributed) ----------
    c.distributed = ml_collections.ConfigDict()
    c.distributed.enabled = "auto"  # auto (an address below / JAX_* env / TPU pod) | true | false
    c.distributed.coordinator_address = ""  # host:port of process 0; "" = $JAX_COORDINATOR_ADDRESS
    c.distributed.num_processes = 0  # processes in the run; 0 = $JAX_NUM_PROCESSES or auto-detect
    c.distributed.process_id = -1  # this process's index; -1 = $JAX_PROCESS_ID or auto-detect

    # --- tokenizer ---------------------------------------------------------------------
    c.tokenizer = ml_collections.ConfigDict()
    c.tokenizer.path = ""  # HF tokenizer dir, or as model.hf_path; "" trains a BPE on env text
    c.tokenizer.vocab_size = 512  # size of a trained tokenizer
    c.tokenizer.chat_template = "chat"  # chat (tokenizer's template) | plain
    c.tokenizer.system_prompt = ""  # episodes' first message; "" = rollout.DEFAULT_SYSTEM_PROMPT

    # --- rollout: sampling actions --------------------------------------------------------
    c.rollout = ml_collections.ConfigDict()
    c.rollout.episodes_per_batch = 32  # episodes collected in lock-step per update
    c.rollout.group_size = 1  # samples per task instance (RLOO / GRPO groups)
    c.rollout.temperature = 1.0  # sampling temperature (0 = greedy); RL trains softmax(logits/T)
    c.rollout.top_p = 1.0  # nucleus sampling mass
    c.rollout.top_k = 0  # top-k sampling (0 = off)
    c.rollout.max_action_tokens = 16  # an action is cut after this many tokens
    c.rollout.max_context = 1024  # an episode whose context would pass this is truncated
    c.rollout.stop_strings = ("\n",)  # an action ends at any of these
    # Also sets SFT's loss: each action token's likelihood among the ids the offered commands
    # allow there (measured apart from play on SmolLM2: docs/results.md, "The free-text arm").
    c.rollout.constrain_actions = False  # sample actions only among the env's offered commands
    # greedy play (evaluation, temperature 0) under constrained decoding: "command" plays the
    # offered command of highest total log-probability, "token" the argmax token at each step
    c.rollout.greedy_by = "command"  # command | token (see above)
    c.rollout.choice_width = 64  # constrained decoding: a step with more candidate ids is free
    c.rollout.length_buckets = (128, 256, 512, 1024)  # padded lengths compiled for
    c.rollout.num_env_workers = 2  # EnvPool worker processes
    c.rollout.env_timeout_s = 30.0  # a worker call slower than this is killed and restarted

    # --- env: what the agent plays --------------------------------------------------------
    c.env = ml_collections.ConfigDict()
    c.env.family = "textworld"  # textworld | alfworld | code | toy
    c.env.name = "w2-o3-q4"  # family-specific task name (TextWorld wR-oO-qQ)
    c.env.size = 0  # alfworld: objects and receptacles; toy: n; 0 = the family's default
    c.env.num_train_tasks = 64  # distinct training task instances
    c.env.num_eval_tasks = 100  # held-out task instances (never trained on)
    c.env.eval_tasks = ()  # tasks ("family:name") only evaluated: held-out games, never trained on
    c.env.reward_density = "sparse"  # sparse | every_k | dense
    c.env.reward_k = 2  # every_k: release intermediate reward every k steps
    c.env.step_penalty = 0.0  # cost (>= 0) subtracted from every step's reward
    c.env.invalid_penalty = 0.0  # further cost (>= 0) subtracted for an invalid action
    c.env.max_steps = 0  # step budget per episode; 0 = 2x the task's optimal steps
    c.env.obs_format = "template"  # template | compact | compact_goal | raw (envs.base)

    # --- algo: the RL objective -------------------------------------------------------------
    c.algo = ml_collections.ConfigDict()
    # gae | turn_gae | bilevel_gae | rloo | grpo | reinforce_pp
    c.algo.estimator = "gae"  # advantage estimator: the table in jaxrl_agents/estimators.py
    c.algo.gamma = 0.99  # discount
    c.algo.lam = 0.95  # GAE lambda
    # estimator "gae" under constrained decoding: "discount" steps every action token with
    # gamma and lam; "pass_through" uses 1 and 1 after a forced token (one allowed id, no
    # decision), so a command is discounted per decision in it, not per token
    c.algo.gae_forced_tokens = "discount"  # discount | pass_through (see above)
    c.algo.clip_eps = 0.2  # PPO clip range
    c.algo.clip_eps_high = 0.0  # upper clip range; 0 = same as clip_eps
    c.algo.dual_clip = 0.0  # dual-clip constant for negative advantages; 0 = off
    c.algo.loss_agg = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean
    c.algo.value_clip = 0.2  # clip range of the value loss; 0 = off
    c.algo.value_coef = 0.5  # weight of the value loss
    c.algo.entropy_coef = 0.0  # weight of the entropy bonus
    c.algo.grpo_std_normalize = True  # GRPO: divide by the group's std
    c.algo.normalize_advantages = True  # whiten advantages over the batch's action tokens
    # tokens the policy loss, entropy, KL terms and their metrics count: "decisions" (action
    # tokens drawn from more than one allowed id; every action token when unconstrained) or
    # "actions" (every action token, forced ones too: they carry no gradient, only weight)
    c.algo.loss_tokens = "decisions"  # decisions | actions (see above)
    c.algo.bootstrap_truncated = False  # True: an episode cut by budget/context ends with V, not 0
    c.algo.token_gamma = 1.0  # bilevel_gae: discount between tokens of one turn
    c.algo.token_lam = 1.0  # bilevel_gae: GAE lambda between tokens of one turn
    c.algo.score_gamma = 1.0  # rloo / grpo: per-turn discount of the episode score (1 = sum)
    c.algo.group_filter_keep = 1.0  # share of task groups kept (highest reward std); 1 = all
    c.algo.diversity_bonus = 0.0  # reward added to an action not yet taken in its episode

    # --- kl: penalty against the frozen reference policy ------------------------------------
    c.kl = ml_collections.ConfigDict()
    c.kl.coef = 0.1  # KL coefficient (final value for warmup)
    c.kl.kind = "k1"  # estimator: k1 | k2 | k3
    c.kl.where = "reward"  # reward (per-token penalty) | loss (added to the policy loss)
    c.kl.controller = "fixed"  # fixed | adaptive | warmup
    c.kl.target = 0.05  # adaptive: target KL per token
    c.kl.horizon = 10000  # adaptive: tokens over which the coefficient adapts
    c.kl.warmup_start = 0.01  # warmup: coefficient at the start
    c.kl.warmup_updates = 100  # warmup: updates to reach `coef`

    # --- pretrain: language-model pretraining of a model trained from scratch (demos) ----
    c.pretrain = ml_collections.ConfigDict()
    c.pretrain.episodes_per_task = 0  # random-play transcripts per train task to LM on; 0 = off
    c.pretrain.epochs = 2  # passes over the random-play transcripts
    c.pretrain.learning_rate = 1e-3  # Adam learning rate
    c.pretrain.batch_size = 16  # transcripts per step
    c.pretrain.grad_accum = 1  # micro-batches per step (same step, 1/k of the activations)

    # --- sft: supervised fine-tuning on golden trajectories ------------------------------
    c.sft = ml_collections.ConfigDict()
    c.sft.enabled = True  # run SFT before RL
    c.sft.num_trajectories = 50  # golden trajectories to train on
    c.sft.learning_rate = 5e-6  # Adam learning rate
    c.sft.batch_size = 16  # trajectories per step
    c.sft.grad_accum = 1  # micro-batches per step (same step, 1/k of the activations)
    c.sft.optimizer_state = "float32"  # Adam moments: float32 | int8 (as rl.optimizer_state)
    c.sft.epochs = 3  # passes over the training split
    c.sft.val_fraction = 0.2  # share held out for validation loss
    c.sft.keep_best = True  # end SFT with the epoch of lowest validation loss
    c.sft.eval_games = 20  # held-out games played after SFT (success rate); 0 = none
    c.sft.eval_every_epochs = 0  # also play them every k SFT epochs (early report); 0 = off

    # --- rl: the outer RL loop ---------------------------------------------------------------
    c.rl = ml_collections.ConfigDict()
    c.rl.learning_rate = 1e-6  # policy Adam learning rate
    c.rl.critic_learning_rate = 1e-5  # critic Adam learning rate
    c.rl.logits_chunk = 0  # logits made this many positions at a time (0 = all; big vocabularies)
    # The policy's first k layers and the token embedding stay as they are in RL: their
    # output is computed once per update and the gradient steps run only the layers above.
    # Needs a value head on the policy's trunk, no LoRA.
    c.rl.frozen_layers = 0  # layers kept fixed in RL (0 = every layer trains)
    c.rl.lr_schedule = "constant"  # constant | linear | step_decay (x0.9 every 200 episodes)
    c.rl.episodes_per_epoch = 500  # episodes in one RL epoch
    c.rl.epochs = 1  # RL epochs
    c.rl.ppo_epochs = 2  # passes over each collected batch
    c.rl.minibatch_size = 16  # episodes per gradient step
    c.rl.grad_accum = 1  # micro-batches accumulated per minibatch
    c.rl.max_grad_norm = 1.0  # global gradient-norm clip
    c.rl.optimizer_state = "float32"  # Adam moments: float32 | int8 (block-wise 8-bit, ~4x less)
    c.rl.master_weights = "none"  # none | float32 (optimizer steps an f32 copy of bf16 params)
    c.rl.reward_scale = 1.0  # rewards are multiplied by this
    c.rl.reward_norm = False  # divide rewards by a running std of returns
    c.rl.reward_clip = 0.0  # clip rewards to [-x, x]; 0 = off
    c.rl.value_warmup_updates = 0  # updates that train only the critic
    c.rl.exclude_sft_tasks = False  # RL draws only train tasks whose gold run SFT did not use
    c.rl.eval_every = 10  # evaluate on held-out tasks every k updates
    c.rl.eval_base = True  # with model.hf_path: play the pretrained weights first ("base")

    # --- reward: where the per-turn reward comes from (jaxrl_agents/rewards.py) ---------------
    # The result is then scaled, normalised and clipped by rl.reward_scale / reward_norm /
    # reward_clip (reward_clip = 1.0 clips to [-1, 1]).
    c.reward = ml_collections.ConfigDict()
    c.reward.source = "verified"  # verified (env's own) | binary (1 if won) | learned | weighted
    c.reward.source_weights = ml_collections.ConfigDict()  # used by source = weighted
    c.reward.source_weights.verified = 0.5  # weight of the environment's own reward
    c.reward.source_weights.binary = 0.0  # weight of 1-if-won on the last turn
    c.reward.source_weights.learned = 0.5  # weight of the reward model's reward
    c.reward.mix = "none"  # none | code (CODE_MIX: +tests, style) | text (TEXT_MIX: +progress)
    c.reward.model_path = ""  # reward model directory (jaxrl_agents/reward_model.py) if learned
    c.reward.dump_trajectories = False  # append episodes + labels to <run>/trajectories.jsonl

    # --- curriculum over environment complexity --------------------------------------------
    c.curriculum = ml_collections.ConfigDict()
    c.curriculum.enabled = False  # move through `stages` by success rate
    c.curriculum.stages = ("w2-o3-q4",)  # ordered task names, easiest first
    c.curriculum.promote_above = 0.75  # promote when success exceeds this
    c.curriculum.demote_below = 0.40  # demote when success falls under this
    c.curriculum.eval_every_epochs = 5  # epochs between curriculum decisions
    c.curriculum.replay_share = 0.10  # share of every batch drawn from earlier stages
    c.curriculum.eval_past_every_epochs = 10  # held-out eval of all stages reached; 0 = off
    c.curriculum.ewc_coef = 0.0  # EWC penalty on leaving a stage (diagonal Fisher); 0 = off
    c.curriculum.ewc_decay = 1.0  # weight kept by earlier stages' Fisher at each new stage

    # --- budget: per-task step budgets adapted to success (see trainer/budget.py) -----------
    c.budget = ml_collections.ConfigDict()
    c.budget.enabled = False  # the driver ends each episode at its task's budget
    c.budget.start_factor = 2.0  # first budget: this x the instance's optimal steps
    c.budget.adjust = 0.25  # relative budget change at each adjustment (+25% / -25%)
    c.budget.adjust_every_epochs = 10  # epochs between adjustments
    c.budget.grow_below = 0.3  # a task whose success is under this gets more steps
    c.budget.shrink_above = 0.7  # a task whose success is over this gets fewer steps
    c.budget.min_factor = 1.0  # smallest budget, x optimal steps
    c.budget.max_factor = 6.0  # largest budget, x optimal steps
    c.budget.env_max_steps = 200  # the envs' own step limit while budgets are on (a backstop)
    c.budget.retire_above = 0.8  # a task is mastered above this success ...
    c.budget.retire_after = 3  # ... at this many adjustments in a row
    c.budget.on_mastered = "retire"  # harder (budget to min_factor) | retire (out of mixing) | none

    # --- mixing: several task families / types in one run (see trainer/mixing.py) -----------
    c.mixing = ml_collections.ConfigDict()
    c.mixing.enabled = False  # draw batches from `tasks` by `weights`
    c.mixing.tasks = ()  # "family:name" or "name" (env.family); "-N" sets toy/alfworld size
    c.mixing.weights = ()  # sampling weight of each of `tasks`; () = equal weights
    c.mixing.core_share = 0.25  # share of every batch kept for the core task (env.* or stage)

    # --- action_space: staged verbs and compound actions (text games) ----------------------
    c.action_space = ml_collections.ConfigDict()
    c.action_space.staging = False  # offer only `initial_verbs` first, more at each stage
    c.action_space.initial_verbs = ("go", "take", "open", "close", "put", "insert",  # stage 0
                                    "examine", "look", "inventory", "drop")  # fmt: skip
    c.action_space.growth = 0.2  # a stage adds at most this share of the allowed verbs
    c.action_space.advance_above = 0.75  # next stage when training success exceeds this
    c.action_space.advance_every_epochs = 1  # epochs between decisions to advance
    c.action_space.compound_actions = 0  # "a ; b" runs up to this many commands in a turn; 0 = off

    # --- monitor: warnings when a run degenerates -------------------------------------------
    c.monitor = ml_collections.ConfigDict()
    c.monitor.enabled = True  # compute the monitors and print / log their warnings
    c.monitor.entropy_collapse = 0.1  # warn: action entropy under this share of its first value
    c.monitor.coverage_min = 0.05  # warn: admissible-command coverage under this
    c.monitor.repeat_max = 0.5  # warn: share of actions repeating one of their episode over this
    c.monitor.return_var_min = 1.0  # warn: variance of episode returns under this
    c.monitor.return_var_max = 10.0  # warn: variance of episode returns over this
    c.monitor.kl_max = 0.5  # warn: KL to the reference policy (per action token) over this

    # --- logging -----------------------------------------------------------------------------
    c.logging = ml_collections.ConfigDict()
    c.logging.tensorboard = True  # write TensorBoard event files
    c.logging.jsonl = True  # write metrics.jsonl
    c.logging.progress_bar = True  # live tqdm bar with the main figures
    c.logging.plots = True  # PNG learning curves at the end

    # --- checkpointing -----------------------------------------------------------------------
    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 10  # save every k updates (0 = only at the end)
    c.checkpoint.keep = 3  # latest checkpoints kept; step 0 (after SFT) is kept as well

    c.lock()
    return c
