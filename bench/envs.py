"""Environment throughput: steps/s per family with 1 and N workers, and games/s of generation.

    .venv/bin/python bench/envs.py [--workers 2] [--envs 4] [--seconds 5] [--games 2]
                                   [--families toy,textworld,alfworld,code]

Steps/s: `--envs` envs play for `--seconds` with two policies, "gold" (each task's gold
actions) and "random" (a random admissible command, where the family lists them), resetting
every finished env; resets are part of the measured time, as in training (after one untimed
warm-up reset). The envs run in this process ("in-proc", the baseline without workers) and in
an EnvPool of 1 and of N workers; "speedup" is against in-proc.
Generation: fresh games (TextWorld, ALFWorld) are made through `envs.make` into a temporary
`cache_dir`, one after the other in this process, then by building an EnvPool over new seeds
with N workers (each worker generates its share). A family whose module is not importable yet
is skipped with a note. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import envs  # noqa: E402
from envs.pool import EnvPool  # noqa: E402

SPECS = {
    "toy": lambda i: {"family": "toy", "task": "guess", "n": 32, "seed": i},
    "textworld": lambda i: {"family": "textworld", "name": "w2-o3-q4", "seed": i, "split": "train"},
    "alfworld": lambda i: {
        "family": "alfworld",
        "task_type": "pick_and_place_simple",
        "objects": 5,
        "receptacles": 5,
        "seed": i,
    },
    "code": lambda i: {"family": "code", "task_family": "off_by_one", "seed": i},
}
GENERATED = ("textworld", "alfworld")  # families whose games are generated and cached
POOL_TIMEOUTS = {"timeout_s": 300.0, "reset_timeout_s": 900.0}


def family_specs(family: str, seeds, cache_dir: str | None) -> list[dict]:
    specs = [SPECS[family](seed) for seed in seeds]
    if cache_dir and family in GENERATED:
        specs = [{**spec, "cache_dir": cache_dir} for spec in specs]
    return specs


def missing_reason(family: str) -> str | None:
    """Why a family cannot be benchmarked now, or None."""
    if family not in envs.FAMILIES:
        return f"not registered in envs.FAMILIES ({sorted(envs.FAMILIES)})"
    module = envs.FAMILIES[family].split(":")[0]
    try:
        importlib.import_module(module)
    except Exception as exc:  # the module is being written, or a dependency is missing
        return f"{module} not importable ({type(exc).__name__}: {exc})"
    return None


class Player:
    """Chooses the next action of each env: its gold actions in order, or random admissible."""

    def __init__(self, policy: str, seed: int = 0):
        self.policy = policy
        self.rng = random.Random(seed)
        self.turn: dict[int, int] = {}

    def start(self, env_id: int) -> None:
        self.turn[env_id] = 0

    def action(self, env_id: int, task, result) -> str | None:
        turn = self.turn[env_id]
        self.turn[env_id] = turn + 1
        if self.policy == "gold":
            gold = task.gold_actions
            return gold[turn] if turn < len(gold) else (gold[-1] if gold else "look")
        commands = result.info.get("admissible_commands") or []
        return self.rng.choice(commands) if commands else None


class InProcess:
    """The pool's reset / step / tasks over envs in this process: the baseline without workers."""

    def __init__(self, specs: list[dict]):
        self.envs = [envs.make(spec) for spec in specs]

    def __len__(self) -> int:
        return len(self.envs)

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc) -> None:
        pass

    @property
    def tasks(self) -> list:
        return [env.task for env in self.envs]

    def reset(self, ids) -> list:
        return [self.envs[i].reset() for i in ids]

    def step(self, ids, actions) -> list:
        return [self.envs[i].step(action) for i, action in zip(ids, actions)]


def play(pool: EnvPool | InProcess, policy: str, seconds: float) -> dict:
    """Plays all envs of `pool` for about `seconds`, and on until one episode has ended (a
    rate over no finished episode says nothing, as on a machine busy with other work);
    returns counts and the elapsed time."""
    player = Player(policy)
    ids = list(range(len(pool)))
    counts = {"steps": 0, "episodes": 0, "won": 0, "failed": 0}
    pool.reset(ids)  # warm-up: a family's first reset loads its game engine
    start = time.perf_counter()
    last = dict(zip(ids, pool.reset(ids)))
    for env_id in ids:
        player.start(env_id)
    while time.perf_counter() - start < seconds or not counts["episodes"]:
        actions = {i: player.action(i, pool.tasks[i], last[i]) for i in ids}
        if any(action is None for action in actions.values()):
            return {"unsupported": "no admissible_commands in info"}
        last.update(zip(ids, pool.step(ids, [actions[i] for i in ids])))
        counts["steps"] += len(ids)
        finished = [i for i in ids if last[i].done]
        for i in finished:
            counts["episodes"] += 1
            counts["won"] += bool(last[i].won)
            counts["failed"] += bool(last[i].info.get("failed"))
            player.start(i)
        if finished:
            last.update(zip(finished, pool.reset(finished)))
    counts["seconds"] = time.perf_counter() - start
    return counts


