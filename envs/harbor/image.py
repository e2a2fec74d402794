"""Harbor task images built without Docker, cached once per node and shared by every episode.

:func:`build_image` parses and plans the task's ``environment/Dockerfile`` (``envs.harbor.dockerfile``), then
builds the root filesystem tree:

* the base (``FROM``): ``mmdebstrap --variant=minbase`` of the Debian suite the base maps to (a tar, extracted as
  root of the build's user namespace), or an empty tree for ``scratch``;
* ``RUN``: ``bwrap`` over the tree as ``/`` (read-write), run as root of a user namespace mapping 65,536 ids
  (``envs.harbor.userns``: ``apt``/``dpkg`` work), fresh ``/dev`` and ``/proc``, the host's network and
  ``/etc/resolv.conf`` (none with ``RUN --network=none``); ``USER`` switches with the image's ``setpriv``;
* ``COPY``/``ADD``/``WORKDIR``: ``envs.harbor.rootfs`` in the same namespace, paths resolved inside the tree.

The cache (``cache_dir``, else :func:`default_cache_dir`: ``$JOINTRL_IMAGE_CACHE``, else ``$JOINTRL_CACHE/images``, else
``~/.cache/jointrl/images``; the test suite's ``conftest.py`` sets ``JOINTRL_CACHE``, so every test that builds shares
one cache and one base build):

* ``images/<digest>/root`` + ``image.json``: the digest is a sha256 of the builder's version, the Dockerfile, the
  base it maps to and the build context's paths, modes and contents (``.dockerignore`` applied). One build per
  digest per node: an exclusive ``flock`` on ``locks/<digest>.lock``; the tree is built under ``tmp/`` and
  published with one ``rename`` (atomic), so a reader sees a whole image or none.
* ``prefixes/<key>/root``: the tree after ``FROM`` and after each ``RUN`` that comes before the first
  ``COPY``/``ADD``, keyed by the hash of the instructions so far. Tasks whose Dockerfiles start alike (same
  ``FROM``, same leading ``RUN``s) start from the longest cached prefix: the shipped tasks build one base. A
  finished image's files that its own steps left unchanged are hard links to the prefix's (trees are never written
  once published), so an image costs the disk space of what its steps changed.

``jointrl images ls|rm`` (``rl/cli/images.py``) lists and removes cached images. An image's tree is never written
after it is published: episodes mount it read-only under a private copy-on-write layer (``envs.harbor.episode``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from envs.harbor.dockerfile import DEFAULT_PATH, Base, DockerfileError, Plan, Step, parse, plan
from envs.harbor.rootfs import lookup_user, ContextError, context_digest, in_root
from envs.harbor.task import HarborTask, HarborTaskError
from envs.harbor.userns import HostNotReady, check_host, run_mapped
from envs.sandbox.files import remove_tree

__all__ = [
    "BUILDER_VERSION",
    "BuiltImage",
    "ImageBuildError",
    "build_image",
    "default_cache_dir",
    "image_digest",
    "image_plan",
    "list_images",
    "remove_image",
    "remove_prefixes",
    "HostNotReady",
]

BUILDER_VERSION = "1"  # bump when a build of the same inputs would give another tree
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY = "http://deb.debian.org/debian-security"
SLIM_EXCLUDES = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/info/*", "/usr/share/locale/*")
logger = logging.getLogger("envs.harbor")


class ImageBuildError(HarborTaskError):
    """An image that did not build: names the task, the file and line, and the step's last output."""


@dataclass(frozen=True)
class BuiltImage:
    digest: str
    root: Path  # the image's root filesystem tree: read-only, shared by every episode
    workdir: str  # the last WORKDIR ("/" without one)
    env: dict[str, str]  # the image's ENV (PATH included)
    user: str | None  # the last USER (None: root)
    cmd: list[str] | None
    entrypoint: list[str] | None
    build_s: float  # seconds the build took (when it was built)
    cached: bool  # True: found in the cache, not built by this call
    base: str = ""  # the FROM reference
    approximate: str = ""  # why the tree differs from the named base ("" when it does not)


