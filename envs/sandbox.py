"""Run untrusted, model-generated code in a bubblewrap (``bwrap``) sandbox.

Two entry points: :class:`Sandbox` runs one command (or one Python program) to completion
and returns a :class:`RunResult`; :class:`ShellSession` keeps one interactive
``bash`` alive inside a sandbox and runs commands in it one at a time (cwd, variables and
background jobs persist between commands), as a terminal env needs.

What ``mode="bwrap"`` isolates
------------------------------
* **Identity.** The code runs as uid/gid 65534 (``nobody``) with no capabilities,
  ``no_new_privs`` and nested user namespaces disabled. When the launching process is
  root, privileges are dropped *before* bwrap starts (``setpriv --reuid=65534
  --regid=65534 --clear-groups``): launched as root, bwrap would keep host capabilities
  inside (a read-only bind could be remounted read-write) and RLIMIT_NPROC would be
  ignored. Files the code creates in the work dir are owned by 65534 on the host (by the
  calling user when it is not root).
* **Filesystem.** The host root is bind-mounted read-only. Writable: the private work dir
  (mounted at ``/work``, or ``/tmp/work`` on hosts without a ``/work`` directory; also the
  cwd and ``$HOME``), and private tmpfs mounts at ``/tmp`` and ``/dev/shm`` whose size is
  capped at ``Limits.memory_mb`` each. ``/root``, ``/home`` and ``/run`` are replaced by
  empty read-only tmpfs (home-directory secrets, ``/run/docker.sock``, D-Bus sockets).
  ``/dev`` is a minimal private one (null, zero, random, urandom, tty, pts); ``/proc``
  belongs to the sandbox's own PID namespace (host processes are invisible).
* **Network.** A new network namespace holding only a loopback interface: no outbound
  traffic, no DNS, no host ports (abstract unix sockets are per-namespace too).
* **Processes.** A new PID namespace whose init is bwrap. Everything the code starts,
  daemons that ``setsid``/``nohup`` included, is SIGKILLed when :meth:`Sandbox.run`
  returns or :meth:`ShellSession.close` is called: killing the sandbox's PID 1 kills the
  whole namespace. IPC, UTS (hostname ``sandbox``) and cgroup namespaces are new too.
* **Resources.** rlimits set in the child before bwrap starts (by ``prlimit(1)``, or a
  ``preexec_fn`` where it is missing): RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC,
  RLIMIT_NOFILE, RLIMIT_CORE=0; a wall-clock timeout that kills the whole sandbox; and a
  cap on captured output.

What it does NOT isolate
------------------------
* **The kernel.** There is no seccomp filter and no VM: a kernel exploit escapes.
* **Reads.** Anything world-readable on the host outside the hidden directories is
  readable (``/etc``, ``/usr``, ``/opt``, ``/sys``, ``/proc/sys``, ``/var``...). Keep
  secrets in ``/root``, ``/home`` or ``/run``, or make them unreadable to uid 65534.
  When the launcher is not root the code runs as the calling user (mapped to 65534),
  keeps that user's supplementary groups, and can read whatever that user can read.
* **Disk.** The work dir is on the host disk; RLIMIT_FSIZE caps each file, not the total.
* **Memory and CPU totals.** RLIMIT_AS and RLIMIT_CPU are per process, so the totals are
  bounded by ``processes`` times those limits, not by a cgroup. RLIMIT_AS also counts
  reserved address space: runtimes that reserve a lot up front (JVM, Go) need a larger
  ``memory_mb``.
* **RLIMIT_NPROC is per host uid.** All sandboxes run as the same uid (65534 when
  launched as root, the caller otherwise), so they share one count; each sandbox gets
  ``processes`` plus the number of processes that uid already has when it starts.
* **Timing and resource side channels** between sandboxes and the host.
* ``mode="none"`` isolates nothing: only the rlimits, the timeout and the output cap
  apply (as root, RLIMIT_NPROC is not even enforced). It is for trusted code and tests,
  and says so with a warning.

Output floods: output beyond ``Limits.output_bytes`` (per stream) is not stored but the
pipes keep being drained, so a program that prints 50 MB still exits normally with its
real exit code; an endless flood ends at the wall-clock timeout. Memory stays bounded
by the cap.

Reaping: the sandbox's PID 1 is a grandchild of this process. When the outer bwrap exits,
PID 1 is orphaned. Without a reaper it would stay a zombie (many container inits never
reap) and zombies count against RLIMIT_NPROC: sequential runs would fail with "Can't
fork" after about a hundred. So the first sandbox launch makes this process a child
subreaper (``prctl(PR_SET_CHILD_SUBREAPER, 1)``): orphaned sandbox processes are
reparented here, and each run reaps its own PID 1 after collecting the outer bwrap,
through a pidfd opened from bwrap's ``--info-fd`` report and checked against the
reported PID namespace. Nothing is reaped with ``waitpid(-1)``: that could steal the
exit status of children other code in this process spawned. When no pidfd could be
opened, a guarded sweep reaps only zombie children named ``bwrap`` that are not a
live launcher of ours. One side effect: other code's orphaned grandchildren are now
reparented to this process too, and this module does not reap them, so run sandboxes
in a worker process that does not daemonize other programs.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import re
import resource
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "Limits",
    "RunResult",
    "Sandbox",
    "SandboxUnavailable",
    "ShellResult",
    "ShellSession",
    "ShellSessionError",
    "check_sandbox",
]

SANDBOX_UID = 65534
SANDBOX_GID = 65534
MODES = ("bwrap", "none")
# Host directories replaced by an empty read-only tmpfs inside the sandbox.
HIDDEN_DIRS = ("/root", "/home", "/run")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MiB = 1 << 20
_READ_CHUNK = 1 << 16
_EXIT_DRAIN_S = 0.5  # after the program exits, how long to wait for its pipes to close
_KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the launcher to exit
_PR_SET_CHILD_SUBREAPER = 36


class SandboxUnavailable(RuntimeError):
    """bubblewrap sandboxes cannot run on this machine; the message says what is missing."""


class ShellSessionError(RuntimeError):
    """The shell session cannot run commands any more (timed out beyond recovery, exited, closed)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one run (or, for a shell, one session's processes)."""

    cpu_seconds: int = 10  # RLIMIT_CPU per process (SIGXCPU, then SIGKILL one second later)
    memory_mb: int = 1024  # RLIMIT_AS per process; also the size of the /tmp and /dev/shm tmpfs
    file_size_mb: int = 64  # RLIMIT_FSIZE: the largest file a process may write
    processes: int = 64  # RLIMIT_NPROC budget (see the module docstring)
    open_files: int = 256  # RLIMIT_NOFILE
    wall_seconds: float = 10.0  # wall-clock timeout of Sandbox.run
    output_bytes: int = 1_000_000  # stdout and stderr are each capped at this many bytes

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_mb", "file_size_mb", "processes", "open_files",
                     "wall_seconds", "output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class RunResult:
    """The outcome of :meth:`Sandbox.run`.

    ``exit_code`` is None when the program was killed by a signal (then ``signal`` holds
    it, e.g. 9 after a timeout, 24 for SIGXCPU). In bwrap mode an exit status above 128
    is read the shell's way, as death by signal ``status - 128``.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    duration_s: float
    signal: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class ShellResult:
    """The outcome of :meth:`ShellSession.run`. ``exit_code`` is None after a timeout."""

    output: str
    exit_code: int | None
    timed_out: bool
    output_truncated: bool = False


# --------------------------------------------------------------------------------------
# Probing
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tools:
    bwrap: str
    setpriv: str | None  # needed when the launcher is root
    prlimit: str | None  # optional; preexec_fn otherwise
    has_size: bool  # bwrap --size (tmpfs size caps)
    has_disable_userns: bool


_check_lock = threading.Lock()
_check_result: _Tools | SandboxUnavailable | None = None


def check_sandbox() -> None:
    """Raise :class:`SandboxUnavailable` unless bwrap sandboxes work here.

    Probes once (runs ``true`` in a real sandbox) and caches the answer, good or bad.
    """
    _tools()


def _tools() -> _Tools:
    global _check_result
    with _check_lock:
        if _check_result is None:
            try:
                _check_result = _probe()
            except SandboxUnavailable as exc:
                _check_result = exc
        result = _check_result
    if isinstance(result, SandboxUnavailable):
        raise SandboxUnavailable(str(result))
    return result


def _probe() -> _Tools:
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable("bubblewrap sandboxes need Linux (namespaces); use mode='none' for trusted code")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed (no `bwrap` on PATH): install it with "
            "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` (Fedora/RHEL)"
        )
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is None:
        raise SandboxUnavailable(
            "running as root needs `setpriv` to drop to uid 65534 before bwrap starts: "
            "install it with `apt-get install util-linux`"
        )
    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"cannot run {bwrap} --help: {exc}") from exc
    tools = _Tools(
        bwrap=bwrap,
        setpriv=setpriv,
        prlimit=shutil.which("prlimit"),
        has_size="--size" in help_text,
        has_disable_userns="--disable-userns" in help_text,
    )
    work = tempfile.mkdtemp(prefix="jointrl-sandbox-probe-", dir=_temp_parent())
    try:
        _prepare_work_dir(work)
        _ensure_subreaper()
        info_r, info_w = os.pipe()
        cmd = _bwrap_command(tools, ["true"], work_dir=work, inner=_inner_work_dir(), env={},
                             limits=Limits(), info_fd=info_w, new_session=True, ro_binds=())
        try:
            res = _execute(cmd, {"PATH": SANDBOX_PATH}, "/", None, None, Limits(wall_seconds=30), info_r, info_w,
                           bwrap=True)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start bwrap: {exc}") from exc
        if res.exit_code != 0:
            said = (res.stderr or res.stdout).strip() or f"exit status {res.exit_code}, signal {res.signal}"
            raise SandboxUnavailable(f"bubblewrap is installed but cannot create a sandbox (bwrap said: {said}). "
                                     + _userns_hint(said))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tools


def _temp_parent() -> str:
    """Where private work dirs go: the temp dir, or /tmp when uid 65534 could not reach it."""
    tmp = tempfile.gettempdir()
    if os.geteuid() != 0:
        return tmp
    path = os.path.realpath(tmp)
    while path != "/":
        try:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return "/tmp"
        except OSError:
            return "/tmp"
        path = os.path.dirname(path)
    return tmp


def _read_sysctl(proc_sys: str, name: str) -> str | None:
    try:
        with open(os.path.join(proc_sys, name)) as f:
            return f.read().strip()
    except OSError:
        return None


def _userns_hint(bwrap_said: str, proc_sys: str = "/proc/sys") -> str:
    """What to change so bwrap may create user namespaces, from the sysctls that refuse them."""
    hints = []
    if _read_sysctl(proc_sys, "kernel/unprivileged_userns_clone") == "0":
        hints.append("unprivileged user namespaces are disabled by sysctl kernel.unprivileged_userns_clone=0: "
                     "run `sysctl -w kernel.unprivileged_userns_clone=1`")
    if _read_sysctl(proc_sys, "user/max_user_namespaces") == "0":
        hints.append("user namespaces are disabled by sysctl user.max_user_namespaces=0: "
                     "run `sysctl -w user.max_user_namespaces=15000`")
    if _read_sysctl(proc_sys, "kernel/apparmor_restrict_unprivileged_userns") == "1":
        hints.append("AppArmor restricts unprivileged user namespaces "
                     "(sysctl kernel.apparmor_restrict_unprivileged_userns=1): run "
                     "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` or give bwrap an AppArmor profile "
                     "that allows userns")
    if hints:
        return "Fix: " + "; ".join(hints) + "."
    if any(s in bwrap_said for s in ("namespace", "uid map", "Operation not permitted", "Permission denied")):
        return ("User namespaces were refused, but no sysctl forbids them: a container runtime's seccomp or "
                "AppArmor profile probably blocks them (Docker: run with `--security-opt seccomp=unconfined "
                "--security-opt apparmor=unconfined`, or `--privileged`).")
    return "See the bwrap message above."


# --------------------------------------------------------------------------------------
# Process bookkeeping: subreaper, live launchers, orphan reaping
# --------------------------------------------------------------------------------------

_registry_lock = threading.Lock()
_live_launchers: set[int] = set()  # pids of outer bwrap / launcher processes not yet reaped
_pending_inner: list[int] = []  # pidfds of sandbox PID 1s that did not die in time
_subreaper_done = False
_runs_since_sweep = 0


def _ensure_subreaper() -> None:
    global _subreaper_done
    if _subreaper_done:
        return
    with _registry_lock:
        if _subreaper_done:
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                err = ctypes.get_errno()
                logger.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: %s; sandbox zombies may accumulate",
                               os.strerror(err))
        except (OSError, AttributeError) as exc:
            logger.warning("cannot set PR_SET_CHILD_SUBREAPER (%s); sandbox zombies may accumulate", exc)
        _subreaper_done = True


def _pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def _open_inner(info: dict[str, Any]) -> int | None:
    """A pidfd for the sandbox's PID 1 reported by bwrap --info-fd, or None.

    The pid could in principle have been reaped and recycled before we look, so the pidfd
    is kept only if the process behind it lives in the PID namespace bwrap reported and
    is still unreaped after that check (so the check was about the same process).
    """
    try:
        pid = int(info["child-pid"])
    except (KeyError, TypeError, ValueError):
        return None
    fd = _pidfd_open(pid)
    if fd is None:
        return None
    try:
        ns = info.get("pid-namespace")
        if ns is not None and os.stat(f"/proc/{pid}/ns/pid").st_ino != int(ns):
            raise OSError("pid namespace mismatch")
        signal.pidfd_send_signal(fd, 0)
    except (OSError, ValueError):
        os.close(fd)
        return None
    return fd


def _kill_pidfd(fd: int | None) -> None:
    if fd is None:
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass


def _collect_inner(fd: int, wait_s: float = 2.0) -> bool:
    """Kill and reap the sandbox's PID 1 if it was reparented to us. True when done.

    Called only after the outer bwrap is reaped: by then PID 1 was either reaped by
    bwrap (ECHILD: nothing to do) or reparented to this subreaper.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            res = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return True  # reaped by bwrap, or not our child
        except OSError:
            return True
        if res is not None:
            return True
        _kill_pidfd(fd)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        sel = selectors.DefaultSelector()
        try:
            sel.register(fd, selectors.EVENT_READ)
            sel.select(min(remaining, 0.5))
        finally:
            sel.close()


def _finish_inner(fd: int | None, wait_s: float = 2.0) -> None:
    """Reap the sandbox's PID 1 and close its pidfd, or keep it for a later retry."""
    if fd is None:
        return
    if _collect_inner(fd, wait_s):
        os.close(fd)
    else:
        with _registry_lock:
            _pending_inner.append(fd)


def _retry_pending() -> None:
    if not _pending_inner:
        return
    with _registry_lock:
        fds = list(_pending_inner)
        _pending_inner.clear()
    for fd in fds:
        _finish_inner(fd, wait_s=0.0)


def _sweep_orphans() -> None:
    """Reap zombie children named bwrap that are not live launchers of ours.

    Such zombies can only be orphaned sandbox PID 1s reparented to this subreaper.
    Launchers are spawned and registered under the same lock, so a launcher that exits
    before it is registered cannot be mistaken for an orphan.
    """
    me = os.getpid()
    with _registry_lock:
        try:
            entries = os.listdir("/proc")
        except OSError:
            return
        for name in entries:
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in _live_launchers:
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            lp, rp = raw.find(b"("), raw.rfind(b")")
            fields = raw[rp + 2:].split()
            if len(fields) < 2 or raw[lp + 1:rp] != b"bwrap" or fields[0] != b"Z" or int(fields[1]) != me:
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _count_procs(uid: int) -> int:
    """Processes owned by ``uid`` right now (zombies included, as RLIMIT_NPROC counts them)."""
    n = 0
    try:
        with os.scandir("/proc") as it:
            for entry in it:
                if entry.name.isdigit():
                    try:
                        if entry.stat(follow_symlinks=False).st_uid == uid:
                            n += 1
                    except OSError:
                        pass
    except OSError:
        return 0
    return n


def _has_exited(pid: int) -> bool:
    """True once ``pid`` (our child) is a zombie; does not reap it (WNOWAIT)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------------------
# Command construction
# --------------------------------------------------------------------------------------


def _inner_work_dir() -> str:
    """Where the work dir appears inside: /work if the host has that directory to mount on."""
    if os.path.isdir("/work") and not os.path.islink("/work"):
        return "/work"
    return "/tmp/work"


def _rlimit_values(limits: Limits, nproc_base: int) -> list[tuple[str, int, int, int]]:
    """(prlimit option, resource, soft, hard), clamped to the current hard limits when not root."""
    cpu = max(1, math.ceil(limits.cpu_seconds))
    wanted = [
        ("cpu", resource.RLIMIT_CPU, cpu, cpu + 1),
        ("as", resource.RLIMIT_AS, limits.memory_mb * _MiB, limits.memory_mb * _MiB),
        ("fsize", resource.RLIMIT_FSIZE, limits.file_size_mb * _MiB, limits.file_size_mb * _MiB),
        ("nproc", resource.RLIMIT_NPROC, limits.processes + nproc_base, limits.processes + nproc_base),
        ("nofile", resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        ("core", resource.RLIMIT_CORE, 0, 0),
    ]
    if os.geteuid() == 0:
        return wanted
    out = []
    for opt, res, soft, hard in wanted:
        _, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        out.append((opt, res, soft, hard))
    return out


def _limit_launcher(prlimit: str | None, values: list[tuple[str, int, int, int]]):
    """(argv prefix, preexec_fn): prlimit(1) when available (keeps subprocess on vfork)."""
    if prlimit:
        return [prlimit, *(f"--{opt}={soft}:{hard}" for opt, _, soft, hard in values), "--"], None
    pairs = [(res, (soft, hard)) for _, res, soft, hard in values]

    def preexec() -> None:
        for res, val in pairs:
            resource.setrlimit(res, val)

    return [], preexec


def _base_env(home: str) -> dict[str, str]:
    return {
        "PATH": SANDBOX_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    out = {}
    for k, v in (env or {}).items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k or "\0" in k or "\0" in v:
            raise ValueError(f"invalid environment entry {k!r}")
        out[k] = v
    return out


def _bwrap_command(tools: _Tools, argv: Sequence[str], *, work_dir: str, inner: str, env: Mapping[str, str],
                   limits: Limits, info_fd: int | None, new_session: bool, ro_binds: Sequence[str]) -> list[str]:
    cmd: list[str] = []
    if os.geteuid() == 0:
        assert tools.setpriv is not None
        cmd += [tools.setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_GID}", "--clear-groups",
                "--no-new-privs", "--"]
    cmd.append(tools.bwrap)
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    size = ["--size", str(limits.memory_mb * _MiB)] if tools.has_size else []
    cmd += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *size, "--tmpfs", "/tmp",
            *size, "--tmpfs", "/dev/shm"]
    for d in HIDDEN_DIRS:
        if os.path.isdir(d):
            real = os.path.realpath(d)
            cmd += [*(["--size", str(_MiB)] if tools.has_size else []), "--tmpfs", real, "--remount-ro", real]
    for path in ro_binds:
        cmd += ["--ro-bind", path, path]
    cmd += ["--bind", work_dir, inner, "--chdir", inner,
            "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
            "--hostname", "sandbox", "--cap-drop", "ALL"]
    if tools.has_disable_userns:
        cmd.append("--disable-userns")
    cmd.append("--die-with-parent")
    if new_session:
        cmd.append("--new-session")
    cmd.append("--clearenv")
    for k, v in {**_base_env(inner), **env}.items():
        cmd += ["--setenv", k, v]
    cmd += ["--", *argv]
    return cmd


def _prepare_work_dir(path: str) -> None:
    """Make ``path`` usable as a work dir by the sandbox uid."""
    st = os.stat(path)
    if os.geteuid() == 0:
        # bwrap runs as uid 65534 and must be able to reach the directory to bind it.
        parent = os.path.dirname(path)
        while parent and parent != "/":
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                raise ValueError(f"work dir {path!r} is not reachable by uid {SANDBOX_UID}: {parent!r} is not "
                                 "world-searchable (mode o+x); use a directory whose ancestors all are, such as "
                                 "one made by tempfile.mkdtemp() directly under /tmp")
            parent = os.path.dirname(parent)
        os.chown(path, SANDBOX_UID, SANDBOX_GID)
    if st.st_mode & 0o700 != 0o700:
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)


def _world_can_exec(path: str) -> bool:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o005 != 0o005:
            return False
        parent = os.path.dirname(path)
        while parent and parent != "/":
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            parent = os.path.dirname(parent)
        return True
    except OSError:
        return False


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _sandbox_python(inner: str) -> str:
    """An absolute interpreter path that exists and can run inside the sandbox."""
    exe = sys.executable or ""
    candidates = [exe, os.path.realpath(exe), "/usr/bin/python3", "/usr/local/bin/python3"]
    shadowed = [*(os.path.realpath(d) for d in HIDDEN_DIRS if os.path.isdir(d)), "/tmp", "/dev", "/proc", inner]
    for cand in candidates:
        if not cand or not os.path.isabs(cand) or not os.path.exists(cand):
            continue
        real = os.path.realpath(cand)
        if any(_under(p, s) for p in (cand, real) for s in shadowed):
            continue
        if os.geteuid() == 0 and not _world_can_exec(real):
            continue
        if os.geteuid() != 0 and not os.access(real, os.X_OK):
            continue
        return cand if cand == real else real
    raise SandboxUnavailable("no Python interpreter is visible inside the sandbox (tried "
                             f"{', '.join(c for c in candidates if c)}); install python3 system-wide or pass "
                             "python=... (and ro_binds=[...] for its prefix)")


# --------------------------------------------------------------------------------------
# Work-dir file access that never follows symlinks the sandbox may have planted
# --------------------------------------------------------------------------------------


def _split_rel(path: str) -> list[str]:
    if not isinstance(path, str) or not path or "\0" in path or os.path.isabs(path):
        raise ValueError(f"expected a relative path inside the work dir, got {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"path {path!r} must stay inside the work dir")
    return parts


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_parent(root: str, parts: list[str], create: bool, chown: bool) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                if chown:
                    os.fchown(nfd, SANDBOX_UID, SANDBOX_GID)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


# --------------------------------------------------------------------------------------
# Output capture
# --------------------------------------------------------------------------------------


class _Capture:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.total = 0
        self.open = True

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.buf)
        if room > 0:
            self.buf += data[:room]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        return _with_marker(bytes(self.buf), self.total, self.cap)


def _with_marker(kept: bytes, total: int, cap: int, crlf: bool = False) -> str:
    if crlf:
        kept = kept.replace(b"\r\n", b"\n")
    s = kept.decode("utf-8", errors="replace")
    if total > cap:
        s += f"\n[... output truncated: showing the first {cap} of {total} bytes ...]\n"
    return s


# --------------------------------------------------------------------------------------
# Sandbox
# --------------------------------------------------------------------------------------


class Sandbox:
    """Runs commands to completion in a private work dir, isolated by bubblewrap.

    ``mode="bwrap"`` isolates (see the module docstring); ``mode="none"`` runs directly on
    the host with only rlimits, the timeout and the output cap, for trusted code. With
    ``work_dir=None`` a private temporary directory is made and removed by :meth:`close`.
    ``python`` overrides the interpreter :meth:`run_python` uses (it must be visible
    inside); ``ro_binds`` lists extra host paths mounted read-only at the same path.
    """

    def __init__(self, work_dir: str | None = None, limits: Limits = Limits(), mode: str = "bwrap", *,
                 python: str | None = None, ro_binds: Sequence[str] = ()) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.limits = limits
        self._tools: _Tools | None = None
        if mode == "none":
            logger.warning("Sandbox(mode='none'): NO ISOLATION. Code runs directly on the host as uid %d with only "
                           "rlimits and a timeout; use it for trusted code only, never for model-generated code.",
                           os.geteuid())
        else:
            self._tools = _tools()
        self._owns_dir = work_dir is None
        self._closed = False
        if work_dir is None:
            work_dir = tempfile.mkdtemp(prefix="jointrl-sandbox-", dir=_temp_parent() if mode == "bwrap" else None)
        else:
            os.makedirs(work_dir, exist_ok=True)
        self.work_dir = os.path.realpath(work_dir)
        try:
            if mode == "bwrap":
                _prepare_work_dir(self.work_dir)
                self.inner_work_dir = _inner_work_dir()
            else:
                self.inner_work_dir = self.work_dir
            self.ro_binds = tuple(os.path.realpath(p) for p in ro_binds)
            if python is not None:
                self.python = python
            elif mode == "none":
                self.python = sys.executable or os.path.realpath("/usr/bin/python3")
            else:
                self.python = _sandbox_python(self.inner_work_dir)
        except BaseException:
            self.close()
            raise

    # -- files -------------------------------------------------------------------------

    def _chown_files(self) -> bool:
        return self.mode == "bwrap" and os.geteuid() == 0

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Write ``{relative path: content}`` into the work dir (str is UTF-8 encoded).

        Parent directories are created. Symlinks are never followed: a symlink (or other
        non-regular file) the sandboxed code left at a target path is replaced, and a
        symlinked parent directory raises OSError.
        """
        self._check_open()
        chown = self._chown_files()
        for rel, content in files.items():
            parts = _split_rel(rel)
            data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
            dfd = _open_parent(self.work_dir, parts, create=True, chown=chown)
            try:
                name = parts[-1]
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        raise IsADirectoryError(f"{rel!r} is a directory in the work dir")
                    if not stat.S_ISREG(st.st_mode):
                        os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    pass
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                             | os.O_CLOEXEC, 0o644, dir_fd=dfd)
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        raise OSError(f"{rel!r} is not a regular file")
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    if chown:
                        os.fchown(fd, SANDBOX_UID, SANDBOX_GID)
                finally:
                    os.close(fd)
            finally:
                os.close(dfd)

    def read_file(self, path: str, max_bytes: int | None = None) -> str:
        """Read a regular file from the work dir as text (UTF-8, errors replaced).

        Refuses symlinks anywhere in the path (OSError), so sandboxed code cannot make
        the host read files outside the work dir.
        """
        self._check_open()
        parts = _split_rel(path)
        dfd = _open_parent(self.work_dir, parts, create=False, chown=False)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path!r} is not a regular file")
            chunks, left = [], (max_bytes if max_bytes is not None else -1)
            while left != 0:
                chunk = os.read(fd, _MiB if left < 0 else min(left, _MiB))
                if not chunk:
                    break
                chunks.append(chunk)
                if left > 0:
                    left -= len(chunk)
            return b"".join(chunks).decode("utf-8", errors="replace")
        finally:
            os.close(fd)

    # -- running -----------------------------------------------------------------------

    def _launch(self, argv: Sequence[str], env: Mapping[str, str] | None, limits: Limits,
                info_fd: int | None, new_session: bool):
        """(command, launcher env, cwd, preexec_fn) for one sandboxed process."""
        user_env = _check_env(env)
        if self.mode == "bwrap":
            assert self._tools is not None
            uid = SANDBOX_UID if os.geteuid() == 0 else os.getuid()
            prefix, preexec = _limit_launcher(self._tools.prlimit, _rlimit_values(limits, _count_procs(uid)))
            cmd = _bwrap_command(self._tools, argv, work_dir=self.work_dir, inner=self.inner_work_dir,
                                 env=user_env, limits=limits, info_fd=info_fd, new_session=new_session,
                                 ro_binds=self.ro_binds)
            return prefix + cmd, {"PATH": SANDBOX_PATH}, "/", preexec
        prlimit = shutil.which("prlimit")
        prefix, preexec = _limit_launcher(prlimit, _rlimit_values(limits, _count_procs(os.getuid())))
        full_env = {**_base_env(self.work_dir), "PATH": os.environ.get("PATH", SANDBOX_PATH), **user_env}
        return prefix + list(argv), full_env, self.work_dir, preexec

    def run(self, argv: list[str], stdin: str | None = None, files: dict[str, str] | None = None,
            env: dict[str, str] | None = None, limits: Limits | None = None) -> RunResult:
        """Run ``argv`` in the sandbox (cwd = the work dir) and wait for it, within the limits.

        ``files`` are written into the work dir first. ``env`` adds to a minimal
        environment (PATH, HOME, LANG, TMPDIR). Returns when the program has exited and
        everything it started is dead, or when the wall-clock timeout killed it all.
        """
        self._check_open()
        if not argv:
            raise ValueError("argv must not be empty")
        lim = limits or self.limits
        if files:
            self.write_files(files)
        _ensure_subreaper()
        _retry_pending()
        info_r = info_w = None
        if self.mode == "bwrap":
            info_r, info_w = os.pipe()
        try:
            cmd, launch_env, cwd, preexec = self._launch(list(argv), env, lim, info_w, new_session=True)
        except BaseException:
            for fd in (info_r, info_w):
                if fd is not None:
                    os.close(fd)
            raise
        # _execute owns (and closes) both pipe ends from here on.
        return _execute(cmd, launch_env, cwd, preexec, stdin, lim, info_r, info_w, bwrap=self.mode == "bwrap")

    def run_python(self, code: str, stdin: str | None = None, files: dict[str, str] | None = None,
                   env: dict[str, str] | None = None, limits: Limits | None = None, *,
                   filename: str = "main.py", args: Sequence[str] = ()) -> RunResult:
        """Write ``code`` to ``filename`` in the work dir and run it with :attr:`python`."""
        self.write_files({**(files or {}), filename: code})
        return self.run([self.python, filename, *args], stdin=stdin, env=env, limits=limits)

    # -- lifecycle ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Sandbox is closed")

    def close(self) -> None:
        """Remove the work dir if this sandbox made it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_dir and getattr(self, "work_dir", None):
            _rmtree(self.work_dir)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sandbox(work_dir={self.work_dir!r}, mode={self.mode!r}, limits={self.limits!r})"


def _rmtree(path: str) -> None:
    def onerror(func, p, _exc):  # sandboxed code may leave directories without u+rwx
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


def _execute(cmd: list[str], launch_env: dict[str, str], cwd: str, preexec, stdin: str | None, limits: Limits,
             info_r: int | None, info_w: int | None, *, bwrap: bool) -> RunResult:
    global _runs_since_sweep
    stdin_data = stdin.encode("utf-8") if stdin is not None else None
    start = time.monotonic()
    try:
        with _registry_lock:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=launch_env, start_new_session=True,
                pass_fds=(info_w,) if info_w is not None else (), preexec_fn=preexec,
            )
            _live_launchers.add(proc.pid)
    except BaseException:
        if info_r is not None:
            os.close(info_r)
        raise
    finally:
        if info_w is not None:
            os.close(info_w)
    inner: int | None = None
    exit_fd = _pidfd_open(proc.pid)
    sel = selectors.DefaultSelector()
    caps: dict[int, _Capture] = {}
    timed_out = exited = False
    try:
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            fd = stream.fileno()
            os.set_blocking(fd, False)
            caps[fd] = _Capture(limits.output_bytes)
            sel.register(fd, selectors.EVENT_READ, "out")
        info_buf = bytearray()
        if info_r is not None:
            os.set_blocking(info_r, False)
            sel.register(info_r, selectors.EVENT_READ, "info")
        if exit_fd is not None:
            sel.register(exit_fd, selectors.EVENT_READ, "exit")
        stdin_view = memoryview(stdin_data) if stdin_data else None
        if proc.stdin is not None:
            if stdin_view:
                os.set_blocking(proc.stdin.fileno(), False)
                sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "in")
            else:
                proc.stdin.close()
        deadline = start + limits.wall_seconds
        stop_at = deadline
        while True:
            now = time.monotonic()
            if not exited and _has_exited(proc.pid):
                exited = True
                # The program is done: kill whatever it left behind. The launcher is a zombie
                # we have not reaped, so its process group id cannot have been recycled.
                _kill_pidfd(inner)
                _killpg(proc.pid)
                stop_at = now + _EXIT_DRAIN_S
            if exited and not any(c.open for c in caps.values()):
                break
            if not exited and not timed_out and now >= deadline:
                timed_out = True
                _kill_pidfd(inner)
                _killpg(proc.pid)
                stop_at = now + _KILL_WAIT_S
            elif now >= stop_at and (exited or timed_out):
                break
            wait = max(0.0, stop_at - now)
            if exit_fd is None:
                wait = min(wait, 0.02)
            for key, _ in sel.select(wait):
                tag = key.data
                if tag == "out":
                    cap = caps[key.fd]
                    for _ in range(16):
                        try:
                            data = os.read(key.fd, _READ_CHUNK)
                        except BlockingIOError:
                            break
                        except OSError:
                            data = b""
                        if not data:
                            sel.unregister(key.fd)
                            cap.open = False
                            break
                        cap.feed(data)
                elif tag == "info":
                    try:
                        data = os.read(key.fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fd)
                        continue
                    info_buf += data
                    if inner is None:
                        try:
                            info = json.loads(info_buf)
                        except ValueError:
                            continue
                        inner = _open_inner(info)
                        if timed_out or exited:
                            _kill_pidfd(inner)
                elif tag == "in":
                    assert proc.stdin is not None and stdin_view is not None
                    try:
                        n = os.write(key.fd, stdin_view[:_READ_CHUNK])
                        stdin_view = stdin_view[n:]
                    except BlockingIOError:
                        continue
                    except OSError:  # BrokenPipe: the program stopped reading
                        stdin_view = stdin_view[:0]
                    if not stdin_view:
                        sel.unregister(key.fd)
                        try:
                            proc.stdin.close()
                        except OSError:
                            pass
                elif tag == "exit":
                    sel.unregister(key.fd)
    finally:
        sel.close()
        if info_r is not None:
            os.close(info_r)
        if proc.poll() is None and not _has_exited(proc.pid):
            _kill_pidfd(inner)
            _killpg(proc.pid)
        try:
            proc.wait(timeout=_KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            logger.error("sandbox launcher %d did not exit after SIGKILL; leaving it", proc.pid)
        for f in (proc.stdout, proc.stderr, proc.stdin):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        if exit_fd is not None:
            os.close(exit_fd)
        with _registry_lock:
            if proc.returncode is not None:
                _live_launchers.discard(proc.pid)
        if bwrap:
            _finish_inner(inner)
            _runs_since_sweep += 1
            if inner is None or _runs_since_sweep >= 100:
                _runs_since_sweep = 0
                _sweep_orphans()
    duration = time.monotonic() - start
    rc = proc.returncode
    exit_code: int | None = rc
    sig: int | None = None
    if timed_out:
        exit_code, sig = None, signal.SIGKILL.value
    elif rc is None:
        exit_code = None
    elif rc < 0:
        exit_code, sig = None, -rc
    elif bwrap and 128 < rc < 128 + 65:
        exit_code, sig = None, rc - 128
    out, err = (caps[fd] for fd in caps)
    return RunResult(
        exit_code=exit_code,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        output_truncated=out.truncated or err.truncated,
        duration_s=duration,
        signal=sig,
    )


# --------------------------------------------------------------------------------------
# ShellSession
# --------------------------------------------------------------------------------------


def _shell_encode(command: str) -> bytes:
    """The line that runs ``command`` in a session.

    The command travels as an ANSI-C quoted string for ``eval``: printable ASCII as is,
    everything else (newlines, control characters, non-ASCII bytes) as ``\\xHH``, so the
    tty's line discipline sees no special characters and bash runs the whole command as
    one unit (one prompt, one exit status) even when it spans several lines. Pieces of at
    most 1000 characters are joined by backslash-newline continuations, which keeps every
    physical line far below the tty's 4096-byte canonical line limit.
    """
    toks = []
    for b in command.encode("utf-8", errors="surrogateescape"):
        if b == 0x27:
            toks.append("\\'")
        elif b == 0x5C:
            toks.append("\\\\")
        elif 0x20 <= b < 0x7F:
            toks.append(chr(b))
        else:
            toks.append(f"\\x{b:02x}")
    pieces, cur, n = [], [], 0
    for t in toks:
        if n + len(t) > 1000:
            pieces.append("".join(cur))
            cur, n = [], 0
        cur.append(t)
        n += len(t)
    pieces.append("".join(cur))
    body = "\\\n".join(f"$'{p}'" for p in pieces)
    return f"eval -- {body}\n".encode("ascii")


# The prompt is printed by PROMPT_COMMAND, not PS1: after an eval that hits EOF inside a
# quote, bash reuses the previous PS1 expansion (stale $?), while PROMPT_COMMAND runs
# afresh before every prompt (and bash keeps $? across it). It numbers the prompts, so a
# late prompt of an earlier line (after Ctrl-C) cannot end a later command.
_PROMPT_COMMAND = '__jrl_r=$?; __jrl_n=$((__jrl_n+1)); printf "\\n__jrl_%s_%s_%s> " "{token}" "$__jrl_n" "$__jrl_r"'
# Sent once when a session starts: the prompt settings came in through the environment;
# stop exporting them to the commands' processes.
_SHELL_SETUP = b"export -n PS1 PS2 PROMPT_COMMAND; unset HISTFILE; set +H +o history\n"


class _PromptCollector:
    """One command's terminal output up to its prompt, keeping the first ``cap`` bytes.

    The prompt that ends the command is the first one numbered ``first`` or later; the
    text drops any other (late) prompts.
    """

    TAIL = 256

    def __init__(self, regex: re.Pattern[bytes], cap: int, first: int) -> None:
        self.re = regex
        self.cap = cap
        self.first = first
        self.number = 0  # the matched prompt's number
        self.kept = bytearray()
        self.pos = 0  # bytes seen so far
        self.tail = b""
        self.end: int | None = None  # stream offset where the prompt starts
        self.exit_code: int | None = None
        self.leftover = b""

    def add_prefix(self, data: bytes) -> None:
        """Output that precedes the command (not searched for the prompt)."""
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        self.pos += len(data)

    def feed(self, data: bytes) -> bool:
        window = self.tail + data
        base = self.pos - len(self.tail)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        self.pos += len(data)
        for m in self.re.finditer(window):
            if int(m.group(1)) >= self.first:
                self.end = base + m.start()
                self.number = int(m.group(1))
                self.exit_code = int(m.group(2))
                self.leftover = window[m.end():]
                return True
        self.tail = window[-self.TAIL:]
        return False

    @property
    def total(self) -> int:
        return self.end if self.end is not None else self.pos

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        kept = self.re.sub(b"", bytes(self.kept[:min(self.total, self.cap)]))
        return _with_marker(kept, self.total, self.cap, crlf=True)


class ShellSession:
    """A persistent ``bash`` inside a sandbox, driven through a pty with pexpect.

    Each :meth:`run` sends one command (as one ``eval`` line, see :func:`_shell_encode`)
    and reads until a prompt that carries a random per-session token, a prompt number and
    ``$?``; cwd, variables, functions and background jobs persist. Because commands run
    through ``eval``, ``set -e`` also fires when the command's last status is non-zero in
    a context that bash otherwise exempts (``set -e; ! true`` ends the shell); a shell that
    exits makes the session dead, like a closed terminal. On a timeout the
    session sends Ctrl-C (then, if the prompt does not come back, SIGKILLs the
    terminal's foreground process group) and reports ``timed_out=True``; if the prompt
    still does not come back the session is marked dead and the next call raises
    :class:`ShellSessionError`. :meth:`close` kills everything the session started.

    Unlike :meth:`Sandbox.run`, bash keeps the pty as its controlling terminal (no
    ``--new-session``) so job control and Ctrl-C work; the pty belongs to this session
    alone, so TIOCSTI can only inject input into the sandbox's own shell. Output that
    the code prints imitating the next prompt (the format is readable from
    ``$PROMPT_COMMAND``) ends the current command early; that only garbles the sandbox's
    own transcript. Commands that replace ``PROMPT_COMMAND`` or ``exec`` another program
    lose the prompt: the command then times out and the session is recovered or dead.
    Sessions are forked from one long-lived helper thread (the main thread when created
    there): bwrap's ``--die-with-parent`` fires when the forking *thread* exits, and a
    session usually outlives the thread-pool or actor thread that created it.
    Limits: rlimits apply to the session's processes; ``cpu_seconds`` counts per process,
    including bash itself (shell-builtin busy loops count against bash), so a session
    that burns it dies; ``output_bytes`` caps each command's output.
    """

    def __init__(self, work_dir: str | None = None, limits: Limits = Limits(), mode: str = "bwrap", *,
                 ro_binds: Sequence[str] = (), startup_timeout: float = 10.0) -> None:
        import pexpect  # deferred: only sessions need it

        self._pexpect = pexpect
        self.limits = limits
        self.sandbox = Sandbox(work_dir, limits, mode, ro_binds=ro_binds)
        self.mode = mode
        self._closed = False
        self._dead: str | None = None
        self._inner: int | None = None
        self._child = None
        self._leftover = b""
        token = secrets.token_hex(8)
        self._next = 1  # number of the prompt that will end the next line sent
        self._prompt_re = re.compile(rb"\r?\n__jrl_" + token.encode() + rb"_(\d+)_(\d+)> ")
        env = {"PS1": "", "PS2": "", "PROMPT_COMMAND": _PROMPT_COMMAND.replace("{token}", token),
               "TERM": "dumb", "HISTFILE": ""}
        argv = ["/bin/bash", "--norc", "--noprofile", "--noediting", "+H", "-i"]
        info_r = info_w = None
        try:
            _ensure_subreaper()
            if mode == "bwrap":
                info_r, info_w = os.pipe()
                os.set_inheritable(info_w, True)
            cmd, launch_env, cwd, preexec = self.sandbox._launch(argv, env, limits, info_w, new_session=False)
            pass_fds = (info_w,) if info_w is not None else ()

            def spawn():
                with _registry_lock:
                    child = _make_spawn(cmd[0], cmd[1:], env=launch_env, cwd=cwd, echo=False, encoding=None,
                                        use_poll=True, preexec_fn=preexec, dimensions=(24, 200), pass_fds=pass_fds)
                    _live_launchers.add(child.pid)
                return child

            # bwrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that
            # forked bwrap exits. Sessions outlive the call that creates them (thread pools, Ray
            # actor threads), so they are forked from one long-lived thread.
            self._child = _spawner_call(spawn)
            self._child.delaybeforesend = None
            self._child.delayafterclose = 0
            self._child.delayafterterminate = 0
            self._child.ptyproc.delayafterclose = 0
            self._child.ptyproc.delayafterterminate = 0
            if info_w is not None:
                os.close(info_w)
                info_w = None
            deadline = time.monotonic() + startup_timeout
            col = _PromptCollector(self._prompt_re, limits.output_bytes, 1)
            if self._collect(col, deadline) != "prompt":
                raise ShellSessionError(f"the sandboxed shell did not start: {col.text()!r}")
            if info_r is not None:
                self._inner = _read_info(info_r, deadline)
            self._shell_pgrp = os.tcgetpgrp(self._child.child_fd)
            self._child.send(_SHELL_SETUP)
            col = _PromptCollector(self._prompt_re, limits.output_bytes, self._next)
            if self._collect(col, deadline) != "prompt" or col.exit_code != 0 or col.total:
                raise ShellSessionError(f"the sandboxed shell did not start: {col.text()!r}")
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (info_r, info_w):
                if fd is not None:
                    os.close(fd)

    @property
    def work_dir(self) -> str:
        return self.sandbox.work_dir

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        self.sandbox.write_files(files)

    def read_file(self, path: str, max_bytes: int | None = None) -> str:
        return self.sandbox.read_file(path, max_bytes)

    @property
    def alive(self) -> bool:
        return not self._closed and self._dead is None

    def _collect(self, col: _PromptCollector, deadline: float) -> str:
        """Read into ``col`` until the prompt ("prompt"), EOF ("eof") or ``deadline`` ("timeout")."""
        pexpect = self._pexpect
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            try:
                data = self._child.read_nonblocking(_READ_CHUNK, timeout=remaining)
            except pexpect.TIMEOUT:
                return "timeout"
            except pexpect.EOF:
                return "eof"
            if col.feed(data):
                self._leftover = col.leftover
                self._next = col.number + 1
                return "prompt"

    def run(self, command: str, timeout: float = 10.0) -> ShellResult:
        """Run ``command`` (any bash, multi-line allowed) and return its output and exit status."""
        if self._closed:
            raise ShellSessionError("this ShellSession is closed")
        if self._dead is not None:
            raise ShellSessionError(f"this ShellSession is dead ({self._dead}); start a new ShellSession")
        pexpect = self._pexpect
        # Output that background jobs printed since the last prompt opens this command's output.
        before, self._leftover = bytearray(self._leftover), b""
        for _ in range(64):
            try:
                before += self._child.read_nonblocking(_READ_CHUNK, timeout=0)
            except pexpect.TIMEOUT:
                break
            except pexpect.EOF:
                col = _PromptCollector(self._prompt_re, self.limits.output_bytes, self._next)
                col.add_prefix(bytes(before))
                return self._on_eof(col)
        col = _PromptCollector(self._prompt_re, self.limits.output_bytes, self._next)
        col.add_prefix(bytes(before))
        try:
            self._child.send(_shell_encode(command))
        except OSError as exc:
            self._dead = f"cannot write to the shell: {exc}"
            self._terminate()
            raise ShellSessionError(f"this ShellSession is dead ({self._dead})") from exc
        state = self._collect(col, time.monotonic() + timeout)
        if state == "prompt":
            return ShellResult(col.text(), col.exit_code, False, col.truncated)
        if state == "eof":
            return self._on_eof(col)
        # Timed out: Ctrl-C, then SIGKILL the foreground job, then give up on the session.
        try:
            self._child.sendintr()
        except OSError:
            pass
        state = self._collect(col, time.monotonic() + 1.0)
        if state == "timeout" and self._kill_foreground():
            state = self._collect(col, time.monotonic() + 2.0)
        if state == "prompt":
            return ShellResult(col.text(), None, True, col.truncated)
        if state == "eof":
            res = self._on_eof(col)
            return ShellResult(res.output, None, True, res.output_truncated)
        self._dead = f"a command timed out after {timeout}s and the prompt did not come back after Ctrl-C"
        self._terminate()
        return ShellResult(col.text(), None, True, col.truncated)

    def _kill_foreground(self) -> bool:
        """SIGKILL the terminal's foreground job if it is not the shell itself."""
        try:
            fg = os.tcgetpgrp(self._child.child_fd)
        except OSError:
            return False
        if fg <= 0 or fg in (self._shell_pgrp, self._child.pid, os.getpgrp()):
            return False
        if self.mode == "bwrap":
            try:
                expected = SANDBOX_UID if os.geteuid() == 0 else os.getuid()
                if os.stat(f"/proc/{fg}").st_uid != expected:
                    return False
            except OSError:
                return False
        _killpg(fg)
        return True

    def _on_eof(self, col: _PromptCollector) -> ShellResult:
        """The terminal closed: the shell exited (or closed its terminal). The session is dead."""
        deadline = time.monotonic() + 1.0
        alive = True
        while time.monotonic() < deadline:
            try:
                alive = self._child.isalive()  # reaps the launcher once it has exited
            except Exception:  # noqa: BLE001 - ptyprocess errors when the child is gone already
                alive = False
            if not alive:
                break
            time.sleep(0.01)
        status = None if alive else self._child.exitstatus
        shown = status if status is not None else (self._child.signalstatus if not alive else "unknown")
        self._dead = f"the shell exited (status {shown})" if not alive else "the shell closed its terminal"
        self._terminate()
        return ShellResult(col.text(), status, False, col.truncated)

    def _terminate(self) -> None:
        """Kill every process of the session and reap them; keeps the work dir."""
        child = self._child
        if child is None:
            return
        _kill_pidfd(self._inner)
        ptyproc = getattr(child, "ptyproc", None)
        if ptyproc is not None and not ptyproc.terminated:
            if self.mode == "none":
                _kill_session_members(child.pid)
            _killpg(child.pid)
            try:
                ptyproc.wait()
            except Exception:  # noqa: BLE001
                pass
        try:
            child.close(force=True)
        except Exception:  # noqa: BLE001
            pass
        with _registry_lock:
            _live_launchers.discard(child.pid)
        if self._inner is not None:
            _finish_inner(self._inner)
            self._inner = None
        self._child = None
        if self._dead is None:
            self._dead = "terminated"

    def close(self) -> None:
        """Kill everything the session started (background daemons included), remove its temp dir."""
        if self._closed:
            return
        self._closed = True
        try:
            self._terminate()
        finally:
            if hasattr(self, "sandbox"):
                self.sandbox.close()

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_info(fd: int, deadline: float) -> int | None:
    buf = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                return None
            data = os.read(fd, _READ_CHUNK)
            if not data:
                break
            buf += data
            try:
                return _open_inner(json.loads(buf))
            except ValueError:
                continue
    finally:
        sel.close()
    try:
        return _open_inner(json.loads(buf))
    except ValueError:
        return None


def _kill_session_members(sid: int) -> None:
    """SIGKILL processes in session ``sid`` (mode "none": bash's jobs live in their own groups)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid and int(name) != os.getpid():
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass


def _spawn_class():
    import pexpect
    import ptyprocess

    class Spawn(pexpect.spawn):
        """pexpect.spawn that can pass extra fds (bwrap's --info-fd) to the child."""

        def __init__(self, *args: Any, pass_fds: Sequence[int] = (), **kwargs: Any) -> None:
            self._pass_fds = tuple(pass_fds)
            super().__init__(*args, **kwargs)

        def _spawnpty(self, args, **kwargs):
            return ptyprocess.PtyProcess.spawn(args, pass_fds=self._pass_fds, **kwargs)

    return Spawn


def _make_spawn(*args: Any, **kwargs: Any):
    global _SPAWN_CLS
    if _SPAWN_CLS is None:
        _SPAWN_CLS = _spawn_class()
    return _SPAWN_CLS(*args, **kwargs)


_SPAWN_CLS = None
_spawner_lock = threading.Lock()
_spawner: Any = None


def _spawner_call(fn):
    """Run ``fn`` on the module's long-lived spawner thread and return its result."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return fn()  # the main thread lives as long as the process
    with _spawner_lock:
        if _spawner is None:
            from concurrent.futures import ThreadPoolExecutor

            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jointrl-sandbox-spawner")
        pool = _spawner
    return pool.submit(fn).result()
