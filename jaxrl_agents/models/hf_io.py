"""Hugging Face checkpoints in and out: `load(path_or_repo_id)` and `save(model, config, path)`.

A checkpoint is a directory with `config.json` and safetensors weights, either one
`model.safetensors` or shards listed in `model.safetensors.index.json`. Loading
builds the model abstractly (no random init) and creates every parameter with
`jax.make_array_from_callback`, so each device reads only its own slice of each
tensor from disk: no full copy of a weight is gathered on one device.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from jaxrl_agents.models import gguf_import, lora
from jaxrl_agents.models.config import DTYPES, ModelConfig
from jaxrl_agents.models.transformer import Transformer

# Our per-layer parameter path -> Hugging Face name inside `model.layers.{i}.`
_LAYER_NAMES = {
    ("attn", "q_proj"): "self_attn.q_proj.weight",
    ("attn", "k_proj"): "self_attn.k_proj.weight",
    ("attn", "v_proj"): "self_attn.v_proj.weight",
    ("attn", "o_proj"): "self_attn.o_proj.weight",
    ("attn", "q_bias"): "self_attn.q_proj.bias",
    ("attn", "k_bias"): "self_attn.k_proj.bias",
    ("attn", "v_bias"): "self_attn.v_proj.bias",
    ("attn", "q_norm"): "self_attn.q_norm.weight",
    ("attn", "k_norm"): "self_attn.k_norm.weight",
    ("mlp", "gate_proj"): "mlp.gate_proj.weight",
    ("mlp", "up_proj"): "mlp.up_proj.weight",
    ("mlp", "down_proj"): "mlp.down_proj.weight",
    ("input_norm", "weight"): "input_layernorm.weight",
    ("post_attn_norm", "weight"): "post_attention_layernorm.weight",
}
_TOP_NAMES = {
    ("embed_tokens",): "model.embed_tokens.weight",
    ("final_norm", "weight"): "model.norm.weight",
    ("lm_head",): "lm_head.weight",
}


def hf_names(path: Sequence, num_layers: int) -> list[str]:
    """Hugging Face tensor names for one of our parameter paths.

    One name for an unstacked parameter; `num_layers` names (stacked on axis 0)
    for a parameter of the scanned `blocks`.
    """
    path = tuple(path)
    if path[0] == "layers":
        return [f"model.layers.{path[1]}.{_LAYER_NAMES[path[2:]]}"]
    if path[0] == "blocks":
        return [f"model.layers.{i}.{_LAYER_NAMES[path[1:]]}" for i in range(num_layers)]
    return [_TOP_NAMES[path]]


# ----------------------------------------------------------------------------- reading


class _Safetensors:
    """Lazy reader over the safetensors file(s) of one checkpoint directory."""

    def __init__(self, directory: str):
        index = os.path.join(directory, "model.safetensors.index.json")
        single = os.path.join(directory, "model.safetensors")
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            self.files = {name: os.path.join(directory, fn) for name, fn in weight_map.items()}
        elif os.path.exists(single):
            self.files = None
            self._single = single
        else:
            raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json "
                                    f"in {directory!r}")
        self._open = {}
        if self.files is None:
            self.files = {name: single for name in self._handle(single).keys()}

    def _handle(self, filename):
        from safetensors import safe_open

        if filename not in self._open:
            # framework="flax" reads bfloat16 too (plain numpy cannot).
            self._open[filename] = safe_open(filename, framework="flax")
        return self._open[filename]

    def names(self) -> set[str]:
        return set(self.files)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self.files[name]).get_slice(name).get_shape())

    def read(self, name: str, index: tuple) -> np.ndarray:
        """The slice `index` (a tuple of slices) of tensor `name`, as numpy."""
        return np.asarray(self._handle(self.files[name]).get_slice(name)[index])


def resolve_path(path_or_repo_id: str) -> str:
    """A local directory as is; otherwise a hub id downloaded by huggingface_hub."""
    if os.path.isdir(path_or_repo_id):
        return path_or_repo_id
    if os.path.exists(path_or_repo_id) or path_or_repo_id.startswith((".", "/")):
        raise FileNotFoundError(f"checkpoint path {path_or_repo_id!r} is not a directory")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(path_or_repo_id, allow_patterns=["*.json", "*.safetensors"])
    except Exception as err:  # offline, unknown repo, no auth, ...
        raise OSError(
            f"{path_or_repo_id!r} is not a local directory and could not be downloaded from "
            f"the Hugging Face hub ({type(err).__name__}: {err}). Without a network, pass "
            "the path of a downloaded checkpoint directory.") from err


def checkpoint_directory(path_or_repo_id: str) -> str:
    """The Hugging Face directory `load` reads: a GGUF source converted once (cached), a
    local directory as is, or a hub id downloaded."""
    if gguf_import.is_gguf_source(path_or_repo_id):
        return gguf_import.resolve(path_or_repo_id)
    return resolve_path(path_or_repo_id)


def read_config(directory: str, **overrides) -> ModelConfig:
    with open(os.path.join(directory, "config.json")) as f:
        return ModelConfig.from_hf(json.load(f), **overrides)


def _sharding_for(var: nnx.Variable, mesh):
    if mesh is None:
        return jax.sharding.SingleDeviceSharding(jax.devices()[0])
    from jaxrl_agents.sharding import logical_to_sharding

    return logical_to_sharding(var.get_metadata().get("out_sharding"), mesh, var.shape)


def _check_tensors(reader: _Safetensors, expected: dict[str, tuple], directory: str):
    missing = sorted(set(expected) - reader.names())
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise KeyError(f"checkpoint {directory!r} is missing tensor(s) {shown} "
                       f"({len(missing)} missing of {len(expected)} expected)")
    for name, shape in expected.items():
        found = reader.shape(name)
        if found != shape:
            raise ValueError(f"tensor {name!r} in {directory!r} has shape {list(found)}, "
                             f"the config expects {list(shape)}")


def _dtype_name(dtype, arg: str) -> str:
    """ "float32", jnp.float32, np.float32 or np.dtype("float32") -> "float32"."""
    try:
        name = np.dtype(dtype).name if dtype is not None else None
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ValueError(f"load({arg}={dtype!r}); allowed: {sorted(DTYPES)} "
                         "(names, or the jnp / numpy dtypes)")
    return name


def load(path_or_repo_id: str, dtype: str = "float32", mesh=None, **config_overrides):
    """Read a Qwen2 / Qwen3 / Llama checkpoint; returns (Transformer, ModelConfig).

    path_or_repo_id: a Hugging Face checkpoint directory or hub id, or a GGUF source (a
    .gguf file, a directory with one, or a preset such as "smollm2-135m-instruct"),
    converted once into a cached Hugging Face directory (`gguf_import`).
    dtype: the parameter and activation dtype ("float32" | "bfloat16", or the jnp /
    numpy dtype); a `param_dtype` override stores the parameters in another.
    mesh: a `jax.sharding.Mesh` to place parameters on (by the logical-axis
    rules of `jaxrl_agents.sharding`); None puts them on the first device.
    config_overrides: ModelConfig fields to change (e.g. remat=True, scan_layers=True).
    """
    dtype = _dtype_name(dtype, "dtype")
    if "param_dtype" in config_overrides:
        config_overrides["param_dtype"] = _dtype_name(config_overrides["param_dtype"],
                                                      "param_dtype")
    directory = checkpoint_directory(path_or_repo_id)
    overrides = {"dtype": dtype, "param_dtype": dtype, **config_overrides}
    config = read_config(directory, **overrides)
    reader = _Safetensors(directory)

    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    flat = list(nnx.to_flat_state(state))
    plan = {}
    for path, var in flat:
        names = hf_names(path, config.num_layers)
        per_layer = var.shape[1:] if path[0] == "blocks" else var.shape
        plan[path] = names
        for name in names:
            plan.setdefault("__expected__", {})[name] = tuple(per_layer)
    _check_tensors(reader, plan.pop("__expected__"), directory)

    np_dtype = np.dtype(config.jnp_param_dtype)
    loaded = []
    for path, var in flat:
        names, stacked = plan[path], path[0] == "blocks"

        def read_slice(index, names=names, stacked=stacked):
            if not stacked:
                return reader.read(names[0], index).astype(np_dtype)
            layers = range(*index[0].indices(len(names)))
            return np.stack([reader.read(names[i], index[1:]) for i in layers]).astype(np_dtype)

        value = jax.make_array_from_callback(var.shape, _sharding_for(var, mesh), read_slice)
        loaded.append((path, var.replace(value)))
    model = nnx.merge(graphdef, nnx.from_flat_state(loaded))
    return model, config


# ----------------------------------------------------------------------------- writing


def export_tensors(model: Transformer) -> dict[str, jax.Array]:
    """Hugging Face name -> array (per layer; stacked blocks are unstacked). LoRA adapters
    are merged into their weights (W + (alpha / r) B A): a plain checkpoint."""
    cfg = model.config
    tensors = {}
    for path, var in nnx.to_flat_state(lora.merged_params(model)):
        names = hf_names(path, cfg.num_layers)
        value = var[...]
        if path[0] == "blocks":
            tensors.update({name: value[i] for i, name in enumerate(names)})
        else:
            tensors[names[0]] = value
    return tensors


def save(model: Transformer, config: ModelConfig, path: str) -> str:
    """Write config.json + model.safetensors that `AutoModelForCausalLM.from_pretrained` reads.

    Arrays are gathered to the host one tensor at a time. Returns `path`.
    """
    from safetensors.flax import save_file

    if model.config.architecture != config.architecture or (
            model.config.num_layers != config.num_layers):
        raise ValueError("save(): `config` does not describe `model` "
                         f"({config.architecture} vs {model.config.architecture})")
    os.makedirs(path, exist_ok=True)
    tensors = {name: jax.device_get(value) for name, value in export_tensors(model).items()}
    save_file({k: jax.numpy.asarray(v) for k, v in tensors.items()},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config.to_hf(), f, indent=2)
    return path
