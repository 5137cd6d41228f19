"""Action-space shaping for text games: staged verbs and compound actions (host side).

Any env can be wrapped through two spec keys, read by `envs.make` before the family sees
the spec:

    allowed_verbs: list of verbs (a command's verb is its first word). The admissible
        commands offered (`info["admissible_commands"]`, and the observation's
        "[Actions] a | b" line when the env shows one) keep only commands with these verbs.
        An action with another verb never reaches the game: the env is stepped with an
        empty command instead, so the step counts, the env's own invalid-action path runs
        (its `invalid_penalty`, `info["invalid"]`) and the "[Feedback]" line says the verb
        is not available. None / absent: every verb.
    compound_actions: n >= 2 lets one turn be "a ; b ; ..." (at most n commands; more are
        dropped): the commands run in order until the episode ends, the turn returns the
        last observation and the summed reward. 0 or 1: off (";" is left to the env).

`ActionStaging` decides the verbs of each stage: `initial_verbs` first, then each
`advance()` adds at most `growth` x the verbs allowed so far (at least one), in the order of
`KNOWN_VERBS`; past the last known verb the restriction is lifted. The trainer `record`s
each update's training episodes and, at the end of each period, `decide`s: the next stage
comes when success over the period exceeded the threshold (as a curriculum promotes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from envs._textplay import to_command
from envs.base import StepResult

WRAPPER_KEYS = ("allowed_verbs", "compound_actions")
BLOCKED_ACTION = ""  # what the env is sent instead of a command whose verb is not allowed
BLOCKED_FEEDBACK = "The verb '{verb}' is not available yet."
COMPOUND_SEPARATOR = ";"
# TextWorld and ALFWorld verbs, basic ones first: the order in which stages add them.
KNOWN_VERBS = (
    "go", "take", "open", "close", "put", "insert", "examine", "look", "inventory", "drop",
    "unlock", "lock", "eat", "toggle", "use", "clean", "heat", "cool", "slice", "cook",
    "chop", "dice", "drink",
)  # fmt: skip
_ACTIONS_LINE, _FEEDBACK_LINE, _ACTIONS_SEP = "[Actions] ", "[Feedback] ", " | "


def verb_of(action: str) -> str:
    """The first word of the game command `action` becomes ('' for an empty one)."""
    words = to_command(action).split()
    return words[0] if words else ""


def split_compound(action: str, max_parts: int) -> list[str]:
    """'a ; b ; c' -> ['a', 'b'] for max_parts = 2; empty parts are skipped."""
    parts = [p.strip() for p in str(action).split(COMPOUND_SEPARATOR) if p.strip()]
    return parts[:max_parts] or [str(action)]


def filter_commands(commands: Iterable[str], allowed: frozenset[str] | None) -> list[str]:
    """The commands whose verb is allowed (all when `allowed` is None), in order."""
    commands = list(commands or [])
    return commands if allowed is None else [c for c in commands if verb_of(c) in allowed]


def _replace_line(observation: str, prefix: str, text: str) -> str:
    lines = observation.split("\n")
    return "\n".join(prefix + text if ln.startswith(prefix) else ln for ln in lines)


class ActionSpaceEnv:
    """An env whose allowed verbs and compound actions follow the spec keys above."""

    def __init__(self, env, allowed_verbs: Sequence[str] | None = None,
                 compound_actions: int = 0):  # fmt: skip
        self.env = env
        self.allowed = None if allowed_verbs is None else frozenset(
            v.strip().lower() for v in allowed_verbs)  # fmt: skip
        self.max_parts = int(compound_actions)

    @property
    def task(self):
        return self.env.task

    def reset(self, seed: int | None = None) -> StepResult:
        return self._offer(self.env.reset(seed))

    def step(self, action: str) -> StepResult:
        if self.max_parts < 2:
            return self._step_one(action)
        parts = split_compound(action, self.max_parts)
        results = []
        for part in parts:
            results.append(self._step_one(part))
            if results[-1].done:
                break
        last = results[-1]
        info = dict(last.info, compound_parts=len(results),
                    invalid=any(r.info.get("invalid", False) for r in results))  # fmt: skip
        total = float(sum(r.reward for r in results))
        return dataclasses.replace(last, reward=total, info=info)

    def _step_one(self, action: str) -> StepResult:
        verb = verb_of(action)
        if self.allowed is None or verb in self.allowed:
            return self._offer(self.env.step(action))
        result = self._offer(self.env.step(BLOCKED_ACTION))
        feedback = BLOCKED_FEEDBACK.format(verb=verb)
        observation = _replace_line(result.observation, _FEEDBACK_LINE, feedback)
        info = dict(result.info, invalid=True, blocked_verb=verb)
        return dataclasses.replace(result, observation=observation, info=info)

    def _offer(self, result: StepResult) -> StepResult:
        """Keeps only the allowed commands in the info and the observation's [Actions] line."""
        if self.allowed is None or "admissible_commands" not in result.info:
            return result
        commands = filter_commands(result.info["admissible_commands"], self.allowed)
        observation = _replace_line(result.observation, _ACTIONS_LINE,
                                    _ACTIONS_SEP.join(c.strip() for c in commands))  # fmt: skip
        info = dict(result.info, admissible_commands=commands)
        return dataclasses.replace(result, observation=observation, info=info)

    def close(self) -> None:
        if hasattr(self.env, "close"):
            self.env.close()


