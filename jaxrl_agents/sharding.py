"""The device mesh and where every array lives on it.

The mesh has axes ('data', 'fsdp', 'tensor'); sizes come from config, and one
size may be -1 ("the rest of the devices"). Model code names its axes
logically (`embed`, `vocab`, `heads`, ...); `LOGICAL_AXIS_RULES` is the one
table that maps those names onto mesh axes. A dimension that the mesh axis
does not divide evenly stays replicated (e.g. one kv head on tensor=2).

Optimizer state that is not laid out like a parameter names its axes too: a pytree
node with a `logical_axes` attribute (one tuple of names per child, e.g. the
block-quantised moments of `trainer.optim8bit`) is placed by those names.

Typical use::

    mesh = make_mesh(cfg.mesh)
    model = shard_params(model, mesh)            # parameters, in place
    opt_state = shard_optimizer_state(opt_state, mesh)
    batch = shard_batch(batch, mesh)             # batch dim over ('data', 'fsdp')
    step = jax.jit(step_fn, out_shardings=...)   # jit follows the input shardings
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axis name -> mesh axis (or axes, or None for replicated). THE table.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", BATCH_AXES),
    ("length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("lora_rank", None),  # the rank axis of LoRA adapters (models/lora.py): small, replicated
    ("moment_blocks", BATCH_AXES),  # blocks of an 8-bit Adam moment: ZeRO-style split
)
_RULES = dict(LOGICAL_AXIS_RULES)


def mesh_shape(mesh_cfg: Mapping[str, int], num_devices: int) -> tuple[int, int, int]:
    """Sizes for ('data', 'fsdp', 'tensor'); one -1 takes the devices left over."""
    unknown = sorted(set(mesh_cfg.keys()) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"unknown mesh key(s) {unknown}; valid: {list(MESH_AXES)}")
    sizes = [int(mesh_cfg.get(axis, 1)) for axis in MESH_AXES]
    bad = [f"{a}={s}" for a, s in zip(MESH_AXES, sizes) if s == 0 or s < -1]
    if bad or sizes.count(-1) > 1:
        raise ValueError(f"mesh sizes must be positive, with at most one -1; got "
                         f"{dict(zip(MESH_AXES, sizes))}")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if num_devices % known:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices "
                             f"are not divisible by {known}")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} "
                         f"devices, {num_devices} are available")
    return tuple(sizes)


def make_mesh(mesh_cfg: Mapping[str, int], devices: Sequence | None = None) -> jax.sharding.Mesh:
    """A mesh with axes ('data', 'fsdp', 'tensor') and Auto axis types."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_cfg, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def logical_to_spec(logical_axes, mesh, shape=None) -> PartitionSpec:
    """PartitionSpec for logical axis names; None or an unknown name is replicated.

    With `shape`, a dimension the mapped mesh axes do not divide stays replicated,
    and a mesh axis is used at most once per array.
    """
    if logical_axes is None:
        return PartitionSpec()
    used, spec = set(), []
    for dim, name in enumerate(logical_axes):
        mesh_axes = _RULES.get(name) if name is not None else None
        if isinstance(mesh_axes, str):
            mesh_axes = (mesh_axes,)
        mesh_axes = tuple(a for a in (mesh_axes or ()) if a not in used)
        size = math.prod(mesh.shape[a] for a in mesh_axes)
        if not mesh_axes or size == 1 or (shape is not None and shape[dim] % size):
            spec.append(None)
            continue
        used.update(mesh_axes)
        spec.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return PartitionSpec(*spec)


def logical_to_sharding(logical_axes, mesh, shape=None) -> NamedSharding:
    """NamedSharding on `mesh` for an array with these logical axis names."""
    return NamedSharding(mesh, logical_to_spec(logical_axes, mesh, shape))


def _is_var(x):
    return isinstance(x, nnx.Variable)


def _is_array(x) -> bool:
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct)


def _has_logical_axes(x) -> bool:
    return isinstance(x, tuple) and hasattr(x, "logical_axes")


def _is_placed_node(x) -> bool:
    return _is_var(x) or _has_logical_axes(x)


