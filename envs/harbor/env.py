"""The ``harbor`` domain: Harbor-format task directories as tasks, and the env that runs them.

Task source
-----------
A task file entry of the recipe (``data.train_files`` / ``data.eval_files``) that is a
directory or a glob is a Harbor task source (:func:`is_harbor_source`): a directory of task
directories, one task directory, or a glob matching either. :func:`load_harbor_tasks` reads
every task directory with the Harbor loader (:func:`envs.harbor.task.load_task`; its errors,
all of them at once, name the task directory, the file and the field) and turns each into a
:class:`~envs.types.Task` of domain ``harbor``: id = the task's name, messages = a system
prompt (:data:`SYSTEM_PROMPT`) and the instruction, ``meta["harbor"]`` = the task directory
(absolute), ``meta["harbor_metadata"]`` = task.toml's ``[metadata]``. Everything else (limits,
timeouts, the image) is read from the directory when an episode starts, so a task record stays
small across process boundaries.

Env
---
:class:`HarborEnv` speaks the terminal env's protocol (:mod:`envs.terminal`: one command per
turn in a fenced block, ``exit code N`` and the output back, the done marker ends the episode)
in a :class:`~envs.harbor.episode.HarborEpisode` over the task's image. The episode ends when the
policy says it is done, its shell exits, ``max_turns`` is reached, the agent timeout is spent or
the writable layer went over its cap; the verifier then runs and its reward is the step's
``info["reward"]`` (:class:`rewards.harbor.HarborVerifierReward` passes it on). Failures before the
agent's first command (the image, the view, the sandbox) raise from ``reset``: the rollout counts
them as harness errors and leaves the sample out of the loss.
"""

from __future__ import annotations

import glob
import os
import threading
from pathlib import Path
from typing import Any

from envs.harbor.episode import EpisodeCeilings, HarborEpisode
from envs.sandbox import ShellSessionError, check_sandbox
from envs.sandbox.config import SandboxConfig
from envs.sandbox.events import shell_status_events
from envs.terminal import DONE_MARKER, parse_action, truncate_output
from envs.types import Message, Task

__all__ = ["DOMAIN", "SYSTEM_PROMPT", "HarborEnv", "is_harbor_source", "load_harbor_tasks", "task_and_image", "to_task"]

DOMAIN = "harbor"
SYSTEM_PROMPT = (
    "You are working in a Linux terminal (bash) inside the task's container, as its user, in its working "
    "directory.\nEach of your turns must contain exactly ONE shell command, in a fenced code block like:\n"
    "```bash\nls -la\n```\n"
    "The command runs and you receive its exit code and output. The shell keeps its state between turns "
    "(current directory, variables, background jobs). Do not use interactive programs (editors, pagers): "
    "write files with redirections, heredocs, sed or python3.\n"
    "When the task is complete, reply with a line containing only DONE."
)
_GLOB_CHARS = ("*", "?", "[")


def is_harbor_source(path: str | os.PathLike[str]) -> bool:
    """Whether a task file entry names Harbor task directories (a directory, or a glob) rather than a file."""
    s = str(path)
    return any(c in s for c in _GLOB_CHARS) or Path(s).is_dir()


def _task_dirs(spec: str) -> list[Path]:
    """The task directories a source names: the directory itself when it holds task.toml, else its
    subdirectories that do; a glob's matches likewise, sorted."""
    if any(c in spec for c in _GLOB_CHARS):
        roots = [Path(p) for p in sorted(glob.glob(spec))]
        if not roots:
            raise FileNotFoundError(f"Harbor task source {spec}: the glob matches nothing")
    else:
        roots = [Path(spec)]
        if not roots[0].is_dir():
            raise FileNotFoundError(f"Harbor task source not found: {spec}")
    dirs: list[Path] = []
    for r in roots:
        if (r / "task.toml").is_file():
            dirs.append(r)
        elif r.is_dir():
            dirs += sorted(d for d in r.iterdir() if d.is_dir() and (d / "task.toml").is_file())
    if not dirs:
        raise FileNotFoundError(f"Harbor task source {spec}: no task directory (a directory with task.toml) in it")
    return dirs


def _load_task(path: Path):
    from envs.harbor.task import load_task  # the Harbor loader (branch h45img)

    return load_task(path)


def _build_image(task, cache_dir: str):
    from envs.harbor.image import build_image  # the image builder (branch h45img); cached by content

    return build_image(task, Path(cache_dir) if cache_dir else None)


