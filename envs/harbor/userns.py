"""Running build commands as root of a user namespace that maps 65,536 ids, and what the host needs for it.

Image builds (``envs.harbor.image``) run ``RUN`` steps, ``apt``/``dpkg`` included, as root over the image's tree
without being root on the host: every build command runs in a fresh user namespace whose ids 0..65535 map to host
ids (:func:`id_maps`):

* harness run as root: the identity map (namespace uid N is host uid N), written to ``/proc/<pid>/uid_map`` by the
  harness itself. The image's files are then owned by the host ids they name.
* harness not root: namespace uid 0 is the caller's uid and 1..65535 the caller's first subordinate range of at
  least 65,535 ids in ``/etc/subuid`` (same for gids in ``/etc/subgid``), written by the setuid ``newuidmap`` and
  ``newgidmap`` (package ``uidmap``). Without such ranges, or without the tools, or where user namespaces are
  refused, :func:`check_host` raises :class:`HostNotReady` saying what to add.

A namespace root has capabilities only over what the namespace owns; the build still never runs a Dockerfile's
command outside ``bwrap`` over the image's own root (the host tree is not reachable from it). Episodes over a built
image use the same map (:func:`id_maps`) so that its files keep their owners.
"""

from __future__ import annotations

import os
import pwd
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

__all__ = ["HostNotReady", "IdMaps", "check_host", "id_maps", "run_mapped", "MappedResult"]

RANGE = 65536  # ids mapped: 0..65535, what Debian's packages and Dockerfiles' useradd use


class HostNotReady(RuntimeError):
    """This host cannot build images as it is; the message says what to install or configure."""


@dataclass(frozen=True)
class IdMaps:
    uid: tuple[tuple[int, int, int], ...]  # (inside, outside, count) lines of /proc/<pid>/uid_map
    gid: tuple[tuple[int, int, int], ...]
    privileged: bool  # written by the harness (root) rather than by newuidmap/newgidmap

    def outside_uid(self, inside: int) -> int:
        for lo, out, n in self.uid:
            if lo <= inside < lo + n:
                return out + inside - lo
        raise ValueError(f"uid {inside} is not mapped")


