"""A quick image builder for the episode and env tests, and the base root it builds on.

The episode tests need images, not the real builder's fidelity (``envs.harbor.image``, tested in
``tests/test_harbor_image.py``: apt, RUN in a user namespace, the cache): so

* :func:`load_task` is the Harbor loader's, with fields replaceable for a test;
* :func:`build_image` starts from the shipped tasks' shared base (``tests/data/harbor_base``: their
  ``FROM`` and package line, built by the real builder into its cache, ``envs.harbor.image.default_cache_dir``,
  which ``conftest.py`` points at the suite's cache: one ``mmdebstrap`` and one ``apt-get`` for the whole
  suite, the audit of the shipped tasks and the builder's tests included). It has bash, coreutils and
  python3, so the test tasks' ``apt-get install python3`` lines are already satisfied and skipped; it
  hard-links it into a per-task tree (under the cache's ``test-trees/``) when
  the Dockerfile has ``WORKDIR`` or ``COPY`` (new files only: the base's files are never written,
  so the shared inodes stay the base's), and records ``ENV``, ``USER`` and ``WORKDIR``. Any
  other ``RUN`` is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from envs.harbor.image import BuiltImage, default_cache_dir
from envs.harbor.image import build_image as real_build_image
from envs.harbor.task import HarborTask
from envs.harbor.task import load_task as _load_task

DATA = Path(__file__).resolve().parent / "data" / "harbor"
BASE_TASK = Path(__file__).resolve().parent / "data" / "harbor_base"


def image(digest: str, root: Path, workdir: str, env: dict[str, str], user: str | None) -> BuiltImage:
    """A :class:`BuiltImage` record of a tree made here (cached, no CMD)."""
    return BuiltImage(digest, root, workdir, env, user, cmd=None, entrypoint=None, build_s=0.0, cached=True)


def load_task(path: Path, **overrides: Any) -> HarborTask:
    """The Harbor loader's task (:func:`envs.harbor.task.load_task`), with ``overrides`` replacing fields."""
    return dataclasses.replace(_load_task(Path(path)), **overrides)


def base_root() -> Path:
    """The shared base's tree (``tests/data/harbor_base``), built once per cache by the real builder."""
    return real_build_image(_load_task(BASE_TASK)).root


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
    digest = hashlib.sha256(
        str(base).encode() + task.dockerfile.read_bytes() + b"".join(s.read_bytes() for s, _ in copies)
    ).hexdigest()[:16]
    trees = default_cache_dir() / "test-trees"
    trees.mkdir(parents=True, exist_ok=True)
    root = trees / f"img-{digest}"
    if not root.exists():
        tmp = trees / f"img-tmp-{digest}-{os.getpid()}"
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
