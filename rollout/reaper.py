"""Kill a vLLM engine's core processes once the process that started them is gone.

vLLM runs its engine core (and, with tensor parallelism on GPU, its workers) in child
processes that wait on sockets for the next request. When their parent, the rollout
worker, is SIGKILLed (Ray does that to the actors of a driver that died, and ``ray.kill``
does it to one actor), nothing tells them: they live on as orphans holding their memory
(the model's weights and KV cache: RAM on CPU; on GPU, the GPU's memory the next run needs).

:func:`start_reaper` starts a small process beside them. It polls its parent; once the
parent is gone it SIGKILLs the recorded processes and their descendants, each only while
its start time still matches the recorded one (pids are reused), and exits. It also exits
once every recorded process has exited (a normal shutdown). It is not a supervisor: it
never restarts anything, and it runs only on Linux (it reads ``/proc``); elsewhere
:func:`start_reaper` starts nothing. Standard library only: it runs as a script
(``python reaper.py PARENT PID:START ...``), without the package on its path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

__all__ = ["start_reaper", "start_time", "stamped", "descendants", "reap"]

POLL_S = 0.5


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None
    when it does not exist or is a zombie (a zombie holds no memory; its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state); field 22 (starttime) is fields[19].
    return None if fields[0] in ("Z", "X") else int(fields[19])


def stamped(pids: list[int]) -> list[tuple[int, int]]:
    """``(pid, start time)`` of each of ``pids`` still running: what :func:`reap` takes, safe against reuse."""
    return [(p, s) for p in pids if (s := start_time(p)) is not None]


def _parents() -> dict[int, int]:
    """Each live process's parent pid, from ``/proc`` ({} where there is none: not Linux)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    out = {}
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    out[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, their children, ...), read from ``/proc`` ([] elsewhere)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def reap(targets: list[tuple[int, int]]) -> list[int]:
    """SIGKILL each ``(pid, start time)`` still running with that start time, and its descendants
    (read before any kill, so that none is reparented away first). Returns the pids killed."""
    victims = []
    for pid, start in targets:
        if start_time(pid) == start:
            victims += [(d, start_time(d)) for d in descendants(pid)] + [(pid, start)]
    killed = []
    for pid, start in victims:
        if start is not None and start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def _watch(parent: int, targets: list[tuple[int, int]]) -> None:
    while any(start_time(pid) == start for pid, start in targets):
        if os.getppid() != parent:  # reparented: the process that started us is gone
            reap(targets)
            return
        time.sleep(POLL_S)


def start_reaper(pids: list[int]) -> subprocess.Popen | None:
    """Start the reaper of ``pids`` (children of this process); None where there is nothing to
    watch or no ``/proc``. The caller ends it (``terminate``) after shutting the processes down
    itself; otherwise it exits on its own once they are gone."""
    targets = stamped(pids)
    if not targets or not os.path.isdir("/proc/self"):
        return None
    args = [sys.executable, os.path.abspath(__file__), str(os.getpid())] + [f"{p}:{s}" for p, s in targets]
    # Its own session: a signal sent to this process's group (a terminal's ^C, a group kill)
    # must not take the reaper along before it has done its one job.
    return subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True
    )


if __name__ == "__main__":
    _parent = int(sys.argv[1])
    _watch(_parent, [(int(p), int(s)) for p, s in (a.split(":") for a in sys.argv[2:])])
