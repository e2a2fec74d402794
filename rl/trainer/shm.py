"""Private folders in /dev/shm for exported weights, and the sweep of those a killed process left.

Weights travel from the learner to the engines through a folder in ``/dev/shm`` (memory, not
disk). Its owner removes it on every exit path it sees (``stop()``, a finalizer, interpreter
exit), but a SIGKILLed or OOM-killed process runs none of them and its folder holds its last
export (a 135M model: ~270 MB) until the host reboots. So each folder is named after the
process that made it, ``<prefix><pid namespace>-<pid>-<random>``, and making one first removes
the folders of the same prefix whose process is gone. A folder is only removed when it belongs
to this uid, was made in this PID namespace (containers sharing one /dev/shm see other pids) and
no process has its pid (a pid reused by another process keeps the folder: a leak, never a folder
removed under a live run).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

__all__ = ["make_shm_dir", "pid_alive", "sweep_dead"]


def _shm_parent() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def _pid_ns() -> str:
    """This process's PID namespace (the inode of /proc/self/ns/pid; "0" where unreadable)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists and is not a zombie (another user's process counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def sweep_dead(prefix: str, parent: str | None = None) -> list[str]:
    """Remove the folders ``<parent>/<prefix><this pid namespace>-<pid>-*`` of this uid whose process
    ``pid`` is gone; returns their paths. ``parent``: /dev/shm (else the temp dir)."""
    parent = parent or _shm_parent() or tempfile.gettempdir()
    pattern = re.compile(re.escape(f"{prefix}{_pid_ns()}-") + r"(\d+)-[^/]+")
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def make_shm_dir(prefix: str, parent: str | None = None) -> str:
    """A new private folder ``<prefix><pid namespace>-<this pid>-<random>`` in /dev/shm (else the temp dir), after
    :func:`sweep_dead` has removed those of the same prefix that killed processes left."""
    parent = parent or _shm_parent()
    sweep_dead(prefix, parent)
    return tempfile.mkdtemp(prefix=f"{prefix}{_pid_ns()}-{os.getpid()}-", dir=parent)