def default_cache_dir() -> Path:
    """``$JOINTRL_IMAGE_CACHE``, else ``$JOINTRL_CACHE/images`` (the cache of jointrl's models), else
    ``~/.cache/jointrl/images``: the driver and its actors read the same variables, so they find the same images."""
    env = os.environ.get("JOINTRL_IMAGE_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("JOINTRL_CACHE") or Path.home() / ".cache" / "jointrl") / "images"


def _where(task: HarborTask) -> str:
    return f"harbor task {task.path}: environment/Dockerfile"


def image_plan(task: HarborTask, allow_approximate: bool = True) -> Plan:
    """The task's Dockerfile parsed and planned (no build); DockerfileError naming the task, file and line."""
    try:
        text = task.dockerfile.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DockerfileError(_where(task), 0, f"cannot be read: {exc}") from None
    return plan(parse(text, _where(task)), _where(task), allow_approximate=allow_approximate)


def image_digest(task: HarborTask, p: Plan) -> str:
    """sha256 of what decides the tree: builder version, Dockerfile, the base it maps to, the context."""
    h = hashlib.sha256()
    for part in (BUILDER_VERSION, task.dockerfile.read_bytes().decode("utf-8"), p.base.key(), _mirrors_key()):
        h.update(part.encode() + b"\0")
    h.update(context_digest(task.context).encode())
    return h.hexdigest()


def _mirrors_key() -> str:
    return json.dumps([os.environ.get("JOINTRL_DEBIAN_MIRROR", DEBIAN_MIRROR)])


# --------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _flock(path: Path, say: Callable[[str], None], waiting: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(waiting)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load(d: Path, cached: bool) -> BuiltImage | None:
    try:
        meta = json.loads((d / "image.json").read_text())
    except (OSError, ValueError):
        return None
    fields = {k: meta[k] for k in ("digest", "workdir", "env", "user", "cmd", "entrypoint", "build_s", "base")}
    return BuiltImage(root=d / "root", cached=cached, approximate=meta.get("approximate", ""), **fields)


def _tree(argv: list[str], what: str, timeout: float | None = None) -> None:
    """A file-tree command (cp, rm, tar) as root of the build namespace; ImageBuildError with its output."""
    res = run_mapped(argv, timeout=timeout)
    if res.returncode != 0:
        said = res.output.decode("utf-8", "replace").strip()[-2000:]
        raise ImageBuildError(f"{what} failed ({'timed out' if res.timed_out else res.returncode}): {said}")


def _remove_tree(path: Path) -> None:
    if not os.path.lexists(path):
        return
    if os.geteuid() == 0:
        remove_tree(str(path), timeout_s=600.0)  # rm -rf, any depth; what cannot go is logged
    else:  # files owned by subordinate ids: removed inside the namespace that owns them
        _tree(["rm", "-rf", "--", str(path)], f"removing {path}")


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(root, onerror=lambda e: None):
        for n in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, n))
                total += st.st_blocks * 512 if st.st_nlink == 1 else 0  # linked files are shared with a prefix
    return total


def list_images(cache_dir: Path | None = None) -> list[dict]:
    """The cached images' records (image.json: digest, tasks, base, size_bytes (not shared with a prefix), build_s,
    created, ...), newest first."""
    images = Path(cache_dir or default_cache_dir()) / "images"
    out = []
    for d in sorted(images.iterdir()) if images.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads((d / "image.json").read_text()))
    return sorted(out, key=lambda m: m.get("created", 0), reverse=True)


def remove_image(digest: str, cache_dir: Path | None = None) -> list[str]:
    """Remove the cached images whose digest starts with ``digest`` (at least 6 characters); their digests.

    Each is removed under its build lock (never while it is being built): renamed out of ``images/`` first, so a
    reader never sees half of one."""
    if len(digest) < 6:
        raise ValueError("give at least 6 characters of the digest")
    cache = Path(cache_dir or default_cache_dir())
    gone = []
    for d in sorted((cache / "images").glob(f"{digest}*")):
        with _flock(cache / "locks" / f"{d.name}.lock", logger.info, f"waiting for the build of {d.name[:12]}"):
            trash = cache / "tmp" / f"rm-{d.name}-{os.getpid()}"
            trash.parent.mkdir(parents=True, exist_ok=True)
            os.rename(d, trash)
            _remove_tree(trash)
        gone.append(d.name)
    return gone


