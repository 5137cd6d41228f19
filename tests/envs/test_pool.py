"""EnvPool: same answers as direct env calls, in order, and faults that end only their episodes.

Faults come from the toy env's injection keys: `hang_on` (step sleeps forever), `crash_on`
(the worker kills itself), `raise_on` (step raises), `sleep_s` (every call sleeps).
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
import time

import pytest

import envs
from envs.pool import EnvPool

FAULTS = {"hang_on": "hang", "crash_on": "crash", "raise_on": "raise"}
HANG_TIMEOUT_S = 2.0  # for the pools where an env hangs on purpose
CALM_TIMEOUT_S = 60.0  # elsewhere: never reached, even on a loaded machine


def guess_specs(count, n=16, **extra):
    spec = {"family": "toy", "task": "guess", "n": n, **FAULTS, **extra}
    return [{**spec, "seed": i} for i in range(count)]


def mixed_specs():
    return [
        {"family": "toy", "task": "count", "n": 3, "seed": 0},
        {"family": "toy", "task": "guess", "n": 20, "seed": 1, "reward_density": "dense"},
        {"family": "toy", "task": "count", "n": 4, "seed": 2, "invalid_penalty": 0.5},
        {"family": "toy", "task": "guess", "n": 7, "seed": 3, "obs_format": "raw"},
        {"family": "toy", "task": "guess", "n": 50, "seed": 4, "split": "eval"},
    ]


def make_pool(specs, num_workers=2, **kwargs):
    kwargs.setdefault("timeout_s", CALM_TIMEOUT_S)
    kwargs.setdefault("reset_timeout_s", CALM_TIMEOUT_S)
    return EnvPool(specs, num_workers, **kwargs)


def scripted_actions(task, turn):
    """Gold actions with junk and a wrong answer mixed in, so every branch of the env is hit."""
    junk = ["", "no idea", "0", "ünï ✓"]
    gold = task.gold_actions
    return junk[turn] if turn < len(junk) else gold[min(turn - len(junk), len(gold) - 1)]


def wait_until_dead(pid, timeout_s=10.0):
    """Waits until `pid` has exited (a zombie or gone); the pool reaps it later."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] in "ZX":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not die")


def is_failed(result):
    return result.done and not result.won and result.info.get("failed") is True


def play_gold_to_the_end(pool, ids, turn):
    """Plays the gold actions of envs `ids` from `turn` on; returns their last results."""
    last, live = {}, list(ids)
    while live:
        actions = [pool.tasks[i].gold_actions[turn] for i in live]
        for env_id, result in zip(live, pool.step(live, actions)):
            last[env_id] = result
        live = [i for i in live if not last[i].done]
        turn += 1
    return [last[i] for i in ids]


def test_pool_gives_the_same_results_as_direct_env_calls():
    specs = mixed_specs()
    direct = [envs.make(spec) for spec in specs]
    with make_pool(specs) as pool:
        assert len(pool) == len(specs) and pool.num_workers == 2
        assert pool.tasks == [env.task for env in direct]
        assert pool.reset() == [env.reset() for env in direct]
        for turn in range(12):
            actions = [scripted_actions(env.task, turn) for env in direct]
            assert pool.step(range(len(specs)), actions) == [
                env.step(a) for env, a in zip(direct, actions)
            ]
        assert pool.stats() == {"pool/failures": 0, "pool/restarts": 0}


def test_results_come_back_in_the_order_of_ids():
    specs = mixed_specs()
    direct = [envs.make(spec) for spec in specs]
    with make_pool(specs, num_workers=3) as pool:
        order = [3, 0, 4, 2]
        assert pool.reset(order) == [direct[i].reset() for i in order]
        order = [4, 2, 3, 0, 1]
        actions = [direct[i].task.gold_actions[0] for i in order]
        direct[1].reset()
        assert pool.step(order, actions) == [direct[i].step(a) for i, a in zip(order, actions)]


def test_reset_with_seeds_updates_the_tasks():
    specs = guess_specs(3, n=40)
    with make_pool(specs) as pool:
        pool.reset([2, 0], seeds=[7, 9])
        assert pool.tasks[2] == envs.make({**specs[2], "seed": 7}).task
        assert pool.tasks[0] == envs.make({**specs[0], "seed": 9}).task
        assert pool.tasks[1] == envs.make(specs[1]).task
        assert all(r.won for r in play_gold_to_the_end(pool, [0, 1, 2], 0))


