"""Per-sandbox storage: one size- and inode-capped tmpfs holding every writable place.

:class:`Storage` makes a private directory with three subdirectories, ``work`` (the work
dir), ``tmp`` (mounted at /tmp inside) and ``shm`` (at /dev/shm). When this process is
root (as in CI and on the training hosts) the directory is a fresh tmpfs mounted with
``size=`` and ``nr_inodes=`` from :class:`~envs.sandbox.config.SandboxConfig`: a sandbox
that writes more gets ENOSPC, the host disk never sees its files, and the memory it can
pin is the size cap. :meth:`Storage.full` tells whether the cap was reached (recorded as
a ``storage`` event).

What it does NOT do: without root (``mount`` needs CAP_SYS_ADMIN on the host) the
directories are plain host directories; then /tmp and /dev/shm are bwrap tmpfs capped in
size only (``--size``), the work dir is bounded by RLIMIT_FSIZE per file only, and
``capped`` is False (a warning is logged once).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import tempfile
import threading
import weakref

from envs.sandbox.base import SANDBOX_GID, SANDBOX_UID
from envs.sandbox.config import SandboxConfig

__all__ = ["Storage"]

logger = logging.getLogger("envs.sandbox")
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_libc = None
_warned = False
_live: dict[str, Storage] = {}  # work dir -> its storage, so a Sandbox over that dir finds it
_live_lock = threading.Lock()


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _mount_tmpfs(path: str, size_bytes: int, inodes: int) -> None:
    opts = f"size={size_bytes},nr_inodes={inodes},mode=0711".encode()
    if _c().mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount -t tmpfs on {path}: {os.strerror(err)}")


class Storage:
    """The writable places of one sandbox (see the module docstring)."""

    def __init__(self, parent: str, config: SandboxConfig, *, sandbox_uid: bool) -> None:
        global _warned
        self.config = config
        self.root = tempfile.mkdtemp(prefix="jointrl-sb-", dir=parent)
        self.capped = False
        if os.geteuid() == 0:
            try:
                _mount_tmpfs(self.root, config.storage_mb << 20, config.storage_inodes)
                self.capped = True
            except OSError as exc:
                if not _warned:
                    logger.warning("sandbox storage is NOT capped (%s): work dirs live on the host disk", exc)
                    _warned = True
        elif not _warned:
            logger.warning(
                "sandbox storage is NOT capped: mounting a tmpfs needs root; work dirs live on the host "
                "disk (bounded per file by RLIMIT_FSIZE only)"
            )
            _warned = True
        if os.geteuid() == 0:
            os.chmod(self.root, 0o711)  # bwrap, run as the sandbox uid, must reach root/work to bind it
        self.work, self.tmp, self.shm = (os.path.join(self.root, n) for n in ("work", "tmp", "shm"))
        try:
            for d, mode in ((self.work, 0o700), (self.tmp, 0o1777), (self.shm, 0o1777)):
                os.mkdir(d)
                os.chmod(d, mode)
                if sandbox_uid and os.geteuid() == 0:
                    os.chown(d, SANDBOX_UID, SANDBOX_GID)
        except BaseException:
            self.close()
            raise
        with _live_lock:
            _live[os.path.realpath(self.work)] = self
        self._closed = False
        # Unmounted also when the object is collected or the interpreter exits without close();
        # a process killed outright leaves its tmpfs mounted (the memory it holds stays in use).
        self._finalizer = weakref.finalize(self, _release, self.root, self.capped)

    @staticmethod
    def of(work_dir: str) -> Storage | None:
        """The live storage whose work dir is ``work_dir``, or None."""
        with _live_lock:
            return _live.get(os.path.realpath(work_dir))

    def usage(self) -> dict[str, int]:
        """Bytes and inodes used and available on the storage (its tmpfs when capped)."""
        st = os.statvfs(self.root)
        return {
            "bytes_used": (st.f_blocks - st.f_bfree) * st.f_frsize,
            "bytes_free": st.f_bavail * st.f_frsize,
            "inodes_used": st.f_files - st.f_ffree,
            "inodes_free": st.f_favail,
        }

    def full(self) -> bool:
        """True when the size or the inode cap is (nearly) reached: fewer than 64 KiB or 16 inodes left."""
        if not self.capped:
            return False
        u = self.usage()
        return u["bytes_free"] < 65536 or u["inodes_free"] < 16

    def clear_scratch(self) -> None:
        """Empty /tmp and /dev/shm (each run starts with empty ones, as a fresh tmpfs would)."""
        for d in (self.tmp, self.shm):
            _empty_dir(d)

    def close(self) -> None:
        """Unmount (lazily: nothing can hold it, every sandbox process is dead) and remove."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        with _live_lock:
            _live.pop(os.path.realpath(getattr(self, "work", "") or "/nonexistent"), None)
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        else:  # __init__ failed before the finalizer existed
            _release(self.root, self.capped)


def _release(root: str, capped: bool) -> None:
    """Unmount (lazily: every sandbox process is dead by now) and remove one storage root."""
    if capped and _c().umount2(root.encode(), _MNT_DETACH) != 0:
        logger.warning("cannot unmount sandbox storage %s: %s", root, os.strerror(ctypes.get_errno()))
    _rmtree(root)


def _onerror(func, p, _exc):  # sandboxed code may leave directories without u+rwx
    try:
        os.chmod(os.path.dirname(p), 0o700)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o700)
        func(p)
    except OSError:
        pass


def _rmtree(path: str) -> None:
    shutil.rmtree(path, onerror=_onerror)


def _empty_dir(path: str) -> None:
    """Remove everything inside ``path``, keeping ``path``; never follows symlinks."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=_onerror)
            else:
                os.unlink(entry.path)
        except OSError:
            pass