def wrap(env, spec: Mapping):
    """`env` in an ActionSpaceEnv when `spec` sets a wrapper key, else `env` itself."""
    verbs = spec.get("allowed_verbs")
    parts = spec.get("compound_actions") or 0
    if verbs is None and parts < 2:
        return env
    return ActionSpaceEnv(env, verbs, parts)


@dataclasses.dataclass
class ActionStaging:
    """The verbs of the current stage; `advance()` moves to the next, `decide()` does when
    the success `record`ed since the last decision is high enough. State: `stage`,
    `allowed` and the tally `wins` / `episodes` (plain data)."""

    initial_verbs: Sequence[str] = KNOWN_VERBS[:10]
    growth: float = 0.2
    verb_order: Sequence[str] = KNOWN_VERBS
    stage: int = 0
    allowed: list | None = None  # None (after __post_init__): every verb
    wins: int = 0  # training episodes won / played since the last decision
    episodes: int = 0

    def __post_init__(self):
        if not self.initial_verbs:
            raise ValueError("action staging needs at least one initial verb")
        if self.growth <= 0:
            raise ValueError(f"action_space.growth must be > 0, got {self.growth}")
        if self.stage == 0 and self.allowed is None:
            self.allowed = list(dict.fromkeys(v.strip().lower() for v in self.initial_verbs))

    @classmethod
    def from_config(cls, action_space_cfg) -> ActionStaging:
        return cls(tuple(action_space_cfg.initial_verbs), float(action_space_cfg.growth))

    @property
    def allowed_verbs(self) -> list[str] | None:
        """The verbs of this stage; None once every verb is allowed."""
        return None if self.allowed is None else list(self.allowed)

    def advance(self) -> bool:
        """Allows up to max(1, floor(growth x |allowed|)) more verbs; past the known verbs,
        all. Returns False when nothing changed (already unrestricted)."""
        if self.allowed is None:
            return False
        pending = [v for v in self.verb_order if v not in self.allowed]
        self.stage += 1
        if not pending:
            self.allowed = None
            return True
        self.allowed += pending[: max(1, math.floor(self.growth * len(self.allowed)))]
        return True

    def record(self, wins: int, episodes: int) -> None:
        """Adds an update's training outcomes to the tally of the current period."""
        self.wins += int(wins)
        self.episodes += int(episodes)

    def decide(self, advance_above: float) -> bool:
        """Ends a period: advances when its success rate exceeded `advance_above` (no
        episode: no advance); the tally starts again. True when the stage changed."""
        rate = self.wins / self.episodes if self.episodes else 0.0
        self.wins = self.episodes = 0
        return rate > advance_above and self.advance()

    def apply(self, spec: dict) -> dict:
        """`spec` with this stage's `allowed_verbs` (removed once unrestricted)."""
        out = {k: v for k, v in spec.items() if k != "allowed_verbs"}
        if self.allowed is not None:
            out["allowed_verbs"] = list(self.allowed)
        return out

    def state_dict(self) -> dict:
        return {"stage": self.stage, "allowed": self.allowed_verbs, "wins": self.wins,
                "episodes": self.episodes}

    def load_state_dict(self, state: Mapping) -> None:
        self.stage = int(state["stage"])
        self.allowed = None if state["allowed"] is None else list(state["allowed"])
        self.wins, self.episodes = int(state.get("wins", 0)), int(state.get("episodes", 0))
