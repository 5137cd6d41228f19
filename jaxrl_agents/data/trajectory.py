"""What an episode leaves behind (`Trajectory`) and what the learner eats (`Batch`).

A trajectory is one token sequence: prompt, then alternating observation and action
segments. Per-token arrays are aligned with `tokens`: index t describes token t.
"""

from __future__ import annotations

import dataclasses

import numpy as np

PROMPT, ACTION = 0, 1  # token_type values: prompt/observation tokens, sampled action tokens


@dataclasses.dataclass
class Trajectory:
    """One episode.

    tokens: [L] int32, the exact ids fed to and sampled by the model.
    token_type: [L] int8, PROMPT (0) or ACTION (1).
    logprobs: [L] float32, log-prob of each action token under the policy at the
        rollout temperature, softmax(logits / temperature), before any top-k / top-p
        filter (the policy the RL learner trains); 0 on prompt tokens.
    rewards: [L] float32, each turn's reward on the last action token of the turn.
    turn_ends: index of the last action token of every turn, in order.
    won / truncated / failed: the episode was solved / cut (step budget or context) /
        ended by an environment failure.
    task_id: name of the task instance; group_id: samples of one task instance share it.
    lower_hidden: optional [L, D] float32, the residual stream after the learner's frozen
        layers at every token, as the rollout computed it (`EpisodeDriver.run(capture=n)`),
        so the learner need not run those layers again; None: the learner computes it.
    """

    tokens: np.ndarray
    token_type: np.ndarray
    logprobs: np.ndarray
    rewards: np.ndarray
    turn_ends: list[int] = dataclasses.field(default_factory=list)
    won: bool = False
    truncated: bool = False
    failed: bool = False
    task_id: str = ""
    group_id: int = 0
    info: dict = dataclasses.field(default_factory=dict)
    lower_hidden: np.ndarray | None = None

    def __post_init__(self):
        self.tokens = np.asarray(self.tokens, np.int32)
        self.token_type = np.asarray(self.token_type, np.int8)
        self.logprobs = np.asarray(self.logprobs, np.float32)
        self.rewards = np.asarray(self.rewards, np.float32)
        n = len(self.tokens)
        for name in ("token_type", "logprobs", "rewards"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Trajectory.{name} has {len(getattr(self, name))} entries, tokens has {n}"
                )
        if self.lower_hidden is not None and (np.ndim(self.lower_hidden) != 2
                                              or len(self.lower_hidden) != n):
            raise ValueError(f"Trajectory.lower_hidden has shape {np.shape(self.lower_hidden)}"
                             f", expected ({n}, D) for {n} tokens")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_turns(self) -> int:
        return len(self.turn_ends)

    @property
    def episode_return(self) -> float:
        return float(self.rewards.sum())

    @property
    def num_action_tokens(self) -> int:
        return int((self.token_type == ACTION).sum())


@dataclasses.dataclass
class Batch:
    """Fixed-shape, padded NumPy arrays for the learner. B rows, T tokens. The RL learner
    takes it as a pytree of arrays on device (registered in `trainer/rl_batch.py`).

    input_ids: [B, T] int32 token ids (pad id where invalid).
    positions: [B, T] int32 position of each token in its episode.
    valid: [B, T] int32, 1 on real tokens, 0 on padding.
    action_mask: [B, T] float32, 1 on action tokens (the ones RL trains on).
    old_logprobs: [B, T] float32, sampling-time log-probs of action tokens.
    rewards: [B, T] float32, turn rewards on the last action token of each turn.
    group_ids: [B] int32; won, truncated: [B] float32; row_valid: [B] float32 (0 for rows
        added only to fill the batch up to its bucket).
    allowed: optional [B, T, K] int32, the ids each action token was restricted to by
        constrained decoding (-1 padded; no id: the whole vocabulary). None when unused.
    loss_index: optional [B, A] int32, each row's action-token positions in order (0
        pads; A is a bucket of the longest row's count): the learner makes output-layer
        logits at these positions only. None: at every position.
    lower_hidden: optional [B, T, D] float32, the frozen layers' output at every token from
        the rollout (`Trajectory.lower_hidden`; 0 on padding), when every row has it. None:
        the learner computes it.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    valid: np.ndarray
    action_mask: np.ndarray
    old_logprobs: np.ndarray
    rewards: np.ndarray
    group_ids: np.ndarray
    won: np.ndarray
    truncated: np.ndarray
    row_valid: np.ndarray
    allowed: np.ndarray | None = None
    loss_index: np.ndarray | None = None
    lower_hidden: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.input_ids.shape

    def as_dict(self) -> dict[str, np.ndarray]:
        """The arrays by name (unused optional ones are left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}

    def rows(self, index) -> Batch:
        """A sub-batch of the given rows (for minibatches)."""
        return Batch(**{k: v[index] for k, v in self.as_dict().items()})
