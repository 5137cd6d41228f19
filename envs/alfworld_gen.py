"""Offline generation of ALFWorld problems from the scene layouts shipped with alfworld.

The ALFRED game data cannot be downloaded here, but the alfworld wheel carries what a game
is made of: the PDDL domain and text grammar (`alfworld/data/`), the receptacles of every
AI2-THOR scene with their positions (`alfworld/gen/layouts/FloorPlan*-openable.json`), the
object classes of every scene (`FloorPlan*-objects.json`), which object fits in which
receptacle (`constants.VAL_RECEPTACLE_OBJECTS`), object affordances
(`constants.VAL_ACTION_OBJECTS`) and the goal formulas (`goal_library.gdict`).

`generate_problem(...)` picks a scene, a subset of its receptacles and a few objects from a
seed, writes the problem in the shape of ALFWorld's `initial_state.pddl`, and returns the two
files alfworld's loaders read: `game.tw-pddl` (JSON with domain, grammar, problem) and
`traj_data.json` (task type and targets, read by the hand-coded expert).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import random
import re

# alfworld creates $ALFWORLD_DATA (default ~/.cache/alfworld) at import; point it at our cache
# unless the user set it (e.g. to a downloaded copy of the real data).
os.environ.setdefault(
    "ALFWORLD_DATA",
    os.path.join(os.path.expanduser(os.environ.get("JAXRL_CACHE", "~/.cache/jaxrl_agents")),
                 "alfworld_data"),
)

import alfworld.gen.constants as C  # noqa: E402
import alfworld.info  # noqa: E402
from alfworld.agents.utils.misc import add_task_to_grammar  # noqa: E402
from alfworld.gen import goal_library  # noqa: E402

from envs.alfworld_tasks import TASK_TYPES  # noqa: E402

# task type -> (receptacle class the agent must use as a tool, affordance of the object)
TOOLS = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}
LAMP = "DeskLamp"
LAMP_HOSTS = ("Desk", "SideTable", "Dresser")
OPENABLE = {"Fridge", "Cabinet", "Microwave", "Drawer", "Safe", "Box"}
AFFORDANCES = {  # VAL_ACTION_OBJECTS key -> PDDL predicate
    "Cleanable": "cleanable",
    "Heatable": "heatable",
    "Coolable": "coolable",
    "Toggleable": "toggleable",
    "Sliceable": "sliceable",
}
MIN_OBJECTS, MAX_OBJECTS = 3, 12
MIN_RECEPTACLES = 2


class GenerationError(RuntimeError):
    """No scene can host the requested task with these sizes."""


# ----------------------------------------------------------------------------- scenes


@functools.lru_cache(maxsize=1)
def scenes() -> dict[str, dict]:
    """FloorPlan name -> {"objects": set of classes, "receptacles": {instance id: location}}."""
    layouts = os.path.join(os.path.dirname(C.__file__), "layouts")
    out = {}
    for path in sorted(glob.glob(os.path.join(layouts, "FloorPlan*-openable.json"))):
        name = os.path.basename(path).split("-")[0]
        with open(path) as f:
            receptacles = json.load(f)
        with open(os.path.join(layouts, f"{name}-objects.json")) as f:
            objects = set(json.load(f))
        out[name] = {"objects": objects, "receptacles": receptacles}
    return out


def receptacle_class(instance_id: str) -> str:
    """'Cabinet|+00.68|+00.50|-02.20' -> 'Cabinet'; 'Sink|..|..|..|SinkBasin' -> 'SinkBasin'."""
    parts = instance_id.split("|")
    return parts[4] if len(parts) > 4 else parts[0]


def _pickable_classes() -> set[str]:
    """Object classes that fit in at least one receptacle and are not fixed furniture."""
    fits = set().union(*C.VAL_RECEPTACLE_OBJECTS.values())
    return {c for c in fits if c in C.OBJECTS and "Sliced" not in c
            and (c not in C.RECEPTACLES or c in C.MOVABLE_RECEPTACLES)}


def fits_in(obj_cls: str, recep_cls: str) -> bool:
    return obj_cls in C.VAL_RECEPTACLE_OBJECTS.get(recep_cls, ())


# ------------------------------------------------------------------------- task choice


def _task_candidates(task_type: str, scene: dict) -> list[dict]:
    """Every (object class, goal receptacle class, toggle class) this scene can host."""
    recep_classes = {receptacle_class(r) for r in scene["receptacles"]}
    objs = sorted(scene["objects"] & _pickable_classes())
    out = []
    if task_type == "look_at_obj_in_light":
        if LAMP not in scene["objects"] or not recep_classes & set(LAMP_HOSTS):
            return []
        return [{"obj": o, "recep": "", "toggle": LAMP} for o in objs
                if any(fits_in(o, r) for r in recep_classes)]
    tool, affordance = TOOLS.get(task_type, (None, None))
    if tool and tool not in recep_classes:
        return []
    for o in objs:
        if affordance and o not in C.VAL_ACTION_OBJECTS[affordance]:
            continue
        for r in sorted(recep_classes - {tool}):
            # the object must also fit somewhere that is not the goal, to start away from it
            if fits_in(o, r) and any(fits_in(o, q) for q in recep_classes - {r}):
                out.append({"obj": o, "recep": r, "toggle": ""})
    return out


def _choose_receptacles(rng, scene, task, task_type, n) -> list[str]:
    """`n` receptacle instances holding the goal one, the tool and a place to start from."""
    ids = sorted(scene["receptacles"])
    rng.shuffle(ids)
    by_cls = lambda cls: [r for r in ids if receptacle_class(r) == cls]  # noqa: E731
    required = []
    if task["recep"]:
        required.append(by_cls(task["recep"])[0])
    if task_type in TOOLS:
        required.append(by_cls(TOOLS[task_type][0])[0])
    if task["toggle"]:
        required.append(next(r for r in ids if receptacle_class(r) in LAMP_HOSTS))
    start = next(r for r in ids if fits_in(task["obj"], receptacle_class(r))
                 and receptacle_class(r) != task["recep"])
    if start not in required:
        required.append(start)
    rest = [r for r in ids if r not in required]
    return required + rest[: max(0, n - len(required))]


def _place_objects(rng, scene, task, task_type, receptacles, n) -> list[tuple[str, str]]:
    """`n` (object class, receptacle id) pairs: the targets first, then distractors.

    No object of the target class starts in a receptacle of the goal class.
    """
    def spots(cls):
        return [r for r in receptacles if fits_in(cls, receptacle_class(r))
                and not (cls == task["obj"] and receptacle_class(r) == task["recep"])]

    placed = []
    if task["toggle"]:
        placed.append((LAMP, next(r for r in receptacles if receptacle_class(r) in LAMP_HOSTS)))
    for _ in range(2 if task_type == "pick_two_obj_and_place" else 1):
        placed.append((task["obj"], rng.choice(spots(task["obj"]))))
    pool = sorted(c for c in scene["objects"] & _pickable_classes() if spots(c))
    while len(placed) < n and pool:
        cls = rng.choice(pool)
        placed.append((cls, rng.choice(spots(cls))))
    return placed


# ----------------------------------------------------------------------------- PDDL text


def mangle(name: str) -> str:
    """ALFRED instance id -> PDDL name, as in ALFWorld's problem files."""
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"),
                 (",", "_comma_")):
        name = name.replace(a, b)
    return name


