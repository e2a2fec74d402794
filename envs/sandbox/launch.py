"""Launch and mounts: the bwrap command line, the work dir, the interpreter visible inside."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence

from envs.sandbox.base import (
    HIDDEN_DIRS,
    SANDBOX_GID,
    SANDBOX_PATH,
    SANDBOX_UID,
    _MiB,
    Limits,
    SandboxUnavailable,
    _Tools,
)

# --------------------------------------------------------------------------------------
# Command construction
# --------------------------------------------------------------------------------------


def _inner_work_dir() -> str:
    """Where the work dir appears inside: /work if the host has that directory to mount on."""
    if os.path.isdir("/work") and not os.path.islink("/work"):
        return "/work"
    return "/tmp/work"


def _temp_parent() -> str:
    """Where private work dirs go: the temp dir, or /tmp when a sandbox's host uid could not reach it."""
    tmp = tempfile.gettempdir()
    if os.geteuid() != 0:
        return tmp
    path = os.path.realpath(tmp)
    while path != "/":
        try:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return "/tmp"
        except OSError:
            return "/tmp"
        path = os.path.dirname(path)
    return tmp


def _base_env(home: str) -> dict[str, str]:
    return {
        "PATH": SANDBOX_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    out = {}
    for k, v in (env or {}).items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k or "\0" in k or "\0" in v:
            raise ValueError(f"invalid environment entry {k!r}")
        out[k] = v
    return out


def _bwrap_command(
    tools: _Tools,
    argv: Sequence[str],
    *,
    work_dir: str,
    inner: str,
    env: Mapping[str, str],
    limits: Limits,
    info_fd: int | None,
    new_session: bool,
    ro_binds: Sequence[str],
    scratch: tuple[str, str] | None = None,
    hide: Sequence[str] = (),
    seccomp_fd: int | None = None,
    host_ids: tuple[int, int],
) -> list[str]:
    """The full launcher command: setpriv (when root) to ``host_ids`` (the sandbox's leased host
    uid and gid, :mod:`envs.sandbox.uids`), then bwrap with the mounts below.

    Mounts, in order (later ones cover earlier ones): the host root read-only; a private
    /dev and /proc; ``hide`` (the directories holding other sandboxes' storage) and
    :data:`HIDDEN_DIRS` as empty read-only tmpfs; /tmp and /dev/shm from ``scratch``
    (the sandbox's capped storage) or, without one, bwrap tmpfs capped by size; extra
    read-only binds; the work dir.
    """
    cmd = _privilege_drop(tools, host_ids) + [tools.bwrap]
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    cmd += _mounts(tools, work_dir, inner, limits, ro_binds, scratch, hide)
    cmd += ["--chdir", inner, *_isolation(tools, seccomp_fd, new_session), "--clearenv"]
    for k, v in {**_base_env(inner), **env}.items():
        cmd += ["--setenv", k, v]
    cmd += ["--", *argv]
    return cmd


def _privilege_drop(tools: _Tools, host_ids: tuple[int, int]) -> list[str]:
    """As root, bwrap itself runs as the sandbox's host uid and gid (setpriv), never with root's capabilities."""
    if os.geteuid() != 0:
        return []
    assert tools.setpriv is not None
    uid, gid = host_ids
    return [tools.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs", "--"]


def _mounts(
    tools: _Tools,
    work_dir: str,
    inner: str,
    limits: Limits,
    ro_binds: Sequence[str],
    scratch: tuple[str, str] | None,
    hide: Sequence[str],
) -> list[str]:
    """The mount options, in the order of :func:`_bwrap_command`'s docstring."""
    small = ["--size", str(_MiB)] if tools.has_size else []
    cmd = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for d in (*hide, *(os.path.realpath(h) for h in HIDDEN_DIRS if os.path.isdir(h))):
        if d not in ("/", "/tmp") and os.path.isdir(d):
            cmd += [*small, "--tmpfs", d, "--remount-ro", d]
    if scratch is not None:
        cmd += ["--bind", scratch[0], "/tmp", "--bind", scratch[1], "/dev/shm"]
    else:
        size = ["--size", str(limits.memory_mb * _MiB)] if tools.has_size else []
        cmd += [*size, "--tmpfs", "/tmp", *size, "--tmpfs", "/dev/shm"]
    for path in ro_binds:
        cmd += ["--ro-bind", path, path]
    return cmd + ["--bind", work_dir, inner]


def _isolation(tools: _Tools, seccomp_fd: int | None, new_session: bool) -> list[str]:
    """Every namespace unshared, uid/gid 65534 inside (mapped to the host uid bwrap runs as), no
    capabilities, seccomp, tied to its parent."""
    cmd = ["--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    cmd += ["--hostname", "sandbox", "--cap-drop", "ALL"]
    if tools.has_disable_userns:
        cmd.append("--disable-userns")
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd.append("--die-with-parent")
    if new_session:
        cmd.append("--new-session")
    return cmd


def _prepare_work_dir(path: str, host_ids: tuple[int, int]) -> None:
    """Make ``path`` usable as a work dir by the sandbox's host uid and gid ``host_ids``."""
    st = os.stat(path)
    if os.geteuid() == 0:
        # bwrap runs as the sandbox's host uid and must be able to reach the directory to bind it.
        parent = os.path.dirname(path)
        while parent and parent != "/":
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                raise ValueError(
                    f"work dir {path!r} is not reachable by uid {host_ids[0]}: {parent!r} is not "
                    "world-searchable (mode o+x); use a directory whose ancestors all are, such as "
                    "one made by tempfile.mkdtemp() directly under /tmp"
                )
            parent = os.path.dirname(parent)
        os.chown(path, *host_ids)
    if st.st_mode & 0o700 != 0o700:
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)


def _world_can_exec(path: str) -> bool:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o005 != 0o005:
            return False
        parent = os.path.dirname(path)
        while parent and parent != "/":
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            parent = os.path.dirname(parent)
        return True
    except OSError:
        return False


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _sandbox_python(inner: str, hidden: Sequence[str] = ()) -> str:
    """An absolute interpreter path that exists and can run inside the sandbox."""
    exe = sys.executable or ""
    candidates = [exe, os.path.realpath(exe), "/usr/bin/python3", "/usr/local/bin/python3"]
    shadowed = [
        *(os.path.realpath(d) for d in HIDDEN_DIRS if os.path.isdir(d)),
        *hidden,
        "/tmp",
        "/dev",
        "/proc",
        inner,
    ]
    for cand in candidates:
        if not cand or not os.path.isabs(cand) or not os.path.exists(cand):
            continue
        real = os.path.realpath(cand)
        if any(_under(p, s) for p in (cand, real) for s in shadowed):
            continue
        if os.geteuid() == 0 and not _world_can_exec(real):
            continue
        if os.geteuid() != 0 and not os.access(real, os.X_OK):
            continue
        return cand if cand == real else real
    raise SandboxUnavailable(
        "no Python interpreter is visible inside the sandbox (tried "
        f"{', '.join(c for c in candidates if c)}); install python3 system-wide or pass "
        "python=... (and ro_binds=[...] for its prefix)"
    )
