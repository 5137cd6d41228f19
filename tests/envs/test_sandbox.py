"""The sandbox really blocks what model-written code might try (checked, not assumed)."""

import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from envs import sandbox
from envs.sandbox import Limits, Sandbox

REPO_ROOT = Path(__file__).resolve().parents[2]
MODE = sandbox.isolation_mode()
needs_netns = pytest.mark.skipif(MODE in ("uid", "rlimits"), reason="no network namespace here")
needs_full = pytest.mark.skipif(MODE != "full", reason="needs the root (namespace) mode")


@pytest.fixture
def box():
    sb = Sandbox(Limits(cpu_seconds=3, wall_seconds=10, memory_bytes=512 << 20))
    yield sb
    sb.close()


def run_py(box, code, **kw):
    work = box.fresh_dir({"main.py": code})
    return box.run([sys.executable, "main.py"], cwd=work, **kw), work


def test_root_gets_the_full_mode():
    if os.geteuid() == 0 and not os.environ.get("JAXRL_SANDBOX_MODE"):
        assert MODE == "full"
    assert MODE in sandbox.MODES


def test_code_runs_and_writes_inside(box):
    res, work = run_py(box, "open('out.txt', 'w').write('hi')\nprint('done')")
    assert res.returncode == 0 and res.stdout.strip() == "done", res
    assert Path(work, "out.txt").read_text() == "hi"


@needs_full
def test_writes_outside_are_blocked(box, tmp_path):
    targets = [f"/tmp/escape_{uuid.uuid4().hex}", str(REPO_ROOT / f"escape_{uuid.uuid4().hex}"),
               os.path.join(os.path.expanduser("~"), f"escape_{uuid.uuid4().hex}"),
               str(tmp_path / "escape"), f"/dev/shm/escape_{uuid.uuid4().hex}",
               os.path.join(box.path, "escape_next_to_workdir")]
    code = (
        "import sys\n"
        f"for p in {targets!r}:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('WROTE', p)\n"
        "    except OSError as e:\n"
        "        print('blocked', p, type(e).__name__)\n"
    )
    res, _ = run_py(box, code)
    assert res.returncode == 0, res
    assert "WROTE" not in res.stdout
    assert res.stdout.count("blocked") == len(targets)
    for target in targets:
        assert not os.path.exists(target)


@needs_full
def test_the_checkout_and_homes_are_hidden_but_the_interpreter_works(box):
    """The project's files (its grader, the generated tasks' reference fixes) and the
    users' homes are not visible; the interpreter and its venv's packages still are."""
    secret = REPO_ROOT / "envs" / "code_tasks" / "libraries.py"
    code = (
        "import os\n"
        f"for p in [{str(secret)!r}, {str(REPO_ROOT / 'envs')!r}, '/home/x', '/root/.ssh']:\n"
        "    print('SEEN' if os.path.exists(p) else 'hidden', p)\n"
        "import pytest\n"
        "print('imported', pytest.__name__)\n"
    )
    res, _ = run_py(box, code)
    assert res.returncode == 0, res
    assert "SEEN" not in res.stdout and res.stdout.count("hidden") == 4
    assert "imported pytest" in res.stdout


def test_host_environment_does_not_leak(box, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "s3cr3t-value-123")
    code = "import os\nprint(sorted(os.environ))\nprint(os.environ.get('SECRET_TOKEN'))"
    res, _ = run_py(box, code)
    assert res.returncode == 0, res
    assert "s3cr3t-value-123" not in res.output and "SECRET_TOKEN" not in res.output
    assert res.stdout.splitlines()[-1] == "None"


@needs_full
def test_host_process_environ_is_unreadable(box, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "s3cr3t-value-123")
    code = (f"try:\n    print(open('/proc/{os.getpid()}/environ', 'rb').read())\n"
            "except OSError as e:\n    print('blocked', type(e).__name__)")
    res, _ = run_py(box, code)
    assert "s3cr3t" not in res.output and "blocked" in res.stdout, res


