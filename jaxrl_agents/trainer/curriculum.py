"""A curriculum over environment complexity: ordered stages, moved through by success rate.

    curriculum = Curriculum(["toy:count-2", "toy:count-4"], promote_above=0.75, ...)
    for epoch in range(epochs):
        ...play mostly curriculum.current, plus replay_share of curriculum.replay_stages()...
        curriculum.observe(epoch, success_of_the_current_stage)

Every `eval_every_epochs` epochs the mean success observed since the last decision decides:
above `promote_above` the next stage starts, below `demote_below` the previous one (never
below stage 0 nor past the last stage), otherwise the stage stays. Against forgetting, a
`replay_share` of every batch is drawn from earlier stages, and every
`eval_past_every_epochs` epochs the loop evaluates every stage reached so far.

State is a plain dict so it checkpoints as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence

PROMOTE, DEMOTE = "promote", "demote"


class Curriculum:
    """Which stage a run trains on, promoted and demoted by success rate.

    stages: stage names, easiest first. promote_above / demote_below: success thresholds
    (strict: a success equal to a threshold changes nothing). eval_every_epochs: epochs
    between decisions. replay_share: share of a batch drawn from earlier stages.
    eval_past_every_epochs: epochs between evaluations of every stage reached (0 = never).
    """

    def __init__(
        self,
        stages: Sequence[str],
        *,
        promote_above: float = 0.75,
        demote_below: float = 0.40,
        eval_every_epochs: int = 5,
        replay_share: float = 0.10,
        eval_past_every_epochs: int = 10,
    ):
        if not stages:
            raise ValueError("curriculum.stages is empty; name at least one stage")
        if len(set(stages)) != len(stages):
            raise ValueError(f"curriculum.stages {list(stages)} repeats a stage")
        if not 0.0 <= demote_below <= promote_above <= 1.0:
            raise ValueError(
                f"curriculum thresholds need 0 <= demote_below ({demote_below}) <= "
                f"promote_above ({promote_above}) <= 1"
            )
        if eval_every_epochs < 1:
            raise ValueError(f"curriculum.eval_every_epochs must be >= 1, got {eval_every_epochs}")
        if not 0.0 <= replay_share < 1.0:
            raise ValueError(f"curriculum.replay_share must lie in [0, 1), got {replay_share}")
        if eval_past_every_epochs < 0:
            raise ValueError(
                f"curriculum.eval_past_every_epochs must be >= 0, got {eval_past_every_epochs}"
            )
        self.stages = list(stages)
        self.promote_above = float(promote_above)
        self.demote_below = float(demote_below)
        self.eval_every_epochs = int(eval_every_epochs)
        self.replay_share = float(replay_share)
        self.eval_past_every_epochs = int(eval_past_every_epochs)
        self.stage = 0
        self.window: list[float] = []  # successes observed since the last decision
        self.changes: list[list] = []  # [epoch, old stage, new stage] of every move

    @classmethod
    def from_config(cls, curriculum_cfg, stages: Sequence[str] | None = None) -> Curriculum:
        """From the `curriculum` config section; `stages` overrides its stage names."""
        c = curriculum_cfg
        return cls(
            list(c.stages if stages is None else stages),
            promote_above=c.promote_above,
            demote_below=c.demote_below,
            eval_every_epochs=c.eval_every_epochs,
            replay_share=c.replay_share,
            eval_past_every_epochs=c.eval_past_every_epochs,
        )

    @property
    def current(self) -> str:
        return self.stages[self.stage]

    def replay_stages(self) -> list[str]:
        """The stages before the current one (replayed against forgetting)."""
        return self.stages[: self.stage]

    def observe(self, epoch: int, success: float | None) -> str | None:
        """Records the current stage's success in `epoch` (None: not played); at a decision
        epoch returns "promote" / "demote" when the stage moved, else None."""
        if success is not None:
            self.window.append(float(success))
        if (epoch + 1) % self.eval_every_epochs or not self.window:
            return None
        mean = sum(self.window) / len(self.window)
        self.window = []
        move = None
        if mean > self.promote_above and self.stage + 1 < len(self.stages):
            move = PROMOTE
        elif mean < self.demote_below and self.stage > 0:
            move = DEMOTE
        if move is not None:
            new = self.stage + (1 if move == PROMOTE else -1)
            self.changes.append([int(epoch), self.stage, new])
            self.stage = new
        return move

    def stages_to_evaluate(self, epoch: int) -> list[str]:
        """Every stage reached so far when `epoch` ends an evaluation period, else []."""
        every = self.eval_past_every_epochs
        if not every or (epoch + 1) % every:
            return []
        return self.stages[: self.stage + 1]

    def state_dict(self) -> dict:
        return {"stage": self.stage, "window": list(self.window), "changes": list(self.changes)}

    def load_state_dict(self, state: dict) -> None:
        stage = int(state["stage"])
        if not 0 <= stage < len(self.stages):
            raise ValueError(f"checkpointed curriculum stage {stage} outside {self.stages}")
        self.stage = stage
        self.window = [float(x) for x in state["window"]]
        self.changes = [list(c) for c in state["changes"]]
