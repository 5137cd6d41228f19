"""Running untrusted (model-written) code in a throw-away directory.

`Sandbox(path).run(argv)` starts `argv` in `path` as a subprocess with

- resource limits: CPU seconds, address space (RLIMIT_AS), file size, open files,
  process count, no core dumps;
- a cap on the resident memory of all the run's processes together
  (`Limits.sandbox_memory_bytes`), summed by the parent every 50 ms (`_watch`);
- a wall-clock timeout that kills the whole process group (and, in the "full" mode,
  the whole PID namespace);
- an environment holding only PATH, HOME, TMPDIR, LANG and a few PYTHON* switches, so
  none of the host's variables (tokens, keys) reach the code;
- and, depending on what the machine allows (probed once per process, see
  `isolation_mode()`):
  * "full" (running as root): new mount, network, PID, IPC and UTS namespaces; every
    mount is remounted read-only except the sandbox directory; this project's checkout
    (its grader, the reference fixes of the generated tasks), /home, /root and the
    directories other users cannot enter on the way to the interpreter are hidden under
    empty tmpfs mounts, with only the interpreter's own directories (the venv, the
    Python install) shown again, read-only; then the process drops to an unprivileged
    uid/gid (no capabilities, `no_new_privs`). The network namespace has only a down
    loopback, so every connect fails with "Network is unreachable".
  * "uid" (root, but namespaces are refused, e.g. a locked-down container): only the drop
    to the unprivileged uid, so writes succeed only where any user may write (/tmp,
    /var/tmp) and the process limit holds; the network is NOT isolated (warning logged).
    The interpreter must be usable by other users (not under /root).
  * "userns" (not root, unprivileged user namespaces allowed): a user + network
    namespace, so no network; file writes are limited by the caller's own permissions.
  * "rlimits" (neither works): resource limits, environment stripping and timeouts
    only. The network is NOT isolated; a warning is logged when this mode is chosen.

The confinement is done by a launcher, this very file run as `python -I -S sandbox.py
CONFIG CMD...` in a new session (no `preexec_fn`, so the caller may have threads): it
unshares, mounts, sets the limits, drops privileges, then starts CMD (in "full" mode as
PID 1 of the new PID namespace, killed with the launcher through PR_SET_PDEATHSIG, so the
kernel kills whatever CMD forked when it ends). After each run every remaining process
of the sandbox's uid (leased by one Sandbox alone, see _UidLease) is killed.

Known limits: the per-sandbox memory cap is a poll, not a kernel limit: between two
checks each process can grow to its RLIMIT_AS (so a run can briefly hold up to
`processes` x `memory_bytes`); host files outside the hidden directories (/etc, /usr,
/opt, other data directories) stay readable where their permissions allow it (only the
writes are blocked). Grading does not trust the tested process's report: envs/grader.py.

Why our own namespace code rather than bubblewrap or cgroups (2026-12): bubblewrap would
do what the "full" mode does (read-only binds, private /tmp, namespaces, uid drop) and
could start from an empty root, but it is a system package the machines do not have
(`which bwrap` finds nothing here; it installs with apt-get where apt is allowed), and the
mode's allow-what-is-needed part, hiding directories and showing the interpreter's again,
takes ~30 lines here. cgroups would cap memory in the kernel, but only in a cgroup
subtree delegated to us; on these machines the only writable hierarchy is the host's
own cgroup-v1 tree (its process manager puts every command in a cgroup of it), which
this project must not manage, hence the polled cap. Where a delegated
cgroup-v2 subtree exists, a `memory.max` per run is the better cap.

Set JAXRL_SANDBOX_MODE to one of the three names to force a weaker mode (tests, debugging).
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import functools
import json
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

MODES = ("full", "uid", "userns", "rlimits")
DROPS_UID = ("full", "uid")  # the modes that run commands as a leased unprivileged uid

# Linux constants (sched.h, sys/mount.h, sys/prctl.h); Python 3.11 has no os.unshare.
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MS_PRIVATE = 1 << 18
PR_SET_NO_NEW_PRIVS = 38

SETUP_FAILED = 125  # exit status of the launcher when it could not confine the command
_SETUP_PREFIX = "sandbox setup failed: "


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-run resource limits (each process gets them; processes counts the whole uid;
    sandbox_memory_bytes caps the resident memory of all the run's processes together)."""

    cpu_seconds: int = 20
    memory_bytes: int = 768 << 20
    sandbox_memory_bytes: int = 1536 << 20
    file_size_bytes: int = 16 << 20
    open_files: int = 256
    processes: int = 32
    wall_seconds: float = 30.0
    output_chars: int = 20_000


