"""Harbor task directories (``task.toml``, ``instruction.md``, ``environment/``, ``tests/``, ``solution/``) read into
:class:`HarborTask` records.

Every field of the ``task.toml`` schemas below is read; a field this loader does not know is kept in
:attr:`HarborTask.extra` under its dotted name (``"environment.foo"``), never guessed at. A field it knows but cannot
honour (GPUs, MCP servers, a host allow-list, a health check, multi-step tasks, compose environments) refuses the
task with a message naming it, rather than running the task without it.

Schemas read (``HarborTask.schema`` is the version the file declares; ``"1.0"`` when it declares none):

* ``version = "1.0"`` (Terminal-Bench 2.0 and most published sets): ``[metadata]``, ``[agent] timeout_sec``,
  ``[verifier] timeout_sec``, ``[environment]`` with ``build_timeout_sec``, ``docker_image``, ``cpus``, and sizes
  either as ``memory_mb``/``storage_mb`` numbers or as the older ``memory = "4G"``/``storage = "10G"`` strings
  (``K``, ``M``, ``G``, ``T`` suffixes, 1024-based), and ``allow_internet``.
* ``schema_version = "1.1"`` and later 1.x (``version`` is the deprecated spelling of ``schema_version``): also a
  ``[task]`` section (``name`` as ``org/name``, ``description``, ``authors``, ``keywords``), ``[verifier] env`` and
  ``user``, ``[agent] user``, ``[solution] env``, ``[environment]`` ``workdir``, ``env``, ``gpus``, ``mcp_servers``,
  ``healthcheck``, and ``network_mode`` (``"public"`` / ``"no-network"``), of which ``allow_internet``
  is the deprecated spelling; ``steps`` (multi-step tasks) and a verifier in a separate environment
  (``[verifier] environment_mode``/``environment``) are refused.

A schema with another major version, or a Terminal-Bench 1 directory (``task.yaml``), is refused.
"""

from __future__ import annotations

