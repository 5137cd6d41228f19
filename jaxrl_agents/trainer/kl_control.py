"""KL-coefficient controllers: fixed, adaptive (target KL) and warm-up.

State is a plain dict so it checkpoints as JSON.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class KLController:
    """Chooses the KL coefficient used by each update.

    kind: "fixed" (always `coef`), "adaptive" (Ziegler et al.: the coefficient grows when
    the measured KL exceeds `target` and shrinks below it, proportional error clipped to
    +-20%, scaled by tokens/horizon) or "warmup" (linear from `warmup_start` to `coef`
    over `warmup_updates` updates, then fixed).
    """

    kind: str
    coef: float
    target: float = 0.05
    horizon: int = 10000
    warmup_start: float = 0.01
    warmup_updates: int = 100
    value: float = dataclasses.field(default=None)
    updates: int = 0

    def __post_init__(self):
        if self.kind not in ("fixed", "adaptive", "warmup"):
            raise ValueError(f"kl.controller {self.kind!r}; allowed: fixed, adaptive, warmup")
        if self.value is None:
            self.value = self.warmup_start if self.kind == "warmup" else self.coef

    @classmethod
    def from_config(cls, kl_cfg) -> KLController:
        return cls(
            kind=kl_cfg.controller,
            coef=kl_cfg.coef,
            target=kl_cfg.target,
            horizon=kl_cfg.horizon,
            warmup_start=kl_cfg.warmup_start,
            warmup_updates=kl_cfg.warmup_updates,
        )

    def update(self, measured_kl: float, num_tokens: int) -> float:
        """Records one update's measured KL per token; returns the next coefficient."""
        self.updates += 1
        if self.kind == "adaptive":
            error = max(-0.2, min(0.2, measured_kl / self.target - 1.0))
            self.value *= 1.0 + error * num_tokens / self.horizon
        elif self.kind == "warmup":
            frac = min(1.0, self.updates / max(self.warmup_updates, 1))
            self.value = self.warmup_start + frac * (self.coef - self.warmup_start)
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.updates = float(state["value"]), int(state["updates"])
