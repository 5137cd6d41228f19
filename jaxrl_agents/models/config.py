"""`ModelConfig`: the sizes and options of one Qwen2 / Qwen3 / Llama decoder.

It is built from our own config section (`ModelConfig.from_config`) or from a
Hugging Face `config.json` dict (`ModelConfig.from_hf`), and written back with
`to_hf` when a model is exported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM")
_MODEL_TYPES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "llama": "LlamaForCausalLM"}
_ARCH_MODEL_TYPES = {arch: model_type for model_type, arch in _MODEL_TYPES.items()}
# RoPE variants: "default" (plain theta^(-2i/H) frequencies) and "llama3" (RopeScaling).
ROPE_TYPES = ("default", "llama3")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# "dots" keeps weight-matmul outputs and recomputes the rest (transformer.REMAT_POLICIES).
REMAT_MODES = ("none", "full", "dots")
# Keys of the `model` config section that are not ModelConfig fields.
CONFIG_ONLY_KEYS = ("hf_path", "critic", "lora")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3.x RoPE frequency scaling (`rope_type: "llama3"` in config.json).

    Wavelengths shorter than original_max_position_embeddings / high_freq_factor keep
    their frequency, those longer than original_max_position_embeddings / low_freq_factor
    are divided by `factor`, and the band between is interpolated
    (`transformer.llama3_inv_freq`). Llama 3.1 uses (8, 1, 4, 8192).
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self):
        if self.rope_type != "llama3":
            raise ValueError(f"RopeScaling.rope_type={self.rope_type!r}; allowed: ['llama3']")
        if not self.factor > 0:
            raise ValueError(f"RopeScaling.factor must be > 0, got {self.factor!r}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError("RopeScaling needs 0 < low_freq_factor < high_freq_factor, got "
                             f"{self.low_freq_factor!r} and {self.high_freq_factor!r}")
        opos = self.original_max_position_embeddings
        if not isinstance(opos, int) or isinstance(opos, bool) or opos <= 0:
            raise ValueError("RopeScaling.original_max_position_embeddings must be a positive "
                             f"int, got {opos!r}")

    def to_hf(self) -> dict[str, Any]:
        """The `rope_parameters` entries of config.json, less rope_theta."""
        return {"rope_type": self.rope_type, "factor": self.factor,
                "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    qkv_bias: bool = True  # True: Qwen2 layout; False: Llama layout
    qk_norm: bool = False  # per-head RMSNorm of queries and keys before RoPE (Qwen3)
    # None: plain RoPE; a RopeScaling (or a dict of its fields): Llama 3.x scaling
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    dtype: str = "float32"  # activations: "float32" | "bfloat16"
    param_dtype: str = "float32"  # stored weights: "float32" | "bfloat16"
    remat: str = "none"  # per-layer recompute in backward: "none" | "full" | "dots"
    scan_layers: bool = False  # stack layers and run them with lax.scan
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        if isinstance(self.remat, bool):  # accept True / False as "full" / "none"
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        if self.remat not in REMAT_MODES:
            raise ValueError(f"ModelConfig.remat={self.remat!r}; allowed: {list(REMAT_MODES)}")
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                    "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}; "
                                 f"allowed: {sorted(DTYPES)}")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"ModelConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if self.qk_norm and self.qkv_bias:
            raise ValueError("ModelConfig.qk_norm=True (Qwen3) with qkv_bias=True is not "
                             "supported: Qwen3 has no q/k/v bias")
        if isinstance(self.rope_scaling, Mapping):  # from a config section or JSON
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError("ModelConfig.rope_scaling must be None or a RopeScaling, got "
                             f"{self.rope_scaling!r}")

    @property
    def architecture(self) -> str:
        """The Hugging Face class this config exports as: Qwen3 has q/k norm, Qwen2 q/k/v
        bias, Llama neither."""
        if self.qk_norm:
            return "Qwen3ForCausalLM"
        return "Qwen2ForCausalLM" if self.qkv_bias else "LlamaForCausalLM"

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self):
        return DTYPES[self.param_dtype]

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_config(cls, cfg_model: Mapping[str, Any]) -> ModelConfig:
        """From the `model` section of our config (ml_collections ConfigDict or dict).

        `hf_path`, `critic` and `lora` are accepted and ignored here; any other key that is
        not a field is an error listing the valid keys.
        """
        items = dict(cfg_model.items())
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(items) - fields - set(CONFIG_ONLY_KEYS))
        if unknown:
            raise ValueError(f"unknown model config key(s) {unknown}; valid keys: "
                             f"{sorted(fields | set(CONFIG_ONLY_KEYS))}")
        return cls(**{k: v for k, v in items.items() if k in fields})

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides) -> ModelConfig:
        """From a Hugging Face `config.json` dict (transformers 4 or 5 form).

        A setting this decoder does not implement (sliding-window layers, attention or
        MLP bias outside Qwen2, another activation or RoPE type) is a ValueError that
        names the config.json key.
        """
        arch = _architecture_of(hf)
        _check_supported(hf, arch)
        theta, rope_scaling = _rope(hf)
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
        values = dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rope_theta=float(theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM",
            qk_norm=arch == "Qwen3ForCausalLM",
            rope_scaling=rope_scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            bos_token_id=_single_id(hf.get("bos_token_id")),
            eos_token_id=_single_id(hf.get("eos_token_id")),
            pad_token_id=_single_id(hf.get("pad_token_id")),
        )
        values.update(overrides)
        return cls(**values)

    def to_hf(self) -> dict[str, Any]:
        """A `config.json` dict that transformers 5 reads (and 4 too: rope_theta is kept)."""
        arch = self.architecture
        hf = {
            "architectures": [arch],
            "model_type": _ARCH_MODEL_TYPES[arch],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": self._rope_parameters(),
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "dtype": self.param_dtype,
        }
        if arch == "LlamaForCausalLM":
            hf.update(attention_bias=False, mlp_bias=False)
        else:
            hf.update(use_sliding_window=False)
        if arch == "Qwen3ForCausalLM":
            hf.update(attention_bias=False)
        return hf

    def _rope_parameters(self) -> dict[str, Any]:
        if self.rope_scaling is None:
            return {"rope_type": "default", "rope_theta": self.rope_theta}
        return {**self.rope_scaling.to_hf(), "rope_theta": self.rope_theta}


def _architecture_of(hf: Mapping[str, Any]) -> str:
    archs = hf.get("architectures") or []
    if archs:
        arch = archs[0]
    else:
        arch = _MODEL_TYPES.get(hf.get("model_type", ""), hf.get("model_type", "<missing>"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r} in config.json; supported: "
                         f"{list(SUPPORTED_ARCHITECTURES)}")
    return arch


def _check_supported(hf: Mapping[str, Any], arch: str):
    """ValueError naming the first config.json setting this decoder does not implement."""
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json hidden_act={hf['hidden_act']!r}; only 'silu' "
                         "(SwiGLU) is supported")
    if arch != "Qwen2ForCausalLM":  # Qwen2's q/k/v bias is implied, not a key
        for key in ("attention_bias", "mlp_bias"):
            if hf.get(key, False):
                raise ValueError(f"config.json {key}=True is not supported for {arch} "
                                 "(only Qwen2-style q/k/v bias is)")
    if hf.get("use_sliding_window", False):
        raise ValueError("config.json use_sliding_window=True is not supported")
    other_layers = sorted({t for t in hf.get("layer_types") or [] if t != "full_attention"})
    if other_layers:
        raise ValueError(f"config.json layer_types has {other_layers}; only "
                         "'full_attention' layers are supported")


# Keys a `rope_parameters` / `rope_scaling` dict may hold (others are errors).
_ROPE_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor",
              *(f.name for f in dataclasses.fields(RopeScaling))}


def _rope(hf: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from `rope_parameters` (transformers 5) or `rope_theta` and
    `rope_scaling` (older files)."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    unknown = sorted(set(params) - _ROPE_KEYS)
    if unknown:
        raise ValueError(f"config.json rope parameter(s) {unknown} are not supported; "
                         f"known: {sorted(_ROPE_KEYS)}")
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"config.json partial_rotary_factor={partial!r} is not supported; "
                         "only 1.0 (RoPE on the whole head)")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"config.json rope_type={rope_type!r} is not supported; "
                         f"allowed: {list(ROPE_TYPES)}")
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if rope_type == "default":
        return theta, None
    # as transformers: a top-level original_max_position_embeddings wins, and
    # max_position_embeddings stands in when neither is given
    original = hf.get("original_max_position_embeddings",
                      params.get("original_max_position_embeddings",
                                 hf.get("max_position_embeddings")))
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in params]
    if missing:
        raise ValueError(f"config.json rope_type='llama3' needs rope parameter(s) {missing}")
    return theta, RopeScaling(
        factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=original)


def _single_id(value):
    """Token ids in config.json may be a list (several EOS ids): keep the first."""
    if isinstance(value, list | tuple):
        return value[0] if value else None
    return value
