"""What a vLLM engine's processes hold in /dev/shm, and unlinking it once no process uses it (Linux ``/proc``).

vLLM's engine core makes shared-memory segments (its executor's message queue, ~160 MiB on CPU, and the named
semaphores of its ``multiprocessing`` locks) and unlinks them when it exits cleanly. An engine core that is
SIGKILLed (its worker died, or vLLM's own shutdown force-killed a core that overran its grace period) unlinks
nothing, and /dev/shm is memory. The rollout worker records the segments at start (``shm_segments``) and whoever
outlives the engine unlinks them once nothing maps or holds them (``unlink_unmapped``): the engine itself after its
shutdown, the pool on the node of a dead worker, the driver's recovery after a killed run. Standard library only.
"""

from __future__ import annotations

import os
import time

from rollout.reaper import descendants

__all__ = ["ipc_held", "ipc_segments", "shm_segments", "unlink_unmapped"]


def shm_segments(pid: int, own: bool = False) -> list[str]:
    """/dev/shm files mapped by the descendants of process ``pid`` (and by ``pid`` itself with ``own``; Linux
    /proc; [] elsewhere).

    Matched by name and by inode: a POSIX named semaphore (glibc's ``sem_open``, e.g. a ``multiprocessing``
    lock of a spawned engine) is mapped under the temporary name it was made as (``/dev/shm/sem.XXXXXX
    (deleted)``) and then linked to its real name (``sem.mp-...``), so only its inode ties it to the process."""
    names, inodes = _shm_maps(set(descendants(pid)) | ({pid} if own else set()))
    return sorted(names | {p for p, ino in _shm_files() if ino in inodes})


def ipc_segments(paths: list[str]) -> list[str]:
    """Those of ``paths`` that Python's ``multiprocessing`` makes directly in /dev/shm for a process group's IPC
    (``psm_*`` shared memory, ``sem.*`` named semaphores): what an engine's own shutdown may unlink. A model file or
    a weights export that happens to sit under /dev/shm and that the engine mapped at start is not one of them."""
    return [p for p in paths if os.path.dirname(p) == "/dev/shm" and os.path.basename(p).startswith(("psm_", "sem."))]


def ipc_held(pids: list[int]) -> list[str]:
    """The IPC segments (``ipc_segments``) that processes ``pids`` and their descendants map."""
    return ipc_segments(sorted({f for pid in pids for f in shm_segments(pid, own=True)}))


def _shm_maps(pids: set[int] | None = None) -> tuple[set[str], set[int]]:
    """The /dev/shm paths (real names) and inodes that processes ``pids`` (None: every process) map."""
    names: set[str] = set()
    inodes: set[int] = set()
    for d in os.listdir("/proc") if pids is None else map(str, pids):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                        path = parts[5].rstrip("\n")
                        inodes.add(int(parts[4]))
                        if not path.endswith(" (deleted)"):
                            names.add(path)
        except (OSError, ValueError):
            continue
    return names, inodes


def _shm_files() -> list[tuple[str, int]]:
    """(path, inode) of each file directly in /dev/shm."""
    try:
        return [(e.path, e.inode()) for e in os.scandir("/dev/shm") if e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def unlink_unmapped(paths: list[str], wait_s: float = 0.0) -> list[str]:
    """Unlink each of ``paths`` that no live process on this node maps or holds open; return those removed.

    ``wait_s``: how long to wait for processes still using some of them to exit (the engine
    processes of a killed run die on their own, seconds after their parent).
    """
    deadline = time.monotonic() + wait_s
    removed: list[str] = []
    todo = {p for p in paths if os.path.exists(p)}
    while todo:
        busy = _in_use(todo)
        for p in sorted(todo - busy):
            try:
                os.unlink(p)
                removed.append(p)
            except OSError:
                pass
        todo = {p for p in busy if os.path.exists(p)}
        if not todo or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return removed


def _in_use(paths: set[str]) -> set[str]:
    """Those of ``paths`` some process on this node maps (by name, or by inode: a named semaphore stays mapped
    under the temporary name it was made as, ``shm_segments``) or holds open."""
    names, inodes = _shm_maps()
    in_use = set(paths) & names
    for p in paths - in_use:
        try:
            if os.stat(p).st_ino in inodes:
                in_use.add(p)
        except OSError:
            continue
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{d}/fd"):
                try:
                    t = os.readlink(f"/proc/{d}/fd/{fd}")
                except OSError:
                    continue
                if t in paths:
                    in_use.add(t)
        except OSError:
            continue
    return in_use