def remove_prefixes(cache_dir: Path | None = None) -> int:
    """Remove every cached build prefix (base trees); the number removed. Images are not affected."""
    cache = Path(cache_dir or default_cache_dir())
    n = 0
    with _flock(cache / "locks" / "prefixes.lock", logger.info, "waiting for a build's prefixes"):
        for d in sorted((cache / "prefixes").glob("*")) if (cache / "prefixes").is_dir() else []:
            _remove_tree(d)
            n += 1
    return n


# --------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------


def build_image(
    task: HarborTask,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    allow_approximate: bool = True,
) -> BuiltImage:
    """The task's image, from the cache or built now (see the module docstring); ``cached`` says which.

    ``progress`` gets one line per build stage (default: the ``envs.harbor`` logger). ``allow_approximate=False``
    refuses bases this builder only approximates (``ubuntu:*``, a python tag naming another suite...).
    Raises :class:`DockerfileError` (a line that cannot be built), :class:`ImageBuildError` (a step that failed,
    naming its line) or :class:`HostNotReady` (what this host lacks to build at all).
    """
    say = progress or logger.info
    cache = Path(cache_dir or default_cache_dir())
    p = image_plan(task, allow_approximate)
    digest = image_digest(task, p)
    final = cache / "images" / digest
    hit = _load(final, cached=True)
    if hit is not None:
        say(f"{task.name}: image {digest[:12]} cached")
        return hit
    check_host(need_debian=p.base.kind == "debian")
    with _flock(cache / "locks" / f"{digest}.lock", say, f"{task.name}: waiting for another build of {digest[:12]}"):
        hit = _load(final, cached=True)
        if hit is not None:
            say(f"{task.name}: image {digest[:12]} built by another process")
            return hit
        t0 = time.monotonic()
        (cache / "tmp").mkdir(parents=True, exist_ok=True)
        for stale in (cache / "tmp").glob(f"build-{digest[:12]}-*"):
            _remove_tree(stale)  # left by a build of this image that was killed (we hold its lock)
        tmp = Path(tempfile.mkdtemp(prefix=f"build-{digest[:12]}-", dir=cache / "tmp"))
        try:
            _Builder(task, p, cache, tmp, say).build(tmp / "root")
            build_s = round(time.monotonic() - t0, 3)
            meta = {
                "digest": digest, "workdir": p.workdir, "env": p.env, "user": p.user, "cmd": p.cmd,
                "entrypoint": p.entrypoint, "build_s": build_s, "base": p.base.ref, "approximate": p.base.approximate,
                "tasks": [task.name], "task_path": str(task.path), "created": time.time(),
                "size_bytes": _tree_size(tmp / "root"), "builder": BUILDER_VERSION, "labels": p.labels,
            }  # fmt: skip
            (tmp / "image.json").write_text(json.dumps(meta, indent=1))
            final.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would keep episodes' other ids out of the tree
            os.rename(tmp, final)
        except BaseException:
            _remove_tree(tmp)
            raise
    say(f"{task.name}: image {digest[:12]} built in {build_s:.1f} s")
    built = _load(final, cached=False)
    assert built is not None
    return built