import glob
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["HarborTask", "HarborTaskError", "load_task", "load_tasks", "parse_size_mb"]

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
DEFAULTS = {
    "agent_timeout_s": 600.0,
    "verifier_timeout_s": 600.0,
    "build_timeout_s": 600.0,
    "cpus": 1.0,
    "memory_mb": 2048,
    "storage_mb": 10240,
}
_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class HarborTaskError(ValueError):
    """A task directory that cannot be used; ``str()`` names the task dir, the file, the field or line, the problem."""


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task directory, read and checked (see the module docstring for the fields' sources)."""

    name: str  # the task directory's name
    path: Path  # the task directory (absolute)
    instruction: str  # instruction.md: the prompt
    schema: str  # the task.toml schema version read ("1.0", "1.1", ...)
    agent_timeout_s: float
    verifier_timeout_s: float
    verifier_env: dict[str, str]
    verifier_user: str | None
    cpus: float
    memory_mb: int
    storage_mb: int
    allow_internet: bool
    workdir: str | None  # [environment] workdir: overrides the image's last WORKDIR
    docker_image: str | None  # named by the task; never pulled (the image is built from the Dockerfile)
    metadata: dict[str, Any]
    extra: dict[str, Any]  # fields no schema above defines, by dotted name: kept, never acted upon
    dockerfile: Path
    context: Path  # the Dockerfile's build context (environment/)
    tests_dir: Path
    solution: Path | None  # solution/solve.sh when present
    build_timeout_s: float = 600.0
    agent_user: str | None = None
    solution_env: dict[str, str] = field(default_factory=dict)
    task_env: dict[str, str] = field(default_factory=dict)  # [environment] env, as written (${VAR} not resolved)
    package: dict[str, Any] = field(default_factory=dict)  # the [task] section (name, description, authors, ...)


# --------------------------------------------------------------------------------------
# Reading one task
# --------------------------------------------------------------------------------------


class _Reader:
    """Reads the sections of one parsed task.toml, naming the task, the file, the field and its line on errors."""

    def __init__(self, task_dir: Path, text: str, data: dict[str, Any]) -> None:
        self.task_dir, self.text, self.data = task_dir, text, data
        self.extra: dict[str, Any] = {}

    def fail(self, field_name: str, problem: str) -> HarborTaskError:
        line = _line_of(self.text, field_name)
        where = f"task.toml line {line}" if line else "task.toml"
        return HarborTaskError(f"harbor task {self.task_dir}: {where}: {field_name}: {problem}")

    def section(self, name: str) -> dict[str, Any]:
        value = self.data.get(name, {})
        if not isinstance(value, dict):
            raise self.fail(name, f"must be a table ([{name}]), got {type(value).__name__}")
        return value

    def number(self, sec: dict[str, Any], dotted: str, default: float, *, integer: bool = False) -> float:
        key = dotted.rsplit(".", 1)[-1]
        value = sec.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self.fail(dotted, f"must be a positive number, got {value!r}")
        if integer and value != int(value):
            raise self.fail(dotted, f"must be a whole number, got {value!r}")
        return int(value) if integer else float(value)

    def string(self, sec: dict[str, Any], dotted: str) -> str | None:
        value = sec.get(dotted.rsplit(".", 1)[-1])
        if value is not None and not isinstance(value, str):
            raise self.fail(dotted, f"must be a string, got {value!r}")
        return value

    def user(self, sec: dict[str, Any], dotted: str) -> str | None:
        value = sec.get("user")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, int) and value < 0):
            raise self.fail(dotted, f"must be a user name or a uid, got {value!r}")
        if isinstance(value, str) and not value.strip():
            raise self.fail(dotted, "is empty")
        return str(value)

    def str_map(self, sec: dict[str, Any], dotted: str) -> dict[str, str]:
        value = sec.get(dotted.rsplit(".", 1)[-1], {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self.fail(dotted, f"must be a table of strings, got {value!r}")
        return dict(value)

    def keep_unknown(self, sec: dict[str, Any], prefix: str, known: set[str]) -> None:
        for k, v in sec.items():
            if k not in known:
                self.extra[f"{prefix}{k}"] = v


def parse_size_mb(value: Any) -> int:
    """MiB in a size string of the older schema (``"4G"``, ``"512M"``, ``"1.5G"``, ``"2048"`` = MiB); ValueError."""
    if not isinstance(value, str):
        raise ValueError(f"must be a size string such as '4G' or '512M', got {value!r}")
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:iB|i|B)?\s*", value, re.IGNORECASE)
    if not m:
        raise ValueError(f"must be a size string such as '4G' or '512M', got {value!r}")
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "": 1}[m.group(2).upper()]
    mb = int(float(m.group(1)) * scale)
    if mb <= 0:
        raise ValueError(f"must be at least 1M, got {value!r}")
    return mb


def _line_of(text: str, dotted: str) -> int | None:
    """The line of ``section.key`` (else of ``[section]``), or of a top-level key or table, in the TOML text."""
    parts = dotted.split(".")
    section, key = (parts[0], parts[-1]) if len(parts) > 1 else (None, parts[0])
    current: str | None = None
    header_line = None
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        header = re.match(r"^\[\[?\s*([A-Za-z0-9_.-]+)\s*\]\]?", line)
        if header:
            current = header.group(1)
            if current == (section or key) and header_line is None:
                header_line = i
                if section is None:
                    return i
        elif current == section and re.match(rf"^{re.escape(key)}\s*=", line):
            return i
        elif current is None and section and re.match(rf"^{re.escape(section)}\.{re.escape(key)}\s*=", line):
            return i
    return header_line


def _schema(r: _Reader) -> str:
    declared = r.data.get("schema_version", r.data.get("version"))
    if "schema_version" in r.data and "version" in r.data and r.data["schema_version"] != r.data["version"]:
        raise r.fail("schema_version", f"disagrees with the deprecated `version` ({r.data['version']!r})")
    if declared is None:
        return "1.0"
    if not isinstance(declared, str) or not re.fullmatch(r"1(\.\d+)*", declared.strip()):
        key = "schema_version" if "schema_version" in r.data else "version"
        raise r.fail(key, f"schema {declared!r} is not one this loader reads (1.x; docs/envs.md#harbor-tasks)")
    return declared.strip()


