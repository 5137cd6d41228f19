"""ALFWorld text games, generated offline (envs/alfworld_gen.py) or loaded from real data.

Games are played with TextWorld's `PddlEnv` wrapped by alfworld's `AlfredDemangler` and
`AlfredInfos` (and `AlfredExpert` when an expert is asked for), so the text, the admissible
commands and the rules are ALFWorld's own.

Spec keys:
    task_type: one of the six ALFWorld task types (default "pick_and_place_simple").
    objects: number of object instances, 3 to 12 (default 6).
    receptacles: number of receptacle instances, at least 2 (default 6).
    seed: index of the problem in its split (0 <= seed < 1e6, default 0).
    split: "train" | "eval" (disjoint seed ranges, so the splits never share a problem).
    expert: gold trajectory source, "planner" (Fast Downward, shortest; default) or
        "handcoded" (alfworld's hand-coded expert; the planner is used where it fails).
    expert_plan: also put the expert's next actions in `info["expert_plan"]` every step
        (costs a planner call or a hand-coded expert step; default False).
    game_file: path of a real ALFWorld `game.tw-pddl` (relative paths are read under
        $ALFWORLD_DATA); replaces task_type/objects/receptacles/seed/split.
    max_steps: step budget (default 50, ALFWorld's own, or more when the gold is longer).
    step_penalty, invalid_penalty: costs per step / per inadmissible action (default 0).
    obs_format: "template" | "compact" | "compact_goal" | "raw" (envs.base); cache_dir: where
        generated games are stored.

Speed: TextWorld's grammar-template parses are memoised (envs/_pddl_memo.py; same text,
about twice the steps per second); JAXRL_PDDL_MEMO=0 turns that off.

Reward: 1 on the winning step (ALFWorld scores only the goal), minus the penalties.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import Sequence

from envs import _gamecache, _pddl_memo, _textplay
from envs import alfworld_gen as gen
from envs.base import SpecError, StepResult, TaskSpec, check_spec_keys

FAMILY = "alfworld"
GEN_KEYS = frozenset({"task_type", "objects", "receptacles", "seed", "split", "expert"})
PLAY_KEYS = frozenset({"max_steps", "obs_format", "invalid_penalty", "step_penalty",
                       "cache_dir", "expert_plan"})
SPEC_KEYS = GEN_KEYS | PLAY_KEYS | {"game_file"}
EXPERTS = ("planner", "handcoded")
GAME_FILE, TRAJ_FILE, META_FILE = "game.tw-pddl", "traj_data.json", "meta.json"
DEFAULT_MAX_STEPS = 50
HANDCODED_BUDGET = 150
START_ROOM = "the middle of the room"
# set to 0 to parse TextWorld's grammar templates afresh on every step (see _pddl_memo)
MEMO_ENV_VAR = "JAXRL_PDDL_MEMO"


@contextlib.contextmanager
def _kept_argv():
    """PddlEnv.load hands sys.argv to Fast Downward, which rewrites it; put it back."""
    saved = list(sys.argv)
    try:
        yield
    finally:
        sys.argv[:] = saved


def _wrapped_env(expert: str | None):
    """PddlEnv + alfworld's wrappers; `expert` adds AlfredExpert of that type."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import (
        AlfredDemangler,
        AlfredExpert,
        AlfredInfos,
    )
    from textworld.envs import PddlEnv

    _pddl_memo.set_enabled(os.environ.get(MEMO_ENV_VAR, "1") != "0")
    extras = ["gamefile"] + (["expert_plan"] if expert else [])
    infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=True, extras=extras)
    env = AlfredInfos(AlfredDemangler(PddlEnv(infos)))
    if not expert:
        return env

    class SafeExpert(AlfredExpert):
        """An expert that gives up (empty plan) instead of raising into the episode."""

        def _gather_infos(self):
            try:
                super()._gather_infos()
            except Exception:  # HandCodedAgentFailed, the expert's "Timeout"
                self.state["extra.expert_plan"] = []

    return SafeExpert(env, expert_type=expert)


# -------------------------------------------------------------------------------- specs