class _Builder:
    """Builds one plan's tree, starting from the longest cached prefix."""

    def __init__(self, task: HarborTask, p: Plan, cache: Path, tmp: Path, say: Callable[[str], None]) -> None:
        self.task, self.plan, self.cache, self.tmp, self.say = task, p, cache, tmp, say
        self.where = _where(task)
        self.deadline = time.monotonic() + task.build_timeout_s
        steps = p.steps
        self.leading = next((i for i, s in enumerate(steps) if s.kind == "copy"), len(steps))
        self.tmp.mkdir(exist_ok=True)
        self.shared: tuple[Path, int] | None = None  # (a prefix tree equal to the build tree, since when)
        key = hashlib.sha256(f"{BUILDER_VERSION}\0{p.base.key()}\0{_mirrors_key()}".encode()).hexdigest()
        self.keys = [key]
        for s in steps[: self.leading]:
            ident = json.dumps([s.kind, s.argv, s.dest, s.env, s.workdir, s.user, s.network])
            self.keys.append(hashlib.sha256(f"{self.keys[-1]}\0{ident}".encode()).hexdigest())

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ImageBuildError(f"{self.where}: the build ran past build_timeout_sec ({self.task.build_timeout_s} s)")
        return left

    def build(self, root: Path) -> None:
        steps = self.plan.steps
        with _flock(self.cache / "locks" / "prefixes.lock", self.say, f"{self.task.name}: waiting for a base build"):
            for stale in self.tmp.parent.glob("prefix-*"):
                _remove_tree(stale)  # left by a killed build: prefixes are only made under this lock
            start = next((j for j in range(self.leading, -1, -1) if self._prefix(j).is_dir()), None)
            if start is None:
                self._base(root)
                self._snapshot(root, 0)
                start = 0
            else:
                self.say(f"{self.task.name}: from cached prefix {self.keys[start][:12]} ({start} steps)")
                _tree(["cp", "-a", "--reflink=auto", str(self._prefix(start) / "root"), str(root)], "copying a prefix")
                self._copied(start)
            for i in range(start, self.leading):
                self._step(root, i)
                if steps[i].kind == "run":
                    self._snapshot(root, i + 1)
        for i in range(max(start, self.leading), len(steps)):
            self._step(root, i)
        if self.shared is not None:
            base, mark_ns = self.shared
            self._job({"op": "share", "tree": str(root), "base": str(base), "mark_ns": mark_ns})

    def _copied(self, j: int) -> None:
        """The build tree and prefix ``j`` were just made equal: files not written from now on can share inodes."""
        self.shared = (self._prefix(j) / "root", time.time_ns())
        time.sleep(0.05)  # later writes get a change time after the mark, whatever the kernel's clock tick

    def _prefix(self, j: int) -> Path:
        return self.cache / "prefixes" / self.keys[j]

    def _snapshot(self, root: Path, j: int) -> None:
        if self._prefix(j).is_dir():
            return
        tmp = Path(tempfile.mkdtemp(prefix="prefix-", dir=self.tmp.parent))
        try:
            _tree(["cp", "-a", "--reflink=auto", str(root), str(tmp / "root")], "saving a build prefix")
            (tmp / "prefix.json").write_text(
                json.dumps({"base": self.plan.base.ref, "steps": j, "created": time.time()})
            )
            self._prefix(j).parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, self._prefix(j))
        except BaseException:
            _remove_tree(tmp)
            raise
        self._copied(j)

    def _job(self, job: dict, line: int = 0, text: str = "") -> None:
        """Run ``envs.harbor.rootfs`` on a job as root of the build namespace; ImageBuildError naming the line."""
        path = self.tmp / f"job-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(job))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]), *sys.path]))
        res = run_mapped([sys.executable, "-m", "envs.harbor.rootfs", str(path)], timeout=self.left(), env=env)
        if res.returncode != 0:
            said = res.output.decode("utf-8", "replace").strip()[-2000:]
            where = f"{self.where} line {line}: {text[:80]}" if line else self.where
            raise ImageBuildError(f"{where}: {said}")

    def _base(self, root: Path) -> None:
        base = self.plan.base
        if base.kind == "scratch":
            root.mkdir(mode=0o755)
            return
        self.say(f"{self.task.name}: base {base.ref}: Debian {base.suite} (mmdebstrap)")
        tar = self.tmp / "base.tar"
        argv = _mmdebstrap_argv(base, str(tar))
        status, said = _run_host(argv, self.left(), self.tmp)
        if status != 0:
            raise ImageBuildError(f"{self.where}: FROM {base.ref}: mmdebstrap failed ({status}): {said}")
        root.mkdir(mode=0o755)
        _tree(["tar", "--numeric-owner", "-xpf", str(tar), "-C", str(root), "--exclude=./dev/*"], "unpacking the base")
        tar.unlink()
        if base.python:
            for marker in (root / "usr" / "lib").glob("python3*/EXTERNALLY-MANAGED"):
                marker.unlink()  # as in the python images: pip installs into the system Python

    def _step(self, root: Path, i: int) -> None:
        s = self.plan.steps[i]
        self.say(f"{self.task.name}: step {i + 1}/{len(self.plan.steps)} {s.text[:100]}")
        if s.kind == "run":
            self._run(root, s)
            return
        self._job({"root": str(root), "step": asdict(s), "context": str(self.task.context)}, s.line, s.text)

    def _run(self, root: Path, s: Step) -> None:
        try:
            argv = _bwrap_argv(str(root), s)
        except ContextError as exc:
            raise ImageBuildError(f"{self.where} line {s.line}: {s.text[:80]}: {exc}") from None
        res = run_mapped(argv, timeout=self.left(), on_line=lambda b: logger.debug("%s", b.decode("utf-8", "replace")))
        if res.returncode != 0:
            tail = res.output.decode("utf-8", "replace").strip()[-3000:]
            why = (
                f"timed out (build_timeout_sec {self.task.build_timeout_s} s)"
                if res.timed_out
                else f"exit status {res.returncode}"
            )
            raise ImageBuildError(f"{self.where} line {s.line}: {s.text[:80]}: {why}; its last output:\n{tail}")


