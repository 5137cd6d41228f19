"""Checkpoints of a run with orbax: array state (params, optimizer state, reference,
PRNG keys, ...) plus a JSON `meta` dict (counters, data and curriculum positions,
controller and normaliser states).

    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"), keep=cfg.checkpoint.keep)
    ckpt.save(step, {"params": params, "opt_state": opt_state, "rng": key}, meta)
    ...
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(template={"params": params, "opt_state": ..., "rng": key})
    ckpt.close()

Layout: <directory>/<step>/{state, meta}. `state` is a dict of arbitrary pytrees (flax
NNX `nnx.State` from `nnx.split`, optax states, plain dicts and tuples). Its leaves are
stored as a nested dict named by their tree paths ("opt_state/0/mu/kernel/value"), so
checkpoints are readable with plain orbax and do not depend on pytree classes.
`restore` rebuilds the template's structure and gives every leaf the template's shape,
dtype and sharding (a checkpoint can be restored onto another mesh).

PRNG keys: raw uint32 keys (`jax.random.PRNGKey`) are plain arrays. Typed keys
(`jax.random.key`) are stored as their key data and re-wrapped with the template's
key implementation on restore.

Atomicity: orbax writes a step into a temporary directory and renames it into place when
complete, so a process killed during a save leaves at most a temporary directory that
`latest_step()` ignores (the next Checkpointer deletes it in the background); every
listed step restores whole.

Saves are asynchronous: `save` returns once the arrays are copied off the devices, and
the writing finishes in a background thread. `wait()` blocks until it is done; `close()`
waits too. Multi-host: call `save` / `restore` on every JAX process (each writes its own
array shards; orbax lets only the primary process write metadata, `meta` and finalise
the step directory). The directory must then be one all hosts see (e.g. gs://...).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp

STATE, META = "state", "meta"


def _key_name(key) -> str:
    """One tree-path entry as a directory-safe name."""
    if isinstance(key, jax.tree_util.DictKey):
        name = str(key.key)
    elif isinstance(key, jax.tree_util.GetAttrKey):
        name = key.name
    elif isinstance(key, jax.tree_util.SequenceKey):
        name = str(key.idx)
    elif isinstance(key, jax.tree_util.FlattenedIndexKey):
        name = str(key.key)
    else:
        name = str(key)
    if not name or "/" in name or "." in name:
        raise ValueError(f"checkpoint leaf name {name!r} may not be empty or hold '/' or '.'")
    return name


def _is_typed_key(leaf) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _leaf_paths(state: Mapping) -> list[tuple[tuple[str, ...], object]]:
    """[(names, leaf)] for every leaf of the dict-of-pytrees `state`, in tree order."""
    if not isinstance(state, Mapping):
        raise TypeError(f"checkpoint state must be a dict of pytrees; got {type(state).__name__}")
    flat, _ = jax.tree_util.tree_flatten_with_path(dict(state))
    return [(tuple(_key_name(k) for k in path), leaf) for path, leaf in flat]


def _nest(pairs) -> dict:
    """{("a", "b"): x} -> {"a": {"b": x}}; two leaves with one name are an error."""
    out: dict = {}
    for names, value in pairs:
        node = out
        for name in names[:-1]:
            node = node.setdefault(name, {})
        if names[-1] in node:
            raise ValueError(f"two checkpoint leaves share the name {'/'.join(names)!r}")
        node[names[-1]] = value
    return out


def _lookup(tree: Mapping, names: tuple[str, ...]):
    node = tree
    for i, name in enumerate(names):
        if not isinstance(node, Mapping) or name not in node:
            where = "/".join(names[: i + 1])
            raise KeyError(f"checkpoint has no leaf {'/'.join(names)!r} (missing at {where!r})")
        node = node[name]
    return node


def _to_storable(leaf):
    """A leaf as orbax stores it: typed keys as key data, Python scalars as NumPy."""
    if _is_typed_key(leaf):
        return jax.random.key_data(leaf)
    if isinstance(leaf, jax.Array):
        return leaf
    if isinstance(leaf, np.ndarray):
        return leaf.copy()  # async save: later in-place changes must not leak in
    if isinstance(leaf, (bool, int, float, np.generic)):
        return np.asarray(leaf)
    raise TypeError(f"checkpoint leaf of type {type(leaf).__name__} is not an array")


def _abstract(leaf):
    """What orbax restores a template leaf into: shape, dtype and sharding."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        if _is_typed_key(leaf):
            raise TypeError("a typed PRNG key in a restore template must be a real key array")
        sharding = leaf.sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
    leaf = _to_storable(leaf)
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    return leaf  # NumPy: orbax restores a NumPy array of the same shape and dtype


def _from_storable(restored, template_leaf):
    if _is_typed_key(template_leaf):
        return jax.random.wrap_key_data(restored, impl=jax.random.key_impl(template_leaf))
    if isinstance(template_leaf, (bool, int, float)):
        return type(template_leaf)(np.asarray(restored).item())
    if isinstance(template_leaf, np.generic):
        return template_leaf.dtype.type(np.asarray(restored).item())
    return restored


def _plain_json(obj, key: str = "meta"):
    """`meta` as plain JSON values: NumPy / JAX scalars and arrays become Python numbers
    and lists, tuples become lists. Anything else that JSON cannot hold is a TypeError
    naming its key."""
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"checkpoint {key} keys must be strings; got {k!r}")
            out[k] = _plain_json(v, f"{key}.{k}")
        return out
    if isinstance(obj, (list, tuple)):
        return [_plain_json(v, f"{key}[{i}]") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (np.generic, np.ndarray, jax.Array)) and not _is_typed_key(obj):
        return np.asarray(obj).tolist()
    raise TypeError(f"checkpoint {key} holds a {type(obj).__name__}, which JSON cannot store")


