"""Small timing helpers shared by the benchmarks, and the one-device-per-core layout
(this module imports no JAX, so a script can call `one_host_device_per_core` first)."""

import os
import statistics
import time


def one_host_device_per_core() -> None:
    """Asks XLA for one host CPU device per core unless XLA_FLAGS already sets a count.
    Call it before JAX is imported."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count="
                                   f"{os.cpu_count() or 1}").strip()


def data_mesh_sampler(model):
    """A `Sampler` of `model` with the batch split over a `data` mesh of every device (the
    model's parameters move onto the mesh: pass a copy the caller no longer uses)."""
    import jax

    from jaxrl_agents import sharding
    from jaxrl_agents.rollout import Sampler

    mesh = sharding.make_mesh({"data": jax.device_count(), "fsdp": 1, "tensor": 1})
    return Sampler(sharding.shard_params(model, mesh), mesh=mesh)


def _times(fn, repeats, warmup, min_time):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        times.append(elapsed / calls)
    return times


def median_seconds(fn, *, repeats=5, warmup=1, min_time=0.0):
    """Median wall time of `fn()` over `repeats` runs (after `warmup` untimed runs).

    With `min_time`, each timed run loops `fn` until that much time has passed and
    reports the time per call.
    """
    return statistics.median(_times(fn, repeats, warmup, min_time))


def best_seconds_interleaved(contestants, *, repeats=5, warmup=1, settle=0):
    """The fastest run of each contestant, timed in turns: repeat r runs every contestant
    once before repeat r + 1 starts, so a burst of load from elsewhere on a shared machine
    slows one turn of each rather than all the runs of one.

    contestants: {name: fn} or {name: (setup, fn)}; `setup()` runs untimed before each
    `fn()` (e.g. torch.set_num_threads). settle: untimed runs of a contestant at the start
    of each of its turns, so that no timed run pays for the state the other contestant
    left in the process (measured: the JAX learner step's first run after a torch backward
    spent 9-10 s of system time in page faults against 3.3 s for the next, 17.8 s against
    14.9 s of wall time). Returns {name: seconds}.
    """
    pairs = {k: v if isinstance(v, tuple) else (None, v) for k, v in contestants.items()}
    best = dict.fromkeys(pairs, float("inf"))
    for turn in range(warmup + repeats):
        for name, (setup, fn) in pairs.items():
            for run in range(settle + 1):
                if setup is not None:
                    setup()
                start = time.perf_counter()
                fn()
                if turn >= warmup and run == settle:
                    best[name] = min(best[name], time.perf_counter() - start)
    return best


def copy_bandwidth_gbs(megabytes=256):
    """Measured memory bandwidth of a large NumPy copy (read + write), in GB/s."""
    import numpy as np

    src = np.ones(megabytes * 2**20 // 8)
    dst = np.empty_like(src)
    seconds = median_seconds(lambda: np.copyto(dst, src), repeats=5)
    return 2 * src.nbytes / seconds / 1e9


def table(rows, headers):
    """Formats rows (lists of str) as an aligned plain-text table."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([line.format(*headers)] + [line.format(*map(str, r)) for r in rows])