@dataclasses.dataclass
class RunResult:
    """What a sandboxed command did. returncode is None when it was killed on timeout."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    mode: str
    error: str = ""

    @property
    def output(self) -> str:
        return (self.stdout + ("\n" + self.stderr if self.stderr.strip() else "")).strip()


UID_BASE, UID_SLOTS = 100_000, 4096
_LEASE_DIR = os.path.join(tempfile.gettempdir(), "jaxrl_sandbox_uids")


class _UidLease:
    """An unprivileged uid held by one Sandbox alone, across processes (an flock on a
    slot file, released on close or when the process dies). Owning the uid alone keeps
    RLIMIT_NPROC (counted per uid) and the post-run kill of the uid's processes from
    touching other sandboxes. No passwd entry is needed."""

    def __init__(self):
        os.makedirs(_LEASE_DIR, mode=0o700, exist_ok=True)
        first = os.getpid() % UID_SLOTS
        for k in range(UID_SLOTS):
            slot = (first + k) % UID_SLOTS
            fd = os.open(os.path.join(_LEASE_DIR, f"{slot}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.fd, self.uid = fd, UID_BASE + slot
            return
        raise RuntimeError(f"all {UID_SLOTS} sandbox uids are in use ({_LEASE_DIR})")

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Libc:
    def __init__(self):
        self.lib = ctypes.CDLL(None, use_errno=True)

    def _check(self, ret: int, what: str) -> None:
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def unshare(self, flags: int) -> None:
        self._check(self.lib.unshare(ctypes.c_int(flags)), "unshare")

    def mount(self, src: str | None, target: str, fstype: str | None, flags: int,
              data: str | None = None) -> None:
        enc = lambda s: None if s is None else s.encode()
        ret = self.lib.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags),
                             enc(data))
        self._check(ret, f"mount {target}")

    def no_new_privs(self) -> None:
        self._check(self.lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            raw = line.split()[4]
            # mountinfo escapes space, tab, newline and backslash as octal (\040 ...)
            points.append(raw.encode().decode("unicode_escape"))
    return points


def _hidden_ancestor(path: str) -> str | None:
    """The first directory on `path` that other users may not enter, if any."""
    current = Path("/")
    for part in Path(path).parts[1:]:
        try:
            if not current.stat().st_mode & stat.S_IXOTH:
                return str(current)
        except OSError:
            return None
        current = current / part
    return None


def _interpreter_paths() -> set[str]:
    """The directories the sandboxed interpreter (and the tools in its venv) live in."""
    return {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix,
                                          os.path.dirname(os.path.realpath(sys.executable)))}


def _hidden_tops() -> set[str]:
    """Host directories the sandbox never shows: this project's checkout (its grader and
    the reference fixes of the generated tasks live there) and the users' homes. The
    interpreter's own directories below them are shown again (see `_exposures`)."""
    checkout = Path(__file__).resolve().parents[1]
    tops = {"/home", "/root"}
    if (checkout / "envs" / "sandbox.py").is_file():
        tops.add(str(checkout))
    return {t for t in tops if os.path.isdir(t)}


def _is_within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _exposures(root: str) -> dict[str, list[list]]:
    """{directory to hide under an empty tmpfs: [[path below it to show again, writable]]}.

    Hidden: the directories other users cannot enter on the way to the interpreter (the
    unprivileged uid could not use them otherwise) and `_hidden_tops()`. A top that holds
    the interpreter itself, or lies below another top, is not hidden. Shown again: the
    interpreter's directories, read-only, and the sandbox root `root`, writable.
    """
    needed = _interpreter_paths()
    tops = {_hidden_ancestor(p) for p in needed} - {None} | _hidden_tops()
    tops = {t for t in tops if not any(_is_within(t, p) for p in needed)}
    tops = {t for t in tops if not any(t != o and _is_within(t, o) for o in tops)}
    out: dict[str, list[list]] = {}
    for top in sorted(tops):
        shown = sorted(p for p in needed if _is_within(p, top) and p != top)
        shown = [p for p in shown if not any(p != q and _is_within(p, q) for q in shown)]
        out[top] = [[p, False] for p in shown]
        if _is_within(root, top):
            out[top].append([root, True])
    return out


def _confine(mode: str, root: str, limits: Limits, uid: int, exposures: dict) -> None:
    """Runs in the launcher process, as the caller's user, before the command starts."""
    libc = _Libc()
    if mode == "full":
        libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS)
        libc.mount("none", "/", None, MS_REC | MS_PRIVATE)
        libc.mount(root, root, None, MS_BIND | MS_REC)
        for point in _mount_points():
            if point != root:
                try:
                    libc.mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
                except OSError:
                    pass  # e.g. a mount that is already read-only with locked flags
        for top, paths in exposures.items():
            _hide_except(libc, top, paths)
        os.chdir(root)  # the old cwd points below the read-only mount
    elif mode == "userns":
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNET)
    _set_limits(limits)
    if mode in DROPS_UID:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        libc.no_new_privs()


