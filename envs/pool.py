"""EnvPool: environments in worker processes, batched reset/step, per-call timeouts, restarts.

Env `i` of `specs` lives in worker `i % num_workers` (at most one worker per env). A batched
call sends every worker its share first and then gathers the answers, so the workers run in
parallel; inside one worker its envs run one after the other. Results come back in the order
of `ids`. Workers exchange plain data only (spec dicts, action strings, StepResults, TaskSpec
dicts); `tasks` holds the TaskSpecs the workers reported at start and after each reset.

    with EnvPool([{"family": "toy", "seed": i} for i in range(8)], num_workers=2) as pool:
        results = pool.reset()                       # list[StepResult], one per env
        results = pool.step(range(8), ["1"] * 8)     # one action per env id

Faults never raise out of `reset` / `step`; they end the affected episodes as failed, a
`StepResult(observation="", reward=failure_reward, done=True, won=False,
info={"failed": True, "error": "..."})`:

- an env that raises inside reset/step: that episode fails, the worker and its other envs go on;
- a worker that dies (kill -9, a segfault) or whose env does not answer within the timeout
  (`timeout_s` for a step, `reset_timeout_s` for a reset, counted per env call) is killed and
  replaced by a fresh worker that rebuilds its envs from their specs. The envs of that worker
  in the call fail; its other envs lost their state too, so their next step fails the same way
  ("lost") until they are reset. Episodes on the other workers go on untouched. A worker found
  dead at the start of a reset is replaced first and the reset goes on without failing.

An env whose result was a failure must be reset before it is stepped again. Every fault is
logged (logger "envs.pool") and counted in `failures` (failed results returned) and `restarts`
(workers replaced); `stats()` gives both as metrics.

Start methods: "exec" (default) runs each worker as a fresh `python -m envs.pool` talking over
a socket pair, so a worker imports only `envs` and its family modules, never the parent's main
script (nor JAX through it). "spawn" and "forkserver" use multiprocessing; they too are safe
with JAX loaded in the parent (no fork of it), but they re-import the parent's main script in
each worker when it was started as a file (a console script importing JAX at its top would load
JAX in every worker).

Overlapping env stepping with model compute: `step_async(ids, actions)` (or `reset_async`)
sends the requests and returns at once; `wait()` gathers them into the list `step` would have
returned. One call may be in flight at a time; timeouts count from when `wait()` starts.
"""

from __future__ import annotations

import logging
import multiprocessing
import operator
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_ready

import envs
from envs.base import SpecError, StepResult, TaskSpec

log = logging.getLogger(__name__)

START_METHODS = ("exec", "spawn", "forkserver")
_CLOSE_GRACE_S = 1.0  # seconds a closing worker gets to exit before it is killed
_START_GRACE_S = 30.0  # seconds for a worker process to start, on top of building its envs


def failed_result(error: str, reward: float = 0.0, **info) -> StepResult:
    """The StepResult of an episode ended by a fault."""
    return StepResult("", float(reward), True, False, {"failed": True, "error": error, **info})


# -- worker side --------------------------------------------------------------------------------


def _build_envs(init: dict) -> dict:
    """{env id: Env} from the init message; a bad spec raises naming its env id."""
    envs.FAMILIES.update(init["families"])
    built = {}
    for env_id, spec in init["specs"].items():
        try:
            built[env_id] = envs.make(spec)
        except Exception as exc:
            raise type(exc)(f"env {env_id} (spec {spec!r}): {exc}") from exc
    return built


def _call_env(env, kind: str, env_id: int, arg, failure_reward: float) -> tuple:
    """One reset/step answer: (env id, StepResult, task dict after a reset or None)."""
    try:
        if kind == "reset":
            return env_id, env.reset(arg), env.task.to_dict()
        return env_id, env.step(arg), None
    except Exception as exc:
        error = f"env {env_id} raised in {kind}: {type(exc).__name__}: {exc}"
        tb = traceback.format_exc(limit=8)
        return env_id, failed_result(error, failure_reward, traceback=tb), None


