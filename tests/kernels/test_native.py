"""The C++ GAE kernel (`kernels.native`) against the pure-JAX scan and the NumPy loop.

`kernels.gae` takes the C++ path on CPU whenever it is built, so the tests of
`test_gae.py` run through it too; these check the kernel directly, where the batch is not
a multiple of its eight interleaved rows, under `vmap`, and inside a jit whose inputs
are sharded over 8 host devices (run as a child process: `__main__` below).
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_agents.kernels import native
from jaxrl_agents.kernels.gae import _gae_scan, gae
from tests.kernels import references as ref

needs_kernel = pytest.mark.skipif(native._compiler() is None,
                                  reason="no C++ compiler on this machine")


def _large_batch(seed, rows, action_share):
    """Random float32 rewards, values [rows, 4096] and a mask with `action_share` ones."""
    rng = np.random.default_rng(seed)
    shape = (rows, 4096)
    rewards, values = (rng.normal(size=shape).astype(np.float32) for _ in range(2))
    return rewards, values, (rng.random(shape) < action_share).astype(np.float32)


@needs_kernel
def test_the_kernel_builds_where_a_compiler_exists():
    assert native.available(), native._state.get("error")


@needs_kernel
@pytest.mark.parametrize("batch", [1, 7, 8, 13])
@pytest.mark.parametrize("truncated", [False, True])
def test_kernel_matches_the_numpy_loop(batch, truncated):
    rewards, values, mask, last_value = ref.random_batch(batch, batch=batch, length=57,
                                                         all_padding_row=batch > 1,
                                                         one_token_row=batch > 1)
    lv = last_value if truncated else np.zeros(batch, np.float32)
    adv, ret = jax.jit(native.gae_cpu)(rewards, values, mask, lv, 0.99, 0.95)
    want_adv, want_ret = ref.gae(rewards, values, mask, 0.99, 0.95, lv if truncated else None)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(adv)[mask == 0] == 0)


@needs_kernel
def test_kernel_matches_the_scan_at_benchmark_size():
    rewards, values, mask = _large_batch(0, 64, 0.3)
    last_value = np.random.default_rng(0).normal(size=64).astype(np.float32)
    got = jax.jit(native.gae_cpu)(rewards, values, mask, last_value, 0.99, 0.95)
    want = jax.jit(_gae_scan)(rewards, values, mask, last_value, 0.99, 0.95)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_two_large_calls_in_one_jit_both_finish_and_agree():
    # Large enough to be split over XLA's threads; two independent calls may run at once.
    rewards, values, mask = _large_batch(1, 32, 0.5)
    zeros = np.zeros(32, np.float32)

    def both(r, v, m):
        a = native.gae_cpu(r, v, m, zeros, 0.99, 0.95)[0]
        b = native.gae_cpu(2 * r, v, m, zeros, 0.99, 0.95)[0]
        return a, b

    a, b = jax.jit(both)(rewards, values, mask)
    want_a, _ = _gae_scan(rewards, values, mask, zeros, 0.99, 0.95)
    want_b, _ = _gae_scan(2 * rewards, values, mask, zeros, 0.99, 0.95)
    np.testing.assert_allclose(a, want_a, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b, want_b, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_gae_under_vmap_and_with_traced_coefficients():
    rewards, values, mask, last_value = ref.random_batch(5)
    stacked = np.stack([rewards, 2 * rewards])

    def one(r, gamma):
        return gae(r, values, mask, gamma, 0.9, last_value=last_value)[0]

    got = jax.jit(jax.vmap(one))(stacked, jnp.array([0.99, 0.5]))
    for i, (r, gamma) in enumerate(zip(stacked, (0.99, 0.5))):
        want, _ = ref.gae(r, values, mask, gamma, 0.9, last_value)
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_take_the_scan():
    rewards, values, mask, _ = ref.random_batch(6)
    adv, _ = gae(rewards, values.astype(jnp.bfloat16), mask, 0.99, 0.95)
    assert adv.dtype == jnp.bfloat16
    want, _ = ref.gae(rewards, values.astype(jnp.bfloat16).astype(np.float32), mask, 0.99, 0.95)
    np.testing.assert_allclose(np.asarray(adv, np.float32), want, rtol=0.05, atol=0.05)


@needs_kernel
def test_gae_inside_a_jit_sharded_over_eight_devices():
    from tests.eight_devices import report_of

    report = report_of(__file__)
    assert report["devices"] == 8 and report["native"]
    assert report["max_error"] < 1e-5
    assert report["rows_sharded"]


def _eight_device_report() -> dict:
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((8,), ("data",))
    rewards, values, mask, last_value = ref.random_batch(11, batch=16, length=64)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    args = [jax.device_put(x, rows) for x in (rewards, values, mask, last_value)]
    adv, _ = jax.jit(lambda r, v, m, lv: gae(r, v, m, 0.99, 0.95, last_value=lv))(
        *args)
    want, _ = ref.gae(rewards, values, mask, 0.99, 0.95, last_value)
    return {"devices": jax.device_count(), "native": native.available(),
            "max_error": float(np.abs(np.asarray(adv) - want).max()),
            "rows_sharded": len(args[0].sharding.device_set) == 8}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    print(json.dumps(_eight_device_report()))