def game_params(spec: dict) -> dict:
    """Validated generation parameters: task_type, objects, receptacles, split, seed, expert."""
    check_spec_keys(spec, SPEC_KEYS, FAMILY)
    task_type = _textplay.get_choice(spec, "task_type", "pick_and_place_simple", gen.TASK_TYPES)
    objects = _textplay.get_int(spec, "objects", 6, lo=gen.MIN_OBJECTS)
    if objects > gen.MAX_OBJECTS:
        raise SpecError(f"spec key 'objects' must be <= {gen.MAX_OBJECTS}, got {objects}")
    receptacles = _textplay.get_int(spec, "receptacles", 6, lo=gen.MIN_RECEPTACLES)
    split = _textplay.get_choice(spec, "split", "train", _textplay.SPLITS)
    index = _textplay.get_int(spec, "seed", 0, lo=0)
    _textplay.split_seed(split, index)
    expert = _textplay.get_choice(spec, "expert", "planner", EXPERTS)
    return {"task_type": task_type, "objects": objects, "receptacles": receptacles,
            "split": split, "seed": index, "expert": expert}


def game_key(p: dict) -> str:
    return "{task_type}-o{objects}-r{receptacles}-{split}-{seed}-{expert}".format(**p)


# ---------------------------------------------------------------------------- gold plans


def _play(game_file: str, actions: Sequence[str]) -> bool:
    """Replays `actions` from reset; True when the last one wins."""
    env = _wrapped_env(None)
    with _kept_argv():
        env.load(game_file)
        gs = env.reset()
    won = False
    for a in actions:
        gs, _, _ = env.step(a)
        won = bool(gs["won"])
    env.close()
    return won


def expert_trajectory(game_file: str, expert: str, seed: int = 0,
                      budget: int = HANDCODED_BUDGET) -> list[str] | None:
    """The actions alfworld's expert plays to a win, or None when it does not win.

    planner: the Fast Downward plan from the initial state. handcoded: the hand-coded
    expert played step by step (it draws from the global `random`, seeded here).
    """
    env = _wrapped_env(expert)
    try:
        with _kept_argv(), gen.seeded_global_random(seed):
            env.load(game_file)
            gs = env.reset()
            if expert == "planner":
                plan = list(gs["extra.expert_plan"] or [])
                return plan if plan and _play(game_file, plan) else None
            actions = []
            for _ in range(budget):
                action = gs["extra.expert_plan"][0]
                actions.append(action)
                gs, _, _ = env.step(action)
                if gs["won"]:
                    return actions
    except Exception:  # HandCodedAgentFailed, its "Timeout", or an unsolvable problem
        return None
    finally:
        env.close()
    return None


def _build_game(p: dict, out_dir: str) -> None:
    """Writes game.tw-pddl, traj_data.json and meta.json (with the gold actions)."""
    seed = _textplay.split_seed(p["split"], p["seed"])
    problem = gen.generate_problem(p["task_type"], p["objects"], p["receptacles"], seed)
    game_file = os.path.join(out_dir, GAME_FILE)
    with open(os.path.join(out_dir, TRAJ_FILE), "w") as f:
        json.dump(problem["traj_data"], f, indent=1)
    with open(game_file, "w") as f:
        json.dump(problem["game"], f)
    plan = expert_trajectory(game_file, "planner")
    if plan is None:
        raise gen.GenerationError(f"the planner finds no solution for {p}")
    gold, source = plan, "planner"
    if p["expert"] == "handcoded":
        handcoded = expert_trajectory(game_file, "handcoded", seed)
        if handcoded is not None:
            gold, source = handcoded, "handcoded"
    problem["game"]["walkthrough"] = gold
    with open(game_file, "w") as f:
        json.dump(problem["game"], f)
    meta = {"params": p, "gold_actions": gold, "gold_source": source,
            "optimal_steps": len(plan), "scene": problem["scene"],
            "complexity": problem["complexity"]}
    with open(os.path.join(out_dir, META_FILE), "w") as f:
        json.dump(meta, f, indent=1)


def ensure_game(p: dict, cache_dir: str | None = None) -> str:
    """The directory of the generated game `p` describes, generating it on first use."""
    root = _gamecache.cache_root(FAMILY, cache_dir)
    return _gamecache.build_once(root, game_key(p), lambda tmp: _build_game(p, tmp), META_FILE)


def _generate_one(args) -> str:
    spec, cache_dir = args
    return os.path.join(ensure_game(game_params(spec), spec.get("cache_dir", cache_dir)),
                        GAME_FILE)