def _location_names(receptacles, scene, rng) -> tuple[dict[str, str], str]:
    """One distinct location per receptacle from the layout's (x, z, rotation, horizon), plus
    a start location holding no receptacle."""
    names, used = {}, set()
    for r in receptacles:
        x, z, rot, hor = scene["receptacles"][r]
        gx, gz, grot = round(x / 0.25), round(z / 0.25), int(rot) // 90 % 4
        hor = int(hor)
        while (gx, gz, grot, hor) in used:
            hor += 15
        used.add((gx, gz, grot, hor))
        names[r] = mangle(f"loc|{gx}|{gz}|{grot}|{hor}")
    while True:
        start = (rng.randint(-20, 20), rng.randint(-20, 20), rng.randint(0, 3), 30)
        if start not in used:
            return names, mangle("loc|{}|{}|{}|{}".format(*start))


def _object_id(cls: str, rng) -> str:
    xyz = [rng.uniform(-3, 3) for _ in range(3)]
    return cls + "".join(f"|{v:+06.2f}" for v in xyz)


def problem_text(receptacles, objects, locations, start, goal) -> str:
    """The PDDL problem: declarations, initial facts and the goal formula.

    receptacles: list of receptacle ids; objects: list of (object id, receptacle id);
    locations: receptacle id -> location name; goal: the `(:goal ...))` text.
    """
    otypes = sorted({o.split("|")[0] for o, _ in objects})
    rtypes = sorted({receptacle_class(r) for r in receptacles} | {"SinkBasin", "Microwave",
                                                                   "Fridge"})
    decl = ["agent1 - agent"]
    decl += [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    decl += [f"{mangle(o)} - object" for o, _ in objects]
    decl += [f"{mangle(r)} - receptacle" for r in receptacles]
    decl += [f"{loc} - location" for loc in sorted(set(locations.values()) | {start})]

    init = [f"(atLocation agent1 {start})"]
    init += [f"(canContain {r}Type {o}Type)" for r in rtypes for o in otypes if fits_in(o, r)]
    if LAMP in otypes:
        init += [f"(canContain {r}Type {LAMP}Type)" for r in rtypes if r in LAMP_HOSTS]
    for r in receptacles:
        cls, name = receptacle_class(r), mangle(r)
        init += [f"(receptacleType {name} {cls}Type)",
                 f"(receptacleAtLocation {name} {locations[r]})"]
        if cls in OPENABLE:
            init.append(f"(openable {name})")
    for o, r in objects:
        cls, name = o.split("|")[0], mangle(o)
        init += [f"(objectType {name} {cls}Type)", f"(inReceptacle {name} {mangle(r)})",
                 f"(objectAtLocation {name} {locations[r]})"]
        if cls != LAMP:
            init.append(f"(pickupable {name})")
        init += [f"({pred} {name})" for key, pred in AFFORDANCES.items()
                 if cls in C.VAL_ACTION_OBJECTS[key]]
    body = "\n        ".join
    return (f"(define (problem plan_trial)\n    (:domain alfred)\n    (:objects\n        "
            f"{body(decl)}\n    )\n    (:init\n        {body(init)}\n    )\n{goal}\n")


@contextlib.contextmanager
def seeded_global_random(seed: int):
    """Seeds Python's global `random` (alfworld draws from it) and restores it afterwards."""
    saved = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved)