def _hide_except(libc: _Libc, top: str, paths: list[list]) -> None:
    """Hides `top` under an empty read-only tmpfs, then binds `paths` ([path, writable]
    pairs below it) back, read-only unless writable."""
    fds = [os.open(p, os.O_PATH) for p, _ in paths]
    libc.mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
    for (path, writable), fd in zip(paths, fds):
        os.makedirs(path, exist_ok=True)
        libc.mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        if not writable:
            libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(fd)
    libc.mount(None, top, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _exec(argv: list[str]) -> None:
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"sandbox: cannot run {argv[0]!r}: {exc}\n")
        os._exit(127)


def _launch(config_json: str, argv: list[str]) -> None:
    """The launcher (`python -I -S sandbox.py CONFIG CMD...`): confine, then run CMD.

    In "full" mode CMD runs as PID 1 of the new PID namespace (a child of the launcher
    with PDEATHSIG=SIGKILL): when it ends, or the launcher is killed, the kernel kills
    every process left in the namespace, fork bombs included.
    """
    config = json.loads(config_json)
    mode = config["mode"]
    try:
        _confine(mode, config["root"], Limits(**config["limits"]), config["uid"],
                 config["exposures"])
    except Exception as exc:  # reported to the parent through the exit status
        sys.stderr.write(f"{_SETUP_PREFIX}{exc!r}\n")
        os._exit(SETUP_FAILED)
    if mode != "full":
        _exec(argv)
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        _exec(argv)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def _set_limits(limits: Limits) -> None:
    cpu = int(limits.cpu_seconds)
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits.memory_bytes,) * 2),
        (resource.RLIMIT_FSIZE, (limits.file_size_bytes,) * 2),
        (resource.RLIMIT_NOFILE, (limits.open_files,) * 2),
        (resource.RLIMIT_NPROC, (limits.processes,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(res, value)


def _clean_env(root: str) -> dict[str, str]:
    bindir = os.path.dirname(sys.executable)
    return {
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": root,
        "TMPDIR": os.path.join(root, ".tmp"),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONNOUSERSITE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _read_bounded(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(limit * 4 + 1)
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit:
        text = text[:limit] + f"\n... [output cut at {limit} characters]"
    return text


def _execute(argv: list[str], root: str, limits: Limits, mode: str, wall_seconds: float,
             uid: int) -> RunResult:
    exposures = _exposures(root) if mode == "full" else {}
    config = {"mode": mode, "root": root, "limits": dataclasses.asdict(limits), "uid": uid,
              "exposures": exposures}
    argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), json.dumps(config), *argv]
    if mode in DROPS_UID:
        _chown_tree(root, uid)
    os.makedirs(os.path.join(root, ".tmp"), exist_ok=True)
    if mode in DROPS_UID:
        os.chown(os.path.join(root, ".tmp"), uid, uid)
    with tempfile.TemporaryDirectory(prefix="sandbox_io_") as io_dir:
        out_path, err_path = os.path.join(io_dir, "out"), os.path.join(io_dir, "err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    argv, cwd=root, env=_clean_env(root), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=err, start_new_session=True, close_fds=True,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return RunResult(None, "", "", False, mode, error=f"could not start: {exc}")
            stopped = _watch(proc, wall_seconds, limits.sandbox_memory_bytes,
                             uid if mode in DROPS_UID else None)
            _kill_group(proc.pid)
            proc.wait()
            if mode in DROPS_UID:
                _reap_uid(uid)
        stdout = _read_bounded(out_path, limits.output_chars)
        stderr = _read_bounded(err_path, limits.output_chars)
    error = stopped if stopped.startswith("memory") else ""
    if proc.returncode == SETUP_FAILED and stderr.startswith(_SETUP_PREFIX):
        error = stderr.strip()
    timed_out = stopped == "timeout"
    return RunResult(None if timed_out else proc.returncode, stdout, stderr, timed_out, mode,
                     error=error)


WATCH_SECONDS = 0.05  # how often the resident memory of a run is summed
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _watch(proc: subprocess.Popen, wall_seconds: float, memory_cap: int,
           uid: int | None) -> str:
    """Waits for the run: "" when it ended, "timeout" at the wall clock, or a "memory ..."
    message when its processes together held more than `memory_cap` bytes (checked every
    WATCH_SECONDS; between two checks each process can grow up to its RLIMIT_AS)."""
    deadline = time.monotonic() + wall_seconds
    while True:
        try:
            proc.wait(timeout=max(0.0, min(WATCH_SECONDS, deadline - time.monotonic())))
            return ""
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            return "timeout"
        held = _resident_bytes(uid, proc.pid)
        if held > memory_cap:
            return (f"memory cap: the sandbox's processes held {held >> 20} MiB, more than "
                    f"its {memory_cap >> 20} MiB (Limits.sandbox_memory_bytes)")


def _resident_bytes(uid: int | None, session: int) -> int:
    """Resident memory of the processes of `uid` (the modes that drop to a leased uid), or
    else of the session `session` (a process that starts its own session escapes this)."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if uid is not None and os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # fields[k] is field k + 3
            if uid is None and int(fields[3]) != session:
                continue
            total += int(fields[21]) * _PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _live_processes(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            pids.append(int(name))
    return pids


def _reap_uid(uid: int, timeout: float = 5.0) -> None:
    """Waits (killing them) until no live process of the sandbox uid is left, so that one
    run's fork bomb cannot eat the next run's process budget. The kernel tears the PID
    namespace down asynchronously; this usually returns at once."""
    deadline = time.monotonic() + timeout
    while (pids := _live_processes(uid)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    if pids:
        log.warning("sandbox: %d process(es) of uid %d survived the kill", len(pids), uid)


def _chown_tree(root: str, uid: int) -> None:
    os.chown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


@functools.lru_cache(maxsize=1)
def isolation_mode() -> str:
    """The strongest mode that works here (probed once per process by running a child)."""
    forced = os.environ.get("JAXRL_SANDBOX_MODE")
    if forced:
        if forced not in MODES:
            raise ValueError(f"JAXRL_SANDBOX_MODE={forced!r}; valid: {list(MODES)}")
        return forced
    candidates = ["full", "uid"] if os.geteuid() == 0 else ["userns"]
    for mode in candidates:
        probe_dir = tempfile.mkdtemp(prefix="sandbox_probe_")
        try:
            os.chmod(probe_dir, 0o755)
            lease = _UidLease()
            try:
                res = _execute([sys.executable, "-I", "-c", "print('ok')"], probe_dir,
                               Limits(), mode, wall_seconds=30, uid=lease.uid)
            finally:
                lease.release()
            if res.returncode == 0 and res.stdout.strip() == "ok":
                _log_choice(mode)
                return mode
            log.info("sandbox mode %s unavailable: %s", mode, res.error or res.output[-300:])
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
    log.warning(
        "sandbox: no namespaces available; model-written code runs with resource limits, "
        "a stripped environment and timeouts only (network and file system NOT isolated)"
    )
    return "rlimits"


def _log_choice(mode: str) -> None:
    if mode == "full":
        log.info("sandbox isolation mode: full")
    else:
        log.warning("sandbox isolation mode: %s (weaker than 'full'; see envs/sandbox.py): "
                    "the network is %sisolated", mode, "" if mode == "userns" else "NOT ")


class Sandbox:
    """A per-episode temporary directory in which untrusted commands run.

    files: {relative path: text} written into the directory by `write_files`.
    The directory is removed by `close()` (also on garbage collection).
    """

    def __init__(self, limits: Limits | None = None, parent_dir: str | None = None):
        self.limits = limits or Limits()
        self._lease: _UidLease | None = None
        self.path = tempfile.mkdtemp(prefix="code_env_", dir=parent_dir)
        os.chmod(self.path, 0o711)  # the unprivileged uid must be able to enter it

    def fresh_dir(self, files: dict[str, str], name: str = "work") -> str:
        """Replaces `self.path/name` with exactly `files`; returns its path."""
        target = os.path.join(self.path, name)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        for rel, text in files.items():
            dest = os.path.join(target, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "w", encoding="utf-8") as f:
                f.write(text)
        return target

    def run(self, argv: list[str], cwd: str | None = None,
            wall_seconds: float | None = None) -> RunResult:
        """Runs argv in `cwd` (a directory inside the sandbox, default its root)."""
        cwd = os.path.realpath(cwd or self.path)
        if os.path.commonpath([cwd, os.path.realpath(self.path)]) != os.path.realpath(self.path):
            raise ValueError(f"cwd {cwd!r} is outside the sandbox {self.path!r}")
        wall = self.limits.wall_seconds if wall_seconds is None else wall_seconds
        mode = isolation_mode()
        if mode in DROPS_UID and self._lease is None:
            self._lease = _UidLease()
        return _execute(list(argv), cwd, self.limits, mode, wall, self.uid)

    @property
    def uid(self) -> int:
        """The uid the commands run as (modes DROPS_UID; -1 before the first run)."""
        return self._lease.uid if self._lease is not None else -1

    def close(self) -> None:
        if getattr(self, "_lease", None) is not None:
            self._lease.release()
            self._lease = None
        if getattr(self, "path", None):
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = ""

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    _launch(sys.argv[1], sys.argv[2:])
