"""Per-sandbox storage: one size- and inode-capped tmpfs holding every writable place.

:class:`Storage` makes a private directory with three subdirectories, ``work`` (the work
dir), ``tmp`` (mounted at /tmp inside) and ``shm`` (at /dev/shm). When this process is
root (as in CI and on the training hosts) the directory is a fresh tmpfs mounted with
``size=`` and ``nr_inodes=`` from :class:`~envs.sandbox.config.SandboxConfig`: a sandbox
that writes more gets ENOSPC, the host disk never sees its files, and the memory it can
pin is the size cap. :meth:`Storage.full` tells whether the cap was reached (recorded as
a ``storage`` event).

Without root, the same tmpfs is mounted inside an unprivileged user + mount namespace
held by a small helper process (:class:`_NamespaceHolder`: ``unshare --user
--map-root-user --mount``, then ``mount -t tmpfs`` and a ``cat`` that waits for its stdin
to close): the caps are the same, every sandbox launch enters that namespace first
(``nsenter --user --mount --preserve-credentials``), and the harness reaches the files
through ``/proc/<holder>/root`` (:attr:`Storage.work` is then such a path; bwrap binds
:meth:`Storage.inside` of it). The namespace, and the memory its files hold, go away when
the holder's stdin closes: on :meth:`close`, and also when the harness dies outright.
Only when unprivileged user namespaces are refused (or ``unshare``/``nsenter`` are
missing) are the directories plain host directories; then /tmp and /dev/shm are bwrap
tmpfs capped in size only (``--size``), the work dir is bounded by RLIMIT_FSIZE per file
only, and ``capped`` is False (a warning naming the reason is logged once).
"""

from __future__ import annotations

import ctypes
import logging
import os
import selectors
import shutil
import subprocess
import tempfile
import threading
import weakref

from envs.sandbox.config import SandboxConfig
from envs.sandbox.files import remove_tree

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

    def __init__(self, parent: str, config: SandboxConfig, *, owner: tuple[int, int] | None) -> None:
        """``owner``: the host (uid, gid) the work, tmp and shm dirs belong to when root (the
        sandbox's leased ids, which a Sandbox later opened over this work dir shares); None: root's."""
        self.config = config
        self.owner = owner
        self.root = tempfile.mkdtemp(prefix="jointrl-sb-", dir=parent)
        self.holder: _NamespaceHolder | None = None
        self.capped = self._mount()
        view = self.holder.view if self.holder is not None else ""  # where the harness sees the files
        if os.geteuid() == 0:
            os.chmod(self.root, 0o711)  # bwrap, run as the sandbox's host uid, must reach root/work to bind it
        self.work, self.tmp, self.shm = (view + os.path.join(self.root, n) for n in ("work", "tmp", "shm"))
        try:
            for d, mode in ((self.work, 0o700), (self.tmp, 0o1777), (self.shm, 0o1777)):
                os.mkdir(d)
                os.chmod(d, mode)
                if owner is not None and os.geteuid() == 0:
                    os.chown(d, *owner)
        except BaseException:
            self.close()
            raise
        with _live_lock:
            _live[_canonical(self.work)] = self
        self._closed = False
        # Unmounted also when the object is collected or the interpreter exits without close();
        # a process killed outright leaves a root-mounted tmpfs mounted (the memory it holds stays
        # in use); a namespace-held one goes with its holder.
        self._finalizer = weakref.finalize(self, _release, self.root, self.capped, self.holder)

    def _mount(self) -> bool:
        """Mount the capped tmpfs on :attr:`root` (as root) or in a held namespace; False if neither."""
        global _warned
        size, inodes = self.config.storage_mb << 20, self.config.storage_inodes
        try:
            if os.geteuid() == 0:
                _mount_tmpfs(self.root, size, inodes)
            else:
                self.holder = _NamespaceHolder(self.root, size, inodes)
            return True
        except OSError as exc:
            if not _warned:
                logger.warning(
                    "sandbox storage is NOT capped (%s): work dirs live on the host disk (bounded per file by "
                    "RLIMIT_FSIZE only)",
                    exc,
                )
                _warned = True
            return False

    def inside(self, path: str) -> str:
        """``path`` (one of this storage's) as the launcher sees it: without the holder's /proc view."""
        if self.holder is not None and path.startswith(self.holder.view + "/"):
            return path[len(self.holder.view) :]
        return path

    def enter(self) -> list[str]:
        """The command prefix that runs a launcher where the storage is mounted (empty as root)."""
        return self.holder.enter() if self.holder is not None else []

    @staticmethod
    def of(work_dir: str) -> Storage | None:
        """The live storage whose work dir is ``work_dir``, or None."""
        with _live_lock:
            return _live.get(_canonical(work_dir))

    def usage(self) -> dict[str, int]:
        """Bytes and inodes used and available on the storage (its tmpfs when capped)."""
        st = os.statvfs(os.path.dirname(self.work))
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
            remove_tree(d, keep_root=True)  # any depth: a deep chain must not break the next run's clean-up

    def close(self) -> None:
        """Unmount (lazily: nothing can hold it, every sandbox process is dead) and remove."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        with _live_lock:
            _live.pop(_canonical(getattr(self, "work", "") or "/nonexistent"), None)
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        else:  # __init__ failed before the finalizer existed
            _release(self.root, self.capped, self.holder)


def _canonical(path: str) -> str:
    """A work dir's key: realpath, except through /proc/<pid>/root (realpath would leave the namespace)."""
    return os.path.normpath(path) if path.startswith("/proc/") else os.path.realpath(path)


