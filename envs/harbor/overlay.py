"""A private copy-on-write view of an image's root filesystem, for one Harbor episode.

The image's tree (:attr:`BuiltImage.root`, shared by every episode and never written) is
the lower layer of a kernel overlayfs; the episode's writes land in an upper directory on
disk, in the episode's own directory. Nothing of the image is copied.

The overlay is mounted in a private mount namespace held by a small helper process (the
holder, like :class:`envs.sandbox.storage._NamespaceHolder`): nothing is mounted on the
host, the mount goes away with the holder (also when the harness is killed outright), and
every sandbox launch of the episode enters that namespace first (``nsenter``). The harness
reaches the merged view through ``/proc/<holder>/root`` (:attr:`Overlay.view`) and the
upper directory directly (it is a plain host directory).

Identity: the episode's processes run as the episode's host uid (a leased uid as root,
the caller's otherwise), and the image's files must look owned by the task's user to
them, as in a container. As root the holder gives the overlay an *idmapped* lower layer
(``open_tree`` + ``mount_setattr(MOUNT_ATTR_IDMAP)``): the image's on-disk owner of the
task's user appears as the episode's host uid, which bwrap maps to the task's user inside.
Files of other on-disk owners appear as the overflow uid (read-only to the agent). Without
root the holder is an unprivileged user namespace mapping root to the caller (the image
then belongs to the caller, as an unprivileged build leaves it) and the overlay is mounted
there with ``userxattr``.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

from envs.sandbox.storage import _NamespaceHolder

__all__ = ["IdMap", "Overlay", "OverlayError", "check_overlay"]


class OverlayError(RuntimeError):
    """The copy-on-write view could not be mounted; the message says what the kernel or tool said."""


@dataclass(frozen=True)
class IdMap:
    """Which on-disk owner (uid, gid) of the image appears as which host (uid, gid) in the view."""

    disk_uid: int
    host_uid: int
    disk_gid: int
    host_gid: int


# Runs in the holder (``python -I -S``): a private mount namespace (and, without root, a user
# namespace mapping root to the caller), the idmapped lower layer when asked, the overlay, then
# "ready" and a read of stdin that returns when the harness closes it (or dies).
_HOLDER = r"""
import ctypes, os, sys
mode, lower, upper, work, merged, idlower = sys.argv[1:7]
ids = [int(x) for x in sys.argv[7:11]] if len(sys.argv) > 7 else None
libc = ctypes.CDLL(None, use_errno=True)
def fail(what):
    e = ctypes.get_errno(); sys.stderr.write(f"{what}: {os.strerror(e)}\n"); sys.exit(1)
def write(path, text):
    with open(path, "w") as f: f.write(text)
NEWNS, NEWUSER = 0x20000, 0x10000000
if mode == "user":
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(NEWUSER | NEWNS) != 0: fail("unshare(user, mount)")
    write("/proc/self/setgroups", "deny"); write("/proc/self/uid_map", f"0 {uid} 1"); write("/proc/self/gid_map", f"0 {gid} 1")
elif libc.unshare(NEWNS) != 0:
    fail("unshare(mount)")
if libc.mount(None, b"/", None, 0x4000 | (1 << 18), None) != 0: fail("mount --make-rprivate /")
if ids is not None:
    r1, w1 = os.pipe(); r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = libc.unshare(NEWUSER) == 0
        os.write(w1, b"1" if ok else b"0"); os.read(r2, 1); os._exit(0)
    if os.read(r1, 1) != b"1": fail("unshare(user) for the idmap")
    write(f"/proc/{pid}/uid_map", f"{ids[0]} {ids[1]} 1"); write(f"/proc/{pid}/gid_map", f"{ids[2]} {ids[3]} 1")
    nsfd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    os.write(w2, b"x"); os.waitpid(pid, 0)
    sc = ctypes.CDLL(None, use_errno=True).syscall
    sc.restype = ctypes.c_long
    fd = sc(428, -100, lower.encode(), ctypes.c_uint(1 | 0o2000000))  # open_tree(CLONE | CLOEXEC)
    if fd < 0: fail("open_tree(image root)")
    attr = (ctypes.c_uint64 * 4)(0x00100000, 0, 0, nsfd)  # MOUNT_ATTR_IDMAP, userns_fd
    if sc(442, ctypes.c_int(fd), b"", ctypes.c_uint(0x1000), ctypes.byref(attr), ctypes.c_size_t(32)) != 0:
        fail("mount_setattr(MOUNT_ATTR_IDMAP) on the image root")
    if sc(429, ctypes.c_int(fd), b"", -100, idlower.encode(), ctypes.c_uint(4)) != 0: fail("move_mount(idmapped root)")
    lower = idlower