@needs_netns
def test_sockets_cannot_reach_the_host_or_outside(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"for addr in [('127.0.0.1', {port}), ('8.8.8.8', 53), ('1.1.1.1', 443)]:\n"
        "    s = socket.socket()\n"
        "    s.settimeout(3)\n"
        "    try:\n"
        "        s.connect(addr)\n"
        "        print('CONNECTED', addr)\n"
        "    except OSError as e:\n"
        "        print('blocked', addr, e)\n"
    )
    try:
        res, _ = run_py(box, code)
    finally:
        server.close()
    assert res.returncode == 0, res
    assert "CONNECTED" not in res.stdout and res.stdout.count("blocked") == 3


def test_fork_bomb_is_contained_and_cleaned_up(box):
    code = ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
            "        pass\n")
    res, _ = run_py(box, code, wall_seconds=4)
    assert res.timed_out or res.returncode != 0
    if MODE == "full":
        assert sandbox._live_processes(box.uid) == []  # zombies aside
    after, _ = run_py(box, "print('still works')")
    assert after.stdout.strip() == "still works"


def test_infinite_loop_is_stopped(box):
    res, _ = run_py(box, "while True:\n    pass\n", wall_seconds=6)
    assert res.timed_out or res.returncode != 0


def test_sleeping_code_hits_the_wall_clock(box):
    res, _ = run_py(box, "import time\ntime.sleep(60)\n", wall_seconds=1.5)
    assert res.timed_out and res.returncode is None


def test_memory_bomb_fails_safely(box):
    res, _ = run_py(box, "x = bytearray(8 << 30)\nprint('allocated')")
    assert res.returncode != 0 and "allocated" not in res.stdout
    assert "MemoryError" in res.stderr


def test_memory_is_capped_per_sandbox_as_well_as_per_process():
    """Four processes of 200 MiB each stay under the per-process cap (512 MiB) but not
    under the sandbox's (400 MiB): the run is stopped early with a clear error."""
    sb = Sandbox(Limits(memory_bytes=512 << 20, sandbox_memory_bytes=400 << 20,
                        wall_seconds=30))
    code = ("import os, time\n"
            "for _ in range(3):\n"
            "    if os.fork() == 0:\n"
            "        break\n"
            "block = b'x' * (200 << 20)\n"
            "time.sleep(30)\n")
    try:
        start = time.monotonic()
        res, _ = run_py(sb, code)
        assert not res.timed_out and time.monotonic() - start < 20, res
        assert res.error.startswith("memory cap") and "400 MiB" in res.error, res
        after, _ = run_py(sb, "print('still works')")
        assert after.stdout.strip() == "still works"
    finally:
        sb.close()


def test_file_size_bomb_is_cut(box):
    code = "with open('big', 'wb') as f:\n    f.write(b'x' * (64 << 20))\nprint('wrote')"
    res, work = run_py(box, code)
    assert "wrote" not in res.stdout and res.returncode != 0
    assert not os.path.exists(os.path.join(work, "big")) or os.path.getsize(
        os.path.join(work, "big")) <= box.limits.file_size_bytes


def test_output_is_bounded(box):
    res, _ = run_py(box, "print('y' * 200_000)")
    assert len(res.stdout) < box.limits.output_chars + 100


def test_cwd_outside_the_sandbox_is_refused(box, tmp_path):
    with pytest.raises(ValueError, match="outside the sandbox"):
        box.run([sys.executable, "-c", "pass"], cwd=str(tmp_path))


def test_sandboxes_get_distinct_uids():
    a, b = Sandbox(), Sandbox()
    try:
        a.run([sys.executable, "-c", "pass"])
        b.run([sys.executable, "-c", "pass"])
        if MODE == "full":
            assert a.uid != b.uid and min(a.uid, b.uid) >= sandbox.UID_BASE
    finally:
        a.close()
        b.close()


def test_close_removes_the_directory():
    sb = Sandbox()
    path = sb.path
    sb.fresh_dir({"a/b.txt": "x"})
    sb.close()
    assert not os.path.exists(path)
