"""A quick image builder for the episode and env tests, and the base root it builds on.

The episode tests need images, not the real builder's fidelity (``envs.harbor.image``, tested in
``tests/test_harbor_image.py``: apt, RUN in a user namespace, the cache): so

* :func:`load_task` is the Harbor loader's, with fields replaceable for a test;
* :func:`build_image` starts from one Debian bookworm root built with ``mmdebstrap`` once per
  machine and cached (it has bash, coreutils and python3, so the test tasks' ``apt-get install
  python3`` lines are already satisfied and skipped), hard-links it into a per-task tree when
  the Dockerfile has ``WORKDIR`` or ``COPY`` (new files only: the base's files are never written,
  so the shared inodes stay the base's), and records ``ENV``, ``USER`` and ``WORKDIR``. Any
  other ``RUN`` is refused.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from envs.harbor.image import BuiltImage
from envs.harbor.task import HarborTask
from envs.harbor.task import load_task as _load_task

DATA = Path(__file__).resolve().parent / "data" / "harbor"
_CACHE = Path(os.environ.get("JOINTRL_CACHE", "/tmp/jointrl-test-cache")) / "harbor"
_BASE_PACKAGES = "bash,coreutils,python3"


def image(digest: str, root: Path, workdir: str, env: dict[str, str], user: str | None) -> BuiltImage:
    """A :class:`BuiltImage` record of a tree made here (cached, no CMD)."""
    return BuiltImage(digest, root, workdir, env, user, cmd=None, entrypoint=None, build_s=0.0, cached=True)


def load_task(path: Path, **overrides: Any) -> HarborTask:
    """The Harbor loader's task (:func:`envs.harbor.task.load_task`), with ``overrides`` replacing fields."""
    return dataclasses.replace(_load_task(Path(path)), **overrides)


def base_root() -> Path:
    """The Debian bookworm root (minbase + bash, coreutils, python3), built once per machine with mmdebstrap."""
    root = _CACHE / "base-bookworm"
    if (root / "usr" / "bin" / "python3").exists():
        return root
    _CACHE.mkdir(parents=True, exist_ok=True)
    os.chmod(_CACHE, 0o755)
    with open(_CACHE / "base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build when several test processes ask at once
        if not (root / "usr" / "bin" / "python3").exists():
            tmp = _CACHE / f"base-tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(
                ["mmdebstrap", "--quiet", "--variant=minbase", f"--include={_BASE_PACKAGES}", "bookworm", str(tmp)],
                check=True,
                timeout=900,
            )
            os.chmod(tmp, 0o755)
            shutil.rmtree(root, ignore_errors=True)
            os.rename(tmp, root)
    return root


def build_image(task: HarborTask, cache_dir: Path | None = None) -> BuiltImage:
    """The stand-in builder (see the module docstring)."""
    base = base_root()
    workdir, env, user, copies = "/", {}, None, []
    for line in task.dockerfile.read_text().splitlines():
        words = line.split(None, 1)
        if not words or words[0].startswith("#"):
            continue
        op, arg = words[0].upper(), (words[1] if len(words) > 1 else "")
        if op == "WORKDIR":
            workdir = arg.strip()
        elif op == "ENV":
            k, _, v = arg.partition("=")
            env[k.strip()] = v.strip()
        elif op == "USER":
            user = arg.strip()
        elif op == "COPY":
            *srcs, dest = shlex.split(arg)
            copies += [(task.context / s, dest) for s in srcs]
        elif op == "RUN" and "apt-get" not in arg:
            raise ValueError(f"{task.dockerfile}: the test stand-in builder runs no RUN lines: {line!r}")
    if workdir == "/" and not copies:
        return image("base", base, workdir, env, user)
    digest = hashlib.sha256(task.dockerfile.read_bytes() + b"".join(s.read_bytes() for s, _ in copies)).hexdigest()[:16]
    root = _CACHE / f"img-{digest}"
    if not root.exists():
        tmp = _CACHE / f"img-tmp-{digest}-{os.getpid()}"
        subprocess.run(["cp", "-al", str(base), str(tmp)], check=True)
        (tmp / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for src, dest in copies:
            target = tmp / dest.lstrip("/") / src.name if dest.endswith("/") else tmp / dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)  # a new inode: the base's files stay untouched
        try:
            os.rename(tmp, root)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return image(digest, root, workdir, env, user)
