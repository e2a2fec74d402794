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
from envs.harbor.overlay import check_overlay
from envs.sandbox import ShellResult
from envs.sandbox.config import SandboxConfig
from envs.terminal import DONE_MARKER, TerminalEnv, truncate_output
from envs.types import Message, Task

__all__ = [
    "DOMAIN",
    "SYSTEM_PROMPT",
    "HarborEnv",
    "HarborSourceError",
    "is_harbor_source",
    "load_harbor_tasks",
    "task_and_image",
    "to_task",
]

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


class HarborSourceError(ValueError):
    """Task directories of a Harbor source that do not load, each named with its problem."""


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


def load_harbor_tasks(
    spec: str | os.PathLike[str], *, skip_bad: bool = False, skipped: list[str] | None = None
) -> list[Task]:
    """Every task directory of ``spec`` (see :func:`is_harbor_source`) as a ``harbor`` :class:`Task`.

    Raises ``FileNotFoundError`` when the source names no task directory, and
    :class:`HarborSourceError` listing every task directory that does not load (the loader's
    message: the directory, the file, the field) or that repeats another's name
    (:func:`envs.io.load_tasks` raises it as a ``TaskFormatError``). With ``skip_bad`` (the recipe's
    ``data.harbor_skip_bad``) those directories are left out instead, each message appended to
    ``skipped`` for the caller to report; a source none of whose directories loads still raises.
    """
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
    if errors and (not skip_bad or not tasks):
        raise HarborSourceError(f"{spec}: {len(errors)} Harbor task(s) do not load:\n" + "\n".join(errors))
    if skipped is not None:
        skipped += errors
    return tasks


def to_task(ht: Any) -> Task:
    """A loaded :class:`~envs.harbor.task.HarborTask` as the mixer's :class:`Task` record."""
    meta = {"harbor": str(Path(ht.path).resolve()), "harbor_metadata": dict(ht.metadata)}
    messages = (Message("system", SYSTEM_PROMPT), Message("user", ht.instruction))
    return Task(id=ht.name, domain=DOMAIN, messages=messages, meta=meta)


_images_lock = threading.Lock()
_images: dict[str, tuple[Any, Any] | Exception] = {}  # task dir -> (HarborTask, BuiltImage) or why not, per process


def task_and_image(task_dir: str, cache_dir: str = "") -> tuple[Any, Any]:
    """The loaded task and its built image (from the builder's cache after the first build), memoised per
    process, a failure too (the next episode of a task whose image does not build fails at once with the
    same error, not after another build); concurrent callers of one directory wait for one build."""
    with _images_lock:
        if task_dir not in _images:
            try:
                ht = _load_task(Path(task_dir))
                _images[task_dir] = (ht, _build_image(ht, cache_dir))
            except Exception as exc:  # noqa: BLE001 - kept and raised again for every episode of the task
                _images[task_dir] = exc
        got = _images[task_dir]
    if isinstance(got, Exception):
        raise RuntimeError(f"Harbor task {task_dir}: no image: {got}") from got
    return got


class HarborEnv(TerminalEnv):
    """A Harbor task's episode in its image, spoken to through the terminal env's protocol (see the module docstring).

    The turn loop is :class:`~envs.terminal.TerminalEnv`'s (its ``step``, ``finalize``, ``close``); the
    commands run in a :class:`~envs.harbor.episode.HarborEpisode` and the episode is scored by its verifier.
    ``max_turns``: agent turns before the episode is truncated (and verified). ``command_timeout_s``:
    the most one command may take (the task's agent timeout budgets their sum). ``output_chars``:
    the most characters of a command's output shown. ``storage_mb``, ``memory_mb``, ``cpus``: the
    ceilings over what task.toml asks; ``max_entries``: the most files and directories of the writable
    layer. ``image_cache_dir``: the image builder's cache ("" = its default). ``scratch_dir``: where
    episode directories (the writable layers) go, on disk ("" = the temp dir). ``image_paths``: paths
    every verifier takes from the image (added to the task's ``[verifier] image_paths``).
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
        super().__init__(
            max_turns,
            command_timeout_s,
            output_chars,
            done_marker=done_marker,
            sandbox_config=sandbox_config,
            stdin=stdin,
        )
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
        self.image_cache_dir = image_cache_dir
        self.image_paths = tuple(str(p) for p in image_paths)
        self.ceilings = EpisodeCeilings(
            storage_mb=storage_mb,
            memory_mb=memory_mb,
            cpus=float(cpus),
            max_entries=max_entries,
            scratch_dir=scratch_dir,
        )
        self._episode: HarborEpisode | None = None
        check_overlay()  # SandboxUnavailable here, not one harness error per episode

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

    # The terminal env's hooks, over the episode.

    def _time_left_s(self) -> float:
        assert self._episode is not None
        return self._episode.time_left_s

    def _run_command(self, cmd: str, timeout: float) -> ShellResult:
        assert self._episode is not None
        return self._episode.run(cmd, timeout, stdin=self.stdin)

    def _shell_alive(self) -> bool:
        ep = self._episode
        return ep is not None and ep.session is not None and ep.session.alive

    def _limit_hit(self) -> str | None:
        return "storage_limit" if self._episode is not None and self._episode.storage_full else None

    def _finish(
        self, obs: list[Message], end: str, *, terminated: bool = False, truncated: bool = False
    ) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        """End the agent's part and run the verifier: its reward is the step's ``info["reward"]``."""
        self._done = True
        assert self._episode is not None
        v = self._episode.verify()
        events = list(dict.fromkeys([*self._events, *self._episode.events, *(["timeout"] if v.timed_out else [])]))
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

    def _release(self) -> None:
        """Kill everything the episode started, unmount its view, remove its layer."""
        ep, self._episode = self._episode, None
        if ep is not None:
            ep.close()


def _task_image_paths(ht: Any) -> list[str]:
    """``[verifier] image_paths`` of task.toml (kept by the loader among the unknown fields), when a list of str."""
    extra = getattr(ht, "extra", {}) or {}
    v = extra.get("verifier", {}) if isinstance(extra.get("verifier"), dict) else {}
    paths = v.get("image_paths", extra.get("verifier.image_paths", []))
    if not isinstance(paths, list) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
        raise ValueError(f"task {getattr(ht, 'name', '?')!r}: [verifier] image_paths must be a list of absolute paths")
    return paths