class _NamespaceHolder:
    """A process holding an unprivileged user + mount namespace in which a capped tmpfs is mounted.

    ``unshare --user --map-root-user --mount`` runs ``sh``, which mounts the tmpfs on ``root``
    (visible only in the namespace), says ``ready`` and becomes ``cat``, which waits for its
    stdin to close. Raises OSError (saying why) when the namespace or the mount is refused.
    """

    _SCRIPT = 'mount -t tmpfs -o "size=$2,nr_inodes=$3,mode=0711,nosuid,nodev" tmpfs "$1" && echo ready && exec cat'

    def __init__(self, root: str, size_bytes: int, inodes: int) -> None:
        unshare, self._nsenter = shutil.which("unshare"), shutil.which("nsenter")
        if unshare is None or self._nsenter is None:
            raise OSError("storage caps without root need `unshare` and `nsenter` (util-linux)")
        argv = [unshare, "--user", "--map-root-user", "--mount", "--propagation", "private", "--"]
        argv += ["/bin/sh", "-c", self._SCRIPT, "sh", root, str(size_bytes), str(inodes)]
        self._start(argv, "cannot mount a capped tmpfs in an unprivileged user namespace", OSError)

    def _start(self, argv: list[str], failure: str, error: type[Exception], timeout: float = 10.0) -> None:
        """Start the holder ``argv``; wait for its ``ready`` line, else raise ``error`` with ``failure`` and what it said."""
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        if self._ready_line(timeout) != b"ready\n":
            self.proc.kill()
            _, err = self.proc.communicate()
            why = err.decode("utf-8", "replace").strip() or "no answer"
            raise error(f"{failure}: {why}")
        self.pid = self.proc.pid
        self.view = f"/proc/{self.pid}/root"

    def _ready_line(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return b""
        return self.proc.stdout.readline()

    def enter(self) -> list[str]:
        return [self._nsenter, f"--target={self.pid}", "--user", "--mount", "--preserve-credentials", "--"]

    def close(self) -> None:
        """End the namespace: the tmpfs and every file in it are gone once ``cat`` exits."""
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def _release(root: str, capped: bool, holder: _NamespaceHolder | None = None) -> None:
    """Unmount (lazily: every sandbox process is dead by now) and remove one storage root."""
    if holder is not None:
        holder.close()
    elif capped and _c().umount2(root.encode(), _MNT_DETACH) != 0:
        logger.warning("cannot unmount sandbox storage %s: %s", root, os.strerror(ctypes.get_errno()))
    remove_tree(root)