def _run_host(argv: list[str], timeout: float, tmpdir: Path) -> tuple[int, str]:
    """mmdebstrap on the host (it makes its own namespaces), its temporary files under ``tmpdir``; (exit status, the
    end of its output). Past ``timeout`` its whole process group is killed."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ, TMPDIR=str(tmpdir)),
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.communicate()
        return -9, "timed out (build_timeout_sec)"
    return proc.returncode, out.decode("utf-8", "replace").strip()[-3000:]


def _mmdebstrap_argv(base: Base, out: str) -> list[str]:
    mirror = os.environ.get("JOINTRL_DEBIAN_MIRROR", DEBIAN_MIRROR)
    security = os.environ.get("JOINTRL_DEBIAN_SECURITY", DEBIAN_SECURITY)
    mode = "root" if os.geteuid() == 0 else "unshare"
    argv = ["mmdebstrap", f"--mode={mode}", "--variant=minbase", "--format=tar", "--quiet"]
    if base.packages:
        argv.append("--include=" + ",".join(base.packages))
    if base.slim:
        argv += [f"--dpkgopt=path-exclude={p}" for p in SLIM_EXCLUDES]
        argv.append("--dpkgopt=path-include=/usr/share/doc/*/copyright")
    if mode == "root":  # its mounts stay in a private mount namespace
        argv = ["unshare", "--mount", "--propagation", "private", "--", *argv]
    suite = base.suite
    sources = [
        f"deb {mirror} {suite} main",
        f"deb {mirror} {suite}-updates main",
        f"deb {security} {suite}-security main",
    ]
    return [*argv, suite, out, *sources]


def _bwrap_argv(root: str, s: Step) -> list[str]:
    """The bwrap command of one RUN step over the tree ``root`` (run as root of the build namespace)."""
    env = dict(s.env)
    env.setdefault("PATH", DEFAULT_PATH)
    prefix: list[str] = []
    home = "/root"
    if s.user:
        uid, gid, home, name = lookup_user(root, s.user)
        if not os.path.exists(in_root(root, "/usr/bin/setpriv", follow_last=True)):
            raise ContextError("USER needs setpriv (util-linux) in the image to run RUN as that user")
        groups = "--init-groups" if name and ":" not in s.user else "--clear-groups"
        prefix = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}", groups, "--"]
    env.setdefault("HOME", home)
    argv = [shutil.which("bwrap") or "bwrap", "--bind", root, "/", "--dev", "/dev", "--proc", "/proc"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"]
    argv += ["--chdir", s.workdir, "--clearenv"]
    for k, v in sorted(env.items()):
        argv += ["--setenv", k, v]
    resolv = in_root(root, "/etc/resolv.conf")
    if not s.network:
        argv.append("--unshare-net")
    elif os.path.exists("/etc/resolv.conf") and not os.path.islink(resolv):
        argv += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    return [*argv, "--", *prefix, *s.argv]
