"""Test-only stand-ins for the Harbor loader and image builder, and the base root they build on.

``envs/harbor/task.py`` and ``envs/harbor/image.py`` (the loader and the Docker-free builder)
come from another branch; these tests code against their agreed records (``HarborTask``,
``BuiltImage``) with small private stand-ins:

* :func:`load_task` reads the task.toml fields the episode uses (no schema checks: those are
  the real loader's tests);
* :func:`build_image` starts from one Debian bookworm root built with ``mmdebstrap`` once per
  machine and cached (it has bash, coreutils and python3, so the test tasks' ``apt-get install
  python3`` lines are already satisfied and skipped), hard-links it into a per-task tree when
  the Dockerfile has ``WORKDIR`` or ``COPY`` (new files only: the base's files are never written,
  so the shared inodes stay the base's), and records ``ENV``, ``USER`` and ``WORKDIR``. Any
  other ``RUN`` is refused.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "harbor"
_CACHE = Path(os.environ.get("JOINTRL_CACHE", "/tmp/jointrl-test-cache")) / "harbor"
_BASE_PACKAGES = "bash,coreutils,python3"


@dataclass(frozen=True)
class HarborTask:
    name: str
    path: Path
    instruction: str
    schema: str
    agent_timeout_s: float
    verifier_timeout_s: float
    verifier_env: dict[str, str]
    verifier_user: str | None
    cpus: float
    memory_mb: int
    storage_mb: int
    allow_internet: bool
    workdir: str | None
    docker_image: str | None
    metadata: dict[str, Any]
    extra: dict[str, Any]
    dockerfile: Path
    context: Path
    tests_dir: Path
    solution: Path | None


@dataclass(frozen=True)
class BuiltImage:
    digest: str
    root: Path
    workdir: str
    env: dict[str, str]
    user: str | None
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None
    build_s: float = 0.0
    cached: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def load_task(path: Path, **overrides: Any) -> HarborTask:
    """The stand-in loader: ``path``'s task.toml read into a :class:`HarborTask`; ``overrides`` replace fields."""
    path = Path(path).resolve()
    raw = tomllib.loads((path / "task.toml").read_text())
    env, ver, agent = raw.get("environment", {}), raw.get("verifier", {}), raw.get("agent", {})
    fields = dict(
        name=path.name,
        path=path,
        instruction=(path / "instruction.md").read_text(),
        schema="1.0",
        agent_timeout_s=float(agent.get("timeout_sec", 600)),
        verifier_timeout_s=float(ver.get("timeout_sec", 600)),
        verifier_env=dict(ver.get("env", {})),
        verifier_user=ver.get("user"),
        cpus=float(env.get("cpus", 1)),
        memory_mb=int(env.get("memory_mb", 2048)),
        storage_mb=int(env.get("storage_mb", 10240)),
        allow_internet=bool(env.get("allow_internet", True)),
        workdir=env.get("workdir"),
        docker_image=env.get("docker_image"),
        metadata=dict(raw.get("metadata", {})),
        extra={k: v for k, v in raw.items() if k not in ("version", "metadata", "agent", "verifier", "environment")},
        dockerfile=path / "environment" / "Dockerfile",
        context=path / "environment",
        tests_dir=path / "tests",
        solution=path / "solution" if (path / "solution").is_dir() else None,
    )
    fields.update(overrides)
    return HarborTask(**fields)


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
        return BuiltImage("base", base, workdir, env, user)
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
    return BuiltImage(digest, root, workdir, env, user)
