"""Every Harbor task's image built before a run's actors start, so no episode pays a build.

:func:`prebuild_images` loads each task directory and builds its image with
:func:`envs.harbor.image.build_image` (the node's cache, keyed by content: an image built before is found,
not built again), one line per task through ``say``: ``n/N name: cached`` or ``built in S s``. A task
that does not load or whose image does not build is kept as a :class:`PrebuildFailure` (the task, its
directory and the builder's message, which names the file and line) and the others still build, so one
run reports every bad task at once; the caller fails the run or drops those tasks.

The images are built on the node that calls this (the driver's). An env on another node finds none in
its own cache and builds each task's image at its first episode, under the builder's per-image lock (one
build per node even when several episodes of the task start at once): on a multi-node cluster, point
``JOINTRL_IMAGE_CACHE`` (or the env's ``image_cache_dir``) at a shared filesystem to build once for all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from envs.harbor.image import build_image
from envs.harbor.task import load_task

__all__ = ["PrebuildFailure", "PrebuildReport", "prebuild_images"]


@dataclass(frozen=True)
class PrebuildFailure:
    task: str  # the task's name (the directory's name when task.toml does not load)
    task_dir: str
    message: str  # the loader's or the builder's error: the file and line, the step's output


@dataclass(frozen=True)
class PrebuildReport:
    built: int  # images built by this call
    cached: int  # images found in the cache
    seconds: float
    failures: tuple[PrebuildFailure, ...]


def prebuild_images(
    task_dirs: Sequence[str], cache_dir: str = "", say: Callable[[str], None] = print
) -> PrebuildReport:
    """Build the image of each task directory (see the module docstring); ``cache_dir`` "" = the builder's default."""
    t0 = time.monotonic()
    built = cached = 0
    failures: list[PrebuildFailure] = []
    n = len(task_dirs)
    for i, d in enumerate(task_dirs, 1):
        name = Path(d).name
        start = time.monotonic()
        try:
            task = load_task(Path(d))
            name = task.name
            image = build_image(task, Path(cache_dir) if cache_dir else None)
        except (ValueError, OSError) as exc:  # HarborTaskError and ImageBuildError are ValueErrors
            failures.append(PrebuildFailure(name, str(d), str(exc)))
            say(f"Harbor image {i}/{n} {name}: FAILED ({str(exc).splitlines()[0]})")
            continue
        if image.cached:
            cached += 1
            say(f"Harbor image {i}/{n} {name}: cached")
        else:
            built += 1
            say(f"Harbor image {i}/{n} {name}: built in {time.monotonic() - start:.1f} s")
    return PrebuildReport(built, cached, time.monotonic() - t0, tuple(failures))
