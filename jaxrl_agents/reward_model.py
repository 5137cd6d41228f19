"""A learned reward: our Transformer trunk with a scalar head that scores episodes or turns.

    rm = RewardModel.create(model_config, mode="episode")  # or RewardModel.from_policy(policy)
    history = rm.fit(trajectories, labels(trajectories, "won"), epochs=20)
    rm.save("runs/rm")                   # orbax, through jaxrl_agents.checkpoint
    rm = RewardModel.load("runs/rm")     # what reward.model_path points at
    rm.turn_scores(trajs)                # per episode: [N] P(success) at each turn's end
    rm.turn_rewards(trajs)               # per episode: [N] rewards summing to its score

The network is `models.value.Critic` (a trunk plus the scalar `ValueHead`); its output at
a token is a logit, and the score there is its sigmoid. It is scored at action tokens that
end a turn (`Trajectory.turn_ends`), where the reward of a turn sits:

- mode "episode": trained and scored at the last turn's end only; the score is the
  episode's reward, on its last turn.
- mode "turn": trained at every turn's end against the episode's label (so s_k estimates
  the chance of success given the episode up to turn k); turn k's reward is s_k - s_{k-1}
  (s_{-1} = 0), so the rewards again sum to the final score.

Loss: binary cross-entropy with labels in [0, 1] (won: 0/1; pass_share: a regression
target in [0, 1]), each episode weighted equally whatever its number of turns.

Labelled data come from earlier runs with `reward.dump_trajectories`: every update's
episodes are appended to <run>/trajectories.jsonl (jaxrl_agents.data.dump: one object per
episode with token ids, token types, turn ends and labels). The token ids
are those of that run's tokenizer: a reward model only makes sense with the same one
(pass that run's `tokenizer` folder as tokenizer.path to the runs that use it).

    python -m jaxrl_agents.reward_model --data runs/a/trajectories.jsonl --out runs/rm \\
        --tokenizer runs/a/tokenizer [--label won|pass_share] [--mode episode|turn] \\
        [--config configs/x.py]   # its `model` section sizes the trunk
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_agents import kernels
from jaxrl_agents.checkpoint import Checkpointer
from jaxrl_agents.data import Trajectory, pack
from jaxrl_agents.data.dump import LABELS, labels, read_jsonl
from jaxrl_agents.models import Critic, ModelConfig, Transformer, ValueHead
from jaxrl_agents.trainer import optim
from jaxrl_agents.trainer.fit import history_row, seeded_orders, split_train_val, train_epochs

MODES = ("episode", "turn")
_STEP = 0  # the one checkpoint step a saved reward model has
_CKPT, _META = "checkpoint", "reward_model.json"  # what a saved reward model folder holds


# ------------------------------------------------------------------------------ the model


def score_mask(trajs: Sequence[Trajectory], length: int, mode: str, rows: int | None = None):
    """[rows, length] float32: 1 at the positions scored in `mode` (every turn end, or the
    last one), 0 elsewhere; rows past len(trajs) are 0."""
    mask = np.zeros((rows or len(trajs), length), np.float32)
    for i, traj in enumerate(trajs):
        ends = list(traj.turn_ends)
        if not ends:
            continue
        mask[i, ends if mode == "turn" else ends[-1:]] = 1.0
    return mask


def rm_loss(graphdef, params, batch: dict):
    """Episode-weighted binary cross-entropy at the scored positions.

    batch: input_ids, positions, valid [B, T]; score_mask [B, T]; labels [B]; row_valid [B].
    loss = sum_b row_valid_b * mean_{t: mask_bt} BCE(sigmoid(logit_bt), label_b) / sum_b row_valid_b
    Returns (loss, metrics) with the accuracy of the last scored position of each row.
    """
    critic = nnx.merge(graphdef, params)
    logits = critic(batch["input_ids"], batch["positions"], batch["valid"])  # [B, T]
    mask = batch["score_mask"]
    labels_bt = jnp.broadcast_to(batch["labels"][:, None], logits.shape)
    bce = optax.sigmoid_binary_cross_entropy(logits, labels_bt)
    per_row = kernels.masked_mean(bce, mask, axis=1)  # [B]
    rows = batch["row_valid"] * (mask.sum(axis=1) > 0)
    loss = kernels.masked_mean(per_row, rows)
    last = jnp.argmax(jnp.where(mask > 0, jnp.arange(mask.shape[1]), -1), axis=1)  # [B]
    final = jnp.take_along_axis(logits, last[:, None], axis=1)[:, 0]
    correct = ((final > 0) == (batch["labels"] > 0.5)).astype(jnp.float32)
    return loss, {"loss": loss, "accuracy": kernels.masked_mean(correct, rows)}


def _train_step(graphdef, tx, state, batch):
    """One optimizer step on `batch`: state (params, opt_state) -> (state, metrics)."""
    params, opt_state = state
    (_, metrics), grads = jax.value_and_grad(functools.partial(rm_loss, graphdef), has_aux=True)(
        params, batch
    )
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), metrics


class RewardModel:
    """A `Critic` (trunk + scalar head) read as a success logit; see the module docstring."""

    def __init__(
        self,
        critic: Critic,
        config: ModelConfig,
        mode: str = "episode",
        *,
        batch_size: int = 16,
        length_buckets: Sequence[int] = (128, 256, 512, 1024),
        meta: dict | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"reward model mode {mode!r}; allowed: {list(MODES)}")
        self.critic, self.config, self.mode = critic, config, mode
        self.batch_size, self.length_buckets = batch_size, tuple(length_buckets)
        self.meta = dict(meta or {})
        self.graphdef, _ = nnx.split(critic)
        self._logits = jax.jit(
            lambda params, ids, pos, valid: nnx.merge(self.graphdef, params)(ids, pos, valid)
        )
        self._loss = jax.jit(functools.partial(rm_loss, self.graphdef))

    @classmethod
    def create(cls, config: ModelConfig, mode: str = "episode", *, seed: int = 0, **kw):
        """A freshly initialised trunk of `config` with a zero head (every score 0.5)."""
        trunk = Transformer(config, rngs=nnx.Rngs(params=seed))
        return cls(Critic(trunk, ValueHead(config.hidden_size)), config, mode, **kw)

    @classmethod
    def from_policy(cls, policy: Transformer, mode: str = "episode", **kw):
        """A trunk copied from `policy` (same tokenizer and sizes) with a zero head."""
        trunk = nnx.clone(policy)
        return cls(Critic(trunk, ValueHead(policy.config.hidden_size)), policy.config, mode, **kw)

    # -- arrays

    def _arrays(self, trajs: Sequence[Trajectory], targets=None) -> dict:
        too_big = max(int(t.tokens.max(initial=0)) for t in trajs)
        if too_big >= self.config.vocab_size:
            raise ValueError(
                f"token id {too_big} is past the reward model's vocabulary "
                f"({self.config.vocab_size}): was it trained with this tokenizer?"
            )
        batch = pack(trajs, length_buckets=self.length_buckets, row_multiple=self.batch_size)
        rows, length = batch.shape
        out = {
            "input_ids": batch.input_ids,
            "positions": batch.positions,
            "valid": batch.valid,
            "row_valid": batch.row_valid,
            "score_mask": score_mask(trajs, length, self.mode, rows),
        }
        out["labels"] = np.zeros(rows, np.float32)
        if targets is not None:
            out["labels"][: len(trajs)] = targets
        return {k: jnp.asarray(v) for k, v in out.items()}

    def _chunks(self, n: int):
        return (slice(i, min(i + self.batch_size, n)) for i in range(0, n, self.batch_size))

    # -- scoring

    def turn_scores(self, trajs: Sequence[Trajectory]) -> list[np.ndarray]:
        """Per episode: [N] float64 sigmoid scores at each turn's last action token."""
        params = nnx.state(self.critic)
        out = []
        for part in self._chunks(len(trajs)):
            chunk = list(trajs[part])
            arrays = self._arrays(chunk)
            logits = np.asarray(
                self._logits(params, arrays["input_ids"], arrays["positions"], arrays["valid"]),
                np.float64,
            )
            for i, traj in enumerate(chunk):
                ends = np.asarray(traj.turn_ends, np.int64)
                out.append(1.0 / (1.0 + np.exp(-logits[i, ends])))
        return out

    def episode_scores(self, trajs: Sequence[Trajectory]) -> np.ndarray:
        """[B]: the score at each episode's last turn end (0.5 for an episode of no turns)."""
        return np.array([s[-1] if s.size else 0.5 for s in self.turn_scores(trajs)])

    def turn_rewards(self, trajs: Sequence[Trajectory]) -> list[np.ndarray]:
        """Per episode: [N] learned rewards summing to its final score (module docstring)."""
        rewards = []
        for scores in self.turn_scores(trajs):
            if self.mode == "turn":
                rewards.append(np.diff(scores, prepend=0.0))
            else:
                last = np.zeros_like(scores)
                last[-1:] = scores[-1:]
                rewards.append(last)
        return rewards

    # -- training

    def fit(
        self,
        trajs: Sequence[Trajectory],
        targets,
        *,
        epochs: int = 10,
        learning_rate: float = 1e-3,
        val_fraction: float = 0.2,
        seed: int = 0,
        max_grad_norm: float = 1.0,
        on_epoch: Callable[[dict], None] | None = None,
    ) -> list[dict]:
        """Trains in place on (trajs, targets in [0, 1]); validation loss and accuracy
        (final score > 0.5 vs label > 0.5) every epoch. Returns the per-epoch history."""
        targets = np.asarray(targets, np.float32)
        if len(targets) != len(trajs) or not len(trajs):
            raise ValueError(f"{len(targets)} labels for {len(trajs)} episodes (need >= 1)")
        if targets.min() < 0 or targets.max() > 1:
            raise ValueError("reward model labels must lie in [0, 1]")
        pairs = [(t, y) for t, y in zip(trajs, targets) if t.num_turns]
        train, val = split_train_val(pairs, val_fraction, seed)
        tx = optim.adam(optax.constant_schedule(learning_rate), max_grad_norm)
        step = jax.jit(functools.partial(_train_step, self.graphdef, tx))
        params = nnx.state(self.critic)
        history = []

        def batch_of(rows, _):
            return self._arrays([train[j][0] for j in rows], [train[j][1] for j in rows])

        passes = train_epochs(step, (params, tx.init(params)),
                              order=seeded_orders(len(train), seed),
                              rows_per_step=self.batch_size, batch_of=batch_of,
                              num_epochs=epochs, fetch_metrics=True)
        for epoch, (params, _), metrics in passes:
            row = history_row(epoch, metrics, "loss", num_train=len(train), num_val=len(val))
            if val:
                row.update({f"val_{k}": v for k, v in self._evaluate(params, val).items()})
            history.append(row)
            if on_epoch is not None:
                on_epoch(row)
        nnx.update(self.critic, params)
        self.meta["history"] = history
        return history

    def _evaluate(self, params, pairs) -> dict:
        """Episode-weighted mean loss and accuracy over (trajectory, label) pairs."""
        totals = {"loss": 0.0, "accuracy": 0.0}
        for part in self._chunks(len(pairs)):
            chunk = pairs[part]
            batch = self._arrays([t for t, _ in chunk], [y for _, y in chunk])
            _, metrics = self._loss(params, batch)
            for k in totals:
                totals[k] += float(metrics[k]) * len(chunk)
        return {k: v / len(pairs) for k, v in totals.items()}

    # -- persistence

    def save(self, path: str) -> None:
        """Writes `path`/reward_model.json (config, mode, history) and the parameters with
        the Checkpointer under `path`/checkpoint."""
        meta = {**self.meta, "model": dataclasses.asdict(self.config), "mode": self.mode}
        os.makedirs(path, exist_ok=True)
        with Checkpointer(os.path.join(path, _CKPT), keep=1, async_save=False) as ckpt:
            if _STEP in ckpt.all_steps():
                raise FileExistsError(f"a reward model is already saved in {path}")
            ckpt.save(_STEP, {"params": nnx.state(self.critic, nnx.Param)}, meta)
        with open(os.path.join(path, _META), "w") as f:
            json.dump(meta, f, indent=1)

    @classmethod
    def load(cls, path: str, **kw) -> RewardModel:
        """The reward model saved under `path` by `save`."""
        meta_path = os.path.join(path, _META)
        if not os.path.isfile(meta_path):
            raise FileNotFoundError(f"no reward model in {path!r} (no {_META})")
        with open(meta_path) as f:
            meta = json.load(f)
        model = cls.create(ModelConfig(**meta.pop("model")), meta.pop("mode"), **kw)
        model.meta = meta
        template = {"params": nnx.state(model.critic, nnx.Param)}
        with Checkpointer(os.path.join(path, _CKPT), keep=1, async_save=False) as ckpt:
            state, _ = ckpt.restore(_STEP, template=template)
        nnx.update(model.critic, state["params"])
        return model


