"""Checkpointer: NNX + optax round trip, PRNG keys, retention, clear errors, restoring
onto another sharding, and a SIGKILL during saving never leaving a broken checkpoint.

The sharding and kill checks need 8 host devices (XLA_FLAGS is read when JAX starts),
so they run in a child process: this file run as a script.
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIG = 1 << 21  # floats per array in the kill test (8 MiB): saves take a while


def leaves_equal(a, b) -> bool:
    import jax

    def raw(x):
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    return len(la) == len(lb) and all(
        raw(x).dtype == raw(y).dtype and np.array_equal(raw(x), raw(y)) for x, y in zip(la, lb)
    )


def make_state(seed: int):
    """A small NNX model after one Adam step, with both kinds of PRNG key."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(seed))
    _, params = nnx.split(model)
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5 + seed), params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return {
        "params": params,
        "opt_state": opt_state,
        "rng": jax.random.PRNGKey(seed),  # raw uint32 key
        "typed_rng": jax.random.key(seed + 100),  # typed key
        "host_buffer": np.arange(4, dtype=np.int16) + seed,
        "updates_done": seed,
    }


def test_nnx_optax_round_trip(tmp_path):
    from flax import nnx

    from jaxrl_agents.checkpoint import Checkpointer

    state = make_state(1)
    meta = {"update": 7, "curriculum": {"stage": 2, "order": [3, 1, 2]}, "kl_coef": 0.05}
    with Checkpointer(str(tmp_path / "ckpt")) as ckpt:
        assert ckpt.latest_step() is None
        assert ckpt.save(7, state, meta)
        ckpt.wait()
        assert ckpt.latest_step() == 7

    with Checkpointer(str(tmp_path / "ckpt")) as ckpt:  # a fresh process would do this
        template = make_state(2)  # same structure, other values
        restored, restored_meta = ckpt.restore(template=template)
        assert restored_meta == meta
        assert leaves_equal(restored, state)
        assert not leaves_equal(template, state)
        assert isinstance(restored["params"], nnx.State)
        assert type(restored["opt_state"][0]) is type(state["opt_state"][0])
        assert isinstance(restored["host_buffer"], np.ndarray)
        assert restored["updates_done"] == 1 and isinstance(restored["updates_done"], int)
        params_only, _ = ckpt.restore(template={"params": template["params"]}, partial=True)
        assert leaves_equal(params_only["params"], state["params"])
        with pytest.raises(ValueError, match="partial=True"):
            ckpt.restore(template={"params": template["params"]})
        raw, _ = ckpt.restore(7)  # no template: the stored nested dict, as NumPy
        assert isinstance(raw["opt_state"]["0"]["mu"]["bias"]["value"], np.ndarray)
        np.testing.assert_array_equal(
            raw["params"]["kernel"]["value"], state["params"]["kernel"][...]
        )


def test_retention_and_errors(tmp_path):
    import jax.numpy as jnp

    from jaxrl_agents.checkpoint import Checkpointer

    ckpt = Checkpointer(str(tmp_path), keep=2)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.restore(template={"w": jnp.zeros(3)})
    for step in range(1, 6):
        assert ckpt.save(step, {"w": jnp.full(3, float(step))}, {"step": step})
    assert ckpt.save(5, {"w": jnp.zeros(3)}) is False  # already on disk: kept as is
    ckpt.wait()
    assert ckpt.all_steps() == [4, 5]
    state, meta = ckpt.restore(4, template={"w": jnp.zeros(3)})
    np.testing.assert_array_equal(state["w"], [4.0, 4.0, 4.0])
    assert meta == {"step": 4}
    with pytest.raises(FileNotFoundError, match="step 2"):
        ckpt.restore(2, template={"w": jnp.zeros(3)})
    with pytest.raises(ValueError, match="'w' has shape"):
        ckpt.restore(template={"w": jnp.zeros(4)})
    with pytest.raises(KeyError, match="'critic/w'"):
        ckpt.restore(template={"w": jnp.zeros(3), "critic": {"w": jnp.zeros(3)}})


def test_always_kept_steps_survive_retention(tmp_path):
    import jax.numpy as jnp

    from jaxrl_agents.checkpoint import Checkpointer

    ckpt = Checkpointer(str(tmp_path), keep=2, always_keep=(0,))
    for step in range(0, 6):
        assert ckpt.save(step, {"w": jnp.full(3, float(step))})
    ckpt.wait()
    assert ckpt.all_steps() == [0, 4, 5]
    state, _ = ckpt.restore(0, template={"w": jnp.zeros(3)})
    np.testing.assert_array_equal(state["w"], [0.0, 0.0, 0.0])
    with pytest.raises(TypeError, match="dict of pytrees"):
        ckpt.save(9, [jnp.zeros(3)])
    with pytest.raises(TypeError, match="meta.controller.fn"):
        ckpt.save(9, {"w": jnp.zeros(3)}, {"controller": {"fn": print}})
    ckpt.save(6, {"w": jnp.zeros(3)}, {"coef": np.float32(0.5), "pos": (1, jnp.int32(2))})
    ckpt.wait()
    assert ckpt.restore(6, template={"w": jnp.zeros(3)})[1] == {"coef": 0.5, "pos": [1, 2]}
    ckpt.close()