def load_harbor_tasks(spec: str | os.PathLike[str]) -> list[Task]:
    """Every task directory of ``spec`` (see :func:`is_harbor_source`) as a ``harbor`` :class:`Task`.

    Raises ``FileNotFoundError`` when the source names no task directory, and
    :class:`~envs.io.TaskFormatError` listing every task directory that does not load (the
    loader's message: the directory, the file, the field) or that repeats another's name.
    """
    from envs.io import TaskFormatError

    tasks: list[Task] = []
    errors: list[str] = []
    seen: dict[str, Path] = {}
    for d in _task_dirs(str(spec)):
        try:
            ht = _load_task(d)
        except (ValueError, OSError) as exc:  # HarborTaskError is a ValueError
            errors.append(str(exc))
            continue
        if ht.name in seen:
            errors.append(f"{d}: task name {ht.name!r} repeats the task at {seen[ht.name]}")
            continue
        seen[ht.name] = d
        tasks.append(to_task(ht))
    if errors:
        raise TaskFormatError(f"{spec}: {len(errors)} Harbor task(s) do not load:\n" + "\n".join(errors))
    return tasks


def to_task(ht: Any) -> Task:
    """A loaded :class:`~envs.harbor.task.HarborTask` as the mixer's :class:`Task` record."""
    meta = {"harbor": str(Path(ht.path).resolve()), "harbor_metadata": dict(ht.metadata)}
    messages = (Message("system", SYSTEM_PROMPT), Message("user", ht.instruction))
    return Task(id=ht.name, domain=DOMAIN, messages=messages, meta=meta)


_images_lock = threading.Lock()
_images: dict[str, tuple[Any, Any]] = {}  # task dir -> (HarborTask, BuiltImage), per process


def task_and_image(task_dir: str, cache_dir: str = "") -> tuple[Any, Any]:
    """The loaded task and its built image (from the builder's cache after the first build), memoised per
    process; concurrent callers of one directory wait for one build."""
    with _images_lock:
        if task_dir in _images:
            return _images[task_dir]
        ht = _load_task(Path(task_dir))
        image = _build_image(ht, cache_dir)
        _images[task_dir] = (ht, image)
        return ht, image


