"""Process bookkeeping: the child subreaper, live launchers, pidfds of sandbox PID 1s, orphan reaping."""

from __future__ import annotations

import ctypes
import logging
import os
import selectors
import signal
import threading
import time
from typing import Any

from envs.sandbox.base import _PR_SET_CHILD_SUBREAPER

logger = logging.getLogger("envs.sandbox")

# --------------------------------------------------------------------------------------
# Process bookkeeping: subreaper, live launchers, orphan reaping
# --------------------------------------------------------------------------------------

_registry_lock = threading.Lock()
_live_launchers: set[int] = set()  # pids of outer bwrap / launcher processes not yet reaped
_pending_inner: list[int] = []  # pidfds of sandbox PID 1s that did not die in time
_subreaper_done = False
_runs_since_sweep = 0
_SWEEP_EVERY = 100  # bwrap runs between two sweeps for orphaned sandbox PID 1s


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
                logger.warning(
                    "prctl(PR_SET_CHILD_SUBREAPER) failed: %s; sandbox zombies may accumulate", os.strerror(err)
                )
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


def _note_bwrap_run(sweep_now: bool) -> None:
    """Count one finished bwrap run and sweep for orphans every :data:`_SWEEP_EVERY` runs, or at once when
    ``sweep_now`` (the run's sandbox PID 1 was never opened, so only a sweep can reap it)."""
    global _runs_since_sweep
    _runs_since_sweep += 1
    if sweep_now or _runs_since_sweep >= _SWEEP_EVERY:
        _runs_since_sweep = 0
        _sweep_orphans()


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
            fields = raw[rp + 2 :].split()
            if len(fields) < 2 or raw[lp + 1 : rp] != b"bwrap" or fields[0] != b"Z" or int(fields[1]) != me:
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
