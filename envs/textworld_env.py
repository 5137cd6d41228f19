"""TextWorld games generated with TextWorld's own generator, cached on disk, played in-process.

Spec keys (all optional):
    rooms, objects, quest_length: world size, number of objects, length of the quest
        (default 2, 3, 4); or `name: "w2-o3-q4"` (the paper's notation) for the three.
    seed: index of the game inside its split (0 <= seed < 1e6, default 0).
    split: "train" | "eval"; the game's generator seed is split offset + index, so the
        splits never share a game.
    reward_density: "sparse" (1 at the win) | "dense" (every change of progress) |
        "every_k" (progress accumulated and paid every `reward_k` steps and at the end).
    reward_k: k of "every_k" (default 4).
    step_penalty: cost paid every step (default 0); invalid_penalty: extra cost of an action
        that is not admissible (default 0).
    max_steps: step budget (default 2 x the walkthrough's length).
    obs_format: "template" (the shared [Room]/[Items]/[Goal]/[Feedback] state) | "raw" |
        "compact" / "compact_goal" (see envs.base).
    cache_dir: where games are stored (default $JAXRL_CACHE/textworld or
        ~/.cache/jaxrl_agents/textworld).

Progress: TextWorld's generated quests score a single point, at the win, so "every score
change" is measured on the quest itself: progress = 1 - len(remaining plan) / len(walkthrough),
from TextWorld's `policy_commands` (0 at reset, 1 at the win, lower after an undoing move).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Sequence

import numpy as np

from envs import _gamecache, _textplay
from envs.base import (
    COMPACT_FORMATS,
    SpecError,
    StepResult,
    TaskSpec,
    check_spec_keys,
    render_state,
)

FAMILY = "textworld"
SPEC_KEYS = frozenset({
    "rooms", "objects", "quest_length", "seed", "name", "split", "reward_density", "reward_k",
    "step_penalty", "max_steps", "invalid_penalty", "obs_format", "cache_dir",
})
DEFAULT_SIZE = {"rooms": 2, "objects": 3, "quest_length": 4}
GAME_FILE, META_FILE = "game.z8", "meta.json"
MAX_GENERATION_ATTEMPTS = 10
# Interpreter meta-commands that would quit, restart, save or transcript the game instead of
# acting in it; answered by the env without reaching the interpreter.
META_VERBS = frozenset({
    "quit", "q", "restart", "save", "restore", "script", "transcript", "unscript", "noscript",
    "undo", "verbose", "brief", "superbrief", "version", "notify", "pronouns", "yes", "y", "no",
    "then", "again", "g", "oops", "o", "score", "full", "fullscore",
})
META_FEEDBACK = "That command is not available in this game."
NAME_RE = re.compile(r"^w(\d+)-o(\d+)-q(\d+)$")


# -------------------------------------------------------------------------------- specs


def parse_name(name: str) -> dict:
    """'w2-o3-q4' -> {"rooms": 2, "objects": 3, "quest_length": 4}."""
    m = NAME_RE.match(str(name).strip().lower())
    if not m:
        raise SpecError(f"TextWorld name must look like 'w2-o3-q4', got {name!r}")
    return dict(zip(("rooms", "objects", "quest_length"), map(int, m.groups())))


def game_params(spec: dict) -> dict:
    """The generation parameters of a spec: rooms, objects, quest_length, split, seed."""
    check_spec_keys(spec, SPEC_KEYS, FAMILY)
    size = dict(DEFAULT_SIZE)
    if "name" in spec:
        size = parse_name(spec["name"])
        clash = {k: spec[k] for k in size if k in spec and spec[k] != size[k]}
        if clash:
            raise SpecError(f"TextWorld name {spec['name']!r} disagrees with {clash}")
    for key in DEFAULT_SIZE:
        size[key] = _textplay.get_int(spec, key, size[key], lo=1 if key != "objects" else 0)
    split = _textplay.get_choice(spec, "split", "train", _textplay.SPLITS)
    index = _textplay.get_int(spec, "seed", 0, lo=0)
    _textplay.split_seed(split, index)  # validates the range
    return {**size, "split": split, "seed": index}


def game_key(params: dict) -> str:
    return "w{rooms}-o{objects}-q{quest_length}-{split}-{seed}".format(**params)


# ---------------------------------------------------------------------------- generation


def _options(params: dict, path: str, attempt: int):
    import textworld

    options = textworld.GameOptions()
    base = _textplay.split_seed(params["split"], params["seed"])
    if attempt == 0:
        options.seeds = base
    else:  # the quest could not be built: derive fresh sub-seeds from (seed, attempt)
        sub = np.random.SeedSequence([base, attempt]).generate_state(4) % 65635
        options.seeds = dict(zip(("map", "objects", "quest", "grammar"), map(int, sub)))
    options.nb_rooms = params["rooms"]
    options.nb_objects = params["objects"]
    length = params["quest_length"]
    options.chaining.min_length = options.chaining.max_length = length
    options.chaining.max_depth = length
    options.chaining.min_breadth = options.chaining.max_breadth = 1
    options.path = path
    options.file_ext = ".z8"
    options.force_recompile = True
    return options


def _build_game(params: dict, out_dir: str) -> None:
    """Generates and compiles one game into `out_dir` (game.z8, game.json, meta.json)."""
    import textworld
    from textworld.generator import QuestGenerationError

    for attempt in range(MAX_GENERATION_ATTEMPTS):
        try:
            _, game = textworld.make(_options(params, os.path.join(out_dir, GAME_FILE), attempt))
            break
        except QuestGenerationError:
            continue
    else:
        raise SpecError(f"TextWorld cannot build a quest for {params} "
                        f"({MAX_GENERATION_ATTEMPTS} seeds tried)")
    meta = {"params": params, "walkthrough": list(game.metadata["walkthrough"]),
            "objective": game.objective, "max_score": game.max_score, "attempt": attempt}
    with open(os.path.join(out_dir, META_FILE), "w") as f:
        json.dump(meta, f, indent=1)


def ensure_game(params: dict, cache_dir: str | None = None) -> str:
    """The directory of the game `params` describes, generating it on first use."""
    root = _gamecache.cache_root(FAMILY, cache_dir)
    return _gamecache.build_once(root, game_key(params),
                                 lambda tmp: _build_game(params, tmp), META_FILE)


def _generate_one(args) -> str:
    spec, cache_dir = args
    game_dir = ensure_game(game_params(spec), spec.get("cache_dir", cache_dir))
    return os.path.join(game_dir, GAME_FILE)


def generate_games(specs: Sequence[dict], num_workers: int = 1,
                   cache_dir: str | None = None) -> list[str]:
    """Generates (or finds in the cache) the games of `specs`, `num_workers` processes.

    specs: TextWorld spec dicts ("family" allowed); a spec's own `cache_dir` wins over the
    argument. Returns the game file paths (game.z8), in the order of `specs`.
    """
    jobs = [({k: v for k, v in s.items() if k != "family"}, cache_dir) for s in specs]
    return _gamecache.parallel_map(_generate_one, jobs, num_workers)


# ------------------------------------------------------------------------------ playing


def _clean_feedback(text: str) -> str:
    """Drops the interpreter's prompt and status line that follow the feedback."""
    lines = []
    for line in (text or "").splitlines():
        if line.lstrip().startswith(">"):
            break
        lines.append(line)
    return "\n".join(lines).strip()


