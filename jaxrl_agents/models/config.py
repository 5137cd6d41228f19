"""`ModelConfig`: the sizes and options of one Qwen2 / Llama decoder.

It is built from our own config section (`ModelConfig.from_config`) or from a
Hugging Face `config.json` dict (`ModelConfig.from_hf`), and written back with
`to_hf` when a model is exported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")
_MODEL_TYPES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# "dots" keeps weight-matmul outputs and recomputes the rest (transformer.REMAT_POLICIES).
REMAT_MODES = ("none", "full", "dots")
# Keys of the `model` config section that are not ModelConfig fields.
CONFIG_ONLY_KEYS = ("hf_path", "critic")


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

    @property
    def architecture(self) -> str:
        """The Hugging Face class this config exports as (Qwen2 has q/k/v bias)."""
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

        `hf_path` and `critic` are accepted and ignored here; any other key that is
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
        """From a Hugging Face `config.json` dict (transformers 4 or 5 form)."""
        arch = _architecture_of(hf)
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json hidden_act={hf['hidden_act']!r}; only 'silu' "
                             "(SwiGLU) is supported")
        if arch == "LlamaForCausalLM":
            for key in ("attention_bias", "mlp_bias"):
                if hf.get(key, False):
                    raise ValueError(f"config.json {key}=True is not supported for Llama "
                                     "(only Qwen2-style q/k/v bias is)")
        if hf.get("use_sliding_window", False):
            raise ValueError("config.json use_sliding_window=True is not supported")
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
            rope_theta=float(_rope_theta(hf)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM",
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
            "model_type": "qwen2" if arch == "Qwen2ForCausalLM" else "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
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
        return hf


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


def _rope_theta(hf: Mapping[str, Any]) -> float:
    """Theta from `rope_parameters` (transformers 5) or `rope_theta` (older files)."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"config.json rope_type={rope_type!r} is not supported; "
                         "allowed: ['default']")
    if "rope_theta" in params:
        return params["rope_theta"]
    return hf.get("rope_theta", 10000.0)


def _single_id(value):
    """Token ids in config.json may be a list (several EOS ids): keep the first."""
    if isinstance(value, list | tuple):
        return value[0] if value else None
    return value