def _refuse_unsupported(r: _Reader, env: dict[str, Any]) -> None:
    """Known fields whose meaning cannot be honoured here: refused by name instead of ignored."""
    if "steps" in r.data:
        raise r.fail("steps", "multi-step tasks are not supported (one instruction, one verifier per task)")
    if env.get("gpus", 0):
        raise r.fail("environment.gpus", f"asks for {env['gpus']} GPU(s); Harbor episodes here get no GPU")
    if env.get("mcp_servers"):
        raise r.fail("environment.mcp_servers", "MCP servers are not supported")
    if env.get("healthcheck"):
        raise r.fail("environment.healthcheck", "health checks (services started with the image) are not supported")
    if env.get("allowed_hosts"):
        raise r.fail("environment.allowed_hosts", "a host allow-list cannot be enforced here (network is all or none)")
    verifier = r.section("verifier")
    if verifier.get("environment") is not None or verifier.get("environment_mode") not in (None, "shared"):
        raise r.fail("verifier.environment_mode", "a verifier in a separate environment is not supported")


def _internet(r: _Reader, env: dict[str, Any]) -> bool:
    allow = env.get("allow_internet")
    if allow is not None and not isinstance(allow, bool):
        raise r.fail("environment.allow_internet", f"must be true or false, got {allow!r}")
    mode = env.get("network_mode")
    if mode is None:
        return True if allow is None else allow
    if mode not in ("public", "no-network"):
        raise r.fail("environment.network_mode", f"{mode!r} is not supported (public, no-network)")
    if allow is not None and allow != (mode == "public"):
        raise r.fail("environment.allow_internet", f"contradicts network_mode = {mode!r}")
    return mode == "public"


def _size(r: _Reader, env: dict[str, Any], new: str, old: str) -> int:
    if new in env and old in env:
        raise r.fail(f"environment.{old}", f"set together with {new}; keep one (`{old}` is the deprecated spelling)")
    if old in env:
        try:
            return parse_size_mb(env[old])
        except ValueError as exc:
            raise r.fail(f"environment.{old}", str(exc)) from None
    return int(r.number(env, f"environment.{new}", DEFAULTS[new], integer=True))


def _package(r: _Reader) -> dict[str, Any]:
    pkg = r.section("task")
    if not pkg:
        return {}
    name = pkg.get("name")
    if not isinstance(name, str) or not _PACKAGE_NAME.match(name) or ".." in name:
        raise r.fail("task.name", f"must be 'org/name' (letters, digits, '.', '_', '-'), got {name!r}")
    return dict(pkg)


def _files(task_dir: Path, env: dict[str, Any]) -> tuple[Path, Path, Path, Path | None, str]:
    def bad(rel: str, why: str) -> HarborTaskError:
        return HarborTaskError(f"harbor task {task_dir}: {rel}: {why}")

    env_dir = task_dir / "environment"
    for name in COMPOSE_FILES:
        if (env_dir / name).exists():
            raise bad(f"environment/{name}", "compose environments (several services) are not supported")
    instruction = task_dir / "instruction.md"
    if not instruction.is_file():
        raise bad("instruction.md", "missing (the task's prompt)")
    try:
        text = instruction.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise bad("instruction.md", f"cannot be read as UTF-8 text: {exc}") from None
    if not text.strip():
        raise bad("instruction.md", "is empty")
    tests = task_dir / "tests"
    if not (tests / "test.sh").is_file():
        raise bad("tests/test.sh", "missing (the verifier the harness runs after the agent)")
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        why = "missing (the image is built from it"
        if env.get("docker_image"):
            why += f"; docker_image {env['docker_image']!r} is never pulled: no registry is used"
        raise bad("environment/Dockerfile", why + ")")
    solve = task_dir / "solution" / "solve.sh"
    return dockerfile, env_dir, tests, solve if solve.is_file() else None, text


_KNOWN = {
    "": {"version", "schema_version", "task", "metadata", "verifier", "agent", "environment", "solution"},
    "verifier.": {"timeout_sec", "env", "user"},
    "agent.": {"timeout_sec", "user"},
    "solution.": {"env"},
    "environment.": {
        "build_timeout_sec", "docker_image", "cpus", "memory_mb", "storage_mb", "memory", "storage",
        "allow_internet", "network_mode", "allowed_hosts", "workdir", "env", "gpus", "mcp_servers", "healthcheck",
    },
}  # fmt: skip