def test_env_exception_becomes_a_failed_result_and_the_worker_lives():
    with make_pool(guess_specs(4)) as pool:
        pids = pool.worker_pids()
        pool.reset()
        first = [pool.tasks[i].gold_actions[0] for i in range(4)]
        results = pool.step([0, 1, 2, 3], ["raise", first[1], first[2], first[3]])
        assert is_failed(results[0]) and results[0].reward == 0.0
        assert "RuntimeError" in results[0].info["error"] and "raise" in results[0].info["error"]
        assert not any(is_failed(r) for r in results[1:])
        assert pool.worker_pids() == pids
        assert pool.stats() == {"pool/failures": 1, "pool/restarts": 0}
        # A failed env must be reset first; env 2 on the same worker kept its state.
        assert is_failed(pool.step([0], ["1"])[0])
        assert all(r.won for r in play_gold_to_the_end(pool, [1, 2, 3], 1))
        pool.reset([0])
        assert play_gold_to_the_end(pool, [0], 0)[0].won


def test_worker_killed_mid_run_fails_its_episodes_and_is_replaced():
    with make_pool(guess_specs(4)) as pool:
        pool.reset()
        pool.step([0, 1, 2, 3], [pool.tasks[i].gold_actions[0] for i in range(4)])
        old_pids = pool.worker_pids()
        os.kill(old_pids[0], 9)  # worker 0 holds envs 0 and 2
        wait_until_dead(old_pids[0])
        results = pool.step([0, 1, 2, 3], [pool.tasks[i].gold_actions[1] for i in range(4)])
        assert is_failed(results[0]) and is_failed(results[2])
        assert "worker 0" in results[0].info["error"]
        assert not is_failed(results[1]) and not is_failed(results[3])
        assert pool.restarts == 1 and pool.failures == 2
        new_pids = pool.worker_pids()
        assert new_pids[0] != old_pids[0] and new_pids[1] == old_pids[1]
        # The others finish with the right results; the new worker serves envs 0 and 2 again.
        assert all(r.won and r.reward == 1.0 for r in play_gold_to_the_end(pool, [1, 3], 2))
        pool.reset([0, 2])
        assert all(r.won for r in play_gold_to_the_end(pool, [0, 2], 0))
        assert pool.restarts == 1


def test_crash_inside_a_step_fails_that_worker_only():
    with make_pool(guess_specs(4)) as pool:
        pool.reset()
        results = pool.step([0, 1, 2], ["crash", pool.tasks[1].gold_actions[0], "1"])
        assert is_failed(results[0]) and is_failed(results[2])  # env 2 shares worker 0
        assert not is_failed(results[1])
        assert pool.restarts == 1
        assert play_gold_to_the_end(pool, [1], 1)[0].won
        assert not is_failed(pool.step([3], [pool.tasks[3].gold_actions[0]])[0])


def test_hung_worker_is_killed_after_the_timeout_and_the_others_go_on():
    with make_pool(guess_specs(4), timeout_s=HANG_TIMEOUT_S) as pool:
        pool.reset()
        old_pids = pool.worker_pids()
        actions = ["hang", pool.tasks[1].gold_actions[0], pool.tasks[2].gold_actions[0]]
        results = pool.step([0, 1, 2], actions)  # worker 0 holds envs 0 and 2
        assert is_failed(results[0]) and "timed out" in results[0].info["error"]
        assert is_failed(results[2]) and not is_failed(results[1])
        assert pool.worker_pids()[0] != old_pids[0] and pool.worker_pids()[1] == old_pids[1]
        assert play_gold_to_the_end(pool, [1], 1)[0].won
        assert not is_failed(pool.step([3], [pool.tasks[3].gold_actions[0]])[0])
        pool.reset([0, 2])
        assert all(r.won for r in play_gold_to_the_end(pool, [0, 2], 0))


def test_envs_of_a_replaced_worker_left_out_of_the_call_are_lost_until_reset():
    with make_pool(guess_specs(4), timeout_s=HANG_TIMEOUT_S) as pool:
        pool.reset()
        results = pool.step([0], ["hang"])
        assert is_failed(results[0])
        lost = pool.step([2], [pool.tasks[2].gold_actions[0]])[0]  # env 2 shared worker 0
        assert is_failed(lost) and "reset" in lost.info["error"]
        pool.reset([2])
        assert play_gold_to_the_end(pool, [2], 0)[0].won


def test_worker_found_dead_before_a_reset_is_replaced_without_failing_it():
    with make_pool(guess_specs(2)) as pool:
        pid = pool.worker_pids()[1]
        os.kill(pid, 9)
        wait_until_dead(pid)
        results = pool.reset()
        assert not any(is_failed(r) for r in results)
        assert pool.restarts == 1 and pool.failures == 0
        assert all(r.won for r in play_gold_to_the_end(pool, [0, 1], 0))


