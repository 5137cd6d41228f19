"""Multi-host runs: one JAX process per host, started with `jax.distributed`.

Every process runs the same program. Each plays its own share of the episodes with
its own EnvPool and a process-local copy of the policy; the packed batches are joined
into one global batch for the learner, whose state lives on the mesh over every
process's devices. Only process 0 writes logs and eval.json.

    distributed.maybe_initialize(cfg)       # first thing, before any other JAX call
    mine = process_slice(len(tasks))        # this process's share
    rows, length = agree_max([rows, length])  # padded shapes every process uses
    batch = global_batch(local_batch, mesh)  # global arrays, batch dim over the mesh
    if is_main_process(): ...
    everyone = allgather_objects(my_trajectories)  # [P] lists, process order

With one process every helper is a no-op that makes no JAX call.
"""

from __future__ import annotations

import glob
import os
import pickle
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxrl_agents import sharding

ENABLED = ("auto", "true", "false")

# Environment variables read when the config leaves a field unset.
ENV_ADDRESS, ENV_NUM_PROCESSES, ENV_PROCESS_ID = (
    "JAX_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
)


def _managed_cluster(environ: Mapping[str, str]) -> bool:
    """A launcher jax.distributed detects by itself: a Cloud TPU VM (TPU device files or
    GKE worker lists), Slurm with several tasks, or Open MPI."""
    tpu_hosts = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES")
    on_tpu_vm = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
    slurm = int(environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_JOB_ID" in environ
    return bool(tpu_hosts) or on_tpu_vm or slurm or "OMPI_MCA_orte_hnp_uri" in environ


def init_args(section, environ: Mapping[str, str] | None = None) -> dict | None:
    """Keyword arguments for `jax.distributed.initialize`, or None to stay single-process.

    `section` is the config's `distributed` section. Unset fields ("", 0, -1) fall back
    to JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, and what is still
    unknown is left to JAX's own cluster detection (TPU pods, Slurm, Open MPI).
    enabled="auto" initializes when an address is known or such a cluster is detected.
    """
    environ = os.environ if environ is None else environ
    enabled = str(section.enabled).lower()
    if enabled not in ENABLED:
        raise ValueError(f"distributed.enabled is {section.enabled!r}; allowed: {list(ENABLED)}")
    if enabled == "false":
        return None
    address = section.coordinator_address or environ.get(ENV_ADDRESS, "")
    num_processes = section.num_processes or int(environ.get(ENV_NUM_PROCESSES, 0) or 0)
    process_id = section.process_id
    if process_id < 0:
        process_id = int(environ.get(ENV_PROCESS_ID, -1) or -1)
    if enabled == "auto" and not address and not _managed_cluster(environ):
        return None
    args = {
        "coordinator_address": address or None,
        "num_processes": num_processes or None,
        "process_id": process_id if process_id >= 0 else None,
    }
    return {k: v for k, v in args.items() if v is not None}


def maybe_initialize(cfg) -> bool:
    """Starts `jax.distributed` if the config or the environment asks for it.

    Must run before any other JAX call (device queries included). Returns True when
    this process is part of a distributed run (also if it was initialized before).
    """
    if jax.distributed.is_initialized():
        return True
    args = init_args(cfg.distributed)
    if args is None:
        return False
    jax.distributed.initialize(**args)
    return True


def is_main_process() -> bool:
    """True on process 0: the one that writes logs, eval.json and summaries."""
    return jax.process_index() == 0


def process_slice(n: int, index: int | None = None, count: int | None = None) -> slice:
    """This process's contiguous share of n items; the first n % count processes get one
    more. Shares of processes 0..count-1 tile range(n) in order."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (index < extra))


def agree_max(values: Sequence[int]) -> list[int]:
    """The element-wise max of `values` over processes (e.g. padded rows and length, so
    every process packs the same shape)."""
    values = np.asarray(values, np.int64)
    if jax.process_count() == 1:
        return values.tolist()
    return np.asarray(multihost_utils.process_allgather(values)).max(axis=0).tolist()


def allgather_rows(local: np.ndarray) -> np.ndarray:
    """Every process's rows, concatenated in process order (row counts may differ)."""
    local = np.asarray(local)
    if jax.process_count() == 1:
        return local
    counts = np.asarray(multihost_utils.process_allgather(np.int64(len(local))))  # [P]
    padded = np.zeros((int(counts.max()),) + local.shape[1:], local.dtype)
    padded[: len(local)] = local
    gathered = np.asarray(multihost_utils.process_allgather(padded))  # [P, rows, ...]
    return np.concatenate([g[:c] for g, c in zip(gathered, counts)])


def allgather_objects(local) -> list:
    """Every process's picklable `local` (e.g. its list of trajectories), in process order;
    [local] with one process."""
    if jax.process_count() == 1:
        return [local]
    data = np.frombuffer(pickle.dumps(local), np.uint8)
    sizes = allgather_rows(np.array([data.size], np.int64))  # [P] bytes per process
    joined = allgather_rows(data)
    parts = np.split(joined, np.cumsum(sizes)[:-1])
    return [pickle.loads(part.tobytes()) for part in parts]


def main_first(fn, name: str):
    """`fn()` on process 0, then (after a barrier named `name`) on the others, so that what
    it writes to a shared directory (a trained tokenizer, generated games) is made once and
    found by the rest. With one process, just `fn()`."""
    if jax.process_count() == 1:
        return fn()
    result = fn() if is_main_process() else None
    multihost_utils.sync_global_devices(name)
    return result if is_main_process() else fn()


def global_batch(local_batch, mesh: jax.sharding.Mesh):
    """One global array per leaf from every process's rows of it.

    local_batch: a pytree of NumPy arrays [b, ...], this process's rows; every process
      must pass the same structure and shapes (pack with sizes from `agree_max`).
    Returns the pytree of jax.Arrays [P * b, ...], rows in process order, the first
    dimension split over the mesh's ('data', 'fsdp') axes. A mismatch of local shapes
    across processes is an error here rather than a hang in a later collective.
    """
    if jax.process_count() > 1:
        shapes = [np.shape(x) for x in jax.tree.leaves(local_batch)]
        flat = [d for s in shapes for d in (len(s), *s)]
        gathered = np.asarray(multihost_utils.process_allgather(np.asarray(flat, np.int64)))
        if not (gathered == gathered[0]).all():
            raise ValueError(f"processes pass batches of different shapes: {gathered.tolist()}")
    return sharding.shard_batch(local_batch, mesh)


def local_copy(tree):
    """A process-local copy of a pytree of (possibly global) arrays, for code that runs on
    this process alone (the sampler): replicated arrays give their local replica, sharded
    ones are gathered from every process."""

    def get(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return x.addressable_data(0)
        return jax.numpy.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(get, tree)


def broadcast_from_main(tree):
    """Process 0's values of a pytree on every process (e.g. parameters after a
    per-process SFT, before they become one replicated global state)."""
    if jax.process_count() == 1:
        return tree
    return multihost_utils.broadcast_one_to_all(tree)
