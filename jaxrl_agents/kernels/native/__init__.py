"""CPU kernels in C++, called from jitted code through XLA's FFI.

XLA:CPU runs a scan over the time axis of a [B, T] array as a loop over [B] slices,
which needs the inputs transposed to time-major and the outputs transposed back; at
T = 4096 those copies cost as much as the scan. A hand-written loop reads the rows where
they lie. The source is compiled once per machine with the system's C++ compiler into a
cache directory (`$JAXRL_CACHE/native`, else `~/.cache/jaxrl_agents/native`: the root
the generated games use) and registered as an XLA FFI target for the CPU platform.

Everything here is optional: without a compiler, with `JAXRL_NATIVE_KERNELS=0`, or on
another platform, `available()` is False and callers use their pure-JAX path.
"""

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import warnings

import jax
import jaxlib

from envs._gamecache import build_once, cache_root

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gae_cpu.cc")
_LIBRARY = "gae_cpu.so"
GAE_TARGET = "jaxrl_gae_f32"
_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")

_lock = threading.Lock()
_state: dict = {}  # "ok": bool once tried; "error": why not


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


def _library_key(compiler: str) -> str:
    """Names one build: the source, compiler, jaxlib version, platform and flags."""
    with open(_SOURCE, "rb") as f:
        source = f.read()
    return "gae_cpu-" + hashlib.sha256(
        b"\0".join([source, compiler.encode(), jaxlib.__version__.encode(),
                    sys.platform.encode(), " ".join(_FLAGS).encode()])
    ).hexdigest()[:16]


def _compile_into(compiler: str, directory: str) -> None:
    cmd = [compiler, *_FLAGS, "-I", jax.ffi.include_dir(), _SOURCE, "-o",
           os.path.join(directory, _LIBRARY)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")


def _load() -> None:
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (g++ / clang++ / $CXX)")
    # Built at most once per machine, published atomically (the games' cache mechanism).
    directory = build_once(cache_root("native"), _library_key(compiler),
                           functools.partial(_compile_into, compiler), marker=_LIBRARY)
    library = ctypes.cdll.LoadLibrary(os.path.join(directory, _LIBRARY))
    jax.ffi.register_ffi_target(GAE_TARGET, jax.ffi.pycapsule(library.JaxrlGaeF32),
                                platform="cpu")


def available() -> bool:
    """True when the CPU kernels are compiled and registered (tried once per process).
    A failure is reported once as a warning, naming why; callers then fall back."""
    with _lock:
        if "ok" in _state:
            return _state["ok"]
        if os.environ.get("JAXRL_NATIVE_KERNELS", "1") == "0":
            _state["ok"], _state["error"] = False, "disabled by JAXRL_NATIVE_KERNELS=0"
            return False
        try:
            _load()
            _state["ok"] = True
        except Exception as e:  # any failure: fall back to pure JAX, say why once
            _state["ok"], _state["error"] = False, str(e)
            warnings.warn(f"native CPU kernels unavailable, using pure JAX: {e}", stacklevel=2)
        return _state["ok"]


def gae_cpu(rewards, values, mask, last_value, gamma, lam):
    """`kernels.gae.gae` on CPU: float32 [B, T] rewards / values / mask, [B] last_value,
    scalar gamma and lam. Returns (advantages, returns), [B, T] float32 each."""
    out = jax.ShapeDtypeStruct(rewards.shape, jax.numpy.float32)
    coefs = jax.numpy.stack([jax.numpy.asarray(gamma, jax.numpy.float32),
                             jax.numpy.asarray(lam, jax.numpy.float32)])
    call = jax.ffi.ffi_call(GAE_TARGET, (out, out), vmap_method="sequential")
    return call(rewards, values, mask, last_value, coefs)
