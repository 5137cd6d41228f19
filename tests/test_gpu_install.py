"""`make install-gpu`, by dry run (`make -n`): the commands it would run, in order, and that
the JAX extra it installs names the CUDA plugin at the jax version setup.cfg pins."""

import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def pinned(package: str) -> str:
    """The version setup.cfg pins `package` to (its `package==X` line)."""
    text = (ROOT / "setup.cfg").read_text()
    return re.search(rf"^\s*{re.escape(package)}==([0-9.]+)\s*$", text, re.M).group(1)


def dry_run(*args) -> list[str]:
    # Under `make test` the outer make's MAKELEVEL/MAKEFLAGS reach this make, which then
    # prints "make[1]: Entering directory" lines around the commands: run it as a top level.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(["make", "--no-print-directory", "-n", "install-gpu", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines()]


@pytest.mark.parametrize("cuda", [None, "cuda12", "cuda13"])
def test_install_gpu_adds_jax_cuda_wheels_at_the_pinned_version(cuda):
    lines = dry_run(*([f"CUDA={cuda}"] if cuda else []))
    jax_line = f'.venv/bin/python -m pip install -q "jax[{cuda or "cuda12"}]=={pinned("jax")}"'
    torch_line = (f".venv/bin/python -m pip install -q torch=={pinned('torch')} "
                  "--index-url https://download.pytorch.org/whl/cpu")
    # torch's CPU build before `make install` (which would otherwise fetch a CUDA torch),
    # JAX's CUDA plugin after it, then the devices JAX sees.
    order = [lines.index(torch_line), lines.index(jax_line)]
    assert order == sorted(order)
    assert any(line.split()[-1:] == ["install"] and "make" in line.split()[0] for line in
               lines[order[0] + 1:order[1]])
    assert lines[-1] == ".venv/bin/python -c 'import jax; print(jax.devices())'"


def test_the_pinned_jax_has_the_cuda_extras():
    """The installed jax (setup.cfg's pin) declares `cuda12` / `cuda13` extras that bring
    its own version of the CUDA plugin, so `jax[cudaNN]==<pin>` never moves jax."""
    version = pinned("jax")
    assert importlib.metadata.version("jax") == version
    requires = importlib.metadata.requires("jax")
    for cuda in ("cuda12", "cuda13"):
        plugin = [r for r in requires if f'extra == "{cuda}"' in r and "plugin" in r]
        assert plugin and f"<={version}" in plugin[0] and f">={version}" in plugin[0], plugin
