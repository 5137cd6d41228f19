"""How held-out games were lost: a reading of an evaluation's episodes.

Every evaluation writes one line per game to run_dir/eval_episodes/<stage>.jsonl
(`data.dump.episode_summary`). This module reads those lines back and sorts each game
into one cause, in this order (the first that applies):

- won;
- env failure: the environment failed (crash, hang) and the episode was cut;
- invalid action: the game refused at least one action (free-text play);
- lost: the game ended without a win before the step budget (a losing move);
- loop: the step budget ran out and some action repeated an earlier one of the game;
- out of steps: the step budget ran out with every action new.

For the loops it also gives the loop's period (turns between an action and its first
repeat: 1 = the same command twice in a row, 2 = back and forth, as "take X from Y",
"put X in Y", "take X from Y") and the verb of the repeated command, and for every lost
game how far it got (its return; under dense TextWorld rewards the share of the quest).

    reading = read_stage("runs/a", "sft")
    print(format_reading(reading, "sft"))
    print(format_transitions(transitions(read_episodes(a), read_episodes(b)), "sft", "rl"))

`jaxrl-eval --run DIR --read STAGE [--read STAGE2]` prints these without playing.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterable, Mapping, Sequence

from jaxrl_agents.logging import eval_episodes_name
from jaxrl_agents.monitors import normalize_action
from jaxrl_agents.run_records import EVAL_EPISODES_DIR

CAUSES = ("won", "env failure", "invalid action", "lost", "loop", "out of steps")


def cause(episode: Mapping) -> str:
    """The one cause (of `CAUSES`) that explains how a game summary ended."""
    if episode.get("won"):
        return "won"
    if episode.get("failed"):
        return "env failure"
    if any(episode.get("invalid", ())):
        return "invalid action"
    if not episode.get("truncated"):
        return "lost"
    if any(episode.get("repeated", ())):
        return "loop"
    return "out of steps"


def first_repeat(actions: Sequence[str]) -> tuple[int, int] | None:
    """(turn of the first action that repeats an earlier one, its period in turns), or
    None when every action is new. Actions compare as the repetition monitor does."""
    last_seen: dict[str, int] = {}
    for k, action in enumerate(actions):
        a = normalize_action(action)
        if a in last_seen:
            return k, k - last_seen[a]
        last_seen[a] = k
    return None


def read_episodes(path: str) -> list[dict]:
    """The game summaries of one eval_episodes file, in file order. Raises
    FileNotFoundError naming the path, ValueError naming the line that is not JSON."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no evaluation episodes at {path}")
    episodes = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                episodes.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n} is not a JSON line ({err.msg})") from None
    return episodes


def stage_path(run_dir: str, stage: str, step: int | None = None) -> str:
    """Where the evaluation `stage` (at update `step`) of a run wrote its episodes."""
    return os.path.join(run_dir, EVAL_EPISODES_DIR, eval_episodes_name(stage, step))


def reading(episodes: Iterable[Mapping]) -> dict:
    """Counts of an evaluation's games by cause, and what the lost games did.

    Returns {"games", "causes": {cause: count} over CAUSES, "loop_period": {period: count},
    "loop_verb": {first word of the repeated command: count}, "lost_return": {return
    rounded to 0.01: count} over games not won, "mean_lost_return", "repeat_rate" (share
    of all actions that repeat one of their game), "invalid_rate", "mean_steps"}."""
    episodes = list(episodes)
    causes = collections.Counter({c: 0 for c in CAUSES})
    period, verb, lost_return = collections.Counter(), collections.Counter(), collections.Counter()
    actions = repeats = invalid = steps = 0
    for ep in episodes:
        c = cause(ep)
        causes[c] += 1
        acts = list(ep.get("actions", ()))
        actions += len(acts)
        steps += int(ep.get("steps", len(acts)))
        repeats += sum(bool(r) for r in ep.get("repeated", ()))
        invalid += sum(bool(v) for v in ep.get("invalid", ()))
        if c == "won":
            continue
        lost_return[round(float(ep.get("return", 0.0)), 2)] += 1
        if c == "loop":
            k, p = first_repeat(acts)
            period[p] += 1
            words = normalize_action(acts[k]).split()
            verb[words[0] if words else ""] += 1
    n_lost = len(episodes) - causes["won"]
    return {
        "games": len(episodes),
        "causes": dict(causes),
        "loop_period": dict(sorted(period.items())),
        "loop_verb": dict(verb.most_common()),
        "lost_return": dict(sorted(lost_return.items())),
        "mean_lost_return": (sum(r * n for r, n in lost_return.items()) / n_lost
                             if n_lost else None),
        "repeat_rate": repeats / actions if actions else 0.0,
        "invalid_rate": invalid / actions if actions else 0.0,
        "mean_steps": steps / len(episodes) if episodes else 0.0,
    }


def read_stage(run_dir: str, stage: str, step: int | None = None) -> dict:
    """`reading` of the episodes a run's evaluation `stage` wrote."""
    return reading(read_episodes(stage_path(run_dir, stage, step)))


def transitions(before: Iterable[Mapping], after: Iterable[Mapping]) -> dict:
    """How each game's cause changed between two evaluations of the same games (matched
    by task_id; games only one of them played are left out).

    Returns {(cause before, cause after): count} for the games whose cause changed, and
    under "same" the number of games whose cause did not."""
    first = {str(ep["task_id"]): cause(ep) for ep in before}
    moved, same = collections.Counter(), 0
    for ep in after:
        key = str(ep["task_id"])
        if key not in first:
            continue
        pair = (first[key], cause(ep))
        if pair[0] == pair[1]:
            same += 1
        else:
            moved[pair] += 1
    return {"changed": dict(moved.most_common()), "same": same}


def format_reading(r: Mapping, label: str) -> str:
    """A few lines a person reads: the games by cause, then what the loops and the lost
    games look like."""
    n = r["games"]
    parts = [f"{c} {k}" for c, k in r["causes"].items() if k]
    lines = [f"{label}: {n} games: " + ", ".join(parts)]
    if r["loop_period"]:
        periods = ", ".join(f"{p}: {k}" for p, k in r["loop_period"].items())
        verbs = ", ".join(f"{v} {k}" for v, k in r["loop_verb"].items())
        lines.append(f"  loops by period (turns between a command and its repeat): {periods}; "
                     f"repeated command's verb: {verbs}")
    if r["mean_lost_return"] is not None:
        returns = ", ".join(f"{v:g}: {k}" for v, k in r["lost_return"].items())
        lines.append(f"  games not won by return reached: {returns} "
                     f"(mean {r['mean_lost_return']:.2f})")
    lines.append(f"  actions repeating one of their game: {r['repeat_rate']:.2f}; refused as "
                 f"invalid: {r['invalid_rate']:.2f}; turns per game: {r['mean_steps']:.1f}")
    return "\n".join(lines)


def format_transitions(t: Mapping, first: str, second: str) -> str:
    """The games whose cause changed from `first` to `second`, most frequent first."""
    if not t["changed"]:
        return f"{first} -> {second}: every one of {t['same']} games ended the same way"
    moves = "; ".join(f"{a} -> {b}: {k}" for (a, b), k in t["changed"].items())
    return f"{first} -> {second}: {moves} ({t['same']} games ended the same way)"