opts = f"lowerdir={lower},upperdir={upper},workdir={work}" + (",userxattr" if mode == "user" else "")
if libc.mount(b"overlay", merged.encode(), b"overlay", 2 | 4, opts.encode()) != 0: fail("mount -t overlay")
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.read()
"""


class Overlay(_NamespaceHolder):
    """The overlay of one episode: ``lower`` (the image root, read-only) under ``dir/upper``.

    ``dir`` holds ``upper`` (the episode's writes), ``work`` (overlayfs's), ``merged`` (the
    mount point, inside the holder's namespace) and ``lower`` (the idmapped image root, as
    root). It is a :class:`~envs.sandbox.storage._NamespaceHolder` holding an overlay instead of
    a tmpfs (its start, ``enter`` without root, ``close``: the namespace and the mount end with the
    holder). ``idmap``: as root, which on-disk owner appears as the episode's host ids (see the
    module docstring); ignored without root. Raises :class:`OverlayError` naming the step the
    kernel refused.
    """

    def __init__(self, lower: str, dir: str, idmap: IdMap | None = None, timeout_s: float = 20.0) -> None:
        self.lower = os.path.realpath(lower)
        self.dir = dir
        self.upper, self.work, self.merged = (os.path.join(dir, n) for n in ("upper", "work", "merged"))
        self.idmapped = os.path.join(dir, "lower")
        self.root_mode = os.geteuid() == 0
        for d in (self.upper, self.work, self.merged, self.idmapped):
            os.mkdir(d, 0o755)
        if self.root_mode and idmap is not None:
            # The view's root directory takes its owner and mode from the upper one: the task user's, as in the image.
            os.chown(self.upper, idmap.host_uid, idmap.host_gid)
            os.chmod(self.upper, os.stat(self.lower).st_mode & 0o7777)
        mode = "root" if self.root_mode else "user"
        argv = [_python(), "-I", "-S", "-c", _HOLDER, mode, self.lower, self.upper, self.work, self.merged]
        argv.append(self.idmapped)
        use_idmap = self.root_mode and idmap is not None
        if use_idmap:
            argv += [str(idmap.disk_uid), str(idmap.host_uid), str(idmap.disk_gid), str(idmap.host_gid)]
        self.lower_inside = self.idmapped if use_idmap else self.lower  # the image as launches see it
        self._nsenter = shutil.which("nsenter") or "nsenter"
        self._start(argv, f"cannot mount the episode's copy-on-write view of {self.lower}", OverlayError, timeout_s)
        self.view = f"/proc/{self.pid}/root{self.merged}"  # the merged tree, from the harness

    def enter(self) -> list[str]:
        """The command prefix that runs a launcher in the holder's namespaces (its mount namespace as root)."""
        if self.root_mode:
            return [self._nsenter, f"--target={self.pid}", "--mount", "--"]
        return super().enter()


def _python() -> str:
    """An interpreter this process may run for the holder (it needs the standard library only)."""
    for exe in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if exe and os.access(exe, os.X_OK):
            return exe
    raise OverlayError("no Python interpreter to run the overlay's holder with (tried this one and python3)")


_probed: str | None = None  # "" once the probe passed in this process, else why it failed


def check_overlay() -> None:
    """Mount (and drop) one view of a scratch tree the way episodes do, once per process; raise
    ``SandboxUnavailable`` naming what the kernel refused when this host cannot (every episode would fail)."""
    global _probed
    if _probed is None:
        import tempfile

        from envs.sandbox.files import remove_tree

        top = tempfile.mkdtemp(prefix="jointrl-harbor-probe-")
        try:
            os.chmod(top, 0o755)
            lower, ep = os.path.join(top, "image"), os.path.join(top, "ep")
            os.mkdir(lower, 0o755)
            os.mkdir(ep, 0o711)
            ids = IdMap(0, os.getuid(), 0, os.getgid()) if os.geteuid() == 0 else None
            Overlay(lower, ep, ids).close()
            _probed = ""
        except (OSError, OverlayError) as exc:
            _probed = str(exc)
        finally:
            remove_tree(top)
    if _probed:
        from envs.sandbox.base import SandboxUnavailable

        raise SandboxUnavailable(
            f"Harbor episodes cannot run here: {_probed} (they need overlayfs in a private mount namespace: "
            "as root with idmapped mounts (Linux 5.19+), without root in an unprivileged user namespace)"
        )
