"""The supervised phases before RL, each one `SFTTrainer` fit with a progress bar and logs:

    run_pretrain(cfg, policy, driver, heads, key, logger, pad_id)      # LM pretraining
    run_sft(cfg, policy, driver, heads, logger, pad_id, evaluate)      # SFT on gold play

policy: the policy modules (trained in place). driver: a group-size-1 episode driver.
heads: one env id per train task (`EnvLayout.train_task_heads`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax

from jaxrl_agents.trainer.sft import SFTTrainer


def run_pretrain(cfg, policy, driver, heads: Sequence[int], key, logger, pad_id: int) -> dict:
    """Language modelling (every token) on transcripts of random admissible commands
    played on the train tasks: a from-scratch model learns the text and the format
    before SFT. No gold action is used. Returns the fit's history and transcript count."""
    trajs = []
    rounds = cfg.pretrain.episodes_per_task
    with logger.phase("pretraining transcripts", rounds * len(heads), "game") as advance:
        for r in range(rounds):
            round_key = jax.random.fold_in(jax.random.fold_in(key, r), 2)
            trajs += driver.run(heads, round_key, forced_actions="random")
            advance(len(heads))
    logger.write(f"Pretraining on {len(trajs)} random-play transcripts")
    trainer = SFTTrainer(
        policy, learning_rate=cfg.pretrain.learning_rate,
        batch_size=cfg.pretrain.batch_size, epochs=cfg.pretrain.epochs, val_fraction=0.1,
        seed=cfg.seed, keep_best=False, target="all", max_grad_norm=cfg.rl.max_grad_norm,
        pad_id=pad_id, length_buckets=cfg.rollout.length_buckets,
        grad_accum=cfg.pretrain.grad_accum)

    def on_epoch(row):
        logger.log(0, {f"pretrain/{k}": v for k, v in row.items()})
        logger.write(f"  pretraining epoch {row['epoch']}: train {row['train_loss']:.4f} "
                     f"val {row.get('val_loss', float('nan')):.4f}")

    with logger.phase("pretraining", trainer.num_steps(len(trajs)), "step") as advance:
        history = trainer.fit(trajs, on_epoch=on_epoch, on_step=advance)
    return {"history": history, "transcripts": len(trajs)}


def run_sft(cfg, policy, driver, heads: Sequence[int], logger, pad_id: int,
            evaluate: Callable[..., dict]) -> dict:
    """SFT on the won gold-action episodes of the first `sft.num_trajectories` train
    tasks. evaluate(stage, step=, limit=): a held-out evaluation (`Evaluator.evaluate`
    with the logger bound), run every `sft.eval_every_epochs` epochs and at the end on
    `sft.eval_games` games. Returns the final evaluation with the fit's history."""
    heads = heads[: cfg.sft.num_trajectories]
    gold = [t for t in driver.run(heads, forced_actions="gold") if t.won]
    logger.write(f"SFT on {len(gold)} golden trajectories (of {len(heads)} tasks)")
    trainer = SFTTrainer.from_config(cfg, policy, pad_id=pad_id)

    every = cfg.sft.eval_every_epochs

    def on_epoch(row):
        line = (f"  SFT epoch {row['epoch']}: train {row['train_loss']:.4f} "
                f"val {row.get('val_loss', float('nan')):.4f}")
        if every and cfg.sft.eval_games and row["epoch"] % every == 0:
            early = evaluate("sft_epoch", step=row["epoch"], limit=cfg.sft.eval_games)
            row["eval_success"] = early["mean"]
            line += f" held-out success {early['mean']:.3f} ({early['n']} games)"
        logger.log(0, {f"sft/{k}": v for k, v in row.items()})
        logger.write(line)

    with logger.phase("SFT", trainer.num_steps(len(gold)), "step") as advance:
        history = trainer.fit(gold, on_epoch=on_epoch, on_step=advance)
    result = evaluate("sft", limit=cfg.sft.eval_games) if cfg.sft.eval_games else {}
    result["history"] = history
    return result