def _sub_range(path: str, user: str, uid: int) -> tuple[int, int] | None:
    """The first range of ``path`` (/etc/subuid format ``name:start:count``) of at least RANGE - 1 ids for the user."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in (user, str(uid)) and parts[1].isdigit() and parts[2].isdigit():
            if int(parts[2]) >= RANGE - 1:
                return int(parts[1]), int(parts[2])
    return None


def id_maps(subuid: str = "/etc/subuid", subgid: str = "/etc/subgid") -> IdMaps:
    """The id maps of build (and episode) namespaces for this process; HostNotReady when none can be made."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        full = ((0, 0, RANGE),)
        return IdMaps(full, full, True)
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    su, sg = _sub_range(subuid, user, uid), _sub_range(subgid, user, uid)
    missing = []
    if su is None:
        missing.append(f"a line `{user}:100000:65536` in {subuid} (subordinate uids)")
    if sg is None:
        missing.append(f"a line `{user}:100000:65536` in {subgid} (subordinate gids)")
    for tool in ("newuidmap", "newgidmap"):
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` (apt-get install uidmap)")
    if missing:
        raise HostNotReady(
            f"building Harbor task images without root needs user namespaces with {RANGE} mapped ids "
            f"(apt and dpkg change file owners); this host (uid {uid}) lacks: " + "; ".join(missing) + ". "
            "Or run the harness as root."
        )
    assert su is not None and sg is not None
    return IdMaps(((0, uid, 1), (1, su[0], RANGE - 1)), ((0, gid, 1), (1, sg[0], RANGE - 1)), False)


@dataclass(frozen=True)
class MappedResult:
    returncode: int
    output: bytes  # stdout and stderr together (the last ``keep`` bytes)
    timed_out: bool


def _write_maps(pid: int, maps: IdMaps) -> None:
    if maps.privileged:
        for name, lines in (("uid_map", maps.uid), ("gid_map", maps.gid)):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write("".join(f"{a} {b} {c}\n" for a, b, c in lines))
        return
    for tool, lines in (("newuidmap", maps.uid), ("newgidmap", maps.gid)):
        argv = [tool, str(pid), *(str(x) for line in lines for x in line)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            raise HostNotReady(f"{' '.join(argv)} failed: {res.stderr.strip() or res.returncode}")


def run_mapped(
    argv: list[str],
    *,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    mount_ns: bool = False,
    on_line: object = None,
    keep: int = 16384,
    maps: IdMaps | None = None,
) -> MappedResult:
    """Run ``argv`` as root of a new user namespace (ids mapped by :func:`id_maps`), stdin at /dev/null.

    The program is started through ``unshare --user`` and a shell that waits until the harness has written the
    id maps, so ``argv`` starts with the namespace's full capabilities. ``mount_ns``: also a private mount
    namespace. ``on_line(bytes)`` is called with each output line; the last ``keep`` bytes are returned.
    A run past ``timeout`` seconds is killed with its process group (``timed_out``).
    """
    maps = maps or id_maps()
    unshare = shutil.which("unshare")
    if unshare is None:
        raise HostNotReady("image builds need `unshare` (util-linux)")
    pre = [unshare, "--user"] + (["--mount", "--propagation", "private"] if mount_ns else [])
    script = 'echo ready; read _ ; exec "$@" </dev/null'
    proc = subprocess.Popen(
        [*pre, "--", "/bin/sh", "-c", script, "sh", *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        _start(proc, maps)
        return _pump(proc, timeout, on_line, keep)
    finally:
        if proc.poll() is None:
            _kill(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def _start(proc: subprocess.Popen, maps: IdMaps) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = proc.stdout.readline() if sel.select(30) else b""
    if ready != b"ready\n":
        _kill(proc)
        rest = proc.stdout.read() or b""
        said = (ready + rest).decode("utf-8", "replace").strip() or "no answer"
        raise HostNotReady(f"cannot create a user namespace for the image build (unshare said: {said})")
    _write_maps(proc.pid, maps)
    proc.stdin.write(b"go\n")
    proc.stdin.close()


def _pump(proc: subprocess.Popen, timeout: float | None, on_line: object, keep: int) -> MappedResult:
    assert proc.stdout is not None
    deadline = None if timeout is None else time.monotonic() + timeout
    tail = bytearray()
    pending = b""
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                _kill(proc)
                return MappedResult(-signal.SIGKILL, bytes(tail), True)
            if not sel.select(left if left is None else min(left, 1.0)):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            tail += chunk
            del tail[:-keep]
            if callable(on_line):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    on_line(line)
    return MappedResult(proc.wait(), bytes(tail), False)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


_probe_lock = threading.Lock()
_probe_result: IdMaps | HostNotReady | None = None


def check_host(need_debian: bool = True) -> IdMaps:
    """Probe once (cached) that image builds can run here; raise HostNotReady naming what is missing.

    Needs ``unshare`` (util-linux), ``bwrap`` (bubblewrap), a user namespace with the 65,536-id map, and for
    Debian bases ``mmdebstrap``.
    """
    global _probe_result
    if need_debian and shutil.which("mmdebstrap") is None:
        raise HostNotReady("Debian-based images are built with mmdebstrap: apt-get install mmdebstrap")
    with _probe_lock:
        if _probe_result is None:
            _probe_result = _probe()
        result = _probe_result
    if isinstance(result, HostNotReady):
        raise HostNotReady(str(result))
    return result


def _probe() -> IdMaps | HostNotReady:
    try:
        if shutil.which("bwrap") is None:
            raise HostNotReady("image builds run RUN steps in bubblewrap: apt-get install bubblewrap")
        maps = id_maps()
        res = run_mapped(["/bin/sh", "-c", "cat /proc/self/uid_map"], timeout=30, maps=maps)
        said = res.output.decode("utf-8", "replace")
        mapped = sum(int(line.split()[2]) for line in said.splitlines() if len(line.split()) == 3)
        if res.returncode != 0 or mapped != RANGE:
            raise HostNotReady(
                "a user namespace with the 65,536-id map could not be made "
                f"(said: {said.strip()}); unprivileged user namespaces may be "
                "disabled: sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0"
            )
        return maps
    except HostNotReady as exc:
        return exc
