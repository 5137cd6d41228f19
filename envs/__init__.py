"""Host-side environments. This package never imports JAX: it runs in worker processes.

`envs.make(spec)` builds an environment from a plain dict whose "family" key picks the
implementation; the family modules are imported only when first used.
"""

from __future__ import annotations

import importlib

from envs import action_space
from envs.base import (
    Env,
    SpecError,
    StepResult,
    TaskSpec,
    check_spec_keys,
    clean_action,
    render_state,
)

# family -> "module:factory". The factory takes the spec dict (without "family").
FAMILIES: dict[str, str] = {
    "textworld": "envs.textworld_env:make_env",
    "alfworld": "envs.alfworld_env:make_env",
    "code": "envs.code_env:make_env",
    "toy": "envs.toy_env:make_env",
}


def register(family: str, target: str) -> None:
    """Adds an env family: `target` is "module:callable" (callable(spec_dict) -> Env)."""
    FAMILIES[family] = target


def make(spec: dict) -> Env:
    """Builds the environment a spec dict describes; unknown families are a SpecError.

    The keys `allowed_verbs` and `compound_actions` work for every family: they wrap the
    env in `envs.action_space.ActionSpaceEnv`."""
    if not isinstance(spec, dict) or "family" not in spec:
        raise SpecError(f"an env spec is a dict with a 'family' key, got {spec!r}")
    family = spec["family"]
    if family not in FAMILIES:
        raise SpecError(f"unknown env family {family!r}; known families: {sorted(FAMILIES)}")
    module_name, attr = FAMILIES[family].split(":")
    factory = getattr(importlib.import_module(module_name), attr)
    skip = ("family", *action_space.WRAPPER_KEYS)
    env = factory({k: v for k, v in spec.items() if k not in skip})
    return action_space.wrap(env, spec)


def __getattr__(name):
    # EnvPool lives in envs.pool; imported lazily to keep `import envs` light.
    if name == "EnvPool":
        from envs.pool import EnvPool

        return EnvPool
    raise AttributeError(name)


__all__ = [
    "Env",
    "EnvPool",
    "FAMILIES",
    "SpecError",
    "StepResult",
    "TaskSpec",
    "check_spec_keys",
    "clean_action",
    "make",
    "register",
    "render_state",
]