# ------------------------------------------------------------------------------ problem


def generate_problem(task_type: str, objects: int = 6, receptacles: int = 6,
                     seed: int = 0) -> dict:
    """One ALFWorld problem from a seed (pure: same arguments, same problem).

    objects: number of object instances (3 to 12), targets and lamp included.
    receptacles: number of receptacle instances (at least 2; more when the task needs more:
        goal, tool and start receptacles; fewer when no scene has that many).
    Returns {"game": game.tw-pddl dict, "traj_data": traj_data.json dict, "scene": FloorPlan,
    "complexity": {"task_type", "objects", "receptacles"}} (actual sizes).
    """
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task_type {task_type!r}; valid: {list(TASK_TYPES)}")
    if not MIN_OBJECTS <= objects <= MAX_OBJECTS:
        raise ValueError(f"objects={objects} must be in [{MIN_OBJECTS}, {MAX_OBJECTS}]")
    if receptacles < MIN_RECEPTACLES:
        raise ValueError(f"receptacles={receptacles} must be at least {MIN_RECEPTACLES}")
    rng = random.Random(f"alfworld/{task_type}/{objects}/{receptacles}/{seed}")
    names = sorted(scenes())
    rng.shuffle(names)
    # scenes with at least `receptacles` receptacles first (stable sort keeps the shuffle)
    names.sort(key=lambda n: len(scenes()[n]["receptacles"]) < receptacles)
    for name in names:
        scene = scenes()[name]
        candidates = _task_candidates(task_type, scene)
        if candidates:
            break
    else:
        raise GenerationError(f"no scene can host {task_type}")
    task = rng.choice(candidates)
    recs = _choose_receptacles(rng, scene, task, task_type, receptacles)
    placed = _place_objects(rng, scene, task, task_type, recs, objects)
    objs = [(_object_id(cls, rng), r) for cls, r in placed]
    locations, start = _location_names(recs, scene, rng)
    params = {"object_target": task["obj"], "parent_target": task["recep"],
              "toggle_target": task["toggle"], "mrecep_target": "", "object_sliced": False}
    goal = goal_library.gdict[task_type]["pddl"].format(
        obj=task["obj"], recep=task["recep"], toggle=task["toggle"], mrecep="")
    traj_data = {"task_type": task_type, "pddl_params": params, "scene": {"floor_plan": name},
                 "task_id": f"{name}-{seed}"}
    with open(alfworld.info.ALFRED_TWL2_PATH) as f:
        grammar = f.read()
    with open(alfworld.info.ALFRED_PDDL_PATH) as f:
        domain = f.read()
    with seeded_global_random(rng.randrange(2**31)):
        grammar = add_task_to_grammar(grammar, traj_data)
    desc = re.search(r"Your task is to: ([^\"#]*)", grammar)
    traj_data["turk_annotations"] = {"anns": [{"task_desc": desc.group(1) if desc else ""}]}
    game = {"pddl_domain": domain, "grammar": grammar,
            "pddl_problem": problem_text(recs, objs, locations, start, goal.replace("#", "-")),
            "solvable": True, "walkthrough": []}
    return {"game": game, "traj_data": traj_data, "scene": name,
            "complexity": {"task_type": task_type, "objects": len(objs),
                           "receptacles": len(recs)}}