class HarborEnv:
    """A Harbor task's episode in its image, spoken to through the terminal env's protocol (see the module docstring).

    ``max_turns``: agent turns before the episode is truncated (and verified). ``command_timeout_s``:
    the most one command may take (the task's agent timeout budgets their sum). ``output_chars``:
    the most characters of a command's output shown. ``storage_mb``, ``memory_mb``, ``cpus``: the
    ceilings over what task.toml asks. ``image_cache_dir``: the image builder's cache ("" = its
    default). ``scratch_dir``: where episode directories (the writable layers) go, on disk
    ("" = the temp dir). ``image_paths``: paths every verifier takes from the image (added to the
    task's ``[verifier] image_paths``).
    """

    def __init__(
        self,
        max_turns: int = 30,
        command_timeout_s: float = 60.0,
        output_chars: int = 4000,
        *,
        done_marker: str = DONE_MARKER,
        storage_mb: int = 4096,
        memory_mb: int = 8192,
        cpus: float = 4.0,
        max_entries: int = 500_000,
        image_cache_dir: str = "",
        scratch_dir: str = "",
        image_paths: list[str] | tuple[str, ...] = (),
        sandbox_config: SandboxConfig | dict | None = None,
        stdin: str = "null",
    ) -> None:
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
        if not command_timeout_s > 0:
            raise ValueError(f"command_timeout_s must be > 0, got {command_timeout_s!r}")
        if not isinstance(output_chars, int) or output_chars < 16:
            raise ValueError(f"output_chars must be an int >= 16, got {output_chars!r}")
        if not done_marker or not done_marker.strip() or "\n" in done_marker:
            raise ValueError(f"done_marker must be a non-empty single line, got {done_marker!r}")
        if stdin not in ("null", "terminal"):
            raise ValueError(f"stdin must be 'null' or 'terminal', got {stdin!r}")
        for name, v, lo in (
            ("storage_mb", storage_mb, 1),
            ("memory_mb", memory_mb, 64),
            ("max_entries", max_entries, 64),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if not cpus > 0:
            raise ValueError(f"cpus must be > 0, got {cpus!r}")
        if any(not str(p).startswith("/") for p in image_paths):
            raise ValueError(f"image_paths must be absolute paths, got {list(image_paths)!r}")
        check_sandbox()  # SandboxUnavailable here, not in the middle of a rollout
        self.max_turns = max_turns
        self.command_timeout_s = float(command_timeout_s)
        self.output_chars = output_chars
        self.done_marker = done_marker.strip()
        self.stdin = stdin
        self.image_cache_dir = image_cache_dir
        self.image_paths = tuple(str(p) for p in image_paths)
        self.sandbox_config = SandboxConfig.coerce(sandbox_config)
        self.ceilings = EpisodeCeilings(
            storage_mb=storage_mb,
            memory_mb=memory_mb,
            cpus=float(cpus),
            max_entries=max_entries,
            scratch_dir=scratch_dir,
        )
        self._task: Task | None = None
        self._episode: HarborEpisode | None = None
        self._done = True
        self._turns = 0
        self._events: list[str] = []

    def reset(self, task: Task) -> list[Message]:
        task_dir = task.meta.get("harbor")
        if not isinstance(task_dir, str) or not task_dir:
            raise ValueError(f"task {task.id!r} (domain {task.domain!r}) has no meta['harbor'] task directory")
        if not task.messages:
            raise ValueError(f"task {task.id!r} has no messages")
        self._release()
        ht, image = task_and_image(task_dir, self.image_cache_dir)
        paths = self.image_paths + tuple(_task_image_paths(ht))
        episode = HarborEpisode(ht, image, self.ceilings, sandbox_config=self.sandbox_config, image_paths=paths)
        self._episode = episode.start()
        self._task, self._turns, self._events, self._done = task, 0, [], False
        return list(task.messages)

    def step(self, action: str) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        if self._task is None:
            raise RuntimeError("HarborEnv.step() before reset()")
        if self._done:
            raise RuntimeError("HarborEnv.step() after the episode ended; call reset() first")
        ep = self._episode
        assert ep is not None
        kind, cmd = parse_action(action, self.done_marker)
        self._turns += 1
        if kind == "done":
            return self._finish([], "done", terminated=True)
        if kind == "invalid":
            text = f"No command found. Put exactly one shell command in a ```bash block, or reply {self.done_marker} when the task is complete."
            obs = [Message("user", text)]
            info: dict[str, Any] = {"exit_code": None, "timed_out": False, "turns": self._turns, "invalid": True}
        else:
            assert cmd is not None
            timeout = min(self.command_timeout_s, ep.time_left_s)
            try:
                res = ep.run(cmd, timeout, stdin=self.stdin)
            except ShellSessionError as exc:
                return self._finish([Message("user", f"the shell is gone ({exc})")], "shell_dead", truncated=True)
            output = truncate_output(res.output.replace("\r\n", "\n"), self.output_chars)
            head = (
                f"command timed out after {max(0.1, timeout):g}s (interrupted)"
                if res.timed_out
                else f"exit code {res.exit_code}"
            )
            obs = [Message("user", f"{head}\n{output}" if output else head)]
            self._note(res)
            info = {"exit_code": res.exit_code, "timed_out": res.timed_out, "turns": self._turns}
            if ep.storage_full:
                return self._finish(obs, "storage_limit", truncated=True)
            if ep.session is None or not ep.session.alive:
                end = "shell_dead" if res.timed_out else "shell_exited"
                return self._finish(obs, end, terminated=not res.timed_out, truncated=res.timed_out)
        if ep.time_left_s <= 0:
            return self._finish(obs, "time_limit", truncated=True)
        if self._turns >= self.max_turns:
            return self._finish(obs, "max_turns", truncated=True)
        return obs, False, False, info

    def _note(self, res) -> None:
        ev = list(shell_status_events(res.exit_code, res.output))
        if res.timed_out:
            ev.append("timeout")
        if res.output_truncated:
            ev.append("output")
        self._events.extend(dict.fromkeys(ev))

    def _finish(
        self, obs: list[Message], end: str, *, terminated: bool = False, truncated: bool = False
    ) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        self._done = True
        ep = self._episode
        assert ep is not None
        v = ep.verify()
        events = list(dict.fromkeys([*self._events, *ep.events, *(["timeout"] if v.timed_out else [])]))
        info = {
            "reward": v.reward,
            "passed": v.reward >= 1.0,
            "verifier": v.reason,
            "check_output": truncate_output(v.output, 4000),
            "check_exit_code": v.exit_code,
            "end": end,
            "turns": self._turns,
            "sandbox_events": events,
        }
        return obs, terminated, truncated, info

    def finalize(self) -> dict[str, Any]:
        """The rollout ended the episode first (token or context limit): verify the state the agent left."""
        if self._task is None or self._done:
            return {}
        return self._finish([], "cut_by_rollout", truncated=True)[3]

    def _release(self) -> None:
        ep, self._episode = self._episode, None
        if ep is not None:
            ep.close()

    def close(self) -> None:
        """Kill everything the episode started, unmount its view, remove its layer. Idempotent."""
        self._done = True
        self._release()

    def __enter__(self) -> HarborEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _task_image_paths(ht: Any) -> list[str]:
    """``[verifier] image_paths`` of task.toml (kept by the loader among the unknown fields), when a list of str."""
    extra = getattr(ht, "extra", {}) or {}
    v = extra.get("verifier", {}) if isinstance(extra.get("verifier"), dict) else {}
    paths = v.get("image_paths", extra.get("verifier.image_paths", []))
    if not isinstance(paths, list) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
        raise ValueError(f"task {getattr(ht, 'name', '?')!r}: [verifier] image_paths must be a list of absolute paths")
    return paths
