"""Work-dir file access from the host that never follows symlinks the sandbox may have planted."""

from __future__ import annotations

import logging
import os
import stat
import subprocess

logger = logging.getLogger("envs.sandbox")


# --------------------------------------------------------------------------------------
# Work-dir file access that never follows symlinks the sandbox may have planted
# --------------------------------------------------------------------------------------


def _split_rel(path: str) -> list[str]:
    if not isinstance(path, str) or not path or "\0" in path or os.path.isabs(path):
        raise ValueError(f"expected a relative path inside the work dir, got {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"path {path!r} must stay inside the work dir")
    return parts


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_parent(root: str, parts: list[str], create: bool, chown: tuple[int, int] | None) -> int:
    """An fd of the directory that holds ``parts[-1]`` under ``root``, never through a symlink;
    missing directories are made when ``create``, owned by ``chown`` (uid, gid) when given."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                if chown is not None:
                    os.fchown(nfd, *chown)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


# --------------------------------------------------------------------------------------
# Removing trees the sandbox wrote, at any depth
# --------------------------------------------------------------------------------------

REMOVE_TIMEOUT_S = 120.0
_RM_BATCH = 256  # directories per `rm` call (keeps argv far below ARG_MAX)


def remove_tree(path: str, *, keep_root: bool = False, timeout_s: float = REMOVE_TIMEOUT_S) -> bool:
    """Remove ``path`` and everything under it (``keep_root``: only what is inside it), never following
    a symlink. Returns True when nothing is left; never raises for what the tree holds.

    The tree is the sandbox's, so it may be as deep as its inode cap allows (a chain of thousands of
    directories, paths far over PATH_MAX) and hold directories without u+rwx: Python's recursive
    ``shutil.rmtree`` and ``os.walk`` raise ``RecursionError`` on such a chain (or leave it behind on
    ``ENAMETOOLONG``). So top-level files go by ``unlink`` here and directories by GNU ``rm -rf``
    (an iterative ``fts`` walk with ``openat``: no depth or path-length limit), after a ``chmod -R
    u+rwx`` when not root; each call is bounded by ``timeout_s`` and killed past it. What could not be
    removed is logged."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        logger.warning("cannot inspect %s to remove it: %s", path, exc)
        return False
    if not keep_root:
        if not stat.S_ISDIR(st.st_mode):
            return _unlink(path)
        try:
            os.rmdir(path)  # the common case (an unmounted storage root): already empty, no process to start
            return True
        except OSError:
            dirs = [path]
    else:
        dirs = _unlink_entries(path)
        if dirs is None:
            return False
    for i in range(0, len(dirs), _RM_BATCH):
        _rm_dirs(dirs[i : i + _RM_BATCH], timeout_s)
    left = [d for d in dirs if os.path.lexists(d)]
    if left:
        logger.warning("could not remove %d sandbox-written directories under %s (e.g. %s)", len(left), path, left[0])
    return not left


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return True
    except OSError as exc:
        logger.warning("cannot remove %s: %s", path, exc)
        return False


def _unlink_entries(path: str) -> list[str] | None:
    """Unlink every non-directory directly in ``path``; its subdirectories (None: ``path`` unreadable)."""
    try:
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | 0o700)
    except OSError:
        pass
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError as exc:
        logger.warning("cannot list %s to empty it: %s", path, exc)
        return None
    dirs = []
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = True  # let rm sort it out
        if is_dir:
            dirs.append(entry.path)
        else:
            _unlink(entry.path)
    return dirs


def _rm_dirs(dirs: list[str], timeout_s: float) -> None:
    """``chmod -R u+rwx`` (unless root: it needs no permission bits) then ``rm -rf`` on ``dirs``, each
    bounded by ``timeout_s``; failures are left to the caller's check of what remains."""
    steps = ([] if os.geteuid() == 0 else [["chmod", "-R", "u+rwx", "--", *dirs]]) + [["rm", "-rf", "--", *dirs]]
    for argv in steps:
        try:
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
                close_fds=True,
            )
        except subprocess.TimeoutExpired:
            logger.warning("%s on %d directories took over %gs; killed", argv[0], len(dirs), timeout_s)
        except OSError as exc:
            logger.warning("cannot run %s: %s", argv[0], exc)