def generate_games(specs: Sequence[dict], num_workers: int = 1,
                   cache_dir: str | None = None) -> list[str]:
    """Generates (or finds in the cache) the problems of `specs` with `num_workers` processes.

    Returns the paths of their game.tw-pddl files, in the order of `specs`.
    """
    jobs = [({k: v for k, v in s.items() if k != "family"}, cache_dir) for s in specs]
    return _gamecache.parallel_map(_generate_one, jobs, num_workers)


def _real_game(spec: dict) -> tuple[str, dict]:
    """(game file, meta) of a real ALFWorld game: gold from its walkthrough or the planner."""
    path = os.path.expanduser(str(spec["game_file"]))
    if not os.path.isabs(path):
        path = os.path.join(os.environ.get("ALFWORLD_DATA", ""), path)
    if os.path.isdir(path):
        path = os.path.join(path, GAME_FILE)
    if not os.path.isfile(path):
        raise SpecError(f"ALFWorld game_file {spec['game_file']!r} not found (looked at {path})")
    with open(path) as f:
        gold = json.load(f).get("walkthrough") or []
    with open(os.path.join(os.path.dirname(path), TRAJ_FILE)) as f:
        task_type = json.load(f)["task_type"]
    source = "walkthrough"
    if not gold or not _play(path, gold):
        gold, source = expert_trajectory(path, "planner") or [], "planner"
    meta = {"gold_actions": gold, "gold_source": source, "optimal_steps": len(gold),
            "complexity": {"task_type": task_type}}
    return path, meta


def real_game_files(root: str | None = None) -> list[str]:
    """The solvable game.tw-pddl files under `root` (default $ALFWORLD_DATA), sorted.

    Skips what alfworld's own loader skips: games without traj_data.json, marked unsolvable,
    and the 'movable' and 'Sliced' variants. E.g. root=$ALFWORLD_DATA/json_2.1.1/train.
    """
    root = os.path.expanduser(root or os.environ.get("ALFWORLD_DATA", ""))
    found = []
    for folder, _, files in os.walk(root):
        if GAME_FILE not in files or TRAJ_FILE not in files:
            continue
        if "movable" in folder or "Sliced" in folder:
            continue
        path = os.path.join(folder, GAME_FILE)
        with open(path) as f:
            if not json.load(f).get("solvable", False):
                continue
        found.append(path)
    return sorted(found)


# ------------------------------------------------------------------------------ playing


def _describe(facts, names_at) -> tuple[str, list[str]]:
    """(room, items) from the game's facts: the receptacle(s) at the agent's location, the
    objects held and the objects visible in them."""
    loc = next((f.arguments[1].name for f in facts
                if f.name == "atlocation" and f.arguments[0].type == "agent"), None)
    here = names_at.get(loc, [])
    opened = {f.arguments[0].name for f in facts if f.name == "opened"}
    openable = {f.arguments[0].name for f in facts if f.name == "openable"}
    items = [f"{f.arguments[1].name} (held)" for f in facts if f.name == "holds"]
    for f in facts:
        if f.name == "inreceptacle" and f.arguments[1].name in here:
            r = f.arguments[1].name
            if r not in openable or r in opened:
                items.append(f"{f.arguments[0].name} ({r})")
    return (", ".join(here) if here else START_ROOM), sorted(items)


