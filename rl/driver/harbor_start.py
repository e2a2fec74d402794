"""The start-up step of a run with Harbor tasks: every task's image built before any actor starts.

:func:`prepare_harbor_images` collects the Harbor tasks (``meta["harbor"]``: their task directory) of the
run's training sources and held-out tasks and builds their images on this node
(:func:`envs.harbor.prebuild.prebuild_images`, one start-up line per task), in the cache the recipe's
``harbor`` env reads (its ``image_cache_dir``, else the builder's default), so no episode pays a build. A
task whose image does not build fails the run here, naming the task and the builder's message (the file
and line), unless ``data.harbor_skip_bad`` is set: then those tasks leave the run and a start-up line says
how many. Task directories that do not load are handled earlier, when the task files are read
(``load_task_sets``). A host that cannot build at all (``HostNotReady``: no user namespaces, no
``mmdebstrap``) fails the run whatever the knob says.
"""

from __future__ import annotations

import dataclasses
import sys

from envs.types import Task
from rl.config.recipe import Recipe, RecipeError
from rl.data.mixer import Source
from rl.driver.logger import STARTUP

__all__ = ["HarborImageError", "prepare_harbor_images"]


class HarborImageError(RecipeError):
    """Harbor tasks of the recipe whose image does not build, each named (bad input: the CLI exits 2 with it)."""


def _harbor_dirs(sources: list[Source], eval_tasks: list[Task]) -> list[str]:
    """The task directories of the Harbor tasks, train then eval, each once."""
    seen: dict[str, None] = {}
    for t in [t for s in sources for t in s.tasks] + list(eval_tasks):
        if t.meta.get("harbor"):
            seen.setdefault(str(t.meta["harbor"]), None)
    return list(seen)


def _cache_dir(cfg: Recipe) -> str:
    """The harbor env's ``image_cache_dir`` ("" = the builder's default), where its episodes look for images."""
    for e in cfg.rollout.envs:
        if e.domain == "harbor":
            return str(e.kwargs.get("image_cache_dir", "") or "")
    return ""


def prepare_harbor_images(
    cfg: Recipe, sources: list[Source], eval_tasks: list[Task]
) -> tuple[list[Source], list[Task]]:
    """Build every Harbor task's image (see the module docstring); the sources and held-out tasks to run with
    (those whose image did not build removed, with ``data.harbor_skip_bad``). Raises :class:`HarborImageError`."""
    dirs = _harbor_dirs(sources, eval_tasks)
    if not dirs:
        return sources, eval_tasks
    from envs.harbor.prebuild import prebuild_images

    STARTUP.phase(f"Harbor images: {len(dirs)} task(s) of the train and eval files, built once on this node")
    report = prebuild_images(dirs, _cache_dir(cfg), say=STARTUP.phase)
    STARTUP.phase(
        f"Harbor images: {report.built} built, {report.cached} cached, {len(report.failures)} failed "
        f"({report.seconds:.1f} s)"
    )
    if not report.failures:
        return sources, eval_tasks
    named = "\n".join(f"  {f.task} ({f.task_dir}): {f.message}" for f in report.failures)
    if not cfg.data.harbor_skip_bad:
        raise HarborImageError(
            f"{len(report.failures)} Harbor task(s) of the recipe have no image (set data.harbor_skip_bad: true "
            f"to train without them):\n{named}"
        )
    bad = {f.task_dir for f in report.failures}
    kept = [dataclasses.replace(s, tasks=[t for t in s.tasks if t.meta.get("harbor") not in bad]) for s in sources]
    kept = [s for s in kept if s.tasks]
    if not kept:
        raise HarborImageError(f"no training task is left once the Harbor tasks without an image are skipped:\n{named}")
    say_always(f"Harbor images: skipped {len(bad)} of {len(dirs)} task(s) (data.harbor_skip_bad):\n{named}")
    return kept, [t for t in eval_tasks if t.meta.get("harbor") not in bad]


def say_always(msg: str) -> None:
    """A start-up line printed even without progress lines: what the run leaves out must be said."""
    if STARTUP.enabled:
        STARTUP.phase(msg)
    else:
        print(f"jointrl: {msg}", file=sys.stderr, flush=True)