def _map_arrays(fn, tree, mesh):
    """`tree` with `fn(array, sharding)` in place of every array, each array with the
    sharding the rules give it: a Variable's from its `out_sharding` axes, the children
    of a node with `logical_axes` from those, any other array replicated. Variables that
    hold no array (optax's MaskedNode placeholders in a multi_transform state) and leaves
    that are not arrays are kept as they are."""

    def visit(leaf):
        if _is_var(leaf):
            value = leaf.get_raw_value()
            if not _is_array(value):
                return leaf
            axes = leaf.get_metadata().get("out_sharding")
            return leaf.replace(fn(value, logical_to_sharding(axes, mesh, value.shape)))
        if _has_logical_axes(leaf):
            return type(leaf)(
                *(fn(x, logical_to_sharding(axes, mesh, x.shape))
                  for x, axes in zip(leaf, leaf.logical_axes, strict=True)))
        if _is_array(leaf):
            return fn(leaf, NamedSharding(mesh, PartitionSpec()))
        return leaf

    return jax.tree.map(visit, tree, is_leaf=_is_placed_node)


def state_shardings(state, mesh):
    """The same pytree with a NamedSharding in place of every array (Variables keep
    their wrapper): usable as jit's in/out_shardings for that state."""
    if isinstance(state, nnx.Module):
        state = nnx.state(state)
    return _map_arrays(lambda _, shard: shard, state, mesh)


def _device_put(x, sharding):
    """jax.device_put; a process-local array bound for a mesh over several processes goes
    through host memory (jax 0.10 otherwise builds a global array whose shards cannot be
    read back, e.g. by orbax's checkpoint save)."""
    if isinstance(x, jax.Array) and x.is_fully_addressable and not sharding.is_fully_addressable:
        x = np.asarray(x)
    return jax.device_put(x, sharding)


def _place(tree, mesh):
    return _map_arrays(_device_put, tree, mesh)


def shard_params(model_or_state, mesh):
    """Place parameters on the mesh by their logical axes.

    A Module is updated in place and returned; an nnx.State gets a sharded copy.
    """
    if isinstance(model_or_state, nnx.Module):
        nnx.update(model_or_state, _place(nnx.state(model_or_state), mesh))
        return model_or_state
    return _place(model_or_state, mesh)


def shard_optimizer_state(opt_state, mesh):
    """Place optimizer state: moment Variables follow their parameter's logical axes
    (optax copies the parameters' Variables), everything else (counts, scalars) is
    replicated; the MaskedNode placeholders of an optax.multi_transform state stay.
    8-bit moments (`trainer.optim8bit`) are split along their blocks over ('data',
    'fsdp') where that divides their number of blocks.

    Accepts an nnx.Optimizer (updated in place and returned) or a state pytree.
    """
    return shard_params(opt_state, mesh)


def batch_shards(mesh) -> int:
    """How many parts a batch's rows are split into: the product of the mesh's batch axes
    (`BATCH_AXES`). A batch's row count must be a multiple of it."""
    return int(np.prod([mesh.shape[axis] for axis in BATCH_AXES]))


def batch_sharding(mesh, ndim: int) -> NamedSharding:
    """Leading (batch) dimension over ('data', 'fsdp'), the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def shard_batch(batch, mesh):
    """Put every array of a batch pytree on the mesh, split along its first axis.

    With several processes (multi-host), each passes its own rows and the global
    batch is their concatenation.
    """
    n = batch_shards(mesh)
    multi_host = jax.process_count() > 1

    def put(path, x):
        x = np.asarray(x) if not isinstance(x, jax.Array) else x
        if x.ndim == 0:
            return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))
        if multi_host:
            return jax.make_array_from_process_local_data(batch_sharding(mesh, x.ndim), x)
        if x.shape[0] % n:
            raise ValueError(f"batch leaf {jax.tree_util.keystr(path)} has leading size "
                             f"{x.shape[0]}, not divisible by data*fsdp = {n}")
        return jax.device_put(x, batch_sharding(mesh, x.ndim))

    return jax.tree_util.tree_map_with_path(put, batch)