def _room_parts(description: str) -> tuple[str, str]:
    """'-= Studio =-\nYou're now in the studio. ...' -> ('Studio', "You're now in ...")."""
    m = re.match(r"\s*-=\s*(.*?)\s*=-\s*(.*)", description or "", re.S)
    if not m:
        return "", _textplay.one_line(description)
    return m.group(1), _textplay.one_line(m.group(2))


def _room(description: str) -> str:
    """'-= Studio =-\nYou're now in the studio. ...' -> 'Studio: You're now in ...'."""
    name, text = _room_parts(description)
    return f"{name}: {text}" if name else text


class TextWorldEnv:
    """One TextWorld game (see the module docstring for the spec keys)."""

    def __init__(self, spec: dict):
        params = game_params(spec)
        self.obs_format = _textplay.get_obs_format(spec)
        self.shaper = _textplay.RewardShaper(
            _textplay.get_choice(spec, "reward_density", "sparse", _textplay.REWARD_DENSITIES),
            _textplay.get_int(spec, "reward_k", 4, lo=1),
            _textplay.get_float(spec, "step_penalty", 0.0),
            _textplay.get_float(spec, "invalid_penalty", 0.0),
        )
        self.game_dir = ensure_game(params, spec.get("cache_dir"))
        with open(os.path.join(self.game_dir, META_FILE)) as f:
            meta = json.load(f)
        gold = meta["walkthrough"]
        self.max_steps = _textplay.get_int(spec, "max_steps", 2 * len(gold), lo=1)
        self.task = TaskSpec(
            family=FAMILY,
            name=f"tw-{game_key(params)}",
            complexity={k: params[k] for k in DEFAULT_SIZE},
            optimal_steps=len(gold),
            gold_actions=list(gold),
            info={"game_file": os.path.join(self.game_dir, GAME_FILE), "split": params["split"],
                  "seed": params["seed"], "objective": meta["objective"],
                  "max_steps": self.max_steps},
        )
        self._env = None
        self._last: StepResult | None = None

    # -- engine ------------------------------------------------------------------------

    def _start(self):
        import textworld

        infos = textworld.EnvInfos(
            admissible_commands=True, objective=True, description=True, inventory=True,
            score=True, max_score=True, won=True, lost=True, policy_commands=True, moves=True)
        with warnings.catch_warnings():  # Jericho: "not fully supported" (TextWorld scores)
            warnings.simplefilter("ignore")
            self._env = textworld.start(self.task.info["game_file"], request_infos=infos)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- protocol ----------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> StepResult:
        """Restarts the game (it is deterministic: `seed` is accepted and ignored)."""
        if self._env is None:
            self._start()
        gs = self._env.reset()
        self.shaper.reset()
        self.steps, self.done = 0, False
        self.progress = self._progress(gs)
        intro = f"{gs['objective']}\n\n{gs['description']}".strip()
        self._last = self._result(gs, feedback="", raw=intro, reward=0.0, invalid=False)
        return self._last

    def step(self, action: str) -> StepResult:
        if self._last is None:
            self.reset()
        if self.done:
            return _textplay.after_episode(self._last)
        command = _textplay.to_command(action)
        admissible = {c.lower() for c in self._last.info["admissible_commands"]}
        invalid = command not in admissible
        words = command.split()
        if words and (words[0] in META_VERBS or "then" in words):
            gs, feedback = self._gs, META_FEEDBACK
        else:
            try:
                gs, _, _ = self._env.step(command)
            except Exception as e:  # the interpreter died: end the episode, never raise
                return self._crash(e)
            feedback = _clean_feedback(gs.feedback) or "Nothing happens."
        self.steps += 1
        progress = self._progress(gs)
        delta, self.progress = progress - self.progress, progress
        won = bool(gs["won"])
        truncated = not (won or gs["lost"]) and self.steps >= self.max_steps
        self.done = won or bool(gs["lost"]) or truncated
        reward = self.shaper(delta, won, self.done, invalid)
        self._last = self._result(gs, feedback, feedback, reward, invalid, truncated)
        return self._last

    # -- helpers -----------------------------------------------------------------------

    def _progress(self, gs) -> float:
        if gs["won"]:
            return 1.0
        plan = gs["policy_commands"]
        if plan is None:
            return getattr(self, "progress", 0.0)
        return 1.0 - len(plan) / max(1, self.task.optimal_steps)

    def _result(self, gs, feedback, raw, reward, invalid, truncated=False) -> StepResult:
        self._gs = gs
        first = self.steps == 0
        if self.obs_format == "raw":
            obs = raw
        elif self.obs_format in COMPACT_FORMATS:
            name, text = _room_parts(gs["description"])
            obs = _textplay.render_text_state(
                self.obs_format, first=first, room=name or text,
                items=_textplay.one_line(gs["inventory"]),
                goal=_textplay.one_line(gs["objective"]),
                feedback=text if first else _room(feedback),
                actions=list(gs["admissible_commands"] or []))
        else:
            obs = render_state(room=_room(gs["description"]),
                               items=_textplay.one_line(gs["inventory"]),
                               goal=_textplay.one_line(gs["objective"]),
                               feedback=_textplay.one_line(feedback))
        info = {
            "admissible_commands": list(gs["admissible_commands"] or []),
            "score": gs["score"], "max_score": gs["max_score"],
            "won": bool(gs["won"]), "lost": bool(gs["lost"]), "raw": raw,
            "progress": self.progress, "invalid": invalid, "truncated": truncated,
            "steps": self.steps,
        }
        return StepResult(obs, float(reward), self.done, bool(gs["won"]), info)

    def _crash(self, error: Exception) -> StepResult:
        self.done = True
        self.close()
        info = dict(self._last.info, error=f"{type(error).__name__}: {error}", truncated=True)
        return StepResult(self._last.observation, 0.0, True, False, info)


def make_env(spec: dict) -> TextWorldEnv:
    return TextWorldEnv(spec)