def load_task(path: Path | str) -> HarborTask:
    """Read and check one task directory; :class:`HarborTaskError` names the task, the file and the problem."""
    task_dir = Path(path).resolve()
    if not task_dir.is_dir():
        raise HarborTaskError(f"harbor task {task_dir}: not a directory")
    toml_path = task_dir / "task.toml"
    if not toml_path.is_file():
        hint = (
            " (a Terminal-Bench 1 task.yaml: convert it to the Harbor format)"
            if (task_dir / "task.yaml").exists()
            else ""
        )
        raise HarborTaskError(f"harbor task {task_dir}: task.toml: missing{hint}")
    try:
        text = toml_path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise HarborTaskError(f"harbor task {task_dir}: task.toml: cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise HarborTaskError(f"harbor task {task_dir}: task.toml: malformed TOML: {exc}") from None
    r = _Reader(task_dir, text, data)
    return _build(r, task_dir)


def _build(r: _Reader, task_dir: Path) -> HarborTask:
    schema = _schema(r)
    agent, verifier, env, solution = (r.section(s) for s in ("agent", "verifier", "environment", "solution"))
    metadata = r.section("metadata")
    _refuse_unsupported(r, env)
    for prefix, known in _KNOWN.items():
        r.keep_unknown(r.data if not prefix else r.section(prefix[:-1]), prefix, known)
    workdir = r.string(env, "environment.workdir")
    if workdir is not None and not workdir.startswith("/"):
        raise r.fail("environment.workdir", f"must be an absolute path, got {workdir!r}")
    dockerfile, context, tests, solve, instruction = _files(task_dir, env)
    return HarborTask(
        name=task_dir.name,
        path=task_dir,
        instruction=instruction,
        schema=schema,
        agent_timeout_s=r.number(agent, "agent.timeout_sec", DEFAULTS["agent_timeout_s"]),
        verifier_timeout_s=r.number(verifier, "verifier.timeout_sec", DEFAULTS["verifier_timeout_s"]),
        verifier_env=r.str_map(verifier, "verifier.env"),
        verifier_user=r.user(verifier, "verifier.user"),
        cpus=r.number(env, "environment.cpus", DEFAULTS["cpus"]),
        memory_mb=_size(r, env, "memory_mb", "memory"),
        storage_mb=_size(r, env, "storage_mb", "storage"),
        allow_internet=_internet(r, env),
        workdir=workdir,
        docker_image=r.string(env, "environment.docker_image"),
        metadata=dict(metadata),
        extra=dict(r.extra),
        dockerfile=dockerfile,
        context=context,
        tests_dir=tests,
        solution=solve,
        build_timeout_s=r.number(env, "environment.build_timeout_sec", DEFAULTS["build_timeout_s"]),
        agent_user=r.user(agent, "agent.user"),
        solution_env=r.str_map(solution, "solution.env"),
        task_env=r.str_map(env, "environment.env"),
        package=_package(r),
    )


# --------------------------------------------------------------------------------------
# Task sets
# --------------------------------------------------------------------------------------


def load_tasks(spec: str | Path) -> list[HarborTask]:
    """The tasks of ``spec``: one task dir (holds ``task.toml``), a directory of task dirs, or a glob of task dirs.

    Sorted by name; two tasks with one name, or a spec that finds no task, are errors. Every task is checked: the
    first bad one raises (its message names it).
    """
    text = str(spec)
    if any(c in text for c in "*?["):
        dirs = sorted(Path(p) for p in glob.glob(text) if Path(p).is_dir())
    else:
        root = Path(text)
        if not root.is_dir():
            raise HarborTaskError(f"harbor tasks {text}: no such directory")
        if (root / "task.toml").is_file() or (root / "task.yaml").is_file():
            dirs = [root]
        else:
            dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
            dirs = [p for p in dirs if (p / "task.toml").exists() or (p / "task.yaml").exists()]
    if not dirs:
        raise HarborTaskError(f"harbor tasks {text}: no task directory (one holding task.toml) found")
    tasks = [load_task(d) for d in dirs]
    seen: dict[str, Path] = {}
    for t in tasks:
        if t.name in seen:
            raise HarborTaskError(f"harbor tasks {text}: two tasks named {t.name!r}: {seen[t.name]} and {t.path}")
        seen[t.name] = t.path
    return tasks