def from_config(reward_cfg, recipe) -> RewardModel | None:
    """The reward model `reward.model_path` names, when the recipe uses a learned source."""
    if not recipe.uses_learned:
        return None
    if not reward_cfg.model_path:
        raise ValueError(
            f"reward.source={reward_cfg.source!r} uses a learned reward: "
            "set reward.model_path to a saved reward model"
        )
    return RewardModel.load(reward_cfg.model_path)


# ------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Fits a reward model on dumped trajectories and saves it (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="trajectories.jsonl file(s)")
    parser.add_argument("--out", required=True, help="directory to save the reward model in")
    parser.add_argument("--label", choices=LABELS, default="won")
    parser.add_argument("--mode", choices=MODES, default="episode")
    parser.add_argument(
        "--config", help="config whose `model` section sizes the trunk (default configs/base.py)"
    )
    parser.add_argument(
        "--tokenizer",
        help="the dumping run's tokenizer folder, to size the vocabulary "
        "(default: the largest token id in the data)",
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--val_fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from configs.base import get_config
    from jaxrl_agents.config import load_config

    cfg = load_config(args.config, []) if args.config else get_config()
    trajs = [t for path in args.data for t in read_jsonl(path)]
    if args.tokenizer:
        from jaxrl_agents.models.tokenizer import load_tokenizer
        from jaxrl_agents.trainer.setup import model_vocab_size

        vocab = model_vocab_size(load_tokenizer(args.tokenizer))
    else:
        vocab = -(-(max(int(t.tokens.max(initial=0)) for t in trajs) + 1) // 8) * 8
    config = ModelConfig.from_config(cfg.model).replace(vocab_size=vocab)
    model = RewardModel.create(
        config, args.mode, seed=args.seed, length_buckets=cfg.rollout.length_buckets
    )
    history = model.fit(
        trajs,
        labels(trajs, args.label),
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        val_fraction=args.val_fraction,
        seed=args.seed,
        on_epoch=lambda row: print(json.dumps(row)),
    )
    model.meta.update(label=args.label, data=list(args.data))
    model.save(args.out)
    print(f"saved to {args.out}; last epoch: {json.dumps(history[-1])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
