"""Runs a test file as a script in a child process with 8 host CPU devices.

XLA_FLAGS must be set before JAX starts, so 8-device checks live in a test file's
`__main__` block, print one JSON report as their last line, and the pytest tests read it.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def report_of(script: str, timeout: int = 600) -> dict:
    """The JSON report `script` prints as its last line when run on 8 host devices."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.abspath(script)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