def bench_steps(family: str, worker_counts, num_envs: int, seconds: float, cache_dir) -> None:
    specs = family_specs(family, range(num_envs), cache_dir)
    base: dict[str, float] = {}
    for workers in worker_counts:
        try:
            pool = EnvPool(specs, workers, **POOL_TIMEOUTS) if workers else InProcess(specs)
        except Exception as exc:
            print(f"{family:<10} skipped: the pool could not build its envs ({exc})")
            return
        where = workers or "in-proc"
        with pool:
            for policy in ("gold", "random"):
                c = play(pool, policy, seconds)
                if "unsupported" in c:
                    print(f"{family:<10} {policy:<7} {where:>7}  skipped: {c['unsupported']}")
                    continue
                rate = c["steps"] / c["seconds"]
                base.setdefault(policy, rate)
                print(
                    f"{family:<10} {policy:<7} {where:>7} {num_envs:>5} {c['steps']:>6} "
                    f"{c['episodes']:>8} {c['won']:>5} {c['failed']:>6} {c['seconds']:>7.1f} "
                    f"{rate:>9.1f} {rate / base[policy]:>8.2f}x"
                )


def print_generation(family: str, how: str, workers, games, seconds) -> None:
    """One row of the generation table (the header when `seconds` is a string)."""
    rate = "games/s" if isinstance(seconds, str) else f"{games / seconds:.2f}"
    seconds = seconds if isinstance(seconds, str) else f"{seconds:.1f}"
    print(f"{family:<10} {how:<8} {workers:>7} {games:>6} {seconds:>8} {rate:>8}")


def bench_generation(family: str, workers: int, games: int) -> None:
    """Fresh games/s: `games` through envs.make here, then `workers * games` through a pool."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{family}-") as cache_dir:
        start = time.perf_counter()
        for spec in family_specs(family, range(games), cache_dir):
            envs.make(spec)
        seconds = time.perf_counter() - start
        print_generation(family, "make", 1, games, seconds)
        count = workers * games
        specs = family_specs(family, range(games, games + count), cache_dir)
        start = time.perf_counter()
        with EnvPool(specs, workers, **POOL_TIMEOUTS) as pool:
            seconds = time.perf_counter() - start
            assert len(pool.tasks) == count
        print_generation(family, "EnvPool", workers, count, seconds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="N of the N-worker runs")
    parser.add_argument("--envs", type=int, default=4, help="envs per pool")
    parser.add_argument("--seconds", type=float, default=5.0, help="play time per measurement")
    parser.add_argument("--games", type=int, default=2, help="fresh games per generation run")
    parser.add_argument("--families", default=",".join(SPECS), help="comma-separated")
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(SPECS))
    if unknown:
        parser.error(f"unknown families {unknown}; known: {sorted(SPECS)}")
    print(f"envs bench: {os.cpu_count()} CPUs, workers 1 and {args.workers}, {args.envs} envs")
    available = []
    for family in families:
        reason = missing_reason(family)
        if reason:
            print(f"NOTE: skipping {family}: {reason}")
        else:
            available.append(family)

    with tempfile.TemporaryDirectory(prefix="bench-envs-") as cache_dir:
        print("\n== game generation (fresh games into an empty cache_dir)")
        print_generation("family", "how", "workers", "games", "seconds")
        for family in (f for f in available if f in GENERATED):
            bench_generation(family, args.workers, args.games)
        print("(EnvPool rows include starting the workers and importing the family in each)")

        print("\n== steps/s (resets included; games generated before timing)")
        print(
            f"{'family':<10} {'policy':<7} {'workers':>7} {'envs':>5} {'steps':>6} "
            f"{'episodes':>8} {'won':>5} {'failed':>6} {'seconds':>7} {'steps/s':>9} {'speedup':>9}"
        )
        worker_counts = sorted({0, 1, args.workers})
        for family in available:
            if family in GENERATED:  # build the games once, outside the timed runs
                specs = family_specs(family, range(args.envs), cache_dir)
                EnvPool(specs, args.workers, **POOL_TIMEOUTS).close()
            bench_steps(family, worker_counts, args.envs, args.seconds, cache_dir)


if __name__ == "__main__":
    main()