def serve(conn: Connection) -> None:
    """The worker loop: build the envs, then answer requests until "close" or the pipe ends.

    Messages in: ("init", {"families", "specs": {id: spec}, "failure_reward"}),
    ("reset", [(id, seed), ...]), ("step", [(id, action), ...]), ("modules",), ("close",).
    Out: ("ready", {id: task dict}) or ("error", (exception type name, message)) after init;
    one (id, StepResult, task dict | None) per reset/step item, in order; a module name list.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        _, init = conn.recv()
        built = _build_envs(init)
    except Exception as exc:
        conn.send(("error", (type(exc).__name__, str(exc))))
        return
    conn.send(("ready", {env_id: env.task.to_dict() for env_id, env in built.items()}))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        kind = message[0]
        if kind == "close":
            return
        if kind == "modules":
            conn.send(sorted(sys.modules))
            continue
        for env_id, arg in message[1]:
            conn.send(_call_env(built[env_id], kind, env_id, arg, init["failure_reward"]))


# -- parent side: one worker process ------------------------------------------------------------


def _launch(start_method: str, name: str) -> tuple[object, Connection]:
    """Starts a worker process running `serve`; returns (process handle, parent connection)."""
    if start_method == "exec":
        parent_sock, child_sock = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.abspath(envs.__file__)))
        path = [root] + [p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
        fd = child_sock.fileno()
        proc = subprocess.Popen(
            [sys.executable, "-m", "envs.pool", str(fd)], pass_fds=(fd,), env=env
        )
        child_sock.close()
        return proc, Connection(parent_sock.detach())
    context = multiprocessing.get_context(start_method)
    parent_conn, child_conn = context.Pipe(duplex=True)
    proc = context.Process(target=serve, args=(child_conn,), name=name, daemon=True)
    proc.start()
    child_conn.close()
    return proc, parent_conn


class _Worker:
    """One worker process, its connection, its env ids and the answers it still owes."""

    def __init__(self, index: int, env_ids: list[int], start_method: str, init: dict):
        self.index = index
        self.env_ids = env_ids
        self.proc, self.conn = _launch(start_method, name=f"envs-worker-{index}")
        self.pending: list[int] = []  # env ids whose answers are due, in the order sent
        self.deadline = 0.0
        self.conn.send(("init", init))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        if isinstance(self.proc, subprocess.Popen):
            return self.proc.poll() is None
        return self.proc.is_alive()

    def exit_code(self):
        if isinstance(self.proc, subprocess.Popen):
            return self.proc.poll()
        return self.proc.exitcode

    def _reap(self, timeout: float) -> bool:
        try:
            if isinstance(self.proc, subprocess.Popen):
                self.proc.wait(timeout)
            else:
                self.proc.join(timeout)
        except subprocess.TimeoutExpired:
            pass
        return not self.alive()

    def stop(self, grace_s: float = 0.0) -> None:
        """Asks the worker to exit (when `grace_s` > 0), kills it if it does not, reaps it."""
        if grace_s > 0 and self.alive():
            try:
                self.conn.send(("close",))
            except (OSError, ValueError):
                pass
        if not self._reap(grace_s) and self.alive():
            self.proc.kill()
            self._reap(5.0)
        self.conn.close()


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop(_CLOSE_GRACE_S)
    workers.clear()


# -- the pool -----------------------------------------------------------------------------------


class EnvPool:
    """Environments from `specs` (envs.make dicts) in `num_workers` processes; see the module doc.

    timeout_s: seconds one env step may take before its worker is killed and replaced.
    reset_timeout_s: the same for one env reset, and per env for building a worker's envs
        (plus 30 s for the process to start).
    failure_reward: the reward of a failed result.
    start_method: "exec" (default), "spawn" or "forkserver".
    """

    def __init__(
        self,
        specs: Sequence[dict],
        num_workers: int,
        *,
        timeout_s: float = 60.0,
        reset_timeout_s: float = 300.0,
        failure_reward: float = 0.0,
        start_method: str = "exec",
    ):
        if start_method not in START_METHODS:
            raise ValueError(f"start_method {start_method!r}; one of {list(START_METHODS)}")
        if not specs:
            raise ValueError("EnvPool needs at least one spec")
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        for i, spec in enumerate(specs):
            if not isinstance(spec, dict) or "family" not in spec:
                raise SpecError(f"spec {i} is not a dict with a 'family' key: {spec!r}")
        self._specs = [dict(spec) for spec in specs]
        self.num_workers = min(num_workers, len(self._specs))
        self.timeout_s = float(timeout_s)
        self.reset_timeout_s = float(reset_timeout_s)
        self.failure_reward = float(failure_reward)
        self.start_method = start_method
        self.failures = 0  # failed results returned
        self.restarts = 0  # workers replaced
        self._tasks: list[TaskSpec | None] = [None] * len(self._specs)
        self._needs_reset: set[int] = set()  # envs whose state was lost or failed
        self._retired: set[int] = set()  # workers killed, to be replaced
        self._inflight: tuple | None = None  # (kind, ids, results, timeout_s)
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)
        try:
            for index in range(self.num_workers):
                self._workers.append(self._launch_worker(index))
            errors = self._await_ready(self._workers)
        except BaseException:
            self.close()
            raise
        if errors:
            self.close()
            index, (type_name, message) = next(iter(errors.items()))
            error_type = SpecError if type_name == "SpecError" else RuntimeError
            raise error_type(f"env worker {index} could not build its envs: {message}")

    # -- public API ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._specs)

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def specs(self) -> list[dict]:
        return [dict(spec) for spec in self._specs]

    @property
    def tasks(self) -> list[TaskSpec]:
        """The TaskSpec of every env (refreshed by each reset, which may change the task)."""
        return list(self._tasks)

    def worker_of(self, env_id: int) -> int:
        return env_id % self.num_workers

    def worker_pids(self) -> list[int]:
        """The process id of every worker, in worker order."""
        return [worker.pid for worker in self._workers]

    def stats(self) -> dict[str, int]:
        return {"pool/failures": self.failures, "pool/restarts": self.restarts}

    def reset(self, ids: Sequence[int] | None = None, seeds=None) -> list[StepResult]:
        """Resets envs `ids` (all when None), with `seeds[k]` for `ids[k]` when given."""
        self.reset_async(ids, seeds)
        return self.wait()

    def step(self, ids: Sequence[int], actions: Sequence[str]) -> list[StepResult]:
        """Plays `actions[k]` in env `ids[k]`; one result per id, in the order of `ids`."""
        self.step_async(ids, actions)
        return self.wait()

    def reset_async(self, ids: Sequence[int] | None = None, seeds=None) -> None:
        ids = list(range(len(self))) if ids is None else list(ids)
        seeds = [None] * len(ids) if seeds is None else list(seeds)
        self._submit("reset", ids, seeds, self.reset_timeout_s)

    def step_async(self, ids: Sequence[int], actions: Sequence[str]) -> None:
        self._submit("step", list(ids), list(actions), self.timeout_s)

    def wait(self) -> list[StepResult]:
        """Gathers the call in flight; returns its results in the order of its `ids`."""
        if self._inflight is None:
            raise RuntimeError("EnvPool.wait() without a call in flight")
        kind, ids, results, timeout_s = self._inflight
        busy = [worker for worker in self._workers if worker.pending]
        start = time.monotonic()
        for worker in busy:
            worker.deadline = start + timeout_s
        try:
            while busy:
                busy = self._gather_some(kind, busy, results, timeout_s)
        finally:  # an interrupted wait leaves workers mid-call: their episodes are lost
            for worker in self._workers:
                if worker.pending:
                    self._retire(worker.index, "was interrupted mid-call", results, kind)
            self._inflight = None
            self._restart_retired()
        for env_id in ids:
            self._record(env_id, results[env_id])
        return [results[env_id] for env_id in ids]

    def worker_imports(self, worker: int) -> list[str]:
        """The modules loaded in a worker process (diagnostics: workers never load JAX)."""
        if self._inflight is not None:
            raise RuntimeError("worker_imports() while a call is in flight")
        conn = self._workers[worker].conn
        conn.send(("modules",))
        if not conn.poll(self.reset_timeout_s):
            self._retire(worker, "did not answer a probe", {}, "probe")
            self._restart_retired()
            raise TimeoutError(f"env worker {worker} did not answer; it was replaced")
        return conn.recv()

    def close(self) -> None:
        """Stops every worker (idempotent)."""
        self._inflight = None
        _stop_all(self._workers)

    # -- sending ------------------------------------------------------------------------------

    def _check_ids(self, ids: list[int], args: list, what: str) -> None:
        if len(args) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(args)} {what}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"ids repeat an env: {ids}")
        bad = [i for i in ids if not 0 <= i < len(self)]
        if bad:
            raise IndexError(f"env ids {bad} out of range for a pool of {len(self)} envs")

    def _submit(self, kind: str, ids: list[int], args: list, timeout_s: float) -> None:
        if not self._workers:
            raise RuntimeError("EnvPool is closed")
        if self._inflight is not None:
            raise RuntimeError(f"EnvPool.{kind}: a call is already in flight; wait() for it first")
        ids = [operator.index(env_id) for env_id in ids]
        self._check_ids(ids, args, "seeds" if kind == "reset" else "actions")
        results: dict[int, StepResult] = {}
        shares: dict[int, list] = {}
        for env_id, arg in zip(ids, args):
            if kind == "step" and env_id in self._needs_reset:
                error = f"env {env_id} must be reset first (its last episode failed or was lost)"
                results[env_id] = self._failed(env_id, error)
            else:
                shares.setdefault(self.worker_of(env_id), []).append((env_id, arg))
        for index, items in list(shares.items()):
            worker = self._workers[index]
            if not worker.alive():  # died since the last call: replace it before sending
                # A step's episodes died with the worker; a reset starts them afresh anyway.
                worker.pending = [env_id for env_id, _ in items] if kind == "step" else []
                reason = f"was found dead (exit code {worker.exit_code()})"
                self._retire(index, reason, results, kind)
                if kind == "step":
                    del shares[index]
        self._restart_retired()
        for index, items in shares.items():
            self._send(index, kind, items, results)
        self._inflight = (kind, ids, results, timeout_s)

    def _send(self, index: int, kind: str, items: list, results: dict) -> None:
        worker = self._workers[index]
        worker.pending = [env_id for env_id, _ in items]
        try:
            worker.conn.send((kind, items))
        except (OSError, ValueError) as exc:
            self._retire(index, f"could not be sent a {kind} ({exc})", results, kind)

    # -- gathering ----------------------------------------------------------------------------

    def _gather_some(self, kind, busy: list[_Worker], results: dict, timeout_s) -> list[_Worker]:
        """Reads the answers ready within the nearest deadline; retires dead or late workers."""
        wait_s = max(0.0, min(worker.deadline for worker in busy) - time.monotonic())
        ready = wait_for_ready([worker.conn for worker in busy], timeout=wait_s)
        for worker in busy:
            if worker.conn not in ready:
                continue
            try:
                env_id, result, task = worker.conn.recv()
            except Exception as exc:  # EOF from a dead worker, or a message cut short
                reason = f"died (exit code {worker.exit_code()}, {type(exc).__name__})"
                self._retire(worker.index, reason, results, kind)
                continue
            worker.pending.remove(env_id)
            results[env_id] = result
            if task is not None:
                self._tasks[env_id] = TaskSpec(**task)
            worker.deadline = time.monotonic() + timeout_s
        now = time.monotonic()
        for worker in busy:
            if worker.pending and worker.deadline <= now and not worker.conn.poll(0):
                reason = f"timed out: env {worker.pending[0]} {kind} took over {timeout_s:g} s"
                self._retire(worker.index, reason, results, kind)
        return [worker for worker in self._workers if worker.pending]

    def _record(self, env_id: int, result: StepResult) -> None:
        """Keeps the failure count and which envs need a reset before their next step."""
        if result.info.get("failed"):
            self._needs_reset.add(env_id)
            self.failures += 1
            log.warning("env %d failed: %s", env_id, result.info.get("error"))
        else:
            self._needs_reset.discard(env_id)

    def _failed(self, env_id: int, error: str) -> StepResult:
        return failed_result(error, self.failure_reward, worker=self.worker_of(env_id))

    # -- restarts -----------------------------------------------------------------------------

    def _launch_worker(self, index: int) -> _Worker:
        env_ids = list(range(index, len(self._specs), self.num_workers))
        init = {
            "families": dict(envs.FAMILIES),
            "specs": {env_id: self._specs[env_id] for env_id in env_ids},
            "failure_reward": self.failure_reward,
        }
        return _Worker(index, env_ids, self.start_method, init)

    def _await_ready(self, workers: list[_Worker]) -> dict[int, tuple[str, str]]:
        """Waits for the workers' "ready"; fills `_tasks`; returns {index: error} of the rest."""
        start = time.monotonic() + _START_GRACE_S
        deadline = {w.index: start + self.reset_timeout_s * len(w.env_ids) for w in workers}
        waiting = {w.conn: w for w in workers}
        errors = {}
        while waiting:
            wait_s = max(0.0, min(deadline[w.index] for w in waiting.values()) - time.monotonic())
            for conn in wait_for_ready(list(waiting), timeout=wait_s):
                worker = waiting.pop(conn)
                try:
                    status, payload = conn.recv()
                except Exception as exc:
                    status, payload = "error", (type(exc).__name__, "the worker died at start")
                if status == "ready":
                    for env_id, task in payload.items():
                        self._tasks[env_id] = TaskSpec(**task)
                else:
                    errors[worker.index] = payload
            for conn, worker in list(waiting.items()):
                if deadline[worker.index] <= time.monotonic():
                    del waiting[conn]
                    errors[worker.index] = ("TimeoutError", "building its envs timed out")
        return errors

    def _retire(self, index: int, reason: str, results: dict, kind: str) -> None:
        """Kills worker `index` and fails its pending episodes; `_restart_retired` replaces it.

        Its other envs lost their state with it: they must be reset before their next step.
        """
        old = self._workers[index]
        failed, lost = list(old.pending), [i for i in old.env_ids if i not in old.pending]
        message = f"env worker {index} (pid {old.pid}) {reason}; it was killed and replaced"
        log.warning("%s; failed envs %s, lost envs %s", message, failed, lost)
        for env_id in failed:
            results[env_id] = self._failed(env_id, f"{message} during a {kind} of env {env_id}")
        self._needs_reset.update(lost)
        old.pending = []
        old.stop()
        self._retired.add(index)

    def _restart_retired(self) -> None:
        """Starts fresh workers (in parallel) for the retired ones; they rebuild their envs."""
        if not self._retired:
            return
        fresh = [self._launch_worker(index) for index in sorted(self._retired)]
        self._retired.clear()
        for worker in fresh:
            self._workers[worker.index] = worker
        self.restarts += len(fresh)
        for index, error in self._await_ready(fresh).items():
            log.error("env worker %d could not be restarted (%s); retrying at its next call",
                      index, error)
            self._workers[index].stop()


if __name__ == "__main__":  # a worker started by the "exec" start method
    serve(Connection(int(sys.argv[1])))
