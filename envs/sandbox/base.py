"""Constants, errors and result types shared by every part of :mod:`envs.sandbox`."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

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
    memory_mb: int = 1024  # RLIMIT_AS per process; also the /tmp and /dev/shm size when storage is not capped (no root)
    file_size_mb: int = 64  # RLIMIT_FSIZE: the largest file a process may write
    processes: int = 64  # RLIMIT_NPROC budget (see the module docstring)
    open_files: int = 256  # RLIMIT_NOFILE
    wall_seconds: float = 10.0  # wall-clock timeout of Sandbox.run
    output_bytes: int = 1_000_000  # stdout and stderr are each capped at this many bytes

    def __post_init__(self) -> None:
        for name in (
            "cpu_seconds",
            "memory_mb",
            "file_size_mb",
            "processes",
            "open_files",
            "wall_seconds",
            "output_bytes",
        ):
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
    stdout_bytes: int = 0  # bytes the program wrote to stdout (kept or not)
    stderr_bytes: int = 0
    events: tuple[str, ...] = ()  # sandbox events of this run (see envs.sandbox.events)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


# bwrap bind-mounts the host root recursively; when another sandbox's storage tmpfs is
# mounted or unmounted on the host at that moment, bwrap's read-only remount of the vanished
# submount fails before the program starts. Such a launch is retried (see setup_race), after a jittered,
# doubling pause: sandboxes closing together (their work dirs unmounted and removed one after another) can
# otherwise make several immediate retries lose the same race.
SETUP_RACE_RETRIES = 5
SETUP_RACE_PAUSE_S = 0.02


_RACE_MESSAGES = ("Can't bind mount", "Unable to apply mount flags", "Can't remount")


def bwrap_mount_race(error_text: str) -> bool:
    """Whether a launch's error output is bwrap failing to set up its mounts (a mount race)."""
    err = error_text[:2000]
    return err.startswith("bwrap: ") and any(m in err for m in _RACE_MESSAGES)


def setup_race(res: RunResult) -> bool:
    """Whether ``res`` is bwrap failing to set up the mounts (a race with a concurrent mount)."""
    return res.exit_code == 1 and bwrap_mount_race(res.stderr)


def retry_setup_race(attempt: Callable[[], T], raced: Callable[[T], bool]) -> T:
    """``attempt()``, made again while ``raced(result)`` says it lost a mount race; at most
    :data:`SETUP_RACE_RETRIES` attempts, the last one's result is returned either way.
    Every launcher (``Sandbox.run``, the code verdict's pair, ``ShellSession`` start) retries
    through here, so they agree on what a race is and how often it is retried. Before retry ``i`` (from 0)
    it sleeps ``SETUP_RACE_PAUSE_S * 2**i`` times a random factor in [0.5, 1.5) (at most about 0.5 s in all),
    so that launchers racing the same mounts do not retry in step."""
    for i in range(SETUP_RACE_RETRIES - 1):
        res = attempt()
        if not raced(res):
            return res
        time.sleep(SETUP_RACE_PAUSE_S * 2**i * (0.5 + random.random()))
    return attempt()


@dataclass(frozen=True)
class ShellResult:
    """The outcome of :meth:`ShellSession.run`. ``exit_code`` is None after a timeout."""

    output: str
    exit_code: int | None
    timed_out: bool
    output_truncated: bool = False


@dataclass(frozen=True)
class _Tools:
    bwrap: str
    setpriv: str | None  # needed when the launcher is root
    prlimit: str | None  # optional; preexec_fn otherwise
    has_size: bool  # bwrap --size (tmpfs size caps)
    has_disable_userns: bool
