"""The memory check a run makes before it builds anything: `jaxrl-plan`'s peak against
what the machine has.

    check_memory(cfg)  # jaxrl-train: every phase of the run
    check_memory(cfg, phases=eval_phases(cfg, step, base))  # jaxrl-eval: playing games

The plan is `plan.make_plan` (the numbers `jaxrl-plan` prints, from `jax.eval_shape`:
nothing is allocated) on the mesh the trainer uses: one device in a single-process run
(`Trainer` places everything on the first device), the config's mesh over every device
when several processes share a run. Capacity per device:

- GPU / TPU: `memory_stats()["bytes_limit"]` of the first local device, what XLA's
  allocator may hand out (75% of a GPU by default).
- CPU: the smaller of the host's MemAvailable (/proc/meminfo) and the room left under the
  process's cgroup memory limit when one is set, divided by the devices of this process
  that hold a share of the run. MemAvailable, not MemTotal: the OOM killer acts on what other
  processes leave free, not on what is installed.

A run whose planned peak is over MARGIN x capacity stops with `MemoryCheckError`, which
names the biggest term of the phase that peaks and the settings that reduce it
(`SETTINGS`). The margin leaves runs the plan puts near the limit to start: the plan
counts the longest length bucket and every buffer live at once, which a run may never
reach. `memory_check = False` skips the check (an estimate that is wrong for a run).
"""

from __future__ import annotations

import os
import sys
import textwrap

import jax

from jaxrl_agents import plan
from jaxrl_agents.config import ConfigError

# Refuse above this multiple of capacity; warn above TIGHT of it.
MARGIN = 1.1
TIGHT = 0.9

# What reduces each term of a phase's peak (`plan.Plan.phases`).
_PARAMS = ('model.param_dtype="bfloat16" (half the bytes), or more devices on mesh.fsdp / '
           "mesh.tensor (multi-host runs)")
_RL_ACTIVATIONS = ('model.remat="full" (keep only each layer\'s input), rl.grad_accum '
                   "(rl.minibatch_size / rl.grad_accum rows per micro-batch), rl.logits_chunk "
                   "(logits a few hundred positions at a time; big vocabularies) or "
                   "rollout.max_context")
_ROLLOUT = ("rollout.episodes_per_batch (rows of the cache) or rollout.max_context (its "
            'length); model.dtype="bfloat16" halves it')
SETTINGS = {
    "policy parameters": _PARAMS,
    "policy and critic parameters": _PARAMS,
    "critic parameters": 'model.critic="head" (a value head on the policy\'s trunk, no second '
                         'model), or model.param_dtype="bfloat16"',
    "reference policy": "model.lora.rank > 0 (the reference is then the base weights: no copy), "
                        'or model.param_dtype="bfloat16"',
    "optimizer state": 'rl.optimizer_state="int8" (about 4x less), or model.lora.rank > 0 '
                       "(moments of the adapters only)",
    "other learner state": 'rl.master_weights="none" (no float32 copy of bfloat16 parameters)',
    "gradients (micro-batch)": "model.lora.rank > 0 (gradients of the adapters only), or "
                               'rl.master_weights="none"',
    "gradients (accumulated)": "model.lora.rank > 0 (gradients of the adapters only), or "
                               'rl.master_weights="none"',
    "activations (saved for backward)": _RL_ACTIVATIONS,
    "activations (one layer recomputed)": "rl.grad_accum (fewer rows per micro-batch) or "
                                          "rollout.max_context",
    "KV cache (rollout)": _ROLLOUT,
    "KV cache copy while compacting": _ROLLOUT,
    "rollout scratch (one prefill)": "rollout.episodes_per_batch or rollout.max_context",
}
# Terms of the supervised phases whose settings differ from the RL step's.
PHASE_SETTINGS = {
    ("SFT", "optimizer state"): 'sft.optimizer_state="int8" (about 4x less), or '
                                "model.lora.rank > 0",
    ("SFT", "activations (saved for backward)"):
        "sft.grad_accum (sft.batch_size / sft.grad_accum rows per micro-batch), "
        'model.remat="full" or rollout.max_context',
    ("SFT", "activations (one layer recomputed)"): "sft.grad_accum or rollout.max_context",
    ("language-model pretraining", "optimizer state"): "model.lora.rank > 0 (pretraining "
                                                        "keeps float32 moments)",
    ("language-model pretraining", "activations (saved for backward)"):
        "pretrain.grad_accum (pretrain.batch_size / pretrain.grad_accum rows per "
        'micro-batch), model.remat="full" or rollout.max_context',
    ("language-model pretraining", "activations (one layer recomputed)"):
        "pretrain.grad_accum or rollout.max_context",
}


class MemoryCheckError(ConfigError):
    """The planned peak of a run is clearly over what the machine has."""


def _gib(n: int) -> str:
    return f"{n / plan.GIB:.2f} GiB"


# ----------------------------------------------------------------------------- capacity


def host_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


def cgroup_room_bytes(proc_cgroup: str = "/proc/self/cgroup",
                      root: str = "/sys/fs/cgroup") -> int | None:
    """Limit minus usage of this process's memory cgroup (v2 memory.max / memory.current,
    v1 memory.limit_in_bytes / memory.usage_in_bytes); None when unlimited or unknown."""
    try:
        with open(proc_cgroup) as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    for _, controllers, path in lines:
        if controllers == "":
            files = os.path.join(root, path.lstrip("/")), "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            files = (os.path.join(root, "memory", path.lstrip("/")), "memory.limit_in_bytes",
                     "memory.usage_in_bytes")
        else:
            continue
        try:
            with open(os.path.join(files[0], files[1])) as f:
                limit = f.read().strip()
            with open(os.path.join(files[0], files[2])) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:  # v1 writes "unlimited" as ~2^63
            return max(int(limit) - usage, 0)
    return None


