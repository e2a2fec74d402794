"""Python stack dumps of a run's processes, for the post-mortem of a hung or dead call (stdlib only).

Each actor process of a run calls :func:`register` as it starts (``rollout.pool.RolloutWorker``,
``rewards.service.RewardScorer``; the learners through ``rl.driver.actors.learners.LearnerGroup.ready``):
faulthandler then writes every thread's stack into ``<stacks dir>/<name>_pid<pid>.txt`` on ``SIGUSR1``.
faulthandler's handler is C code that needs no GIL, so a process stuck in a collective, in C code or
in a deadlock still answers. The file is the registration: its first line names the host, the pid
and the process's start time, so :func:`dump_registered` signals only live processes of this host
that set the handler up (``SIGUSR1``'s default action would kill any other), never a reused pid.

The stacks dir comes from ``JOINTRL_STACKS_DIR`` (set by the Ray runtime for every actor of a
run); without it :func:`register` does nothing (in-process use: ``jointrl score``, the local runtime).
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import re
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import IO, Iterator

__all__ = ["STACKS_ENV", "StackDumps", "register", "child_stacks", "dump_registered", "dump_self", "stamp"]

STACKS_ENV = "JOINTRL_STACKS_DIR"
CHILD_ENV = "JOINTRL_STACKS_CHILD"  # read by envs/stackhook/sitecustomize.py in a spawned child
_HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stackhook")
_HEAD = re.compile(r"# jointrl stacks: host (\S+) pid (\d+) start (\d+)")
_NAME = re.compile(r"[A-Za-z0-9_.-]+_pid\d+\.txt")
_OPEN: list[IO[str]] = []  # the registered file, kept open for faulthandler for the process's life


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, ``/proc/<pid>/stat``); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def register(name: str, stacks_dir: str | None = None) -> str | None:
    """In this process: ``SIGUSR1`` appends every thread's Python stack to ``<stacks_dir>/<name>_pid<pid>.txt``
    (``stacks_dir`` default: ``$JOINTRL_STACKS_DIR``; neither: nothing is set up, None). Returns the file's path.

    The file appears under its final name only once the handler is set (written as ``.tmp``, then
    renamed), so a dumper never signals a process that would die of ``SIGUSR1``. Registering again
    (a second name) moves the handler to the new file."""
    d = stacks_dir or os.environ.get(STACKS_ENV)
    if not d:
        return None
    pid = os.getpid()
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}_pid{pid}.txt")
    f = open(path + ".tmp", "a")  # noqa: SIM115 - kept open for faulthandler for the process's life
    f.write(f"# jointrl stacks: host {socket.gethostname()} pid {pid} start {_start_time(pid) or 0} ({name})\n")
    f.flush()
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
    os.replace(path + ".tmp", path)
    for old in _OPEN:
        old.close()
    _OPEN[:] = [f]
    return path


@contextlib.contextmanager
def child_stacks(name: str) -> Iterator[None]:
    """While inside: every Python process this one starts (fork+exec or ``multiprocessing`` spawn, e.g. vLLM's
    engine core) registers its own stack dump as ``<name>.<this pid's file stem>_pid<its pid>.txt`` as it starts
    (``envs/stackhook/sitecustomize.py``, put first on ``PYTHONPATH``). Only where this process registered
    (a run's actor); the environment is restored after, so later children (env sandboxes) get nothing."""
    if not _OPEN:
        yield
        return
    stem = os.path.basename(_OPEN[0].name).removesuffix(".txt.tmp").removesuffix(".txt")
    old = {k: os.environ.get(k) for k in (CHILD_ENV, STACKS_ENV, "PYTHONPATH")}
    os.environ[CHILD_ENV] = f"{name}.{stem}"
    os.environ[STACKS_ENV] = os.path.dirname(_OPEN[0].name)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_HOOK_DIR, old["PYTHONPATH"]) if p)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stamp(why: str) -> str:
    """The line that heads one dump in each file: when, and why (the failure that caused it)."""
    return f"\n==== {datetime.datetime.now().isoformat(timespec='seconds')} {why}\n"


def dump_self(path: str, why: str) -> None:
    """This process's own stacks (every thread), appended to ``path`` under :func:`stamp` ``(why)``."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as f:
        f.write(stamp(why))
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)


def _registered(stacks_dir: str) -> list[tuple[str, int]]:
    """(file name, pid) of every process registered in ``stacks_dir`` that is alive on this host (same
    start time as registered: a reused pid is not it); never this process. The file of a process of this
    host that is gone and never dumped (only its registration line) is removed."""
    host, found = socket.gethostname(), []
    for name in sorted(os.listdir(stacks_dir)):
        if not _NAME.fullmatch(name):
            continue
        try:
            with open(os.path.join(stacks_dir, name)) as f:
                m, rest = _HEAD.match(f.readline()), f.read(1)
        except OSError:
            continue
        if m is None or m[1] != host:
            continue
        pid, start = int(m[2]), int(m[3])
        if pid != os.getpid() and start and _start_time(pid) == start:
            found.append((name, pid))
        elif not rest and _start_time(pid) != start:  # gone without ever dumping (a short-lived child): tidy
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(stacks_dir, name))
    return found


@dataclass(frozen=True)
class StackDumps:
    """What :func:`dump_registered` collected on one host: ``files``, each signalled process's stack file
    (name -> text: a remote node's, shipped to the driver), and ``silent``, the names that wrote nothing in time."""

    files: dict[str, str] = field(default_factory=dict)
    silent: list[str] = field(default_factory=list)


def dump_registered(stacks_dir: str, why: str, wait_s: float = 3.0) -> StackDumps:
    """Every live process of this host registered in ``stacks_dir`` (:func:`register`): :func:`stamp` ``(why)``
    appended to its file, then ``SIGUSR1``, then up to ``wait_s`` for each file to grow (the handler writes
    at once, even in a stuck process). Returns the texts of the files signalled and the names of those that
    wrote nothing in time (:class:`StackDumps`).
    Never raises for one process: a file or a signal that fails skips that process."""
    if not os.path.isdir(stacks_dir):
        return StackDumps()
    sent: dict[str, int] = {}
    for name, pid in _registered(stacks_dir):
        path = os.path.join(stacks_dir, name)
        try:
            with open(path, "a") as f:
                f.write(stamp(why))
            sent[name] = os.path.getsize(path)
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            sent.pop(name, None)
    deadline, waiting = time.monotonic() + wait_s, set(sent)
    while waiting and time.monotonic() < deadline:
        time.sleep(0.05)
        waiting = {n for n in waiting if _size(os.path.join(stacks_dir, n)) <= sent[n]}
    time.sleep(0.1)  # a dump that began is a few writes: let it finish
    files = {}
    for name in sent:
        try:
            with open(os.path.join(stacks_dir, name), errors="replace") as f:
                files[name] = f.read()
        except OSError:
            continue
    return StackDumps(files=files, silent=sorted(waiting))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