class AlfWorldEnv:
    """One ALFWorld game (see the module docstring for the spec keys)."""

    def __init__(self, spec: dict):
        check_spec_keys(spec, SPEC_KEYS, FAMILY)
        if "game_file" in spec:
            clash = sorted(set(spec) & GEN_KEYS - {"split", "expert"})
            if clash:
                raise SpecError(f"ALFWorld spec has game_file and generation keys {clash}")
            self.game_file, meta = _real_game(spec)
            split = _textplay.get_choice(spec, "split", "train", _textplay.SPLITS)
            name = "alfworld-" + hashlib.sha1(self.game_file.encode()).hexdigest()[:12]
            params = {"split": split, "seed": None}
        else:
            params = game_params(spec)
            game_dir = ensure_game(params, spec.get("cache_dir"))
            self.game_file = os.path.join(game_dir, GAME_FILE)
            with open(os.path.join(game_dir, META_FILE)) as f:
                meta = json.load(f)
            name = f"alfworld-{game_key(params)}"
        self.obs_format = _textplay.get_obs_format(spec)
        self.shaper = _textplay.RewardShaper(
            "sparse", 1, _textplay.get_float(spec, "step_penalty", 0.0),
            _textplay.get_float(spec, "invalid_penalty", 0.0))
        gold = meta["gold_actions"]
        self.max_steps = _textplay.get_int(
            spec, "max_steps", max(DEFAULT_MAX_STEPS, 2 * len(gold)), lo=1)
        self.expert_plan = bool(spec.get("expert_plan", False))
        expert = _textplay.get_choice(spec, "expert", "planner", EXPERTS)
        self.expert_type = expert if self.expert_plan else None
        self.task = TaskSpec(
            family=FAMILY, name=name, complexity=dict(meta["complexity"]),
            optimal_steps=int(meta["optimal_steps"]), gold_actions=list(gold),
            info={"game_file": self.game_file, "split": params["split"],
                  "seed": params["seed"], "gold_source": meta["gold_source"],
                  "scene": meta.get("scene"), "max_steps": self.max_steps})
        self._env = None
        self._last: StepResult | None = None

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def reset(self, seed: int | None = None) -> StepResult:
        """Restarts the game; `seed` seeds the hand-coded expert's global `random` draws."""
        if self._env is None:
            self._env = _wrapped_env(self.expert_type)
            with _kept_argv():
                self._env.load(self.game_file)
        with _kept_argv(), gen.seeded_global_random(0 if seed is None else seed):
            gs = self._env.reset()
        self._names_at = self._receptacles_by_location(gs)
        intro = gs.feedback.strip()
        m = re.search(r"Your task is to:\s*(.*)", intro)
        self.goal = m.group(1).strip() if m else ""
        self.shaper.reset()
        self.steps, self.done = 0, False
        intro_room = re.sub(r"^-=.*?=-\s*", "", intro).split("Your task is to:")[0]
        self._last = self._result(gs, _textplay.one_line(intro_room), intro, 0.0, False)
        return self._last

    def step(self, action: str) -> StepResult:
        if self._last is None:
            self.reset()
        if self.done:
            return _textplay.after_episode(self._last)
        command = _textplay.to_command(action)
        invalid = command not in self._last.info["admissible_commands"]
        try:
            with _kept_argv():
                gs, _, _ = self._env.step(command)
        except Exception as e:  # the expert wrapper gave up, or the engine failed
            self.done = True
            info = dict(self._last.info, error=f"{type(e).__name__}: {e}", truncated=True)
            return StepResult(self._last.observation, 0.0, True, False, info)
        self.steps += 1
        won = bool(gs["won"])
        truncated = not won and self.steps >= self.max_steps
        self.done = won or truncated
        feedback = gs.feedback.strip() or "Nothing happens."
        reward = self.shaper(0.0, won, self.done, invalid)
        self._last = self._result(gs, feedback, feedback, reward, invalid, truncated)
        return self._last

    @staticmethod
    def _receptacles_by_location(gs) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for f in gs["facts"]:
            if f.name == "receptacleatlocation":
                out.setdefault(f.arguments[1].name, []).append(f.arguments[0].name)
        return {k: sorted(v) for k, v in out.items()}

    def _result(self, gs, feedback, raw, reward, invalid, truncated=False) -> StepResult:
        if self.obs_format == "raw":
            obs = raw
        else:
            room, items = _describe(gs["facts"], self._names_at)
            obs = _textplay.render_text_state(
                self.obs_format, first=self.steps == 0, room=room, items=items,
                goal=self.goal, feedback=_textplay.one_line(feedback),
                actions=list(gs["admissible_commands"] or []))
        info = {"admissible_commands": list(gs["admissible_commands"] or []),
                "score": 1 if gs["won"] else 0, "max_score": 1, "won": bool(gs["won"]),
                "lost": False, "raw": raw, "invalid": invalid, "truncated": truncated,
                "steps": self.steps}
        if self.expert_plan:
            info["expert_plan"] = list(gs.get("extra.expert_plan") or [])
        return StepResult(obs, float(reward), self.done, bool(gs["won"]), info)


def make_env(spec: dict) -> AlfWorldEnv:
    return AlfWorldEnv(spec)
