"""On-disk game cache and parallel generation shared by the TextWorld and ALFWorld envs.

A generated game lives in its own directory `<cache_root>/<key>/`, where the key names the
generation parameters and the seed, so a second request for the same game only reads files.
Directories are built under a temporary name and renamed into place, so a crash or two
processes generating the same game never leave a half-written game behind.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

CACHE_ENV_VAR = "JAXRL_CACHE"


def cache_root(family: str, cache_dir: str | None = None) -> str:
    """The directory holding a family's games: `cache_dir`, else $JAXRL_CACHE/<family>,
    else ~/.cache/jaxrl_agents/<family>."""
    if cache_dir:
        return os.path.abspath(os.path.expanduser(cache_dir))
    base = os.environ.get(CACHE_ENV_VAR) or os.path.join("~", ".cache", "jaxrl_agents")
    return os.path.abspath(os.path.join(os.path.expanduser(base), family))


def build_once(root: str, key: str, build: Callable[[str], None], marker: str) -> str:
    """Returns `<root>/<key>`, calling `build(tmp_dir)` to fill it when `marker` is missing.

    `build` writes its files into a fresh temporary directory, which is then renamed to the
    final path; when another process won the race, its copy is kept and ours discarded.
    """
    final = os.path.join(root, key)
    if os.path.exists(os.path.join(final, marker)):
        return final
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{key}.", dir=root)
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # someone else published it first (or a stale, incomplete dir)
            if not os.path.exists(os.path.join(final, marker)):
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def parallel_map(fn: Callable[[Any], Any], items: Sequence[Any], num_workers: int) -> list:
    """`[fn(x) for x in items]` over `num_workers` spawned processes (in order).

    Spawn, not fork: the caller may have JAX or threads loaded, which fork does not survive.
    """
    items = list(items)
    if num_workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(min(num_workers, len(items))) as pool:
        return pool.map(fn, items, chunksize=1)
