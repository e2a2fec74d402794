"""Host uid leases: one host uid (and gid) per sandbox, so sandboxes never share a process count.

RLIMIT_NPROC counts the processes of a host uid. Were every sandbox to run as the same
host uid, a sandbox that forks up to its limit would make concurrent sandboxes fail to
fork (in GRPO: an episode sabotaging the other episodes of its own group). So when the
harness is root, each sandbox leases a host uid of its own from a pool
(:attr:`~envs.sandbox.config.SandboxConfig.uid_base`, ``uid_count``), used for its gid
too, and holds it until it is closed. Inside the sandbox the identity is still 65534
(bwrap's user namespace maps 65534 to the leased host uid).

A lease is an exclusive, non-blocking ``flock`` on ``/run/jointrl-uids/<uid>`` (a
root-owned directory, hidden from sandboxes like all of /run; ``/dev/shm/jointrl-uids`` where
/run cannot be written, e.g. a read-only container root): unique across every process
of the host, and released by the kernel when the holder dies, so a crash leaks nothing.
A uid is leased only while no process runs as it (a previous holder's orphans must not
share the new holder's count); otherwise the next uid of the pool is tried. Without root
there is nothing to lease: every sandbox runs as the caller's uid and they share one count.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
import weakref

from envs.sandbox.config import SandboxConfig
from envs.sandbox.reap import _count_procs

__all__ = ["LOCK_DIR", "UidLease", "UidPoolExhausted", "lease_uid"]

LOCK_DIR = "/run/jointrl-uids"
# Where /run cannot be written. Every process of a host sees the same /run, so all of them
# pick the same directory and the leases stay unique.
FALLBACK_LOCK_DIR = "/dev/shm/jointrl-uids"
_dir_lock = threading.Lock()


class UidPoolExhausted(RuntimeError):
    """Every uid of the pool is leased (or still has processes): no sandbox can start now."""


class UidLease:
    """A host uid and gid one sandbox runs as; :meth:`release` gives it back (idempotent)."""

    def __init__(self, uid: int, gid: int, fd: int | None) -> None:
        self.uid, self.gid = uid, gid
        # Released also when the lease is collected unreleased (a Sandbox never closed).
        self._finalizer = weakref.finalize(self, _unlock, fd) if fd is not None else None

    @property
    def held(self) -> bool:
        """True while this lease holds a pool uid's lock (never for a non-root caller's own uid)."""
        return self._finalizer is not None and self._finalizer.alive

    def release(self) -> None:
        """Unlock the uid's lock file, so another sandbox may lease the uid."""
        if self._finalizer is not None:
            self._finalizer()


def _unlock(fd: int) -> None:
    """Drop the lock on ``fd`` (for every process sharing its open file) and close it."""
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)

    def __repr__(self) -> str:
        return f"UidLease(uid={self.uid}, gid={self.gid}, held={self.held})"


def _lock_dir() -> str:
    """The lock directory: :data:`LOCK_DIR`, else :data:`FALLBACK_LOCK_DIR` when /run cannot be
    written; made if missing, refused unless a root-owned directory nobody else can write."""
    with _dir_lock:
        for i, path in enumerate((LOCK_DIR, FALLBACK_LOCK_DIR)):
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            except OSError:
                if i == 0:
                    continue  # /run not writable here (read-only, missing): the fallback
                raise
            _check_private(path)
            return path
    raise AssertionError("unreachable")


def _check_private(path: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise RuntimeError(
            f"{path} must be a directory owned by root and writable by root only "
            f"(mode {stat.filemode(st.st_mode)}, owner {st.st_uid}); remove it to let the sandbox remake it"
        )


def _try_lock(directory: str, uid: int) -> int | None:
    """The locked fd of ``uid``'s lock file, or None when another open file holds the lock."""
    fd = os.open(os.path.join(directory, str(uid)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise


def lease_uid(config: SandboxConfig) -> UidLease:
    """A host uid for one sandbox (see the module docstring): the lowest free one of the pool.

    Not root: the caller's own uid and gid, nothing held. Raises :class:`UidPoolExhausted`
    when every uid of the pool is locked by a live sandbox or still runs processes.
    """
    if os.geteuid() != 0:
        return UidLease(os.getuid(), os.getgid(), None)
    directory = _lock_dir()
    busy = 0
    for uid in range(config.uid_base, config.uid_base + config.uid_count):
        fd = _try_lock(directory, uid)
        if fd is None:
            continue
        if _count_procs(uid) == 0:
            return UidLease(uid, uid, fd)
        busy += 1  # a previous holder's orphans still run as this uid
        _unlock(fd)
    raise UidPoolExhausted(
        f"no free sandbox uid in [{config.uid_base}, {config.uid_base + config.uid_count}) "
        f"(sandbox_config.uid_base/uid_count): all {config.uid_count} are leased by live sandboxes "
        f"(locks in {directory}) or still run processes ({busy}); close sandboxes or enlarge uid_count"
    )