def test_slow_reset_times_out_and_failure_reward_is_used():
    specs = [{"family": "toy", "sleep_s": 30.0}, {"family": "toy"}]
    with make_pool(specs, reset_timeout_s=HANG_TIMEOUT_S, failure_reward=-1.0) as pool:
        result = pool.reset([0])[0]
        assert is_failed(result) and result.reward == -1.0 and "timed out" in result.info["error"]
        assert pool.restarts == 1
        assert not is_failed(pool.step([1], ["1"])[0])  # a fresh toy env plays before a reset


def test_async_step_and_wait_match_step():
    specs = mixed_specs()
    with make_pool(specs) as sync_pool, make_pool(specs) as async_pool:
        assert sync_pool.reset() == (async_pool.reset_async() or async_pool.wait())
        for turn in range(6):
            actions = [scripted_actions(task, turn) for task in sync_pool.tasks]
            async_pool.step_async(range(len(specs)), actions)
            with pytest.raises(RuntimeError, match="in flight"):
                async_pool.step_async([0], ["1"])
            assert async_pool.wait() == sync_pool.step(range(len(specs)), actions)
        with pytest.raises(RuntimeError, match="without a call"):
            async_pool.wait()


def test_bad_calls_and_bad_specs_are_clear_errors():
    with pytest.raises(envs.SpecError, match="'bogus'"):
        make_pool([{"family": "toy"}, {"family": "toy", "bogus": 1}])
    with pytest.raises(envs.SpecError, match="'family'"):
        make_pool([{"task": "count"}])
    with make_pool(guess_specs(2)) as pool:
        with pytest.raises(IndexError, match="out of range"):
            pool.step([2], ["1"])
        with pytest.raises(ValueError, match="repeat"):
            pool.step([1, 1], ["1", "2"])
        with pytest.raises(ValueError, match="actions"):
            pool.step([0, 1], ["1"])


def test_close_stops_the_workers():
    pool = make_pool(guess_specs(3), num_workers=3)
    pids = pool.worker_pids()
    pool.close()
    pool.close()
    for pid in pids:
        wait_until_dead(pid, timeout_s=1.0)
    with pytest.raises(RuntimeError, match="closed"):
        pool.step([0], ["1"])


@pytest.mark.parametrize("start_method", ["exec", "spawn", "forkserver"])
def test_workers_never_import_jax(start_method):
    import jax  # noqa: F401  (the parent has JAX loaded, as the trainer will)

    with make_pool(guess_specs(2), start_method=start_method, reset_timeout_s=60.0) as pool:
        for worker in range(pool.num_workers):
            modules = pool.worker_imports(worker)
            assert "envs.toy_env" in modules and "jax" not in modules
        pool.reset()
        assert all(r.won for r in play_gold_to_the_end(pool, [0, 1], 0))


def test_workers_of_a_script_that_imports_jax_first_do_not_load_jax(tmp_path):
    """The trainer's console script imports JAX at its top; "exec" workers never see it."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import jax
            import envs

            with envs.EnvPool([{"family": "toy"}], 1) as pool:
                print("jax" in pool.worker_imports(0), pool.step([0], ["1"])[0].info["steps"])
            """
        )
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=root, timeout=120,
        env=dict(os.environ, PYTHONPATH=root),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "1"]


def test_the_env_bench_runs_on_the_toy_family(capsys):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "envs.py")
    spec = importlib.util.spec_from_file_location("bench_envs", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--families", "toy", "--seconds", "0.2", "--envs", "2"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.startswith("toy ")]
    assert [(row[1], row[2]) for row in rows] == [
        (policy, where) for where in ("in-proc", "1", "2") for policy in ("gold", "random")
    ]
    assert all(int(row[5]) > 0 and row[7] == "0" for row in rows)  # episodes played, none failed


def flaky_env(spec):
    """A toy env that builds once; later builds (a restarted worker) raise while `marker` exists."""
    if os.path.exists(spec["marker"]):
        raise RuntimeError("flaky env: cannot be rebuilt")
    open(spec["marker"], "w").close()
    return envs.make({"family": "toy"})


def test_a_worker_that_cannot_be_restarted_fails_its_envs_until_it_can(tmp_path):
    marker = str(tmp_path / "built")
    envs.register("flaky", f"{__name__}:flaky_env")  # the workers import this test module
    try:
        with make_pool([{"family": "flaky", "marker": marker}, {"family": "toy"}]) as pool:
            pid = pool.worker_pids()[0]
            os.kill(pid, 9)
            wait_until_dead(pid)
            results = pool.step([0, 1], ["1", "1"])
            assert is_failed(results[0]) and not is_failed(results[1])
            assert is_failed(pool.reset([0])[0])  # the rebuild still fails; nothing raises
            assert not is_failed(pool.step([1], ["2"])[0])
            os.remove(marker)
            assert not is_failed(pool.reset([0])[0])
            assert not is_failed(pool.step([0], ["1"])[0])
    finally:
        del envs.FAMILIES["flaky"]