def device_capacity() -> tuple[int, str] | None:
    """(bytes one device may use, where the figure comes from), or None when unknown."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" not in stats:
            return None
        return int(stats["bytes_limit"]), f"{device.device_kind}, XLA's bytes_limit"
    known = {"MemAvailable of /proc/meminfo": host_available_bytes(),
             "room under the cgroup memory limit": cgroup_room_bytes()}
    known = {k: v for k, v in known.items() if v is not None}
    if not known:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        known = {"installed memory": pages}
    where, host = min(known.items(), key=lambda kv: kv[1])
    holders = jax.local_device_count() if jax.process_count() > 1 else 1
    if holders > 1:
        return host // holders, f"{where}, shared by {holders} CPU devices"
    return host, where


# ----------------------------------------------------------------------------- the plan


def run_mesh(cfg):
    """The mesh of the learner state, as `Trainer` makes it: the config's over every device
    with several processes, else one device (no mesh: everything on the first device)."""
    if jax.process_count() > 1:
        return plan.abstract_mesh(cfg.mesh, jax.device_count())
    return plan.abstract_mesh({"data": 1, "fsdp": 1, "tensor": 1}, 1)


def planned_model(cfg):
    """The ModelConfig the trainer builds: `plan.model_config`, with the tokenizer's
    vocabulary when the model is built from the config's fields (as `Trainer` does; a
    trained tokenizer has at most `tokenizer.vocab_size` tokens)."""
    from jaxrl_agents.trainer import setup

    mc = plan.model_config(cfg)
    if cfg.model.hf_path:
        return mc
    if cfg.tokenizer.path:
        from jaxrl_agents.models.tokenizer import load_tokenizer

        return mc.replace(vocab_size=setup.model_vocab_size(load_tokenizer(cfg.tokenizer.path)))
    trained = range(cfg.tokenizer.vocab_size)  # as long as the largest trained tokenizer
    return mc.replace(vocab_size=setup.model_vocab_size(trained))


def eval_phases(cfg, step: int | None, base: bool) -> tuple[str]:
    """The plan phase `evaluate_checkpoint` reaches: "rollout" when it restores a checkpoint
    (it builds the learner state to restore into), "evaluation" when it plays the
    pretrained weights (`base`, or a run directory without checkpoints)."""
    from jaxrl_agents.run_records import CHECKPOINT_DIR

    directory = os.path.join(cfg.output_dir, cfg.name, CHECKPOINT_DIR)
    saved = os.path.isdir(directory) and bool(os.listdir(directory))
    return ("rollout",) if not base and (step is not None or saved) else ("evaluation",)


def biggest_term(result: plan.Plan, phases=None) -> tuple[str, int, str, int]:
    """(phase, its peak, term, its bytes): the phase among `phases` (default all) with the
    highest peak, and the largest term of that peak."""
    chosen = {k: v for k, v in result.phases.items() if phases is None or k in phases}
    phase, terms = max(chosen.items(), key=lambda kv: sum(kv[1].values()))
    term, size = max(terms.items(), key=lambda kv: kv[1])
    return phase, sum(terms.values()), term, size


def refusal(result: plan.Plan, capacity: int, where: str, phases=None) -> str | None:
    """The error message when the peak is over MARGIN x capacity, else None."""
    phase, peak, term, size = biggest_term(result, phases)
    if peak <= MARGIN * capacity:
        return None
    setting = PHASE_SETTINGS.get((phase, term)) or SETTINGS.get(term, "")
    mesh = ",".join(f"{k}={v}" for k, v in result.info["mesh"].items())
    return "\n".join([
        f"memory check: planned peak {_gib(peak)} per device ({phase}), over {MARGIN:g} x "
        f"the {_gib(capacity)} this machine has ({where}).",
        f"  biggest term: {term}, {_gib(size)}",
        textwrap.fill(f"  reduce it with: {setting}", 96, subsequent_indent="    "),
        f"  every term: jaxrl-plan --config FILE [same overrides] --mesh {mesh} "
        f"--device {capacity}",
        "  to start anyway: --config.memory_check=false",
    ])


def check_memory(cfg, phases=None, capacity: tuple[int, str] | None = None):
    """Raises MemoryCheckError when the run's planned peak (over `phases`, default all of
    them) is over MARGIN x capacity (default `device_capacity()`); warns on stderr above
    TIGHT x capacity. Returns the plan, or None when the check is off or cannot be made."""
    if not cfg.memory_check:
        return None
    capacity = capacity or device_capacity()
    if capacity is None:
        return None
    try:
        mc = planned_model(cfg)
    except (ValueError, OSError) as err:  # e.g. a hub id the planner does not know
        print(f"memory check skipped: no architecture to plan ({err})", file=sys.stderr)
        return None
    result = plan.make_plan(cfg, mc, run_mesh(cfg))
    message = refusal(result, *capacity, phases=phases)
    if message:
        raise MemoryCheckError(message)
    phase, peak, _, _ = biggest_term(result, phases)
    if peak > TIGHT * capacity[0]:
        print(f"memory check: planned peak {_gib(peak)} per device ({phase}) is "
              f"{100 * peak / capacity[0]:.0f}% of {_gib(capacity[0])} ({capacity[1]}); the "
              "run may run out of memory", file=sys.stderr)
    return result
