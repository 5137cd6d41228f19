"""Keeps a long run's compiled programs under the kernel's limit on memory mappings.

XLA:CPU maps every compiled program's code into memory, several mappings per program
(about 40 for a small one; more for the sampler's decode loop, whose nested loops and
branches are compiled apart), and JAX keeps every program it compiled for as long as the
process lives. A run that meets many shapes (curriculum stages, greedy and sampled play,
prompt, cache and batch buckets) can reach Linux's `vm.max_map_count` (65530 by
default). LLVM then cannot map the next program and the process dies: a claim-1 run of
`configs/sweeps/textworld_curriculum.py` ended with SIGSEGV after "LLVM compilation
error: Cannot allocate memory", while resident memory was a fifth of the machine's.

`release_if_near_limit` drops JAX's caches before that point. The programs still in use
are compiled again on their next call, which costs seconds, once in a long while.
Elsewhere than Linux (no /proc) it does nothing.
"""

from __future__ import annotations

import gc
import logging

import jax

log = logging.getLogger(__name__)

DEFAULT_FRACTION = 0.5  # of the limit: a compilation can add thousands of mappings at once


def mapping_count() -> int | None:
    """Memory mappings of this process (lines of /proc/self/maps); None without /proc."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


def mapping_limit() -> int | None:
    """The kernel's per-process limit on mappings (vm.max_map_count); None without /proc."""
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return None


def release_if_near_limit(fraction: float = DEFAULT_FRACTION) -> bool:
    """Clears JAX's compilation caches when this process holds more than `fraction` of the
    mappings the kernel allows. Returns whether it did. Call it between device calls
    (never inside a traced function)."""
    count, limit = mapping_count(), mapping_limit()
    if count is None or limit is None or count <= fraction * limit:
        return False
    jax.clear_caches()
    gc.collect()  # the executables go with their last Python reference
    after = mapping_count()
    log.warning("%d memory mappings of %d allowed (vm.max_map_count): cleared JAX's "
                "compiled programs, %s mappings left; the ones in use compile again",
                count, limit, after)
    return True


# Seconds JAX has spent lowering and compiling programs in this process, counted from its
# compile events: the part of a phase's wall time that is compilation, not execution.
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_compile_seconds = [0.0]


def _count_compile(event: str, duration: float, **_) -> None:
    if event in _COMPILE_EVENTS:
        _compile_seconds[0] += duration


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def compile_seconds() -> float:
    """Seconds spent lowering and compiling since the process started (take differences
    around a phase to get its share)."""
    return _compile_seconds[0]
