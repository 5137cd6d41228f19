"""Supervised fine-tuning on golden trajectories: cross-entropy on action tokens only.

The trajectories come from the episode driver with the environments' gold actions forced,
so SFT sees exactly the token layout RL episodes have.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_agents import kernels
from jaxrl_agents.data import Batch, Trajectory, pack
from jaxrl_agents.models import lora
from jaxrl_agents.trainer import optim
from jaxrl_agents.trainer.fit import (
    history_row,
    seeded_orders,
    split_train_val,
    steps_per_epoch,
    train_epochs,
)

TARGETS = ("actions", "all")


def sft_loss(graphdef, params, batch: dict, target: str = "actions"):
    """Mean negative log-likelihood of the action tokens (target "actions") or of every
    token after the first (target "all": language modelling of whole episodes). With
    `batch["allowed"]` (constrained decoding) an action token's likelihood is among its
    allowed ids only. For "actions" with `batch["loss_index"]`, the output layer runs at
    the action tokens only. Returns (loss, metrics)."""
    model = nnx.merge(graphdef, params)
    hidden = model.hidden_states(batch["input_ids"], batch["positions"], batch["valid"])
    ids, allowed = batch["input_ids"], batch.get("allowed")
    if target == "actions" and "loss_index" in batch:
        index = batch["loss_index"]  # (B, A): the predicted positions
        mask = (index > 0).astype(jnp.float32)
    else:  # every position t >= 1
        index = jnp.broadcast_to(jnp.arange(1, ids.shape[1]), (ids.shape[0], ids.shape[1] - 1))
        mask = jnp.take_along_axis(target_mask(batch, target), index, axis=1)
    h = jnp.take_along_axis(hidden, (index - 1)[..., None], axis=1)  # (B, A, D)
    logits = model.logits(h)  # (B, A, V)
    targets = jnp.take_along_axis(ids, index, axis=1)
    picked = None if allowed is None else jnp.take_along_axis(allowed, index[..., None], axis=1)
    logp, _ = kernels.target_logprobs_and_entropy(logits, targets, picked)
    nll = -kernels.masked_mean(logp, mask)
    predicted = jnp.argmax(logits, axis=-1)
    if picked is not None:  # constrained tokens: the argmax among their allowed ids
        top = jnp.argmax(kernels.allowed_logits(logits, picked), axis=-1)
        best = jnp.take_along_axis(picked, top[..., None], axis=-1)[..., 0]
        predicted = jnp.where((picked >= 0).any(axis=-1), best, predicted)
    accuracy = kernels.masked_mean((predicted == targets).astype(jnp.float32), mask)
    return nll, {"sft/loss": nll, "sft/token_accuracy": accuracy}


def target_mask(batch: dict, target: str):
    """[..., B, T] float32: 1 on the tokens whose likelihood the loss counts (action tokens,
    or every real token after the first)."""
    if target == "all":
        return batch["valid"].astype(jnp.float32).at[..., 0].set(0.0)
    return batch["action_mask"].astype(jnp.float32)


def _train_step(graphdef, tx, target, grad_accum, state, batch):
    """One optimizer step on a batch of B rows (B a multiple of grad_accum), taken as
    grad_accum micro-batches of B / grad_accum rows whose gradients are summed, each
    weighted by its share of the counted tokens: the step equals the whole batch's. With
    LoRA adapters only they get gradients and optimizer state (`lora.split_trainable`).
    state: (params, opt_state) -> ((params, opt_state), metrics)."""
    params, opt_state = state
    micro = jax.tree.map(lambda v: v.reshape((grad_accum, -1) + v.shape[1:]), batch)
    counts = target_mask(micro, target).sum(axis=(1, 2))  # (A,)
    weights = counts / jnp.maximum(counts.sum(), 1.0)
    trainable, frozen = lora.split_trainable(params)  # frozen: None without adapters

    def loss_of(trainable, mb):
        return sft_loss(graphdef, lora.merge_trainable(trainable, frozen), mb, target=target)

    grad_fn = jax.value_and_grad(loss_of, has_aux=True)
    grads, metrics = optim.accumulate_gradients(grad_fn, trainable, micro, weights)
    updates, opt_state = tx.update(grads, opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    return (lora.merge_trainable(trainable, frozen), opt_state), metrics


class SFTTrainer:
    """Fits a policy Transformer to golden trajectories; validation loss every epoch.

    `fit(trajectories, on_epoch=None)` trains in place (the policy module is updated) and
    returns the per-epoch history [{"epoch", "train_loss", "val_loss", ...}]. With
    `keep_best` the policy ends with the parameters of the epoch of lowest validation loss
    (early stopping without cutting the history short). `grad_accum` splits each batch
    into that many micro-batches, one alive at a time (the step is the same; the memory of
    the activations is divided). `optimizer_state`: Adam's moments in float32 or int8
    (`optim.adam`).
    """

    def __init__(
        self,
        policy,
        *,
        learning_rate: float,
        batch_size: int,
        epochs: int,
        val_fraction: float,
        seed: int = 0,
        keep_best: bool = True,
        target: str = "actions",
        max_grad_norm: float = 1.0,
        pad_id: int = 0,
        length_buckets: Sequence[int] = (128, 256, 512, 1024),
        choice_width: int | None = None,
        grad_accum: int = 1,
        optimizer_state: str = "float32",
    ):
        if grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
        self.policy = policy
        self.batch_size, self.epochs, self.grad_accum = batch_size, epochs, grad_accum
        self.val_fraction, self.seed = val_fraction, seed
        self.keep_best = keep_best
        if target not in TARGETS:
            raise ValueError(f"SFT target {target!r}; one of {list(TARGETS)}")
        self.target = target
        self.pad_id, self.length_buckets = pad_id, tuple(length_buckets)
        self.choice_width = choice_width  # set: trajectories' recorded choices restrict SFT
        self.tx = optim.adam(optax.constant_schedule(learning_rate), max_grad_norm,
                             state=optimizer_state)
        self.graphdef, _ = nnx.split(policy)
        self._step = jax.jit(functools.partial(_train_step, self.graphdef, self.tx, target,
                                               grad_accum))
        self._eval = jax.jit(functools.partial(sft_loss, self.graphdef, target=target))

    @classmethod
    def from_config(cls, cfg, policy, *, pad_id: int) -> SFTTrainer:
        return cls(
            policy,
            learning_rate=cfg.sft.learning_rate,
            batch_size=cfg.sft.batch_size,
            epochs=cfg.sft.epochs,
            val_fraction=cfg.sft.val_fraction,
            seed=cfg.seed,
            keep_best=cfg.sft.keep_best,
            max_grad_norm=cfg.rl.max_grad_norm,
            pad_id=pad_id,
            length_buckets=cfg.rollout.length_buckets,
            choice_width=cfg.rollout.choice_width if cfg.rollout.constrain_actions else None,
            grad_accum=cfg.sft.grad_accum,
            optimizer_state=cfg.sft.optimizer_state,
        )

    def _pack(self, trajs: Sequence[Trajectory], row_multiple: int = 1) -> dict:
        batch: Batch = pack(trajs, pad_id=self.pad_id, length_buckets=self.length_buckets,
                            row_multiple=row_multiple, choice_width=self.choice_width)
        return {k: jnp.asarray(v) for k, v in batch.as_dict().items()}

    def evaluate(self, params, trajs: Sequence[Trajectory]) -> dict:
        """Token-weighted mean loss and accuracy over `trajs`."""
        totals, weight = {}, 0.0
        for i in range(0, len(trajs), self.batch_size):
            chunk = trajs[i : i + self.batch_size]
            _, metrics = self._eval(params, self._pack(chunk))
            n = sum(t.num_action_tokens if self.target == "actions" else len(t.tokens) - 1
                    for t in chunk)
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + float(v) * n
            weight += n
        return {k: v / max(weight, 1.0) for k, v in totals.items()}

    def num_steps(self, num_trajectories: int) -> int:
        """The optimizer steps `fit` takes on `num_trajectories` trajectories (after the
        validation split), over every epoch."""
        train, _ = split_train_val(range(num_trajectories), self.val_fraction, self.seed)
        return self.epochs * steps_per_epoch(len(train), self.batch_size)

    def fit(
        self, trajectories: Sequence[Trajectory], on_epoch: Callable[[dict], None] | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> list[dict]:
        """Trains on `trajectories` less the validation split; `on_epoch(row)` after each
        epoch (the policy then holds that epoch's parameters), `on_step()` after each step."""
        if not trajectories:
            raise ValueError("SFT needs at least one golden trajectory")
        train, val = split_train_val(list(trajectories), self.val_fraction, self.seed)
        params = nnx.state(self.policy)
        state = (params, self.tx.init(lora.trainable(params)))
        history = []
        best_loss, best_params = float("inf"), params
        passes = train_epochs(
            self._step, state, order=seeded_orders(len(train), self.seed),
            rows_per_step=self.batch_size, num_epochs=self.epochs, fetch_metrics=True,
            on_step=on_step, batch_of=lambda rows, _: self._pack([train[j] for j in rows],
                                                row_multiple=self.grad_accum))
        for epoch, (params, _), metrics in passes:
            row = history_row(epoch, metrics, "sft/loss", num_train=len(train), num_val=len(val))
            if val:
                val_metrics = self.evaluate(params, val)
                row["val_loss"] = val_metrics["sft/loss"]
                row["val_token_accuracy"] = val_metrics["sft/token_accuracy"]
                if row["val_loss"] < best_loss:
                    best_loss, best_params = row["val_loss"], params
            history.append(row)
            # The policy module holds this epoch's parameters while `on_epoch` runs (it may
            # play games with them).
            nnx.update(self.policy, params)
            if on_epoch is not None:
                on_epoch(row)
        if self.keep_best and val:
            nnx.update(self.policy, best_params)
        return history
