"""Multi-host training: two JAX processes (1 host CPU device each, gloo collectives,
coordinator on 127.0.0.1) each feed half of a fixed batch to the RL learner, with the
parameters and the batch split over the two (mesh fsdp=2); one process with 2 devices
feeds the whole batch. Losses, metrics and final parameters must agree.

One device a process: with 2 devices a process, XLA:CPU's gloo collectives deadlocked
now and then (2 of 5 launches on a loaded 2-core machine, 2026-12-04: a process stuck
in a resharding program's Execute; 0 of 8 with one device a process). TPU and
GPU hosts do not use these CPU collectives.

End to end: `jaxrl-train` on the toy game as two processes and as one must write the same
logs, evaluations and checkpoints.

This file is also the worker script (XLA_FLAGS must be set before JAX starts):
    python tests/test_multihost.py OUT.npz [PROCESS_ID NUM_PROCESSES PORT]
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPDATES = 3
EPISODES = 8
TIMEOUT_S = 600  # a hung collective fails the test instead of blocking the suite


# -- the worker (runs in a child process)


def worker(out: str, process_id: int = 0, num_processes: int = 1, port: int = 0) -> None:
    from configs.base import get_config
    from jaxrl_agents import distributed

    cfg = get_config()
    if port:
        cfg.distributed.enabled = "true"
        cfg.distributed.coordinator_address = f"127.0.0.1:{port}"
        cfg.distributed.num_processes = num_processes
        cfg.distributed.process_id = process_id
    else:
        cfg.distributed.enabled = "false"
    initialized = distributed.maybe_initialize(cfg)  # before any other JAX call

    import jax
    import optax

    from jaxrl_agents.sharding import make_mesh
    from jaxrl_agents.trainer.kl_control import KLController
    from jaxrl_agents.trainer.rl import RLHyper, RLLearner
    from tests.trainer.helpers import random_batch, tiny_actor_critic

    assert initialized == bool(port) and jax.process_count() == num_processes
    assert jax.device_count() == 2 and distributed.is_main_process() == (process_id == 0)
    mesh = make_mesh({"data": 1, "fsdp": 2})  # parameters and batch split over the processes
    ac = tiny_actor_critic(seed=0)
    learner = RLLearner(
        ac,
        RLHyper.defaults(estimator="gae", entropy_coef=0.01),
        optax.adam(3e-3),
        ppo_epochs=1,
        minibatch_size=4,  # two optimizer steps per update, on permuted global rows
        kl=KLController("adaptive", coef=0.1, target=0.01, horizon=100),  # uses global tokens
        mesh=mesh,
    )
    state = learner.init_state(ac)
    params_at_start = [np.asarray(p) for p in jax.tree.leaves(distributed.local_copy(state.params))]
    batch = random_batch(0, episodes=EPISODES)
    local = batch.rows(distributed.process_slice(EPISODES))
    key = jax.random.key(0)
    rows = []
    for u in range(UPDATES):
        state, metrics = learner.update(state, local, jax.random.fold_in(key, u))
        rows.append([metrics[k] for k in ("losses/total", "charts/return_mean", "kl/coef")])
    params = [np.asarray(p) for p in jax.tree.leaves(distributed.local_copy(state.params))]
    moved = max(float(np.abs(a - b).max()) for a, b in zip(params, params_at_start))

    shapes_error = ""
    try:  # 4 rows on process 0, 8 on process 1: an error on both, not a hang
        distributed.global_batch({"x": np.zeros((4 + 4 * process_id, 3))}, mesh)
    except ValueError as err:
        shapes_error = str(err)
    np.savez(
        out,
        metrics=np.array(rows),
        local_rows=local.shape[0],
        agree_max=distributed.agree_max([process_id, 10 - process_id]),
        allgather=distributed.allgather_rows(np.arange(process_id + 1)),
        shapes_error=shapes_error,
        moved=moved,
        **{f"param_{i}": np.asarray(p) for i, p in enumerate(params)},
    )


# -- the tests (launch workers, compare their outputs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(cmd, devices: int, log_path):
    """Starts `cmd` in the repo root with `devices` host CPU devices, output to log_path."""
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=ROOT,
    )
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(name, None)
    log = open(log_path, "w")
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log


def _launch(args, devices: int, log_path):
    return _spawn([sys.executable, os.path.abspath(__file__), *map(str, args)], devices, log_path)


def _wait_all(procs, timeout_s: float) -> None:
    """Waits for every child; on a failure or the timeout the others are killed."""
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("multihost")
    port = _free_port()
    jobs = {f"p{i}": ([out / f"p{i}.npz", i, 2, port], 1) for i in range(2)}
    jobs["single"] = ([out / "single.npz"], 2)
    launched = {
        name: _launch(args, devices, out / f"{name}.log") for name, (args, devices) in jobs.items()
    }
    procs = [p for p, _ in launched.values()]
    _wait_all(procs, TIMEOUT_S)
    for name, (proc, log) in launched.items():
        log.close()
        text = (out / f"{name}.log").read_text()
        assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{text[-4000:]}"
    return {name: dict(np.load(out / f"{name}.npz")) for name in jobs}


def test_each_process_feeds_half_the_batch(results):
    assert results["p0"]["local_rows"] == results["p1"]["local_rows"] == EPISODES // 2
    assert results["single"]["local_rows"] == EPISODES


def test_two_processes_train_like_one(results):
    single = results["single"]
    for name in ("p0", "p1"):
        np.testing.assert_allclose(
            results[name]["metrics"], single["metrics"], rtol=2e-5, atol=1e-6
        )
    losses = single["metrics"][:, 0]
    assert np.all(np.isfinite(losses)) and len(set(losses.tolist())) == UPDATES
    # Adam divides by sqrt(v): where gradients are ~0, float32 reduction-order noise moves a
    # parameter by up to ~1e-3 of a step (lr 3e-3); the training moved them by far more.
    assert single["moved"] > 1e-2
    param_keys = [k for k in single if k.startswith("param_")]
    assert param_keys
    for name in ("p0", "p1"):
        for k in param_keys:
            np.testing.assert_allclose(results[name][k], single[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_collective_helpers(results):
    for name in ("p0", "p1"):
        r = results[name]
        assert r["agree_max"].tolist() == [1, 10]
        assert r["allgather"].tolist() == [0, 0, 1]  # process 0's row, then process 1's two
        assert "different shapes" in str(r["shapes_error"])
    assert results["single"]["allgather"].tolist() == [0]
    assert str(results["single"]["shapes_error"]) == ""


# -- jaxrl-train end to end: two processes (1 device each) and one, greedy sampling


def _train_cmd(out, name, *args, **values):
    """A tiny toy run with config overrides `values` ("a.b": v) and extra arguments."""
    base = {
        "output_dir": str(out),
        "name": name,
        "env.size": 2,
        "env.num_train_tasks": 4,
        "env.num_eval_tasks": 4,
        # Rewards even for a policy that never counts right: with all-zero returns the
        # whitened advantages would be float noise, and no two runs would agree.
        "env.invalid_penalty": 0.5,
        "rollout.episodes_per_batch": 4,  # two per process
        "rollout.temperature": 0,  # greedy: episodes depend on the parameters alone
        "rl.episodes_per_epoch": 8,  # two RL updates
        "rl.minibatch_size": 2,
        "rl.ppo_epochs": 1,
        "sft.num_trajectories": 4,
        "sft.epochs": 2,
        "sft.batch_size": 4,
        "checkpoint.every": 1,
        "logging.progress_bar": False,
        "logging.tensorboard": False,
        "logging.plots": False,
        "distributed.enabled": "false",
    }
    overrides = [f"--config.{k}={v}" for k, v in {**base, **values}.items()]
    cli = [sys.executable, "-m", "jaxrl_agents.cli", "--config", "configs/toy_tiny.py"]
    return cli + overrides + list(args)


def _two_process_cmds(out, name, *args, **values) -> dict:
    port = _free_port()
    cmds = {}
    for i in range(2):
        distributed = {
            "distributed.enabled": "true",
            "distributed.coordinator_address": f"127.0.0.1:{port}",
            "distributed.num_processes": 2,
            "distributed.process_id": i,
        }
        cmds[f"p{i}"] = _train_cmd(out, name, *args, **values, **distributed)
    return cmds


def _run_all(cmds: dict, out) -> dict:
    """Runs the commands together (1 CPU device each); their logs, all having exited 0."""
    launched = {name: _spawn(cmd, 1, out / f"{name}.log") for name, cmd in cmds.items()}
    _wait_all([p for p, _ in launched.values()], TIMEOUT_S)
    logs = {}
    for name, (proc, log) in launched.items():
        log.close()
        logs[name] = (out / f"{name}.log").read_text()
        assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{logs[name][-4000:]}"
    return logs


@pytest.fixture(scope="module")
def train_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("multihost_train")
    cmds = {**_two_process_cmds(out, "multi"), "single": _train_cmd(out, "single")}
    return out, _run_all(cmds, out)


def _timing(key: str) -> bool:
    """Wall-clock metrics, which differ between any two runs."""
    return key == "wall_time" or key.startswith("perf/") or key.endswith(("_s", "wait_frac"))


def _comparable(rows):
    return [{k: v for k, v in row.items() if not _timing(k)} for row in rows]


@pytest.mark.slow
def test_two_process_train_writes_one_set_of_outputs(train_runs):
    from jaxrl_agents.checkpoint import Checkpointer
    from jaxrl_agents.run_records import read_metrics

    out, logs = train_runs
    run = out / "multi"
    rows = read_metrics(str(run))  # process 1 writing too would double every row
    assert [r["step"] for r in rows] == [0, 0, 1, 2]  # two SFT epochs, two RL updates
    assert all(r["rollout/episodes"] == 4 for r in rows[2:])  # both processes' episodes
    evals = json.loads((run / "eval.json").read_text())
    assert evals["sft"]["n"] == evals["rl"]["n"] == 4  # the whole held-out set
    assert json.loads((run / "config.json").read_text())["distributed"]["num_processes"] == 2
    assert (run / "summary.json").exists() and (run / "tokenizer" / "tokenizer.json").exists()
    assert "held-out success after RL" in logs["p0"]
    assert "held-out success" not in logs["p1"]
    with Checkpointer(str(run / "checkpoints")) as ckpt:
        assert ckpt.latest_step() == 2
        state, meta = ckpt.restore()
    assert meta["progress"]["update"] == 2 and meta["progress"]["sft_done"]
    assert state["learner"]["params"]


@pytest.mark.slow
def test_two_process_train_matches_one_process(train_runs):
    from jaxrl_agents.run_records import read_metrics

    out, _ = train_runs
    multi = _comparable(read_metrics(str(out / "multi")))
    single = _comparable(read_metrics(str(out / "single")))
    assert [sorted(r) for r in multi] == [sorted(r) for r in single]
    for got, want in zip(multi, single):
        for key, value in want.items():
            if isinstance(value, float):  # the 2-device learner sums in another order
                assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
            else:
                assert got[key] == value, key
    a = json.loads((out / "multi" / "eval.json").read_text())
    b = json.loads((out / "single" / "eval.json").read_text())
    for stage in ("sft", "rl"):
        assert a[stage].pop("per_game") == b[stage].pop("per_game"), stage  # game by game
        assert a[stage] == pytest.approx(b[stage]), stage


@pytest.mark.slow
def test_two_process_train_resumes_from_its_checkpoint(train_runs):
    from jaxrl_agents.checkpoint import Checkpointer
    from jaxrl_agents.run_records import read_metrics

    out, _ = train_runs
    shutil.copytree(out / "multi", out / "resumed")
    more = {"rl.episodes_per_epoch": 12}  # a third update after the restored two
    _run_all(_two_process_cmds(out, "resumed", "--resume", **more), out)
    rows = read_metrics(str(out / "resumed"))
    assert [r["step"] for r in rows] == [0, 0, 1, 2, 3]
    before = _comparable(read_metrics(str(out / "multi")))
    assert _comparable(rows[:4]) == before  # the restored run's rows are kept as they were
    with Checkpointer(str(out / "resumed" / "checkpoints")) as ckpt:
        assert ckpt.latest_step() == 3


# -- pure helpers, in this process


def test_process_slices_tile_the_range():
    from jaxrl_agents.distributed import process_slice

    for n, count in [(8, 2), (7, 3), (2, 4), (0, 2)]:
        slices = [process_slice(n, i, count) for i in range(count)]
        covered = [j for s in slices for j in range(n)[s]]
        assert covered == list(range(n))
        sizes = [s.stop - s.start for s in slices]
        assert max(sizes) - min(sizes) <= 1


def test_init_args_from_config_and_environment():
    from configs.base import get_config
    from jaxrl_agents.distributed import init_args

    section = get_config().distributed
    assert init_args(section, {}) is None  # auto, nothing set: single process
    env = {
        "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
        "JAX_NUM_PROCESSES": "4",
        "JAX_PROCESS_ID": "2",
    }
    assert init_args(section, env) == {
        "coordinator_address": "10.0.0.1:1234",
        "num_processes": 4,
        "process_id": 2,
    }
    assert init_args(section, {"TPU_WORKER_HOSTNAMES": "h0,h1"}) == {}  # JAX detects the rest
    section.process_id = 0
    section.coordinator_address = "h0:99"
    assert init_args(section, env) == {
        "coordinator_address": "h0:99",
        "num_processes": 4,
        "process_id": 0,
    }
    section.enabled = "false"
    assert init_args(section, env) is None
    section.enabled = "true"
    section.coordinator_address, section.process_id = "", -1
    assert init_args(section, {}) == {}  # true with nothing set: JAX's own detection
    section.enabled = "maybe"
    with pytest.raises(ValueError, match="distributed.enabled"):
        init_args(section, {})


if __name__ == "__main__":
    out_path, *rest = sys.argv[1:]
    worker(out_path, *map(int, rest))