# --- child process: 8 host devices ---------------------------------------------------


def child_reshard(directory: str) -> dict:
    """Saves sharded over 8 devices, restores onto another mesh and onto one device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxrl_agents.checkpoint import Checkpointer

    devices = np.array(jax.devices())
    row_mesh = jax.sharding.Mesh(devices.reshape(8, 1), ("a", "b"))
    grid_mesh = jax.sharding.Mesh(devices.reshape(2, 4), ("a", "b"))
    value = jnp.arange(64.0).reshape(8, 8)
    saved = {"w": jax.device_put(value, NamedSharding(row_mesh, P("a", None)))}
    with Checkpointer(directory) as ckpt:
        ckpt.save(1, saved)
        ckpt.wait()
        grid = NamedSharding(grid_mesh, P("b", "a"))
        template = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=grid)}
        on_grid, _ = ckpt.restore(template=template)
        one = {"w": jax.device_put(jnp.zeros((8, 8)), jax.devices()[3])}
        on_one, _ = ckpt.restore(template=one)
    return {
        "grid_equal": bool(np.array_equal(on_grid["w"], value)),
        "grid_sharding": on_grid["w"].sharding == grid,
        "one_equal": bool(np.array_equal(on_one["w"], value)),
        "one_device": str(list(on_one["w"].devices())[0]) == str(jax.devices()[3]),
    }


def _half_written(directory: str) -> set[int]:
    """The steps whose orbax temporary directory ("<step>.orbax-checkpoint-tmp-...") is in
    `directory`: saves under way, or cut short by a kill."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return {int(n.split(".")[0]) for n in names if "tmp" in n}


def _wait_for_temporary(directory: str, step: int, seconds: float = 30.0) -> None:
    """Returns once orbax's temporary directory of `step` exists (the async save creates
    it in the background: a kill before that would catch no half-written step)."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and step not in _half_written(directory):
        time.sleep(0.005)


def child_writer(directory: str) -> None:
    """Saves step after step of sharded arrays whose values encode the step, printing
    'started N' once each async save's temporary directory exists; the parent kills us."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxrl_agents.checkpoint import Checkpointer

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("a",))
    sharding = NamedSharding(mesh, P("a"))
    ckpt = Checkpointer(directory, keep=2)
    for step in range(1, 1000):
        state = {
            "params": {"w": jax.device_put(jnp.full(BIG, float(step)), sharding)},
            "rng": jax.random.PRNGKey(step),
        }
        ckpt.save(step, state, {"step": step})
        _wait_for_temporary(directory, step)
        print(f"started {step}", flush=True)


def test_reshard_and_sigkill_during_save(tmp_path):
    import jax
    import jax.numpy as jnp

    from jaxrl_agents.checkpoint import Checkpointer

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    directory = str(tmp_path / "ckpt")
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "child", directory],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        report = json.loads(proc.stdout.readline())
        assert report == {"grid_equal": True, "grid_sharding": True,
                          "one_equal": True, "one_device": True}
        for line in proc.stdout:  # kill while step 4 is being written in the background
            if line.strip() == "started 4":
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    # The kill caught a step half-written: orbax's temporary directory is left ...
    half_written = _half_written(directory)
    assert half_written, os.listdir(directory)

    with Checkpointer(directory) as ckpt:
        steps = ckpt.all_steps()  # ... and is not listed
        assert steps and steps[-1] >= 2 and not half_written & set(steps)
        assert ckpt.latest_step() == steps[-1]
        template = {"params": {"w": jnp.zeros(BIG)}, "rng": jax.random.PRNGKey(0)}
        for step in steps:  # every listed checkpoint is whole
            state, meta = ckpt.restore(step, template=template)
            assert meta == {"step": step}
            np.testing.assert_array_equal(np.asarray(state["params"]["w"]), float(step))
            np.testing.assert_array_equal(state["rng"], jax.random.PRNGKey(step))
        # The resumed run saves the half-written step again, over orbax's leftovers.
        redo = min(half_written)
        state = {"params": {"w": jnp.full(BIG, -1.0)}, "rng": jax.random.PRNGKey(redo)}
        assert ckpt.save(redo, state, {"step": redo})
        ckpt.wait()
        assert ckpt.latest_step() == redo
        again, _ = ckpt.restore(template=template)
        assert leaves_equal(again, state)


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    print(json.dumps(child_reshard(sys.argv[2] + "_reshard")), flush=True)
    child_writer(sys.argv[2])
