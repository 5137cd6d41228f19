"""The guard that drops compiled programs before the process runs out of memory mappings."""

import jax
import jax.numpy as jnp
import pytest

from jaxrl_agents import compile_cache

linux_only = pytest.mark.skipif(compile_cache.mapping_count() is None, reason="needs /proc")


def _compile_programs(n: int):
    """A jitted function compiled for n shapes; returns it."""
    fn = jax.jit(lambda x: jax.lax.while_loop(lambda c: c[0] < 3,
                                              lambda c: (c[0] + 1, jnp.cos(c[1])), (0, x))[1])
    for size in range(1, n + 1):
        fn(jnp.ones((size, 7))).block_until_ready()
    return fn


@linux_only
def test_release_clears_compiled_programs_and_frees_their_mappings():
    fn = _compile_programs(8)
    assert fn._cache_size() == 8
    before = compile_cache.mapping_count()
    assert compile_cache.release_if_near_limit(fraction=0.0)
    assert fn._cache_size() == 0
    assert compile_cache.mapping_count() < before - 8  # each program held several
    assert float(fn(jnp.ones((2, 7)))[0, 0]) == pytest.approx(float(jnp.cos(jnp.cos(jnp.cos(1.0)))))


@linux_only
def test_nothing_is_released_below_the_limit():
    fn = _compile_programs(2)
    assert compile_cache.mapping_count() < compile_cache.mapping_limit()
    assert not compile_cache.release_if_near_limit(fraction=1.0)
    assert fn._cache_size() == 2


def test_without_proc_it_does_nothing(monkeypatch):
    monkeypatch.setattr(compile_cache, "mapping_count", lambda: None)
    fn = _compile_programs(1)
    assert not compile_cache.release_if_near_limit(fraction=0.0)
    assert fn._cache_size() == 1
