"""Work-dir file access from the host that never follows symlinks the sandbox may have planted."""

from __future__ import annotations

import os


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