class Checkpointer:
    """Keeps the last `keep` checkpoints of a run under `directory`, and the steps of
    `always_keep`.

    Args:
      directory: where the step directories go (created).
      keep: number of latest checkpoints kept; older ones are deleted after a save.
      always_keep: steps never deleted (the trainer keeps step 0, the policy after SFT,
        which `jaxrl-eval --step 0` compares against).
      async_save: write in a background thread (see `wait`).
    """

    def __init__(self, directory: str, keep: int = 3, *, always_keep: tuple[int, ...] = (),
                 async_save: bool = True):
        if keep < 1:
            raise ValueError(f"checkpoint keep must be >= 1; got {keep}")
        self.directory = os.path.abspath(directory)
        policy = ocp.checkpoint_managers.LatestN(n=keep)
        if always_keep:
            policy = ocp.checkpoint_managers.AnyPreservationPolicy(
                [policy, ocp.checkpoint_managers.CustomSteps([int(s) for s in always_keep])])
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policy,
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save,
        )
        # PyTree (not Standard) handler: same files, and it can restore a subset.
        handlers = {STATE: ocp.PyTreeCheckpointHandler(), META: ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )

    def save(self, step: int, state: Mapping, meta: Mapping | None = None) -> bool:
        """Starts saving `state` (dict of pytrees) and `meta` (JSON dict) as `step`.

        `meta` comes back from `restore` as plain JSON: tuples as lists, NumPy scalars
        as Python numbers.

        Returns False, saving nothing, if `step` is already on disk (e.g. the final save
        of a run that just checkpointed that step). Arrays are copied before returning,
        so the caller may donate or update them at once.
        """
        step = int(step)
        if step in self._manager.all_steps():
            return False
        tree = _nest((names, _to_storable(leaf)) for names, leaf in _leaf_paths(state))
        args = ocp.args.Composite(
            **{STATE: ocp.args.PyTreeSave(tree), META: ocp.args.JsonSave(_plain_json(meta or {}))}
        )
        return bool(self._manager.save(step, args=args, force=True))

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None when there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def restore(
        self, step: int | None = None, *, template: Mapping | None = None, partial: bool = False
    ):
        """Loads checkpoint `step` (default: the latest) -> (state, meta).

        template: a state of the same structure (e.g. freshly initialised params and
          optimizer state, or `jax.eval_shape` / ShapeDtypeStruct leaves with shardings);
          the restored state has its structure, shapes, dtypes and shardings. A leaf of
          the template missing from the checkpoint raises KeyError naming it; a shape
          mismatch raises ValueError. Without a template the state comes back as the
          nested dict it is stored as (names from the tree paths), as NumPy arrays
          (typed keys as their key data).
        partial: restore only what the template holds and ignore the checkpoint's other
          entries (e.g. `template={"params": params}` for evaluation).
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        step = int(step)
        if step not in self._manager.all_steps():
            raise FileNotFoundError(
                f"no checkpoint for step {step} in {self.directory}; have {self.all_steps()}"
            )
        if template is None:
            restored = self._restore(step, None, partial=False)
            return restored[STATE], dict(restored[META])

        template_leaves = _leaf_paths(template)
        target = _nest((names, _abstract(leaf)) for names, leaf in template_leaves)
        self._check_against_metadata(step, template_leaves, target, partial)
        restored = self._restore(step, target, partial=partial)
        leaves = [
            _from_storable(_lookup(restored[STATE], names), leaf)
            for names, leaf in template_leaves
        ]
        treedef = jax.tree_util.tree_structure(dict(template))
        return jax.tree_util.tree_unflatten(treedef, leaves), dict(restored[META])

    def _restore(self, step: int, target, *, partial: bool):
        if target is None:  # everything, as NumPy (safe on any topology)
            stored = self._stored_tree(step)
            as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), stored)
            state_args = ocp.args.PyTreeRestore(item=stored, restore_args=as_numpy)
        else:
            restore_args = ocp.checkpoint_utils.construct_restore_args(target)
            state_args = ocp.args.PyTreeRestore(
                item=target, restore_args=restore_args, partial_restore=partial
            )
        args = ocp.args.Composite(**{STATE: state_args, META: ocp.args.JsonRestore()})
        return self._manager.restore(step, args=args)

    def _stored_tree(self, step: int) -> dict:
        """The nested dict of stored leaves' metadata (shape, dtype, ...)."""
        stored = self._manager.item_metadata(step)[STATE]
        return getattr(stored, "tree", stored)  # TreeMetadata wraps the nested dict

    def _check_against_metadata(self, step: int, template_leaves, target, partial) -> None:
        """Clear errors for a template that does not match the stored leaves."""
        stored = self._stored_tree(step)
        if not partial:
            flat, _ = jax.tree_util.tree_flatten_with_path(stored)
            extra = sorted(
                {"/".join(_key_name(k) for k in path) for path, _ in flat}
                - {"/".join(names) for names, _ in template_leaves}
            )
            if extra:
                raise ValueError(
                    f"checkpoint holds leaves the template lacks: {extra[:5]}"
                    f"{' ...' if len(extra) > 5 else ''}; pass partial=True to restore "
                    "only the template's"
                )
        for names, _ in template_leaves:
            meta = _lookup(stored, names)
            want = tuple(_lookup(target, names).shape)
            have = tuple(getattr(meta, "shape", want))
            if have != want:
                raise ValueError(
                    f"checkpoint leaf {'/'.join(names)!r} has shape {have}; template has {want}"
                )

    def wait(self) -> None:
        """Blocks until every started save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases orbax's threads."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
